//! RMSNorm of every head followed by the rotary embedding, as one op (Qwen3's query and key
//! norms): the same two kernels, forward and backward, but one graph node instead of two, so
//! candle's backward pass sums one gradient fewer into a fresh zero tensor per use.

use super::cpu::{by_real_dtype, slice, storage, tensor, with_slices, Real};
use super::norm::RmsNorm;
use super::rope::rotate;
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

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
        by_real_dtype!(n, s1.dtype(), |T| Ok(storage(
            self.fwd::<T>(slice(n, s1, l1)?, slice(n, s2, l2)?)?,
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
        fn run<T: Real>(op: &NormRope, [x, w, g]: [&Tensor; 3]) -> Result<(Tensor, Tensor)> {
            let (dx, dw) = with_slices::<T, _>(op.name(), &[x, w, g, &op.cos, &op.sin], |s| {
                let half = s[1].len() / 2;
                let g_normed = rotate(s[2], s[3], s[4], half, -T::one());
                RmsNorm { eps: op.eps }.bwd_t(s[0], s[1], &g_normed)
            })?;
            Ok((tensor(dx, x.shape())?, tensor(dw, w.shape())?))
        }
        let args = [x, w, grad];
        let (dx, dw) = by_real_dtype!(self.name(), x.dtype(), run(self, args))?;
        Ok((Some(dx), Some(dw)))
    }
}
