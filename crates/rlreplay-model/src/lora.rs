//! LoRA (low-rank adapters) in PEFT's terms: for each targeted projection `W [out, in]` of every
//! decoder layer, `A [r, in]` (`lora_A`) and `B [out, r]` (`lora_B`), and
//! `y = x·Wᵀ + (alpha/r)·(x·Aᵀ)·Bᵀ`.
//!
//! - [`LoraConfig`]: rank, alpha and target modules, read from and written to PEFT's
//!   `adapter_config.json`.
//! - [`Model::add_lora`](crate::Model::add_lora) puts fresh adapters on a model (A
//!   kaiming-uniform as PEFT initialises it, B zero), [`Model::load_adapter`] reads a PEFT adapter
//!   directory, [`Model::save_adapter`] writes one, and
//!   [`Model::merge_lora`](crate::Model::merge_lora) folds the adapters into the base weights
//!   (`W + (alpha/r)·B·A`) for export. With adapters on, only A and B are trainable parameters;
//!   the base weights are frozen and get no gradient.
//!
//! On disk (PEFT): `adapter_config.json` and `adapter_model.safetensors` holding
//! `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`, `...lora_B.weight`, and so
//! on for every targeted module of every layer.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Tensor, Var};
use rand::SeedableRng;
use rand_distr::{Distribution, Uniform};
use serde_json::{json, Value};

use crate::checkpoint::{io_err, write_dir_atomically, write_json, write_safetensors};
use crate::layer::DecoderLayer;
use crate::model::Param;
use crate::{Error, Model, ModelConfig, Result};

/// The adapter configuration file of a PEFT adapter directory.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// The adapter weights file of a PEFT adapter directory.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
/// The prefix PEFT puts before the transformers module names of the adapter tensors.
pub const PEFT_PREFIX: &str = "base_model.model.";

/// A projection of the decoder layer that an adapter can target, by PEFT's module name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LoraTarget {
    /// `self_attn.q_proj`.
    QProj,
    /// `self_attn.k_proj`.
    KProj,
    /// `self_attn.v_proj`.
    VProj,
    /// `self_attn.o_proj`.
    OProj,
    /// `mlp.gate_proj`.
    GateProj,
    /// `mlp.up_proj`.
    UpProj,
    /// `mlp.down_proj`.
    DownProj,
}

impl LoraTarget {
    /// Every target, in the layer's order (what `"all-linear"` means: every linear layer of the
    /// decoder but the lm_head).
    pub const ALL: [LoraTarget; 7] = [
        LoraTarget::QProj,
        LoraTarget::KProj,
        LoraTarget::VProj,
        LoraTarget::OProj,
        LoraTarget::GateProj,
        LoraTarget::UpProj,
        LoraTarget::DownProj,
    ];

    /// PEFT's (and transformers') module name, `q_proj`.
    pub fn name(self) -> &'static str {
        self.path().rsplit('.').next().unwrap_or_default()
    }

    /// The module path inside a decoder layer, `self_attn.q_proj`.
    pub fn path(self) -> &'static str {
        match self {
            LoraTarget::QProj => "self_attn.q_proj",
            LoraTarget::KProj => "self_attn.k_proj",
            LoraTarget::VProj => "self_attn.v_proj",
            LoraTarget::OProj => "self_attn.o_proj",
            LoraTarget::GateProj => "mlp.gate_proj",
            LoraTarget::UpProj => "mlp.up_proj",
            LoraTarget::DownProj => "mlp.down_proj",
        }
    }

    /// The target of a module name (`q_proj`), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The `[out, in]` shape of this projection's weight in a model of `cfg`.
    pub fn weight_shape(self, cfg: &ModelConfig) -> (usize, usize) {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let (q, kv) = (
            cfg.num_attention_heads * cfg.head_dim,
            cfg.num_key_value_heads * cfg.head_dim,
        );
        match self {
            LoraTarget::QProj => (q, h),
            LoraTarget::KProj | LoraTarget::VProj => (kv, h),
            LoraTarget::OProj => (h, q),
            LoraTarget::GateProj | LoraTarget::UpProj => (i, h),
            LoraTarget::DownProj => (h, i),
        }
    }

    /// The projection's weight in a decoder layer.
    pub fn weight<W>(self, layer: &DecoderLayer<W>) -> &W {
        let (a, m) = (&layer.self_attn, &layer.mlp);
        match self {
            LoraTarget::QProj => &a.q_proj.weight,
            LoraTarget::KProj => &a.k_proj.weight,
            LoraTarget::VProj => &a.v_proj.weight,
            LoraTarget::OProj => &a.o_proj.weight,
            LoraTarget::GateProj => &m.gate_proj,
            LoraTarget::UpProj => &m.up_proj,
            LoraTarget::DownProj => &m.down_proj,
        }
    }

    /// The projection's weight in a decoder layer, mutably.
    pub(crate) fn weight_mut<W>(self, layer: &mut DecoderLayer<W>) -> &mut W {
        let (a, m) = (&mut layer.self_attn, &mut layer.mlp);
        match self {
            LoraTarget::QProj => &mut a.q_proj.weight,
            LoraTarget::KProj => &mut a.k_proj.weight,
            LoraTarget::VProj => &mut a.v_proj.weight,
            LoraTarget::OProj => &mut a.o_proj.weight,
            LoraTarget::GateProj => &mut m.gate_proj,
            LoraTarget::UpProj => &mut m.up_proj,
            LoraTarget::DownProj => &mut m.down_proj,
        }
    }
}

