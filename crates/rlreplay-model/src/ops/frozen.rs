//! The projection `x · Wᵀ` of a frozen weight (one that does not track gradients, as the base
//! weights under LoRA adapters) from candle's ops, for the devices and dtypes without a
//! hand-written kernel (CUDA, half precision on the CPU). candle's matmul computes the gradients
//! of both operands in its backward pass, `dW` too, only to drop it; here the product is computed
//! without a graph and recorded as a node whose backward pass computes only `dx = dy · W`.

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use super::blockwise::Precomputed;

/// The graph node of [`linear`].
struct FrozenLinear {
    out: Precomputed,
}

impl CustomOp2 for FrozenLinear {
    fn name(&self) -> &'static str {
        "rlreplay-frozen-linear"
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
        _x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(grad.matmul(w)?), None))
    }
}

/// `x · Wᵀ` for `x: [T, in]` and a frozen `w: [out, in]`: `[T, out]`, whose backward pass hands
/// `x` its gradient and computes none for `w`.
pub(super) fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let y = x.detach().matmul(&w.t()?)?;
    x.apply_op2(
        w,
        FrozenLinear {
            out: Precomputed::new(y),
        },
    )
}
