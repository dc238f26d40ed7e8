//! `rlreplay export`: a run directory as the published model card's layout.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use rlreplay_train::export::{export, CheckpointChoice, ExportOptions};

/// Arguments of `rlreplay export`.
#[derive(clap::Args)]
pub struct Args {
    /// Run directory of `rlreplay train` or `rlreplay replay` (finished or interrupted).
    pub run_dir: PathBuf,
    /// Card directory to write: the root policy, checkpoints/last/, results/, artifacts/,
    /// README.md.
    #[arg(long)]
    pub out: PathBuf,
    /// Policy at the card's root: best (by validation mean@k; the last one when the run never
    /// validated), last, or global_step_N.
    #[arg(long, default_value = "best", value_parser = parse_checkpoint)]
    pub checkpoint: CheckpointChoice,
    /// Replace an existing non-empty card directory.
    #[arg(long)]
    pub force: bool,
    /// Hub id of the base model for the card's metadata (default: derived from [model] path
    /// when it names one).
    #[arg(long, value_name = "OWNER/NAME")]
    pub base_model: Option<String>,
    /// License for the card's metadata (default: the base model README's, when it has one).
    #[arg(long)]
    pub license: Option<String>,
    /// For a LoRA run: the root policy's adapter merged into the base model's weights (the
    /// Hugging Face layout) instead of the adapter alone.
    #[arg(long)]
    pub merge: bool,
    /// The report as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

fn parse_checkpoint(s: &str) -> Result<CheckpointChoice, String> {
    s.parse().map_err(|e: rlreplay_train::Error| e.to_string())
}

/// Runs `rlreplay export`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let opts = ExportOptions {
        run_dir: args.run_dir,
        card_dir: args.out,
        checkpoint: args.checkpoint,
        force: args.force,
        base_model: args.base_model,
        license: args.license,
        merge: args.merge,
    };
    let report = export(&opts).with_context(|| {
        format!(
            "exporting {} to {}",
            opts.run_dir.display(),
            opts.card_dir.display()
        )
    })?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    let card = &report.card_dir;
    println!(
        "exported {} to {}{}",
        report.run_dir.display(),
        card.display(),
        if report.replaced { " (replaced)" } else { "" }
    );
    let mean = report
        .root_mean
        .map(|m| format!(", validation mean@{} {m:.4}", report.k))
        .unwrap_or_default();
    println!(
        "  root policy:  {} (step {}{mean})",
        report.root, report.root_step
    );
    if let Some(note) = &report.note {
        println!("  note:         {note}");
    }
    if let Some(b) = &report.best {
        println!(
            "  best:         step {}, mean@{} {:.4}",
            b.step, report.k, b.mean
        );
    }
    println!(
        "  last policy:  {} (step {})",
        card.join("checkpoints/last").display(),
        report.last_step
    );
    println!("  results:      {}", card.join("results").display());
    println!("  artifacts:    {}", card.join("artifacts").display());
    println!("  model card:   {}", card.join("README.md").display());
    Ok(ExitCode::SUCCESS)
}
