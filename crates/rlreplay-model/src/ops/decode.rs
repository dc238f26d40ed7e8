//! Inference-only f32 CPU kernels of the incremental decoder (no autograd, no backward): matrix
//! products against weights packed in panels, RMSNorm, per-head RMSNorm fused with RoPE, SwiGLU, and
//! grouped-query attention of the new tokens of many sequences over their own KV caches.
//!
//! All functions work on row-major slices that the caller owns; a matrix product repacks its input
//! rows into one scratch buffer of their size, and the attention holds one score row per task.

use super::cpu::{dot, exp_f32_slice, sum};
use candle_core::{bail, Result};
use rayon::prelude::*;

/// Elements per parallel task of the row-wise kernels (smaller inputs run on the caller's thread).
const MIN_TASK: usize = 1 << 14;

/// Output columns per panel of [`Panels`] (two AVX2 or one AVX-512 register of f32).
const NR: usize = 16;
/// Rows per register tile of [`linear`] (12 × 16 accumulators: twelve AVX-512 registers).
const MR: usize = 12;
/// Rows per register tile of the AVX2 and portable kernels (6 × 16 accumulators fill twelve AVX2
/// registers); they run a tile of [`MR`] rows as two.
const MR_NARROW: usize = 6;
/// Rows per parallel task of [`linear`] when a product has many rows (a multiple of [`MR`]).
const ROW_BLOCK: usize = 4 * MR;
/// Inputs per block of a panel that all row tiles of a task go through in turn (16 KiB).
const KB: usize = 256;
/// Lines of a panel ahead of the one being read that a product's first row tile asks the cache
/// to fetch (two blocks of [`KB`]): the hardware prefetcher alone leaves a tile of many rows
/// waiting on memory for a third of its time.
const PREFETCH_AHEAD: usize = 2 * KB;
/// Rows a tile needs before it prefetches: a tile of few rows is paced by the weight stream,
/// which the hardware prefetcher keeps up with.
const PREFETCH_MIN_ROWS: usize = 8;
/// Multiply-adds per parallel task of [`linear`] (smaller products run on the caller's thread).
const MIN_TASK_MACS: usize = 1 << 17;

/// One input's weights of one panel: [`NR`] output columns, one 64-byte cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; NR]);

/// A weight matrix `W[out, in]` packed for the decoder's products `x · Wᵀ`: panels of [`NR`]
/// output columns, each `[in][NR]` (the last padded with zeros), one after another, so that a
/// panel is read as one contiguous stream of cache lines, one per input.
pub(crate) struct Panels {
    data: Vec<Line>,
    inp: usize,
    out: usize,
}

impl Panels {
    /// Packs row-major `w` (`[out, in]`, `out = w.len() / inp`).
    pub(crate) fn pack(w: &[f32], inp: usize) -> Result<Self> {
        let out = w.len().checked_div(inp).unwrap_or(0);
        if out * inp != w.len() || inp == 0 {
            bail!("decode panels: {} weights are not rows of {inp}", w.len());
        }
        let panels = out.div_ceil(NR);
        let mut data = vec![Line([0.0; NR]); panels * inp];
        data.par_chunks_mut(inp)
            .zip(w.par_chunks(inp * NR))
            .for_each(|(panel, rows)| {
                for (j, row) in rows.chunks_exact(inp).enumerate() {
                    for (line, &v) in panel.iter_mut().zip(row) {
                        line.0[j] = v;
                    }
                }
            });
        Ok(Self { data, inp, out })
    }

    /// Copies row `n` of `W` (`in` elements) into `dst`.
    pub(crate) fn row_into(&self, n: usize, dst: &mut [f32]) {
        let panel = &self.data[(n / NR) * self.inp..][..self.inp];
        for (d, w) in dst.iter_mut().zip(panel) {
            *d = w.0[n % NR];
        }
    }
}

/// A destination that parallel tasks write in disjoint `(row, column)` blocks.
#[derive(Clone, Copy)]
struct SharedDst(*mut f32);
// SAFETY: the tasks of `linear` write disjoint elements of the destination, which outlives them.
unsafe impl Send for SharedDst {}
// SAFETY: as above.
unsafe impl Sync for SharedDst {}

