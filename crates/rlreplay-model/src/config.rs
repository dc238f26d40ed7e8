//! The model configuration, read from and written to a Hugging Face `config.json`: the sizes every
//! supported architecture (Qwen3, Qwen2, Llama) shares, the rotary embedding's scaling, and which
//! [`Architecture`] the checkpoint is.

use std::path::Path;

use serde_json::{Map, Value};

use crate::{Error, Result};

/// Upper bounds beyond which a configuration is refused as absurd, before anything is allocated.
pub(crate) const MAX_VOCAB: usize = 1 << 24;
pub(crate) const MAX_HIDDEN: usize = 1 << 16;
pub(crate) const MAX_INTERMEDIATE: usize = 1 << 20;
pub(crate) const MAX_LAYERS: usize = 1024;
pub(crate) const MAX_HEADS: usize = 1024;
pub(crate) const MAX_HEAD_DIM: usize = 1024;
pub(crate) const MAX_POSITIONS: usize = 1 << 24;
/// One trillion parameters.
const MAX_PARAMS: u128 = 1_000_000_000_000;

/// The architectures the model crate implements, by their Hugging Face `model_type`. Each has a
/// module ([`crate::qwen3`], [`crate::qwen2`], [`crate::llama`]) that reads its `config.json`
/// specifics and says what its decoder layers hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Architecture {
    /// `Qwen3ForCausalLM`: RMSNorm on every query and key head, no projection biases.
    #[default]
    Qwen3,
    /// `Qwen2ForCausalLM` (Qwen2, Qwen2.5, Qwen2.5-Math): biases on the q/k/v projections, no
    /// query/key norm.
    Qwen2,
    /// `LlamaForCausalLM` (Llama 2/3.x, SmolLM2): no query/key norm, biases on all four attention
    /// projections when `attention_bias` is set, untied by default.
    Llama,
}

impl Architecture {
    /// Every architecture, in declaration order.
    pub const ALL: [Architecture; 3] = [
        Architecture::Qwen3,
        Architecture::Qwen2,
        Architecture::Llama,
    ];

    /// The Hugging Face `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Qwen3 => "qwen3",
            Architecture::Qwen2 => "qwen2",
            Architecture::Llama => "llama",
        }
    }

    /// The Hugging Face model class written to `architectures`.
    pub fn class_name(self) -> &'static str {
        match self {
            Architecture::Qwen3 => "Qwen3ForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Llama => "LlamaForCausalLM",
        }
    }

    /// The architecture of a `model_type`, if supported.
    pub fn from_model_type(model_type: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.model_type() == model_type)
    }

    /// Refuses the `config.json` keys this architecture's module does not implement.
    fn check_hf(self, obj: &Map<String, Value>) -> Result<()> {
        match self {
            Architecture::Qwen3 => crate::qwen3::check_hf_config(obj),
            Architecture::Qwen2 => crate::qwen2::check_hf_config(obj),
            Architecture::Llama => crate::llama::check_hf_config(obj),
        }
    }

    /// `tie_word_embeddings` when `config.json` leaves it out.
    fn default_tie_word_embeddings(self) -> bool {
        match self {
            Architecture::Qwen3 => crate::qwen3::DEFAULT_TIED,
            Architecture::Qwen2 => crate::qwen2::DEFAULT_TIED,
            Architecture::Llama => crate::llama::DEFAULT_TIED,
        }
    }

    /// What the architecture's decoder layer holds besides the common weights, given whether the
    /// configuration asks for attention biases (`attention_bias`, read by Llama only).
    pub(crate) fn layer(self, attention_bias: bool) -> crate::layer::LayerKind {
        match self {
            Architecture::Qwen3 => crate::qwen3::LAYER,
            Architecture::Qwen2 => crate::qwen2::LAYER,
            Architecture::Llama => crate::llama::layer(attention_bias),
        }
    }
}

/// How the rotary embedding's frequencies are scaled (`rope_parameters` / `rope_scaling` of
/// `config.json`). Only the scalings whose attention factor is 1 are implemented.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum RopeScaling {
    /// The plain rotary embedding, `θ^(−2i/D)`.
    #[default]
    Default,
    /// Position interpolation (`rope_type = "linear"`): every frequency divided by `factor`.
    Linear {
        /// How much longer the context is than the original one.
        factor: f64,
    },
    /// Llama 3.1's frequency-dependent scaling (`rope_type = "llama3"`): long wavelengths are
    /// divided by `factor`, short ones kept, the band between interpolated.
    Llama3 {
        /// How much longer the context is than the original one.
        factor: f64,
        /// Wavelengths longer than `original / low_freq_factor` are divided by `factor`.
        low_freq_factor: f64,
        /// Wavelengths shorter than `original / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context length the model was pretrained with.
        original_max_position_embeddings: usize,
    },
}

