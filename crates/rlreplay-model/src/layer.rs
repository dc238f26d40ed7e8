//! The decoder layer of every supported architecture (Qwen3, Qwen2, Llama), defined once: its weights as named fields, how they are
//! named in a Hugging Face checkpoint, the rotary tables, and the layer's math. The training
//! forward pass and the KV-cache decoder run `DecoderLayer::forward` (they differ only in how
//! attention sees past tokens); the f32 host decoder reads the same weights and rotary tables and is
//! held to this definition by the tests that all three agree.

use candle_core::{DType, Device, Tensor, Var};

use crate::lora::{LayerLora, LoraTarget};
use crate::model::Param;
use crate::ops;
use crate::{ModelConfig, Result};

/// What an architecture's decoder layer holds besides the common weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LayerKind {
    /// Biases on the q, k and v projections.
    pub qkv_bias: bool,
    /// A bias on the output projection.
    pub o_bias: bool,
    /// RMSNorm on every query and key head before the rotary embedding.
    pub qk_norm: bool,
}

/// A linear map `y = x·Wᵀ (+ b)` with `W: [out, in]`.
#[derive(Debug, Clone)]
pub struct Linear<W> {
    /// The weight, `[out, in]`.
    pub weight: W,
    /// The bias, `[out]`, when the layer has one.
    pub bias: Option<W>,
}

/// Grouped-query self-attention.
#[derive(Debug, Clone)]
pub struct Attention<W> {
    /// Query projection, `[Hq·D, H]`.
    pub q_proj: Linear<W>,
    /// Key projection, `[Hkv·D, H]`.
    pub k_proj: Linear<W>,
    /// Value projection, `[Hkv·D, H]`.
    pub v_proj: Linear<W>,
    /// Output projection, `[H, Hq·D]`.
    pub o_proj: Linear<W>,
    /// RMSNorm weight of every query head, `[D]` (Model).
    pub q_norm: Option<W>,
    /// RMSNorm weight of every key head, `[D]` (Model).
    pub k_norm: Option<W>,
}

/// The SwiGLU MLP `down(silu(gate(x)) · up(x))`.
#[derive(Debug, Clone)]
pub struct Mlp<W> {
    /// `[I, H]`.
    pub gate_proj: W,
    /// `[I, H]`.
    pub up_proj: W,
    /// `[H, I]`.
    pub down_proj: W,
}

/// One pre-norm decoder layer: `x + attn(norm(x))`, then `x + mlp(norm(x))`.
#[derive(Debug, Clone)]
pub struct DecoderLayer<W> {
    /// RMSNorm before attention, `[H]`.
    pub input_layernorm: W,
    /// Self-attention.
    pub self_attn: Attention<W>,
    /// RMSNorm before the MLP, `[H]`.
    pub post_attention_layernorm: W,
    /// The MLP.
    pub mlp: Mlp<W>,
}

impl<W> Linear<W> {
    fn map<U>(&self, f: &mut impl FnMut(&W) -> Result<U>) -> Result<Linear<U>> {
        Ok(Linear {
            weight: f(&self.weight)?,
            bias: self.bias.as_ref().map(&mut *f).transpose()?,
        })
    }
}

impl Linear<Tensor> {
    /// `x·Wᵀ (+ b)` (plus the adapter of `target`, if any) for `x: [T, in]`, split into
    /// `heads`: `[T, heads, out / heads]`.
    fn forward_heads(
        &self,
        x: &Tensor,
        heads: usize,
        lora: Option<&LayerLora<'_>>,
        target: LoraTarget,
    ) -> Result<Tensor> {
        if self.bias.is_none() {
            if !LayerLora::has(lora, target) {
                return Ok(ops::linear_heads(x, &self.weight, heads)?);
            }
            if let Some(y) = LayerLora::project(lora, target, x, &self.weight, Some(heads))? {
                return Ok(y);
            }
        }
        let mut y = ops::linear(x, &self.weight)?;
        if let Some(b) = &self.bias {
            y = y.broadcast_add(b)?;
        }
        let y = LayerLora::add(lora, target, x, y)?;
        let (t, out) = y.dims2()?;
        Ok(y.reshape((t, heads, out / heads))?)
    }