/// The adapter configuration, mirroring PEFT's `LoraConfig` (plain LoRA: no rsLoRA, DoRA,
/// per-module ranks, biases or dropout).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// The rank `r` of every adapter.
    pub r: usize,
    /// `lora_alpha`: the adapters' output is scaled by `lora_alpha / r`.
    pub lora_alpha: f64,
    /// The targeted projections, without repeats, in [`LoraTarget::ALL`] order.
    pub target_modules: Vec<LoraTarget>,
    /// `lora_dropout`: only 0 is supported.
    pub lora_dropout: f64,
}

impl LoraConfig {
    /// A configuration of rank `r` and `lora_alpha` targeting `target_modules` as PEFT spells
    /// them: module names (`q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`, `up_proj`,
    /// `down_proj`) or `"all-linear"` (all seven). Checked as [`LoraConfig::validate`].
    pub fn new(r: usize, lora_alpha: f64, target_modules: &[&str]) -> Result<Self> {
        let cfg = Self {
            r,
            lora_alpha,
            target_modules: parse_targets(target_modules)?,
            lora_dropout: 0.0,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The scaling of the adapters' output, `lora_alpha / r`.
    pub fn scaling(&self) -> f64 {
        self.lora_alpha / self.r as f64
    }

    /// Whether `target` carries an adapter.
    pub fn targets(&self, target: LoraTarget) -> bool {
        self.target_modules.contains(&target)
    }

    /// Refuses a rank of 0, no targets, a non-finite alpha and a non-zero dropout.
    pub fn validate(&self) -> Result<()> {
        if self.target_modules.is_empty() {
            return Err(Error::Config(
                "LoRA: target_modules is empty (name q_proj, k_proj, v_proj, o_proj, gate_proj, \
                 up_proj, down_proj, or \"all-linear\")"
                    .into(),
            ));
        }
        if self.r == 0 {
            let names: Vec<&str> = self.target_modules.iter().map(|t| t.name()).collect();
            return Err(Error::Config(format!(
                "LoRA: rank r = 0 with target modules {names:?}; the rank must be at least 1"
            )));
        }
        if !self.lora_alpha.is_finite() {
            return Err(Error::Config(format!(
                "LoRA: lora_alpha must be finite, got {}",
                self.lora_alpha
            )));
        }
        if self.lora_dropout != 0.0 {
            return Err(Error::Config(format!(
                "LoRA: lora_dropout {} is not supported (dropout is not implemented): only \
                 lora_dropout = 0 is accepted",
                self.lora_dropout
            )));
        }
        Ok(())
    }

    /// Reads PEFT's `adapter_config.json` (as a JSON value). Options that change the adapters'
    /// math and are not implemented (rsLoRA, DoRA, per-module ranks or alphas, biases, layer
    /// subsets, fan-in-fan-out weights, extra trained modules) are refused, naming the key.
    pub fn from_peft_json(v: &Value) -> Result<Self> {
        let obj = v
            .as_object()
            .ok_or_else(|| Error::Config("adapter_config.json is not a JSON object".into()))?;
        let get = |k: &str| obj.get(k).filter(|v| !v.is_null());
        if let Some(t) = get("peft_type").and_then(Value::as_str) {
            if t != "LORA" {
                return Err(Error::Config(format!(
                    "adapter_config.json: peft_type {t:?} is not supported (only \"LORA\")"
                )));
            }
        }
        let unsupported = |k: &str, why: &str| {
            Error::Config(format!(
                "adapter_config.json: {k} = {} is not supported ({why})",
                obj.get(k).map_or(String::new(), Value::to_string)
            ))
        };
        for k in [
            "use_rslora",
            "use_dora",
            "use_qalora",
            "fan_in_fan_out",
            "lora_bias",
        ] {
            if get(k).is_some_and(|v| v != &Value::Bool(false)) {
                return Err(unsupported(k, "only false"));
            }
        }
        if get("bias").is_some_and(|v| v.as_str() != Some("none")) {
            return Err(unsupported("bias", "only \"none\""));
        }
        for k in ["rank_pattern", "alpha_pattern"] {
            if get(k).is_some_and(|v| v.as_object().is_none_or(|o| !o.is_empty())) {
                return Err(unsupported(k, "one rank and alpha for every module"));
            }
        }
        for k in [
            "layers_to_transform",
            "layer_replication",
            "modules_to_save",
            "exclude_modules",
            "target_parameters",
            "trainable_token_indices",
            "alora_invocation_tokens",
        ] {
            if get(k).is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty())) {
                return Err(unsupported(
                    k,
                    "plain adapters on the same modules of every layer, nothing else trained",
                ));
            }
        }
        let r = get("r").and_then(Value::as_u64).ok_or_else(|| {
            Error::Config("adapter_config.json: r is missing or not a non-negative integer".into())
        })?;
        let lora_alpha = get("lora_alpha").and_then(Value::as_f64).ok_or_else(|| {
            Error::Config("adapter_config.json: lora_alpha is missing or not a number".into())
        })?;
        let lora_dropout = match get("lora_dropout") {
            None => 0.0,
            Some(v) => v.as_f64().ok_or_else(|| {
                Error::Config(format!(
                    "adapter_config.json: lora_dropout {v} is not a number"
                ))
            })?,
        };
        let names: Vec<&str> = match get("target_modules") {
            Some(Value::String(s)) => vec![s.as_str()],
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str().ok_or_else(|| {
                        Error::Config(format!(
                            "adapter_config.json: target_modules entry {v} is not a string"
                        ))
                    })
                })
                .collect::<Result<_>>()?,
            other => {
                return Err(Error::Config(format!(
                    "adapter_config.json: target_modules {} is neither a list of module names \
                     nor \"all-linear\"",
                    other.map_or("(missing)".into(), Value::to_string)
                )))
            }
        };
        let cfg = Self {
            r: usize::try_from(r)
                .map_err(|_| Error::Config(format!("adapter_config.json: r = {r} is too large")))?,
            lora_alpha,
            target_modules: parse_targets(&names)?,
            lora_dropout,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// PEFT's `adapter_config.json` of this configuration for the base model
    /// `base_model_name_or_path` (a causal-LM adapter).
    pub fn to_peft_json(&self, base_model_name_or_path: &str) -> Value {
        let alpha = if self.lora_alpha.fract() == 0.0 && self.lora_alpha.abs() < 1e15 {
            json!(self.lora_alpha as i64)
        } else {
            json!(self.lora_alpha)
        };
        let targets: Vec<&str> = self.target_modules.iter().map(|t| t.name()).collect();
        json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base_model_name_or_path,
            "r": self.r,
            "lora_alpha": alpha,
            "lora_dropout": self.lora_dropout,
            "target_modules": targets,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": false,
            "use_dora": false,
            "init_lora_weights": true,
            "inference_mode": true,
            "modules_to_save": null,
            "layers_to_transform": null,
            "rank_pattern": {},
            "alpha_pattern": {},
        })
    }

    /// Reads `dir/adapter_config.json`.
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(ADAPTER_CONFIG);
        let text = std::fs::read_to_string(&path).map_err(|e| io_err("reading", &path, e))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| Error::Config(format!("{}: invalid JSON: {e}", path.display())))?;
        Self::from_peft_json(&v).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
    }

    /// The `(A, B)` shapes of the adapter of `target` on a model of `cfg`: `[r, in]`, `[out, r]`.
    pub fn adapter_shapes(
        &self,
        cfg: &ModelConfig,
        target: LoraTarget,
    ) -> ([usize; 2], [usize; 2]) {
        let (out, inp) = target.weight_shape(cfg);
        ([self.r, inp], [out, self.r])
    }
}

