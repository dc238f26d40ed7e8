//! `rlreplay train`: online RL (generate, score, update), including RLSD_TR.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use rlreplay_online::config::OnlineConfig;
use rlreplay_online::trainer::{run as run_online, Provenance, RunOptions};

/// Arguments of `rlreplay train`.
#[derive(clap::Args)]
pub struct Args {
    /// Run configuration (TOML). With --resume it may be left out: the run directory's
    /// config.toml is used.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Run directory (overrides `[trainer] dir`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Override one configuration key, e.g. `--set optim.lr=1e-5` (repeatable; values are TOML).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    set: Vec<String>,
    /// Continue from the run directory's latest complete checkpoint (weights, optimizer, prompt
    /// sampler position).
    #[arg(long)]
    resume: bool,
    /// Stop after this step (a checkpoint is written); continue later with --resume.
    #[arg(long, value_name = "STEP")]
    stop_after: Option<u64>,
}

/// Runs `rlreplay train`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let config_path = match (&args.config, &args.out) {
        (Some(c), _) => c.clone(),
        (None, Some(out)) if args.resume => out.join("config.toml"),
        _ => bail!("--config is required (it may be left out only with --resume and --out)"),
    };
    let text = std::fs::read_to_string(&config_path)
        .with_context(|| format!("cannot read config {}", config_path.display()))?;
    let config = OnlineConfig::parse(&text, &args.set)
        .with_context(|| format!("in config {}", config_path.display()))?;
    let out = match (&args.out, &config.trainer.dir) {
        (Some(o), _) => o.clone(),
        (None, Some(d)) => d.clone(),
        (None, None) => bail!("no run directory: pass --out or set [trainer] dir"),
    };
    let opts = RunOptions {
        config,
        provenance: Provenance {
            file: Some((config_path, text)),
            overrides: args.set.clone(),
        },
        out: out.clone(),
        resume: args.resume,
        stop_after: args.stop_after,
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