    /// `r + x·Wᵀ (+ b)` (plus the adapter of `target`, if any) for `x: [T, in]` (or
    /// `[T, heads, D]`) and the residual `r: [T, out]`.
    fn forward_add(
        &self,
        x: &Tensor,
        r: &Tensor,
        lora: Option<&LayerLora<'_>>,
        target: LoraTarget,
    ) -> Result<Tensor> {
        let y = match &self.bias {
            Some(b) => (r + ops::linear(x, &self.weight)?.broadcast_add(b)?)?,
            None => ops::linear_add(x, &self.weight, r)?,
        };
        LayerLora::add(lora, target, x, y)
    }
}

impl<W> DecoderLayer<W> {
    /// Applies `f` to every weight, keeping the structure.
    pub fn map<U>(&self, mut f: impl FnMut(&W) -> Result<U>) -> Result<DecoderLayer<U>> {
        let a = &self.self_attn;
        Ok(DecoderLayer {
            input_layernorm: f(&self.input_layernorm)?,
            self_attn: Attention {
                q_proj: a.q_proj.map(&mut f)?,
                k_proj: a.k_proj.map(&mut f)?,
                v_proj: a.v_proj.map(&mut f)?,
                o_proj: a.o_proj.map(&mut f)?,
                q_norm: a.q_norm.as_ref().map(&mut f).transpose()?,
                k_norm: a.k_norm.as_ref().map(&mut f).transpose()?,
            },
            post_attention_layernorm: f(&self.post_attention_layernorm)?,
            mlp: Mlp {
                gate_proj: f(&self.mlp.gate_proj)?,
                up_proj: f(&self.mlp.up_proj)?,
                down_proj: f(&self.mlp.down_proj)?,
            },
        })
    }

    /// Every weight of the layer.
    pub fn weights(&self) -> Vec<&W> {
        let a = &self.self_attn;
        let mut out = vec![&self.input_layernorm];
        for l in [&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj] {
            out.push(&l.weight);
            out.extend(l.bias.as_ref());
        }
        out.extend(a.q_norm.as_ref());
        out.extend(a.k_norm.as_ref());
        out.extend([
            &self.post_attention_layernorm,
            &self.mlp.gate_proj,
            &self.mlp.up_proj,
            &self.mlp.down_proj,
        ]);
        out
    }
}

impl DecoderLayer<Var> {
    /// Layer `prefix` (`model.layers.N`) of `cfg`'s architecture, with its Hugging Face names.
    pub(crate) fn new(cfg: &ModelConfig, vb: &mut VarBuilder<'_>, prefix: &str) -> Result<Self> {
        let kind = cfg.layer();
        let (h, i, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
        let (q, kv) = (cfg.num_attention_heads * d, cfg.num_key_value_heads * d);
        let p = |s: &str| format!("{prefix}.{s}");
        let input_layernorm = vb.get(&p("input_layernorm.weight"), &[h])?;
        let q_proj = vb.linear(&p("self_attn.q_proj"), q, h, kind.qkv_bias)?;
        let k_proj = vb.linear(&p("self_attn.k_proj"), kv, h, kind.qkv_bias)?;
        let v_proj = vb.linear(&p("self_attn.v_proj"), kv, h, kind.qkv_bias)?;
        let o_proj = vb.linear(&p("self_attn.o_proj"), h, q, kind.o_bias)?;
        let (q_norm, k_norm) = if kind.qk_norm {
            (
                Some(vb.get(&p("self_attn.q_norm.weight"), &[d])?),
                Some(vb.get(&p("self_attn.k_norm.weight"), &[d])?),
            )
        } else {
            (None, None)
        };
        Ok(Self {
            input_layernorm,
            self_attn: Attention {
                q_proj,
                k_proj,
                v_proj,
                o_proj,
                q_norm,
                k_norm,
            },
            post_attention_layernorm: vb.get(&p("post_attention_layernorm.weight"), &[h])?,
            mlp: Mlp {
                gate_proj: vb.get(&p("mlp.gate_proj.weight"), &[i, h])?,
                up_proj: vb.get(&p("mlp.up_proj.weight"), &[i, h])?,
                down_proj: vb.get(&p("mlp.down_proj.weight"), &[h, i])?,
            },
        })
    }
}

/// What every layer of one forward pass shares: head counts, the norm epsilon and the rotary
/// tables of the tokens' positions.
pub(crate) struct LayerCtx<'a> {
    /// Query heads, key/value heads, head width.
    pub heads: (usize, usize, usize),
    /// Epsilon of every RMSNorm.
    pub eps: f64,
    /// `cos` of the rotary angles, `[T, D/2]`.
    pub cos: &'a Tensor,
    /// `sin` of the rotary angles, `[T, D/2]`.
    pub sin: &'a Tensor,
}

