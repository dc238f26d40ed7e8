//! Per-token log-probabilities (and entropy) through the lm_head without the `[N, V]` logits:
//! the forward pass walks `[rows × vocab block]` tiles with an online logsumexp and keeps three
//! numbers per token; the backward pass recomputes each tile's logits and turns them into the
//! gradients of the hidden states and of the lm_head in place.

use super::cpu::{c, gemm, slice, storage, tensor, with_slices, MatRef, Real};
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// Rows (tokens) per tile.
const TILE_ROWS: usize = 1024;
/// Elements per logits tile (32 MiB in f32).
const TILE_ELEMS: usize = 1 << 23;

/// Output columns per token.
pub(crate) const COLS: usize = 3;
/// Column of the target log-probability.
pub(crate) const COL_LOGP: usize = 0;
/// Column of the entropy (zero unless requested).
pub(crate) const COL_ENTROPY: usize = 1;
/// Column of the logsumexp of the tempered logits (kept for the backward pass).
const COL_LSE: usize = 2;

/// The op: `hidden [N, H]`, `lm_head [V, H]` → `[N, 3]` (log-prob, entropy, logsumexp).
pub(crate) struct TokenLogProbs {
    /// Target token of every row.
    pub targets: Vec<u32>,
    /// Softmax temperature.
    pub temperature: f64,
    /// Whether to compute the entropy.
    pub entropy: bool,
    /// Tile size `(rows, elements)`; the defaults [`TILE_ROWS`], [`TILE_ELEMS`] outside tests.
    pub tile: (usize, usize),
}

impl TokenLogProbs {
    /// The op with the default tile size.
    pub(crate) fn new(targets: Vec<u32>, temperature: f64, entropy: bool) -> Self {
        Self {
            targets,
            temperature,
            entropy,
            tile: (TILE_ROWS, TILE_ELEMS),
        }
    }

    /// `(rows per tile, vocabulary entries per tile)`.
    fn tile(&self, n: usize, vocab: usize) -> (usize, usize) {
        let (max_rows, elems) = self.tile;
        let rows = n.clamp(1, max_rows);
        let cols = (elems / rows).max(1).min(vocab.max(1));
        (rows, cols)
    }
}

/// Running online-softmax state of one row.
#[derive(Clone, Copy)]
struct RowState<T> {
    max: T,
    sum: T,
    /// Σ exp(z - max) · z, for the entropy.
    sum_z: T,
    target: T,
}

impl TokenLogProbs {
    fn fwd<T: Real>(&self, hid: &[T], w: &[T], h: usize) -> Result<Vec<T>> {
        let n = self.targets.len();
        let vocab = w.len() / h.max(1);
        let (tr, tv) = self.tile(n, vocab);
        let inv_t: T = c(1.0 / self.temperature);
        let mut logits = vec![T::zero(); tr * tv];
        let mut out = vec![T::zero(); n * COLS];
        let init = RowState {
            max: T::neg_infinity(),
            sum: T::zero(),
            sum_z: T::zero(),
            target: T::zero(),
        };
        for r0 in (0..n).step_by(tr) {
            let rows = tr.min(n - r0);
            let mut state = vec![init; rows];
            let targets = &self.targets[r0..r0 + rows];
            for v0 in (0..vocab).step_by(tv) {
                let cols = tv.min(vocab - v0);
                let hm = MatRef::rows(hid, r0 * h, rows, h, h);
                let wm = MatRef::rows(w, v0 * h, cols, h, h);
                gemm(&mut logits, 0, cols, false, hm, wm.t(), inv_t, true)?;
                logits[..rows * cols]
                    .par_chunks(cols)
                    .zip(state.par_iter_mut().zip(targets))
                    .for_each_init(Vec::new, |e, (z, (st, &tgt))| {
                        let bmax = z
                            .iter()
                            .fold(T::neg_infinity(), |m, &x| num_traits::Float::max(m, x));
                        let m = num_traits::Float::max(st.max, bmax);
                        let rescale = (st.max - m).exp();
                        // e = exp(z - m), vectorised.
                        e.clear();
                        e.extend(z.iter().map(|&x| x - m));
                        T::exp_in_place(e);
                        let (mut s, mut sz) = (T::zero(), T::zero());
                        if self.entropy {
                            for (&e, &x) in e.iter().zip(z) {
                                s += e;
                                sz += e * x;
                            }
                        } else {
                            for &e in e.iter() {
                                s += e;
                            }
                        }
                        st.sum = st.sum * rescale + s;
                        st.sum_z = st.sum_z * rescale + sz;
                        st.max = m;
                        let t = tgt as usize;
                        if (v0..v0 + cols).contains(&t) {
                            st.target = z[t - v0];
                        }
                    });
            }
            for (o, st) in out[r0 * COLS..(r0 + rows) * COLS]
                .chunks_exact_mut(COLS)
                .zip(&state)
            {
                let lse = st.max + st.sum.ln();
                o[COL_LOGP] = st.target - lse;
                if self.entropy {
                    o[COL_ENTROPY] = lse - st.sum_z / st.sum;
                }
                o[COL_LSE] = lse;
            }
        }
        Ok(out)
    }

