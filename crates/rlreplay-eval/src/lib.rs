//! Evaluation of policies: validation-set reading, scoring, the metrics mean@k, pass@k and maj@k,
//! reports, and the pipeline that samples through `rlreplay-sampling` and scores the answers.
#![warn(missing_docs)]

pub mod dataset;
pub mod error;
pub mod metrics;
pub mod pipeline;
pub mod report;
pub mod scoring;

pub use error::{Error, Result};
