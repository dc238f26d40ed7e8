//! Shared plumbing of the CPU kernels: element types, slice access to tensors, strided gemm, and
//! the vectorised `exp` of the f32 kernels.

use candle_core::{bail, CpuStorage, Device, Layout, Result, Shape, Storage, Tensor, WithDType};
use gemm::Parallelism;
use std::mem::MaybeUninit;

/// Floating-point element types the CPU kernels are written for (f32 and f64).
pub(crate) trait Real:
    num_traits::Float
    + WithDType
    + std::iter::Sum
    + std::ops::AddAssign
    + std::ops::MulAssign
    + std::ops::SubAssign
    + Send
    + Sync
    + 'static
{
    /// `x = exp(x)` for every element. f64 uses the standard library's `exp`; f32 uses
    /// [`exp_f32`], which the compiler vectorises (8 lanes with AVX2 and FMA where the CPU has them).
    fn exp_in_place(xs: &mut [Self]) {
        xs.iter_mut().for_each(|x| *x = x.exp());
    }
}
impl Real for f32 {
    fn exp_in_place(xs: &mut [Self]) {
        exp_f32_slice(xs);
    }
}
impl Real for f64 {}

/// `exp(x)` in f32 within 2 ulp of the correctly rounded value for normal results (Cody–Waite
/// range reduction by ln 2 and Cephes' degree-6 polynomial, as in `expf` of Cephes): branch-free
/// so that a loop over a slice vectorises. Below `ln(f32::MIN_POSITIVE)` it returns 0 (the true
/// value would be subnormal), above `ln(f32::MAX)` infinity; NaN stays NaN. The fused
/// multiply-adds round the same whether the CPU has FMA or not, so the values do not depend on
/// the machine.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LO: f32 = -87.336_55; // ln(2^-126)
    const HI: f32 = 88.722_83; // ln(f32::MAX)
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 · 2^23: adding it rounds to the nearest integer, which lands in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    // Clamp with comparisons that let NaN through (`f32::min`/`max` would drop it).
    let xc = if x > HI { HI } else { x };
    let xc = if xc < LO { LO } else { xc };
    let t = xc.mul_add(LOG2E, ROUND);
    let n = t - ROUND;
    let r = n.mul_add(-LN2_HI, xc);
    let r = n.mul_add(-LN2_LO, r);
    let p = 1.987_569_1e-4f32;
    let p = p.mul_add(r, 1.398_199_9e-3);
    let p = p.mul_add(r, 8.333_452e-3);
    let p = p.mul_add(r, 4.166_579_6e-2);
    let p = p.mul_add(r, 1.666_666_5e-1);
    let p = p.mul_add(r, 0.5);
    let y = p.mul_add(r * r, r) + 1.0;
    // 2^n from the integer in t's low mantissa bits, as 2^(n/2) · 2^(n - n/2) so that both
    // factors are normal for every n in [-126, 128].
    let n_int = t.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let half = n_int >> 1;
    let pow2 = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    let v = y * pow2(half) * pow2(n_int - half);
    if x < LO {
        0.0
    } else if x > HI {
        f32::INFINITY
    } else {
        v
    }
}

