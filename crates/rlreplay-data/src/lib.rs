//! Rollout datasets: reading, validation, statistics, writing and synthesis of Parquet rollout shards.