impl RopeScaling {
    /// Reads a `rope_parameters` / `rope_scaling` object (`rope_type`, or the older `type`).
    fn from_hf(key: &str, v: &Value) -> Result<Self> {
        if v.is_null() {
            return Ok(RopeScaling::Default);
        }
        let kind = v
            .get("rope_type")
            .or_else(|| v.get("type"))
            .and_then(Value::as_str);
        match kind {
            None | Some("default") => Ok(RopeScaling::Default),
            Some("linear") => {
                let factor = v.get("factor").and_then(Value::as_f64).ok_or_else(|| {
                    Error::Config(format!("{key}.factor is missing or not a number"))
                })?;
                let scaling = RopeScaling::Linear { factor };
                scaling.validate()?;
                Ok(scaling)
            }
            Some("llama3") => {
                let num = |k: &str| -> Result<f64> {
                    v.get(k).and_then(Value::as_f64).ok_or_else(|| {
                        Error::Config(format!("{key}.{k} is missing or not a number"))
                    })
                };
                let scaling = RopeScaling::Llama3 {
                    factor: num("factor")?,
                    low_freq_factor: num("low_freq_factor")?,
                    high_freq_factor: num("high_freq_factor")?,
                    original_max_position_embeddings: v
                        .get("original_max_position_embeddings")
                        .map(|x| as_usize(&format!("{key}.original_max_position_embeddings"), x))
                        .transpose()?
                        .ok_or_else(|| {
                            Error::Config(format!(
                                "{key}.original_max_position_embeddings is missing"
                            ))
                        })?,
                };
                scaling.validate()?;
                Ok(scaling)
            }
            Some(other) => Err(Error::Config(format!(
                "{key} {v} is not supported: rope_type {other:?} (supported: default, linear, llama3)"
            ))),
        }
    }

