//! The replay trainer: train a Qwen3 policy on a logged rollout dataset; and the pieces the online
//! trainer shares with it.
//!
//! - [`update`]: one policy update on a batch of rollouts (both trainers' update step).
//! - [`context`]: RLSD teacher contexts (`sibling`, `reference`, `sibling+feedback`), templates,
//!   truncation of over-long teacher prompts, the self-distillation mask.
//! - [`teacher`]: the trust-region and EMA teachers and their log-probs.
#![warn(missing_docs)]

pub mod config;
pub mod context;
pub mod plot;
pub mod rundir;
pub mod schedule;
pub mod teacher;
pub mod trainer;
pub mod update;

pub use config::ReplayConfig;
pub use trainer::{run, RunOptions, RunSummary, TrainerState};
