//! The projection `y = x · Wᵀ` with its own backward, `dx = dy · W` and `dW = dyᵀ · x`, each one
//! gemm into a fresh buffer (not zeroed first). Through candle's matmul the weight enters as the
//! view `Wᵀ`, so its backward materialises `dWᵀ`, adds it to a zero tensor, then transposes that
//! into another.

use super::cpu::{gemm_new, slice, storage, tensor, with_slices, MatRef, Real};
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

/// `x [T, in]`, `W [out, in]` → `x · Wᵀ [T, out]`.
pub(crate) struct Linear;

/// `a · bᵀ` for row-major `a [m, k]` and `b [n, k]`.
fn a_bt<T: Real>(a: &[T], b: &[T], k: usize) -> Result<Vec<T>> {
    let (m, n) = (a.len() / k.max(1), b.len() / k.max(1));
    let (am, bm) = (MatRef::rows(a, 0, m, k, k), MatRef::rows(b, 0, n, k, k));
    gemm_new(am, bm.t(), T::one(), true)
}

/// `(dy · W, dyᵀ · x)` for `x [T, in]`, `W [out, in]`, `dy [T, out]`.
fn bwd_t<T: Real>(x: &[T], w: &[T], dy: &[T], inp: usize) -> Result<(Vec<T>, Vec<T>)> {
    let t = x.len() / inp.max(1);
    let out = w.len() / inp.max(1);
    let (xm, wm) = (
        MatRef::rows(x, 0, t, inp, inp),
        MatRef::rows(w, 0, out, inp, inp),
    );
    let dym = MatRef::rows(dy, 0, t, out, out);
    let dx = gemm_new(dym, wm, T::one(), true)?;
    let dw = gemm_new(dym.t(), xm, T::one(), true)?;
    Ok((dx, dw))
}

impl CustomOp2 for Linear {
    fn name(&self) -> &'static str {
        "rlreplay-linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let n = self.name();
        let (t, k) = l1.shape().dims2()?;
        let (out, k2) = l2.shape().dims2()?;
        if k != k2 {
            bail!(
                "{n}: x {:?} and weight {:?} do not match",
                l1.dims(),
                l2.dims()
            );
        }
        let shape = (t, out);
        match s1 {
            CpuStorage::F32(_) => Ok(storage(
                a_bt::<f32>(slice(n, s1, l1)?, slice(n, s2, l2)?, k)?,
                shape,
            )),
            CpuStorage::F64(_) => Ok(storage(
                a_bt::<f64>(slice(n, s1, l1)?, slice(n, s2, l2)?, k)?,
                shape,
            )),
            _ => bail!("{n}: unsupported dtype {:?}", s1.dtype()),
        }
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        fn run<T: Real>(op: &Linear, [x, w, g]: [&Tensor; 3]) -> Result<(Tensor, Tensor)> {
            let inp = x.dims()[1];
            let (dx, dw) =
                with_slices::<T, _>(op.name(), &[x, w, g], |s| bwd_t(s[0], s[1], s[2], inp))?;
            Ok((tensor(dx, x.shape())?, tensor(dw, w.shape())?))
        }
        let args = [x, w, grad];
        let (dx, dw) = match x.dtype() {
            candle_core::DType::F32 => run::<f32>(self, args)?,
            candle_core::DType::F64 => run::<f64>(self, args)?,
            dt => bail!("{}: unsupported dtype {dt:?}", self.name()),
        };
        Ok((Some(dx), Some(dw)))
    }
}
