//! The model's hyper-parameters from GGUF metadata, and the `config.json` and
//! `generation_config.json` transformers reads them from.

use serde_json::{json, Map, Value};

use super::Meta;
use crate::config::{
    MAX_HEADS, MAX_HEAD_DIM, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB,
};
use crate::Result;

/// The GGUF architectures (`general.architecture`) the converter reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arch {
    /// `llama`: Llama, SmolLM, Mistral-style decoders; llama.cpp permutes the Q and K rows.
    Llama,
    /// `qwen2`: Qwen2 and Qwen2.5, biases on the q/k/v projections.
    Qwen2,
    /// `qwen3`: Qwen3, RMSNorm on every query and key head.
    Qwen3,
}

impl Arch {
    const ALL: [Arch; 3] = [Arch::Llama, Arch::Qwen2, Arch::Qwen3];

    /// The `general.architecture` value, also the prefix of the architecture's metadata keys.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
    }

    /// The Hugging Face `model_type`.
    pub(crate) fn model_type(self) -> &'static str {
        self.name()
    }

    /// The Hugging Face model class.
    fn class_name(self) -> &'static str {
        match self {
            Arch::Llama => "LlamaForCausalLM",
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
        }
    }
}

/// What the metadata says about the model's shape.
#[derive(Debug, Clone)]
pub(crate) struct Hyper {
    pub arch: Arch,
    pub layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub context: usize,
    pub rope_theta: f64,
    pub rms_eps: f64,
    /// `rope_scaling` for `config.json`, when the file scales the rotary embedding.
    pub rope_scaling: Option<Value>,
    pub bos: Option<u64>,
    pub eos: Option<u64>,
    pub pad: Option<u64>,
}

/// Reads and bounds the hyper-parameters.
pub(crate) fn hyper(meta: &Meta) -> Result<Hyper> {
    let arch_name = meta
        .str("general.architecture")?
        .ok_or_else(|| meta.err("general.architecture is missing"))?;
    let arch = Arch::ALL
        .into_iter()
        .find(|a| a.name() == arch_name)
        .ok_or_else(|| {
            meta.err(format!(
                "general.architecture = {arch_name:?} is not supported (supported: llama, qwen2, \
                 qwen3)"
            ))
        })?;
    let p = arch.name();
    let bounded = |key: &str, max: usize| -> Result<usize> {
        let key = format!("{p}.{key}");
        let v = meta
            .u64(&key)?
            .ok_or_else(|| meta.err(format!("{key} is missing")))?;
        bounded_value(meta, &key, v, max)
    };
    let layers = bounded("block_count", MAX_LAYERS)?;
    let hidden = bounded("embedding_length", MAX_HIDDEN)?;
    let ffn = bounded("feed_forward_length", MAX_INTERMEDIATE)?;
    let heads = bounded("attention.head_count", MAX_HEADS)?;
    let kv_heads = bounded("attention.head_count_kv", MAX_HEADS)?;
    let context = bounded("context_length", MAX_POSITIONS)?;
    let head_dim = match meta.u64(&format!("{p}.attention.key_length"))? {
        Some(v) => bounded_value(meta, &format!("{p}.attention.key_length"), v, MAX_HEAD_DIM)?,
        None if hidden.is_multiple_of(heads) => hidden / heads,
        None => {
            return Err(meta.err(format!(
                "{p}.attention.key_length is missing and {p}.embedding_length {hidden} is not a \
                 multiple of {p}.attention.head_count {heads}"
            )))
        }
    };
    if let Some(v) = meta.u64(&format!("{p}.attention.value_length"))? {
        if v != head_dim as u64 {
            return Err(meta.err(format!(
                "{p}.attention.value_length = {v} differs from the key length {head_dim}, which \
                 transformers does not support"
            )));
        }
    }
    if let Some(v) = meta.u64(&format!("{p}.rope.dimension_count"))? {
        if v != head_dim as u64 {
            return Err(meta.err(format!(
                "{p}.rope.dimension_count = {v} differs from the head width {head_dim} (a partial \
                 rotary embedding, which is not supported)"
            )));
        }
    }
    if !heads.is_multiple_of(kv_heads) {
        return Err(meta.err(format!(
            "{p}.attention.head_count = {heads} is not a multiple of {p}.attention.head_count_kv = \
             {kv_heads}"
        )));
    }
    if !head_dim.is_multiple_of(2) {
        return Err(meta.err(format!(
            "the head width {head_dim} is odd; the rotary embedding needs it even"
        )));
    }
    let vocab_key = format!("{p}.vocab_size");
    let vocab = match meta.u64(&vocab_key)? {
        Some(v) => bounded_value(meta, &vocab_key, v, MAX_VOCAB)?,
        None => match meta.array_len("tokenizer.ggml.tokens")? {
            Some(n) => bounded_value(meta, "tokenizer.ggml.tokens", n as u64, MAX_VOCAB)?,
            None => {
                return Err(meta.err(format!(
                    "neither {vocab_key} nor tokenizer.ggml.tokens gives the vocabulary size"
                )))
            }
        },
    };
    let rope_theta = meta
        .f64(&format!("{p}.rope.freq_base"))?
        .unwrap_or(10_000.0);
    if !(rope_theta.is_finite() && rope_theta > 1.0) {
        return Err(meta.err(format!(
            "{p}.rope.freq_base = {rope_theta} must be a finite number above 1"
        )));
    }
    let eps_key = format!("{p}.attention.layer_norm_rms_epsilon");
    let rms_eps = meta
        .f64(&eps_key)?
        .ok_or_else(|| meta.err(format!("{eps_key} is missing")))?;
    if !(rms_eps.is_finite() && rms_eps > 0.0 && rms_eps < 1.0) {
        return Err(meta.err(format!("{eps_key} = {rms_eps} is out of range (0, 1)")));
    }
    let rope_scaling = rope_scaling(meta, p)?;
    let token_id = |key: &str| -> Result<Option<u64>> {
        let key = format!("tokenizer.ggml.{key}");
        match meta.u64(&key)? {
            Some(id) if id >= vocab as u64 => Err(meta.err(format!(
                "{key} = {id} is outside the vocabulary of {vocab} tokens"
            ))),
            id => Ok(id),
        }
    };
    Ok(Hyper {
        arch,
        layers,
        hidden,
        ffn,
        heads,
        kv_heads,
        head_dim,
        vocab,
        context,
        rope_theta,
        rms_eps,
        rope_scaling,
        bos: token_id("bos_token_id")?,
        eos: token_id("eos_token_id")?,
        pad: token_id("padding_token_id")?,
    })
}