/// `x = exp(x)` for every element of `xs`: `exp_f32` (within 2 ulp; 0 below the normal range),
/// with AVX-512 or AVX2 + FMA code where the CPU has them (the same values: every path computes
/// the same fused multiply-adds). The kernels' `exp`, also for samplers.
pub fn exp_f32_slice(xs: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports the target features the function is compiled for.
            unsafe { exp_f32_slice_avx512(xs) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: as above.
            unsafe { exp_f32_slice_avx2(xs) };
            return;
        }
    }
    xs.iter_mut().for_each(|x| *x = exp_f32(*x));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn exp_f32_slice_avx512(xs: &mut [f32]) {
    xs.iter_mut().for_each(|x| *x = exp_f32(*x));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn exp_f32_slice_avx2(xs: &mut [f32]) {
    xs.iter_mut().for_each(|x| *x = exp_f32(*x));
}

/// Independent partial results in the lane reductions below ([`sum`], [`dot`], [`dot3`],
/// [`max`]): enough for the compiler to keep several vector registers busy, so the loops run at
/// the adder's throughput rather than its latency (a plain `iter().sum()` adds one element at a
/// time, in order). The order of the operations is fixed, so results do not depend on the CPU.
const LANES: usize = 32;

/// The partial results of a lane reduction folded in halves (a fixed tree).
#[inline(always)]
fn fold_lanes<T: Real>(mut acc: [T; LANES], op: impl Fn(T, T) -> T) -> T {
    let mut w = LANES / 2;
    while w > 0 {
        for i in 0..w {
            acc[i] = op(acc[i], acc[i + w]);
        }
        w /= 2;
    }
    acc[0]
}

/// `Σ xs` in [`LANES`] partial sums.
#[inline]
pub(crate) fn sum<T: Real>(xs: &[T]) -> T {
    let mut acc = [T::zero(); LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder().iter().fold(T::zero(), |s, &x| s + x);
    for ch in chunks {
        for (s, &x) in acc.iter_mut().zip(ch) {
            *s += x;
        }
    }
    fold_lanes(acc, |a, b| a + b) + tail
}

/// `Σ a_i · b_i` over the common length, in [`LANES`] partial sums.
#[inline]
pub(crate) fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    let n = a.len().min(b.len());
    let (ca, cb) = (a[..n].chunks_exact(LANES), b[..n].chunks_exact(LANES));
    let tail = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .fold(T::zero(), |s, (&x, &y)| s + x * y);
    let mut acc = [T::zero(); LANES];
    for (xs, ys) in ca.zip(cb) {
        for ((s, &x), &y) in acc.iter_mut().zip(xs).zip(ys) {
            *s += x * y;
        }
    }
    fold_lanes(acc, |a, b| a + b) + tail
}

/// `Σ a_i · b_i · d_i` over the common length, in [`LANES`] partial sums.
#[inline]
pub(crate) fn dot3<T: Real>(a: &[T], b: &[T], d: &[T]) -> T {
    let n = a.len().min(b.len()).min(d.len());
    let (ca, cb, cc) = (
        a[..n].chunks_exact(LANES),
        b[..n].chunks_exact(LANES),
        d[..n].chunks_exact(LANES),
    );
    let tail = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .zip(cc.remainder())
        .fold(T::zero(), |s, ((&x, &y), &z)| s + x * y * z);
    let mut acc = [T::zero(); LANES];
    for ((xs, ys), zs) in ca.zip(cb).zip(cc) {
        for (((s, &x), &y), &z) in acc.iter_mut().zip(xs).zip(ys).zip(zs) {
            *s += x * y * z;
        }
    }
    fold_lanes(acc, |a, b| a + b) + tail
}

/// The largest element of `xs`, ignoring NaNs as `f32::max` does; negative infinity when `xs`
/// is empty or all NaN.
#[inline]
pub(crate) fn max<T: Real>(xs: &[T]) -> T {
    // `if x > m { x } else { m }` keeps `m` when `x` is NaN and compiles to one vector max.
    let pick = |m: T, x: T| if x > m { x } else { m };
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks
        .remainder()
        .iter()
        .fold(T::neg_infinity(), |m, &x| pick(m, x));
    let mut acc = [T::neg_infinity(); LANES];
    for ch in chunks {
        for (m, &x) in acc.iter_mut().zip(ch) {
            *m = pick(*m, x);
        }
    }
    pick(fold_lanes(acc, pick), tail)
}

/// The kernels' one f32 / f64 dispatch: `by_real_dtype!(op, dtype, run(args..))` calls
/// `run::<f32>` or `run::<f64>`, and `by_real_dtype!(op, dtype, |T| body)` evaluates `body` with
/// `T` the element type; any other dtype is an error naming `op`.
macro_rules! by_real_dtype {
    ($op:expr, $dtype:expr, |$t:ident| $body:expr) => {
        match $dtype {
            candle_core::DType::F32 => {
                type $t = f32;
                $body
            }
            candle_core::DType::F64 => {
                type $t = f64;
                $body
            }
            dt => candle_core::bail!("{}: unsupported dtype {dt:?}", $op),
        }
    };
    ($op:expr, $dtype:expr, $f:ident($($arg:expr),* $(,)?)) => {
        by_real_dtype!($op, $dtype, |T| $f::<T>($($arg),*))
    };
}
pub(crate) use by_real_dtype;

/// Converts an `f64` constant to the element type.
#[inline]
pub(crate) fn c<T: Real>(v: f64) -> T {
    <T as WithDType>::from_f64(v)
}

/// The contiguous elements of a CPU storage seen through `layout`.
pub(crate) fn slice<'a, T: Real>(
    op: &str,
    storage: &'a CpuStorage,
    layout: &Layout,
) -> Result<&'a [T]> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        bail!("{op}: kernel input is not contiguous");
    };
    Ok(&T::cpu_storage_as_slice(storage)?[start..end])
}