/// `dst[rows, out] (+)= x[rows, in] · Wᵀ` (adding the product to `dst` when `accumulate`).
///
/// Every output element is one chain of fused multiply-adds over `in`, in order, from zero (then
/// added to `dst` when accumulating): its bits depend on its own row only, not on how many rows
/// the product has, how they are tiled or how many threads share the work, so a sequence samples
/// the same tokens alone or among others, on one rank or split across ranks. The chains are
/// vectorised across output columns (no horizontal sums), with AVX-512 or AVX2 + FMA code where
/// the CPU has them and the same values everywhere.
pub(crate) fn linear(
    dst: &mut [f32],
    accumulate: bool,
    x: &[f32],
    rows: usize,
    w: &Panels,
) -> Result<()> {
    let (inp, out) = (w.inp, w.out);
    if x.len() != rows * inp || dst.len() != rows * out {
        bail!(
            "decode linear: x {} / dst {} do not fit {rows} rows of {inp} inputs and {out} outputs",
            x.len(),
            dst.len()
        );
    }
    if rows == 0 {
        return Ok(());
    }
    let panels = out.div_ceil(NR);
    let row_blocks = rows.div_ceil(ROW_BLOCK);
    let block_rows = rows.min(ROW_BLOCK);
    // Panels per task: enough multiply-adds to pay for a task, and enough tasks for the threads.
    let per_panel = block_rows * inp * NR;
    let threads = rayon::current_num_threads();
    let by_work = (MIN_TASK_MACS / per_panel.max(1)).max(1);
    let by_threads = (panels * row_blocks).div_ceil(4 * threads).max(1);
    let group = by_work.min(by_threads).min(panels);
    let groups = panels.div_ceil(group);
    // The rows in tiles of MR, each tile input-major (`[in][rows of the tile]`), so that a
    // tile's inputs at one position are adjacent.
    let xp = pack_rows(x, inp);
    let x = &xp[..];
    let dst = SharedDst(dst.as_mut_ptr());
    let task = |t: usize| {
        let (rb, g) = (t / groups, t % groups);
        let r0 = rb * ROW_BLOCK;
        let r1 = (r0 + ROW_BLOCK).min(rows);
        for p in g * group..((g + 1) * group).min(panels) {
            let panel = &w.data[p * inp..(p + 1) * inp];
            let cols = NR.min(out - p * NR);
            // SAFETY: this task alone writes rows `r0..r1` of columns `p·NR..p·NR + cols`, all
            // inside `dst` (`rows × out`, checked above), which outlives the tasks.
            unsafe { panel_rows(dst, accumulate, x, r0, r1, inp, out, panel, p * NR, cols) };
        }
    };
    let tasks = row_blocks * groups;
    if tasks == 1 || threads == 1 {
        (0..tasks).for_each(task);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
    Ok(())
}

/// `x` (`[rows, inp]`) in tiles of [`MR`] rows (the last may have fewer), one after another,
/// each stored input-major: element `(r, k)` of the tile at `k · tile_rows + r`.
fn pack_rows(x: &[f32], inp: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for (tile, dst) in x.chunks(MR * inp).zip(out.chunks_mut(MR * inp)) {
        let n = tile.len() / inp;
        for (r, row) in tile.chunks_exact(inp).enumerate() {
            for (k, &v) in row.iter().enumerate() {
                dst[k * n + r] = v;
            }
        }
    }
    out
}

/// Rows `r0..r1` (at most [`ROW_BLOCK`]) of one panel's columns: blocks of [`KB`] inputs, each
/// run over all the row tiles of [`MR`] rows while the block of the panel is in the L1 cache.
///
/// # Safety
///
/// Rows `r0..r1` and columns `c0..c0 + cols` of the `[_, out]` destination must be in bounds and
/// written by no one else meanwhile; `x` holds the rows packed by [`pack_rows`], `r0` a multiple
/// of [`MR`].
#[allow(clippy::too_many_arguments)]
unsafe fn panel_rows(
    dst: SharedDst,
    accumulate: bool,
    x: &[f32],
    r0: usize,
    r1: usize,
    inp: usize,
    out: usize,
    panel: &[Line],
    c0: usize,
    cols: usize,
) {
    let xs = &x[r0 * inp..r1 * inp];
    let mut acc = [[0f32; NR]; ROW_BLOCK];
    let acc = &mut acc[..r1 - r0];
    for k0 in (0..inp).step_by(KB) {
        let block = &panel[k0..(k0 + KB).min(inp)];
        for (i, (acc, xt)) in acc.chunks_mut(MR).zip(xs.chunks(MR * inp)).enumerate() {
            tile_dispatch(i == 0 && acc.len() >= PREFETCH_MIN_ROWS, acc, xt, k0, block);
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        // SAFETY: row `r0 + i` < `r1` and columns `c0..c0 + cols` are this caller's to write.
        let row = unsafe { std::slice::from_raw_parts_mut(dst.0.add((r0 + i) * out + c0), cols) };
        if accumulate {
            row.iter_mut().zip(acc).for_each(|(d, a)| *d += a);
        } else {
            row.copy_from_slice(&acc[..cols]);
        }
    }
}

/// Continues the chains of a register tile of `acc.len()` (≤ [`MR`]) rows over one block of a
/// panel, with AVX-512 or AVX2 + FMA where the CPU has them (each step is one fused
/// multiply-add whatever the code path, so the values are the same). `xt` is the tile's rows
/// packed input-major (`[in][acc.len()]`); with `prefetch` the vector code also asks for the
/// panel's lines [`PREFETCH_AHEAD`] ahead, one per input.
fn tile_dispatch(prefetch: bool, acc: &mut [[f32; NR]], xt: &[f32], k0: usize, block: &[Line]) {
    let (rows, n) = (acc.len(), block.len());
    assert!(
        (1..=MR).contains(&rows) && xt.len() >= (k0 + n) * rows,
        "decode tile out of bounds"
    );
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! rows {
            ($f:ident, $pre:expr, $acc:expr, $off:expr, $($r:literal)*) => {
                // SAFETY: the CPU supports the function's target features (checked by the
                // caller's branch) and `xt` holds the block's inputs of every row (asserted).
                unsafe {
                    match $acc.len() {
                        $($r => $f::<$r>($pre, $acc, xt, rows, $off, k0, block),)*
                        _ => unreachable!("tile rows checked above"),
                    }
                }
            };
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            rows!(tile_avx512, prefetch, acc, 0, 1 2 3 4 5 6 7 8 9 10 11 12);
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            for (c, acc) in acc.chunks_mut(MR_NARROW).enumerate() {
                rows!(tile_avx2, prefetch && c == 0, acc, c * MR_NARROW, 1 2 3 4 5 6);
            }
            return;
        }
    }
    // The portable tiles leave the prefetching to the hardware.
    let _ = prefetch;
    for (c, acc) in acc.chunks_mut(MR_NARROW).enumerate() {
        tile_rows(acc, xt, rows, c * MR_NARROW, k0, block);
    }
}

/// [`tile`] in AVX-512: one register per row, the block's row loaded once per input (and, with
/// `prefetch`, the line [`PREFETCH_AHEAD`] ahead requested).
///
/// # Safety
///
/// The CPU must support AVX-512F; `acc` has `R` rows, and `xt` holds inputs `k0..k0 +
/// block.len()` of rows `off..off + R` of a tile of `stride` rows packed input-major.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile_avx512<const R: usize>(
    prefetch: bool,
    acc: &mut [[f32; NR]],
    xt: &[f32],
    stride: usize,
    off: usize,
    k0: usize,
    block: &[Line],
) {
    use std::arch::x86_64::*;
    let mut a = [_mm512_setzero_ps(); R];
    for (a, acc) in a.iter_mut().zip(acc.iter()) {
        // SAFETY: `acc` rows hold NR = 16 floats.
        *a = unsafe { _mm512_loadu_ps(acc.as_ptr()) };
    }
    // SAFETY: input `k0` of row `off` is inside `xt` (the caller's contract).
    let mut x = unsafe { xt.as_ptr().add(k0 * stride + off) };
    for w in block {
        if prefetch {
            prefetch_ahead(w);
        }
        // SAFETY: `w` is 16 floats aligned to 64 bytes (a `Line`).
        let wv = unsafe { _mm512_load_ps(w.0.as_ptr()) };
        for (r, a) in a.iter_mut().enumerate() {
            // SAFETY: rows `off..off + R` of this input are inside `xt` (the caller's contract).
            let xv = unsafe { *x.add(r) };
            *a = _mm512_fmadd_ps(_mm512_set1_ps(xv), wv, *a);
        }
        x = x.wrapping_add(stride);
    }
    for (a, acc) in a.iter().zip(acc.iter_mut()) {
        // SAFETY: as for the loads.
        unsafe { _mm512_storeu_ps(acc.as_mut_ptr(), *a) };
    }
}

