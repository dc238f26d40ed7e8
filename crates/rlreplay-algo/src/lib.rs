//! The RL algorithm layer: group advantages, policy losses, rollout correction and aggregation
//! as pure functions over flat per-token arrays.
