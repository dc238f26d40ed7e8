//! The Qwen3 causal language model: packed forward pass, per-token log-probs and gradients.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor, Var};
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

use crate::ops;
use crate::pack::{Packed, SeqPair};
use crate::{Error, Qwen3Config, Result};

/// Parameters of one decoder layer, in Hugging Face order, with their name suffixes.
const LAYER_PARAMS: [&str; 11] = [
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
];
const IN_NORM: usize = 0;
const Q_PROJ: usize = 1;
const K_PROJ: usize = 2;
const V_PROJ: usize = 3;
const O_PROJ: usize = 4;
const Q_NORM: usize = 5;
const K_NORM: usize = 6;
const POST_NORM: usize = 7;
const GATE: usize = 8;
const UP: usize = 9;
const DOWN: usize = 10;

/// Standard deviation of the random initialisation of matrices (Hugging Face `initializer_range`).
const INIT_STD: f64 = 0.02;

/// One named trainable parameter; the name is the Hugging Face tensor name.
#[derive(Debug, Clone)]
pub struct Param {
    /// Hugging Face tensor name, e.g. `model.layers.0.mlp.up_proj.weight`.
    pub name: String,
    /// The master weight (f32, or f64 for an f64 model).
    pub var: Var,
}

/// Per-token log-probs (and entropies) of the response tokens, one vector per input pair.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogProbs {
    /// `log softmax(z/τ)` of each response token, in order.
    pub logprobs: Vec<Vec<f64>>,
    /// Entropy of `softmax(z/τ)` at each response token, when asked for.
    pub entropy: Option<Vec<Vec<f64>>>,
}

/// A Qwen3 causal LM with master weights, gradient buffers and a compute dtype.
pub struct Qwen3 {
    cfg: Qwen3Config,
    params: Vec<Param>,
    grads: Vec<Option<Tensor>>,
    compute_dtype: DType,
    device: Device,
    source_dir: Option<PathBuf>,
    recompute: bool,
}

/// The master dtype used for a compute dtype: f64 for f64, f32 otherwise.
pub(crate) fn master_dtype(compute: DType) -> DType {
    if compute == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// The expected `(name, shape)` of every parameter of `cfg`, in Hugging Face order.
pub(crate) fn param_shapes(cfg: &Qwen3Config) -> Vec<(String, Vec<usize>)> {
    let (h, i, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let q = cfg.num_attention_heads * d;
    let kv = cfg.num_key_value_heads * d;
    let layer_shapes = [
        vec![h],
        vec![q, h],
        vec![kv, h],
        vec![kv, h],
        vec![h, q],
        vec![d],
        vec![d],
        vec![h],
        vec![i, h],
        vec![i, h],
        vec![h, i],
    ];
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![cfg.vocab_size, h],
    )];
    for l in 0..cfg.num_hidden_layers {
        for (suffix, shape) in LAYER_PARAMS.iter().zip(&layer_shapes) {
            out.push((format!("model.layers.{l}.{suffix}"), shape.clone()));
        }
    }
    out.push(("model.norm.weight".to_string(), vec![h]));
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![cfg.vocab_size, h]));
    }
    out
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

impl Qwen3 {
    /// Builds a model from master-weight tensors given in [`param_shapes`] order.
    pub(crate) fn from_tensors(
        cfg: Qwen3Config,
        tensors: Vec<Tensor>,
        compute_dtype: DType,
        source_dir: Option<PathBuf>,
    ) -> Result<Self> {
        check_compute_dtype(compute_dtype)?;
        let shapes = param_shapes(&cfg);
        let device = tensors.first().map_or(Device::Cpu, |t| t.device().clone());
        let mut params = Vec::with_capacity(shapes.len());
        for ((name, shape), t) in shapes.into_iter().zip(tensors) {
            debug_assert_eq!(t.dims(), &shape[..], "{name}");
            params.push(Param {
                name,
                var: Var::from_tensor(&t.to_dtype(master_dtype(compute_dtype))?)?,
            });
        }
        let grads = vec![None; params.len()];
        Ok(Self {
            cfg,
            params,
            grads,
            compute_dtype,
            device,
            source_dir,
            recompute: false,
        })
    }

