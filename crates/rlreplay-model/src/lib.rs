//! The Qwen3 causal language model on candle: packed per-token log-probs, backward, AdamW and
//! Hugging Face checkpoints.
pub mod ops;
