//! The gated half of the SwiGLU MLP, `silu(x · W_gateᵀ) · (x · W_upᵀ)`, as one op: forward two
//! gemms and the gating, backward the gating's gradients and three gemms, `dx = d_gate · W_gate +
//! d_up · W_up` accumulated by the second gemm into the first one's buffer. As three ops, the two
//! projections' outputs and their gradients were graph nodes of their own, each gradient summed
//! into a fresh zero tensor by candle's backward pass, and `dx` the sum of two more.

use super::cpu::{
    by_real_dtype, gemm, gemm_new, slice, storage, tensor, with_slices, MatRef, Real,
};
use super::linear::a_bt;
use super::swiglu;
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};
use std::sync::Mutex;

/// `x [T, H]`, `W_gate [I, H]`, `W_up [I, H]` → `silu(x · W_gateᵀ) · (x · W_upᵀ)` `[T, I]`; the
/// forward pass keeps both projections for the backward pass.
pub(crate) struct GatedUp {
    /// `(x · W_gateᵀ, x · W_upᵀ)`, written by the forward pass.
    saved: Mutex<Option<(CpuStorage, CpuStorage)>>,
    /// Whether the weights get gradients (`false` for frozen ones: only the `dx` gemms run).
    weight_grad: bool,
}

impl GatedUp {
    /// The op; without `weight_grad` its backward pass computes no weight gradients.
    pub(crate) fn new(weight_grad: bool) -> Self {
        Self {
            saved: Mutex::new(None),
            weight_grad,
        }
    }
}

/// The gradients `dW_gate`, `dW_up` of the MLP's weights.
type WeightGrads<T> = Option<(Vec<T>, Vec<T>)>;

/// `(dx, dW_gate, dW_up)` for `x [T, H]`, the weights `[I, H]`, the saved projections and the
/// output gradient `[T, I]`; the weight gradients only with `weight_grad`.
fn bwd_t<T: Real>(
    [x, wg, wu, gate, up, g]: [&[T]; 6],
    h: usize,
    weight_grad: bool,
) -> Result<(Vec<T>, WeightGrads<T>)> {
    let t = x.len() / h.max(1);
    let i = wg.len() / h.max(1);
    let (dgate, dup) = swiglu::bwd(gate, up, g);
    let xm = MatRef::rows(x, 0, t, h, h);
    let (wgm, wum) = (MatRef::rows(wg, 0, i, h, h), MatRef::rows(wu, 0, i, h, h));
    let (dgm, dum) = (
        MatRef::rows(&dgate, 0, t, i, i),
        MatRef::rows(&dup, 0, t, i, i),
    );
    let dx = || {
        let mut dx = gemm_new(dgm, wgm, T::one(), true)?;
        gemm(&mut dx, 0, h, true, dum, wum, T::one(), true)?;
        Ok::<_, candle_core::Error>(dx)
    };
    if !weight_grad {
        return Ok((dx()?, None));
    }
    // The three products are independent: run side by side, each small gemm keeps a thread busy
    // without waiting on the others' synchronisation.
    let (dx, (dwg, dwu)) = rayon::join(dx, || {
        rayon::join(
            || gemm_new(dgm.t(), xm, T::one(), true),
            || gemm_new(dum.t(), xm, T::one(), true),
        )
    });
    Ok((dx?, Some((dwg?, dwu?))))
}

impl CustomOp3 for GatedUp {
    fn name(&self) -> &'static str {
        "rlreplay-gated-up"
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
            op: &GatedUp,
            [(s1, l1), (s2, l2), (s3, l3)]: [(&CpuStorage, &Layout); 3],
        ) -> Result<(CpuStorage, Shape)> {
            let n = op.name();
            let (t, h) = l1.shape().dims2()?;
            let (i, h2) = l2.shape().dims2()?;
            if h != h2 || l3.dims() != l2.dims() {
                bail!(
                    "{n}: x {:?}, gate {:?} and up {:?} do not match",
                    l1.dims(),
                    l2.dims(),
                    l3.dims()
                );
            }
            let x = slice::<T>(n, s1, l1)?;
            let (wg, wu) = (slice::<T>(n, s2, l2)?, slice::<T>(n, s3, l3)?);
            let (gate, up) = rayon::join(|| a_bt(x, wg, h), || a_bt(x, wu, h));
            let (gate, up) = (gate?, up?);
            let out = swiglu::fwd(&gate, &up);
            *op.saved
                .lock()
                .map_err(|_| candle_core::Error::Msg(format!("{n}: poisoned lock")))? =
                Some((T::to_cpu_storage_owned(gate), T::to_cpu_storage_owned(up)));
            Ok(storage(out, (t, i)))
        }
        let args = [(s1, l1), (s2, l2), (s3, l3)];
        by_real_dtype!(self.name(), s1.dtype(), run(self, args))
    }

    fn bwd(
        &self,
        x: &Tensor,
        wg: &Tensor,
        wu: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        fn run<T: Real>(
            op: &GatedUp,
            [x, wg, wu, g]: [&Tensor; 4],
        ) -> Result<(Tensor, Option<(Tensor, Tensor)>)> {
            let n = op.name();
            let guard = op
                .saved
                .lock()
                .map_err(|_| candle_core::Error::Msg(format!("{n}: poisoned lock")))?;
            let Some((gate, up)) = guard.as_ref() else {
                bail!("{n}: backward called before forward");
            };
            let (gate, up) = (T::cpu_storage_as_slice(gate)?, T::cpu_storage_as_slice(up)?);
            let h = x.dims()[1];
            let (dx, dw) = with_slices::<T, _>(n, &[x, wg, wu, g], |s| {
                bwd_t([s[0], s[1], s[2], gate, up, s[3]], h, op.weight_grad)
            })?;
            let dw = match dw {
                Some((dwg, dwu)) => Some((tensor(dwg, wg.shape())?, tensor(dwu, wu.shape())?)),
                None => None,
            };
            Ok((tensor(dx, x.shape())?, dw))
        }
        let args = [x, wg, wu, grad];
        let (dx, dw) = by_real_dtype!(self.name(), x.dtype(), run(self, args))?;
        let (dwg, dwu) = dw.unzip();
        Ok((Some(dx), dwg, dwu))
    }
}
