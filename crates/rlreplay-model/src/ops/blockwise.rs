//! Memory-lean attention and log-prob head built from candle tensor ops, for every device and
//! dtype without a hand-written kernel (CUDA; the tests run the same functions on the CPU).
//!
//! Both ops compute their forward pass block by block without an autograd graph and recompute
//! each block in the backward pass, so the graph keeps only their inputs and outputs:
//!
//! - [`packed_causal_attention`](super::packed_causal_attention): per sequence, blocks of query
//!   rows against the keys they may see (FlashAttention-2's schedule at the level of tensor ops):
//!   a `[Hkv, G·rows, keys]` score block at a time, never `[heads × L × L]` across the backward.
//! - [`token_logprobs`]: chunks of rows through the lm_head; the `[N, V]` logits are never whole
//!   and no chunk's logits outlive its step.
//!
//! Matrix products run in the input dtype (cuBLAS on CUDA), softmax statistics in at least f32,
//! as in the composite reference ([`super::composite`]).

use std::sync::Mutex;

use candle_core::backend::BackendStorage;
use candle_core::{
    bail, CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Storage, Tensor, D,
};

/// Score elements per attention block (`Hq × rows × L`; 256 MiB in f32).
pub const SCORE_ELEMS: usize = 1 << 26;
/// Logit elements per chunk of the log-prob head (`rows × V`; 512 MiB in f32).
pub const LOGIT_ELEMS: usize = 1 << 27;

/// Dtype of softmax statistics: f32 for half-precision inputs, else unchanged.
fn stat_dtype(dtype: DType) -> DType {
    match dtype {
        DType::BF16 | DType::F16 => DType::F32,
        other => other,
    }
}

/// The forward result of an op computed beforehand with tensor ops, handed to candle by the
/// custom op's forward so that the graph records the op and its backward.
pub(super) struct Precomputed(Mutex<Option<Tensor>>);

impl Precomputed {
    pub(super) fn new(t: Tensor) -> Self {
        Self(Mutex::new(Some(t)))
    }

    /// Takes the result (once) as a contiguous tensor whose storage starts at its first element.
    fn take(&self, op: &str) -> Result<Tensor> {
        let t = self
            .0
            .lock()
            .map_err(|_| candle_core::Error::Msg(format!("{op}: poisoned lock")))?
            .take();
        let Some(t) = t else {
            bail!("{op}: forward called twice");
        };
        if t.is_contiguous() && t.layout().start_offset() == 0 {
            Ok(t)
        } else {
            t.force_contiguous()
        }
    }

    pub(super) fn cpu(&self, op: &str) -> Result<(CpuStorage, Shape)> {
        let t = self.take(op)?;
        let (storage, layout) = t.storage_and_layout();
        match &*storage {
            Storage::Cpu(s) => Ok((s.try_clone(layout)?, layout.shape().clone())),
            _ => bail!("{op}: result is not on the CPU"),
        }
    }

    #[cfg(feature = "cuda")]
    pub(super) fn cuda(&self, op: &str) -> Result<(candle_core::CudaStorage, Shape)> {
        let t = self.take(op)?;
        let (storage, layout) = t.storage_and_layout();
        match &*storage {
            Storage::Cuda(s) => Ok((s.try_clone(layout)?, layout.shape().clone())),
            _ => bail!("{op}: result is not on a CUDA device"),
        }
    }
}

/// Non-empty sequences of `offsets` as `(start, len)`.
fn sequences(offsets: &[usize]) -> impl Iterator<Item = (usize, usize)> + '_ {
    offsets
        .windows(2)
        .filter(|w| w[1] > w[0])
        .map(|w| (w[0], w[1] - w[0]))
}

/// The attention schedule: sizes, scale and rows per block.
#[derive(Clone, Copy)]
struct Attn {
    hq: usize,
    hkv: usize,
    d: usize,
    scale: f64,
    /// Most score elements per block.
    elems: usize,
}

/// One sequence's keys and values as `[Hkv, L, D]`, and its query rows per block.
struct SeqKv {
    k: Tensor,
    v: Tensor,
    rows: usize,
}

impl Attn {
    fn group(&self) -> usize {
        self.hq / self.hkv
    }

    /// Query rows per block for a sequence of `len` tokens.
    fn rows(&self, len: usize) -> usize {
        (self.elems / (self.hq * len).max(1)).clamp(1, len.max(1))
    }

    fn seq_kv(&self, k: &Tensor, v: &Tensor, start: usize, len: usize) -> Result<SeqKv> {
        let t = |x: &Tensor| x.narrow(0, start, len)?.transpose(0, 1)?.contiguous();
        Ok(SeqKv {
            k: t(k)?,
            v: t(v)?,
            rows: self.rows(len),
        })
    }