impl<'a> LayerCtx<'a> {
    /// The context of `cfg` with rotary tables `(cos, sin)`.
    pub fn new(cfg: &ModelConfig, (cos, sin): &'a (Tensor, Tensor)) -> Self {
        Self {
            heads: (
                cfg.num_attention_heads,
                cfg.num_key_value_heads,
                cfg.head_dim,
            ),
            eps: cfg.rms_norm_eps,
            cos,
            sin,
        }
    }
}

impl DecoderLayer<Tensor> {
    /// The layer applied to the packed hidden states `x: [T, H]`. `attend(q, k, v)` gets the
    /// normalised, rotated queries `[T, Hq, D]`, keys and values `[T, Hkv, D]` of the new tokens
    /// and returns the attention output `[T, Hq, D]` (causal over whatever past it keeps). `lora`:
    /// the layer's LoRA adapters, added to the outputs of the projections they target.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        ctx: &LayerCtx<'_>,
        lora: Option<&LayerLora<'_>>,
        attend: impl FnOnce(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let (hq, hkv, _) = ctx.heads;
        let a = &self.self_attn;
        let norm_rope = |x: Tensor, w: &Option<Tensor>| -> Result<Tensor> {
            Ok(match w {
                Some(w) => ops::norm_rope(&x, w, ctx.eps, ctx.cos, ctx.sin)?,
                None => ops::rope(&x, ctx.cos, ctx.sin)?,
            })
        };
        let h = ops::rms_norm(x, &self.input_layernorm, ctx.eps)?;
        let q = a.q_proj.forward_heads(&h, hq, lora, LoraTarget::QProj)?;
        let k = a.k_proj.forward_heads(&h, hkv, lora, LoraTarget::KProj)?;
        let v = a.v_proj.forward_heads(&h, hkv, lora, LoraTarget::VProj)?;
        let q = norm_rope(q, &a.q_norm)?;
        let k = norm_rope(k, &a.k_norm)?;
        let o = attend(&q, &k, &v)?;
        let x = a.o_proj.forward_add(&o, x, lora, LoraTarget::OProj)?;
        let h = ops::rms_norm(&x, &self.post_attention_layernorm, ctx.eps)?;
        let (gate, up) = (LoraTarget::GateProj, LoraTarget::UpProj);
        let m = if LayerLora::has(lora, gate) || LayerLora::has(lora, up) {
            let proj = |t: LoraTarget, w: &Tensor| -> Result<Tensor> {
                match LayerLora::project(lora, t, &h, w, None)? {
                    Some(y) => Ok(y),
                    None => LayerLora::add(lora, t, &h, ops::linear(&h, w)?),
                }
            };
            let g = proj(gate, &self.mlp.gate_proj)?;
            let u = proj(up, &self.mlp.up_proj)?;
            ops::swiglu(&g, &u)?
        } else {
            ops::gated_up(&h, &self.mlp.gate_proj, &self.mlp.up_proj)?
        };
        let y = ops::linear_add(&m, &self.mlp.down_proj, &x)?;
        LayerLora::add(lora, LoraTarget::DownProj, &m, y)
    }
}

/// The rotary embedding's inverse frequencies `θ^(−2i/D)`, computed in f64.
#[derive(Debug, Clone)]
pub(crate) struct Rotary {
    inv_freq: Vec<f64>,
}

impl Rotary {
    /// The rotary embedding of `cfg`, with its frequency scaling.
    pub fn new(cfg: &ModelConfig) -> Self {
        Self {
            inv_freq: cfg.rope_scaling.inv_freq(cfg.rope_theta, cfg.head_dim),
        }
    }