/// [`tile`] in AVX2 + FMA: two registers per row, the block's row loaded once per input (and,
/// with `prefetch`, the line [`PREFETCH_AHEAD`] ahead requested).
///
/// # Safety
///
/// The CPU must support AVX2 and FMA; `acc` has `R` rows, and `xt` holds inputs `k0..k0 +
/// block.len()` of rows `off..off + R` of a tile of `stride` rows packed input-major.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const R: usize>(
    prefetch: bool,
    acc: &mut [[f32; NR]],
    xt: &[f32],
    stride: usize,
    off: usize,
    k0: usize,
    block: &[Line],
) {
    use std::arch::x86_64::*;
    let mut a = [[_mm256_setzero_ps(); 2]; R];
    for (a, acc) in a.iter_mut().zip(acc.iter()) {
        // SAFETY: `acc` rows hold NR = 16 floats.
        unsafe {
            a[0] = _mm256_loadu_ps(acc.as_ptr());
            a[1] = _mm256_loadu_ps(acc.as_ptr().add(8));
        }
    }
    // SAFETY: input `k0` of row `off` is inside `xt` (the caller's contract).
    let mut x = unsafe { xt.as_ptr().add(k0 * stride + off) };
    for w in block {
        if prefetch {
            prefetch_ahead(w);
        }
        // SAFETY: `w` is 16 floats aligned to 64 bytes (a `Line`).
        let (w0, w1) = unsafe {
            (
                _mm256_load_ps(w.0.as_ptr()),
                _mm256_load_ps(w.0.as_ptr().add(8)),
            )
        };
        for (r, a) in a.iter_mut().enumerate() {
            // SAFETY: rows `off..off + R` of this input are inside `xt` (the caller's contract).
            let xv = _mm256_set1_ps(unsafe { *x.add(r) });
            a[0] = _mm256_fmadd_ps(xv, w0, a[0]);
            a[1] = _mm256_fmadd_ps(xv, w1, a[1]);
        }
        x = x.wrapping_add(stride);
    }
    for (a, acc) in a.iter().zip(acc.iter_mut()) {
        // SAFETY: as for the loads.
        unsafe {
            _mm256_storeu_ps(acc.as_mut_ptr(), a[0]);
            _mm256_storeu_ps(acc.as_mut_ptr().add(8), a[1]);
        }
    }
}

/// Asks for the panel line [`PREFETCH_AHEAD`] lines after `w` in the L2 cache (a hint: an
/// address past the panels is never read).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_ahead(w: &Line) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    let ahead = std::ptr::from_ref(w).wrapping_add(PREFETCH_AHEAD);
    // SAFETY: a prefetch reads nothing and cannot fault, whatever the address.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(ahead.cast()) };
}

/// Dispatches on the tile's row count so that each size is its own fully unrolled kernel.
#[inline(always)]
fn tile_rows(
    acc: &mut [[f32; NR]],
    xt: &[f32],
    stride: usize,
    off: usize,
    k0: usize,
    block: &[Line],
) {
    match acc.len() {
        1 => tile::<1>(acc, xt, stride, off, k0, block),
        2 => tile::<2>(acc, xt, stride, off, k0, block),
        3 => tile::<3>(acc, xt, stride, off, k0, block),
        4 => tile::<4>(acc, xt, stride, off, k0, block),
        5 => tile::<5>(acc, xt, stride, off, k0, block),
        _ => tile::<MR_NARROW>(acc, xt, stride, off, k0, block),
    }
}

/// `acc[r][j] += x(off + r, k0 + k) · block[k][j]` for each `k` in order, one fused multiply-add
/// at a time per element, `x(r, k) = xt[k · stride + r]` (a tile packed by [`pack_rows`]).
#[inline(always)]
fn tile<const R: usize>(
    acc: &mut [[f32; NR]],
    xt: &[f32],
    stride: usize,
    off: usize,
    k0: usize,
    block: &[Line],
) {
    let mut a: [[f32; NR]; R] = std::array::from_fn(|r| acc[r]);
    for (k, w) in block.iter().enumerate() {
        let xs = &xt[(k0 + k) * stride + off..][..R];
        for (a, &xv) in a.iter_mut().zip(xs) {
            for (a, &w) in a.iter_mut().zip(&w.0) {
                *a = xv.mul_add(w, *a);
            }
        }
    }
    acc[..R].copy_from_slice(&a);
}

