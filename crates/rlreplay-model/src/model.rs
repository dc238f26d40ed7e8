//! The causal language model (Qwen3, Qwen2, Llama): packed forward pass, per-token log-probs and
//! gradients. The decoder layers are [`DecoderLayer`]s built by the architecture named in the
//! configuration.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use candle_core::{DType, Device, Tensor, TensorId, Var};
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

use crate::layer::{DecoderLayer, LayerCtx, Rotary, VarBuilder, WeightSource};
use crate::lora::{self, LayerAdapters, LayerLora, LoraConfig};
use crate::ops;
use crate::pack::{Packed, SeqPair};
use crate::{Error, MemoryEstimate, ModelConfig, Result, Workload};

/// Standard deviation of the random initialisation of matrices (Hugging Face `initializer_range`).
const INIT_STD: f64 = 0.02;

/// One named parameter; the name is the Hugging Face tensor name (for a LoRA adapter,
/// transformers' module path with `lora_A` / `lora_B`, PEFT's key without its prefix).
#[derive(Debug, Clone)]
pub struct Param {
    /// Hugging Face tensor name, e.g. `model.layers.0.mlp.up_proj.weight`.
    pub name: String,
    /// The master weight (f32, or f64 for an f64 model), or its compute-dtype replica where the
    /// master was dropped ([`Model::drop_master`]).
    pub var: Var,
}

/// The weights a [`Model`] holds, in bytes: the master weights (f32) and the compute-dtype
/// replicas of the parameters whose masters were dropped ([`Model::drop_master`]). The
/// compute-dtype casts of the masters that a pass makes are not counted: they live for the pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeldWeights {
    /// Bytes of master weights.
    pub masters: u64,
    /// Bytes of compute-dtype replicas.
    pub replicas: u64,
}

/// Per-token log-probs (and entropies) of the response tokens, one vector per input pair.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogProbs {
    /// `log softmax(z/τ)` of each response token, in order.
    pub logprobs: Vec<Vec<f64>>,
    /// Entropy of `softmax(z/τ)` at each response token, when asked for.
    pub entropy: Option<Vec<Vec<f64>>>,
}

/// A causal LM of any supported [`crate::Architecture`] with master weights, gradient buffers and a compute dtype.
pub struct Model {
    cfg: ModelConfig,
    embed_tokens: Var,
    layers: Vec<DecoderLayer<Var>>,
    norm: Var,
    /// The output matrix; `None` when tied to `embed_tokens`.
    lm_head: Option<Var>,
    rotary: Rotary,
    /// The trainable parameters: every weight, or only the adapters when LoRA is on.
    params: Vec<Param>,
    /// The frozen base weights when LoRA is on (empty otherwise), in Hugging Face order.
    frozen: Vec<Param>,
    /// The LoRA configuration and every layer's adapters, when on.
    lora: Option<(LoraConfig, Vec<LayerAdapters<Var>>)>,
    /// Index into `params` of every trainable weight.
    index: HashMap<TensorId, usize>,
    grads: Vec<Option<Tensor>>,
    /// The exact sums behind `grads` once a second micro-batch was added: the micro-batches'
    /// gradients summed in f64, `grads` being their rounding to the master dtype (see
    /// [`Model::grad_sums`]).
    sums: Vec<Option<Tensor>>,
    compute_dtype: DType,
    device: Device,
    source_dir: Option<PathBuf>,
    recompute: bool,
    /// The graph leaves made for the replicas a tracked pass uses, with their parameter index:
    /// one leaf per use, so that each use's gradient reaches the master dtype on its own, as
    /// through the cast of a master.
    taps: Mutex<Vec<(usize, Var)>>,
}

/// The master dtype used for a compute dtype: f64 for f64, f32 otherwise.
pub(crate) fn master_dtype(compute: DType) -> DType {
    if compute == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Checks that `dtype` is a supported compute dtype.
fn check_compute_dtype(dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::F64 | DType::BF16 | DType::F16 => Ok(()),
        other => Err(Error::Input(format!(
            "compute dtype {other:?} is not supported (f32, f64, bf16, f16)"
        ))),
    }
}

/// Whether the weight `name` is an RMSNorm weight (initialised to 1).
fn is_norm(name: &str) -> bool {
    name.ends_with("norm.weight")
}