    /// The additive causal mask tile in `dtype` for every block of `offsets`' sequences:
    /// `[rows, rows]` (the most rows of a block), 0 on and below the diagonal, `-inf` above.
    fn mask_tile(
        &self,
        offsets: &[usize],
        dtype: DType,
        dev: &candle_core::Device,
    ) -> Result<Tensor> {
        let rows = sequences(offsets)
            .map(|(_, len)| self.rows(len))
            .max()
            .unwrap_or(1);
        let r = Tensor::arange(0u32, rows as u32, dev)?;
        let above = r.reshape((1, rows))?.broadcast_gt(&r.reshape((rows, 1))?)?;
        let zero = Tensor::zeros((rows, rows), dtype, dev)?;
        let inf = Tensor::full(f32::NEG_INFINITY, (rows, rows), dev)?.to_dtype(dtype)?;
        above.where_cond(&inf, &zero)
    }

    /// Query rows `[i0, i0 + br)` of one sequence (`q` packed `[T, Hq, D]`), pre-scaled, as
    /// `[Hkv, G·br, D]`.
    fn q_block(&self, q: &Tensor, row0: usize, br: usize) -> Result<Tensor> {
        (q.narrow(0, row0, br)?.transpose(0, 1)?.contiguous()? * self.scale)?.reshape((
            self.hkv,
            self.group() * br,
            self.d,
        ))
    }

    /// Softmax probabilities `[Hkv, G·br, nk]` (stat dtype) of query block `qb` against the
    /// first `nk = i0 + br` keys, with the causal mask on the last `br` of them.
    fn probs(
        &self,
        qb: &Tensor,
        kv: &SeqKv,
        tile: &Tensor,
        i0: usize,
        br: usize,
    ) -> Result<Tensor> {
        let nk = i0 + br;
        let k = kv.k.narrow(1, 0, nk)?;
        let s = qb.matmul(&k.t()?)?.to_dtype(stat_dtype(qb.dtype()))?;
        let diag = tile.narrow(0, 0, br)?.narrow(1, 0, br)?;
        let mask = if i0 == 0 {
            diag
        } else {
            Tensor::cat(
                &[&Tensor::zeros((br, i0), s.dtype(), s.device())?, &diag],
                1,
            )?
        };
        let s = s
            .reshape((self.hkv, self.group(), br, nk))?
            .broadcast_add(&mask)?
            .reshape((self.hkv, self.group() * br, nk))?;
        candle_nn::ops::softmax_last_dim(&s)
    }

    /// A `[Hkv, G·br, D]` block back to `[br, Hq, D]`.
    fn unblock(&self, x: &Tensor, br: usize) -> Result<Tensor> {
        x.reshape((self.hq, br, self.d))?.transpose(0, 1)
    }

    fn forward(&self, q: &Tensor, k: &Tensor, v: &Tensor, offsets: &[usize]) -> Result<Tensor> {
        let dtype = q.dtype();
        let tile = self.mask_tile(offsets, stat_dtype(dtype), q.device())?;
        let mut parts = Vec::new();
        for (start, len) in sequences(offsets) {
            let kv = self.seq_kv(k, v, start, len)?;
            for i0 in (0..len).step_by(kv.rows) {
                let br = kv.rows.min(len - i0);
                let qb = self.q_block(q, start + i0, br)?;
                let p = self.probs(&qb, &kv, &tile, i0, br)?.to_dtype(dtype)?;
                let o = p.matmul(&kv.v.narrow(1, 0, i0 + br)?)?;
                parts.push(self.unblock(&o, br)?.contiguous()?);
            }
        }
        Tensor::cat(&parts, 0)
    }

