//! The projection `y = x · Wᵀ` with its own backward, `dx = dy · W` and `dW = dyᵀ · x`, each one
//! gemm into a fresh buffer (not zeroed first). Through candle's matmul the weight enters as the
//! view `Wᵀ`, so its backward materialises `dWᵀ`, adds it to a zero tensor, then transposes that
//! into another.
//!
//! `x` may be `[T, heads, D]` (read as `[T, heads·D]`) and the output may be split into heads,
//! so the layer needs no reshape nodes around its projections; [`LinearAdd`] adds a residual in
//! the same gemm, so the layer needs no add node after its output projections.
//!
//! A frozen weight (one that does not track gradients, as the base weights under LoRA adapters)
//! gets no gradient: the backward pass skips the `dW` gemm and hands the weight `None`.

use super::cpu::{
    by_real_dtype, c, gemm, gemm_new, slice, storage, tensor, with_slices, MatRef, Real,
};
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};

/// `x [T, in]` (or `[T, a, b]` with `a·b = in`), `W [out, in]` → `x · Wᵀ`, `[T, out]` or, with
/// `heads`, `[T, heads, out / heads]`.
pub(crate) struct Linear {
    /// Heads to split the output into.
    pub heads: Option<usize>,
    /// Whether the weight gets a gradient (`false` for a frozen weight: no `dW` gemm).
    pub weight_grad: bool,
}

/// `x [T, in]` (or `[T, a, b]`), `W [out, in]`, `r [T, out]` → `r + x · Wᵀ`: the gemm accumulates
/// into a copy of `r`, and the backward pass hands `r` the output gradient.
pub(crate) struct LinearAdd {
    /// Whether the weight gets a gradient (`false` for a frozen weight: no `dW` gemm).
    pub weight_grad: bool,
}

/// `a · bᵀ` for row-major `a [m, k]` and `b [n, k]`.
pub(super) fn a_bt<T: Real>(a: &[T], b: &[T], k: usize) -> Result<Vec<T>> {
    let (m, n) = (a.len() / k.max(1), b.len() / k.max(1));
    let (am, bm) = (MatRef::rows(a, 0, m, k, k), MatRef::rows(b, 0, n, k, k));
    gemm_new(am, bm.t(), T::one(), true)
}

/// `(T, in, out)` of `x` and `W`, `x` read as `[T, in]`.
fn dims(op: &str, x: &Layout, w: &Layout) -> Result<(usize, usize, usize)> {
    let (out, inp) = w.shape().dims2()?;
    let t = x.dims().first().copied().unwrap_or(0);
    if x.dims().len() < 2 || t * inp != x.shape().elem_count() {
        bail!(
            "{op}: x {:?} and weight {:?} do not match",
            x.dims(),
            w.dims()
        );
    }
    Ok((t, inp, out))
}

/// `(dy · W, dyᵀ · x)` for `x [T, in]`, `W [out, in]`, `dy [T, out]`; without `weight_grad`
/// only `dy · W`.
fn bwd_t<T: Real>(
    x: &[T],
    w: &[T],
    dy: &[T],
    inp: usize,
    weight_grad: bool,
) -> Result<(Vec<T>, Option<Vec<T>>)> {
    let t = x.len() / inp.max(1);
    let out = w.len() / inp.max(1);
    let (xm, wm) = (
        MatRef::rows(x, 0, t, inp, inp),
        MatRef::rows(w, 0, out, inp, inp),
    );
    let dym = MatRef::rows(dy, 0, t, out, out);
    if !weight_grad {
        return Ok((gemm_new(dym, wm, T::one(), true)?, None));
    }
    // Independent products: side by side (see `mlp::bwd_t`).
    let (dx, dw) = rayon::join(
        || gemm_new(dym, wm, T::one(), true),
        || gemm_new(dym.t(), xm, T::one(), true),
    );
    Ok((dx?, Some(dw?)))
}

