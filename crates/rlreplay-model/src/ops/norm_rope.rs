//! RMSNorm of every head followed by the rotary embedding, as one op (Qwen3's query and key
//! norms): the same two kernels, forward and backward, but one graph node instead of two, so
//! candle's backward pass sums one gradient fewer into a fresh zero tensor per use.

use super::cpu::{slice, storage, tensor, with_slices, Real};
use super::norm::RmsNorm;
use super::rope::rotate;
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

/// `rope(rms_norm(x, w))` for `x: [T, heads, D]`, `w: [D]`, with the tables `[T, D/2]` (CPU,
/// contiguous, in x's dtype) held by the op.
pub(crate) struct NormRope {
    pub eps: f64,
    pub cos: Tensor,
    pub sin: Tensor,
}

impl NormRope {
    fn fwd<T: Real>(&self, x: &[T], w: &[T]) -> Result<Vec<T>> {
        let normed = RmsNorm { eps: self.eps }.fwd(x, w);
        with_slices::<T, _>(self.name(), &[&self.cos, &self.sin], |s| {
            Ok(rotate(&normed, s[0], s[1], w.len() / 2, T::one()))
        })
    }
}

impl CustomOp2 for NormRope {
    fn name(&self) -> &'static str {
        "rlreplay-norm-rope"
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
        match (s1, s2) {
            (CpuStorage::F32(_), CpuStorage::F32(_)) => Ok(storage(
                self.fwd::<f32>(slice(n, s1, l1)?, slice(n, s2, l2)?)?,
                shape,
            )),
            (CpuStorage::F64(_), CpuStorage::F64(_)) => Ok(storage(
                self.fwd::<f64>(slice(n, s1, l1)?, slice(n, s2, l2)?)?,
                shape,
            )),
            _ => bail!("{n}: unsupported dtype {:?}", s1.dtype()),
        }
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        fn run<T: Real>(op: &NormRope, [x, w, g]: [&Tensor; 3]) -> Result<(Tensor, Tensor)> {
            let (dx, dw) = with_slices::<T, _>(op.name(), &[x, w, g, &op.cos, &op.sin], |s| {
                let half = s[1].len() / 2;
                let g_normed = rotate(s[2], s[3], s[4], half, -T::one());
                RmsNorm { eps: op.eps }.bwd_t(s[0], s[1], &g_normed)
            })?;
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
