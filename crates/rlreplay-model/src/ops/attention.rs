//! Packed block-diagonal causal attention with grouped KV heads, FlashAttention-2 style on the CPU:
//! the forward pass processes blocks of query rows against the keys they may see, keeps only the
//! per-row logsumexp, and the backward pass recomputes the probabilities block by block. Memory is
//! `O(block × L)` per worker, never `O(T²)`, and K/V are read in place for every query head of
//! their group.

use super::cpu::{
    by_real_dtype, c, dot, gemm, max, slice, storage, sum, tensor, with_slices, MatRef, Real,
};
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::sync::Mutex;

/// Query rows per block.
const BLOCK: usize = 64;

/// The attention op; the forward pass stores the logsumexp of every (token, query head).
pub(crate) struct PackedAttention {
    /// Sequence boundaries `[0, .., T]`.
    pub offsets: Vec<usize>,
    /// Score scale (usually `1/sqrt(D)`).
    pub scale: f64,
    /// `[T, Hq]` logsumexp of the scaled scores, written by the forward pass.
    pub lse: Mutex<Option<CpuStorage>>,
}

/// Sizes of the packed q/k/v tensors.
#[derive(Clone, Copy)]
struct Dims {
    hq: usize,
    hkv: usize,
    d: usize,
}

impl Dims {
    fn group(&self) -> usize {
        self.hq / self.hkv
    }
}

impl PackedAttention {
    /// Non-empty sequences as `(start, len)`.
    fn seqs(&self) -> Vec<(usize, usize)> {
        self.offsets
            .windows(2)
            .filter(|w| w[1] > w[0])
            .map(|w| (w[0], w[1] - w[0]))
            .collect()
    }

    /// Forward pass of one query head of one sequence: `(out [L, D], lse [L])`.
    #[allow(clippy::too_many_arguments)]
    fn fwd_unit<T: Real>(
        &self,
        q: &[T],
        k: &[T],
        v: &[T],
        dims: Dims,
        start: usize,
        len: usize,
        h: usize,
    ) -> Result<(Vec<T>, Vec<T>)> {
        let Dims { hq, hkv, d } = dims;
        let g = h / dims.group();
        let mut out = vec![T::zero(); len * d];
        let mut lse = vec![T::zero(); len];
        let mut s = vec![T::zero(); BLOCK.min(len) * len];
        for i0 in (0..len).step_by(BLOCK) {
            let br = BLOCK.min(len - i0);
            let nk = i0 + br;
            let qm = MatRef::rows(q, ((start + i0) * hq + h) * d, br, d, hq * d);
            let km = MatRef::rows(k, (start * hkv + g) * d, nk, d, hkv * d);
            let vm = MatRef::rows(v, (start * hkv + g) * d, nk, d, hkv * d);
            gemm(&mut s, 0, nk, false, qm, km.t(), c(self.scale), false)?;
            for r in 0..br {
                let i = i0 + r;
                let row = &mut s[r * nk..(r + 1) * nk];
                let (seen, masked) = row.split_at_mut(i + 1);
                let m = max(seen);
                seen.iter_mut().for_each(|x| *x -= m);
                T::exp_in_place(seen);
                let total = sum(seen);
                let inv = total.recip();
                seen.iter_mut().for_each(|x| *x *= inv);
                masked.fill(T::zero());
                lse[i] = m + total.ln();
            }
            let pm = MatRef::rows(&s, 0, br, nk, nk);
            gemm(&mut out, i0 * d, d, false, pm, vm, T::one(), false)?;
        }
        Ok((out, lse))
    }