/// Runs `f` on the contiguous CPU data of every tensor in `tensors`.
pub(crate) fn with_slices<T: Real, R>(
    op: &str,
    tensors: &[&Tensor],
    f: impl FnOnce(&[&[T]]) -> Result<R>,
) -> Result<R> {
    let owned = tensors
        .iter()
        .map(|t| t.contiguous())
        .collect::<Result<Vec<_>>>()?;
    let guards: Vec<_> = owned.iter().map(|t| t.storage_and_layout()).collect();
    let mut slices = Vec::with_capacity(guards.len());
    for (storage, layout) in &guards {
        let Storage::Cpu(cpu) = &**storage else {
            bail!("{op}: backward kernel called on a non-CPU tensor");
        };
        slices.push(slice::<T>(op, cpu, layout)?);
    }
    f(&slices)
}

/// A CPU tensor holding `data` with `shape`.
pub(crate) fn tensor<T: Real>(data: Vec<T>, shape: impl Into<Shape>) -> Result<Tensor> {
    Tensor::from_vec(data, shape, &Device::Cpu)
}

/// Wraps a kernel result as the `(storage, shape)` pair `cpu_fwd` returns.
pub(crate) fn storage<T: Real>(data: Vec<T>, shape: impl Into<Shape>) -> (CpuStorage, Shape) {
    (T::to_cpu_storage_owned(data), shape.into())
}

/// True when the op can run its CPU kernel on these tensors (CPU device, f32 or f64).
pub(crate) fn kernel_applies(tensors: &[&Tensor]) -> bool {
    tensors.iter().all(|t| {
        t.device().is_cpu()
            && matches!(t.dtype(), candle_core::DType::F32 | candle_core::DType::F64)
    }) && tensors.windows(2).all(|w| w[0].dtype() == w[1].dtype())
}

/// A strided read-only matrix view into a slice.
#[derive(Clone, Copy)]
pub(crate) struct MatRef<'a, T> {
    /// Backing elements.
    pub data: &'a [T],
    /// Index of element (0, 0).
    pub off: usize,
    /// Number of rows.
    pub rows: usize,
    /// Number of columns.
    pub cols: usize,
    /// Distance between consecutive rows.
    pub rs: usize,
    /// Distance between consecutive columns.
    pub cs: usize,
}

impl<'a, T> MatRef<'a, T> {
    /// A row-major view: `rows` rows of `cols` elements, consecutive rows `rs` apart.
    pub fn rows(data: &'a [T], off: usize, rows: usize, cols: usize, rs: usize) -> Self {
        Self {
            data,
            off,
            rows,
            cols,
            rs,
            cs: 1,
        }
    }

    /// The transposed view (no copy).
    pub fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }

    /// Whether every element lies inside `data`.
    fn in_bounds(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || self.off + (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.data.len()
    }
}

/// Checks the operands of `a @ b` and returns `(m, k, n)`.
fn gemm_dims<T>(a: &MatRef<'_, T>, b: &MatRef<'_, T>) -> Result<(usize, usize, usize)> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if b.rows != k || !a.in_bounds() || !b.in_bounds() {
        bail!(
            "internal gemm: operands {m}x{k} and {}x{n} out of bounds or mismatched",
            b.rows
        );
    }
    Ok((m, k, n))
}

