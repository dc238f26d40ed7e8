//! `rlreplay synth`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use rlreplay_data::synth::{write_dataset, SynthConfig};

use super::eos::EosArgs;

/// Arguments of `rlreplay synth`.
#[derive(clap::Args)]
pub struct Args {
    /// Output dataset directory (shards go to OUT/data/step-NNNN.parquet).
    #[arg(long)]
    pub out: PathBuf,
    /// Number of steps (shards).
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// First step number.
    #[arg(long, default_value_t = 1)]
    pub first_step: i64,
    /// Prompt groups per step.
    #[arg(long, default_value_t = 256)]
    pub prompts: usize,
    /// Rollouts per prompt.
    #[arg(long, default_value_t = 16)]
    pub group: usize,
    /// Token ids are drawn below this.
    #[arg(long, default_value_t = 151_936)]
    pub vocab: u32,
    /// Mean response length (lognormal).
    #[arg(long, default_value_t = 1400.0)]
    pub mean_len: f64,
    /// Maximum response length; longer responses are truncated without EOS.
    #[arg(long, default_value_t = 4096)]
    pub max_len: usize,
    /// Mean prompt length.
    #[arg(long, default_value_t = 150)]
    pub prompt_len: usize,
    /// End-of-sequence id that ends the responses that are not truncated. Default: the first
    /// id the --tokenizer directory names, else the published run's (Qwen3 `<|endoftext|>`,
    /// 151643).
    #[arg(long)]
    pub eos: Option<u32>,
    /// Tokenizer or model (tokenizer.json, its directory, or hf://OWNER/NAME) whose directory
    /// names the end-of-sequence id.
    #[arg(long)]
    pub tokenizer: Option<String>,
    /// Successful responses start with a fixed pattern of this many tokens (learnable data).
    #[arg(long, default_value_t = 0)]
    pub pattern_len: usize,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write into a non-empty output directory; the `.parquet` shards already in OUT/data are
    /// removed first, so that the dataset holds only the new steps.
    #[arg(long)]
    pub force: bool,
}

/// Refuses a non-empty `out` unless `force`; with `force`, removes the shards in `out/data`.
fn prepare_out(out: &Path, force: bool) -> anyhow::Result<()> {
    if out.exists() && !out.is_dir() {
        bail!("--out {} exists and is not a directory", out.display());
    }
    let entries = match std::fs::read_dir(out) {
        Ok(e) => e.count(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", out.display())),
    };
    if entries == 0 {
        return Ok(());
    }
    if !force {
        bail!(
            "--out {} is not empty ({entries} entr{}); refusing to mix a new dataset into it \
             (pass --force to replace the shards in {})",
            out.display(),
            if entries == 1 { "y" } else { "ies" },
            out.join("data").display()
        );
    }
    let data = out.join("data");
    let Ok(shards) = std::fs::read_dir(&data) else {
        return Ok(());
    };
    for e in shards {
        let p = e
            .with_context(|| format!("reading {}", data.display()))?
            .path();
        if p.extension().is_some_and(|x| x == "parquet") && p.is_file() {
            std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
        }
    }
    Ok(())
}

/// Runs `rlreplay synth`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (eos, from) = match (args.eos, &args.tokenizer) {
        (Some(id), _) => (id, "--eos".to_string()),
        (None, Some(t)) => {
            let named = EosArgs::default()
                .resolve(Some(t), None, None)?
                .context("the --tokenizer directory names no end-of-sequence id")?;
            (named.ids[0], named.from)
        }
        (None, None) => (
            SynthConfig::default().eos,
            "the published run's default; set --eos or --tokenizer".to_string(),
        ),
    };
    let cfg = SynthConfig {
        steps: args.steps,
        first_step: args.first_step,
        prompts: args.prompts,
        group: args.group,
        vocab: args.vocab,
        mean_len: args.mean_len,
        max_len: args.max_len,
        prompt_len: args.prompt_len,
        eos,
        pattern_len: args.pattern_len,
        seed: args.seed,
    };
    prepare_out(&args.out, args.force)?;
    let bar = super::audit::progress(cfg.steps, "synth");
    let files = write_dataset(&args.out, &cfg, |_| bar.inc(1))?;
    bar.finish_and_clear();
    eprintln!(
        "wrote {} shard(s) of {} rows to {} (end of sequence: {eos}, from {from})",
        files.len(),
        cfg.prompts * cfg.group,
        args.out.join("data").display()
    );
    Ok(ExitCode::SUCCESS)
}
