//! Online RL for Qwen3 policies: generate rollouts, score them, update the policy (the update,
//! the RLSD teacher contexts and the trust-region / EMA teachers are the replay trainer's, in
//! `rlreplay-train`).
//!
//! - [`toy`]: the toy arithmetic task (tokenizer, prompts, tiny model) for CPU demos and tests.
//! - [`config`]: the `rlreplay train` configuration.
//! - [`trainer`]: the online loop, run directory, checkpoints, resume and published results.
#![warn(missing_docs)]

pub mod config;
pub mod toy;
pub mod trainer;