/// Inverse root-mean-square of one row.
#[inline]
fn rinv(row: &[f32], eps: f32) -> f32 {
    let ss = dot(row, row);
    (ss / row.len() as f32 + eps).sqrt().recip()
}

/// `dst = x / rms(x) * w` row by row (`w.len()` elements per row).
pub(crate) fn rms_norm(dst: &mut [f32], x: &[f32], w: &[f32], eps: f32) {
    let h = w.len();
    let rows = (MIN_TASK / h.max(1)).max(1) * h;
    dst.par_chunks_mut(rows)
        .zip(x.par_chunks(rows))
        .for_each(|(dst, x)| {
            for (o, x) in dst.chunks_exact_mut(h).zip(x.chunks_exact(h)) {
                let r = rinv(x, eps);
                for ((o, &x), &w) in o.iter_mut().zip(x).zip(w) {
                    *o = x * r * w;
                }
            }
        });
}

/// `dst[r, i] += bias[i]` for every row of `dst` (`bias.len()` elements per row).
pub(crate) fn add_bias(dst: &mut [f32], bias: &[f32]) {
    let rows = (MIN_TASK / bias.len().max(1)).max(1) * bias.len();
    dst.par_chunks_mut(rows).for_each(|dst| {
        for row in dst.chunks_exact_mut(bias.len()) {
            for (o, &b) in row.iter_mut().zip(bias) {
                *o += b;
            }
        }
    });
}

/// For every token row of `qkv` (`[T, width]`, each row holding `heads` heads of `d` elements at
/// `offset`): per-head RMSNorm with weight `w` (when given), then the rotate-half RoPE of that
/// token's angles (`cos`, `sin`: `[T, d/2]`), in place.
#[allow(clippy::too_many_arguments)]
pub(crate) fn norm_rope_heads(
    qkv: &mut [f32],
    width: usize,
    offset: usize,
    heads: usize,
    d: usize,
    w: Option<&[f32]>,
    eps: f32,
    cos: &[f32],
    sin: &[f32],
) {
    let half = d / 2;
    let rows = (MIN_TASK / width.max(1)).max(1);
    qkv.par_chunks_mut(rows * width)
        .zip(cos.par_chunks(rows * half).zip(sin.par_chunks(rows * half)))
        .for_each(|(qkv, (cos, sin))| {
            for ((row, cs), sn) in qkv
                .chunks_exact_mut(width)
                .zip(cos.chunks_exact(half))
                .zip(sin.chunks_exact(half))
            {
                for x in row[offset..offset + heads * d].chunks_exact_mut(d) {
                    if let Some(w) = w {
                        let r = rinv(x, eps);
                        for (x, &w) in x.iter_mut().zip(w) {
                            *x = *x * r * w;
                        }
                    }
                    let (x1, x2) = x.split_at_mut(half);
                    for i in 0..half {
                        let (a, b) = (x1[i], x2[i]);
                        x1[i] = a * cs[i] - b * sn[i];
                        x2[i] = b * cs[i] + a * sn[i];
                    }
                }
            }
        });
}

/// `dst[r, i] = silu(gu[r, i]) * gu[r, I + i]` for `gu: [rows, 2I]` (gate then up), `dst: [rows, I]`.
pub(crate) fn swiglu(dst: &mut [f32], gu: &[f32], inter: usize) {
    let rows = (MIN_TASK / (2 * inter).max(1)).max(1);
    dst.par_chunks_mut(rows * inter)
        .zip(gu.par_chunks(rows * 2 * inter))
        .for_each(|(dst, gu)| {
            for (o, gu) in dst.chunks_exact_mut(inter).zip(gu.chunks_exact(2 * inter)) {
                let (g, u) = gu.split_at(inter);
                for (o, &g) in o.iter_mut().zip(g) {
                    *o = -g;
                }
                exp_f32_slice(o);
                for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                    *o = g / (1.0 + *o) * u;
                }
            }
        });
}

/// The part of one sequence in a decode step: its new tokens are the last `n` of its cache.
pub(crate) struct CachedSeq<'a> {
    /// Keys of all its positions, `[len, Hkv·D]`.
    pub k: &'a [f32],
    /// Values of all its positions, `[len, Hkv·D]`.
    pub v: &'a [f32],
    /// Number of new tokens (query rows, packed in sequence order).
    pub n: usize,
}

/// Head counts and sizes of [`cached_attention`].
#[derive(Clone, Copy)]
pub(crate) struct AttnDims {
    /// Query heads.
    pub hq: usize,
    /// Key/value heads (`hq` is a multiple).
    pub hkv: usize,
    /// Head dimension.
    pub d: usize,
    /// Score scale (usually `1/sqrt(D)`).
    pub scale: f32,
}

/// One KV head of a cached sequence: the head's slice of every key and value row.
#[derive(Clone, Copy)]
struct KvHead<'a> {
    seq: &'a CachedSeq<'a>,
    /// First element of the head in a cache row.
    col: usize,
    /// Elements per cache row (`Hkv·D`).
    kv_width: usize,
    /// Head dimension.
    d: usize,
}

impl<'a> KvHead<'a> {
    /// The head's key at position `j`.
    #[inline(always)]
    fn key(&self, j: usize) -> &'a [f32] {
        let start = j * self.kv_width + self.col;
        &self.seq.k[start..start + self.d]
    }

    /// The head's value at position `j`.
    #[inline(always)]
    fn value(&self, j: usize) -> &'a [f32] {
        let start = j * self.kv_width + self.col;
        &self.seq.v[start..start + self.d]
    }

    /// The cache's keys from the head's key at `j0` to the end of its key at `j0 + n - 1`
    /// (`n ≥ 1`; key `j0 + i` starts at `i · kv_width`).
    #[inline(always)]
    fn keys(&self, j0: usize, n: usize) -> &'a [f32] {
        let start = j0 * self.kv_width + self.col;
        &self.seq.k[start..start + (n - 1) * self.kv_width + self.d]
    }
}

