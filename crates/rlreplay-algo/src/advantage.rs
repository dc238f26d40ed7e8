//! Group advantage estimators, grouped by uid, as verl computes them.

use std::collections::BTreeMap;

use crate::config::{AdvEstimator, AlgoConfig, SingletonPolicy};
use crate::error::{AlgoError, Result};
use crate::layout::Rows;
use crate::metrics::{insert_stats, Metrics};

/// The estimators of [`AdvEstimator::binarizes_scores`] count a score above this as a success
/// inside their formulas (the reference's `s > 0.5`); it is not `success_reward_threshold`.
pub const ESTIMATOR_BINARY_THRESHOLD: f64 = 0.5;

/// ε of GRPO's std and MaxRL's mean denominators.
pub const EPS: f64 = 1e-6;

/// Advantages of one batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Advantages {
    /// One value per row. For `reinforce_plus_plus` (per-token returns) it is the advantage of
    /// the row's first valid token (0 for a row without valid tokens).
    pub rows: Vec<f64>,
    /// One value per token (flat, like the inputs); 0 on invalid tokens.
    pub tokens: Vec<f64>,
    /// `critic/score/*` (over rows), `critic/advantages/*` (over valid tokens) and the group
    /// counts `advantage/groups`, `advantage/singleton_groups`, `advantage/uniform_groups`
    /// (all scores equal), `advantage/whiten_degenerate` (whitening over ≤ 1 valid token).
    pub metrics: Metrics,
}

