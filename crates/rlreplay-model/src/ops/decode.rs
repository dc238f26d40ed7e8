//! Inference-only f32 CPU kernels of the incremental decoder (no autograd, no backward): matrix
//! products against `[out, in]` weights, RMSNorm, per-head RMSNorm fused with RoPE, SwiGLU, and
//! grouped-query attention of the new tokens of many sequences over their own KV caches.
//!
//! All functions work on row-major slices; the caller owns every buffer, so a decode step allocates
//! nothing per sequence or per layer.

use super::cpu::{dot, exp_f32_slice, gemm, sum, MatRef};
use candle_core::{bail, Result};
use rayon::prelude::*;

/// Elements per parallel task of the row-wise kernels (smaller inputs run on the caller's thread).
const MIN_TASK: usize = 1 << 14;

/// `dst[rows, out] (+)= x[rows, in] · wt[in, out]` (accumulating into `dst` when `accumulate`).
/// Weights are stored transposed (`[in, out]`, output index contiguous) so that the matrix
/// product reads them in place instead of repacking them on every call.
pub(crate) fn linear(
    dst: &mut [f32],
    accumulate: bool,
    x: &[f32],
    rows: usize,
    wt: &[f32],
    out: usize,
) -> Result<()> {
    let inp = x.len().checked_div(rows).unwrap_or(0);
    if rows * inp != x.len() || wt.len() != out * inp || dst.len() != rows * out {
        bail!(
            "decode linear: x {} / w {} / dst {} do not fit {rows} rows and {out} outputs",
            x.len(),
            wt.len(),
            dst.len()
        );
    }
    if rows == 1 {
        // One row would take gemm's matrix-vector path, which sums in another order than its
        // matrix kernel: run it as two equal rows so that a sequence's logits are the same bits
        // whether it runs alone or among others (data-parallel ranks generating parts of a step
        // sample what one process samples whole).
        let x2 = [x, x].concat();
        let mut d2 = if accumulate {
            [&*dst, &*dst].concat()
        } else {
            vec![0f32; 2 * out]
        };
        linear(&mut d2, accumulate, &x2, 2, wt, out)?;
        dst.copy_from_slice(&d2[..out]);
        return Ok(());
    }
    let a = MatRef::rows(x, 0, rows, inp, inp);
    let b = MatRef::rows(wt, 0, inp, out, out);
    let parallel = rayon::current_num_threads() > 1 && rows * inp * out >= 1 << 16;
    gemm(dst, 0, out, accumulate, a, b, 1.0, parallel)
}

/// The `[cols, rows]` transpose of a row-major `[rows, cols]` matrix.
pub(crate) fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; m.len()];
    for (r, row) in m.chunks_exact(cols).enumerate().take(rows) {
        for (c, &v) in row.iter().enumerate() {
            t[c * rows + r] = v;
        }
    }
    t
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
            let seq = &seqs[s];
            let len = seq.k.len() / kv_width;
            let mut scores = vec![0f32; len];
            for i in 0..rows {
                let visible = len - seq.n + r0 + i + 1;
                let q = &qkv[(packed + i) * width..(packed + i) * width + hq * d];
                let o = &mut out[i * hq * d..(i + 1) * hq * d];
                for h in 0..hq {
                    let g = h / (hq / hkv);
                    attend(
                        &mut o[h * d..(h + 1) * d],
                        &q[h * d..(h + 1) * d],
                        seq,
                        g * d,
                        kv_width,
                        &mut scores[..visible],
                        dims.scale,
                    );
                }
            }
        });
    Ok(())
}

/// One query head over the first `scores.len()` positions of KV head columns `col..col + D`.
fn attend(
    out: &mut [f32],
    q: &[f32],
    seq: &CachedSeq<'_>,
    col: usize,
    kv_width: usize,
    scores: &mut [f32],
    scale: f32,
) {
    let d = q.len();
    let mut max = f32::NEG_INFINITY;
    for (j, s) in scores.iter_mut().enumerate() {
        let k = &seq.k[j * kv_width + col..j * kv_width + col + d];
        *s = dot(q, k) * scale;
        max = max.max(*s);
    }
    scores.iter_mut().for_each(|s| *s -= max);
    exp_f32_slice(scores);
    let total = sum(scores);
    out.fill(0.0);
    for (j, &p) in scores.iter().enumerate() {
        let v = &seq.v[j * kv_width + col..j * kv_width + col + d];
        for (o, &v) in out.iter_mut().zip(v) {
            *o += p * v;
        }
    }
    let inv = total.recip();
    out.iter_mut().for_each(|o| *o *= inv);
}