    /// Gradients of the hidden states and of the lm_head given `res` and `grad` (`[N, 3]`).
    fn bwd_t<T: Real>(
        &self,
        hid: &[T],
        w: &[T],
        res: &[T],
        grad: &[T],
        h: usize,
    ) -> Result<(Vec<T>, Vec<T>)> {
        let n = self.targets.len();
        let vocab = w.len() / h.max(1);
        let (tr, tv) = self.tile(n, vocab);
        let inv_t: T = c(1.0 / self.temperature);
        let mut dh = vec![T::zero(); hid.len()];
        let mut dw = vec![T::zero(); w.len()];
        let mut dz = vec![T::zero(); tr * tv];
        for r0 in (0..n).step_by(tr) {
            let rows = tr.min(n - r0);
            let g = &grad[r0 * COLS..(r0 + rows) * COLS];
            let has_entropy_grad =
                self.entropy && g.chunks_exact(COLS).any(|g| g[COL_ENTROPY] != T::zero());
            if g.chunks_exact(COLS).all(|g| g[COL_LOGP] == T::zero()) && !has_entropy_grad {
                continue;
            }
            let r = &res[r0 * COLS..(r0 + rows) * COLS];
            let targets = &self.targets[r0..r0 + rows];
            let hm = MatRef::rows(hid, r0 * h, rows, h, h);
            for v0 in (0..vocab).step_by(tv) {
                let cols = tv.min(vocab - v0);
                let wm = MatRef::rows(w, v0 * h, cols, h, h);
                gemm(&mut dz, 0, cols, false, hm, wm.t(), inv_t, true)?;
                dz[..rows * cols]
                    .par_chunks_mut(cols)
                    .zip(g.par_chunks(COLS).zip(r.par_chunks(COLS)).zip(targets))
                    .for_each_init(Vec::new, |p, (z, ((g, r), &tgt))| {
                        let (gl, lse) = (g[COL_LOGP], r[COL_LSE]);
                        // z becomes the log-probs, p their exp (vectorised).
                        z.iter_mut().for_each(|x| *x -= lse);
                        p.clear();
                        p.extend_from_slice(z);
                        T::exp_in_place(p);
                        if has_entropy_grad {
                            let (ge, ent) = (g[COL_ENTROPY], r[COL_ENTROPY]);
                            for (x, &p) in z.iter_mut().zip(p.iter()) {
                                let lp = *x;
                                *x = -(gl * p + ge * p * (lp + ent)) * inv_t;
                            }
                        } else {
                            for (x, &p) in z.iter_mut().zip(p.iter()) {
                                *x = -(gl * p) * inv_t;
                            }
                        }
                        let t = tgt as usize;
                        if (v0..v0 + cols).contains(&t) {
                            z[t - v0] += gl * inv_t;
                        }
                    });
                let dzm = MatRef::rows(&dz, 0, rows, cols, cols);
                gemm(&mut dh, r0 * h, h, true, dzm, wm, T::one(), true)?;
                gemm(&mut dw, v0 * h, h, true, dzm.t(), hm, T::one(), true)?;
            }
        }
        Ok((dh, dw))
    }
}