/// The gradients `(dx, dW)` of `x · Wᵀ` for the output gradient `grad`, in the shapes of `x`, `W`;
/// `dW` only with `weight_grad`.
fn grads(
    op: &str,
    x: &Tensor,
    w: &Tensor,
    grad: &Tensor,
    weight_grad: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    fn run<T: Real>(
        op: &str,
        [x, w, g]: [&Tensor; 3],
        weight_grad: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let inp = w.dims()[1];
        let (dx, dw) = with_slices::<T, _>(op, &[x, w, g], |s| {
            bwd_t(s[0], s[1], s[2], inp, weight_grad)
        })?;
        let dw = dw.map(|dw| tensor(dw, w.shape())).transpose()?;
        Ok((tensor(dx, x.shape())?, dw))
    }
    let args = [x, w, grad];
    by_real_dtype!(op, x.dtype(), run(op, args, weight_grad))
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
        let (t, k, out) = dims(n, l1, l2)?;
        let shape: Shape = match self.heads {
            Some(h) if h > 0 && out % h == 0 => (t, h, out / h).into(),
            Some(h) => bail!("{n}: {out} outputs do not split into {h} heads"),
            None => (t, out).into(),
        };
        by_real_dtype!(n, s1.dtype(), |T| Ok(storage(
            a_bt::<T>(slice(n, s1, l1)?, slice(n, s2, l2)?, k)?,
            shape,
        )))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw) = grads(self.name(), x, w, grad, self.weight_grad)?;
        Ok((Some(dx), dw))
    }
}

/// `r + a · bᵀ` for row-major `a [m, k]`, `b [n, k]` and `r [m, n]`.
fn r_plus_a_bt<T: Real>(a: &[T], b: &[T], r: &[T], k: usize) -> Result<Vec<T>> {
    let (m, n) = (a.len() / k.max(1), b.len() / k.max(1));
    let (am, bm) = (MatRef::rows(a, 0, m, k, k), MatRef::rows(b, 0, n, k, k));
    let mut out = r.to_vec();
    gemm(&mut out, 0, n, true, am, bm.t(), T::one(), true)?;
    Ok(out)
}

impl CustomOp3 for LinearAdd {
    fn name(&self) -> &'static str {
        "rlreplay-linear-add"
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
        let n = self.name();
        let (t, k, out) = dims(n, l1, l2)?;
        if l3.dims() != [t, out] {
            bail!(
                "{n}: residual {:?} does not match the output [{t}, {out}]",
                l3.dims()
            );
        }
        let shape = (t, out);
        by_real_dtype!(n, s1.dtype(), |T| Ok(storage(
            r_plus_a_bt::<T>(slice(n, s1, l1)?, slice(n, s2, l2)?, slice(n, s3, l3)?, k)?,
            shape,
        )))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _r: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dw) = grads(self.name(), x, w, grad, self.weight_grad)?;
        Ok((Some(dx), dw, Some(grad.clone())))
    }
}

/// `x [T, in]` (or `[T, a, b]`), the LoRA adapter `A [r, in]`, `B [out, r]` of the frozen weight
/// `w [out, in]` → `x · Wᵀ + scale · (x · Aᵀ) · Bᵀ`, `[T, out]` or, with `heads`,
/// `[T, heads, out / heads]`: one node, so the frozen projection's own output is not kept beside
/// the adapted one for the backward pass. The backward pass computes `dx`, `dA` and `dB` (the
/// frozen weight gets none and is not an input of the node).
pub(crate) struct LoraLinear {
    /// The frozen weight.
    pub w: Tensor,
    /// `lora_alpha / r`.
    pub scale: f64,
    /// Heads to split the output into.
    pub heads: Option<usize>,
}