/// Computes advantages per row and per token.
///
/// Rows are grouped by `uids` (row order does not matter); `scores` holds one sequence score per
/// row; `offsets` describes each row's tokens; `mask` marks valid tokens (all valid when `None`;
/// tokens rejected by rollout rejection sampling must be invalid here). A group of one rollout gets
/// advantage 0 unless `singleton_groups` is `verl`.
pub fn compute_advantages<S: AsRef<str>>(
    cfg: &AlgoConfig,
    uids: &[S],
    scores: &[f64],
    offsets: &[usize],
    mask: Option<&[bool]>,
) -> Result<Advantages> {
    cfg.validate()?;
    let rows = Rows::new(offsets, 0)?;
    rows.check_rows("uids", uids)?;
    rows.check_finite_rows("scores", scores)?;
    let valid = rows.valid(mask)?;
    let n = rows.len();
    let lens: Vec<usize> = (0..n)
        .map(|i| valid[rows.range(i)].iter().filter(|&&v| v).count())
        .collect();

    let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, u) in uids.iter().enumerate() {
        groups.entry(u.as_ref()).or_default().push(i);
    }
    let mut metrics = Metrics::new();
    let singletons = groups.values().filter(|g| g.len() == 1).count();
    let uniform = groups
        .values()
        .filter(|g| g.iter().all(|&i| scores[i] == scores[g[0]]))
        .count();
    metrics.insert("advantage/groups".into(), groups.len() as f64);
    metrics.insert("advantage/singleton_groups".into(), singletons as f64);
    metrics.insert("advantage/uniform_groups".into(), uniform as f64);

    let zero_singletons = cfg.singleton_groups == SingletonPolicy::Zero;
    let mut row_adv = vec![0.0; n];
    let mut tokens = vec![0.0; rows.tokens()];
    let mut degenerate = false;
    match cfg.adv_estimator {
        AdvEstimator::ReinforcePlusPlus => {
            // Discounted returns of the score placed at the row's last token, reset after
            // invalid tokens, then whitened over all valid tokens of the batch.
            for (i, &score) in scores.iter().enumerate() {
                let r = rows.range(i);
                let mut g = 0.0;
                for t in r.clone().rev() {
                    let reward = if t + 1 == r.end { score } else { 0.0 };
                    g = reward + cfg.gamma * g;
                    tokens[t] = g;
                    if !valid[t] {
                        g = 0.0;
                    }
                }
            }
            degenerate = whiten(&mut tokens, &valid)?;
        }
        AdvEstimator::ReinforcePlusPlusBaseline => {
            let mut include = valid.clone();
            for (uid, g) in &groups {
                let mean = if g.len() == 1 {
                    0.0
                } else {
                    let m = g.iter().map(|&i| scores[i]).sum::<f64>() / g.len() as f64;
                    finite_stat(m, "mean", &format!("group `{uid}`'s scores"))?
                };
                for &i in g {
                    let a = scores[i] - mean;
                    for t in rows.range(i) {
                        tokens[t] = a;
                        if g.len() == 1 && zero_singletons {
                            include[t] = false;
                        }
                    }
                }
            }
            degenerate = whiten(&mut tokens, &include)?;
            for (x, &inc) in tokens.iter_mut().zip(&include) {
                if !inc {
                    *x = 0.0;
                }
            }
        }
        est => {
            for (uid, g) in &groups {
                let s: Vec<f64> = g.iter().map(|&i| scores[i]).collect();
                let l: Vec<usize> = g.iter().map(|&i| lens[i]).collect();
                let a = if g.len() == 1 && zero_singletons {
                    vec![0.0]
                } else {
                    let of = format!("group `{uid}`'s scores");
                    let a = group_advantages(cfg, est, &s, &l, &of)?;
                    if let Some(x) = a.iter().find(|x| !x.is_finite()) {
                        finite_stat(*x, "advantage", &of)?;
                    }
                    a
                };
                for (&i, a) in g.iter().zip(a) {
                    row_adv[i] = a;
                    for t in rows.range(i) {
                        tokens[t] = a;
                    }
                }
            }
        }
    }
    for (x, &v) in tokens.iter_mut().zip(&valid) {
        if !v {
            *x = 0.0;
        }
    }
    if cfg.adv_estimator.token_level() {
        for (i, a) in row_adv.iter_mut().enumerate() {
            let r = rows.range(i);
            *a = r.clone().find(|&t| valid[t]).map_or(0.0, |t| tokens[t]);
        }
    }
    metrics.insert(
        "advantage/whiten_degenerate".into(),
        f64::from(u8::from(degenerate)),
    );
    insert_stats(&mut metrics, "critic/score", scores.iter().copied());
    insert_stats(
        &mut metrics,
        "critic/advantages",
        tokens
            .iter()
            .zip(&valid)
            .filter(|(_, &v)| v)
            .map(|(&a, _)| a),
    );
    Ok(Advantages {
        rows: row_adv,
        tokens,
        metrics,
    })
}

/// verl's `masked_whiten` (unbiased variance, 1e-8 guards) in place over the included tokens.
/// Returns true (and sets everything to 0) when at most one token is included; fails when the
/// mean or variance overflows.
fn whiten(xs: &mut [f64], include: &[bool]) -> Result<bool> {
    let n = include.iter().filter(|&&v| v).count() as f64;
    if n <= 1.0 {
        xs.iter_mut().for_each(|x| *x = 0.0);
        return Ok(true);
    }
    let sel = || xs.iter().zip(include).filter(|(_, &v)| v).map(|(&x, _)| x);
    let mean = finite_stat(
        sel().sum::<f64>() / (n + 1e-8),
        "mean",
        "the batch's returns",
    )?;
    let var = finite_stat(
        sel().map(|x| (x - mean).powi(2)).sum::<f64>() / (n + 1e-8) * n / (n - 1.0),
        "variance",
        "the batch's returns",
    )?;
    let scale = 1.0 / (var + 1e-8).sqrt();
    for x in xs.iter_mut() {
        *x = (*x - mean) * scale;
    }
    Ok(false)
}