impl Model {
    /// Builds the model of `cfg` with weights from `source` (asked for by Hugging Face name, in
    /// Hugging Face order).
    pub(crate) fn build(
        cfg: ModelConfig,
        source: &mut WeightSource<'_>,
        compute_dtype: DType,
        device: &Device,
        source_dir: Option<PathBuf>,
    ) -> Result<Self> {
        check_compute_dtype(compute_dtype)?;
        let (v, h) = (cfg.vocab_size, cfg.hidden_size);
        let mut vb = VarBuilder::new(source, master_dtype(compute_dtype));
        let embed_tokens = vb.get("model.embed_tokens.weight", &[v, h])?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| DecoderLayer::new(&cfg, &mut vb, &format!("model.layers.{l}")))
            .collect::<Result<Vec<_>>>()?;
        let norm = vb.get("model.norm.weight", &[h])?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(vb.get("lm_head.weight", &[v, h])?)
        };
        let params = vb.params;
        let index = params
            .iter()
            .enumerate()
            .map(|(i, p)| (p.var.as_tensor().id(), i))
            .collect();
        Ok(Self {
            rotary: Rotary::new(&cfg),
            cfg,
            embed_tokens,
            layers,
            norm,
            lm_head,
            grads: vec![None; params.len()],
            sums: vec![None; params.len()],
            params,
            frozen: Vec::new(),
            lora: None,
            index,
            compute_dtype,
            device: device.clone(),
            source_dir,
            recompute: false,
            taps: Mutex::new(Vec::new()),
        })
    }

    /// A randomly initialised model, deterministic for a given `seed`: matrices and biases drawn
    /// from N(0, 0.02²) as Hugging Face draws matrices, norm weights set to 1. `dtype` is the
    /// compute dtype; master weights are f32 (f64 for an f64 model). Refused with the estimate
    /// when the weights do not fit in the device's available memory ([`MemoryEstimate`]).
    pub fn new_random(cfg: ModelConfig, seed: u64, dtype: DType, device: &Device) -> Result<Self> {
        cfg.validate()?;
        check_compute_dtype(dtype)?;
        MemoryEstimate::new(&cfg, dtype, Workload::Inference).check(device)?;
        let master = master_dtype(dtype);
        let normal = Normal::new(0.0f64, INIT_STD).expect("valid normal distribution");
        let mut source = |name: &str, shape: &[usize], i: usize| -> Result<Tensor> {
            if is_norm(name) {
                return Ok(Tensor::ones(shape, master, device)?);
            }
            let n: usize = shape.iter().product();
            let mut rng = rand::rngs::StdRng::seed_from_u64(
                seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i as u64,
            );
            let values: Vec<f64> = (0..n).map(|_| normal.sample(&mut rng)).collect();
            Ok(Tensor::from_vec(values, shape, device)?.to_dtype(master)?)
        };
        Self::build(cfg, &mut source, dtype, device, None)
    }

    /// A randomly initialised model drawn on `device` itself (candle's generator; cuRAND on
    /// CUDA): matrices and biases from N(0, 0.02²), norm weights 1. Fast at full size (for
    /// benchmarks), but not reproducible across devices; [`Model::new_random`] is.
    pub fn new_random_on_device(cfg: ModelConfig, dtype: DType, device: &Device) -> Result<Self> {
        cfg.validate()?;
        check_compute_dtype(dtype)?;
        let master = master_dtype(dtype);
        let mut source = |name: &str, shape: &[usize], _: usize| -> Result<Tensor> {
            Ok(if is_norm(name) {
                Tensor::ones(shape, master, device)?
            } else {
                Tensor::randn(0f32, INIT_STD as f32, shape, device)?.to_dtype(master)?
            })
        };
        Self::build(cfg, &mut source, dtype, device, None)
    }

    /// The model configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The dtype the forward pass computes in.
    pub fn compute_dtype(&self) -> DType {
        self.compute_dtype
    }

    /// The dtype of master weights, gradients and optimizer state (f32, or f64 for an f64 model).
    pub fn master_dtype(&self) -> DType {
        master_dtype(self.compute_dtype)
    }

    /// The device holding the weights.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The directory the model was loaded from, if any (tokenizer files are copied from it on save).
    pub fn source_dir(&self) -> Option<&std::path::Path> {
        self.source_dir.as_deref()
    }

    /// Sets the directory tokenizer files are copied from on save (for a model loaded from a
    /// checkpoint that may later be rotated away, the run's original model directory).
    pub fn set_source_dir(&mut self, dir: Option<PathBuf>) {
        self.source_dir = dir;
    }

    /// Every trainable parameter, in Hugging Face order.
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// Whether parameter `i` holds its master weight; `false` once [`Model::drop_master`] kept
    /// only its compute-dtype replica.
    pub fn holds_master(&self, i: usize) -> bool {
        self.params.get(i).is_some_and(|p| !self.is_replica(&p.var))
    }

    /// Drops the master weight of parameter `i` and keeps its cast to the compute dtype (a
    /// replica) instead: for a data-parallel rank that does not update this parameter itself and
    /// only computes with it (ZeRO with sharded master weights). Passes, log-probs and gradients
    /// are the same bits as with the master, and the gradient stays in the master dtype; the
    /// optimizer must not update the parameter while it is a replica (a replica holds no
    /// gradient after an optimizer's step either way: the owner updates it and sends the cast,
    /// [`Model::set_weight_bytes`]). [`Model::set_weight`] with master-dtype values restores the
    /// master. Refused when the compute dtype is the master dtype (f32, f64): the masters are
    /// the compute weights then, and there is nothing to save.
    pub fn drop_master(&mut self, i: usize) -> Result<()> {
        if self.compute_dtype == self.master_dtype() {
            return Err(Error::Input(format!(
                "the master weights of a {:?} model are its compute weights: there is no \
                 replica to keep instead",
                self.compute_dtype
            )));
        }
        let p = self.param(i)?;
        if self.is_replica(&p.var) {
            return Ok(());
        }
        let replica = p.var.as_detached_tensor().to_dtype(self.compute_dtype)?;
        self.set_weight(i, &replica)
    }

    /// Sets the weight of parameter `i` (of its shape): values in the master dtype make it the
    /// parameter's master weight (restoring a dropped one), values in the compute dtype its
    /// replica (dropping the master, as [`Model::drop_master`]). The gradient buffer is left as
    /// it is.
    pub fn set_weight(&mut self, i: usize, values: &Tensor) -> Result<()> {
        let p = self.param(i)?.clone();
        if values.shape() != p.var.shape() {
            return Err(Error::Input(format!(
                "{}: shape {:?} given for a weight of shape {:?}",
                p.name,
                values.dims(),
                p.var.dims()
            )));
        }
        let dtype = values.dtype();
        if dtype != self.master_dtype() && dtype != self.compute_dtype {
            return Err(Error::Input(format!(
                "{}: {dtype:?} values for a model of {:?} masters computing in {:?}",
                p.name,
                self.master_dtype(),
                self.compute_dtype
            )));
        }
        if dtype == p.var.dtype() {
            p.var.set(values)?;
            return Ok(());
        }
        let new = Var::from_tensor(&values.detach())?;
        let old = p.var.as_tensor().id();
        self.swap_var(old, &new)?;
        self.index.remove(&old);
        self.index.insert(new.as_tensor().id(), i);
        self.params[i].var = new;
        Ok(())
    }

    /// Puts `new` wherever the model holds the weight `old` (the embedding, the norms, the LM
    /// head, the layers, the adapters); the parameter lists are the caller's.
    fn swap_var(&mut self, old: TensorId, new: &Var) -> Result<()> {
        let swap = |v: &Var| {
            if v.as_tensor().id() == old {
                new.clone()
            } else {
                v.clone()
            }
        };
        self.embed_tokens = swap(&self.embed_tokens);
        self.norm = swap(&self.norm);
        self.lm_head = self.lm_head.as_ref().map(swap);
        self.layers = self
            .layers
            .iter()
            .map(|l| l.map(|v| Ok(swap(v))))
            .collect::<Result<_>>()?;
        if let Some((_, adapters)) = &mut self.lora {
            *adapters = adapters
                .iter()
                .map(|l| l.map(|v| Ok(swap(v))))
                .collect::<Result<_>>()?;
        }
        Ok(())
    }

    /// Holds every frozen weight in `dtype` (its cast), in place of what it was held in.
    fn cast_frozen(&mut self, dtype: DType) -> Result<()> {
        for i in 0..self.frozen.len() {
            let old = self.frozen[i].var.clone();
            if old.dtype() == dtype {
                continue;
            }
            let new = Var::from_tensor(&old.as_detached_tensor().to_dtype(dtype)?)?;
            self.swap_var(old.as_tensor().id(), &new)?;
            self.frozen[i].var = new;
        }
        Ok(())
    }

    /// The weight of parameter `i` cast to `dtype` (f32, f64, bf16 or f16), as little-endian
    /// bytes (to send it to other processes).
    pub fn weight_bytes(&self, i: usize, dtype: DType) -> Result<Vec<u8>> {
        let t = self
            .param(i)?
            .var
            .as_detached_tensor()
            .to_dtype(dtype)?
            .flatten_all()?;
        Ok(match dtype {
            DType::F32 => t
                .to_vec1::<f32>()?
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            DType::F64 => t
                .to_vec1::<f64>()?
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            DType::BF16 => t
                .to_vec1::<half::bf16>()?
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            DType::F16 => t
                .to_vec1::<half::f16>()?
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            other => {
                return Err(Error::Input(format!(
                    "weights are sent as f32, f64, bf16 or f16, not {other:?}"
                )))
            }
        })
    }

    /// [`Model::set_weight`] from the little-endian bytes of `dtype` values that
    /// [`Model::weight_bytes`] made.
    pub fn set_weight_bytes(&mut self, i: usize, dtype: DType, bytes: &[u8]) -> Result<()> {
        let p = self.param(i)?;
        let want = p.var.elem_count() * dtype.size_in_bytes();
        if bytes.len() != want {
            return Err(Error::Input(format!(
                "{}: {} bytes for {} {dtype:?} values ({want} bytes)",
                p.name,
                bytes.len(),
                p.var.elem_count()
            )));
        }
        let t = Tensor::from_raw_buffer(bytes, dtype, p.var.dims(), &self.device)?;
        self.set_weight(i, &t)
    }

    /// The bytes of master weights and of replicas this model holds.
    pub fn held_weights(&self) -> HeldWeights {
        let mut held = HeldWeights::default();
        for p in self.params.iter().chain(&self.frozen) {
            let bytes = (p.var.elem_count() * p.var.dtype().size_in_bytes()) as u64;
            if self.is_replica(&p.var) {
                held.replicas += bytes;
            } else {
                held.masters += bytes;
            }
        }
        held
    }

    /// Whether `var` is a replica (its dtype is not the master dtype).
    fn is_replica(&self, var: &Var) -> bool {
        var.dtype() != self.master_dtype()
    }

    fn param(&self, i: usize) -> Result<&Param> {
        self.params.get(i).ok_or_else(|| {
            Error::Input(format!(
                "parameter {i} does not exist ({} parameters)",
                self.params.len()
            ))
        })
    }

    /// The decoder layers' master weights, by name.
    pub fn layers(&self) -> &[DecoderLayer<Var>] {
        &self.layers
    }

    /// The LoRA configuration, when the model carries adapters.
    pub fn lora_config(&self) -> Option<&LoraConfig> {
        self.lora.as_ref().map(|(c, _)| c)
    }

    /// Every layer's LoRA adapters (master weights), when the model carries them.
    pub fn lora_adapters(&self) -> Option<&[LayerAdapters<Var>]> {
        self.lora.as_ref().map(|(_, a)| a.as_slice())
    }

    /// The frozen base weights under LoRA adapters, in Hugging Face order (empty without
    /// adapters: every weight is then a trainable [`Model::params`] entry).
    pub fn frozen_params(&self) -> &[Param] {
        &self.frozen
    }

    /// Puts fresh LoRA adapters on the targeted projections of every layer, initialised as PEFT
    /// does: `lora_A` kaiming-uniform (uniform in `±1/√in`, drawn deterministically from `seed`),
    /// `lora_B` zero, so the model computes what it did. From then on [`Model::params`] (what
    /// the optimizer updates) are only the adapters; the base weights are frozen
    /// ([`Model::frozen_params`]) and the backward pass computes no gradient for them.
    /// Accumulated gradients are cleared. Refused when the model already has adapters.
    pub fn add_lora(&mut self, cfg: LoraConfig, seed: u64) -> Result<()> {
        cfg.validate()?;
        let model_cfg = self.cfg.clone();
        let device = self.device.clone();
        let mut index = 0usize;
        let mut source = |name: &str, shape: [usize; 2]| -> Result<Tensor> {
            let values = lora::init_values(seed, index, name, shape)?;
            index += 1;
            Ok(Tensor::from_vec(values, shape.to_vec(), &device)?)
        };
        let (layers, params) =
            lora::build_adapters(&model_cfg, &cfg, self.master_dtype(), &mut source)?;
        self.attach_lora(cfg, layers, params)
    }

    /// Makes `params` (the adapters `layers` of `cfg`) the trainable parameters and freezes the
    /// base weights.
    pub(crate) fn attach_lora(
        &mut self,
        cfg: LoraConfig,
        layers: Vec<LayerAdapters<Var>>,
        params: Vec<Param>,
    ) -> Result<()> {
        if let Some((c, _)) = &self.lora {
            return Err(Error::Input(format!(
                "the model already carries LoRA adapters (r = {}): merge them (Model::merge_lora) \
                 before adding others",
                c.r
            )));
        }
        if layers.len() != self.layers.len() {
            return Err(Error::Input(format!(
                "{} layers of adapters for a model of {} layers",
                layers.len(),
                self.layers.len()
            )));
        }
        self.frozen = std::mem::replace(&mut self.params, params);
        self.lora = Some((cfg, layers));
        self.reindex();
        // Frozen weights need no master: in a half-precision model they are held in the compute
        // dtype only (half the bytes), as the passes would cast them anyway.
        self.cast_frozen(self.compute_dtype)
    }

    /// Folds the LoRA adapters into the base weights, `W + (alpha/r)·B·A` (computed in the master
    /// dtype), and drops them: the model is a plain model again, every weight trainable (for
    /// export with [`Model::save_hf`], which a model with adapters refuses). Accumulated
    /// gradients are cleared. An error when the model has no adapters.
    pub fn merge_lora(&mut self) -> Result<()> {
        // Masters again (a half-precision model held its frozen weights in the compute dtype;
        // without adapters nothing is frozen).
        self.cast_frozen(self.master_dtype())?;
        let Some((cfg, adapters)) = self.lora.take() else {
            return Err(Error::Input(
                "the model has no LoRA adapters to merge".into(),
            ));
        };
        for (layer, adapters) in self.layers.iter().zip(&adapters) {
            for (t, a) in adapters.iter() {
                let w = t.weight(layer);
                let merged = merged_weight(w.as_tensor(), &a.lora_a, &a.lora_b, cfg.scaling())?;
                w.set(&merged.to_dtype(w.dtype())?)?;
            }
        }
        self.params = std::mem::take(&mut self.frozen);
        self.reindex();
        Ok(())
    }

    /// Rebuilds the index of the trainable parameters and clears the gradients.
    fn reindex(&mut self) {
        self.index = self
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| (p.var.as_tensor().id(), i))
            .collect();
        self.grads = vec![None; self.params.len()];
        self.sums = vec![None; self.params.len()];
        self.taps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Whether `var` is a trainable parameter (not a frozen base weight under adapters).
    fn is_trainable(&self, var: &Var) -> bool {
        self.index.contains_key(&var.as_tensor().id())
    }

    /// The accumulated gradient of each parameter (same order as [`Model::params`]); `None` before
    /// any [`Model::forward_backward`] since the last [`Model::zero_grad`].
    pub fn grads(&self) -> &[Option<Tensor>] {
        &self.grads
    }

    /// Mutable access to the gradient buffers (for clipping, scaling or all-reduce). A gradient
    /// changed here is no longer the rounding of its sum ([`Model::grad_sums`]): the sums are
    /// dropped.
    pub fn grads_mut(&mut self) -> &mut [Option<Tensor>] {
        self.sums.iter_mut().for_each(|s| *s = None);
        &mut self.grads
    }

    /// The accumulated gradients in f64, as summed: micro-batch gradients add up in f64 and
    /// [`Model::grads`] is that sum rounded once to the master dtype, so the rounding does not
    /// depend on how the micro-batches were grouped (one process adding eight, or two ranks
    /// adding four each and then their two sums). Exact sums give the same bits in any
    /// grouping; an f64 sum rounds only when one parameter's terms lie more than about 2^29
    /// apart in magnitude, and that changes the final rounding about once in 2^29.
    pub fn grad_sums(&self) -> Result<Vec<Option<Tensor>>> {
        self.sums
            .iter()
            .zip(&self.grads)
            .map(|(s, g)| match (s, g) {
                (Some(s), _) => Ok(Some(s.clone())),
                (None, Some(g)) => Ok(Some(g.to_dtype(DType::F64)?)),
                (None, None) => Ok(None),
            })
            .collect()
    }

    /// Sets the accumulated gradients from f64 sums (as [`Model::grad_sums`] gives them, for
    /// example summed over data-parallel ranks): [`Model::grads`] becomes their rounding.
    pub fn set_grad_sums(&mut self, sums: Vec<Option<Tensor>>) -> Result<()> {
        if sums.len() != self.params.len() {
            return Err(Error::Input(format!(
                "{} gradient sums for {} parameters",
                sums.len(),
                self.params.len()
            )));
        }
        let dt = self.master_dtype();
        for ((g, s), sum) in self.grads.iter_mut().zip(self.sums.iter_mut()).zip(sums) {
            *g = sum.as_ref().map(|t| t.to_dtype(dt)).transpose()?;
            *s = sum;
        }
        Ok(())
    }

    /// Turns per-layer activation recompute (gradient checkpointing) on or off; off by default.
    /// When on, [`Model::forward_backward`] runs the decoder layers without an autograd graph and
    /// keeps only each layer's input; the backward pass then goes from the top layer down,
    /// rebuilding one layer's graph at a time from its saved input. Peak memory drops from all
    /// layers' activations to one layer's (plus the `[T, H]` layer inputs) at the cost of a second
    /// forward pass of the layers; the gradients are the same.
    pub fn set_activation_recompute(&mut self, on: bool) {
        self.recompute = on;
    }

    /// Whether per-layer activation recompute is on (see [`Model::set_activation_recompute`]).
    pub fn activation_recompute(&self) -> bool {
        self.recompute
    }

    /// Clears the accumulated gradients.
    pub fn zero_grad(&mut self) {
        self.grads.iter_mut().for_each(|g| *g = None);
        self.sums.iter_mut().for_each(|s| *s = None);
    }

    /// The parameters holding NaN or infinite values, with how many each holds (empty for a
    /// healthy model). Reads the weights in chunks of at most 4 Mi values.
    pub fn non_finite_params(&self) -> Result<Vec<(String, usize)>> {
        const CHUNK: usize = 1 << 22;
        let mut out = Vec::new();
        for p in &self.params {
            let t = p.var.as_tensor();
            let rows = t.dim(0)?;
            let per_row = (t.elem_count() / rows.max(1)).max(1);
            let step = (CHUNK / per_row).max(1);
            let mut bad = 0;
            let mut start = 0;
            while start < rows {
                let n = step.min(rows - start);
                let chunk = t.narrow(0, start, n)?.flatten_all()?;
                bad += match chunk.dtype() {
                    DType::F64 => chunk
                        .to_vec1::<f64>()?
                        .iter()
                        .filter(|x| !x.is_finite())
                        .count(),
                    _ => chunk
                        .to_dtype(DType::F32)?
                        .to_vec1::<f32>()?
                        .iter()
                        .filter(|x| !x.is_finite())
                        .count(),
                };
                start += n;
            }
            if bad > 0 {
                out.push((p.name.clone(), bad));
            }
        }
        Ok(out)
    }

    /// The global L2 norm of the accumulated gradients (0 when there are none).
    pub fn grad_norm(&self) -> Result<f64> {
        let mut sq = 0.0f64;
        for g in self.grads.iter().flatten() {
            sq += g
                .sqr()?
                .sum_all()?
                .to_dtype(DType::F64)?
                .to_scalar::<f64>()?;
        }
        Ok(sq.sqrt())
    }

    /// Per-token log-probs of the response tokens of `pairs`, packed into one forward pass without
    /// an autograd graph. `temperature` divides the logits; `entropy` also returns the entropies.
    pub fn logprobs(
        &self,
        pairs: &[SeqPair<'_>],
        temperature: f64,
        entropy: bool,
    ) -> Result<TokenLogProbs> {
        crate::on_pool(|| self.logprobs_here(pairs, temperature, entropy))
    }

    /// [`Model::logprobs`] on the calling thread.
    fn logprobs_here(
        &self,
        pairs: &[SeqPair<'_>],
        temperature: f64,
        entropy: bool,
    ) -> Result<TokenLogProbs> {
        let packed = self.pack(pairs)?;
        let (lp, ent) = self.forward_logprobs(&packed, temperature, entropy, false)?;
        let logprobs = packed.split(&to_f64_vec(&lp)?);
        let entropy = match ent {
            Some(e) => Some(packed.split(&to_f64_vec(&e)?)),
            None => None,
        };
        Ok(TokenLogProbs { logprobs, entropy })
    }

    /// Runs `pairs` forward with a graph and accumulates into the gradient buffers the gradient
    /// of `Σ g_t · ℓ_t`, where `ℓ_t` are the response-token log-probs and `g_t` =
    /// `grad_logprobs[t]` (all response tokens of all pairs, concatenated in order). Gradients add
    /// up across calls (micro-batches) until [`Model::zero_grad`]. Returns the log-probs. With
    /// [`Model::set_activation_recompute`] on, the layers' activations are recomputed during the
    /// backward pass instead of being kept.
    pub fn forward_backward(
        &mut self,
        pairs: &[SeqPair<'_>],
        grad_logprobs: &[f64],
        temperature: f64,
    ) -> Result<Vec<Vec<f64>>> {
        crate::on_pool(|| self.forward_backward_here(pairs, grad_logprobs, temperature))
    }

    /// [`Model::forward_backward`] on the calling thread.
    fn forward_backward_here(
        &mut self,
        pairs: &[SeqPair<'_>],
        grad_logprobs: &[f64],
        temperature: f64,
    ) -> Result<Vec<Vec<f64>>> {
        let packed = self.pack(pairs)?;
        if grad_logprobs.len() != packed.targets.len() {
            return Err(Error::Input(format!(
                "{} log-prob gradients for {} response tokens",
                grad_logprobs.len(),
                packed.targets.len()
            )));
        }
        if let Some((i, g)) = grad_logprobs
            .iter()
            .enumerate()
            .find(|(_, g)| !g.is_finite())
        {
            return Err(Error::Input(format!(
                "log-prob gradient {i} is not finite ({g})"
            )));
        }
        if packed.targets.is_empty() {
            return Ok(packed.split::<f64>(&[]));
        }
        self.taps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        let mut fresh = vec![None; self.params.len()];
        let lp = if self.recompute {
            self.backward_recompute(&packed, grad_logprobs, temperature, &mut fresh)?
        } else {
            let lp = self.forward_for_grad(&packed, temperature, grad_logprobs)?;
            let g = Tensor::new(grad_logprobs, &self.device)?.to_dtype(lp.dtype())?;
            let mut store = (&lp * &g)?.sum_all()?.backward()?;
            let all: Vec<&Var> = self.params.iter().map(|p| &p.var).collect();
            self.collect_grads(&mut store, all, &mut fresh)?;
            lp
        };
        let dt = self.master_dtype();
        for (((p, acc), sum), grad) in self
            .params
            .iter()
            .zip(self.grads.iter_mut())
            .zip(self.sums.iter_mut())
            .zip(fresh)
        {
            let grad = grad.ok_or_else(|| no_gradient(&p.name))?;
            // The first micro-batch's gradient is its own sum; later ones add up in f64.
            *acc = Some(match acc.take() {
                None => grad,
                Some(a) => {
                    let before = match sum.take() {
                        Some(s) => s,
                        None => a.to_dtype(DType::F64)?,
                    };
                    let total = (before + grad.to_dtype(DType::F64)?)?;
                    let rounded = total.to_dtype(dt)?;
                    *sum = Some(total);
                    rounded
                }
            });
        }
        Ok(packed.split(&to_f64_vec(&lp)?))
    }

    /// Moves the gradients of `vars` from `store` into `out` (indexed like the parameters), adding
    /// to what is there; errors for a weight without a gradient.
    fn collect_grads<'v>(
        &self,
        store: &mut candle_core::backprop::GradStore,
        vars: impl IntoIterator<Item = &'v Var>,
        out: &mut [Option<Tensor>],
    ) -> Result<()> {
        let mut add = |i: usize, grad: Tensor| -> Result<()> {
            out[i] = Some(match out[i].take() {
                Some(a) => (a + grad)?,
                None => grad,
            });
            Ok(())
        };
        for var in vars.into_iter().filter(|v| !self.is_replica(v)) {
            // A frozen weight gets no gradient.
            let Some(&i) = self.index.get(&var.as_tensor().id()) else {
                continue;
            };
            let grad = store
                .remove(var.as_tensor())
                .ok_or_else(|| no_gradient(&self.params[i].name))?;
            add(i, grad)?;
        }
        let taps = std::mem::take(&mut *self.taps.lock().unwrap_or_else(PoisonError::into_inner));
        for (i, leaf) in taps {
            let grad = store
                .remove(leaf.as_tensor())
                .ok_or_else(|| no_gradient(&self.params[i].name))?;
            // What the cast of a master hands its master: `0 + g` in the master dtype.
            add(i, grad.to_dtype(self.master_dtype())?.affine(1.0, 0.0)?)?;
        }
        Ok(())
    }

    /// [`Model::forward_backward`] with per-layer activation recompute: the gradients of
    /// `Σ g_t · ℓ_t` go into `out` (indexed like the parameters); returns the log-probs `ℓ`.
    fn backward_recompute(
        &self,
        packed: &Packed,
        grad_logprobs: &[f64],
        temperature: f64,
        out: &mut [Option<Tensor>],
    ) -> Result<Tensor> {
        let tables = self.rope_tables(packed)?;
        let ctx = LayerCtx::new(&self.cfg, &tables);
        // Forward without a graph, keeping each layer's input.
        let mut inputs = Vec::with_capacity(self.layers.len());
        let mut x = self.embed(packed, false)?;
        for l in 0..self.layers.len() {
            let next = self.layer_forward(l, &x, &ctx, packed, false)?;
            inputs.push(std::mem::replace(&mut x, next));
        }
        // Head: final norm and lm_head on the top hidden states as a leaf.
        let top = Var::from_tensor(&x)?;
        drop(x);
        let hidden = self.final_hidden(top.as_tensor(), packed, true)?;
        let lp = ops::token_logprobs_for_grad(
            &hidden,
            &self.lm_head(true)?,
            &packed.targets,
            temperature,
            grad_logprobs,
        )?;
        let g = Tensor::new(grad_logprobs, &self.device)?.to_dtype(lp.dtype())?;
        let mut store = (&lp * &g)?.sum_all()?.backward()?;
        self.collect_grads(&mut store, [&self.norm, self.head_var()], out)?;
        let missing = |what: &str| Error::Input(format!("{what} received no gradient"));
        let mut grad_x = store
            .remove(top.as_tensor())
            .ok_or_else(|| missing("the final hidden states"))?;
        drop(store);
        // Layers from the top: rebuild one layer's graph from its input, backprop grad_x.
        for (l, input) in inputs.into_iter().enumerate().rev() {
            let input = Var::from_tensor(&input)?;
            let y = self.layer_forward(l, input.as_tensor(), &ctx, packed, true)?;
            let mut store = (y * &grad_x)?.sum_all()?.backward()?;
            self.collect_grads(&mut store, self.layer_vars(l), out)?;
            grad_x = store
                .remove(input.as_tensor())
                .ok_or_else(|| missing(&format!("the input of layer {l}")))?;
        }
        // Embedding lookup (frozen under adapters).
        if self.is_trainable(&self.embed_tokens) {
            let mut store = (self.embed(packed, true)? * &grad_x)?
                .sum_all()?
                .backward()?;
            self.collect_grads(&mut store, [&self.embed_tokens], out)?;
        }
        Ok(lp)
    }

    fn pack(&self, pairs: &[SeqPair<'_>]) -> Result<Packed> {
        Packed::new(pairs, self.cfg.vocab_size, self.cfg.max_position_embeddings)
    }

    /// A master weight (or a replica) in the compute dtype, tracked by autograd when `track` and
    /// the weight is trainable (a frozen base weight under adapters never is).
    fn weight(&self, var: &Var, track: bool) -> Result<Tensor> {
        let track = track && self.is_trainable(var);
        if self.is_replica(var) {
            if !track {
                return Ok(var.as_detached_tensor());
            }
            // A leaf of its own for this use (a copy, as a master's cast is one), whose
            // gradient collect_grads brings to the master dtype.
            let leaf = Var::from_tensor(&var.as_detached_tensor())?;
            let i = self.index[&var.as_tensor().id()];
            self.taps
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((i, leaf.clone()));
            return Ok(leaf.as_tensor().clone());
        }
        let t = if track {
            var.as_tensor().clone()
        } else {
            var.as_detached_tensor()
        };
        Ok(t.to_dtype(self.compute_dtype)?)
    }

    /// The weights of layer `l` in the compute dtype (tracked when `track`).
    pub(crate) fn layer_weights(&self, l: usize, track: bool) -> Result<DecoderLayer<Tensor>> {
        self.layers[l].map(|v| self.weight(v, track))
    }

    /// The LoRA adapters of layer `l` in the compute dtype (tracked when `track`), with their
    /// scaling.
    fn layer_adapters(
        &self,
        l: usize,
        track: bool,
    ) -> Result<Option<(LayerAdapters<Tensor>, f64)>> {
        self.lora
            .as_ref()
            .map(|(cfg, layers)| Ok((layers[l].map(|v| self.weight(v, track))?, cfg.scaling())))
            .transpose()
    }

    /// The weights of layer `l` in the compute dtype without a graph, with the LoRA adapters
    /// merged into the projections they target (`W + (alpha/r)·B·A` in the master dtype, then
    /// cast): what the decoders generate with.
    pub(crate) fn merged_layer_weights(&self, l: usize) -> Result<DecoderLayer<Tensor>> {
        let Some((cfg, adapters)) = &self.lora else {
            return self.layer_weights(l, false);
        };
        let mut out = self.layer_weights(l, false)?;
        for (t, a) in adapters[l].iter() {
            let w = t.weight(&self.layers[l]).as_detached_tensor();
            let w = w.to_dtype(self.master_dtype())?;
            let merged = merged_weight(&w, &a.lora_a, &a.lora_b, cfg.scaling())?;
            *t.weight_mut(&mut out) = merged.to_dtype(self.compute_dtype)?;
        }
        Ok(out)
    }

    /// The trainable weights of layer `l`: its own and its adapters'.
    fn layer_vars(&self, l: usize) -> Vec<&Var> {
        let mut vars = self.layers[l].weights();
        if let Some((_, adapters)) = &self.lora {
            vars.extend(adapters[l].weights());
        }
        vars.retain(|v| self.is_trainable(v));
        vars
    }

    /// The rotary embedding of the model.
    pub(crate) fn rotary(&self) -> &Rotary {
        &self.rotary
    }

    /// Rotary `cos`/`sin` tables `[T, D/2]` for the packed positions.
    fn rope_tables(&self, packed: &Packed) -> Result<(Tensor, Tensor)> {
        self.rotary.tables(
            packed.positions.iter().map(|&p| p as usize),
            self.compute_dtype,
            &self.device,
        )
    }

    /// The token embeddings of the packed input ids, `[T, H]`.
    fn embed(&self, packed: &Packed, track: bool) -> Result<Tensor> {
        let ids = Tensor::new(packed.ids.as_slice(), &self.device)?;
        Ok(self
            .weight(&self.embed_tokens, track)?
            .index_select(&ids, 0)?)
    }

    /// Decoder layer `l` on the packed hidden states `x` (`[T, H]`), with block-diagonal causal
    /// attention over the packed sequences.
    fn layer_forward(
        &self,
        l: usize,
        x: &Tensor,
        ctx: &LayerCtx<'_>,
        packed: &Packed,
        track: bool,
    ) -> Result<Tensor> {
        let scale = 1.0 / (self.cfg.head_dim as f64).sqrt();
        let adapters = self.layer_adapters(l, track)?;
        let lora = adapters.as_ref().map(|(adapters, scale)| LayerLora {
            adapters,
            scale: *scale,
        });
        self.layer_weights(l, track)?
            .forward(x, ctx, lora.as_ref(), |q, k, v| {
                Ok(ops::packed_causal_attention(
                    q,
                    k,
                    v,
                    &packed.seq_offsets,
                    scale,
                )?)
            })
    }

    /// The final norm of the rows of `x` (`[T, H]`) that predict the scored tokens: `[N, H]`.
    fn final_hidden(&self, x: &Tensor, packed: &Packed, track: bool) -> Result<Tensor> {
        let rows = Tensor::new(packed.rows.as_slice(), &self.device)?;
        let hidden = x.index_select(&rows, 0)?;
        Ok(ops::rms_norm(
            &hidden,
            &self.weight(&self.norm, track)?,
            self.cfg.rms_norm_eps,
        )?)
    }

    /// The master weight of the lm_head (the embedding when tied).
    fn head_var(&self) -> &Var {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }

    /// The token embedding matrix `[V, H]` in the compute dtype, without a graph.
    pub(crate) fn embed_weight(&self) -> Result<Tensor> {
        self.weight(&self.embed_tokens, false)
    }

    /// The final norm weight `[H]` in the compute dtype, without a graph.
    pub(crate) fn norm_weight(&self) -> Result<Tensor> {
        self.weight(&self.norm, false)
    }

    /// The lm_head matrix `[V, H]` in the compute dtype (the embedding when tied).
    pub(crate) fn lm_head(&self, track: bool) -> Result<Tensor> {
        self.weight(self.head_var(), track)
    }

    /// The final hidden states (after the final norm) of the positions that predict the scored
    /// tokens of `packed`, `[N, H]` in the compute dtype, without an autograd graph.
    pub(crate) fn scoring_hidden(&self, packed: &Packed) -> Result<Tensor> {
        self.forward_hidden(packed, false)
    }

    /// The packed forward pass up to the final hidden states of the scored positions, `[N, H]`.
    fn forward_hidden(&self, packed: &Packed, track: bool) -> Result<Tensor> {
        let tables = self.rope_tables(packed)?;
        let ctx = LayerCtx::new(&self.cfg, &tables);
        let mut x = self.embed(packed, track)?;
        for l in 0..self.layers.len() {
            x = self.layer_forward(l, &x, &ctx, packed, track)?;
        }
        self.final_hidden(&x, packed, track)
    }

    /// The packed forward pass up to the response-token log-probs (and entropies).
    fn forward_logprobs(
        &self,
        packed: &Packed,
        temperature: f64,
        entropy: bool,
        track: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let hidden = self.forward_hidden(packed, track)?;
        Ok(ops::token_logprobs(
            &hidden,
            &self.lm_head(track)?,
            &packed.targets,
            temperature,
            entropy,
        )?)
    }

    /// The packed forward pass with a graph up to the response-token log-probs, for the loss
    /// `Σ g_t · ℓ_t` with `g_t = grad_logprobs[t]` ([`ops::token_logprobs_for_grad`]).
    fn forward_for_grad(
        &self,
        packed: &Packed,
        temperature: f64,
        grad_logprobs: &[f64],
    ) -> Result<Tensor> {
        let hidden = self.forward_hidden(packed, true)?;
        Ok(ops::token_logprobs_for_grad(
            &hidden,
            &self.lm_head(true)?,
            &packed.targets,
            temperature,
            grad_logprobs,
        )?)
    }
}

/// `W + scale·B·A` in the dtype of `w` (the master dtype) for `W [out, in]`, `A [r, in]`,
/// `B [out, r]`.
fn merged_weight(w: &Tensor, a: &Var, b: &Var, scale: f64) -> Result<Tensor> {
    let dt = w.dtype();
    let (a, b) = (
        a.as_detached_tensor().to_dtype(dt)?,
        b.as_detached_tensor().to_dtype(dt)?,
    );
    Ok((w + (b.matmul(&a)? * scale)?)?)
}

/// The error of a weight that the backward pass did not reach.
fn no_gradient(name: &str) -> Error {
    Error::Input(format!(
        "parameter {name} received no gradient (an op without backward in the graph)"
    ))
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("config", &self.cfg)
            .field("compute_dtype", &self.compute_dtype)
            .field("device", &self.device)
            .field("params", &self.params.len())
            .field("source_dir", &self.source_dir)
            .finish()
    }
}

fn to_f64_vec(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.to_dtype(DType::F64)?.to_vec1::<f64>()?)
}

#[cfg(test)]
#[path = "../tests/it/grad_store.rs"]
mod grad_store;

#[cfg(test)]
mod tests {
    //! The CUDA code path (blockwise attention and log-prob head) run on the CPU through the same
    //! model functions, against the CPU kernels (f64) and the composite reference (bf16).
    use super::*;
    use crate::{Architecture, SeqPair};

    fn config(arch: Architecture, tied: bool) -> ModelConfig {
        ModelConfig {
            vocab_size: 97,
            hidden_size: 32,
            intermediate_size: 48,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 16,
            tie_word_embeddings: tied,
            ..ModelConfig::tiny_of(arch)
        }
    }

    fn batch() -> Vec<(Vec<u32>, Vec<u32>)> {
        let ids = |seed: u32, n: u32| -> Vec<u32> {
            (0..n).map(|i| (seed * 31 + i * 17 + i * i) % 97).collect()
        };
        vec![
            (ids(1, 9), ids(2, 7)),
            (ids(3, 1), ids(4, 1)),
            (ids(5, 30), ids(6, 12)),
        ]
    }

    fn weights(n: usize) -> Vec<f64> {
        (0..n).map(|i| ((i * 7 % 11) as f64 - 5.0) / 5.0).collect()
    }

    fn flat(t: &Tensor) -> Vec<f64> {
        t.to_dtype(DType::F64)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1())
            .unwrap()
    }

    /// Log-probs, entropies and every parameter's gradient of one forward/backward pass.
    fn run(model: &mut Model, b: &[(Vec<u32>, Vec<u32>)]) -> (Vec<f64>, Vec<f64>, Vec<Vec<f64>>) {
        let pairs: Vec<SeqPair<'_>> = b.iter().map(|(p, r)| SeqPair::new(p, r)).collect();
        let lp = model.logprobs(&pairs, 0.8, true).unwrap();
        let n: usize = b.iter().map(|(_, r)| r.len()).sum();
        model.zero_grad();
        let fb = model.forward_backward(&pairs, &weights(n), 0.8).unwrap();
        let flat_lp: Vec<f64> = lp.logprobs.concat();
        assert_eq!(
            fb.concat(),
            flat_lp,
            "forward_backward returns the log-probs"
        );
        let grads = model
            .grads()
            .iter()
            .map(|g| flat(g.as_ref().expect("every parameter gets a gradient")))
            .collect();
        (flat_lp, lp.entropy.unwrap().concat(), grads)
    }

    fn max_rel_diff(a: &[f64], b: &[f64]) -> f64 {
        let scale = b.iter().fold(1e-12f64, |m, x| m.max(x.abs()));
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs() / scale)
            .fold(0.0, f64::max)
    }

    #[test]
    fn blockwise_path_matches_the_cpu_kernels_in_f64() {
        for arch in Architecture::ALL {
            for tied in [true, false] {
                for recompute in [false, true] {
                    let mut model =
                        Model::new_random(config(arch, tied), 3, DType::F64, &Device::Cpu).unwrap();
                    model.set_activation_recompute(recompute);
                    let want = run(&mut model, &batch());
                    let got = ops::force_blockwise(|| run(&mut model, &batch()));
                    let what = format!("{arch:?} tied={tied} recompute={recompute}");
                    assert!(max_rel_diff(&got.0, &want.0) < 1e-12, "{what}: log-probs");
                    assert!(max_rel_diff(&got.1, &want.1) < 1e-12, "{what}: entropies");
                    for (p, (g, w)) in model.params().iter().zip(got.2.iter().zip(&want.2)) {
                        let d = max_rel_diff(g, w);
                        assert!(d < 1e-10, "{what}: gradient of {} off by {d:e}", p.name);
                    }
                }
            }
        }
    }

    /// Under adapters the backward pass reaches every adapter and computes nothing for the frozen
    /// base weights on any code path (the CPU kernels, the blockwise CUDA path, half precision
    /// through candle's ops): the gradient store holds no matrix of a base weight's shape or its
    /// transpose, not even one computed and left unused. Without adapters it holds them all.
    /// In a half-precision model the frozen base is held in the compute dtype only (no f32
    /// masters), computes what it computed, and merging brings the masters back.
    #[test]
    fn a_bf16_models_frozen_base_is_held_in_bf16() {
        let b = batch();
        let pairs: Vec<SeqPair<'_>> = b.iter().map(|(p, r)| SeqPair::new(p, r)).collect();
        let cfg = config(crate::Architecture::Qwen3, false);
        let plain = Model::new_random(cfg.clone(), 3, DType::BF16, &Device::Cpu).unwrap();
        let mut model = Model::new_random(cfg, 3, DType::BF16, &Device::Cpu).unwrap();
        let before = model.held_weights();
        model
            .add_lora(crate::LoraConfig::new(2, 4.0, &["all-linear"]).unwrap(), 1)
            .unwrap();
        assert!(model
            .frozen_params()
            .iter()
            .all(|p| p.var.dtype() == DType::BF16));
        assert!(model.params().iter().all(|p| p.var.dtype() == DType::F32));
        let held = model.held_weights();
        let adapters: u64 = model
            .params()
            .iter()
            .map(|p| 4 * p.var.elem_count() as u64)
            .sum();
        assert_eq!(held.masters, adapters);
        assert_eq!(held.replicas, before.masters / 2);
        // B = 0: the same log-probs, bit for bit (the passes cast the masters to bf16 anyway).
        let lp = |m: &Model| m.logprobs(&pairs, 1.0, false).unwrap().logprobs;
        assert_eq!(lp(&model), lp(&plain));
        model.merge_lora().unwrap();
        assert!(model.params().iter().all(|p| p.var.dtype() == DType::F32));
        assert_eq!(model.held_weights(), before);
        assert_eq!(lp(&model), lp(&plain));
    }

    #[test]
    fn frozen_base_weights_get_no_gradient_at_all() {
        let b = batch();
        let pairs: Vec<SeqPair<'_>> = b.iter().map(|(p, r)| SeqPair::new(p, r)).collect();
        let targets: [Option<&[&str]>; 3] =
            [None, Some(&["q_proj", "o_proj"]), Some(&["all-linear"])];
        for arch in crate::Architecture::ALL {
            for (dtype, blockwise) in [
                (DType::F64, false),
                (DType::F64, true),
                (DType::BF16, false),
                (DType::BF16, true),
            ] {
                for targets in targets {
                    let what = format!("{arch:?} {dtype:?} blockwise={blockwise} {targets:?}");
                    let mut model =
                        Model::new_random(config(arch, false), 3, dtype, &Device::Cpu).unwrap();
                    if let Some(t) = targets {
                        let lora = crate::LoraConfig::new(2, 4.0, t).unwrap();
                        model.add_lora(lora, 1).unwrap();
                    }
                    let packed = model.pack(&pairs).unwrap();
                    let g = weights(packed.targets.len());
                    let pass = || -> Result<candle_core::backprop::GradStore> {
                        let lp = model.forward_for_grad(&packed, 1.0, &g)?;
                        let gt = Tensor::new(g.as_slice(), &Device::Cpu)?.to_dtype(lp.dtype())?;
                        Ok((&lp * &gt)?.sum_all()?.backward()?)
                    };
                    let store = if blockwise {
                        ops::force_blockwise(pass)
                    } else {
                        pass()
                    }
                    .unwrap();
                    let shapes = super::grad_store::matrix_shapes(&store);
                    let has = |p: &Param| {
                        let &[o, i] = p.var.dims() else {
                            return None;
                        };
                        Some(shapes.contains(&[o, i]) || shapes.contains(&[i, o]))
                    };
                    if targets.is_none() {
                        assert!(model.frozen_params().is_empty());
                        for p in model.params() {
                            assert_ne!(has(p), Some(false), "{what}: {} has no gradient", p.name);
                        }
                        continue;
                    }
                    assert!(!model.frozen_params().is_empty());
                    for p in model.frozen_params() {
                        assert_ne!(
                            has(p),
                            Some(true),
                            "{what}: frozen {} got a gradient",
                            p.name
                        );
                    }
                    for p in model.params() {
                        assert!(store.get(p.var.as_tensor()).is_some(), "{what}: {}", p.name);
                    }
                }
            }
        }
    }

    #[test]
    fn blockwise_path_in_bf16_keeps_f32_masters_and_matches_the_composite_path() {
        let b = batch();
        let mut model = Model::new_random(
            config(Architecture::Qwen3, true),
            5,
            DType::BF16,
            &Device::Cpu,
        )
        .unwrap();
        let composite = run(&mut model, &b);
        let blockwise = ops::force_blockwise(|| run(&mut model, &b));
        model.set_activation_recompute(true);
        let recomputed = ops::force_blockwise(|| run(&mut model, &b));
        let diff = |a: &[f64], b: &[f64]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max)
        };
        assert!(diff(&blockwise.0, &composite.0) < 2e-2, "log-probs");
        assert!(diff(&blockwise.1, &composite.1) < 2e-2, "entropies");
        for (((p, g), c), r) in model
            .params()
            .iter()
            .zip(&blockwise.2)
            .zip(&composite.2)
            .zip(&recomputed.2)
        {
            assert_eq!(p.var.dtype(), DType::F32, "{}", p.name);
            let d = max_rel_diff(g, c);
            assert!(
                d < 5e-2,
                "{}: blockwise vs composite gradient {d:e}",
                p.name
            );
            let d = max_rel_diff(r, g);
            assert!(
                d < 1e-6,
                "{}: recompute changes the gradient by {d:e}",
                p.name
            );
        }
        for g in model.grads().iter().flatten() {
            assert_eq!(g.dtype(), DType::F32);
        }
    }
}