/// `x · Wᵀ + scale · (x · Aᵀ) · Bᵀ` for row-major `x [T, in]`, `w [out, in]`, `a [r, in]`,
/// `b [out, r]`.
fn lora_fwd<T: Real>(x: &[T], w: &[T], a: &[T], b: &[T], inp: usize, scale: f64) -> Result<Vec<T>> {
    let (t, out, r) = (
        x.len() / inp.max(1),
        w.len() / inp.max(1),
        a.len() / inp.max(1),
    );
    let mut y = a_bt(x, w, inp)?;
    let xa = a_bt(x, a, inp)?;
    let (xam, bm) = (MatRef::rows(&xa, 0, t, r, r), MatRef::rows(b, 0, out, r, r));
    gemm(&mut y, 0, out, true, xam, bm.t(), c(scale), true)?;
    Ok(y)
}

/// `(dx, dA, dB)` of [`lora_fwd`] for the output gradient `dy [T, out]`: with `g = scale·dy·B`,
/// `dx = dy·W + g·A`, `dA = gᵀ·x`, `dB = scale·dyᵀ·(x·Aᵀ)`.
#[allow(clippy::type_complexity)]
fn lora_bwd<T: Real>(
    [x, w, a, b, dy]: [&[T]; 5],
    inp: usize,
    scale: f64,
) -> Result<(Vec<T>, Vec<T>, Vec<T>)> {
    let (t, out, r) = (
        x.len() / inp.max(1),
        w.len() / inp.max(1),
        a.len() / inp.max(1),
    );
    let rows = |d, n, k| MatRef::rows(d, 0, n, k, k);
    let (xm, wm, am, bm, dym) = (
        rows(x, t, inp),
        rows(w, out, inp),
        rows(a, r, inp),
        rows(b, out, r),
        rows(dy, t, out),
    );
    let xa = gemm_new(xm, am.t(), T::one(), true)?;
    let g = gemm_new(dym, bm, c(scale), true)?;
    let gm = rows(&g, t, r);
    let mut dx = gemm_new(dym, wm, T::one(), true)?;
    gemm(&mut dx, 0, inp, true, gm, am, T::one(), true)?;
    let da = gemm_new(gm.t(), xm, T::one(), true)?;
    let db = gemm_new(dym.t(), rows(&xa, t, r), c(scale), true)?;
    Ok((dx, da, db))
}

impl CustomOp3 for LoraLinear {
    fn name(&self) -> &'static str {
        "rlreplay-lora-linear"
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
        let n = self.name();
        let (t, k, out) = dims(n, l1, self.w.layout())?;
        let (r, ka) = l2.shape().dims2()?;
        if ka != k || l3.dims() != [out, r] {
            bail!(
                "{n}: adapter A {:?} and B {:?} do not fit the weight [{out}, {k}]",
                l2.dims(),
                l3.dims()
            );
        }
        let shape: Shape = match self.heads {
            Some(h) if h > 0 && out % h == 0 => (t, h, out / h).into(),
            Some(h) => bail!("{n}: {out} outputs do not split into {h} heads"),
            None => (t, out).into(),
        };
        let (x, a, b) = (s1, s2, s3);
        by_real_dtype!(n, x.dtype(), |T| {
            let y = with_slices::<T, _>(n, &[&self.w], |w| {
                lora_fwd::<T>(
                    slice(n, x, l1)?,
                    w[0],
                    slice(n, a, l2)?,
                    slice(n, b, l3)?,
                    k,
                    self.scale,
                )
            })?;
            Ok(storage(y, shape))
        })
    }

    fn bwd(
        &self,
        x: &Tensor,
        a: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        fn run<T: Real>(
            op: &LoraLinear,
            [x, a, b, g]: [&Tensor; 4],
        ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
            let inp = a.dims()[1];
            let (dx, da, db) = with_slices::<T, _>(op.name(), &[x, &op.w, a, b, g], |s| {
                lora_bwd([s[0], s[1], s[2], s[3], s[4]], inp, op.scale)
            })?;
            Ok((
                Some(tensor(dx, x.shape())?),
                Some(tensor(da, a.shape())?),
                Some(tensor(db, b.shape())?),
            ))
        }
        by_real_dtype!(self.name(), x.dtype(), run(self, [x, a, b, grad]))
    }
}