/// `value` when finite; otherwise the error that the `what` of `of` overflows f64 (scores so
/// large that their sums or squares do not fit would otherwise turn into silent zeros or NaN).
fn finite_stat(value: f64, what: &str, of: &str) -> Result<f64> {
    if value.is_finite() {
        Ok(value)
    } else {
        Err(AlgoError::Invalid(format!(
            "the {what} of {of} is {value} in f64: the scores are too large; rescale the rewards"
        )))
    }
}

fn mean(s: &[f64]) -> f64 {
    s.iter().sum::<f64>() / s.len() as f64
}

/// Unbiased (Bessel) standard deviation; 1 for fewer than two values (verl's singleton rule).
fn unbiased_std(s: &[f64]) -> f64 {
    if s.len() < 2 {
        return 1.0;
    }
    let m = mean(s);
    (s.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (s.len() - 1) as f64).sqrt()
}

/// Binomial coefficient as f64; 0 for invalid arguments (n < 0, k < 0, k > n).
pub fn binom(n: i64, k: i64) -> f64 {
    if n < 0 || k < 0 || k > n {
        return 0.0;
    }
    let k = k.min(n - k);
    (0..k).fold(1.0, |acc, j| acc * (n - j) as f64 / (j + 1) as f64)
}

/// Per-sample weights `(w_succ, w_fail)` of the MaxRL compute-indexed family for a group of `n`
/// rollouts with `c` successes, truncation order `t` and `pass_k` (only `pkpo` uses it; `pkpo`
/// returns its per-success score `a` before the leave-one-out baseline as `w_succ`).
pub fn maxrl_family_weights(est: AdvEstimator, n: usize, c: usize, t: usize) -> (f64, f64) {
    let (n_, c_, t_) = (n as i64, c as i64, t as i64);
    let f_ = n_ - c_;
    let nf = n as f64;
    match est {
        AdvEstimator::Maclaurin => {
            let mut w_fail = 0.0;
            if t_ >= 2 && n_ >= 2 {
                for k in 2..=t_.min(f_) {
                    w_fail -= binom(f_ - 1, k - 1) / binom(n_ - 1, k - 1);
                }
            }
            (1.0 / nf, w_fail / nf)
        }
        AdvEstimator::MaclaurinBaseline => {
            let (mut ws, mut wf) = (1.0 / nf, 0.0);
            for k in 2..=t_.min(n_ - 1) {
                if f_ >= k {
                    let rho = binom(f_, k) / (binom(n_, k) - 1.0);
                    ws += rho / nf;
                    wf += rho * (1.0 / nf - 1.0 / f_ as f64);
                }
            }
            if t_ >= n_ && f_ == n_ {
                wf -= 1.0 / nf;
            }
            (ws, wf)
        }
        AdvEstimator::CrossFittedMaclaurin => {
            let s_ = c_;
            let (mut ws, mut wf) = (1.0 / nf, 0.0);
            for k in 2..=t_.min(n_) {
                let denom = k as f64 * binom(n_, k);
                wf -= binom(f_ - 1, k - 1) / denom;
                if n_ >= 2 * k {
                    let tuples = binom(n_ - k, k);
                    let (mut af, mut as_) = (0.0, 0.0);
                    for j in 0..k {
                        af += binom(f_ - 1, j) * binom(s_, k - 1 - j) * binom(f_ - 1 - j, k);
                        as_ += binom(f_, j) * binom(s_ - 1, k - 1 - j) * binom(f_ - j, k);
                    }
                    wf += af / tuples / denom;
                    ws += as_ / tuples / denom;
                }
            }
            (ws, wf)
        }
        AdvEstimator::OversampleSubsetVr => {
            let te = t_.min(n_);
            let mut cc = 0.0;
            if c_ > 0 {
                for k in 1..=te.min(c_) {
                    cc += binom(c_ - 1, k - 1) * binom(f_, te - k) / k as f64;
                }
                cc /= binom(n_, te);
            }
            (cc - 1.0 / nf, -1.0 / nf)
        }
        AdvEstimator::VrCond => {
            let ws = if c_ > 0 {
                1.0 / c as f64 - 1.0 / nf
            } else {
                0.0
            };
            (ws, -1.0 / nf)
        }
        _ => (0.0, 0.0),
    }
}

