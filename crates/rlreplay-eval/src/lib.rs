//! Evaluation of Qwen3 policies: chat-template rendering, token sampling, batched generation,
//! validation-set reading and the metrics mean@k, pass@k and maj@k.
#![warn(missing_docs)]

pub mod chat;
pub mod dataset;
pub mod engine;
pub mod metrics;
pub mod pipeline;
pub mod report;
pub mod sampling;
pub mod scoring;
