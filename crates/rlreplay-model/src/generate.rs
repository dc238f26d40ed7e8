//! Inference-only decoding with a per-sequence KV cache, for sampling.
//!
//! [`Decoder`] snapshots a [`Qwen3`]'s weights in the compute dtype and runs the same network as
//! the training path, with candle's fused inference kernels (RMSNorm, RoPE, softmax) and no
//! autograd graph. Sequences are ragged: every call takes any number of new tokens per sequence
//! (a whole prompt to prefill, or one sampled token), packs them into one set of matrix products,
//! and attends per sequence against that sequence's own cache. It returns the logits of the last
//! new token of each sequence.

use candle_core::{DType, Device, Tensor};

use crate::{Error, Qwen3, Qwen3Config, Result};

/// Weights of one decoder layer, in the compute dtype.
struct LayerWeights {
    in_norm: Tensor,
    q_proj: Tensor,
    k_proj: Tensor,
    v_proj: Tensor,
    o_proj: Tensor,
    q_norm: Tensor,
    k_norm: Tensor,
    post_norm: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
}

/// A snapshot of a model's weights prepared for incremental decoding.
pub struct Decoder {
    cfg: Qwen3Config,
    dtype: DType,
    device: Device,
    embed: Tensor,
    layers: Vec<LayerWeights>,
    norm: Tensor,
    lm_head: Tensor,
    inv_freq: Vec<f64>,
}

/// The key/value cache of one sequence: per layer `[Hkv, capacity, D]` key and value buffers, of
/// which the first `len` positions are filled; appends write in place and grow the buffers
/// geometrically.
#[derive(Default)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
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
        let layers = self
            .layers
            .iter()
            .map(|l| match l {
                Some((k, v)) => Ok(Some((k.copy()?, v.copy()?))),
                None => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            layers,
            len: self.len,
        })
    }

    /// Appends `[Hkv, n, D]` keys and values to layer `l` (positions `len..len + n`) and returns
    /// views of the `len + n` cached positions.
    fn append(&mut self, l: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let n = k.dim(1)?;
        let total = self.len + n;
        let (mut kb, mut vb) = match self.layers[l].take() {
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
        self.layers[l] = Some((kb, vb));
        Ok(views)
    }
}