    /// A randomly initialised model, deterministic for a given `seed`: matrices drawn from
    /// N(0, 0.02²) as in Hugging Face, norm weights set to 1. `dtype` is the compute dtype; master
    /// weights are f32 (f64 for an f64 model).
    pub fn new_random(cfg: Qwen3Config, seed: u64, dtype: DType, device: &Device) -> Result<Self> {
        cfg.validate()?;
        check_compute_dtype(dtype)?;
        let master = master_dtype(dtype);
        let normal = Normal::new(0.0f64, INIT_STD).expect("valid normal distribution");
        let mut tensors = Vec::new();
        for (i, (_, shape)) in param_shapes(&cfg).into_iter().enumerate() {
            let t = if shape.len() == 1 {
                Tensor::ones(shape, master, device)?
            } else {
                let n: usize = shape.iter().product();
                let mut rng = rand::rngs::StdRng::seed_from_u64(
                    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i as u64,
                );
                let values: Vec<f64> = (0..n).map(|_| normal.sample(&mut rng)).collect();
                Tensor::from_vec(values, shape, device)?.to_dtype(master)?
            };
            tensors.push(t);
        }
        Self::from_tensors(cfg, tensors, dtype, None)
    }

    /// The model configuration.
    pub fn config(&self) -> &Qwen3Config {
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

    /// Every trainable parameter, in Hugging Face order.
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// The accumulated gradient of each parameter (same order as [`Qwen3::params`]); `None` before
    /// any [`Qwen3::forward_backward`] since the last [`Qwen3::zero_grad`].
    pub fn grads(&self) -> &[Option<Tensor>] {
        &self.grads
    }

    /// Mutable access to the gradient buffers (for clipping, scaling or all-reduce).
    pub fn grads_mut(&mut self) -> &mut [Option<Tensor>] {
        &mut self.grads
    }

    /// Turns per-layer activation recompute (gradient checkpointing) on or off; off by default.
    /// When on, [`Qwen3::forward_backward`] runs the decoder layers without an autograd graph and
    /// keeps only each layer's input; the backward pass then goes from the top layer down,
    /// rebuilding one layer's graph at a time from its saved input. Peak memory drops from all
    /// layers' activations to one layer's (plus the `[T, H]` layer inputs) at the cost of a second
    /// forward pass of the layers; the gradients are the same.
    pub fn set_activation_recompute(&mut self, on: bool) {
        self.recompute = on;
    }

    /// Whether per-layer activation recompute is on (see [`Qwen3::set_activation_recompute`]).
    pub fn activation_recompute(&self) -> bool {
        self.recompute
    }

    /// Clears the accumulated gradients.
    pub fn zero_grad(&mut self) {
        self.grads.iter_mut().for_each(|g| *g = None);
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
    /// up across calls (micro-batches) until [`Qwen3::zero_grad`]. Returns the log-probs. With
    /// [`Qwen3::set_activation_recompute`] on, the layers' activations are recomputed during the
    /// backward pass instead of being kept.
    pub fn forward_backward(
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
        let mut fresh = vec![None; self.params.len()];
        let lp = if self.recompute {
            self.backward_recompute(&packed, grad_logprobs, temperature, &mut fresh)?
        } else {
            let (lp, _) = self.forward_logprobs(&packed, temperature, false, true)?;
            let g = Tensor::new(grad_logprobs, &self.device)?.to_dtype(lp.dtype())?;
            let mut store = (&lp * &g)?.sum_all()?.backward()?;
            self.collect_grads(&mut store, 0..self.params.len(), &mut fresh)?;
            lp
        };
        for ((p, acc), grad) in self.params.iter().zip(self.grads.iter_mut()).zip(fresh) {
            let grad = grad.ok_or_else(|| {
                Error::Input(format!(
                    "parameter {} received no gradient (an op without backward in the graph)",
                    p.name
                ))
            })?;
            *acc = Some(match acc.take() {
                Some(a) => (a + grad)?,
                None => grad,
            });
        }
        Ok(packed.split(&to_f64_vec(&lp)?))
    }

    /// Moves the gradients of parameters `indices` from `store` into `out`, adding to what is
    /// there; errors for a parameter without a gradient.
    fn collect_grads(
        &self,
        store: &mut candle_core::backprop::GradStore,
        indices: impl IntoIterator<Item = usize>,
        out: &mut [Option<Tensor>],
    ) -> Result<()> {
        for i in indices {
            let p = &self.params[i];
            let grad = store.remove(p.var.as_tensor()).ok_or_else(|| {
                Error::Input(format!(
                    "parameter {} received no gradient (an op without backward in the graph)",
                    p.name
                ))
            })?;
            out[i] = Some(match out[i].take() {
                Some(a) => (a + grad)?,
                None => grad,
            });
        }
        Ok(())
    }

    /// [`Qwen3::forward_backward`] with per-layer activation recompute: the gradients of
    /// `Σ g_t · ℓ_t` go into `out` (indexed like the parameters); returns the log-probs `ℓ`.
    fn backward_recompute(
        &self,
        packed: &Packed,
        grad_logprobs: &[f64],
        temperature: f64,
        out: &mut [Option<Tensor>],
    ) -> Result<Tensor> {
        let n_layers = self.cfg.num_hidden_layers;
        let (cos, sin) = self.rope_tables(&packed.positions)?;
        let ctx = LayerCtx {
            cos: &cos,
            sin: &sin,
            seq_offsets: &packed.seq_offsets,
        };
        // Forward without a graph, keeping each layer's input.
        let mut inputs = Vec::with_capacity(n_layers);
        let mut x = self.embed(packed, false)?;
        for l in 0..n_layers {
            let next = self.layer(l, &x, &ctx, false)?;
            inputs.push(std::mem::replace(&mut x, next));
        }
        // Head: final norm and lm_head on the top hidden states as a leaf.
        let top = Var::from_tensor(&x)?;
        drop(x);
        let hidden = self.final_hidden(top.as_tensor(), packed, true)?;
        let (lp, _) = ops::token_logprobs(
            &hidden,
            &self.lm_head(true)?,
            &packed.targets,
            temperature,
            false,
        )?;
        let g = Tensor::new(grad_logprobs, &self.device)?.to_dtype(lp.dtype())?;
        let mut store = (&lp * &g)?.sum_all()?.backward()?;
        let norm_idx = 1 + n_layers * LAYER_PARAMS.len();
        let head_idx = if self.cfg.tie_word_embeddings {
            0
        } else {
            self.params.len() - 1
        };
        self.collect_grads(&mut store, [norm_idx, head_idx], out)?;
        let missing = |what: &str| Error::Input(format!("{what} received no gradient"));
        let mut grad_x = store
            .remove(top.as_tensor())
            .ok_or_else(|| missing("the final hidden states"))?;
        drop(store);
        // Layers from the top: rebuild one layer's graph from its input, backprop grad_x.
        for (l, input) in inputs.into_iter().enumerate().rev() {
            let input = Var::from_tensor(&input)?;
            let y = self.layer(l, input.as_tensor(), &ctx, true)?;
            let mut store = (y * &grad_x)?.sum_all()?.backward()?;
            let first = 1 + l * LAYER_PARAMS.len();
            self.collect_grads(&mut store, first..first + LAYER_PARAMS.len(), out)?;
            grad_x = store
                .remove(input.as_tensor())
                .ok_or_else(|| missing(&format!("the input of layer {l}")))?;
        }
        // Embedding lookup.
        let mut store = (self.embed(packed, true)? * &grad_x)?
            .sum_all()?
            .backward()?;
        self.collect_grads(&mut store, [0], out)?;
        Ok(lp)
    }

    fn pack(&self, pairs: &[SeqPair<'_>]) -> Result<Packed> {
        Packed::new(pairs, self.cfg.vocab_size, self.cfg.max_position_embeddings)
    }

    /// The weight `i` in the compute dtype, tracked by autograd when `track`.
    fn weight(&self, i: usize, track: bool) -> Result<Tensor> {
        let t = if track {
            self.params[i].var.as_tensor().clone()
        } else {
            self.params[i].var.as_detached_tensor()
        };
        Ok(t.to_dtype(self.compute_dtype)?)
    }

    /// Rotary `cos`/`sin` tables `[T, D/2]` for the packed positions, computed in f64.
    fn rope_tables(&self, positions: &[u32]) -> Result<(Tensor, Tensor)> {
        let d = self.cfg.head_dim;
        let inv_freq: Vec<f64> = (0..d / 2)
            .map(|i| 1.0 / self.cfg.rope_theta.powf((2 * i) as f64 / d as f64))
            .collect();
        let mut cos = Vec::with_capacity(positions.len() * d / 2);
        let mut sin = Vec::with_capacity(positions.len() * d / 2);
        for &p in positions {
            for &f in &inv_freq {
                let (s, c) = (p as f64 * f).sin_cos();
                cos.push(c);
                sin.push(s);
            }
        }
        let shape = (positions.len(), d / 2);
        let cos = Tensor::from_vec(cos, shape, &self.device)?.to_dtype(self.compute_dtype)?;
        let sin = Tensor::from_vec(sin, shape, &self.device)?.to_dtype(self.compute_dtype)?;
        Ok((cos, sin))
    }

    /// The token embeddings of the packed input ids, `[T, H]`.
    fn embed(&self, packed: &Packed, track: bool) -> Result<Tensor> {
        let ids = Tensor::new(packed.ids.as_slice(), &self.device)?;
        Ok(self.weight(0, track)?.index_select(&ids, 0)?)
    }

    /// Decoder layer `l` applied to the packed hidden states `x` (`[T, H]`).
    fn layer(&self, l: usize, x: &Tensor, ctx: &LayerCtx<'_>, track: bool) -> Result<Tensor> {
        let cfg = &self.cfg;
        let t = x.dim(0)?;
        let (hq, hkv, d) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        let eps = cfg.rms_norm_eps;
        let linear = |x: &Tensor, w: &Tensor| x.matmul(&w.t()?);
        let w = |j: usize| self.weight(1 + l * LAYER_PARAMS.len() + j, track);
        let h = ops::rms_norm(x, &w(IN_NORM)?, eps)?;
        let q = linear(&h, &w(Q_PROJ)?)?.reshape((t, hq, d))?;
        let k = linear(&h, &w(K_PROJ)?)?.reshape((t, hkv, d))?;
        let v = linear(&h, &w(V_PROJ)?)?.reshape((t, hkv, d))?;
        let q = ops::rope(&ops::rms_norm(&q, &w(Q_NORM)?, eps)?, ctx.cos, ctx.sin)?;
        let k = ops::rope(&ops::rms_norm(&k, &w(K_NORM)?, eps)?, ctx.cos, ctx.sin)?;
        let a = ops::packed_causal_attention(&q, &k, &v, ctx.seq_offsets, 1.0 / (d as f64).sqrt())?;
        let x = (x + linear(&a.reshape((t, hq * d))?, &w(O_PROJ)?)?)?;
        let h = ops::rms_norm(&x, &w(POST_NORM)?, eps)?;
        let m = ops::swiglu(&linear(&h, &w(GATE)?)?, &linear(&h, &w(UP)?)?)?;
        Ok((&x + linear(&m, &w(DOWN)?)?)?)
    }

    /// The final norm of the rows of `x` (`[T, H]`) that predict the scored tokens: `[N, H]`.
    fn final_hidden(&self, x: &Tensor, packed: &Packed, track: bool) -> Result<Tensor> {
        let norm_idx = 1 + self.cfg.num_hidden_layers * LAYER_PARAMS.len();
        let rows = Tensor::new(packed.rows.as_slice(), &self.device)?;
        let hidden = x.index_select(&rows, 0)?;
        Ok(ops::rms_norm(
            &hidden,
            &self.weight(norm_idx, track)?,
            self.cfg.rms_norm_eps,
        )?)
    }

    /// The lm_head matrix `[V, H]` in the compute dtype (the embedding when tied).
    pub(crate) fn lm_head(&self, track: bool) -> Result<Tensor> {
        let idx = if self.cfg.tie_word_embeddings {
            0
        } else {
            self.params.len() - 1
        };
        self.weight(idx, track)
    }

    /// The final hidden states (after the final norm) of the positions that predict the scored
    /// tokens of `packed`, `[N, H]` in the compute dtype, without an autograd graph.
    pub(crate) fn scoring_hidden(&self, packed: &Packed) -> Result<Tensor> {
        let (cos, sin) = self.rope_tables(&packed.positions)?;
        let ctx = LayerCtx {
            cos: &cos,
            sin: &sin,
            seq_offsets: &packed.seq_offsets,
        };
        let mut x = self.embed(packed, false)?;
        for l in 0..self.cfg.num_hidden_layers {
            x = self.layer(l, &x, &ctx, false)?;
        }
        self.final_hidden(&x, packed, false)
    }

    /// The packed forward pass up to the response-token log-probs (and entropies).
    fn forward_logprobs(
        &self,
        packed: &Packed,
        temperature: f64,
        entropy: bool,
        track: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (cos, sin) = self.rope_tables(&packed.positions)?;
        let ctx = LayerCtx {
            cos: &cos,
            sin: &sin,
            seq_offsets: &packed.seq_offsets,
        };
        let mut x = self.embed(packed, track)?;
        for l in 0..self.cfg.num_hidden_layers {
            x = self.layer(l, &x, &ctx, track)?;
        }
        let hidden = self.final_hidden(&x, packed, track)?;
        Ok(ops::token_logprobs(
            &hidden,
            &self.lm_head(track)?,
            &packed.targets,
            temperature,
            entropy,
        )?)
    }
}

/// Per-batch inputs every decoder layer shares: rotary tables and sequence boundaries.
struct LayerCtx<'a> {
    cos: &'a Tensor,
    sin: &'a Tensor,
    seq_offsets: &'a [usize],
}

impl std::fmt::Debug for Qwen3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qwen3")
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