    /// `(cos, sin)` of the angles of `positions`, `[T, D/2]` row-major, in f64.
    pub fn angles(&self, positions: impl ExactSizeIterator<Item = usize>) -> (Vec<f64>, Vec<f64>) {
        let positions: Vec<usize> = positions.collect();
        let top = positions.iter().max().map_or(0, |&p| p + 1);
        if top > positions.len() {
            return self.rows(positions.iter().copied(), positions.len());
        }
        // Packed sequences repeat positions 0, 1, ..: each distinct one once, then copied.
        let half = self.inv_freq.len();
        let (tc, ts) = self.rows(0..top, top);
        let (mut cos, mut sin) = (
            Vec::with_capacity(positions.len() * half),
            Vec::with_capacity(positions.len() * half),
        );
        for &p in &positions {
            cos.extend_from_slice(&tc[p * half..(p + 1) * half]);
            sin.extend_from_slice(&ts[p * half..(p + 1) * half]);
        }
        (cos, sin)
    }

    /// `(cos, sin)` rows of the `n` positions of `ps`, computed one by one.
    fn rows(&self, ps: impl Iterator<Item = usize>, n: usize) -> (Vec<f64>, Vec<f64>) {
        let len = n * self.inv_freq.len();
        let (mut cos, mut sin) = (Vec::with_capacity(len), Vec::with_capacity(len));
        for p in ps {
            for &f in &self.inv_freq {
                let (s, c) = (p as f64 * f).sin_cos();
                cos.push(c);
                sin.push(s);
            }
        }
        (cos, sin)
    }

    /// The `(cos, sin)` tables `[T, D/2]` of `positions` in `dtype` on `device`.
    pub fn tables(
        &self,
        positions: impl ExactSizeIterator<Item = usize>,
        dtype: DType,
        device: &Device,
    ) -> Result<(Tensor, Tensor)> {
        let t = positions.len();
        let (cos, sin) = self.angles(positions);
        let shape = (t, self.inv_freq.len());
        Ok((
            Tensor::from_vec(cos, shape, device)?.to_dtype(dtype)?,
            Tensor::from_vec(sin, shape, device)?.to_dtype(dtype)?,
        ))
    }
}

/// Where the weights of a model being built come from: `(name, shape, index)` to the tensor, any
/// dtype (converted to the master dtype). `index` counts the tensors asked for so far.
pub(crate) type WeightSource<'a> = dyn FnMut(&str, &[usize], usize) -> Result<Tensor> + 'a;

/// Builds a model's weights by name from a [`WeightSource`] and records them as parameters in the
/// order they are asked for (the Hugging Face order).
pub(crate) struct VarBuilder<'a> {
    source: &'a mut WeightSource<'a>,
    master: DType,
    /// The parameters built so far.
    pub params: Vec<Param>,
}

impl<'a> VarBuilder<'a> {
    /// A builder of master weights in `master` dtype.
    pub fn new(source: &'a mut WeightSource<'a>, master: DType) -> Self {
        Self {
            source,
            master,
            params: Vec::new(),
        }
    }

    /// The weight `name` of `shape`.
    pub fn get(&mut self, name: &str, shape: &[usize]) -> Result<Var> {
        let t = (self.source)(name, shape, self.params.len())?;
        let var = Var::from_tensor(&t.to_dtype(self.master)?)?;
        self.params.push(Param {
            name: name.to_string(),
            var: var.clone(),
        });
        Ok(var)
    }

    /// The linear layer `prefix` (`prefix.weight`, and `prefix.bias` when `bias`).
    pub fn linear(
        &mut self,
        prefix: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<Linear<Var>> {
        let weight = self.get(&format!("{prefix}.weight"), &[out, inp])?;
        let bias = if bias {
            Some(self.get(&format!("{prefix}.bias"), &[out])?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotary_angles_of_repeated_and_sparse_positions_match_the_direct_ones() {
        let rot = Rotary::new(&ModelConfig::tiny());
        let direct = |ps: &[usize]| {
            let (mut cos, mut sin) = (Vec::new(), Vec::new());
            for &p in ps {
                for &f in &rot.inv_freq {
                    cos.push((p as f64 * f).cos());
                    sin.push((p as f64 * f).sin());
                }
            }
            (cos, sin)
        };
        for ps in [&[0, 1, 2, 0, 1, 2, 3][..], &[700, 3], &[], &[5]] {
            assert_eq!(rot.angles(ps.iter().copied()), direct(ps), "{ps:?}");
        }
    }
}
