//! Inference-only decoding with a per-sequence KV cache, for sampling.
//!
//! [`Decoder`] snapshots a [`Model`]'s weights in the compute dtype, with any LoRA adapters merged
//! into the weights they target (`W + (alpha/r)·B·A`), so both decoders generate with the
//! adapters at the cost of none. Sequences are ragged: every
//! call takes any number of new tokens per sequence (a whole prompt to prefill, or one sampled
//! token), packs them into one set of matrix products (one `[T, H] · Wᵀ` per projection and layer
//! for all sequences), and attends per sequence against that sequence's own cache. It returns the
//! logits of the last new token of each sequence.
//!
//! Other devices and dtypes run the model's own layer definition (`DecoderLayer::forward`) with
//! attention over the caches. On the CPU in f32 (the usual sampling setup) the whole step runs on
//! host buffers made from the same weights and rotary tables: fused projections (q/k/v in one
//! product, gate/up in one), the kernels of [`crate::ops`]' decode module, and one attention kernel
//! per layer for all sequences over caches kept as growable per-layer buffers. Tests hold both to
//! the training forward pass, for every architecture.

use candle_core::{DType, Device, Tensor};

use crate::layer::{DecoderLayer, LayerCtx, Rotary};
use crate::ops::decode::{self, AttnDims, CachedSeq, Panels};
use crate::{Error, Model, ModelConfig, Result};

/// Weights of one decoder layer as f32 host buffers; matrices packed for the decoder's products.
struct HostLayer {
    in_norm: Vec<f32>,
    /// q, k and v projections stacked: `[(Hq + 2·Hkv)·D, H]`.
    qkv: Panels,
    /// The q, k and v biases side by side, when the layer has them.
    qkv_bias: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    o_proj: Panels,
    o_bias: Option<Vec<f32>>,
    post_norm: Vec<f32>,
    /// Gate and up projections stacked: `[2·I, H]`.
    gate_up: Panels,
    down: Panels,
}

/// The model's weights as f32 host buffers (CPU, f32 compute).
struct HostWeights {
    /// `[V, H]`, or `None` when tied to the lm_head (rows are then read from its panels).
    embed: Option<Vec<f32>>,
    layers: Vec<HostLayer>,
    norm: Vec<f32>,
    /// `[V, H]`.
    lm_head: Panels,
}

/// The model's weights as candle tensors in the compute dtype.
struct TensorWeights {
    embed: Tensor,
    layers: Vec<DecoderLayer<Tensor>>,
    norm: Tensor,
    lm_head: Tensor,
}

/// Where the forward pass runs.
enum Weights {
    Host(HostWeights),
    Tensors(TensorWeights),
}

/// A snapshot of a model's weights prepared for incremental decoding.
pub struct Decoder {
    cfg: ModelConfig,
    dtype: DType,
    device: Device,
    weights: Weights,
    rotary: Rotary,
}

/// Per-layer cache buffers.
enum Layers {
    /// Per layer, keys and values `[len, Hkv·D]` (position-major); pushes grow the buffers
    /// geometrically.
    Host(Vec<(Vec<f32>, Vec<f32>)>),
    /// Per layer `[Hkv, capacity, D]` key and value tensors, of which the first `len` positions
    /// are filled; appends write in place and grow the buffers geometrically.
    Tensors(Vec<Option<(Tensor, Tensor)>>),
}

impl Default for Layers {
    fn default() -> Self {
        Self::Tensors(Vec::new())
    }
}

/// The key/value cache of one sequence, made by [`Decoder::new_cache`].
#[derive(Default)]
pub struct KvCache {
    layers: Layers,
    len: usize,
}

/// Smallest buffer capacity, in positions.
const MIN_CAPACITY: usize = 64;

