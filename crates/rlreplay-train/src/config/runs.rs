//! The configurations of earlier runs: how a configuration compares with the one a run started
//! with on `--resume`, and the replay configuration of an online run.

use std::path::Path;

use super::{Config, SourceKind};
use crate::error::{Error, Result};

/// What may differ between the configuration a run started with and the one it resumes with.
pub const MAY_CHANGE_ON_RESUME: &str = "[trainer] save_freq, keep, dir, loggers, \
     collective_timeout_s; [optim] shard_optimizer_state; [rollout] endpoints, request_timeout_s, \
     retries, retry_backoff_s";

impl Config {
    /// The configuration as it compares on `--resume`: what may change cleared
    /// ([`MAY_CHANGE_ON_RESUME`]).
    pub fn comparable(&self) -> Self {
        let mut c = self.clone();
        c.trainer.save_freq = 0;
        c.trainer.keep = 0;
        c.trainer.dir = None;
        c.trainer.loggers.clear();
        c.trainer.collective_timeout_s = 0;
        c.optim.shard_optimizer_state = false;
        // Where the inference servers run and how they are reached: servers restarted after a
        // failure come back on other hosts or ports.
        c.rollout.endpoints.clear();
        c.rollout.request_timeout_s = 0.0;
        c.rollout.retries = 0;
        c.rollout.retry_backoff_s = 0.0;
        c
    }

    /// The replay configuration of the online run in `run_dir`, as TOML text: the run's
    /// resolved configuration (`RUN_DIR/config.toml`) replaying its logged rollouts
    /// (`RUN_DIR/rollouts`) onto its initial policy (`RUN_DIR/initial` after the toy task's
    /// warm-up, else its `[model]`), with the same algorithm, batches, optimizer, schedule and
    /// seed; the online-only keys are dropped and so is `[trainer] dir`. Replayed with the same
    /// build, it trains the online run's policy bit for bit.
    pub fn replay_of_run(run_dir: &Path) -> Result<String> {
        let rollouts = run_dir.join("rollouts");
        if !rollouts.is_dir() {
            return Err(Error::config(
                "data.path",
                format!(
                    "{}: no rollouts to replay: not the directory of an online run \
                     (`rlreplay train` writes them there)",
                    rollouts.display()
                ),
            ));
        }
        let (mut c, _) = Config::load(&run_dir.join("config.toml"), &[], SourceKind::Online)?;
        c.source = SourceKind::Logged;
        c.data.path = Some(rollouts.display().to_string());
        let initial = run_dir.join("initial");
        if initial.join("model.safetensors").is_file() {
            c.model.path = Some(initial);
            c.model.random = None;
        }
        c.trainer.dir = None;
        c.to_toml()
    }
}
