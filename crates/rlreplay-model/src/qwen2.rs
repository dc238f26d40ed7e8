//! Qwen2 / Qwen2.5 (`Qwen2ForCausalLM`): biases on the q, k and v projections, no query/key norm.
//! The published RL recipes on Qwen2.5-Math-1.5B/7B start from this architecture.

use serde_json::{Map, Value};

use crate::layer::LayerKind;
use crate::{Error, Result};

/// The decoder layer of Qwen2.
pub(crate) const LAYER: LayerKind = LayerKind {
    qkv_bias: true,
    o_bias: false,
    qk_norm: false,
};

/// `tie_word_embeddings` when `config.json` leaves it out (transformers' `Qwen2Config`).
pub(crate) const DEFAULT_TIED: bool = false;

/// Refuses the `config.json` keys of Qwen2 that this module does not implement: a `head_dim`
/// other than `hidden_size / num_attention_heads` (transformers' Qwen2 derives the head width from
/// them).
pub(crate) fn check_hf_config(obj: &Map<String, Value>) -> Result<()> {
    let get = |k: &str| obj.get(k).and_then(Value::as_u64);
    if let (Some(d), Some(h), Some(n)) = (
        get("head_dim"),
        get("hidden_size"),
        get("num_attention_heads"),
    ) {
        if d * n != h {
            return Err(Error::Config(format!(
                "head_dim = {d} is not hidden_size / num_attention_heads = {h} / {n}"
            )));
        }
    }
    Ok(())
}