fn bounded_value(meta: &Meta, key: &str, v: u64, max: usize) -> Result<usize> {
    match usize::try_from(v) {
        Ok(v) if (1..=max).contains(&v) => Ok(v),
        _ => Err(meta.err(format!("{key} = {v} is out of range (1..={max})"))),
    }
}

/// The rotary scaling the metadata states: linear scaling becomes `rope_scaling`; other kinds
/// are refused. (llama3-style scaling is stored as a `rope_freqs.weight` tensor, refused where
/// the tensors are mapped.)
fn rope_scaling(meta: &Meta, p: &str) -> Result<Option<Value>> {
    let type_key = format!("{p}.rope.scaling.type");
    let factor_key = format!("{p}.rope.scaling.factor");
    let linear = |factor: Option<f64>, key: &str| -> Result<Option<Value>> {
        match factor {
            None => Err(meta.err(format!("{key} is missing for linear rope scaling"))),
            Some(1.0) => Ok(None),
            Some(f) if f.is_finite() && f > 0.0 => {
                Ok(Some(json!({"rope_type": "linear", "factor": f})))
            }
            Some(f) => Err(meta.err(format!("{key} = {f} is not a positive number"))),
        }
    };
    match meta.str(&type_key)? {
        None | Some("none") => {
            let legacy = format!("{p}.rope.scale_linear");
            match meta.f64(&legacy)? {
                Some(f) => linear(Some(f), &legacy),
                None => Ok(None),
            }
        }
        Some("linear") => linear(meta.f64(&factor_key)?, &factor_key),
        Some(other) => Err(meta.err(format!(
            "{type_key} = {other:?} is not supported (only linear rope scaling)"
        ))),
    }
}

/// `config.json` for transformers' `LlamaConfig`, `Qwen2Config` or `Qwen3Config`.
pub(crate) fn config_json(h: &Hyper, tied: bool, attention_bias: bool, torch_dtype: &str) -> Value {
    let mut c = Map::new();
    let mut set = |k: &str, v: Value| {
        c.insert(k.to_string(), v);
    };
    set("architectures", json!([h.arch.class_name()]));
    set("model_type", h.arch.model_type().into());
    set("vocab_size", h.vocab.into());
    set("hidden_size", h.hidden.into());
    set("intermediate_size", h.ffn.into());
    set("num_hidden_layers", h.layers.into());
    set("num_attention_heads", h.heads.into());
    set("num_key_value_heads", h.kv_heads.into());
    set("head_dim", h.head_dim.into());
    set("hidden_act", "silu".into());
    set("max_position_embeddings", h.context.into());
    set("rms_norm_eps", h.rms_eps.into());
    set("rope_theta", h.rope_theta.into());
    set(
        "rope_scaling",
        h.rope_scaling.clone().unwrap_or(Value::Null),
    );
    let mut rope_parameters = json!({"rope_theta": h.rope_theta, "rope_type": "default"});
    if let (Some(Value::Object(scaling)), Value::Object(rp)) =
        (&h.rope_scaling, &mut rope_parameters)
    {
        rp.extend(scaling.clone());
    }
    set("rope_parameters", rope_parameters);
    set("attention_dropout", 0.0.into());
    match h.arch {
        Arch::Llama => {
            set("attention_bias", attention_bias.into());
            set("mlp_bias", false.into());
            set("pretraining_tp", 1.into());
        }
        Arch::Qwen2 => {
            set("use_sliding_window", false.into());
            set("sliding_window", Value::Null);
            set("max_window_layers", h.layers.into());
        }
        Arch::Qwen3 => {
            set("attention_bias", attention_bias.into());
            set("use_sliding_window", false.into());
            set("sliding_window", Value::Null);
            set("max_window_layers", h.layers.into());
        }
    }
    set("tie_word_embeddings", tied.into());
    set("torch_dtype", torch_dtype.into());
    set("use_cache", true.into());
    for (key, id) in [
        ("bos_token_id", h.bos),
        ("eos_token_id", h.eos),
        ("pad_token_id", h.pad),
    ] {
        if let Some(id) = id {
            set(key, id.into());
        }
    }
    Value::Object(c)
}

/// `generation_config.json`: the special token ids.
pub(crate) fn generation_config(h: &Hyper) -> Value {
    let mut c = Map::new();
    for (key, id) in [
        ("bos_token_id", h.bos),
        ("eos_token_id", h.eos),
        ("pad_token_id", h.pad),
    ] {
        if let Some(id) = id {
            c.insert(key.to_string(), id.into());
        }
    }
    Value::Object(c)
}