impl KvCache {
    /// Number of cached positions (tokens fed so far).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token has been fed yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// An independent copy (for sequences that continue the same prefix).
    pub fn fork(&self) -> Result<Self> {
        let layers = match &self.layers {
            Layers::Host(layers) => {
                let copy = |b: &Vec<f32>| {
                    let mut c = Vec::with_capacity(b.capacity());
                    c.extend_from_slice(b);
                    c
                };
                Layers::Host(layers.iter().map(|(k, v)| (copy(k), copy(v))).collect())
            }
            Layers::Tensors(layers) => Layers::Tensors(
                layers
                    .iter()
                    .map(|l| match l {
                        Some((k, v)) => Ok(Some((k.copy()?, v.copy()?))),
                        None => Ok(None),
                    })
                    .collect::<Result<Vec<_>>>()?,
            ),
        };
        Ok(Self {
            layers,
            len: self.len,
        })
    }

    /// Number of layers the cache was made for.
    fn num_layers(&self) -> usize {
        match &self.layers {
            Layers::Host(l) => l.len(),
            Layers::Tensors(l) => l.len(),
        }
    }

    /// The host buffers of layer `l` (the cache must be a host cache).
    fn host(&self, l: usize) -> Result<&(Vec<f32>, Vec<f32>)> {
        match &self.layers {
            Layers::Host(layers) => Ok(&layers[l]),
            Layers::Tensors(_) => Err(Error::Input(
                "the cache was not made by this decoder".into(),
            )),
        }
    }

    /// Appends `[Hkv, n, D]` keys and values to layer `l` (positions `len..len + n`) of a tensor
    /// cache and returns views of the `len + n` cached positions.
    fn append(&mut self, l: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let Layers::Tensors(layers) = &mut self.layers else {
            return Err(Error::Input(
                "the cache was not made by this decoder".into(),
            ));
        };
        let n = k.dim(1)?;
        let total = self.len + n;
        let (mut kb, mut vb) = match layers[l].take() {
            Some(bufs) => bufs,
            None => {
                let (h, _, d) = k.dims3()?;
                let cap = total.max(MIN_CAPACITY);
                (
                    Tensor::zeros((h, cap, d), k.dtype(), k.device())?,
                    Tensor::zeros((h, cap, d), v.dtype(), v.device())?,
                )
            }
        };
        let cap = kb.dim(1)?;
        if total > cap {
            let (h, _, d) = kb.dims3()?;
            let new_cap = total.max(2 * cap);
            let grow = |old: &Tensor| -> Result<Tensor> {
                let t = Tensor::zeros((h, new_cap, d), old.dtype(), old.device())?;
                t.slice_set(&old.narrow(1, 0, self.len)?.contiguous()?, 1, 0)?;
                Ok(t)
            };
            kb = grow(&kb)?;
            vb = grow(&vb)?;
        }
        kb.slice_set(k, 1, self.len)?;
        vb.slice_set(v, 1, self.len)?;
        let views = (kb.narrow(1, 0, total)?, vb.narrow(1, 0, total)?);
        layers[l] = Some((kb, vb));
        Ok(views)
    }
}

/// The new tokens of one call, packed: ids, positions and sequence boundaries.
struct Packed {
    ids: Vec<u32>,
    positions: Vec<usize>,
    offsets: Vec<usize>,
}

/// Counts the new tokens of a forward call (sequence boundaries `offsets`) into their caches.
fn commit(caches: &mut [&mut KvCache], offsets: &[usize]) {
    for (cache, se) in caches.iter_mut().zip(offsets.windows(2)) {
        cache.len += se[1] - se[0];
    }
}

/// A tensor's elements as an f32 vector.
fn host_vec(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?)
}

impl Decoder {
    /// Snapshots the current weights of `model` (later training steps do not affect it).
    pub fn new(model: &Model) -> Result<Self> {
        Self::build(
            model,
            model.device().is_cpu() && model.compute_dtype() == DType::F32,
        )
    }