/// `dst[i*rs + j] (+)= alpha * (a @ b)[i][j]` through the gemm crate, for `m, n, k > 0`.
///
/// # Safety
///
/// `a` and `b` must be in bounds ([`gemm_dims`]), and `dst` valid for writes (and for reads when
/// `accumulate`) of every `dst[i*rs + j]`, `i < m`, `j < n`, without aliasing `a` or `b`.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_raw<T: Real>(
    dst: *mut T,
    rs: usize,
    accumulate: bool,
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    alpha: T,
    parallel: bool,
) {
    let par = if parallel {
        Parallelism::Rayon(rayon::current_num_threads())
    } else {
        Parallelism::None
    };
    // SAFETY: the caller guarantees the bounds of the three operands.
    unsafe {
        gemm::gemm(
            a.rows,
            b.cols,
            a.cols,
            dst,
            1,
            rs as isize,
            accumulate,
            a.data.as_ptr().add(a.off),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr().add(b.off),
            b.cs as isize,
            b.rs as isize,
            T::one(),
            alpha,
            false,
            false,
            false,
            par,
        );
    }
}

/// `dst[off + i*rs + j] (+)= alpha * (a @ b)[i][j]` for a row-major destination block; accumulates
/// into the existing values when `accumulate`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<T: Real>(
    dst: &mut [T],
    off: usize,
    rs: usize,
    accumulate: bool,
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    alpha: T,
    parallel: bool,
) -> Result<()> {
    let (m, k, n) = gemm_dims(&a, &b)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if off + (m - 1) * rs + n > dst.len() {
        bail!("internal gemm: destination {m}x{n} out of bounds");
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                dst[off + i * rs..off + i * rs + n].fill(T::zero());
            }
        }
        return Ok(());
    }
    let dst = dst[off..].as_mut_ptr();
    // SAFETY: every index touched (checked above) lies inside the three slices; `dst` is borrowed
    // mutably and does not alias the shared operands.
    unsafe { gemm_raw(dst, rs, accumulate, a, b, alpha, parallel) };
    Ok(())
}

/// `alpha * (a @ b)` as a new row-major `[m, n]` buffer, which the gemm writes without it being
/// zeroed first.
pub(crate) fn gemm_new<T: Real>(
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    alpha: T,
    parallel: bool,
) -> Result<Vec<T>> {
    let (m, k, n) = gemm_dims(&a, &b)?;
    if m == 0 || n == 0 || k == 0 {
        return Ok(vec![T::zero(); m * n]);
    }
    let mut out = Vec::with_capacity(m * n);
    // SAFETY: the operands are in bounds (checked above) and `out` has room for the `m × n`
    // destination, which does not alias them. Without `accumulate` (`read_dst = false`) the gemm
    // crate zeroes its coefficient of the destination and stores every one of its elements
    // without reading any (gemm-common's `gemm_basic_generic`, and the `gemv`/`gevv` paths it
    // takes for thin shapes), so all `m · n` elements are initialised when `set_len` runs.
    unsafe {
        gemm_raw(out.as_mut_ptr(), n, false, a, b, alpha, parallel);
        out.set_len(m * n);
    }
    Ok(out)
}

/// A buffer of `n` elements that `fill` writes, without zeroing it first: `fill` gets the `n`
/// uninitialised elements.
///
/// # Safety
///
/// `fill` must write every element of the slice it is given.
pub(crate) unsafe fn new_written<T>(n: usize, fill: impl FnOnce(&mut [MaybeUninit<T>])) -> Vec<T> {
    let mut out = Vec::with_capacity(n);
    fill(&mut out.spare_capacity_mut()[..n]);
    // SAFETY: the `n` elements are within the capacity, and the caller guarantees that `fill`
    // wrote every one of them.
    unsafe { out.set_len(n) };
    out
}

/// `xs` as initialised values.
///
/// # Safety
///
/// Every element of `xs` must have been written.
pub(crate) unsafe fn assume_written<T>(xs: &mut [MaybeUninit<T>]) -> &mut [T] {
    // SAFETY: `MaybeUninit<T>` has the layout of `T`, and the caller guarantees that every element
    // is initialised.
    unsafe { &mut *(xs as *mut [MaybeUninit<T>] as *mut [T]) }
}