/// Query rows per parallel task.
const ROWS_PER_TASK: usize = 8;

/// Causal grouped-query attention of the new tokens of every sequence over its cache: new token
/// `i` of a sequence with `len` cached positions (its `n` new ones included) attends to positions
/// `0..len - n + i + 1`; query head `h` uses KV head `h / (hq / hkv)`. Queries are read from the
/// packed rows of `qkv` (`[T, width]`, heads at the start of each row), the result is written to
/// `out` (`[T, hq·D]`). Parallel over blocks of query rows.
pub(crate) fn cached_attention(
    out: &mut [f32],
    qkv: &[f32],
    width: usize,
    seqs: &[CachedSeq<'_>],
    dims: AttnDims,
) -> Result<()> {
    let AttnDims { hq, hkv, d, .. } = dims;
    let kv_width = hkv * d;
    let t: usize = seqs.iter().map(|s| s.n).sum();
    if hkv == 0 || hq % hkv != 0 || out.len() != t * hq * d || qkv.len() != t * width {
        bail!("cached_attention: buffers do not match {t} tokens of {hq}/{hkv} heads of {d}");
    }
    if let Some(s) = seqs
        .iter()
        .find(|s| s.k.len() != s.v.len() || s.k.len() % kv_width != 0 || s.k.len() < s.n * kv_width)
    {
        bail!(
            "cached_attention: a cache of {} keys and {} values for {} new tokens",
            s.k.len(),
            s.v.len(),
            s.n
        );
    }
    // Units of work: (sequence, first new row, rows, packed row), each owning its output rows.
    let mut units = Vec::new();
    let mut row = 0;
    for (s, seq) in seqs.iter().enumerate() {
        for r0 in (0..seq.n).step_by(ROWS_PER_TASK) {
            let rows = ROWS_PER_TASK.min(seq.n - r0);
            units.push((s, r0, rows, row + r0));
        }
        row += seq.n;
    }
    let mut parts = Vec::with_capacity(units.len());
    let mut rest = out;
    for &(_, _, rows, _) in &units {
        let (part, tail) = rest.split_at_mut(rows * hq * d);
        parts.push(part);
        rest = tail;
    }
    units
        .into_par_iter()
        .zip(parts)
        .for_each(|((s, r0, rows, packed), out)| {
            let unit = Unit {
                seq: &seqs[s],
                first: r0,
                rows,
                q: &qkv[packed * width..],
                width,
                dims,
            };
            unit.run_widest(out);
        });
    Ok(())
}

/// Query rows `first..first + rows` of one sequence in [`cached_attention`].
struct Unit<'a> {
    seq: &'a CachedSeq<'a>,
    first: usize,
    rows: usize,
    /// The packed rows of `qkv` from the unit's first query row on.
    q: &'a [f32],
    width: usize,
    dims: AttnDims,
}

impl Unit<'_> {
    /// [`Unit::run`] compiled for AVX-512 or AVX2 where the CPU has them: the same operations in
    /// the same order (no fused multiply-adds), so the same values, in wider registers.
    fn run_widest(&self, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU supports the target features the function is compiled for.
                unsafe { self.run_avx512(out) };
                return;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: as above.
                unsafe { self.run_avx2(out) };
                return;
            }
        }
        self.run(out);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn run_avx512(&self, out: &mut [f32]) {
        match self.dims.d {
            64 => self.run_groups_avx512::<4>(out),
            128 => self.run_groups_avx512::<8>(out),
            _ => self.run_with(out, |a, b| head_dot_avx512(a, b)),
        }
    }

    /// [`Unit::run`] for heads of `16 · NV` elements: the query heads that share a KV head
    /// together ([`attend_group_avx512`]).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn run_groups_avx512<const NV: usize>(&self, out: &mut [f32]) {
        let AttnDims { hq, hkv, d, scale } = self.dims;
        let (seq, kv_width, per) = (self.seq, hkv * d, hq / hkv);
        let len = seq.k.len() / kv_width;
        let mut scores = vec![0f32; per * len];
        for i in 0..self.rows {
            let visible = len - seq.n + self.first + i + 1;
            let q = &self.q[i * self.width..i * self.width + hq * d];
            let o = &mut out[i * hq * d..(i + 1) * hq * d];
            for g in 0..hkv {
                let heads = g * per * d..(g + 1) * per * d;
                let kv = KvHead {
                    seq,
                    col: g * d,
                    kv_width,
                    d,
                };
                attend_group_avx512::<NV>(
                    &mut o[heads.clone()],
                    &q[heads],
                    kv,
                    &mut scores[..per * visible],
                    scale,
                );
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn run_avx2(&self, out: &mut [f32]) {
        self.run_with(out, |a, b| head_dot_avx2(a, b));
    }

    fn run(&self, out: &mut [f32]) {
        self.run_with(out, head_dot);
    }

    /// Every query head of the unit's rows, written to `out` (`[rows, hq·D]`), the scores' dot
    /// products by `dot` ([`head_dot`] or one of its vector versions).
    #[inline(always)]
    fn run_with(&self, out: &mut [f32], dot: impl Fn(&[f32], &[f32]) -> f32 + Copy) {
        let AttnDims { hq, hkv, d, scale } = self.dims;
        let (seq, kv_width) = (self.seq, hkv * d);
        let len = seq.k.len() / kv_width;
        let mut scores = vec![0f32; len];
        for i in 0..self.rows {
            let visible = len - seq.n + self.first + i + 1;
            let q = &self.q[i * self.width..i * self.width + hq * d];
            let o = &mut out[i * hq * d..(i + 1) * hq * d];
            for h in 0..hq {
                let kv = KvHead {
                    seq,
                    col: h / (hq / hkv) * d,
                    kv_width,
                    d,
                };
                attend(
                    &mut o[h * d..(h + 1) * d],
                    &q[h * d..(h + 1) * d],
                    kv,
                    &mut scores[..visible],
                    scale,
                    dot,
                );
            }
        }
    }
}

/// `Σ a_i · b_i` of a query and a key head in 16 partial sums (lane `i` adds the products
/// `a_j · b_j` with `j ≡ i mod 16`, in order), folded by [`fold16`]; the vector versions
/// ([`head_dot_avx512`], [`head_dot_avx2`]) do the same operations.
#[inline(always)]
fn head_dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (ca, ta) = a[..n].as_chunks::<16>();
    let (cb, tb) = b[..n].as_chunks::<16>();
    let mut acc = [0f32; 16];
    for (xs, ys) in ca.iter().zip(cb) {
        for i in 0..16 {
            acc[i] += xs[i] * ys[i];
        }
    }
    fold16(acc, ta, tb)
}

