//! Shared plumbing of the CPU kernels: element types, slice access to tensors, strided gemm.

use candle_core::{bail, CpuStorage, Device, Layout, Result, Shape, Storage, Tensor, WithDType};
use gemm::Parallelism;

/// Floating-point element types the CPU kernels are written for (f32 and f64).
pub(crate) trait Real:
    num_traits::Float
    + WithDType
    + std::iter::Sum
    + std::ops::AddAssign
    + std::ops::MulAssign
    + Send
    + Sync
    + 'static
{
}
impl Real for f32 {}
impl Real for f64 {}

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
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if b.rows != k || !a.in_bounds() || !b.in_bounds() {
        bail!(
            "internal gemm: operands {m}x{k} and {}x{n} out of bounds or mismatched",
            b.rows
        );
    }
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
    let par = if parallel {
        Parallelism::Rayon(rayon::current_num_threads())
    } else {
        Parallelism::None
    };
    // SAFETY: every index touched (checked above) lies inside the three slices; `dst` is borrowed
    // mutably and does not alias the shared operands.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr().add(off),
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
    Ok(())
}

/// Rows per parallel task so that each task handles at least `min_elems` elements.
pub(crate) fn rows_per_task(row_len: usize, min_elems: usize) -> usize {
    (min_elems / row_len.max(1)).max(1)
}