/// The targets of PEFT module names, or of `"all-linear"`. A module path (PEFT saves
/// `"all-linear"` as the paths it resolved to, `model.layers.0.self_attn.q_proj`) counts as its
/// module name; that every layer has the adapter is checked against the stored tensors.
fn parse_targets(names: &[&str]) -> Result<Vec<LoraTarget>> {
    let mut set = HashSet::new();
    for &name in names {
        if name == "all-linear" {
            set.extend(LoraTarget::ALL);
            continue;
        }
        let module = name.rsplit('.').next().unwrap_or_default();
        let t = LoraTarget::from_name(module)
            .filter(|t| module == name || name.ends_with(&format!(".{}", t.path())))
            .ok_or_else(|| {
                Error::Config(format!(
                    "LoRA: unknown target module {name:?} (known: q_proj, k_proj, v_proj, o_proj, \
                     gate_proj, up_proj, down_proj, or \"all-linear\")"
                ))
            })?;
        set.insert(t);
    }
    let mut out: Vec<LoraTarget> = set.into_iter().collect();
    out.sort();
    Ok(out)
}

/// One adapter: `lora_A [r, in]` and `lora_B [out, r]`.
#[derive(Debug, Clone)]
pub struct Adapter<W> {
    /// `lora_A`, `[r, in]`.
    pub lora_a: W,
    /// `lora_B`, `[out, r]`.
    pub lora_b: W,
}