/// The 16 partial sums folded in halves (`i + 8`, `i + 4`, `i + 2`, `i + 1`), plus the products
/// of the tails.
#[inline(always)]
fn fold16(acc: [f32; 16], ta: &[f32], tb: &[f32]) -> f32 {
    let tail: f32 = ta.iter().zip(tb).map(|(x, y)| x * y).sum();
    let h8: [f32; 8] = std::array::from_fn(|i| acc[i] + acc[i + 8]);
    let h4: [f32; 4] = std::array::from_fn(|i| h8[i] + h8[i + 4]);
    (h4[0] + h4[2]) + (h4[1] + h4[3]) + tail
}

/// [`head_dot`] in one AVX-512 register.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn head_dot_avx512(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let (ca, ta) = a[..n].as_chunks::<16>();
    let (cb, tb) = b[..n].as_chunks::<16>();
    let mut acc = _mm512_setzero_ps();
    for (xs, ys) in ca.iter().zip(cb) {
        // SAFETY: both chunks hold 16 floats.
        let (x, y) = unsafe { (_mm512_loadu_ps(xs.as_ptr()), _mm512_loadu_ps(ys.as_ptr())) };
        acc = _mm512_add_ps(acc, _mm512_mul_ps(x, y));
    }
    let mut lanes = [0f32; 16];
    // SAFETY: `lanes` holds 16 floats.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc) };
    fold16(lanes, ta, tb)
}

/// [`head_dot`] in two AVX2 registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn head_dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let (ca, ta) = a[..n].as_chunks::<16>();
    let (cb, tb) = b[..n].as_chunks::<16>();
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for (xs, ys) in ca.iter().zip(cb) {
        // SAFETY: both chunks hold 16 floats.
        unsafe {
            let (x0, y0) = (_mm256_loadu_ps(xs.as_ptr()), _mm256_loadu_ps(ys.as_ptr()));
            let (x1, y1) = (
                _mm256_loadu_ps(xs.as_ptr().add(8)),
                _mm256_loadu_ps(ys.as_ptr().add(8)),
            );
            lo = _mm256_add_ps(lo, _mm256_mul_ps(x0, y0));
            hi = _mm256_add_ps(hi, _mm256_mul_ps(x1, y1));
        }
    }
    let mut lanes = [0f32; 16];
    // SAFETY: `lanes` holds 16 floats.
    unsafe {
        _mm256_storeu_ps(lanes.as_mut_ptr(), lo);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), hi);
    }
    fold16(lanes, ta, tb)
}

/// `scores ← exp(scores − max)` in place; returns their sum (the softmax's denominator).
#[inline(always)]
fn exp_from_max(scores: &mut [f32]) -> f32 {
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    scores.iter_mut().for_each(|s| *s -= max);
    exp_f32_slice(scores);
    sum(scores)
}

/// One query head over the first `scores.len()` positions of the KV head `kv`.
#[inline(always)]
fn attend(
    out: &mut [f32],
    q: &[f32],
    kv: KvHead<'_>,
    scores: &mut [f32],
    scale: f32,
    dot: impl Fn(&[f32], &[f32]) -> f32,
) {
    for (j, s) in scores.iter_mut().enumerate() {
        *s = dot(q, kv.key(j)) * scale;
    }
    let total = exp_from_max(scores);
    out.fill(0.0);
    for (j, &p) in scores.iter().enumerate() {
        for (o, &v) in out.iter_mut().zip(kv.value(j)) {
            *o += p * v;
        }
    }
    let inv = total.recip();
    out.iter_mut().for_each(|o| *o *= inv);
}