    /// [`Decoder::new`] on host buffers (`host`, CPU f32 only) or with candle ops.
    fn build(model: &Model, host: bool) -> Result<Self> {
        let cfg = model.config().clone();
        let dtype = model.compute_dtype();
        // A copy, so that optimizer steps (which write the master weights in place) leave it be.
        let snapshot = |t: Tensor| -> Result<Tensor> { Ok(t.copy()?) };
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| model.merged_layer_weights(l)?.map(|t| snapshot(t.clone())))
            .collect::<Result<Vec<_>>>()?;
        let embed = snapshot(model.embed_weight()?)?;
        let lm_head = if cfg.tie_word_embeddings {
            embed.clone()
        } else {
            snapshot(model.lm_head(false)?)?
        };
        let tensors = TensorWeights {
            embed,
            layers,
            norm: snapshot(model.norm_weight()?)?,
            lm_head,
        };
        let weights = if host {
            Weights::Host(Self::host_weights(&cfg, &tensors)?)
        } else {
            Weights::Tensors(tensors)
        };
        Ok(Self {
            device: model.device().clone(),
            rotary: model.rotary().clone(),
            cfg,
            dtype,
            weights,
        })
    }

    /// Copies the weights into host buffers, packed, with q/k/v and gate/up stacked.
    fn host_weights(cfg: &ModelConfig, w: &TensorWeights) -> Result<HostWeights> {
        let h = cfg.hidden_size;
        let stack = |ts: &[&Tensor]| -> Result<Panels> {
            let mut out = Vec::new();
            for t in ts {
                out.extend(host_vec(t)?);
            }
            Ok(Panels::pack(&out, h)?)
        };
        let opt = |t: Option<&Tensor>| t.map(host_vec).transpose();
        let layers = w
            .layers
            .iter()
            .map(|l| {
                let a = &l.self_attn;
                let qkv_bias = match (&a.q_proj.bias, &a.k_proj.bias, &a.v_proj.bias) {
                    (Some(q), Some(k), Some(v)) => {
                        Some([host_vec(q)?, host_vec(k)?, host_vec(v)?].concat())
                    }
                    (None, None, None) => None,
                    _ => {
                        return Err(Error::Config(
                            "the host decoder needs biases on all or none of q/k/v".into(),
                        ))
                    }
                };
                Ok(HostLayer {
                    in_norm: host_vec(&l.input_layernorm)?,
                    qkv: stack(&[&a.q_proj.weight, &a.k_proj.weight, &a.v_proj.weight])?,
                    qkv_bias,
                    q_norm: opt(a.q_norm.as_ref())?,
                    k_norm: opt(a.k_norm.as_ref())?,
                    // [H, Hq·D]: its input width is not H when Hq·D differs (Qwen3-4B).
                    o_proj: Panels::pack(
                        &host_vec(&a.o_proj.weight)?,
                        cfg.num_attention_heads * cfg.head_dim,
                    )?,
                    o_bias: opt(a.o_proj.bias.as_ref())?,
                    post_norm: host_vec(&l.post_attention_layernorm)?,
                    gate_up: stack(&[&l.mlp.gate_proj, &l.mlp.up_proj])?,
                    down: Panels::pack(&host_vec(&l.mlp.down_proj)?, cfg.intermediate_size)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(HostWeights {
            embed: if cfg.tie_word_embeddings {
                None
            } else {
                Some(host_vec(&w.embed)?)
            },
            layers,
            norm: host_vec(&w.norm)?,
            lm_head: stack(&[&w.lm_head])?,
        })
    }

    /// The model configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// An empty cache for a new sequence.
    pub fn new_cache(&self) -> KvCache {
        let layers = match self.weights {
            Weights::Host(_) => {
                let cap = MIN_CAPACITY * self.cfg.num_key_value_heads * self.cfg.head_dim;
                Layers::Host(
                    (0..self.cfg.num_hidden_layers)
                        .map(|_| (Vec::with_capacity(cap), Vec::with_capacity(cap)))
                        .collect(),
                )
            }
            Weights::Tensors(_) => Layers::Tensors(vec![None; self.cfg.num_hidden_layers]),
        };
        KvCache { layers, len: 0 }
    }

    /// Checks the inputs of a forward call and packs the new tokens.
    fn pack(&self, caches: &[&mut KvCache], tokens: &[&[u32]]) -> Result<Packed> {
        let cfg = &self.cfg;
        if caches.len() != tokens.len() {
            return Err(Error::Input(format!(
                "{} caches for {} token lists",
                caches.len(),
                tokens.len()
            )));
        }
        let host = matches!(self.weights, Weights::Host(_));
        let mut ids = Vec::new();
        let mut positions = Vec::new();
        let mut offsets = vec![0usize];
        for (i, (cache, toks)) in caches.iter().zip(tokens).enumerate() {
            if toks.is_empty() {
                return Err(Error::Input(format!("sequence {i}: no token to feed")));
            }
            if cache.num_layers() != cfg.num_hidden_layers
                || host != matches!(cache.layers, Layers::Host(_))
            {
                return Err(Error::Input(format!(
                    "sequence {i}: the cache was not made by this decoder"
                )));
            }
            if cache.len + toks.len() > cfg.max_position_embeddings {
                return Err(Error::Input(format!(
                    "sequence {i}: {} positions exceed max_position_embeddings {}",
                    cache.len + toks.len(),
                    cfg.max_position_embeddings
                )));
            }
            if let Some(&bad) = toks.iter().find(|&&t| t as usize >= cfg.vocab_size) {
                return Err(Error::Input(format!(
                    "sequence {i}: token {bad} is outside the vocabulary of {}",
                    cfg.vocab_size
                )));
            }
            ids.extend_from_slice(toks);
            positions.extend(cache.len..cache.len + toks.len());
            offsets.push(ids.len());
        }
        Ok(Packed {
            ids,
            positions,
            offsets,
        })
    }

    /// Feeds `tokens[i]` (at least one token) to sequence `caches[i]` for every `i`, appends their
    /// keys and values to the caches, and returns the f32 logits `[caches.len(), vocab]` of the last
    /// fed token of each sequence.
    pub fn forward(&self, caches: &mut [&mut KvCache], tokens: &[&[u32]]) -> Result<Tensor> {
        crate::on_pool(|| self.forward_here(caches, tokens))
    }

    /// [`Decoder::forward`] on the calling thread.
    fn forward_here(&self, caches: &mut [&mut KvCache], tokens: &[&[u32]]) -> Result<Tensor> {
        let packed = self.pack(caches, tokens)?;
        match &self.weights {
            Weights::Host(w) => {
                let logits = self.forward_host(w, caches, &packed)?;
                let shape = (caches.len(), self.cfg.vocab_size);
                Ok(Tensor::from_vec(logits, shape, &self.device)?)
            }
            Weights::Tensors(w) => self.forward_tensors(w, caches, &packed),
        }
    }

    /// [`Decoder::forward`] with the logits as one row-major vector (`caches.len() × vocab`).
    pub fn forward_logits(
        &self,
        caches: &mut [&mut KvCache],
        tokens: &[&[u32]],
    ) -> Result<Vec<f32>> {
        crate::on_pool(|| {
            let packed = self.pack(caches, tokens)?;
            match &self.weights {
                Weights::Host(w) => self.forward_host(w, caches, &packed),
                Weights::Tensors(w) => Ok(self
                    .forward_tensors(w, caches, &packed)?
                    .flatten_all()?
                    .to_vec1()?),
            }
        })
    }

    /// The forward pass on host buffers (CPU, f32).
    fn forward_host(
        &self,
        w: &HostWeights,
        caches: &mut [&mut KvCache],
        packed: &Packed,
    ) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let Packed {
            ids,
            positions,
            offsets,
        } = packed;
        let (t, b, vocab) = (ids.len(), caches.len(), cfg.vocab_size);
        if t == 0 {
            return Ok(Vec::new());
        }
        let (hs, inter) = (cfg.hidden_size, cfg.intermediate_size);
        let (hq, hkv, d) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        let dims = AttnDims {
            hq,
            hkv,
            d,
            scale: (1.0 / (d as f64).sqrt()) as f32,
        };
        let width = (hq + 2 * hkv) * d;
        let (k_at, v_at) = (hq * d, (hq + hkv) * d);
        let eps = cfg.rms_norm_eps as f32;
        let mut x = vec![0f32; t * hs];
        for (row, &id) in x.chunks_exact_mut(hs).zip(ids) {
            let id = id as usize;
            match &w.embed {
                Some(embed) => row.copy_from_slice(&embed[id * hs..(id + 1) * hs]),
                None => w.lm_head.row_into(id, row),
            }
        }
        let (cos, sin) = self.rotary.angles(positions.iter().copied());
        let cos: Vec<f32> = cos.into_iter().map(|v| v as f32).collect();
        let sin: Vec<f32> = sin.into_iter().map(|v| v as f32).collect();
        let mut h = vec![0f32; t * hs];
        let mut qkv = vec![0f32; t * width];
        let mut att = vec![0f32; t * hq * d];
        let mut gu = vec![0f32; t * 2 * inter];
        let mut m = vec![0f32; t * inter];
        for (l, lw) in w.layers.iter().enumerate() {
            decode::rms_norm(&mut h, &x, &lw.in_norm, eps);
            decode::linear(&mut qkv, false, &h, t, &lw.qkv)?;
            if let Some(bias) = &lw.qkv_bias {
                decode::add_bias(&mut qkv, bias);
            }
            let q_norm = lw.q_norm.as_deref();
            let k_norm = lw.k_norm.as_deref();
            decode::norm_rope_heads(&mut qkv, width, 0, hq, d, q_norm, eps, &cos, &sin);
            decode::norm_rope_heads(&mut qkv, width, k_at, hkv, d, k_norm, eps, &cos, &sin);
            for (cache, se) in caches.iter_mut().zip(offsets.windows(2)) {
                let Layers::Host(layers) = &mut cache.layers else {
                    return Err(Error::Input(
                        "the cache was not made by this decoder".into(),
                    ));
                };
                let (kb, vb) = &mut layers[l];
                for row in qkv[se[0] * width..se[1] * width].chunks_exact(width) {
                    kb.extend_from_slice(&row[k_at..v_at]);
                    vb.extend_from_slice(&row[v_at..]);
                }
            }
            let seqs = caches
                .iter()
                .zip(offsets.windows(2))
                .map(|(cache, se)| {
                    let (k, v) = cache.host(l)?;
                    Ok(CachedSeq {
                        k,
                        v,
                        n: se[1] - se[0],
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            decode::cached_attention(&mut att, &qkv, width, &seqs, dims)?;
            decode::linear(&mut x, true, &att, t, &lw.o_proj)?;
            if let Some(bias) = &lw.o_bias {
                decode::add_bias(&mut x, bias);
            }
            decode::rms_norm(&mut h, &x, &lw.post_norm, eps);
            decode::linear(&mut gu, false, &h, t, &lw.gate_up)?;
            decode::swiglu(&mut m, &gu, inter);
            decode::linear(&mut x, true, &m, t, &lw.down)?;
        }
        commit(caches, offsets);
        let mut last = vec![0f32; b * hs];
        for (row, &end) in last.chunks_exact_mut(hs).zip(&offsets[1..]) {
            row.copy_from_slice(&x[(end - 1) * hs..end * hs]);
        }
        let mut normed = vec![0f32; b * hs];
        decode::rms_norm(&mut normed, &last, &w.norm, eps);
        let mut logits = vec![0f32; b * vocab];
        decode::linear(&mut logits, false, &normed, b, &w.lm_head)?;
        Ok(logits)
    }

    /// The forward pass with candle ops (any device and dtype): the model's own layer definition,
    /// with attention over each sequence's cache.
    fn forward_tensors(
        &self,
        w: &TensorWeights,
        caches: &mut [&mut KvCache],
        packed: &Packed,
    ) -> Result<Tensor> {
        let cfg = &self.cfg;
        let (ids, offsets) = (&packed.ids, &packed.offsets);
        if ids.is_empty() {
            return Ok(Tensor::zeros(
                (0, cfg.vocab_size),
                DType::F32,
                &self.device,
            )?);
        }
        let ids_t = Tensor::new(ids.as_slice(), &self.device)?;
        let mut x = w.embed.index_select(&ids_t, 0)?;
        let tables =
            self.rotary
                .tables(packed.positions.iter().copied(), self.dtype, &self.device)?;
        let ctx = LayerCtx::new(cfg, &tables);
        for (l, layer) in w.layers.iter().enumerate() {
            x = layer.forward(&x, &ctx, None, |q, k, v| {
                self.cached_attention(l, caches, offsets, q, k, v)
            })?;
        }
        commit(caches, offsets);
        let last: Vec<u32> = offsets[1..].iter().map(|&o| (o - 1) as u32).collect();
        let last = Tensor::new(last.as_slice(), &self.device)?;
        let h = x.index_select(&last, 0)?;
        let h = crate::ops::rms_norm(&h, &w.norm, cfg.rms_norm_eps)?;
        Ok(h.matmul(&w.lm_head.t()?)?
            .to_dtype(DType::F32)?
            .contiguous()?)
    }

    /// Appends the new keys and values `k, v: [T, Hkv, D]` of layer `l` to every sequence's cache
    /// and returns the causal attention of the new queries `q: [T, Hq, D]` over the caches.
    fn cached_attention(
        &self,
        l: usize,
        caches: &mut [&mut KvCache],
        offsets: &[usize],
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<Tensor> {
        let (hq, hkv, d) = (
            self.cfg.num_attention_heads,
            self.cfg.num_key_value_heads,
            self.cfg.head_dim,
        );
        let group = hq / hkv;
        let scale = 1.0 / (d as f64).sqrt();
        let mut outs = Vec::with_capacity(caches.len());
        for (s, cache) in caches.iter_mut().enumerate() {
            let (start, n) = (offsets[s], offsets[s + 1] - offsets[s]);
            // [n, H, D] -> [H, n, D]
            let ks = k.narrow(0, start, n)?.transpose(0, 1)?.contiguous()?;
            let vs = v.narrow(0, start, n)?.transpose(0, 1)?.contiguous()?;
            let (kc, vc) = cache.append(l, &ks, &vs)?;
            let total = kc.dim(1)?;
            // Query heads of one KV head are adjacent: [n, Hq, D] -> [Hkv, group * n, D].
            let qs = q
                .narrow(0, start, n)?
                .transpose(0, 1)?
                .contiguous()?
                .reshape((hkv, group * n, d))?;
            let mut scores = (qs.matmul(&kc.t()?)? * scale)?;
            if n > 1 {
                let past = total - n;
                let mask: Vec<f32> = (0..group * n)
                    .flat_map(|r| {
                        let i = r % n;
                        (0..total).map(move |j| {
                            if j <= past + i {
                                0.0
                            } else {
                                f32::NEG_INFINITY
                            }
                        })
                    })
                    .collect();
                let mask = Tensor::from_vec(mask, (group * n, total), &self.device)?
                    .to_dtype(scores.dtype())?;
                scores = scores.broadcast_add(&mask)?;
            }
            // Inference only: candle's fused softmax (no backward) is fine here.
            let probs = candle_nn::ops::softmax_last_dim(&scores.to_dtype(DType::F32)?)?
                .to_dtype(self.dtype)?;
            outs.push(probs.matmul(&vc)?.reshape((hq, n, d))?.transpose(0, 1)?);
        }
        Ok(Tensor::cat(&outs, 0)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SeqPair;

    fn log_softmax_at(row: &[f32], tok: usize) -> f64 {
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = m + row.iter().map(|&z| (z as f64 - m).exp()).sum::<f64>().ln();
        row[tok] as f64 - lse
    }

    #[test]
    fn cached_decoding_matches_the_training_path() {
        // Host kernels, then candle ops.
        for host in [true, false] {
            cached_decoding_matches_the_training_path_with(host);
        }
    }

    fn cached_decoding_matches_the_training_path_with(host: bool) {
        let model = Model::new_random(ModelConfig::tiny(), 3, DType::F32, &Device::Cpu).unwrap();
        let dec = Decoder::build(&model, host).unwrap();
        let prompts: [&[u32]; 2] = [&[1, 2, 3, 4, 5], &[9, 8]];
        let responses: [&[u32]; 2] = [&[7, 100, 42], &[300, 11, 12, 13]];
        let mut caches = [dec.new_cache(), dec.new_cache()];
        let mut got: Vec<Vec<f64>> = vec![vec![], vec![]];
        // Prefill both prompts together, then feed the responses token by token (ragged).
        let mut refs: Vec<&mut KvCache> = caches.iter_mut().collect();
        let mut cur: Vec<Vec<f32>> = dec.forward(&mut refs, &prompts).unwrap().to_vec2().unwrap();
        for step in 0.. {
            for s in 0..2 {
                if step < responses[s].len() {
                    got[s].push(log_softmax_at(&cur[s], responses[s][step] as usize));
                }
            }
            let active: Vec<usize> = (0..2).filter(|&s| step + 1 < responses[s].len()).collect();
            if active.is_empty() {
                break;
            }
            let mut refs: Vec<&mut KvCache> = caches
                .iter_mut()
                .enumerate()
                .filter(|(s, _)| active.contains(s))
                .map(|(_, c)| c)
                .collect();
            let feed: Vec<&[u32]> = active.iter().map(|&s| &responses[s][step..=step]).collect();
            let rows: Vec<Vec<f32>> = dec.forward(&mut refs, &feed).unwrap().to_vec2().unwrap();
            for (r, &s) in active.iter().enumerate() {
                cur[s] = rows[r].clone();
            }
        }
        let pairs: Vec<SeqPair> = prompts
            .iter()
            .zip(responses)
            .map(|(p, r)| SeqPair::new(p, r))
            .collect();
        let want = model.logprobs(&pairs, 1.0, false).unwrap().logprobs;
        for s in 0..2 {
            assert_eq!(got[s].len(), want[s].len());
            for (a, b) in got[s].iter().zip(&want[s]) {
                assert!((a - b).abs() < 1e-4, "host {host}, seq {s}: {a} vs {b}");
            }
        }
        assert_eq!(caches[0].len(), 5 + 2);
        assert_eq!(caches[1].len(), 2 + 3);
    }

    #[test]
    fn cache_growth_and_forks_keep_the_logprobs() {
        let model = Model::new_random(ModelConfig::tiny(), 4, DType::F32, &Device::Cpu).unwrap();
        let dec = Decoder::new(&model).unwrap();
        let prompt: Vec<u32> = (0..50).map(|i| (i * 7 % 500) as u32).collect();
        let response: Vec<u32> = (0..100).map(|i| (i * 13 % 500) as u32).collect();
        let mut base = dec.new_cache();
        let first = dec.forward(&mut [&mut base], &[&prompt]).unwrap();
        // A fork continues independently of the original.
        let mut fork = base.fork().unwrap();
        dec.forward(&mut [&mut base], &[&[3, 4, 5]]).unwrap();
        let mut got = vec![log_softmax_at(
            &first.to_vec2::<f32>().unwrap()[0],
            response[0] as usize,
        )];
        for t in 0..response.len() - 1 {
            let row = dec.forward(&mut [&mut fork], &[&response[t..=t]]).unwrap();
            got.push(log_softmax_at(
                &row.to_vec2::<f32>().unwrap()[0],
                response[t + 1] as usize,
            ));
        }
        assert_eq!(fork.len(), 149);
        let want = model
            .logprobs(&[SeqPair::new(&prompt, &response)], 1.0, false)
            .unwrap()
            .logprobs;
        for (a, b) in got.iter().zip(&want[0]) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }

    #[test]
    fn bad_input_is_an_error() {
        let model = Model::new_random(ModelConfig::tiny(), 3, DType::F32, &Device::Cpu).unwrap();
        let dec = Decoder::new(&model).unwrap();
        let mut c = dec.new_cache();
        assert!(dec.forward(&mut [&mut c], &[&[]]).is_err());
        assert!(dec.forward(&mut [&mut c], &[&[100_000]]).is_err());
        assert!(dec.forward(&mut [&mut c], &[]).is_err());
        assert_eq!(dec.forward(&mut [], &[]).unwrap().dims(), [0, 512]);
        // A cache of the other kind of decoder.
        let candle = Decoder::build(&model, false).unwrap();
        assert!(candle.forward(&mut [&mut c], &[&[1]]).is_err());
        assert!(dec
            .forward(&mut [&mut candle.new_cache()], &[&[1]])
            .is_err());
        assert!(c.is_empty());
    }
}
