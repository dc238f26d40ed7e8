//! The replay trainer: train a Qwen3 policy on a logged rollout dataset.
#![warn(missing_docs)]

pub mod config;
pub mod plot;
pub mod rundir;
pub mod schedule;
pub mod trainer;

pub use config::ReplayConfig;
pub use trainer::{run, RunOptions, RunSummary, TrainerState};
