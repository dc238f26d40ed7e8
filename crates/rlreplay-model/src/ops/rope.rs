//! Fused rotary embedding (rotate-half) with backward for the input.

use super::cpu::{by_real_dtype, new_written, slice, storage, tensor, with_slices, Real};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// `x * cos + rotate_half(x) * sin` for `x: [T, heads, D]`, tables `[T, D/2]`.
pub(crate) struct Rope;

/// Rotates every head of `x` by the angles of its token; `sign = -1` applies the inverse rotation
/// (the backward pass).
pub(super) fn rotate<T: Real>(x: &[T], cos: &[T], sin: &[T], half: usize, sign: T) -> Vec<T> {
    let d = 2 * half;
    let t = cos.len() / half.max(1);
    let per_token = x.len().checked_div(t).unwrap_or(0);
    if per_token == 0 {
        return vec![T::zero(); x.len()];
    }
    // SAFETY: the chunks of `out` (per token, then per head) cover it, and the loop writes both
    // halves of every head chunk, `o1[0..half]` and `o2[0..half]` (indexing panics, before
    // `set_len`, if a chunk were shorter than `D = 2 · half`).
    unsafe {
        new_written(x.len(), |out| {
            out.par_chunks_mut(per_token)
                .zip(x.par_chunks(per_token))
                .enumerate()
                .for_each(|(tok, (o, x))| {
                    let cs = &cos[tok * half..(tok + 1) * half];
                    let sn = &sin[tok * half..(tok + 1) * half];
                    for (o, x) in o.chunks_mut(d).zip(x.chunks(d)) {
                        let (x1, x2) = x.split_at(half);
                        let (o1, o2) = o.split_at_mut(half);
                        for i in 0..half {
                            let s = sn[i] * sign;
                            o1[i].write(x1[i] * cs[i] - x2[i] * s);
                            o2[i].write(x2[i] * cs[i] + x1[i] * s);
                        }
                    }
                })
        })
    }
}

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        "rlreplay-rope"
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
        let half = l1.dims()[2] / 2;
        let n = self.name();
        by_real_dtype!(n, s1.dtype(), |T| Ok(storage(
            rotate::<T>(
                slice(n, s1, l1)?,
                slice(n, s2, l2)?,
                slice(n, s3, l3)?,
                half,
                1.0,
            ),
            l1.shape().clone(),
        )))
    }

    fn bwd(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        fn run<T: Real>(x: &Tensor, cos: &Tensor, sin: &Tensor, g: &Tensor) -> Result<Tensor> {
            let half = x.dims()[2] / 2;
            let dx = with_slices::<T, _>("rlreplay-rope", &[g, cos, sin], |s| {
                Ok(rotate(s[0], s[1], s[2], half, -T::one()))
            })?;
            tensor(dx, x.shape())
        }
        let dx = by_real_dtype!(self.name(), x.dtype(), run(x, cos, sin, grad))?;
        Ok((Some(dx), None, None))
    }
}
