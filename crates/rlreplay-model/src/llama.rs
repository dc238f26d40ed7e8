//! Llama (`LlamaForCausalLM`: Llama 2, Llama 3.x, SmolLM2): no query/key norm; with
//! `attention_bias`, biases on the q, k, v and o projections. Llama 3.1's frequency-dependent
//! rotary scaling (`rope_type = "llama3"`) is read by [`crate::RopeScaling`].

use serde_json::{Map, Value};

use crate::config::refuse_if;
use crate::layer::LayerKind;
use crate::Result;

/// The decoder layer of Llama, with or without attention biases.
pub(crate) fn layer(attention_bias: bool) -> LayerKind {
    LayerKind {
        qkv_bias: attention_bias,
        o_bias: attention_bias,
        qk_norm: false,
    }
}

/// `tie_word_embeddings` when `config.json` leaves it out (transformers' `LlamaConfig`).
pub(crate) const DEFAULT_TIED: bool = false;

/// Refuses the `config.json` keys of Llama that this module does not implement: biases in the MLP
/// and the tensor-parallel slicing of `pretraining_tp > 1`.
pub(crate) fn check_hf_config(obj: &Map<String, Value>) -> Result<()> {
    refuse_if(obj, "mlp_bias", |v| v.as_bool() == Some(true))?;
    refuse_if(obj, "pretraining_tp", |v| v.as_u64().is_some_and(|n| n > 1))
}
