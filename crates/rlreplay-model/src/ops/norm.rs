//! Fused RMSNorm with backward (gradients for the input and the weight).

use super::cpu::{
    by_real_dtype, c, dot, dot3, new_written, rows_per_task, slice, storage, tensor, with_slices,
    Real,
};
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// `y = x * r * w` with `r = 1 / sqrt(mean(x²) + eps)` per row.
pub(crate) struct RmsNorm {
    pub eps: f64,
}

/// Inverse root-mean-square of one row.
#[inline]
fn rinv<T: Real>(row: &[T], eps: f64) -> T {
    let ss = dot(row, row);
    (ss / c::<T>(row.len() as f64) + c::<T>(eps)).sqrt().recip()
}

impl RmsNorm {
    /// The normalised rows of `x`, times `w`.
    pub(super) fn fwd<T: Real>(&self, x: &[T], w: &[T]) -> Vec<T> {
        let h = w.len();
        let rows = rows_per_task(h, 1 << 14);
        // SAFETY: `out` and `x` have the same length, so their chunks (of `h` elements but for a
        // shorter last one) pair up with equal lengths, and the loop writes every element of each
        // (`w` has `h` elements).
        let out = unsafe {
            new_written(x.len(), |out| {
                out.par_chunks_mut(rows * h)
                    .zip(x.par_chunks(rows * h))
                    .for_each(|(o, x)| {
                        for (o, x) in o.chunks_mut(h).zip(x.chunks(h)) {
                            let r = rinv(x, self.eps);
                            for ((o, &x), &w) in o.iter_mut().zip(x).zip(w) {
                                o.write(x * r * w);
                            }
                        }
                    })
            })
        };
        out
    }

    /// The gradients `(dx, dw)` for the output gradient `g`.
    pub(super) fn bwd_t<T: Real>(&self, x: &[T], w: &[T], g: &[T]) -> Result<(Vec<T>, Vec<T>)> {
        if g.len() != x.len() {
            bail!(
                "{}: gradient of {} elements for {}",
                self.name(),
                g.len(),
                x.len()
            );
        }
        let h = w.len();
        let inv_h = c::<T>(1.0 / h as f64);
        let mut dx = Vec::with_capacity(x.len());
        let rows = rows_per_task(h, 1 << 14);
        // Fixed-size tasks and an ordered reduction keep the weight gradient deterministic.
        let partials: Vec<Vec<T>> = dx.spare_capacity_mut()[..x.len()]
            .par_chunks_mut(rows * h)
            .zip(x.par_chunks(rows * h).zip(g.par_chunks(rows * h)))
            .map(|(dx, (x, g))| {
                let mut dw = vec![T::zero(); h];
                for ((dx, x), g) in dx.chunks_mut(h).zip(x.chunks(h)).zip(g.chunks(h)) {
                    let r = rinv(x, self.eps);
                    let k = r * r * r * dot3(g, w, x) * inv_h;
                    // Sliced to `h` so that the loop runs without bounds checks (and vectorises).
                    let (dx, x, g, w, dw) = (&mut dx[..h], &x[..h], &g[..h], &w[..h], &mut dw[..h]);
                    for i in 0..h {
                        dx[i].write(r * g[i] * w[i] - x[i] * k);
                        dw[i] += g[i] * x[i] * r;
                    }
                }
                dw
            })
            .collect();
        // SAFETY: `dx`, `x` and `g` have the same length, so their chunks pair up with equal
        // lengths and cover `dx`; the loop above writes `dx[0..h]` of each (slicing panics,
        // before this line, if a chunk were shorter).
        unsafe { dx.set_len(x.len()) };
        let mut dw = vec![T::zero(); h];
        for p in partials {
            for (a, b) in dw.iter_mut().zip(p) {
                *a += b;
            }
        }
        Ok((dx, dw))
    }
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "rlreplay-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let n = self.name();
        let shape = l1.shape().clone();
        by_real_dtype!(n, s1.dtype(), |T| Ok(storage(
            self.fwd::<T>(slice(n, s1, l1)?, slice(n, s2, l2)?),
            shape,
        )))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        fn run<T: Real>(
            op: &RmsNorm,
            x: &Tensor,
            w: &Tensor,
            g: &Tensor,
        ) -> Result<(Tensor, Tensor)> {
            let (dx, dw) =
                with_slices::<T, _>(op.name(), &[x, w, g], |s| op.bwd_t(s[0], s[1], s[2]))?;
            Ok((tensor(dx, x.shape())?, tensor(dw, w.shape())?))
        }
        let (dx, dw) = by_real_dtype!(self.name(), x.dtype(), run(self, x, w, grad))?;
        Ok((Some(dx), Some(dw)))
    }
}
