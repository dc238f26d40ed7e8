//! `rlreplay show`.

use std::process::ExitCode;

use anyhow::{bail, Context};
use rlreplay_data::{default_tokenizer_path, load_tokenizer, Dataset, ReadOptions, StepRange};

use super::eos::EosArgs;

/// Arguments of `rlreplay show`.
#[derive(clap::Args)]
pub struct Args {
    /// Dataset: a directory, a file, a glob, or hf://datasets/OWNER/NAME.
    pub path: String,
    /// Step of the row (default: the first step).
    #[arg(long)]
    pub step: Option<i64>,
    /// Row index within the step's shard.
    #[arg(long, default_value_t = 0)]
    pub row: usize,
    /// tokenizer.json (file, directory or hf://OWNER/NAME); default: the installed Qwen3 tokenizer
    /// when found, else raw ids are shown. Its directory also names the end-of-sequence ids.
    #[arg(long)]
    pub tokenizer: Option<String>,
    #[command(flatten)]
    pub eos: EosArgs,
    /// Skip bad rows when reading (row indices then count kept rows).
    #[arg(long)]
    pub lenient: bool,
}

fn ids(t: &[u32]) -> String {
    let s = |x: &[u32]| x.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
    if t.len() <= 80 {
        s(t)
    } else {
        format!(
            "{} … ({} more) … {}",
            s(&t[..64]),
            t.len() - 80,
            s(&t[t.len() - 16..])
        )
    }
}

/// Runs `rlreplay show`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let range = args.step.map_or(StepRange::ALL, |s| StepRange::new(s, s));
    let ds = Dataset::open_steps(&args.path, range)?;
    let eos = args
        .eos
        .resolve(args.tokenizer.as_deref(), Some(&ds), None)?;
    let step = ds.steps()[0].0;
    let opts = ReadOptions {
        lenient: args.lenient,
        eos: eos.as_ref().map(|e| e.ids.clone()).unwrap_or_default(),
        vocab: None,
        max_positions: None,
    };
    let (b, _) = ds.read_step(step, &opts)?;
    if args.row >= b.len() {
        bail!(
            "step {step} has {} rows; row {} does not exist",
            b.len(),
            args.row
        );
    }
    let tok = match &args.tokenizer {
        Some(t) => Some(load_tokenizer(t)?),
        None => default_tokenizer_path()
            .filter(|p| p.is_file())
            .map(|p| load_tokenizer(&p.to_string_lossy()))
            .transpose()?,
    };
    let i = args.row;
    let (prompt, response, lps) = (b.prompt(i), b.response(i), b.log_probs(i));
    let n = lps.len().max(1) as f64;
    let sum: f64 = lps.iter().map(|&x| f64::from(x)).sum();
    let min = lps.iter().copied().fold(f32::INFINITY, f32::min);
    let max = lps.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    println!("file:        {}", b.source.display());
    println!("step:        {step}   row: {i}   uid: {}", b.uids[i]);
    println!("score:       {}", b.scores[i]);
    println!(
        "lengths:     prompt {}   response {}   truncated: {}",
        prompt.len(),
        response.len(),
        eos.as_ref()
            .map_or_else(|| "unknown".into(), |e| b.truncated(i, &e.ids).to_string())
    );
    match &eos {
        Some(eos) => println!("             {eos}"),
        None => println!("             {}", super::eos::UNKNOWN),
    }
    println!(
        "log-probs:   sum {sum:.4}   mean {:.4}   min {min:.4}   max {max:.4}",
        sum / n
    );
    if let Some(d) = &b.data_source[i] {
        println!("data_source: {d}");
    }
    if let Some(g) = &b.ground_truth[i] {
        println!("ground_truth: {g}");
    }
    if let (Some(t), Some(p)) = (b.temperature[i], b.top_p[i]) {
        println!("sampling:    temperature {t}   top_p {p}");
    }
    match tok {
        Some(tok) => {
            let dec = |x: &[u32]| {
                tok.decode(x, false)
                    .map_err(|e| anyhow::anyhow!("{e}"))
                    .context("decoding")
            };
            println!("--- prompt ---\n{}", dec(prompt)?);
            println!("--- response ---\n{}", dec(response)?);
        }
        None => {
            println!("--- prompt ids ---\n{}", ids(prompt));
            println!("--- response ids ---\n{}", ids(response));
        }
    }
    Ok(ExitCode::SUCCESS)
}