    /// Gradients `(dq, dk, dv)` given the output `o` and its gradient `go` (all packed).
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        go: &Tensor,
        offsets: &[usize],
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let dtype = q.dtype();
        let sdt = stat_dtype(dtype);
        let (hkv, g, d) = (self.hkv, self.group(), self.d);
        let tile = self.mask_tile(offsets, sdt, q.device())?;
        // Dᵢ = Σ_d o·do per (token, head), `[T, Hq]`.
        let di = (o.to_dtype(sdt)? * go.to_dtype(sdt)?)?.sum(D::Minus1)?;
        let (mut dq, mut dk, mut dv) = (Vec::new(), Vec::new(), Vec::new());
        for (start, len) in sequences(offsets) {
            let kv = self.seq_kv(k, v, start, len)?;
            let mut dk_acc: Option<Tensor> = None;
            let mut dv_acc: Option<Tensor> = None;
            let add = |acc: &mut Option<Tensor>, part: Tensor| -> Result<()> {
                let nk = part.dim(1)?;
                let part = part.to_dtype(sdt)?.pad_with_zeros(1, 0, len - nk)?;
                *acc = Some(match acc.take() {
                    Some(a) => (a + part)?,
                    None => part,
                });
                Ok(())
            };
            for i0 in (0..len).step_by(kv.rows) {
                let br = kv.rows.min(len - i0);
                let nk = i0 + br;
                let row0 = start + i0;
                let qb = self.q_block(q, row0, br)?;
                let gb = go
                    .narrow(0, row0, br)?
                    .transpose(0, 1)?
                    .contiguous()?
                    .reshape((hkv, g * br, d))?;
                let dib = di
                    .narrow(0, row0, br)?
                    .t()?
                    .contiguous()?
                    .reshape((hkv, g * br, 1))?;
                let p = self.probs(&qb, &kv, &tile, i0, br)?;
                let (kb, vb) = (kv.k.narrow(1, 0, nk)?, kv.v.narrow(1, 0, nk)?);
                add(&mut dv_acc, p.to_dtype(dtype)?.t()?.matmul(&gb)?)?;
                let dp = gb.matmul(&vb.t()?)?.to_dtype(sdt)?;
                let ds = (p * dp.broadcast_sub(&dib)?)?.to_dtype(dtype)?;
                dq.push(
                    self.unblock(&(ds.matmul(&kb)? * self.scale)?, br)?
                        .contiguous()?,
                );
                add(&mut dk_acc, ds.t()?.matmul(&qb)?)?;
            }
            let finish = |acc: Option<Tensor>| -> Result<Tensor> {
                match acc {
                    Some(a) => a.to_dtype(dtype)?.transpose(0, 1)?.contiguous(),
                    None => bail!("attention backward: empty sequence"),
                }
            };
            dk.push(finish(dk_acc)?);
            dv.push(finish(dv_acc)?);
        }
        Ok((
            Tensor::cat(&dq, 0)?,
            Tensor::cat(&dk, 0)?,
            Tensor::cat(&dv, 0)?,
        ))
    }
}

/// The graph node of [`packed_causal_attention`](super::packed_causal_attention).
struct AttentionNode {
    attn: Attn,
    offsets: Vec<usize>,
    out: Precomputed,
}

impl CustomOp3 for AttentionNode {
    fn name(&self) -> &'static str {
        "rlreplay-blockwise-attention"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.out.cpu(self.name())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        self.out.cuda(self.name())
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dq, dk, dv) = self.attn.backward(q, k, v, res, grad, &self.offsets)?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

/// Block-diagonal causal attention over packed sequences (the semantics of
/// [`super::packed_causal_attention`]), blockwise with at most `block_elems` score elements per
/// block; the backward pass recomputes each block. Inputs are checked by the caller.
pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seq_offsets: &[usize],
    scale: f64,
    block_elems: usize,
) -> Result<Tensor> {
    let (_, hq, d) = q.dims3()?;
    let attn = Attn {
        hq,
        hkv: k.dim(1)?,
        d,
        scale,
        elems: block_elems.max(1),
    };
    let (qd, kd, vd) = (q.detach(), k.detach(), v.detach());
    let out = attn.forward(&qd, &kd, &vd, seq_offsets)?;
    if !(q.track_op() || k.track_op() || v.track_op()) {
        return Ok(out);
    }
    let node = AttentionNode {
        attn,
        offsets: seq_offsets.to_vec(),
        out: Precomputed::new(out),
    };
    q.apply_op3(k, v, node)
}

/// The chunked log-prob head: sizes and targets.
struct Head {
    /// Target token of every row, `[N]` u32 on the device.
    targets: Tensor,
    temperature: f64,
    entropy: bool,
    /// Rows per chunk.
    rows: usize,
}

impl Head {
    /// Tempered logits `[n, V]` (stat dtype) of rows `r0..r0 + n`.
    fn logits(&self, hidden: &Tensor, w: &Tensor, r0: usize, n: usize) -> Result<Tensor> {
        let h = hidden.narrow(0, r0, n)?;
        let z = h.matmul(&w.t()?)?.to_dtype(stat_dtype(hidden.dtype()))?;
        z.affine(1.0 / self.temperature, 0.0)
    }

    fn chunk_targets(&self, r0: usize, n: usize) -> Result<Tensor> {
        self.targets.narrow(0, r0, n)?.reshape((n, 1))
    }

    /// `[N, 3]` (log-prob, entropy or 0, logsumexp) in the stat dtype.
    fn forward(&self, hidden: &Tensor, w: &Tensor) -> Result<Tensor> {
        let n = hidden.dim(0)?;
        let mut parts = Vec::new();
        for r0 in (0..n).step_by(self.rows) {
            let len = self.rows.min(n - r0);
            let z = self.logits(hidden, w, r0, len)?;
            let max = z.max_keepdim(D::Minus1)?;
            let shifted = z.broadcast_sub(&max)?;
            let e = shifted.exp()?;
            let sum = e.sum_keepdim(D::Minus1)?;
            let lse = (sum.log()? + &max)?;
            let target = z.gather(&self.chunk_targets(r0, len)?, D::Minus1)?;
            let lp = (target - &lse)?;
            let ent = if self.entropy {
                // H = lse − Σ p·z with p = e / sum.
                let pz = ((e * &z)?.sum_keepdim(D::Minus1)? / &sum)?;
                (&lse - pz)?
            } else {
                lp.zeros_like()?
            };
            parts.push(Tensor::cat(&[lp, ent, lse], 1)?);
        }
        Tensor::cat(&parts, 0)
    }