/// The adapters of one decoder layer, by target.
#[derive(Debug, Clone)]
pub struct LayerAdapters<W> {
    adapters: [Option<Adapter<W>>; 7],
}

impl<W> Default for LayerAdapters<W> {
    fn default() -> Self {
        Self {
            adapters: std::array::from_fn(|_| None),
        }
    }
}

impl<W> LayerAdapters<W> {
    /// The adapter of `target`, if it has one.
    pub fn get(&self, target: LoraTarget) -> Option<&Adapter<W>> {
        self.adapters[target.index()].as_ref()
    }

    /// Every adapter with its target.
    pub fn iter(&self) -> impl Iterator<Item = (LoraTarget, &Adapter<W>)> {
        LoraTarget::ALL
            .into_iter()
            .filter_map(|t| self.get(t).map(|a| (t, a)))
    }

    pub(crate) fn set(&mut self, target: LoraTarget, adapter: Adapter<W>) {
        self.adapters[target.index()] = Some(adapter);
    }

    /// Applies `f` to every A and B, keeping the structure.
    pub fn map<U>(&self, mut f: impl FnMut(&W) -> Result<U>) -> Result<LayerAdapters<U>> {
        let mut out = LayerAdapters::default();
        for (t, a) in self.iter() {
            out.set(
                t,
                Adapter {
                    lora_a: f(&a.lora_a)?,
                    lora_b: f(&a.lora_b)?,
                },
            );
        }
        Ok(out)
    }

    /// Every A and B of the layer, in target order (A before B).
    pub fn weights(&self) -> Vec<&W> {
        self.iter()
            .flat_map(|(_, a)| [&a.lora_a, &a.lora_b])
            .collect()
    }
}

/// The adapters of one layer in the compute dtype with their scaling, for one forward pass.
pub(crate) struct LayerLora<'a> {
    pub adapters: &'a LayerAdapters<Tensor>,
    pub scale: f64,
}

impl LayerLora<'_> {
    /// `y + scale·(x·Aᵀ)·Bᵀ` when `target` has an adapter, else `y`; `x: [T, in]` (or
    /// `[T, heads, D]`), `y: [T, out]`.
    pub fn add(lora: Option<&Self>, target: LoraTarget, x: &Tensor, y: Tensor) -> Result<Tensor> {
        let Some(a) = lora.and_then(|l| l.adapters.get(target).map(|a| (a, l.scale))) else {
            return Ok(y);
        };
        let (adapter, scale) = a;
        let xa = crate::ops::linear(x, &adapter.lora_a)?.affine(scale, 0.0)?;
        Ok(crate::ops::linear_add(&xa, &adapter.lora_b, &y)?)
    }

    /// `x·Wᵀ + scale·(x·Aᵀ)·Bᵀ` for the frozen `w` when `target` has an adapter and one node
    /// computes it ([`crate::ops::lora_linear`]: the frozen output is not kept for the backward
    /// pass), split into `heads` when given; else `None` ([`LayerLora::add`] then adds the
    /// adapter to the projection).
    pub fn project(
        lora: Option<&Self>,
        target: LoraTarget,
        x: &Tensor,
        w: &Tensor,
        heads: Option<usize>,
    ) -> Result<Option<Tensor>> {
        let Some(l) = lora else { return Ok(None) };
        let Some(a) = l.adapters.get(target) else {
            return Ok(None);
        };
        Ok(crate::ops::lora_linear(
            x, w, &a.lora_a, &a.lora_b, l.scale, heads,
        )?)
    }

    /// Whether `target` has an adapter.
    pub fn has(lora: Option<&Self>, target: LoraTarget) -> bool {
        lora.is_some_and(|l| l.adapters.get(target).is_some())
    }
}

