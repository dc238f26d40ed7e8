//! `rlreplay validate`.

use std::process::ExitCode;

use anyhow::Context;
use rlreplay_data::{validate_shard, Dataset, ReadOptions, StepRange, ValidationReport};

use super::eos::EosArgs;

/// Arguments of `rlreplay validate`.
#[derive(clap::Args)]
pub struct Args {
    /// Dataset: a directory, a file, a glob, or hf://datasets/OWNER/NAME.
    pub path: String,
    /// Steps to check, inclusive: A..B, A.., ..B or A.
    #[arg(long, default_value = "..")]
    pub steps: StepRange,
    /// Skip bad rows and report their counts; exit 1 only for files that cannot be read at all.
    #[arg(long)]
    pub lenient: bool,
    /// Token ids must be below this vocabulary size (default with --model: the model's).
    #[arg(long)]
    pub vocab: Option<u32>,
    /// The policy the rows are for (a model directory): check them as the trainer does (token
    /// ids below its `vocab_size`, prompt and response within its `max_position_embeddings`).
    /// Its directory also names the end-of-sequence ids when the dataset names none.
    #[arg(long)]
    pub model: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub eos: EosArgs,
    /// Tokenizer or model (tokenizer.json, its directory, or hf://OWNER/NAME) whose directory
    /// names the end-of-sequence ids.
    #[arg(long)]
    pub tokenizer: Option<String>,
}

/// Runs `rlreplay validate`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let ds = match Dataset::open_steps(&args.path, args.steps) {
        Ok(ds) => ds,
        Err(e) => {
            println!("error: {}", rlreplay_data::error::chain(&e));
            return Ok(ExitCode::from(1));
        }
    };
    let eos = args
        .eos
        .resolve(args.tokenizer.as_deref(), Some(&ds), args.model.as_deref())?;
    let model = args
        .model
        .as_ref()
        .map(|m| {
            rlreplay_model::ModelConfig::from_hf_json(m.join("config.json"))
                .with_context(|| format!("--model {}", m.display()))
        })
        .transpose()?;
    let opts = ReadOptions {
        lenient: args.lenient,
        eos: eos.as_ref().map(|e| e.ids.clone()).unwrap_or_default(),
        vocab: args.vocab.or_else(|| {
            model
                .as_ref()
                .and_then(|m| u32::try_from(m.vocab_size).ok())
        }),
        max_positions: model.as_ref().map(|m| m.max_position_embeddings),
    };
    let shards = ds.steps();
    let bar = super::audit::progress(shards.len(), "validate");
    let mut total = ValidationReport::default();
    let mut failed_files = 0;
    for (step, path) in &shards {
        let report = validate_shard(path, *step, &opts);
        let fatal = if args.lenient {
            report.counts.keys().any(|k| k.is_structural())
        } else {
            !report.is_clean()
        };
        failed_files += usize::from(fatal);
        if !report.is_clean() {
            bar.suspend(|| {
                println!("{}: {} problem(s)", path.display(), report.issue_count());
                for i in report.issues.iter().take(10) {
                    println!("  {i}");
                }
            });
        }
        total.merge(report);
        bar.inc(1);
    }
    bar.finish_and_clear();
    match &eos {
        Some(eos) => println!("{} shard(s) checked; {eos}", shards.len()),
        None => println!("{} shard(s) checked; {}", shards.len(), super::eos::UNKNOWN),
    }
    print!("{total}");
    if failed_files > 0 {
        println!("FAILED: {failed_files} shard(s) with problems");
        return Ok(ExitCode::from(1));
    }
    println!("OK");
    Ok(ExitCode::SUCCESS)
}
