//! Online RL for Qwen3 policies: generate rollouts, score them, update the policy; and the
//! self-distillation pieces of RLSD: teacher contexts and the trust-region / EMA teachers.
//!
//! - [`context`]: teacher contexts (`sibling`, `reference`, `sibling+feedback`), templates,
//!   truncation of over-long teacher prompts, the self-distillation mask.
//! - [`teacher`]: trust-region teacher log-probs (mixed logits of the frozen initial model and the
//!   current model) and the EMA teacher update.
//! - [`toy`]: the toy arithmetic task (tokenizer, prompts, tiny model) for CPU demos and tests.
//! - [`teacher_lp`]: teacher log-probs of response tokens through the incremental decoder.
//! - [`config`]: the `rlreplay train` configuration.
//! - [`trainer`]: the online loop, run directory, checkpoints, resume and published results.
#![warn(missing_docs)]

pub mod config;
pub mod context;
pub mod teacher;
pub mod teacher_lp;
pub mod toy;
pub mod trainer;