/// The name of an adapter tensor of layer `l` (`model.layers.{l}.self_attn.q_proj.lora_A.weight`,
/// transformers' module path; PEFT's file key is [`PEFT_PREFIX`] before it).
pub fn adapter_name(l: usize, target: LoraTarget, b: bool) -> String {
    let which = if b { "lora_B" } else { "lora_A" };
    format!("model.layers.{l}.{}.{which}.weight", target.path())
}

/// Builds the adapters of `lora` on a model of `cfg` with tensors from `source(name, shape)`
/// (any float dtype, converted to `master`), in layer and target order. Returns the adapters
/// and their parameters.
pub(crate) fn build_adapters(
    cfg: &ModelConfig,
    lora: &LoraConfig,
    master: DType,
    source: &mut dyn FnMut(&str, [usize; 2]) -> Result<Tensor>,
) -> Result<(Vec<LayerAdapters<Var>>, Vec<Param>)> {
    let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
    let mut params = Vec::new();
    for l in 0..cfg.num_hidden_layers {
        let mut layer = LayerAdapters::default();
        for &t in &lora.target_modules {
            let (sa, sb) = lora.adapter_shapes(cfg, t);
            let mut var = |b: bool, shape: [usize; 2]| -> Result<Var> {
                let name = adapter_name(l, t, b);
                let v = Var::from_tensor(&source(&name, shape)?.to_dtype(master)?)?;
                params.push(Param {
                    name,
                    var: v.clone(),
                });
                Ok(v)
            };
            let lora_a = var(false, sa)?;
            let lora_b = var(true, sb)?;
            layer.set(t, Adapter { lora_a, lora_b });
        }
        layers.push(layer);
    }
    Ok((layers, params))
}

/// The values of a fresh adapter as PEFT initialises them (`init_lora_weights=True`): `lora_A`
/// kaiming-uniform with `a = √5`, that is uniform in `±1/√in`, drawn from a generator seeded by
/// `seed` and the tensor's index; `lora_B` zero.
pub(crate) fn init_values(
    seed: u64,
    index: usize,
    name: &str,
    shape: [usize; 2],
) -> Result<Vec<f64>> {
    let n = shape[0] * shape[1];
    if name.contains(".lora_B.") {
        return Ok(vec![0.0; n]);
    }
    let bound = 1.0 / (shape[1].max(1) as f64).sqrt();
    let dist = Uniform::new(-bound, bound)
        .map_err(|e| Error::Config(format!("LoRA: {name}: no uniform in ±{bound}: {e}")))?;
    let mut rng =
        rand::rngs::StdRng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index as u64);
    Ok((0..n).map(|_| dist.sample(&mut rng)).collect())
}