    /// Gradients of the hidden states and the lm_head given the output `res` and its gradient
    /// `grad` (`[N, 3]`); each chunk's logits are recomputed. Without `weight_grad` (a frozen
    /// lm_head) the `dW` products are skipped and the lm_head gets `None`.
    fn backward(
        &self,
        hidden: &Tensor,
        w: &Tensor,
        res: &Tensor,
        grad: &Tensor,
        weight_grad: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let dtype = hidden.dtype();
        let sdt = stat_dtype(dtype);
        let n = hidden.dim(0)?;
        let inv_t = 1.0 / self.temperature;
        let mut dh = Vec::new();
        let mut dw: Option<Tensor> = None;
        for r0 in (0..n).step_by(self.rows) {
            let len = self.rows.min(n - r0);
            let col = |t: &Tensor, c: usize| t.narrow(0, r0, len)?.narrow(1, c, 1);
            let gl = col(grad, 0)?.to_dtype(sdt)?;
            let z = self.logits(hidden, w, r0, len)?;
            let p = candle_nn::ops::softmax_last_dim(&z)?;
            // dℓ/dz = (onehot(target) − p)/τ, and for the entropy −p·(log p + H)/τ.
            let mut coef = p.broadcast_mul(&gl)?;
            if self.entropy {
                let ge = col(grad, 1)?.to_dtype(sdt)?;
                let (ent, lse) = (col(res, 1)?, col(res, 2)?);
                let logp = z.broadcast_sub(&lse)?;
                coef = (coef + (p * logp.broadcast_add(&ent)?)?.broadcast_mul(&ge)?)?;
            }
            let dz = coef.affine(-inv_t, 0.0)?.contiguous()?;
            dz.scatter_add_set(&self.chunk_targets(r0, len)?, &gl.affine(inv_t, 0.0)?, 1)?;
            let dz = dz.to_dtype(dtype)?;
            dh.push(dz.matmul(w)?);
            if !weight_grad {
                continue;
            }
            let part = dz.t()?.matmul(&hidden.narrow(0, r0, len)?)?.to_dtype(sdt)?;
            dw = Some(match dw {
                Some(acc) => (acc + part)?,
                None => part,
            });
        }
        let dw = match (dw, weight_grad) {
            (Some(dw), _) => Some(dw.to_dtype(w.dtype())?),
            (None, true) => Some(w.zeros_like()?),
            (None, false) => None,
        };
        Ok((Tensor::cat(&dh, 0)?, dw))
    }
}

/// The graph node of [`token_logprobs`].
struct HeadNode {
    head: Head,
    out: Precomputed,
}

impl CustomOp2 for HeadNode {
    fn name(&self) -> &'static str {
        "rlreplay-blockwise-token-logprobs"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.out.cpu(self.name())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        self.out.cuda(self.name())
    }

    fn bwd(
        &self,
        hidden: &Tensor,
        lm_head: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let weight_grad = lm_head.track_op();
        let (dh, dw) = self
            .head
            .backward(hidden, lm_head, res, grad, weight_grad)?;
        Ok((Some(dh), dw))
    }
}

/// Per-token log-probs and entropies through the lm_head (the semantics of
/// [`super::token_logprobs`]) in chunks of at most `chunk_elems` logits; the backward pass
/// recomputes each chunk's logits. Returns `[N, 3]` (log-prob, entropy or 0, logsumexp) in at
/// least f32. Inputs are checked by the caller; `N > 0`.
pub(crate) fn token_logprobs(
    hidden: &Tensor,
    lm_head: &Tensor,
    targets: &[u32],
    temperature: f64,
    want_entropy: bool,
    chunk_elems: usize,
) -> Result<Tensor> {
    let vocab = lm_head.dim(0)?;
    let head = Head {
        targets: Tensor::new(targets, hidden.device())?,
        temperature,
        entropy: want_entropy,
        rows: (chunk_elems / vocab.max(1)).clamp(1, targets.len().max(1)),
    };
    let out = head.forward(&hidden.detach(), &lm_head.detach())?;
    if !(hidden.track_op() || lm_head.track_op()) {
        return Ok(out);
    }
    let node = HeadNode {
        head,
        out: Precomputed::new(out),
    };
    hidden.apply_op2(lm_head, node)
}
