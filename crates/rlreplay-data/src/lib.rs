//! Rollout datasets: reading, validation, statistics, writing and synthesis of Parquet rollout shards.
//!
//! A dataset holds one Parquet shard per trainer step ([`Dataset`]); a shard is read into a
//! [`RolloutBatch`] (flat token and log-prob buffers with row offsets) and validated on every read
//! ([`ValidationReport`]). [`write_shard`] writes the canonical schema, [`synth`] generates
//! datasets, [`AuditSums`] computes per-step statistics.
#![warn(missing_docs)]

pub mod batch;
pub mod dataset;
pub mod error;
pub mod hub;
mod lists;
mod pages;
pub mod read;
pub mod report;
pub mod stats;
pub mod steps;
pub mod stop;
pub mod synth;
pub mod tokenizer;
pub mod write;

pub use batch::RolloutBatch;
pub use dataset::{shard_step, step_from_name, Dataset, StepIter};
pub use error::{Error, IoContext, IoError, Result};
pub use hub::{resolve_hub_path, HubConfig, HubKind, HubPath};
pub use read::{
    read_footer, read_shard, read_shard_reusing, validate_shard, ReadOptions, ShardFooter,
};
pub use report::{Issue, IssueKind, ValidationReport};
pub use stats::{AuditStats, AuditSums};
pub use steps::StepRange;
pub use stop::{StopIds, STOP_IDS_KEY};
pub use tokenizer::{default_tokenizer_path, load_tokenizer, Tokenizer};
pub use write::{canonical_schema, shard_path, write_shard, ShardWriter};
