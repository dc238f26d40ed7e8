//! The sampling engine and chat templates: token sampling from logits (temperature, top-k,
//! top-p), batched generation of `n` completions per prompt over the model's KV-cache decoder,
//! and chat-template rendering. Online training, `rlreplay generate` and evaluation all call it.
#![warn(missing_docs)]

pub mod chat;
pub mod engine;
pub mod error;
pub mod sampling;
pub mod special;

pub use error::{Error, Result};
pub use special::{stop_ids, stop_ids_from_files};
