//! `rlreplay replay`: train a policy on a logged rollout dataset.

use std::process::ExitCode;

use anyhow::Context;
use rlreplay_train::SourceKind;

/// Arguments of `rlreplay replay`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    run: super::RunArgs,
    /// Replay an online run (a `rlreplay train` directory): its resolved configuration, its
    /// logged rollouts and its initial policy; `--set` changes what a study varies. With the same
    /// build it trains the online run's policy bit for bit.
    #[arg(long, value_name = "RUN_DIR", conflicts_with = "config")]
    from_run: Option<std::path::PathBuf>,
}

/// Runs `rlreplay replay`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let opts = match &args.from_run {
        Some(dir) if !args.run.resume => {
            let text = rlreplay_train::Config::replay_of_run(dir)
                .with_context(|| format!("--from-run {}", dir.display()))?;
            args.run
                .options_of(dir.join("config.toml"), text, SourceKind::Logged)?
        }
        // A resumed replay reads its own saved configuration.
        _ => args.run.options(SourceKind::Logged)?,
    };
    let out = opts.out.clone();
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
    super::print_time_per_step(&summary);
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
