//! Fused SwiGLU `silu(gate) * up` with backward for both inputs.

use super::cpu::{
    assume_written, by_real_dtype, new_written, slice, storage, tensor, with_slices, Real,
};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// `silu(gate) * up`, elementwise.
pub(crate) struct SwiGlu;

/// Elements per parallel task.
const TASK: usize = 1 << 14;

/// `sigmoid(g) = 1 / (1 + exp(-g))` elementwise into `out` (as long as `g`), which it writes
/// before reading.
fn sigmoid<'a, T: Real>(out: &'a mut [MaybeUninit<T>], g: &[T]) -> &'a mut [T] {
    for (o, &g) in out.iter_mut().zip(g) {
        o.write(-g);
    }
    // SAFETY: `out` and `g` have the same length, so the loop above wrote every element.
    let out = unsafe { assume_written(out) };
    T::exp_in_place(out);
    out.iter_mut().for_each(|o| *o = (T::one() + *o).recip());
    out
}

/// `silu(gate) · up`.
pub(super) fn fwd<T: Real>(gate: &[T], up: &[T]) -> Vec<T> {
    // SAFETY: `out` and `gate` have the same length, so their chunks pair up with equal lengths
    // and cover `out`, and `sigmoid` writes every element of its chunk (slicing `up` panics,
    // before `new_written` returns, if it were shorter).
    unsafe {
        new_written(gate.len(), |out| {
            out.par_chunks_mut(TASK)
                .zip(gate.par_chunks(TASK))
                .enumerate()
                .for_each(|(c, (o, g))| {
                    let u = &up[c * TASK..c * TASK + g.len()];
                    let o = sigmoid(o, g);
                    for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                        *o = g * *o * u;
                    }
                })
        })
    }
}

/// The gradients `(d gate, d up)` of `silu(gate) · up` for the output gradient `grad`.
pub(super) fn bwd<T: Real>(gate: &[T], up: &[T], grad: &[T]) -> (Vec<T>, Vec<T>) {
    let n = gate.len();
    let mut dg = Vec::with_capacity(n);
    // SAFETY: `dg`, `du` and `gate` have the same length, so their chunks pair up with equal
    // lengths and cover `dg` and `du`; `sigmoid` writes every element of its chunk of `du`, and
    // the loop every element of its chunk of `dg` (slicing `up` or `grad` panics, before
    // `new_written` returns, if one were shorter).
    let du = unsafe {
        new_written(n, |du| {
            dg.spare_capacity_mut()[..n]
                .par_chunks_mut(TASK)
                .zip(du.par_chunks_mut(TASK))
                .zip(gate.par_chunks(TASK))
                .enumerate()
                .for_each(|(c, ((dg, du), g))| {
                    let (u, go) = (
                        &up[c * TASK..c * TASK + g.len()],
                        &grad[c * TASK..c * TASK + g.len()],
                    );
                    // du holds the sigmoid until it is overwritten.
                    let du = sigmoid(du, g);
                    for i in 0..g.len() {
                        let s = du[i];
                        let silu = g[i] * s;
                        du[i] = go[i] * silu;
                        dg[i].write(go[i] * u[i] * s * (T::one() + g[i] * (T::one() - s)));
                    }
                })
        })
    };
    // SAFETY: see above: the loop wrote all `n` elements of `dg`.
    unsafe { dg.set_len(n) };
    (dg, du)
}

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "rlreplay-swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let n = self.name();
        by_real_dtype!(n, s1.dtype(), |T| Ok(storage(
            fwd::<T>(slice(n, s1, l1)?, slice(n, s2, l2)?),
            l1.shape().clone(),
        )))
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        fn run<T: Real>(gate: &Tensor, up: &Tensor, g: &Tensor) -> Result<(Tensor, Tensor)> {
            let (dg, du) = with_slices::<T, _>("rlreplay-swiglu", &[gate, up, g], |s| {
                Ok(bwd(s[0], s[1], s[2]))
            })?;
            Ok((tensor(dg, gate.shape())?, tensor(du, up.shape())?))
        }
        let (dg, du) = by_real_dtype!(self.name(), gate.dtype(), run(gate, up, grad))?;
        Ok((Some(dg), Some(du)))
    }
}
