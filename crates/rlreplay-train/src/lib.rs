//! Training a policy: one [`Trainer`] fed by a [`RolloutSource`] — a logged rollout dataset
//! replayed along a schedule (`rlreplay replay`) or rollouts generated from the policy being
//! trained (`rlreplay train`) — over one configuration schema and one run-directory layout.
//!
//! - [`trainer`]: the trainer (policy, optimizer, teacher, run directory, checkpoints, resume,
//!   validation, best policy, metrics, published results).
//! - [`source`]: the rollout-source trait, its logged and online sources, and [`source::open`].
//! - [`config`]: the one configuration of both fronts and the kinds of rollout source with what
//!   each needs ([`SourceKind`]); a leaf that the other modules read.
//! - [`update`]: one policy update on a batch of rollouts.
//! - [`dist`]: data-parallel updates on the ranks of `mpirun` / `srun` (the model passes shared
//!   out, the gradients summed before clipping and AdamW).
//! - [`context`]: RLSD teacher contexts (`sibling`, `reference`, `sibling+feedback`), templates,
//!   truncation of over-long teacher prompts, the self-distillation mask.
//! - [`teacher`]: the trust-region and EMA teachers and their log-probs.
//! - [`schedule`]: plans and row selection over a logged dataset's steps.
//! - [`prompts`], [`validate`]: prompt sets and validation mean@k.
//! - [`rundir`]: the run directory; [`export`]: a run directory as the published model card's
//!   layout; [`toy`]: the toy arithmetic task for CPU demos and tests.
#![warn(missing_docs)]

pub mod config;
pub mod context;
pub mod dist;
pub mod error;
pub mod export;
pub mod plot;
pub mod prompts;
pub mod rundir;
pub mod schedule;
pub mod source;
pub mod teacher;
pub mod toy;
pub mod trainer;
pub mod update;
pub mod validate;

pub use config::{Config, SourceKind};
pub use error::{Error, Result};
pub use source::{RolloutSource, RolloutStep};
pub use trainer::{run, RunOptions, RunSummary, Trainer, TrainerState};