impl CustomOp2 for TokenLogProbs {
    fn name(&self) -> &'static str {
        "rlreplay-token-logprobs"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let n = self.name();
        let h = l1.dims()[1];
        let shape = (self.targets.len(), COLS);
        match s1 {
            CpuStorage::F32(_) => Ok(storage(
                self.fwd::<f32>(slice(n, s1, l1)?, slice(n, s2, l2)?, h)?,
                shape,
            )),
            CpuStorage::F64(_) => Ok(storage(
                self.fwd::<f64>(slice(n, s1, l1)?, slice(n, s2, l2)?, h)?,
                shape,
            )),
            _ => bail!("{n}: unsupported dtype {:?}", s1.dtype()),
        }
    }

    fn bwd(
        &self,
        hidden: &Tensor,
        lm_head: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        fn run<T: Real>(
            op: &TokenLogProbs,
            [hid, w, res, g]: [&Tensor; 4],
        ) -> Result<(Tensor, Tensor)> {
            let h = hid.dims()[1];
            let (dh, dw) = with_slices::<T, _>(op.name(), &[hid, w, res, g], |s| {
                op.bwd_t(s[0], s[1], s[2], s[3], h)
            })?;
            Ok((tensor(dh, hid.shape())?, tensor(dw, w.shape())?))
        }
        let args = [hidden, lm_head, res, grad];
        let (dh, dw) = match hidden.dtype() {
            candle_core::DType::F32 => run::<f32>(self, args)?,
            candle_core::DType::F64 => run::<f64>(self, args)?,
            dt => bail!("{}: unsupported dtype {dt:?}", self.name()),
        };
        Ok((Some(dh), Some(dw)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// Several row tiles and several vocabulary tiles (including ragged last ones) give the same
    /// values and gradients as the composite reference.
    #[test]
    fn multi_tile_matches_composite() {
        let (n, vocab, h) = (23, 37, 5);
        let val = |i: usize, seed: f64| (i as f64 * 0.37 + seed).sin() * 1.7;
        let hid: Vec<f64> = (0..n * h).map(|i| val(i, 1.0)).collect();
        let w: Vec<f64> = (0..vocab * h).map(|i| val(i, 2.0)).collect();
        let targets: Vec<u32> = (0..n as u32).map(|i| (i * 11 + 5) % vocab as u32).collect();
        let gl: Vec<f64> = (0..n).map(|i| val(i, 3.0)).collect();
        let ge: Vec<f64> = (0..n).map(|i| val(i, 4.0)).collect();
        let dev = Device::Cpu;
        let run = |fused: bool| -> Result<Vec<Vec<f64>>> {
            let hv = Var::from_vec(hid.clone(), (n, h), &dev)?;
            let wv = Var::from_vec(w.clone(), (vocab, h), &dev)?;
            let (lp, ent) = if fused {
                let op = TokenLogProbs {
                    tile: (7, 7 * 10),
                    ..TokenLogProbs::new(targets.clone(), 1.3, true)
                };
                let out = hv.as_tensor().apply_op2(wv.as_tensor(), op)?;
                (
                    out.narrow(1, COL_LOGP, 1)?.squeeze(1)?,
                    out.narrow(1, COL_ENTROPY, 1)?.squeeze(1)?,
                )
            } else {
                let (lp, ent) = crate::ops::composite::token_logprobs(
                    hv.as_tensor(),
                    wv.as_tensor(),
                    &targets,
                    1.3,
                    true,
                    4,
                )?;
                (lp, ent.expect("entropy requested"))
            };
            let loss = ((&lp * Tensor::new(gl.as_slice(), &dev)?)?.sum_all()?
                + (&ent * Tensor::new(ge.as_slice(), &dev)?)?.sum_all()?)?;
            let grads = loss.backward()?;
            let flat = |t: &Tensor| t.flatten_all()?.to_vec1::<f64>();
            let gh = grads.get(hv.as_tensor()).expect("hidden gradient");
            let gw = grads.get(wv.as_tensor()).expect("lm_head gradient");
            Ok(vec![flat(&lp)?, flat(&ent)?, flat(gh)?, flat(gw)?])
        };
        let (fused, reference) = (run(true).unwrap(), run(false).unwrap());
        for (k, (a, b)) in fused.iter().zip(&reference).enumerate() {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert!((x - y).abs() < 1e-11, "output {k}[{i}]: {x} vs {y}");
            }
        }
    }
}