/// Rows per parallel task so that each task handles at least `min_elems` elements.
pub(crate) fn rows_per_task(row_len: usize, min_elems: usize) -> usize {
    (min_elems / row_len.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units in the last place between `got` and the exact `exp(x)`.
    fn ulps(x: f32, got: f32) -> f64 {
        let want = (x as f64).exp();
        let ulp = (want as f32).abs().max(f32::MIN_POSITIVE);
        let ulp = f32::from_bits(ulp.to_bits() + 1) - ulp;
        (got as f64 - want).abs() / ulp as f64
    }

    #[test]
    fn lane_reductions_match_plain_loops() {
        for n in [0, 1, 5, 31, 32, 33, 64, 100, 1000] {
            let a: Vec<f64> = (0..n)
                .map(|i| ((i * 37 % 101) as f64 - 50.0) / 7.0)
                .collect();
            let b: Vec<f64> = (0..n)
                .map(|i| ((i * 11 % 29) as f64 - 14.0) / 3.0)
                .collect();
            let d: Vec<f64> = (0..n).map(|i| 1.0 + (i % 5) as f64).collect();
            let close = |x: f64, y: f64| (x - y).abs() <= 1e-9 * (1.0 + y.abs());
            assert!(close(sum(&a), a.iter().sum()), "sum n={n}");
            let want: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert!(close(dot(&a, &b), want), "dot n={n}");
            let want: f64 = (0..n).map(|i| a[i] * b[i] * d[i]).sum();
            assert!(close(dot3(&a, &b, &d), want), "dot3 n={n}");
            let want = a.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            assert_eq!(max(&a), want, "max n={n}");
        }
        // The common length of unequal operands; NaN ignored by `max` as by `f32::max`.
        assert_eq!(dot(&[1.0f32, 2.0, 3.0], &[1.0, 1.0]), 3.0);
        let mut xs = vec![f32::NAN; 70];
        assert_eq!(max(&xs), f32::NEG_INFINITY);
        xs[3] = -2.0;
        xs[65] = -1.0;
        assert_eq!(max(&xs), -1.0);
        // f32 sums agree with an f64 reference to rounding.
        let xs: Vec<f32> = (0..151_936).map(|i| ((i % 977) as f32).sin()).collect();
        let want: f64 = xs.iter().map(|&x| x as f64).sum();
        assert!(
            (sum(&xs) as f64 - want).abs() < 1e-3,
            "{} vs {want}",
            sum(&xs)
        );
    }

    #[test]
    fn exp_f32_is_within_two_ulp_and_handles_the_edges() {
        let mut xs: Vec<f32> = (0..2_000_001)
            .map(|i| -87.3 + 176.0 * i as f32 / 2_000_000.0)
            .filter(|x| *x < 88.72)
            .collect();
        xs.extend([0.0, -0.0, 1e-30, -1e-30, 0.5, -0.5, 1.0, -1.0, 88.0, -87.0]);
        let mut ys = xs.clone();
        f32::exp_in_place(&mut ys);
        let worst = xs
            .iter()
            .zip(&ys)
            .map(|(&x, &y)| ulps(x, y))
            .fold(0.0, f64::max);
        let at = xs
            .iter()
            .zip(&ys)
            .map(|(&x, &y)| (ulps(x, y), x, y))
            .fold((0.0, 0.0, 0.0), |a, b| if b.0 > a.0 { b } else { a });
        assert!(worst <= 2.0, "worst error {worst} ulp at {at:?}");
        for (&x, &y) in xs.iter().zip(&ys) {
            assert_eq!(y, exp_f32(x), "the vector and scalar paths differ at {x}");
        }
        assert_eq!(exp_f32(0.0), 1.0);
        let mut edges = [
            f32::NEG_INFINITY,
            -1e4,
            -90.0,
            89.0,
            1e4,
            f32::INFINITY,
            f32::NAN,
        ];
        f32::exp_in_place(&mut edges);
        assert_eq!(
            &edges[..6],
            &[0.0, 0.0, 0.0, f32::INFINITY, f32::INFINITY, f32::INFINITY]
        );
        assert!(edges[6].is_nan());
    }
}