impl Decoder {
    /// Snapshots the current weights of `model` (later training steps do not affect it).
    pub fn new(model: &Qwen3) -> Result<Self> {
        let cfg = model.config().clone();
        let dtype = model.compute_dtype();
        let params = model.params();
        let get = |name: &str| -> Result<Tensor> {
            let p = params
                .iter()
                .find(|p| p.name == name)
                .ok_or_else(|| Error::Checkpoint(format!("the model has no parameter {name}")))?;
            Ok(p.var.as_detached_tensor().to_dtype(dtype)?)
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| {
                let w = |s: &str| get(&format!("model.layers.{l}.{s}"));
                Ok(LayerWeights {
                    in_norm: w("input_layernorm.weight")?,
                    q_proj: w("self_attn.q_proj.weight")?,
                    k_proj: w("self_attn.k_proj.weight")?,
                    v_proj: w("self_attn.v_proj.weight")?,
                    o_proj: w("self_attn.o_proj.weight")?,
                    q_norm: w("self_attn.q_norm.weight")?,
                    k_norm: w("self_attn.k_norm.weight")?,
                    post_norm: w("post_attention_layernorm.weight")?,
                    gate: w("mlp.gate_proj.weight")?,
                    up: w("mlp.up_proj.weight")?,
                    down: w("mlp.down_proj.weight")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let embed = get("model.embed_tokens.weight")?;
        let lm_head = if cfg.tie_word_embeddings {
            embed.clone()
        } else {
            get("lm_head.weight")?
        };
        let d = cfg.head_dim;
        let inv_freq = (0..d / 2)
            .map(|i| 1.0 / cfg.rope_theta.powf((2 * i) as f64 / d as f64))
            .collect();
        Ok(Self {
            norm: get("model.norm.weight")?,
            device: model.device().clone(),
            cfg,
            dtype,
            embed,
            layers,
            lm_head,
            inv_freq,
        })
    }

    /// The model configuration.
    pub fn config(&self) -> &Qwen3Config {
        &self.cfg
    }

    /// An empty cache for a new sequence.
    pub fn new_cache(&self) -> KvCache {
        KvCache {
            layers: vec![None; self.cfg.num_hidden_layers],
            len: 0,
        }
    }

    /// RoPE tables `[T, D/2]` for the given positions (computed in f64 as in the training path).
    fn rope_tables(&self, positions: &[usize]) -> Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for &f in &self.inv_freq {
                let (s, c) = (p as f64 * f).sin_cos();
                cos.push(c);
                sin.push(s);
            }
        }
        let shape = (positions.len(), half);
        Ok((
            Tensor::from_vec(cos, shape, &self.device)?.to_dtype(self.dtype)?,
            Tensor::from_vec(sin, shape, &self.device)?.to_dtype(self.dtype)?,
        ))
    }

    /// Feeds `tokens[i]` (at least one token) to sequence `caches[i]` for every `i`, appends their
    /// keys and values to the caches, and returns the f32 logits `[caches.len(), vocab]` of the last
    /// fed token of each sequence.
    pub fn forward(&self, caches: &mut [&mut KvCache], tokens: &[&[u32]]) -> Result<Tensor> {
        let cfg = &self.cfg;
        if caches.len() != tokens.len() {
            return Err(Error::Input(format!(
                "{} caches for {} token lists",
                caches.len(),
                tokens.len()
            )));
        }
        let mut ids = Vec::new();
        let mut positions = Vec::new();
        let mut offsets = vec![0usize];
        for (i, (cache, toks)) in caches.iter().zip(tokens).enumerate() {
            if toks.is_empty() {
                return Err(Error::Input(format!("sequence {i}: no token to feed")));
            }
            if cache.layers.len() != cfg.num_hidden_layers {
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
        if ids.is_empty() {
            return Ok(Tensor::zeros(
                (0, cfg.vocab_size),
                DType::F32,
                &self.device,
            )?);
        }
        let t = ids.len();
        let (hq, hkv, d) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        let group = hq / hkv;
        let eps = cfg.rms_norm_eps as f32;
        let scale = 1.0 / (d as f64).sqrt();
        let linear = |x: &Tensor, w: &Tensor| x.matmul(&w.t()?);
        let ids_t = Tensor::new(ids.as_slice(), &self.device)?;
        let mut x = self.embed.index_select(&ids_t, 0)?;
        let (cos, sin) = self.rope_tables(&positions)?;
        for (l, w) in self.layers.iter().enumerate() {
            let h = candle_nn::ops::rms_norm(&x, &w.in_norm, eps)?;
            let q = linear(&h, &w.q_proj)?.reshape((t, hq, d))?;
            let k = linear(&h, &w.k_proj)?.reshape((t, hkv, d))?;
            let v = linear(&h, &w.v_proj)?.reshape((t, hkv, d))?;
            let q = candle_nn::ops::rms_norm(&q, &w.q_norm, eps)?;
            let k = candle_nn::ops::rms_norm(&k, &w.k_norm, eps)?;
            let q = candle_nn::rotary_emb::rope_thd(&q.unsqueeze(0)?, &cos, &sin)?.squeeze(0)?;
            let k = candle_nn::rotary_emb::rope_thd(&k.unsqueeze(0)?, &cos, &sin)?.squeeze(0)?;
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
                let probs = candle_nn::ops::softmax_last_dim(&scores.to_dtype(DType::F32)?)?
                    .to_dtype(self.dtype)?;
                let o = probs
                    .matmul(&vc)?
                    .reshape((hq, n, d))?
                    .transpose(0, 1)?
                    .reshape((n, hq * d))?;
                outs.push(o);
            }
            let a = Tensor::cat(&outs, 0)?;
            x = (x + linear(&a, &w.o_proj)?)?;
            let h = candle_nn::ops::rms_norm(&x, &w.post_norm, eps)?;
            let m = (candle_nn::ops::silu(&linear(&h, &w.gate)?)? * linear(&h, &w.up)?)?;
            x = (x + linear(&m, &w.down)?)?;
        }
        for (cache, toks) in caches.iter_mut().zip(tokens) {
            cache.len += toks.len();
        }
        let last: Vec<u32> = offsets[1..].iter().map(|&o| (o - 1) as u32).collect();
        let last = Tensor::new(last.as_slice(), &self.device)?;
        let h = x.index_select(&last, 0)?;
        let h = candle_nn::ops::rms_norm(&h, &self.norm, eps)?;
        Ok(linear(&h, &self.lm_head)?
            .to_dtype(DType::F32)?
            .contiguous()?)
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
        let model = Qwen3::new_random(Qwen3Config::tiny(), 3, DType::F32, &Device::Cpu).unwrap();
        let dec = Decoder::new(&model).unwrap();
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
                assert!((a - b).abs() < 1e-4, "seq {s}: {a} vs {b}");
            }
        }
        assert_eq!(caches[0].len(), 5 + 2);
        assert_eq!(caches[1].len(), 2 + 3);
    }

    #[test]
    fn cache_growth_and_forks_keep_the_logprobs() {
        let model = Qwen3::new_random(Qwen3Config::tiny(), 4, DType::F32, &Device::Cpu).unwrap();
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
        let model = Qwen3::new_random(Qwen3Config::tiny(), 3, DType::F32, &Device::Cpu).unwrap();
        let dec = Decoder::new(&model).unwrap();
        let mut c = dec.new_cache();
        assert!(dec.forward(&mut [&mut c], &[&[]]).is_err());
        assert!(dec.forward(&mut [&mut c], &[&[100_000]]).is_err());
        assert!(dec.forward(&mut [&mut c], &[]).is_err());
        assert_eq!(dec.forward(&mut [], &[]).unwrap().dims(), [0, 512]);
        assert!(c.is_empty());
    }
}