impl Model {
    /// Loads the PEFT adapter directory `dir` (`adapter_config.json`, `adapter_model.safetensors`)
    /// onto this model, as [`Model::add_lora`] with the stored weights. The configuration is
    /// checked ([`LoraConfig::from_peft_json`]), then every tensor, before anything is computed:
    /// an unexpected or missing tensor, or one whose shape does not fit the base model's module,
    /// is an error naming the module and both shapes.
    pub fn load_adapter(&mut self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        let lora = LoraConfig::read(dir)?;
        let path = dir.join(ADAPTER_WEIGHTS);
        if !path.is_file() {
            return Err(Error::Checkpoint(format!(
                "{}: {ADAPTER_WEIGHTS} not found",
                dir.display()
            )));
        }
        // SAFETY: the file is mapped read-only; like every mmap-based loader we rely on it not
        // being truncated while the adapter loads.
        let st = unsafe { MmapedSafetensors::new(&path) }.map_err(|e| {
            Error::Checkpoint(format!("{}: cannot read safetensors: {e}", path.display()))
        })?;
        let found: HashMap<String, Vec<usize>> = st
            .tensors()
            .into_iter()
            .map(|(name, view)| (name, view.shape().to_vec()))
            .collect();
        let cfg = self.config().clone();
        let mut expected = HashSet::new();
        for l in 0..cfg.num_hidden_layers {
            for &t in &lora.target_modules {
                for b in [false, true] {
                    expected.insert(format!("{PEFT_PREFIX}{}", adapter_name(l, t, b)));
                }
            }
        }
        let mut extra: Vec<&String> = found.keys().filter(|k| !expected.contains(*k)).collect();
        extra.sort();
        if let Some(name) = extra.first() {
            return Err(Error::Checkpoint(format!(
                "{}: unexpected tensor {name} ({} unexpected in all) for an adapter of {:?} on \
                 {} layers",
                path.display(),
                extra.len(),
                lora.target_modules
                    .iter()
                    .map(|t| t.name())
                    .collect::<Vec<_>>(),
                cfg.num_hidden_layers
            )));
        }
        // Every shape first, so that a misfit is reported before anything is read.
        for l in 0..cfg.num_hidden_layers {
            for &t in &lora.target_modules {
                let (out, inp) = t.weight_shape(&cfg);
                let (sa, sb) = lora.adapter_shapes(&cfg, t);
                for (b, want) in [(false, sa), (true, sb)] {
                    let key = format!("{PEFT_PREFIX}{}", adapter_name(l, t, b));
                    match found.get(&key) {
                        None => {
                            return Err(Error::Checkpoint(format!(
                                "{}: tensor {key} is missing",
                                path.display()
                            )))
                        }
                        Some(s) if s.as_slice() != want => {
                            return Err(Error::Checkpoint(format!(
                                "{}: tensor {key} has shape {s:?}, but module \
                                 model.layers.{l}.{} of the base model has weight \
                                 [{out}, {inp}], so rank {} needs {want:?}",
                                path.display(),
                                t.path(),
                                lora.r
                            )))
                        }
                        Some(_) => {}
                    }
                }
            }
        }
        let device = self.device().clone();
        let mut source = |name: &str, _: [usize; 2]| -> Result<Tensor> {
            let key = format!("{PEFT_PREFIX}{name}");
            let dtype = st.get(&key)?.dtype();
            match dtype {
                safetensors::Dtype::BF16
                | safetensors::Dtype::F16
                | safetensors::Dtype::F32
                | safetensors::Dtype::F64 => Ok(st.load(&key, &device)?),
                other => Err(Error::Checkpoint(format!(
                    "{}: tensor {key} has dtype {other:?}, expected bf16, f16, f32 or f64",
                    path.display()
                ))),
            }
        };
        let (layers, params) = build_adapters(&cfg, &lora, self.master_dtype(), &mut source)?;
        self.attach_lora(lora, layers, params)
    }

    /// Saves the adapters as a PEFT adapter directory: `adapter_config.json` naming
    /// `base_model_name_or_path`, and `adapter_model.safetensors` with PEFT's key names, in the
    /// master dtype. Written into a temporary sibling directory and renamed onto `dir`
    /// (replacing a previous one there). An error when the model has no adapters.
    pub fn save_adapter(&self, dir: impl AsRef<Path>, base_model_name_or_path: &str) -> Result<()> {
        let lora = self.lora_config().ok_or_else(|| {
            Error::Input("the model has no LoRA adapters to save (Model::add_lora)".into())
        })?;
        let mut tensors = Vec::with_capacity(self.params().len());
        for p in self.params() {
            let t = p.var.as_detached_tensor().to_dtype(self.master_dtype())?;
            tensors.push((format!("{PEFT_PREFIX}{}", p.name), t));
        }
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        let metadata = Some([("format".to_string(), "pt".to_string())].into());
        write_dir_atomically(dir.as_ref(), true, |tmp| {
            write_json(
                &tmp.join(ADAPTER_CONFIG),
                &lora.to_peft_json(base_model_name_or_path),
            )?;
            write_safetensors(&tmp.join(ADAPTER_WEIGHTS), &tensors, &metadata)
        })
    }
}