/// The scaled scores [`attend`] computes with [`head_dot`], the same bits, for a head of
/// `16 · NV` elements in AVX-512 registers: 16 keys at a time, their 16 partial sums folded
/// together by lane shuffles in [`fold16`]'s order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn head_scores_avx512<const NV: usize>(scores: &mut [f32], q: &[f32], kv: KvHead<'_>, scale: f32) {
    use std::arch::x86_64::*;
    let d = 16 * NV;
    assert!(q.len() == d && kv.d == d, "attention head of {d} elements");
    // What `fold16` adds for the (empty) tail of a head of whole vectors.
    let tail = _mm512_set1_ps(std::iter::empty::<f32>().sum::<f32>());
    let scale_v = _mm512_set1_ps(scale);
    // Lane `4j + m` of the fold holds key `4m + j`.
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let mut qv = [_mm512_setzero_ps(); NV];
    for (c, v) in qv.iter_mut().enumerate() {
        // SAFETY: `q` holds 16 · NV floats.
        *v = unsafe { _mm512_loadu_ps(q.as_ptr().add(16 * c)) };
    }
    let mut blocks = scores.chunks_exact_mut(16);
    let mut j0 = 0;
    for block in &mut blocks {
        // The 16 keys' chains side by side, each over the head's vectors in order.
        let block_keys = kv.keys(j0, 16);
        let mut acc = [_mm512_setzero_ps(); 16];
        for (c, &qc) in qv.iter().enumerate() {
            for (key, a) in acc.iter_mut().enumerate() {
                // SAFETY: key `key` of the block starts at `key · kv_width` and holds 16 · NV
                // floats, inside `block_keys`.
                let kc =
                    unsafe { _mm512_loadu_ps(block_keys.as_ptr().add(key * kv.kv_width + 16 * c)) };
                *a = _mm512_add_ps(*a, _mm512_mul_ps(qc, kc));
            }
        }
        // h8 = lanes i + (i + 8): keys in pairs, [h8 of the first, h8 of the second].
        let h8: [__m512; 8] = std::array::from_fn(|p| {
            let (a, b) = (acc[2 * p], acc[2 * p + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
                _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
            )
        });
        // h4 = lanes i + (i + 4) of h8: four keys, one 128-bit block each.
        let h4: [__m512; 4] = std::array::from_fn(|p| {
            let (a, b) = (h8[2 * p], h8[2 * p + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
                _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
            )
        });
        // Per block: [h4[0] + h4[2], h4[1] + h4[3]] of two keys, interleaved...
        let u: [__m512; 2] = std::array::from_fn(|p| {
            let (a, b) = (h4[2 * p], h4[2 * p + 1]);
            _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b))
        });
        // ...then their sum: block `j` holds key `j` of each group of four.
        let folded = _mm512_add_ps(
            _mm512_shuffle_ps::<0b01_00_01_00>(u[0], u[1]),
            _mm512_shuffle_ps::<0b11_10_11_10>(u[0], u[1]),
        );
        let dots = _mm512_add_ps(_mm512_permutexvar_ps(order, folded), tail);
        // SAFETY: `block` holds 16 floats.
        unsafe { _mm512_storeu_ps(block.as_mut_ptr(), _mm512_mul_ps(dots, scale_v)) };
        j0 += 16;
    }
    for (j, s) in blocks.into_remainder().iter_mut().enumerate() {
        *s = head_dot_avx512(q, kv.key(j0 + j)) * scale;
    }
}

/// [`attend`] with [`head_dot`]'s bits for the query heads that share the KV head `kv`
/// (`q` and `out`: `[heads, 16 · NV]`; `scores`: one row per head): each head's scores by
/// [`head_scores_avx512`]'s blocked dot products, then the heads' weighted sums of the values in one
/// pass over them ([`weighted_values_avx512`]), each value row loaded once for all the heads.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn attend_group_avx512<const NV: usize>(
    out: &mut [f32],
    q: &[f32],
    kv: KvHead<'_>,
    scores: &mut [f32],
    scale: f32,
) {
    let d = 16 * NV;
    let heads = q.len() / d;
    let len = scores.len() / heads.max(1);
    let mut totals = vec![0f32; heads];
    for (h, total) in totals.iter_mut().enumerate() {
        let s = &mut scores[h * len..(h + 1) * len];
        head_scores_avx512::<NV>(s, &q[h * d..(h + 1) * d], kv, scale);
        *total = exp_from_max(s);
    }
    // Up to 16 accumulator registers per pass.
    let per_pass = (16 / NV).max(1);
    let mut h0 = 0;
    while h0 < heads {
        let n = per_pass.min(heads - h0);
        let (o, p, t) = (
            &mut out[h0 * d..(h0 + n) * d],
            &scores[h0 * len..(h0 + n) * len],
            &totals[h0..h0 + n],
        );
        match n {
            1 => weighted_values_avx512::<NV, 1>(o, p, t, kv),
            2 => weighted_values_avx512::<NV, 2>(o, p, t, kv),
            3 => weighted_values_avx512::<NV, 3>(o, p, t, kv),
            _ => weighted_values_avx512::<NV, 4>(o, p, t, kv),
        }
        h0 += n;
    }
}