    fn validate(&self) -> Result<()> {
        if let RopeScaling::Linear { factor } = *self {
            if !(factor.is_finite() && factor > 0.0) {
                return Err(Error::Config(format!(
                    "linear rope scaling needs a positive factor, got {factor}"
                )));
            }
        }
        if let RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } = *self
        {
            let ok = factor.is_finite()
                && factor >= 1.0
                && low_freq_factor.is_finite()
                && low_freq_factor > 0.0
                && high_freq_factor.is_finite()
                && high_freq_factor > low_freq_factor
                && original_max_position_embeddings > 0;
            if !ok {
                return Err(Error::Config(format!(
                    "llama3 rope scaling needs factor >= 1, 0 < low_freq_factor < \
                     high_freq_factor and original_max_position_embeddings > 0, got {self:?}"
                )));
            }
        }
        Ok(())
    }

    /// The inverse frequencies `θ^(−2i/D)` of a head width `d`, scaled (in f64; transformers'
    /// `_compute_llama3_parameters`).
    pub fn inv_freq(&self, theta: f64, d: usize) -> Vec<f64> {
        let base = (0..d / 2).map(|i| 1.0 / theta.powf((2 * i) as f64 / d as f64));
        match *self {
            RopeScaling::Default => base.collect(),
            RopeScaling::Linear { factor } => base.map(|f| f / factor).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let old = original_max_position_embeddings as f64;
                let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
                base.map(|f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen > low_wavelen {
                        f / factor
                    } else if wavelen < high_wavelen {
                        f
                    } else {
                        let smooth = (old / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
            }
        }
    }

    /// The `rope_parameters` object transformers writes, with `rope_theta`.
    fn to_hf(self, theta: f64) -> Value {
        match self {
            RopeScaling::Default => {
                serde_json::json!({"rope_theta": theta, "rope_type": "default"})
            }
            RopeScaling::Linear { factor } => {
                serde_json::json!({"rope_theta": theta, "rope_type": "linear", "factor": factor})
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => serde_json::json!({
                "rope_theta": theta,
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low_freq_factor,
                "high_freq_factor": high_freq_factor,
                "original_max_position_embeddings": original_max_position_embeddings,
            }),
        }
    }
}

/// The hyper-parameters of a causal language model of a supported [`Architecture`].
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Which architecture (Hugging Face `model_type`).
    pub architecture: Architecture,
    /// Vocabulary size (rows of the embedding and of the lm_head).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Number of query heads.
    pub num_attention_heads: usize,
    /// Number of key/value heads (grouped-query attention).
    pub num_key_value_heads: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f64,
    /// Base of the rotary position embedding.
    pub rope_theta: f64,
    /// How the rotary frequencies are scaled.
    pub rope_scaling: RopeScaling,
    /// Biases on the q, k, v and o projections (Llama's `attention_bias`; Qwen2's q/k/v biases
    /// are part of its architecture and do not depend on it).
    pub attention_bias: bool,
    /// Whether the lm_head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Longest supported sequence.
    pub max_position_embeddings: usize,
    /// The checkpoint's storage dtype as written in `config.json` (`bfloat16`, `float32`, ...).
    pub torch_dtype: Option<String>,
    /// Other keys of the source `config.json` (token ids, cache flags, ...), written back on save.
    pub extra: Map<String, Value>,
}

impl ModelConfig {
    /// A tiny configuration for tests and demos: vocab 512, hidden 128, 2 layers, 4 query and 2
    /// key/value heads of width 32, MLP 384, tied embeddings.
    pub fn tiny() -> Self {
        Self {
            architecture: Architecture::Qwen3,
            vocab_size: 512,
            hidden_size: 128,
            intermediate_size: 384,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 32,
            rms_norm_eps: 1e-6,
            rope_theta: 1_000_000.0,
            rope_scaling: RopeScaling::Default,
            attention_bias: false,
            tie_word_embeddings: true,
            max_position_embeddings: 4096,
            torch_dtype: None,
            extra: Map::new(),
        }
    }

    /// [`ModelConfig::tiny`] of another architecture.
    pub fn tiny_of(architecture: Architecture) -> Self {
        Self {
            architecture,
            ..Self::tiny()
        }
    }

    /// The `config.json` keys [`ModelConfig::with_hf_keys`] accepts: the model type and shape,
    /// the rotary and normalisation constants, and the special token ids.
    pub const SETTABLE_KEYS: &'static [&'static str] = &[
        "model_type",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "rope_theta",
        "attention_bias",
        "tie_word_embeddings",
        "max_position_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    ];

    /// This configuration with some of its Hugging Face `config.json` keys replaced (a random
    /// model's shape over [`ModelConfig::tiny`], for one), validated as a `config.json` is. A key
    /// outside [`ModelConfig::SETTABLE_KEYS`] is an error.
    pub fn with_hf_keys(&self, keys: &Map<String, Value>) -> Result<Self> {
        let mut obj = self.hf_object();
        for (key, value) in keys {
            if !Self::SETTABLE_KEYS.contains(&key.as_str()) {
                return Err(Error::Config(format!(
                    "unknown key `{key}` (expected one of: {})",
                    Self::SETTABLE_KEYS.join(", ")
                )));
            }
            if key == "model_type" {
                obj.remove("architectures");
            }
            if key == "rope_theta" {
                obj.remove("rope_parameters");
            }
            obj.insert(key.clone(), value.clone());
        }
        let mut cfg = Self::from_hf_object(obj)?;
        // What `to_hf_json` writes of itself (`architectures`, `hidden_act`, ...) stays out.
        cfg.extra.retain(|k, _| {
            self.extra.contains_key(k) || (keys.contains_key(k) && k.ends_with("_token_id"))
        });
        Ok(cfg)
    }

    /// Reads and validates a Hugging Face `config.json` of a supported architecture.
    pub fn from_hf_json(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Io(format!("reading {}: {e}", path.display())))?;
        Self::from_hf_str(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
    }

    /// Parses and validates the text of a Hugging Face `config.json`.
    pub fn from_hf_str(text: &str) -> Result<Self> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| Error::Config(format!("invalid JSON: {e}")))?;
        let Value::Object(obj) = value else {
            return Err(Error::Config("config.json is not a JSON object".into()));
        };
        Self::from_hf_object(obj)
    }

    /// [`ModelConfig::from_hf_str`] of the parsed object.
    fn from_hf_object(mut obj: Map<String, Value>) -> Result<Self> {
        let Some(architecture) = obj
            .get("model_type")
            .and_then(Value::as_str)
            .and_then(Architecture::from_model_type)
        else {
            let supported: Vec<String> = Architecture::ALL
                .iter()
                .map(|a| format!("{:?}", a.model_type()))
                .collect();
            return Err(Error::Config(format!(
                "model_type is {}, supported: {}",
                obj.get("model_type")
                    .map_or("missing".to_string(), Value::to_string),
                supported.join(", ")
            )));
        };
        if let Some(archs) = obj.get("architectures") {
            let class = architecture.class_name();
            let ok = archs
                .as_array()
                .is_some_and(|a| a.iter().any(|v| v.as_str() == Some(class)));
            if !ok {
                return Err(Error::Config(format!(
                    "architectures is {archs}, expected [\"{class}\"]"
                )));
            }
        }
        architecture.check_hf(&obj)?;
        refuse_if(&obj, "use_sliding_window", |v| v.as_bool() == Some(true))?;
        refuse_if(&obj, "hidden_act", |v| v.as_str() != Some("silu"))?;
        // transformers 5 writes `rope_parameters`; earlier versions `rope_scaling`.
        let rope_params = obj.get("rope_parameters").cloned();
        let rope_scaling = match (&rope_params, obj.remove("rope_scaling")) {
            (Some(rp), _) if !rp.is_null() => RopeScaling::from_hf("rope_parameters", rp)?,
            (_, Some(rs)) => RopeScaling::from_hf("rope_scaling", &rs)?,
            _ => RopeScaling::Default,
        };
        let attention_bias = match obj.remove("attention_bias") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => b,
            Some(v) => {
                return Err(Error::Config(format!(
                    "attention_bias is {v}, expected true or false"
                )))
            }
        };

        let num_attention_heads = take_usize(&mut obj, "num_attention_heads")?;
        let hidden_size = take_usize(&mut obj, "hidden_size")?;
        let head_dim = match obj.remove("head_dim") {
            None | Some(Value::Null) => {
                if num_attention_heads == 0 || !hidden_size.is_multiple_of(num_attention_heads) {
                    return Err(Error::Config(format!(
                        "head_dim is missing and hidden_size {hidden_size} is not a multiple of \
                         num_attention_heads {num_attention_heads}"
                    )));
                }
                hidden_size / num_attention_heads
            }
            Some(v) => as_usize("head_dim", &v)?,
        };
        let rope_theta =
            match obj.remove("rope_theta") {
                Some(v) if !v.is_null() => as_f64("rope_theta", &v)?,
                _ => match rope_params.as_ref().and_then(|rp| rp.get("rope_theta")) {
                    Some(v) => as_f64("rope_parameters.rope_theta", v)?,
                    None => return Err(Error::Config(
                        "rope_theta is missing (neither top level nor rope_parameters.rope_theta)"
                            .into(),
                    )),
                },
            };
        obj.remove("rope_parameters");
        let tie_word_embeddings = match obj.remove("tie_word_embeddings") {
            None | Some(Value::Null) => architecture.default_tie_word_embeddings(),
            Some(Value::Bool(b)) => b,
            Some(v) => {
                return Err(Error::Config(format!(
                    "tie_word_embeddings is {v}, expected true or false"
                )))
            }
        };
        let torch_dtype = match obj.remove("torch_dtype").or_else(|| obj.remove("dtype")) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s),
            Some(v) => {
                return Err(Error::Config(format!(
                    "torch_dtype is {v}, expected a string"
                )))
            }
        };
        let cfg = Self {
            architecture,
            vocab_size: take_usize(&mut obj, "vocab_size")?,
            hidden_size,
            intermediate_size: take_usize(&mut obj, "intermediate_size")?,
            num_hidden_layers: take_usize(&mut obj, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: take_usize(&mut obj, "num_key_value_heads")?,
            head_dim,
            rms_norm_eps: {
                let v = obj
                    .remove("rms_norm_eps")
                    .ok_or_else(|| Error::Config("rms_norm_eps is missing".into()))?;
                as_f64("rms_norm_eps", &v)?
            },
            rope_theta,
            rope_scaling,
            attention_bias,
            tie_word_embeddings,
            max_position_embeddings: take_usize(&mut obj, "max_position_embeddings")?,
            torch_dtype,
            extra: obj,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks that the sizes are consistent and within sane bounds.
    pub fn validate(&self) -> Result<()> {
        let bounded = [
            ("vocab_size", self.vocab_size, MAX_VOCAB),
            ("hidden_size", self.hidden_size, MAX_HIDDEN),
            (
                "intermediate_size",
                self.intermediate_size,
                MAX_INTERMEDIATE,
            ),
            ("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS),
            ("num_attention_heads", self.num_attention_heads, MAX_HEADS),
            ("num_key_value_heads", self.num_key_value_heads, MAX_HEADS),
            ("head_dim", self.head_dim, MAX_HEAD_DIM),
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                MAX_POSITIONS,
            ),
        ];
        for (key, value, max) in bounded {
            if value == 0 || value > max {
                return Err(Error::Config(format!(
                    "{key} = {value} is out of range (1..={max})"
                )));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(Error::Config(format!(
                "num_attention_heads = {} is not a multiple of num_key_value_heads = {}",
                self.num_attention_heads, self.num_key_value_heads
            )));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(Error::Config(format!(
                "head_dim = {} must be even for the rotary embedding",
                self.head_dim
            )));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1.0) {
            return Err(Error::Config(format!(
                "rms_norm_eps = {} is out of range (0, 1)",
                self.rms_norm_eps
            )));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return Err(Error::Config(format!(
                "rope_theta = {} must be a finite number above 1",
                self.rope_theta
            )));
        }
        self.rope_scaling.validate()?;
        if self.attention_bias && self.architecture != Architecture::Llama {
            return Err(Error::Config(format!(
                "attention_bias = true is not supported for {}",
                self.architecture.model_type()
            )));
        }
        if self.num_parameters() > MAX_PARAMS {
            return Err(Error::Config(format!(
                "the configuration describes {} parameters, more than the supported {MAX_PARAMS}",
                self.num_parameters()
            )));
        }
        Ok(())
    }

    /// Total number of parameters (the tied lm_head counted once).
    pub fn num_parameters(&self) -> u128 {
        let (v, h, i) = (
            self.vocab_size as u128,
            self.hidden_size as u128,
            self.intermediate_size as u128,
        );
        let d = self.head_dim as u128;
        let q = self.num_attention_heads as u128 * d;
        let kv = self.num_key_value_heads as u128 * d;
        let kind = self.layer();
        let qk_norm = if kind.qk_norm { 2 * d } else { 0 };
        let qkv_bias = if kind.qkv_bias { q + 2 * kv } else { 0 };
        let o_bias = if kind.o_bias { h } else { 0 };
        let layer = 2 * h + qk_norm + qkv_bias + o_bias + h * q + 2 * h * kv + q * h + 3 * h * i;
        let lm_head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + self.num_hidden_layers as u128 * layer + h + lm_head
    }

    /// What this configuration's decoder layers hold besides the common weights.
    pub(crate) fn layer(&self) -> crate::layer::LayerKind {
        self.architecture.layer(self.attention_bias)
    }

    /// The configuration as a Hugging Face `config.json` object that `transformers` loads.
    pub fn to_hf_json(&self) -> Value {
        Value::Object(self.hf_object())
    }

    /// The keys and values of [`ModelConfig::to_hf_json`].
    fn hf_object(&self) -> Map<String, Value> {
        let mut obj = self.extra.clone();
        let mut set = |k: &str, v: Value| {
            obj.insert(k.to_string(), v);
        };
        set(
            "architectures",
            serde_json::json!([self.architecture.class_name()]),
        );
        set("model_type", self.architecture.model_type().into());
        set("vocab_size", self.vocab_size.into());
        set("hidden_size", self.hidden_size.into());
        set("intermediate_size", self.intermediate_size.into());
        set("num_hidden_layers", self.num_hidden_layers.into());
        set("num_attention_heads", self.num_attention_heads.into());
        set("num_key_value_heads", self.num_key_value_heads.into());
        set("head_dim", self.head_dim.into());
        set("rms_norm_eps", self.rms_norm_eps.into());
        set("rope_theta", self.rope_theta.into());
        set("rope_parameters", self.rope_scaling.to_hf(self.rope_theta));
        set("tie_word_embeddings", self.tie_word_embeddings.into());
        set(
            "max_position_embeddings",
            self.max_position_embeddings.into(),
        );
        set("hidden_act", "silu".into());
        match self.architecture {
            Architecture::Qwen3 => set("attention_bias", false.into()),
            Architecture::Llama => {
                set("attention_bias", self.attention_bias.into());
                set("mlp_bias", false.into());
            }
            Architecture::Qwen2 => {}
        }
        if let Some(d) = &self.torch_dtype {
            set("torch_dtype", d.clone().into());
        }
        obj
    }
}

/// Errors when `key` is present and `bad` holds for its value.
pub(crate) fn refuse_if(
    obj: &Map<String, Value>,
    key: &str,
    bad: impl Fn(&Value) -> bool,
) -> Result<()> {
    match obj.get(key) {
        Some(v) if bad(v) => Err(Error::Config(format!("{key} = {v} is not supported"))),
        _ => Ok(()),
    }
}

fn take_usize(obj: &mut Map<String, Value>, key: &str) -> Result<usize> {
    let v = obj
        .remove(key)
        .ok_or_else(|| Error::Config(format!("{key} is missing")))?;
    as_usize(key, &v)
}

fn as_usize(key: &str, v: &Value) -> Result<usize> {
    v.as_u64()
        .and_then(|x| usize::try_from(x).ok())
        .ok_or_else(|| Error::Config(format!("{key} = {v} is not a non-negative integer")))
}

fn as_f64(key: &str, v: &Value) -> Result<f64> {
    v.as_f64()
        .ok_or_else(|| Error::Config(format!("{key} = {v} is not a number")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A random model's keys over the tiny configuration: another architecture, shape, rotary
    /// base and token ids; anything else is refused, and so is an invalid shape.
    #[test]
    fn hf_keys_replace_the_settable_ones() {
        let keys = |v: Value| v.as_object().cloned().unwrap();
        let cfg = ModelConfig::tiny()
            .with_hf_keys(&keys(serde_json::json!({
                "model_type": "llama", "hidden_size": 64, "rope_theta": 500000.0,
                "eos_token_id": [2, 3],
            })))
            .unwrap();
        assert_eq!(cfg.architecture, Architecture::Llama);
        assert_eq!((cfg.hidden_size, cfg.rope_theta), (64, 500_000.0));
        assert_eq!(cfg.extra["eos_token_id"], serde_json::json!([2, 3]));
        assert_eq!(
            ModelConfig::tiny().with_hf_keys(&Map::new()).unwrap(),
            ModelConfig::tiny()
        );
        let e = ModelConfig::tiny()
            .with_hf_keys(&keys(serde_json::json!({"hidden_sise": 8})))
            .unwrap_err();
        assert!(e.to_string().contains("unknown key `hidden_sise`"), "{e}");
        let e = ModelConfig::tiny()
            .with_hf_keys(&keys(serde_json::json!({"head_dim": 7})))
            .unwrap_err();
        assert!(e.to_string().contains("head_dim"), "{e}");
    }

    fn hf_json() -> Value {
        serde_json::json!({
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "vocab_size": 151936, "hidden_size": 2560, "intermediate_size": 9728,
            "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
            "tie_word_embeddings": true, "max_position_embeddings": 40960,
            "torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151645,
            "hidden_act": "silu", "attention_bias": false, "rope_scaling": null,
            "use_sliding_window": false, "sliding_window": null
        })
    }

    fn parse(v: &Value) -> Result<ModelConfig> {
        ModelConfig::from_hf_str(&v.to_string())
    }

    #[test]
    fn parses_qwen3_4b() {
        let cfg = parse(&hf_json()).unwrap();
        assert_eq!(cfg.vocab_size, 151936);
        assert_eq!(cfg.head_dim, 128);
        assert_eq!(cfg.rope_theta, 1e6);
        assert_eq!(cfg.torch_dtype.as_deref(), Some("bfloat16"));
        assert_eq!(cfg.extra["bos_token_id"], 151643);
        // Qwen3-4B has about 4.02 B parameters.
        let n = cfg.num_parameters();
        assert!((4_000_000_000..4_100_000_000).contains(&n), "{n}");
        // Round trip through to_hf_json.
        let again = parse(&cfg.to_hf_json()).unwrap();
        assert_eq!(again, cfg);
    }

    #[test]
    fn rope_theta_from_rope_parameters() {
        let mut v = hf_json();
        v.as_object_mut().unwrap().remove("rope_theta");
        v["rope_parameters"] = serde_json::json!({"rope_theta": 5e5, "rope_type": "default"});
        v.as_object_mut().unwrap().remove("torch_dtype");
        v["dtype"] = "float32".into();
        let cfg = parse(&v).unwrap();
        assert_eq!(cfg.rope_theta, 5e5);
        assert_eq!(cfg.torch_dtype.as_deref(), Some("float32"));
    }

    #[test]
    fn refuses_bad_configs() {
        let cases: Vec<(&str, Value, &str)> = vec![
            ("model_type", "gpt2".into(), "model_type"),
            ("num_key_value_heads", 5.into(), "not a multiple"),
            ("vocab_size", 0.into(), "vocab_size"),
            ("hidden_size", (1u64 << 40).into(), "hidden_size"),
            ("head_dim", 127.into(), "even"),
            ("rms_norm_eps", (-1.0).into(), "rms_norm_eps"),
            ("attention_bias", true.into(), "attention_bias"),
            ("num_hidden_layers", "36".into(), "num_hidden_layers"),
            (
                "rope_scaling",
                serde_json::json!({"rope_type": "yarn", "factor": 4.0}),
                "rope_scaling",
            ),
        ];
        for (key, value, needle) in cases {
            let mut v = hf_json();
            v[key] = value;
            let err = parse(&v).unwrap_err().to_string();
            assert!(err.contains(needle), "{key}: {err}");
        }
        let mut v = hf_json();
        v.as_object_mut().unwrap().remove("vocab_size");
        assert!(parse(&v)
            .unwrap_err()
            .to_string()
            .contains("vocab_size is missing"));
        assert!(ModelConfig::from_hf_str("[1]").is_err());
        assert!(ModelConfig::from_hf_str("{").is_err());
    }

    #[test]
    fn parses_qwen2_and_round_trips() {
        let mut v = hf_json();
        let o = v.as_object_mut().unwrap();
        o.insert(
            "architectures".into(),
            serde_json::json!(["Qwen2ForCausalLM"]),
        );
        o.insert("model_type".into(), "qwen2".into());
        o.remove("attention_bias");
        o.remove("head_dim");
        o.remove("tie_word_embeddings");
        let cfg = parse(&v).unwrap();
        assert_eq!(cfg.architecture, Architecture::Qwen2);
        assert_eq!(cfg.head_dim, 80);
        assert!(!cfg.tie_word_embeddings, "Qwen2's default is untied");
        assert_eq!(parse(&cfg.to_hf_json()).unwrap(), cfg);
        // A Qwen2 config names its own class; a head_dim other than hidden / heads is refused.
        o_set(
            &mut v,
            "architectures",
            serde_json::json!(["Qwen3ForCausalLM"]),
        );
        assert!(parse(&v)
            .unwrap_err()
            .to_string()
            .contains("Qwen2ForCausalLM"));
        o_set(
            &mut v,
            "architectures",
            serde_json::json!(["Qwen2ForCausalLM"]),
        );
        o_set(&mut v, "head_dim", 64.into());
        assert!(parse(&v).unwrap_err().to_string().contains("head_dim"));
    }

    /// SmolLM2-135M-Instruct's `config.json` (a Llama with tied embeddings).
    fn smollm2_json() -> Value {
        serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 1,
            "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 576,
            "initializer_range": 0.041666666666666664, "intermediate_size": 1536,
            "max_position_embeddings": 8192, "mlp_bias": false, "num_attention_heads": 9,
            "num_hidden_layers": 30, "num_key_value_heads": 3, "pad_token_id": 2,
            "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
            "rope_theta": 100000, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
            "vocab_size": 49152
        })
    }

    #[test]
    fn parses_llama_smollm2_and_llama3_scaling() {
        let cfg = parse(&smollm2_json()).unwrap();
        assert_eq!(cfg.architecture, Architecture::Llama);
        assert_eq!((cfg.head_dim, cfg.num_key_value_heads), (64, 3));
        assert!(cfg.tie_word_embeddings && !cfg.attention_bias);
        assert_eq!(cfg.rope_scaling, RopeScaling::Default);
        // SmolLM2-135M has 134.5 M parameters.
        assert_eq!(cfg.num_parameters(), 134_515_008);
        assert_eq!(parse(&cfg.to_hf_json()).unwrap(), cfg);

        // Llama 3.2 1B: untied by default here, llama3 rope scaling, in both spellings.
        let mut v = smollm2_json();
        let o = v.as_object_mut().unwrap();
        o.remove("tie_word_embeddings");
        o.insert("attention_bias".into(), true.into());
        let scaling = serde_json::json!({"factor": 32.0, "high_freq_factor": 4.0,
            "low_freq_factor": 1.0, "original_max_position_embeddings": 8192,
            "rope_type": "llama3"});
        o.insert("rope_scaling".into(), scaling.clone());
        let cfg = parse(&v).unwrap();
        assert!(!cfg.tie_word_embeddings && cfg.attention_bias);
        let want = RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        assert_eq!(cfg.rope_scaling, want);
        let again = parse(&cfg.to_hf_json()).unwrap();
        assert_eq!(again, cfg);
        assert_eq!(cfg.to_hf_json()["rope_parameters"]["rope_type"], "llama3");
        // Biases on q, k, v (Hq·D + 2·Hkv·D) and o (H) in every layer.
        let plain = parse(&smollm2_json()).unwrap().num_parameters();
        let untied_biased = plain + 49152 * 576 + 30 * (576 + 2 * 192 + 576);
        assert_eq!(cfg.num_parameters(), untied_biased);

        o_set(&mut v, "mlp_bias", true.into());
        assert!(parse(&v).unwrap_err().to_string().contains("mlp_bias"));
        o_set(&mut v, "mlp_bias", false.into());
        let mut bad = scaling.clone();
        bad["rope_type"] = "yarn".into();
        o_set(&mut v, "rope_scaling", bad);
        assert!(parse(&v).unwrap_err().to_string().contains("yarn"));
        let mut bad = scaling;
        bad["high_freq_factor"] = 0.5.into();
        o_set(&mut v, "rope_scaling", bad);
        assert!(parse(&v).unwrap_err().to_string().contains("llama3"));
        // attention_bias is Llama's alone.
        let mut q = hf_json();
        o_set(&mut q, "attention_bias", true.into());
        assert!(parse(&q).is_err());
    }

    #[test]
    fn linear_scaling_divides_every_frequency_and_round_trips() {
        let mut v = smollm2_json();
        o_set(
            &mut v,
            "rope_scaling",
            serde_json::json!({"rope_type": "linear", "factor": 4.0}),
        );
        let cfg = parse(&v).unwrap();
        assert_eq!(cfg.rope_scaling, RopeScaling::Linear { factor: 4.0 });
        let base = RopeScaling::Default.inv_freq(1e4, 8);
        let scaled = cfg.rope_scaling.inv_freq(1e4, 8);
        assert!(base.iter().zip(&scaled).all(|(b, s)| *s == b / 4.0));
        assert_eq!(parse(&cfg.to_hf_json()).unwrap(), cfg);
        o_set(
            &mut v,
            "rope_scaling",
            serde_json::json!({"rope_type": "linear", "factor": -1.0}),
        );
        assert!(parse(&v)
            .unwrap_err()
            .to_string()
            .contains("positive factor"));
    }

    #[test]
    fn llama3_scaling_keeps_short_divides_long_and_blends_between() {
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64,
        };
        let base = RopeScaling::Default.inv_freq(1e4, 16);
        let scaled = s.inv_freq(1e4, 16);
        let wavelen = |f: f64| 2.0 * std::f64::consts::PI / f;
        let mut bands = [0; 3];
        for (b, v) in base.iter().zip(&scaled) {
            let w = wavelen(*b);
            if w < 16.0 {
                assert_eq!(v, b);
                bands[0] += 1;
            } else if w > 64.0 {
                assert_eq!(*v, b / 8.0);
                bands[2] += 1;
            } else {
                assert!(*v < *b && *v > b / 8.0, "{v} {b}");
                bands[1] += 1;
            }
        }
        assert!(bands.iter().all(|&n| n > 0), "{bands:?}");
    }

    fn o_set(v: &mut Value, key: &str, value: Value) {
        v.as_object_mut().unwrap().insert(key.into(), value);
    }

    #[test]
    fn file_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(&p, "{\"model_type\": \"gpt2\"}").unwrap();
        let err = ModelConfig::from_hf_json(&p).unwrap_err().to_string();
        assert!(err.contains("config.json") && err.contains("gpt2"), "{err}");
        assert!(ModelConfig::tiny().validate().is_ok());
    }
}
