//! Per-token log-probabilities (and entropy) through the lm_head without the `[N, V]` logits:
//! the forward pass walks `[rows × vocab block]` tiles with an online logsumexp and keeps three
//! numbers per token; the backward pass recomputes each tile's logits and turns them into the
//! gradients of the hidden states and of the lm_head in place.
//!
//! When the upstream gradient `g_t` of every log-prob is known before the forward pass (training:
//! the loss is `Σ g_t · logp_t`), [`TokenLogProbs::with_grad`] computes the gradients in the
//! forward pass itself, a chunk of `[rows × V]` logits at a time (three lm_head gemms, as a
//! framework that keeps the whole logits, instead of four), and the backward pass hands them on
//! when its upstream gradient is that `g` (it recomputes them for any other).

use super::cpu::{
    by_real_dtype, c, dot, gemm, max, slice, storage, sum, tensor, with_slices, MatRef, Real,
};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::sync::Mutex;

/// Rows (tokens) per tile.
const TILE_ROWS: usize = 1024;
/// Elements per logits tile (32 MiB in f32).
const TILE_ELEMS: usize = 1 << 23;
/// Fewest rows per `[rows × V]` logits chunk of the fused forward+backward pass (otherwise as
/// many as fit in [`TILE_ELEMS`]): enough that the `dW += dzᵀ · h` update of every chunk, which
/// reads and writes all of `dW`, is bound by arithmetic rather than memory.
const FUSED_MIN_ROWS: usize = 256;

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
    /// The gradients computed in the forward pass, when the upstream gradient is given.
    pub fused: Option<FusedGrad>,
    /// Whether the lm_head gets a gradient (`false` for a frozen one: no `dW` gemms).
    pub weight_grad: bool,
}

/// The gradient of `Σ g_t · logp_t` computed during the forward pass.
pub(crate) struct FusedGrad {
    /// `g_t` of every row.
    grad: Vec<f64>,
    /// `(fewest rows, elements)` of a logits chunk; [`FUSED_MIN_ROWS`], [`TILE_ELEMS`] outside
    /// tests.
    chunk: (usize, usize),
    /// `(d hidden, d lm_head)`, written by the forward pass and taken by the backward pass.
    grads: Mutex<Option<(Tensor, Option<Tensor>)>>,
}

impl TokenLogProbs {
    /// The op with the default tile size.
    pub(crate) fn new(targets: Vec<u32>, temperature: f64, entropy: bool) -> Self {
        Self {
            targets,
            temperature,
            entropy,
            tile: (TILE_ROWS, TILE_ELEMS),
            fused: None,
            weight_grad: true,
        }
    }