/// `out[h] = Σ_j probs[h][j] · V[j] / totals[h]` for `H` heads over the values of `kv` at the
/// first `len = probs.len() / H` positions, the sums in position order as [`attend`] adds them:
/// one pass over the values, `H · NV` independent chains in registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn weighted_values_avx512<const NV: usize, const H: usize>(
    out: &mut [f32],
    probs: &[f32],
    totals: &[f32],
    kv: KvHead<'_>,
) {
    use std::arch::x86_64::*;
    let d = 16 * NV;
    let len = probs.len() / H;
    assert!(
        kv.d == d && out.len() == H * d && probs.len() == H * len && totals.len() == H,
        "weighted values of {H} heads of {d} over {len} positions"
    );
    let mut o = [[_mm512_setzero_ps(); NV]; H];
    for j in 0..len {
        let v = kv.value(j);
        // SAFETY: `v` holds 16 · NV floats.
        let vc: [__m512; NV] =
            std::array::from_fn(|c| unsafe { _mm512_loadu_ps(v.as_ptr().add(16 * c)) });
        for (h, o) in o.iter_mut().enumerate() {
            let p = _mm512_set1_ps(probs[h * len + j]);
            for (o, &vc) in o.iter_mut().zip(&vc) {
                *o = _mm512_add_ps(*o, _mm512_mul_ps(p, vc));
            }
        }
    }
    for (h, o) in o.iter().enumerate() {
        let inv = _mm512_set1_ps(totals[h].recip());
        for (c, o) in o.iter().enumerate() {
            // SAFETY: `out` holds H · 16 · NV floats.
            unsafe {
                _mm512_storeu_ps(out.as_mut_ptr().add(h * d + 16 * c), _mm512_mul_ps(*o, inv))
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random values in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    #[test]
    fn panel_products_match_f64_and_do_not_depend_on_the_row_count() {
        // Output widths that do and do not fill the last panel, rows across tiles and blocks.
        for &(inp, out) in &[(7usize, 5usize), (64, 48), (33, 70), (96, 130)] {
            let w = values(out * inp, inp as u64);
            let panels = Panels::pack(&w, inp).unwrap();
            let rows = 2 * ROW_BLOCK + MR + 1;
            let x = values(rows * inp, out as u64);
            let base = values(rows * out, 3);
            for accumulate in [false, true] {
                let mut all = base.clone();
                linear(&mut all, accumulate, &x, rows, &panels).unwrap();
                for r in 0..rows {
                    for n in 0..out {
                        let exact: f64 = (0..inp)
                            .map(|k| x[r * inp + k] as f64 * w[n * inp + k] as f64)
                            .sum::<f64>()
                            + if accumulate {
                                base[r * out + n] as f64
                            } else {
                                0.0
                            };
                        let got = all[r * out + n] as f64;
                        assert!(
                            (got - exact).abs() < 1e-5 * (1.0 + exact.abs()),
                            "{got} vs {exact}"
                        );
                    }
                }
                // Each row alone, and every other row count, gives the same bits.
                for take in [1, 2, MR - 1, MR + 1, ROW_BLOCK + 3] {
                    for r0 in (0..rows - take).step_by(take + 5) {
                        let mut part = base[r0 * out..(r0 + take) * out].to_vec();
                        let xs = &x[r0 * inp..(r0 + take) * inp];
                        linear(&mut part, accumulate, xs, take, &panels).unwrap();
                        assert_eq!(
                            part,
                            all[r0 * out..(r0 + take) * out],
                            "{take} rows at {r0}"
                        );
                    }
                }
            }
            let mut row = vec![0f32; inp];
            panels.row_into(out - 1, &mut row);
            assert_eq!(row, w[(out - 1) * inp..]);
        }
    }

    #[test]
    fn the_vector_tiles_compute_the_portable_tiles_bits() {
        let inp = 37;
        let w = values(NR * inp, 5);
        let panels = Panels::pack(&w, inp).unwrap();
        let block = &panels.data;
        for rows in 1..=MR {
            let xt = pack_rows(&values(rows * inp, 6), inp);
            let start: Vec<[f32; NR]> = (0..rows)
                .map(|r| std::array::from_fn(|j| (r * NR + j) as f32 * 0.01))
                .collect();
            let (mut fast, mut portable) = (start.clone(), start);
            tile_dispatch(true, &mut fast, &xt, 3, &block[3..30]);
            for (c, p) in portable.chunks_mut(MR_NARROW).enumerate() {
                tile_rows(p, &xt, rows, c * MR_NARROW, 3, &block[3..30]);
            }
            assert_eq!(fast, portable, "{rows} rows");
        }
    }

    #[test]
    fn the_vector_head_dots_compute_the_portable_bits() {
        for n in [64, 128, 37, 5] {
            let (a, b) = (values(n, 7), values(n, 8));
            let want = head_dot(&a, &b);
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU supports AVX-512F.
                    assert_eq!(unsafe { head_dot_avx512(&a, &b) }.to_bits(), want.to_bits());
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU supports AVX2.
                    assert_eq!(unsafe { head_dot_avx2(&a, &b) }.to_bits(), want.to_bits());
                }
            }
            let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((want as f64 - exact).abs() < 1e-5);
        }
    }

    /// The AVX-512 attention of a group of query heads (blocked scores, one pass over the
    /// values for all the heads) gives the portable attention's bits, head by head, for whole
    /// blocks of 16 keys and the keys after them.
    #[test]
    fn the_grouped_attention_computes_the_portable_bits() {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            for d in [64, 128] {
                for heads in [1, 3, 4, 5] {
                    for len in [1, 5, 16, 17, 33, 100] {
                        let kv_width = 2 * d;
                        let (k, v) = (values(len * kv_width, 3), values(len * kv_width, 4));
                        let q = values(heads * d, 5);
                        let seq = CachedSeq { k: &k, v: &v, n: 1 };
                        let kv = KvHead {
                            seq: &seq,
                            col: d,
                            kv_width,
                            d,
                        };
                        let mut want = vec![0f32; heads * d];
                        for (o, q) in want.chunks_exact_mut(d).zip(q.chunks_exact(d)) {
                            let mut s = vec![0f32; len];
                            attend(o, q, kv, &mut s, 0.125, head_dot);
                        }
                        let mut got = vec![0f32; heads * d];
                        let mut s = vec![0f32; heads * len];
                        // SAFETY: the CPU supports AVX-512F.
                        unsafe {
                            if d == 64 {
                                attend_group_avx512::<4>(&mut got, &q, kv, &mut s, 0.125)
                            } else {
                                attend_group_avx512::<8>(&mut got, &q, kv, &mut s, 0.125)
                            }
                        };
                        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&got), bits(&want), "d {d}, {heads} heads, {len} keys");
                    }
                }
            }
        }
    }

    #[test]
    fn panel_products_refuse_mismatched_buffers() {
        assert!(Panels::pack(&[1.0; 7], 2).is_err());
        assert!(Panels::pack(&[], 0).is_err());
        let p = Panels::pack(&[1.0; 6], 3).unwrap();
        assert!(linear(&mut [0.0; 2], false, &[1.0; 4], 1, &p).is_err());
        assert!(linear(&mut [0.0; 3], false, &[1.0; 3], 1, &p).is_err());
        let mut d = [0.0; 2];
        linear(&mut d, false, &[1.0; 3], 1, &p).unwrap();
        assert_eq!(d, [3.0, 3.0]);
    }
}
