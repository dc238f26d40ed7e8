//! `rlreplay train`: online RL (generate, score, update), including RLSD_TR.

use std::process::ExitCode;

use anyhow::Context;
use rlreplay_train::SourceKind;

/// Arguments of `rlreplay train`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    run: super::RunArgs,
}

/// Runs `rlreplay train`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let opts = args.run.options(SourceKind::Online)?;
    let out = opts.out.clone();
    let summary = rlreplay_train::run(&opts)
        .with_context(|| format!("online training into {}", out.display()))?;
    let m = &summary.last_metrics;
    let get = |k: &str| m.get(k).copied().unwrap_or(f64::NAN);
    println!(
        "trained {} steps; last step: score {:.4}, loss {:.6}, grad norm {:.4}",
        summary.global_step,
        get("critic/score/mean"),
        get("actor/pg_loss"),
        get("actor/grad_norm"),
    );
    super::print_time_per_step(&summary);
    for (step, v) in &summary.validations {
        println!("  validation step {step:>5}: mean@k {:.4}", v);
    }
    if let Some((s, v)) = summary.best {
        println!("best validation: step {s}, mean@k {v:.4} (model at the run root)");
    }
    println!("run directory:  {}", out.display());
    println!("  results:      {}", out.join("results").display());
    println!("  rollouts:     {}", out.join("rollouts/data").display());
    println!("  last model:   {}", out.join("checkpoints/last").display());
    println!("  log:          {}", out.join("run.log").display());
    Ok(ExitCode::SUCCESS)
}