/// Advantages of one group (scores `s`, valid lengths `lens`, described by `of` in errors) under
/// a group estimator.
fn group_advantages(
    cfg: &AlgoConfig,
    est: AdvEstimator,
    s: &[f64],
    lens: &[usize],
    of: &str,
) -> Result<Vec<f64>> {
    let n = s.len();
    let mu = finite_stat(if n == 1 { 0.0 } else { mean(s) }, "mean", of)?;
    let std = || finite_stat(unbiased_std(s), "standard deviation", of);
    // The reference's binarisation, part of these estimators' formulas (algorithms.md §3).
    let binary: Vec<bool> = s.iter().map(|&x| x > ESTIMATOR_BINARY_THRESHOLD).collect();
    let c = binary.iter().filter(|&&b| b).count();
    Ok(match est {
        AdvEstimator::Grpo => {
            if cfg.norm_adv_by_std_in_grpo {
                let sd = std()?;
                s.iter().map(|x| (x - mu) / (sd + EPS)).collect()
            } else {
                s.iter().map(|x| x - mu).collect()
            }
        }
        AdvEstimator::Rloo => {
            if n == 1 {
                s.to_vec()
            } else {
                let k = n as f64 / (n as f64 - 1.0);
                s.iter().map(|x| k * x - k * mu).collect()
            }
        }
        AdvEstimator::Maxrl => s.iter().map(|x| (x - mu) / (mu + EPS)).collect(),
        AdvEstimator::Opo => {
            let total: usize = lens.iter().sum();
            let b = if n == 1 {
                0.0
            } else if total == 0 {
                mu
            } else {
                s.iter().zip(lens).map(|(x, &l)| x * l as f64).sum::<f64>() / total as f64
            };
            s.iter().map(|x| x - b).collect()
        }
        AdvEstimator::GrpoPassk => {
            if n < 2 {
                return Err(AlgoError::Invalid(
                    "grpo_passk needs at least 2 rollouts per group".into(),
                ));
            }
            let best = (0..n).fold(0, |b, i| if s[i] > s[b] { i } else { b });
            let second = (0..n)
                .filter(|&i| i != best)
                .map(|i| s[i])
                .fold(f64::NEG_INFINITY, f64::max);
            let mut gap = s[best] - second;
            if cfg.norm_adv_by_std_in_grpo {
                gap /= std()? + EPS;
            }
            let mut out = vec![0.0; n];
            out[best] = gap;
            out
        }
        AdvEstimator::Pkpo => {
            let k = cfg.pass_k as i64;
            let (n_, c_) = (n as i64, c as i64);
            let a: Vec<f64> = binary
                .iter()
                .map(|&b| {
                    if b {
                        let d = binom(n_ - 1, k - 1);
                        if d > 0.0 {
                            binom(n_ - c_, k - 1) / d
                        } else {
                            0.0
                        }
                    } else {
                        0.0
                    }
                })
                .collect();
            if n == 1 {
                a
            } else {
                let sum: f64 = a.iter().sum();
                a.iter()
                    .map(|x| (n as f64 * x - sum) / (n as f64 - 1.0))
                    .collect()
            }
        }
        AdvEstimator::Maclaurin
        | AdvEstimator::MaclaurinBaseline
        | AdvEstimator::CrossFittedMaclaurin
        | AdvEstimator::OversampleSubsetVr
        | AdvEstimator::VrCond => {
            let (ws, wf) = maxrl_family_weights(est, n, c, cfg.truncate_order);
            binary.iter().map(|&b| if b { ws } else { wf }).collect()
        }
        AdvEstimator::ReinforcePlusPlus | AdvEstimator::ReinforcePlusPlusBaseline => {
            unreachable!("token-level estimators are handled by compute_advantages")
        }
    })
}
