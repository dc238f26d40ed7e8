//! The RL algorithm layer: group advantages, policy losses, rollout correction and aggregation
//! as pure functions over flat per-token arrays.
//!
//! Every array holds one value per token of a batch described by row offsets
//! (`offsets.len() == rows + 1`). Everything is computed in f64.
#![warn(missing_docs)]

pub mod advantage;
pub mod config;
pub mod correction;
pub mod error;
pub mod layout;
pub mod loss;
pub mod metrics;
pub mod rlsd;

pub use advantage::{compute_advantages, Advantages, ESTIMATOR_BINARY_THRESHOLD};
pub use config::{
    AdvEstimator, AggMode, AggNormalizer, AlgoConfig, IsLevel, IsMode, KlType, LossMode,
    PolicyObjective, RsThreshold, SingletonPolicy, TeacherRatio,
};
pub use correction::{off_policy_metrics, rollout_correction, RolloutCorrection};
pub use error::{AlgoError, Result};
pub use loss::{mini_batch_loss, policy_loss, LossOutput, MicroBatch, Normalizer};
pub use metrics::{MetricAccumulator, Metrics};
pub use rlsd::trust_region_logprobs;

#[cfg(test)]
mod proptests;
