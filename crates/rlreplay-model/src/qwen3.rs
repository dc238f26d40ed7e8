//! Qwen3 (`Qwen3ForCausalLM`): RMSNorm on every query and key head before the rotary embedding,
//! no projection biases.

use serde_json::{Map, Value};

use crate::config::refuse_if;
use crate::layer::LayerKind;
use crate::Result;

/// The decoder layer of Qwen3.
pub(crate) const LAYER: LayerKind = LayerKind {
    qkv_bias: false,
    o_bias: false,
    qk_norm: true,
};

/// `tie_word_embeddings` when `config.json` leaves it out.
pub(crate) const DEFAULT_TIED: bool = true;

/// Refuses the `config.json` keys of Qwen3 that this module does not implement.
pub(crate) fn check_hf_config(obj: &Map<String, Value>) -> Result<()> {
    refuse_if(obj, "attention_bias", |v| v.as_bool() == Some(true))
}
