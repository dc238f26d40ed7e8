//! The Qwen3 causal language model on candle: packed per-token log-probs, backward, AdamW and
//! Hugging Face checkpoints.
//!
//! - [`Qwen3Config`]: the model configuration, read from a Hugging Face `config.json`.
//! - [`Qwen3`]: the model with f32 (or f64) master weights; [`Qwen3::logprobs`] for per-token
//!   log-probs of packed (prompt, response) pairs, [`Qwen3::forward_backward`] to accumulate the
//!   gradients of a weighted sum of those log-probs; [`Qwen3::load`] / [`Qwen3::save_hf`] for
//!   checkpoints in the Hugging Face layout; [`Qwen3::set_activation_recompute`] trades a second
//!   forward pass of the layers for activation memory in the backward pass.
//! - [`mixed_logprobs`]: per-token log-probs under a weighted mixture of several models' logits.
//! - [`AdamW`], [`LrSchedule`]: the optimizer (verl/torch semantics) and learning-rate schedules.
#![warn(missing_docs)]

mod checkpoint;
mod config;
pub mod generate;
mod mixed;
mod model;
pub mod ops;
mod optim;
mod pack;

pub use candle_core::{DType, Device};
pub use checkpoint::{SaveOptions, TOKENIZER_FILES};
pub use config::Qwen3Config;
pub use mixed::mixed_logprobs;
pub use model::{Param, Qwen3, TokenLogProbs};
pub use optim::{AdamW, AdamWConfig, LrSchedule, StepReport};
pub use pack::{micro_batches, SeqPair};

/// Errors of the model crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An invalid or unsupported model configuration.
    #[error("{0}")]
    Config(String),
    /// A checkpoint that cannot be read or written (missing, extra or mis-shaped tensors, ...).
    #[error("{0}")]
    Checkpoint(String),
    /// Invalid input to a model call (token ids, gradient lengths, ...).
    #[error("{0}")]
    Input(String),
    /// A file-system error, with the path it concerns.
    #[error("{0}")]
    Io(String),
    /// An error of the tensor library.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Result type of the model crate.
pub type Result<T> = std::result::Result<T, Error>;
