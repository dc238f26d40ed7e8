//! One module per subcommand; each exposes `Args` and `run`.

pub mod audit;
pub mod compute;
pub mod convert;
pub mod device_check;
pub mod eos;
pub mod eval;
pub mod export;
pub mod generate;
pub mod logprobs;
pub mod prepare;
pub mod replay;
pub mod serve;
pub mod show;
pub mod synth;
pub mod train;
pub mod validate;
pub mod verify;

/// Arguments shared by the training commands (`replay`, `train`).
#[derive(clap::Args)]
pub struct RunArgs {
    /// Run configuration (TOML). With --resume it may be left out: the run directory's
    /// config.toml is used.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// Run directory (overrides the configuration's run directory).
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
    /// Override one configuration key, e.g. `--set optim.lr=1e-5` (repeatable; values are TOML).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub set: Vec<String>,
    /// Continue from the run directory's latest complete checkpoint.
    #[arg(long)]
    pub resume: bool,
    /// Stop after this trainer step (a checkpoint is written); continue later with --resume.
    #[arg(long, value_name = "STEP", value_parser = clap::value_parser!(u64).range(1..))]
    pub stop_after: Option<u64>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

impl RunArgs {
    /// The run directory: `--out`, or the configuration's (`key` names it in the error).
    pub fn out_dir(
        &self,
        configured: Option<&std::path::Path>,
        key: &str,
    ) -> anyhow::Result<std::path::PathBuf> {
        match (&self.out, configured) {
            (Some(o), _) => Ok(o.clone()),
            (None, Some(d)) => Ok(d.to_path_buf()),
            (None, None) => anyhow::bail!("no run directory: pass --out or set {key}"),
        }
    }

    /// The run of a `kind` front: the configuration read (its deprecation warnings printed to
    /// stderr) with the `--set` overrides and their provenance, the run directory, resume and
    /// early stop; a progress bar on a terminal unless `--quiet`.
    pub fn options(
        &self,
        kind: rlreplay_train::SourceKind,
    ) -> anyhow::Result<rlreplay_train::RunOptions> {
        use anyhow::Context;
        let path = self.config_path()?;
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        self.options_of(path, text, kind)
    }

    /// [`RunArgs::options`] of configuration `text` (read from `path`).
    pub fn options_of(
        &self,
        path: std::path::PathBuf,
        text: String,
        kind: rlreplay_train::SourceKind,
    ) -> anyhow::Result<rlreplay_train::RunOptions> {
        use anyhow::Context;
        use std::io::IsTerminal;
        let (config, warnings) = rlreplay_train::Config::parse_reporting(&text, &self.set, kind)
            .with_context(|| format!("in config {}", path.display()))?;
        for w in warnings {
            eprintln!("warning: {w}");
        }
        let out = self.out_dir(config.trainer.dir.as_deref(), "[trainer] dir")?;
        Ok(rlreplay_train::RunOptions {
            config,
            provenance: rlreplay_train::rundir::Provenance {
                file: Some((path, text)),
                overrides: self.set.clone(),
            },
            out,
            resume: self.resume,
            stop_after: self.stop_after,
            progress: !self.quiet && std::io::stderr().is_terminal(),
        })
    }

    /// The configuration file: `--config`, or the run directory's saved one when resuming.
    pub fn config_path(&self) -> anyhow::Result<std::path::PathBuf> {
        match (&self.config, &self.out) {
            (Some(c), _) => Ok(c.clone()),
            (None, Some(out)) if self.resume => Ok(out.join("config.toml")),
            _ => anyhow::bail!(
                "--config is required (it may be left out only with --resume and --out)"
            ),
        }
    }
}

/// Loads the Hugging Face model directory `model`, with the PEFT adapter directory `adapter` on
/// it when given.
pub fn load_model(
    model: &std::path::Path,
    adapter: Option<&std::path::Path>,
    dtype: rlreplay_model::DType,
    device: &rlreplay_model::Device,
) -> anyhow::Result<rlreplay_model::Model> {
    use anyhow::Context;
    let mut m = rlreplay_model::Model::load(model, dtype, device)
        .with_context(|| format!("loading the model from {}", model.display()))?;
    if let Some(dir) = adapter {
        m.load_adapter(dir)
            .with_context(|| format!("loading the adapter {}", dir.display()))?;
    }
    Ok(m)
}

/// Warns on stderr about weights holding NaN or infinite values (what depends on them is NaN).
pub fn warn_non_finite(model: &std::path::Path, found: &[(String, usize)]) {
    for (name, n) in found {
        eprintln!(
            "warning: {}: tensor {name} holds {n} NaN or infinite value(s); log-probs and logits \
             that depend on it are NaN",
            model.display()
        );
    }
}

/// Prints where the run's steps spent their time (means over the steps run), when they ran any.
pub fn print_time_per_step(summary: &rlreplay_train::RunSummary) {
    if let Some(t) = rlreplay_train::rundir::time_breakdown(&summary.mean_timings, true) {
        println!("time per step: {t}");
    }
}