    fn fwd<T: Real>(&self, q: &[T], k: &[T], v: &[T], dims: Dims) -> Result<(Vec<T>, Vec<T>)> {
        let Dims { hq, d, .. } = dims;
        let units: Vec<(usize, usize, usize)> = self
            .seqs()
            .into_iter()
            .flat_map(|(st, len)| (0..hq).map(move |h| (st, len, h)))
            .collect();
        let parts = units
            .par_iter()
            .map(|&(st, len, h)| self.fwd_unit(q, k, v, dims, st, len, h))
            .collect::<Result<Vec<_>>>()?;
        // The sequences cover the tokens in order, so writing token by token, head by head fills
        // `[T, Hq, D]` without zeroing it first.
        let mut out = Vec::with_capacity(q.len());
        let mut lse = Vec::with_capacity(q.len() / d);
        for seq in parts.chunks(hq.max(1)) {
            for i in 0..seq.first().map_or(0, |(_, l)| l.len()) {
                for (o, l) in seq {
                    out.extend_from_slice(&o[i * d..(i + 1) * d]);
                    lse.push(l[i]);
                }
            }
        }
        Ok((out, lse))
    }

    /// Backward pass of one KV head of one sequence, covering every query head of its group:
    /// `(dq [G, L, D], dk [L, D], dv [L, D])`.
    #[allow(clippy::too_many_arguments)]
    fn bwd_unit<T: Real>(
        &self,
        [q, k, v, o, go]: [&[T]; 5],
        lse: &[T],
        dims: Dims,
        start: usize,
        len: usize,
        g: usize,
    ) -> Result<(Vec<T>, Vec<T>, Vec<T>)> {
        let Dims { hq, hkv, d } = dims;
        let group = dims.group();
        let scale: T = c(self.scale);
        let mut dq = vec![T::zero(); group * len * d];
        let mut dk = vec![T::zero(); len * d];
        let mut dv = vec![T::zero(); len * d];
        let mut p = vec![T::zero(); BLOCK.min(len) * len];
        let mut dp = vec![T::zero(); BLOCK.min(len) * len];
        let km_all = MatRef::rows(k, (start * hkv + g) * d, len, d, hkv * d);
        let vm_all = MatRef::rows(v, (start * hkv + g) * d, len, d, hkv * d);
        for hh in 0..group {
            let h = g * group + hh;
            for i0 in (0..len).step_by(BLOCK) {
                let br = BLOCK.min(len - i0);
                let nk = i0 + br;
                let row0 = ((start + i0) * hq + h) * d;
                let qm = MatRef::rows(q, row0, br, d, hq * d);
                let gm = MatRef::rows(go, row0, br, d, hq * d);
                let km = MatRef { rows: nk, ..km_all };
                let vm = MatRef { rows: nk, ..vm_all };
                gemm(&mut p, 0, nk, false, qm, km.t(), scale, false)?;
                gemm(&mut dp, 0, nk, false, gm, vm.t(), T::one(), false)?;
                for r in 0..br {
                    let i = i0 + r;
                    let tok = (start + i) * hq + h;
                    let l = lse[tok];
                    let orow = &o[tok * d..(tok + 1) * d];
                    let grow = &go[tok * d..(tok + 1) * d];
                    let di = dot(orow, grow);
                    let prow = &mut p[r * nk..(r + 1) * nk];
                    let dsrow = &mut dp[r * nk..(r + 1) * nk];
                    let (seen, masked) = prow.split_at_mut(i + 1);
                    seen.iter_mut().for_each(|x| *x -= l);
                    T::exp_in_place(seen);
                    for (ds, &p) in dsrow.iter_mut().zip(seen.iter()) {
                        *ds = p * (*ds - di);
                    }
                    masked.fill(T::zero());
                    dsrow[i + 1..].fill(T::zero());
                }
                let pm = MatRef::rows(&p, 0, br, nk, nk);
                let dsm = MatRef::rows(&dp, 0, br, nk, nk);
                gemm(&mut dv, 0, d, true, pm.t(), gm, T::one(), false)?;
                gemm(
                    &mut dq,
                    (hh * len + i0) * d,
                    d,
                    false,
                    dsm,
                    km,
                    scale,
                    false,
                )?;
                gemm(&mut dk, 0, d, true, dsm.t(), qm, scale, false)?;
            }
        }
        Ok((dq, dk, dv))
    }