    /// The op that also computes, in its forward pass, the gradients of `Σ g_t · logp_t` with
    /// `g_t = grad[t]`, and hands them on in the backward pass when the upstream gradient of the
    /// log-probs is `g` (and zero for the other columns); any other upstream gradient is
    /// backpropagated by recomputing the logits, as without `grad`.
    pub(crate) fn with_grad(targets: Vec<u32>, temperature: f64, grad: Vec<f64>) -> Self {
        Self {
            fused: Some(FusedGrad {
                grad,
                chunk: (FUSED_MIN_ROWS, TILE_ELEMS),
                grads: Mutex::new(None),
            }),
            ..Self::new(targets, temperature, false)
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

impl<T: Real> RowState<T> {
    /// The state before any logit.
    fn new() -> Self {
        Self {
            max: T::neg_infinity(),
            sum: T::zero(),
            sum_z: T::zero(),
            target: T::zero(),
        }
    }
}

impl TokenLogProbs {
    fn fwd<T: Real>(&self, hid: &[T], w: &[T], h: usize) -> Result<Vec<T>> {
        let n = self.targets.len();
        let vocab = w.len() / h.max(1);
        let (tr, tv) = self.tile(n, vocab);
        let inv_t: T = c(1.0 / self.temperature);
        let mut logits = vec![T::zero(); tr * tv];
        let mut out = vec![T::zero(); n * COLS];
        for r0 in (0..n).step_by(tr) {
            let rows = tr.min(n - r0);
            let mut state = vec![RowState::new(); rows];
            let targets = &self.targets[r0..r0 + rows];
            for v0 in (0..vocab).step_by(tv) {
                let cols = tv.min(vocab - v0);
                let hm = MatRef::rows(hid, r0 * h, rows, h, h);
                let wm = MatRef::rows(w, v0 * h, cols, h, h);
                gemm(&mut logits, 0, cols, false, hm, wm.t(), inv_t, true)?;
                let z = &logits[..rows * cols];
                self.online_update(z, cols, 0, v0, cols, &mut state, targets);
            }
            self.finish(&state, &mut out[r0 * COLS..(r0 + rows) * COLS]);
        }
        Ok(out)
    }

    /// Folds the logits of vocabulary entries `v0..v0 + cols` into the running state of each row;
    /// row `r`'s logits are `z[r * ld + col0..r * ld + col0 + cols]`.
    #[allow(clippy::too_many_arguments)]
    fn online_update<T: Real>(
        &self,
        z: &[T],
        ld: usize,
        col0: usize,
        v0: usize,
        cols: usize,
        state: &mut [RowState<T>],
        targets: &[u32],
    ) {
        z.par_chunks(ld)
            .zip(state.par_iter_mut().zip(targets))
            .for_each_init(Vec::new, |e, (z, (st, &tgt))| {
                let z = &z[col0..col0 + cols];
                let bmax = max(z);
                let m = num_traits::Float::max(st.max, bmax);
                let rescale = (st.max - m).exp();
                // e = exp(z - m), vectorised.
                e.clear();
                e.extend(z.iter().map(|&x| x - m));
                T::exp_in_place(e);
                let s = sum(e);
                let sz = if self.entropy { dot(e, z) } else { T::zero() };
                st.sum = st.sum * rescale + s;
                st.sum_z = st.sum_z * rescale + sz;
                st.max = m;
                let t = tgt as usize;
                if (v0..v0 + cols).contains(&t) {
                    st.target = z[t - v0];
                }
            });
    }

    /// Writes the `[rows, 3]` output of the finished row states.
    fn finish<T: Real>(&self, state: &[RowState<T>], out: &mut [T]) {
        for (o, st) in out.chunks_exact_mut(COLS).zip(state) {
            let lse = st.max + st.sum.ln();
            o[COL_LOGP] = st.target - lse;
            if self.entropy {
                o[COL_ENTROPY] = lse - st.sum_z / st.sum;
            }
            o[COL_LSE] = lse;
        }
    }

    /// The forward pass with the gradients of `Σ g_t · logp_t` (`g_t = grad[t]`): per chunk of
    /// rows, the `[rows, V]` logits tile by tile (the same tiles and online logsumexp as
    /// [`Self::fwd`], so the outputs are the same), then their gradient in place, `dh = dz · W`
    /// and `dW += dzᵀ · h` (without `weight_grad`, an empty `dW`). Returns `(out, dh, dW)`.
    fn fwd_fused<T: Real>(
        &self,
        hid: &[T],
        w: &[T],
        h: usize,
        fused: &FusedGrad,
    ) -> Result<(Vec<T>, Vec<T>, Vec<T>)> {
        let n = self.targets.len();
        let vocab = w.len() / h.max(1);
        let (_, tv) = self.tile(n, vocab);
        let (min_rows, elems) = fused.chunk;
        let chunk = (elems / vocab.max(1)).max(min_rows).clamp(1, n.max(1));
        let inv_t: T = c(1.0 / self.temperature);
        let mut z = vec![T::zero(); chunk * vocab];
        let mut out = vec![T::zero(); n * COLS];
        let mut dh = vec![T::zero(); hid.len()];
        let mut dw = vec![T::zero(); if self.weight_grad { w.len() } else { 0 }];
        let wall = MatRef::rows(w, 0, vocab, h, h);
        let mut first = true;
        for r0 in (0..n).step_by(chunk) {
            let rows = chunk.min(n - r0);
            let mut state = vec![RowState::new(); rows];
            let targets = &self.targets[r0..r0 + rows];
            let hm = MatRef::rows(hid, r0 * h, rows, h, h);
            let z = &mut z[..rows * vocab];
            for v0 in (0..vocab).step_by(tv) {
                let cols = tv.min(vocab - v0);
                let wm = MatRef::rows(w, v0 * h, cols, h, h);
                gemm(z, v0, vocab, false, hm, wm.t(), inv_t, true)?;
                self.online_update(z, vocab, v0, v0, cols, &mut state, targets);
            }
            let out = &mut out[r0 * COLS..(r0 + rows) * COLS];
            self.finish(&state, out);
            let g: Vec<T> = fused.grad[r0..r0 + rows].iter().map(|&g| c(g)).collect();
            if g.iter().all(|&g| g == T::zero()) {
                continue;
            }
            z.par_chunks_mut(vocab)
                .zip(g.par_iter().zip(out.par_chunks(COLS)).zip(targets))
                .for_each(|(z, ((&gl, o), &tgt))| {
                    // z becomes the probabilities, then the gradient of the logits (as in
                    // `bwd_t` without an entropy gradient).
                    let lse = o[COL_LSE];
                    z.iter_mut().for_each(|x| *x -= lse);
                    T::exp_in_place(z);
                    z.iter_mut().for_each(|x| *x = -(gl * *x) * inv_t);
                    z[tgt as usize] += gl * inv_t;
                });
            let dzm = MatRef::rows(z, 0, rows, vocab, vocab);
            gemm(&mut dh, r0 * h, h, false, dzm, wall, T::one(), true)?;
            if self.weight_grad {
                gemm(&mut dw, 0, h, !first, dzm.t(), hm, T::one(), true)?;
            }
            first = false;
        }
        Ok((out, dh, dw))
    }

    /// Gradients of the hidden states and of the lm_head given `res` and `grad` (`[N, 3]`);
    /// without `weight_grad` an empty lm_head gradient.
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
        let mut dw = vec![T::zero(); if self.weight_grad { w.len() } else { 0 }];
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
                if self.weight_grad {
                    gemm(&mut dw, v0 * h, h, true, dzm.t(), hm, T::one(), true)?;
                }
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
        fn run<T: Real>(
            op: &TokenLogProbs,
            (s1, l1): (&CpuStorage, &Layout),
            (s2, l2): (&CpuStorage, &Layout),
        ) -> Result<(CpuStorage, Shape)> {
            let n = op.name();
            let (hid, w) = (slice::<T>(n, s1, l1)?, slice::<T>(n, s2, l2)?);
            let h = l1.dims()[1];
            let shape = (op.targets.len(), COLS);
            let Some(fused) = &op.fused else {
                return Ok(storage(op.fwd(hid, w, h)?, shape));
            };
            let (out, dh, dw) = op.fwd_fused(hid, w, h, fused)?;
            let dw = match op.weight_grad {
                true => Some(tensor(dw, l2.shape())?),
                false => None,
            };
            let grads = (tensor(dh, l1.shape())?, dw);
            *fused
                .grads
                .lock()
                .map_err(|_| candle_core::Error::Msg(format!("{n}: poisoned lock")))? = Some(grads);
            Ok(storage(out, shape))
        }
        by_real_dtype!(self.name(), s1.dtype(), run(self, (s1, l1), (s2, l2)))
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
        ) -> Result<(Tensor, Option<Tensor>)> {
            if let Some(grads) = op.fused_grads::<T>(g)? {
                return Ok(grads);
            }
            let h = hid.dims()[1];
            let (dh, dw) = with_slices::<T, _>(op.name(), &[hid, w, res, g], |s| {
                op.bwd_t(s[0], s[1], s[2], s[3], h)
            })?;
            let dw = match op.weight_grad {
                true => Some(tensor(dw, w.shape())?),
                false => None,
            };
            Ok((tensor(dh, hid.shape())?, dw))
        }
        let args = [hidden, lm_head, res, grad];
        let (dh, dw) = by_real_dtype!(self.name(), hidden.dtype(), run(self, args))?;
        Ok((Some(dh), dw))
    }
}

impl TokenLogProbs {
    /// The gradients the fused forward pass computed, when the upstream gradient `grad`
    /// (`[N, 3]`) is exactly the `g` they were computed for (zero in the entropy and logsumexp
    /// columns); `None` otherwise, or when they were already handed on.
    fn fused_grads<T: Real>(&self, grad: &Tensor) -> Result<Option<(Tensor, Option<Tensor>)>> {
        let Some(fused) = &self.fused else {
            return Ok(None);
        };
        let matches = with_slices::<T, _>(self.name(), &[grad], |s| {
            Ok(s[0].len() == fused.grad.len() * COLS
                && s[0].chunks_exact(COLS).zip(&fused.grad).all(|(u, &g)| {
                    u[COL_LOGP] == c::<T>(g)
                        && u[COL_ENTROPY] == T::zero()
                        && u[COL_LSE] == T::zero()
                }))
        })?;
        if !matches {
            return Ok(None);
        }
        let mut guard = fused
            .grads
            .lock()
            .map_err(|_| candle_core::Error::Msg(format!("{}: poisoned lock", self.name())))?;
        Ok(guard.take())
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

    /// The fused forward+backward gives the plain op's log-probs bit for bit and its gradients,
    /// over several row chunks (one of them with zero weights) and vocabulary tiles; an upstream
    /// gradient other than the one it was given is backpropagated by recomputing, exactly as
    /// without the fusion.
    #[test]
    fn fused_gradients_match_the_recomputing_backward() {
        let (n, vocab, h) = (23, 37, 5);
        let val = |i: usize, seed: f64| (i as f64 * 0.37 + seed).sin() * 1.7;
        let hid: Vec<f64> = (0..n * h).map(|i| val(i, 1.0)).collect();
        let w: Vec<f64> = (0..vocab * h).map(|i| val(i, 2.0)).collect();
        let targets: Vec<u32> = (0..n as u32).map(|i| (i * 11 + 5) % vocab as u32).collect();
        let gl: Vec<f64> = (0..n)
            .map(|i| if i < 5 { 0.0 } else { val(i, 3.0) })
            .collect();
        let dev = Device::Cpu;
        let run = |fused: bool, upstream: f64| -> Result<Vec<Vec<f64>>> {
            let hv = Var::from_vec(hid.clone(), (n, h), &dev)?;
            let wv = Var::from_vec(w.clone(), (vocab, h), &dev)?;
            let plain = TokenLogProbs {
                tile: (7, 7 * 10),
                ..TokenLogProbs::new(targets.clone(), 1.3, false)
            };
            let op = if fused {
                TokenLogProbs {
                    fused: Some(FusedGrad {
                        grad: gl.clone(),
                        chunk: (5, 4 * vocab),
                        grads: Mutex::new(None),
                    }),
                    ..plain
                }
            } else {
                plain
            };
            let out = hv.as_tensor().apply_op2(wv.as_tensor(), op)?;
            let lp = out.narrow(1, COL_LOGP, 1)?.squeeze(1)?;
            let g = (Tensor::new(gl.as_slice(), &dev)? * upstream)?;
            let grads = (&lp * g)?.sum_all()?.backward()?;
            let flat = |t: &Tensor| t.flatten_all()?.to_vec1::<f64>();
            let gh = grads.get(hv.as_tensor()).expect("hidden gradient");
            let gw = grads.get(wv.as_tensor()).expect("lm_head gradient");
            Ok(vec![flat(&lp)?, flat(gh)?, flat(gw)?])
        };
        for upstream in [1.0, -0.5] {
            let (fused, plain) = (run(true, upstream).unwrap(), run(false, upstream).unwrap());
            assert_eq!(fused[0], plain[0], "log-probs");
            for (k, (a, b)) in fused.iter().zip(&plain).enumerate().skip(1) {
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    assert!(
                        (x - y).abs() < 1e-12,
                        "{upstream}: gradient {k}[{i}]: {x} vs {y}"
                    );
                }
            }
            assert!(fused[1][..5 * h].iter().all(|&x| x == 0.0));
        }
    }
}
