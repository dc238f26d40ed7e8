//! `rlreplay replay`: train a Qwen3 policy on a rollout dataset.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use rlreplay_train::{ReplayConfig, RunOptions};

/// Arguments of `rlreplay replay`.
#[derive(clap::Args)]
pub struct Args {
    /// Run configuration (TOML). With --resume it may be left out: the run directory's
    /// config.toml is used.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Run directory (overrides `[run] dir`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Override one configuration key, e.g. `--set optim.lr=1e-5` (repeatable; values are TOML).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    set: Vec<String>,
    /// Continue from the run directory's latest complete checkpoint.
    #[arg(long)]
    resume: bool,
    /// Stop after this trainer step (a checkpoint is written); continue later with --resume.
    #[arg(long, value_name = "STEP")]
    stop_after: Option<u64>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// Runs `rlreplay replay`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let config_path = match (&args.config, &args.out) {
        (Some(c), _) => c.clone(),
        (None, Some(out)) if args.resume => out.join("config.toml"),
        _ => bail!("--config is required (it may be left out only with --resume and --out)"),
    };
    let config = ReplayConfig::load(&config_path, &args.set)?;
    let out = match (&args.out, &config.run.dir) {
        (Some(o), _) => o.clone(),
        (None, Some(d)) => d.clone(),
        (None, None) => bail!("no run directory: pass --out or set [run] dir"),
    };
    let opts = RunOptions {
        config,
        out: out.clone(),
        resume: args.resume,
        stop_after: args.stop_after,
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