    #[allow(clippy::type_complexity)]
    fn bwd_t<T: Real>(
        &self,
        qkvog: [&[T]; 5],
        lse: &[T],
        dims: Dims,
    ) -> Result<(Vec<T>, Vec<T>, Vec<T>)> {
        let Dims { hkv, d, .. } = dims;
        let group = dims.group();
        let units: Vec<(usize, usize, usize)> = self
            .seqs()
            .into_iter()
            .flat_map(|(st, len)| (0..hkv).map(move |g| (st, len, g)))
            .collect();
        let parts = units
            .par_iter()
            .map(|&(st, len, g)| self.bwd_unit(qkvog, lse, dims, st, len, g))
            .collect::<Result<Vec<_>>>()?;
        // As in the forward pass: token by token, head by head, without zeroing first.
        let mut dq = Vec::with_capacity(qkvog[0].len());
        let mut dk = Vec::with_capacity(qkvog[1].len());
        let mut dv = Vec::with_capacity(qkvog[2].len());
        for (seq, &(_, len, _)) in parts.chunks(hkv).zip(units.iter().step_by(hkv)) {
            for i in 0..len {
                for (pq, pk, pv) in seq {
                    for hh in 0..group {
                        let src = (hh * len + i) * d;
                        dq.extend_from_slice(&pq[src..src + d]);
                    }
                    dk.extend_from_slice(&pk[i * d..(i + 1) * d]);
                    dv.extend_from_slice(&pv[i * d..(i + 1) * d]);
                }
            }
        }
        Ok((dq, dk, dv))
    }
}

/// Dimensions of the q and k layouts.
fn dims_of(q: &[usize], k: &[usize]) -> Dims {
    Dims {
        hq: q[1],
        hkv: k[1],
        d: q[2],
    }
}

impl CustomOp3 for PackedAttention {
    fn name(&self) -> &'static str {
        "rlreplay-packed-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        fn run<T: Real>(
            op: &PackedAttention,
            [s1, s2, s3]: [(&CpuStorage, &Layout); 3],
        ) -> Result<(CpuStorage, Shape)> {
            let n = op.name();
            let dims = dims_of(s1.1.dims(), s2.1.dims());
            let (out, lse) = op.fwd::<T>(
                slice(n, s1.0, s1.1)?,
                slice(n, s2.0, s2.1)?,
                slice(n, s3.0, s3.1)?,
                dims,
            )?;
            *op.lse
                .lock()
                .map_err(|_| candle_core::Error::Msg(format!("{n}: poisoned lock")))? =
                Some(T::to_cpu_storage_owned(lse));
            Ok(storage(out, s1.1.shape().clone()))
        }
        let args = [(s1, l1), (s2, l2), (s3, l3)];
        by_real_dtype!(self.name(), s1.dtype(), run(self, args))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        fn run<T: Real>(
            op: &PackedAttention,
            [q, k, v, o, g]: [&Tensor; 5],
        ) -> Result<(Tensor, Tensor, Tensor)> {
            let n = op.name();
            let guard = op
                .lse
                .lock()
                .map_err(|_| candle_core::Error::Msg(format!("{n}: poisoned lock")))?;
            let Some(lse) = guard.as_ref() else {
                bail!("{n}: backward called before forward");
            };
            let lse = T::cpu_storage_as_slice(lse)?;
            let dims = dims_of(q.dims(), k.dims());
            let (dq, dk, dv) = with_slices::<T, _>(n, &[q, k, v, o, g], |s| {
                op.bwd_t([s[0], s[1], s[2], s[3], s[4]], lse, dims)
            })?;
            Ok((
                tensor(dq, q.shape())?,
                tensor(dk, k.shape())?,
                tensor(dv, v.shape())?,
            ))
        }
        let args = [q, k, v, res, grad];
        let (dq, dk, dv) = by_real_dtype!(self.name(), q.dtype(), run(self, args))?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}
