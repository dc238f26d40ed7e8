//! Fused SwiGLU `silu(gate) * up` with backward for both inputs.

use super::cpu::{slice, storage, tensor, with_slices, Real};
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// `silu(gate) * up`, elementwise.
pub(crate) struct SwiGlu;

/// Elements per parallel task.
const TASK: usize = 1 << 14;

/// `out = sigmoid(g) = 1 / (1 + exp(-g))` elementwise.
fn sigmoid<T: Real>(out: &mut [T], g: &[T]) {
    for (o, &g) in out.iter_mut().zip(g) {
        *o = -g;
    }
    T::exp_in_place(out);
    out.iter_mut().for_each(|o| *o = (T::one() + *o).recip());
}

fn fwd<T: Real>(gate: &[T], up: &[T]) -> Vec<T> {
    let mut out = vec![T::zero(); gate.len()];
    out.par_chunks_mut(TASK)
        .zip(gate.par_chunks(TASK).zip(up.par_chunks(TASK)))
        .for_each(|(o, (g, u))| {
            sigmoid(o, g);
            for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                *o = g * *o * u;
            }
        });
    out
}

fn bwd<T: Real>(gate: &[T], up: &[T], grad: &[T]) -> (Vec<T>, Vec<T>) {
    let mut dg = vec![T::zero(); gate.len()];
    let mut du = vec![T::zero(); gate.len()];
    dg.par_chunks_mut(TASK)
        .zip(du.par_chunks_mut(TASK))
        .zip(
            gate.par_chunks(TASK)
                .zip(up.par_chunks(TASK))
                .zip(grad.par_chunks(TASK)),
        )
        .for_each(|((dg, du), ((g, u), go))| {
            // du holds the sigmoid until it is overwritten.
            sigmoid(du, g);
            for i in 0..g.len() {
                let s = du[i];
                let silu = g[i] * s;
                du[i] = go[i] * silu;
                dg[i] = go[i] * u[i] * s * (T::one() + g[i] * (T::one() - s));
            }
        });
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
        match s1 {
            CpuStorage::F32(_) => Ok(storage(
                fwd::<f32>(slice(n, s1, l1)?, slice(n, s2, l2)?),
                l1.shape().clone(),
            )),
            CpuStorage::F64(_) => Ok(storage(
                fwd::<f64>(slice(n, s1, l1)?, slice(n, s2, l2)?),
                l1.shape().clone(),
            )),
            _ => bail!("{n}: unsupported dtype {:?}", s1.dtype()),
        }
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
        let (dg, du) = match gate.dtype() {
            candle_core::DType::F32 => run::<f32>(gate, up, grad)?,
            candle_core::DType::F64 => run::<f64>(gate, up, grad)?,
            dt => bail!("{}: unsupported dtype {dt:?}", self.name()),
        };
        Ok((Some(dg), Some(du)))
    }
}
