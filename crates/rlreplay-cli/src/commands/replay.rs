//! `rlreplay replay`: train a Qwen3 policy on a rollout dataset.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use rlreplay_train::{ReplayConfig, RunOptions};

/// Arguments of `rlreplay replay`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    run: super::RunArgs,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// Runs `rlreplay replay`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let config_path = args.run.config_path()?;
    let (config, warnings) = ReplayConfig::load_reporting(&config_path, &args.run.set)?;
    super::RunArgs::warn(&warnings);
    let out = args.run.out_dir(config.run.dir.as_deref(), "[run] dir")?;
    let opts = RunOptions {
        config,
        out: out.clone(),
        resume: args.run.resume,
        stop_after: args.run.stop_after,
        progress: !args.quiet && std::io::stderr().is_terminal(),
    };
    let summary =
        rlreplay_train::run(&opts).with_context(|| format!("replay into {}", out.display()))?;
    let m = &summary.last_metrics;
    let get = |k: &str| m.get(k).copied().unwrap_or(f64::NAN);
    println!(
        "trained {}/{} steps ({} updates skipped); last step: score {:.4}, loss {:.6}, grad norm {:.4}",
        summary.global_step,
        summary.planned_steps,
        summary.skipped_updates,
        get("critic/score/mean"),
        get("actor/pg_loss"),
        get("actor/grad_norm"),
    );
    println!("run directory:  {}", out.display());
    println!("  metrics:      {}", out.join("metrics.jsonl").display());
    println!(
        "  scores:       {}",
        out.join("training_scores.csv").display()
    );
    println!(
        "  plot:         {}",
        out.join("plots/training_score.png").display()
    );
    if let Some(c) = &summary.last_checkpoint {
        println!("  checkpoint:   {}", c.display());
    }
    Ok(ExitCode::SUCCESS)
}
