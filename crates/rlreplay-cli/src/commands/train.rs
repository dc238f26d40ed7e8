//! `rlreplay train`: online RL (generate, score, update), including RLSD_TR.

use std::process::ExitCode;

use anyhow::Context;
use rlreplay_online::config::OnlineConfig;
use rlreplay_online::trainer::{run as run_online, Provenance, RunOptions};

/// Arguments of `rlreplay train`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    run: super::RunArgs,
}

/// Runs `rlreplay train`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let config_path = args.run.config_path()?;
    let text = std::fs::read_to_string(&config_path)
        .with_context(|| format!("cannot read config {}", config_path.display()))?;
    let (config, warnings) = OnlineConfig::parse_reporting(&text, &args.run.set)
        .with_context(|| format!("in config {}", config_path.display()))?;
    super::RunArgs::warn(&warnings);
    let out = args
        .run
        .out_dir(config.trainer.dir.as_deref(), "[trainer] dir")?;
    let opts = RunOptions {
        config,
        provenance: Provenance {
            file: Some((config_path, text)),
            overrides: args.run.set.clone(),
        },
        out: out.clone(),
        resume: args.run.resume,
        stop_after: args.run.stop_after,
    };
    let summary =
        run_online(&opts).with_context(|| format!("online training into {}", out.display()))?;
    let m = &summary.last_metrics;
    let get = |k: &str| m.get(k).copied().unwrap_or(f64::NAN);
    println!(
        "trained {} steps; last step: score {:.4}, loss {:.6}, grad norm {:.4}",
        summary.global_step,
        get("critic/score/mean"),
        get("actor/pg_loss"),
        get("actor/grad_norm"),
    );
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
