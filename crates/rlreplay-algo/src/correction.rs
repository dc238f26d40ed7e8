//! Rollout correction: importance weights between the trainer's and the rollout engine's
//! log-probs, rejection masks, and verl's `rollout_corr/*` metrics.

use crate::config::{AlgoConfig, IsLevel, IsMode, RsThreshold};
use crate::error::{AlgoError, Result};
use crate::layout::Rows;
use crate::metrics::{mean_max_min, Metrics};

/// Bound on log-ratios before exponentiation.
pub const SAFETY_BOUND: f64 = 20.0;

/// The divergence a rejection option measures per token (δ = ℓ_old − ℓ_roll).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Divergence {
    /// `k1 = −δ`, compared with log ratio bounds.
    K1,
    /// `k2 = δ²/2`.
    K2,
    /// `k3 = e^δ − 1 − δ`.
    K3,
}

impl Divergence {
    /// The divergence of one token's log-ratio `δ`, clamped to ±[`SAFETY_BOUND`] first.
    pub fn of(self, delta: f64) -> f64 {
        let d = delta.clamp(-SAFETY_BOUND, SAFETY_BOUND);
        match self {
            Divergence::K1 => -d,
            Divergence::K2 => 0.5 * d * d,
            Divergence::K3 => d.exp() - 1.0 - d,
        }
    }
}

/// The importance weight `exp(clamp(x, ±SAFETY_BOUND))` of a log-ratio `x`.
pub fn is_weight(log_ratio: f64) -> f64 {
    log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
}

/// How a rejection option aggregates a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RsAgg {
    /// Each token on its own.
    Token,
    /// Sum over the row's valid tokens.
    SeqSum,
    /// Mean over the row's valid tokens.
    SeqMean,
    /// Max over the row's valid tokens (0 for an empty row).
    SeqMax,
}

/// One rejection-sampling option with its bounds: keep iff `lower ≤ stat ≤ upper`.
#[derive(Debug, Clone, PartialEq)]
pub struct RsOption {
    /// The option's name (`token_k1`, `seq_mean_k3`, ...).
    pub name: String,
    /// Aggregation.
    pub agg: RsAgg,
    /// Divergence.
    pub div: Divergence,
    /// Lower bound on the statistic (−∞ for k2/k3).
    pub lower: f64,
    /// Upper bound on the statistic.
    pub upper: f64,
}

const RS_NAMES: &[&str] = &[
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
];

fn rs_err(msg: String) -> AlgoError {
    AlgoError::Config {
        key: "rollout_rs_threshold",
        msg,
    }
}

/// Parses `rollout_rs` (comma-separated options) and `rollout_rs_threshold`: one number for all
/// options, or a string with one entry per option (or one for all), each `"u"` or `"lower_upper"`.
/// k1 options take ratio bounds on `π_rollout/π_train` (a single `u` means `[1/u, u]`) compared in
/// log space; k2/k3 options take one upper bound.
pub fn parse_rejection(rs: Option<&str>, threshold: Option<&RsThreshold>) -> Result<Vec<RsOption>> {
    let Some(rs) = rs else { return Ok(vec![]) };
    let names: Vec<&str> = rs
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if names.is_empty() {
        return Ok(vec![]);
    }
    let entries: Vec<String> = match threshold {
        None => return Err(rs_err("required when rollout_rs is set".into())),
        Some(RsThreshold::Number(x)) => vec![x.to_string()],
        Some(RsThreshold::Text(s)) => s.split(',').map(|e| e.trim().to_string()).collect(),
    };
    if entries.len() != 1 && entries.len() != names.len() {
        return Err(rs_err(format!(
            "{} thresholds for {} rejection options",
            entries.len(),
            names.len()
        )));
    }
    names
        .iter()
        .enumerate()
        .map(|(j, &name)| {
            if !RS_NAMES.contains(&name) {
                return Err(AlgoError::UnknownName {
                    kind: "rollout_rs",
                    name: name.to_string(),
                    valid: RS_NAMES.join(", "),
                });
            }
            let (agg, div) = name.rsplit_once('_').unwrap_or((name, ""));
            let agg = match agg {
                "token" => RsAgg::Token,
                "seq_sum" => RsAgg::SeqSum,
                "seq_mean" => RsAgg::SeqMean,
                _ => RsAgg::SeqMax,
            };
            let div = match div {
                "k1" => Divergence::K1,
                "k2" => Divergence::K2,
                _ => Divergence::K3,
            };
            let entry = &entries[if entries.len() == 1 { 0 } else { j }];
            let num = |s: &str| -> Result<f64> {
                s.parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v > 0.0)
                    .ok_or_else(|| rs_err(format!("`{entry}` is not a positive number")))
            };
            let (lower, upper) = match (div, entry.split_once('_')) {
                (Divergence::K1, Some((lo, hi))) => (num(lo)?.ln(), num(hi)?.ln()),
                (Divergence::K1, None) => {
                    let u = num(entry)?;
                    (-u.ln(), u.ln())
                }
                (_, None) => (f64::NEG_INFINITY, num(entry)?),
                (_, Some(_)) => {
                    return Err(rs_err(format!(
                        "`{name}` takes one upper bound, got `{entry}`"
                    )))
                }
            };
            if lower > upper {
                return Err(rs_err(format!(
                    "lower bound above upper bound in `{entry}`"
                )));
            }
            Ok(RsOption {
                name: name.to_string(),
                agg,
                div,
                lower,
                upper,
            })
        })
        .collect()
}

/// Result of the per-step rollout correction.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutCorrection {
    /// Per-token IS weights (detached, 0 on invalid tokens), or `None` when `rollout_is` is null.
    pub is_weights: Option<Vec<f64>>,
    /// Validity after rejection sampling (the input mask when no option is set).
    pub mask: Vec<bool>,
    /// `rollout_corr/*` metrics: IS, RS and off-policy diagnostics (computed on the pre-RS mask).
    pub metrics: Metrics,
}

/// Runs the rollout correction once per step on the trainer's `old_logprobs` against the engine's
/// `rollout_logprobs`: IS weights (token, sequence or geometric; truncate or mask; optional batch
/// normalisation), rejection masks and all metrics. In bypass mode the caller passes the rollout
/// log-probs as both arguments.
pub fn rollout_correction(
    cfg: &AlgoConfig,
    offsets: &[usize],
    old_logprobs: &[f64],
    rollout_logprobs: &[f64],
    mask: Option<&[bool]>,
) -> Result<RolloutCorrection> {
    cfg.validate()?;
    let rows = Rows::new(offsets, 0)?;
    rows.check_finite_tokens("old_logprobs", old_logprobs)?;
    rows.check_finite_tokens("rollout_logprobs", rollout_logprobs)?;
    let valid = rows.valid(mask)?;
    let delta: Vec<f64> = old_logprobs
        .iter()
        .zip(rollout_logprobs)
        .map(|(a, b)| a - b)
        .collect();
    let mut metrics =
        off_policy_metrics_delta(&rows, old_logprobs, rollout_logprobs, &delta, &valid);

    let is_weights = match cfg.rollout_is {
        None => None,
        Some(level) => {
            let (w, m) = is_weights(cfg, level, &rows, &delta, &valid);
            metrics.extend(m);
            Some(w)
        }
    };

    let options = cfg.rejection_options()?;
    let mut out_mask = valid.clone();
    if !options.is_empty() {
        let n_valid = valid.iter().filter(|&&v| v).count().max(1) as f64;
        let nonempty: Vec<usize> = (0..rows.len())
            .filter(|&i| valid[rows.range(i)].iter().any(|&v| v))
            .collect();
        for opt in &options {
            let keep = rejection_keep(opt, &rows, &delta, &valid, &mut metrics);
            let rejected = valid.iter().zip(&keep).filter(|(&v, &k)| v && !k).count();
            let p = format!("rollout_corr/rollout_rs_{}", opt.name);
            metrics.insert(format!("{p}_masked_fraction"), rejected as f64 / n_valid);
            let seq_rej = nonempty
                .iter()
                .filter(|&&i| rows.range(i).any(|t| valid[t] && !keep[t]))
                .count();
            metrics.insert(
                format!("{p}_seq_masked_fraction"),
                seq_rej as f64 / nonempty.len().max(1) as f64,
            );
            for (o, k) in out_mask.iter_mut().zip(keep) {
                *o &= k;
            }
        }
        let rejected = valid
            .iter()
            .zip(&out_mask)
            .filter(|(&v, &k)| v && !k)
            .count();
        metrics.insert(
            "rollout_corr/rollout_rs_masked_fraction".into(),
            rejected as f64 / n_valid,
        );
        let seq_rej = nonempty
            .iter()
            .filter(|&&i| rows.range(i).any(|t| valid[t] && !out_mask[t]))
            .count();
        metrics.insert(
            "rollout_corr/rollout_rs_seq_masked_fraction".into(),
            seq_rej as f64 / nonempty.len().max(1) as f64,
        );
    }
    Ok(RolloutCorrection {
        is_weights,
        mask: out_mask,
        metrics,
    })
}

/// Per-token IS weight of one token's log-ratio at a level, computed from the row's log-ratios.
fn level_log_ratio(level: IsLevel, rows: &Rows, delta: &[f64], valid: &[bool], i: usize) -> f64 {
    let r = rows.range(i);
    let (sum, n) = r
        .filter(|&t| valid[t])
        .fold((0.0, 0usize), |(s, n), t| (s + delta[t], n + 1));
    match level {
        IsLevel::Sequence => sum,
        _ => {
            if n == 0 {
                0.0
            } else {
                sum / n as f64
            }
        }
    }
}

/// Per-token IS weights with their metrics.
fn is_weights(
    cfg: &AlgoConfig,
    level: IsLevel,
    rows: &Rows,
    delta: &[f64],
    valid: &[bool],
) -> (Vec<f64>, Metrics) {
    let upper = cfg.rollout_is_threshold;
    let lower = cfg.is_threshold_lower();
    let mut raw = vec![0.0; delta.len()];
    // Per-row log statistic for sequence-level metrics.
    let mut row_log = Vec::new();
    for i in 0..rows.len() {
        let lr = match level {
            IsLevel::Token => 0.0,
            _ => level_log_ratio(level, rows, delta, valid, i),
        };
        let r = rows.range(i);
        if level != IsLevel::Token && r.clone().any(|t| valid[t]) {
            row_log.push(lr);
        }
        for t in r {
            if valid[t] {
                let x = if level == IsLevel::Token {
                    delta[t]
                } else {
                    lr
                };
                raw[t] = is_weight(x);
            }
        }
    }
    let metrics = weight_metrics(
        "rollout_is",
        level,
        rows,
        &raw,
        &row_log,
        valid,
        lower,
        upper,
    );

    let mut w: Vec<f64> = raw
        .iter()
        .map(|&x| match cfg.rollout_is_mode {
            IsMode::Truncate => x.min(upper),
            IsMode::Mask => {
                if (lower..=upper).contains(&x) {
                    x
                } else {
                    0.0
                }
            }
        })
        .collect();
    let mut metrics = metrics;
    if cfg.rollout_is_mode == IsMode::Mask {
        let n = valid.iter().filter(|&&v| v).count().max(1) as f64;
        let masked = w.iter().zip(valid).filter(|(&x, &v)| v && x == 0.0).count();
        metrics.insert(
            "rollout_corr/rollout_is_masked_fraction".into(),
            masked as f64 / n,
        );
    }
    if cfg.rollout_is_batch_normalize {
        let mean = match level {
            IsLevel::Token => masked_mean(&w, valid),
            _ => {
                let per_row: Vec<f64> = (0..rows.len())
                    .filter_map(|i| {
                        let r = rows.range(i);
                        let n = r.clone().filter(|&t| valid[t]).count();
                        (n > 0)
                            .then(|| r.filter(|&t| valid[t]).map(|t| w[t]).sum::<f64>() / n as f64)
                    })
                    .collect();
                mean_max_min(per_row).map_or(0.0, |m| m.0)
            }
        };
        if mean > 1e-8 {
            w.iter_mut().for_each(|x| *x /= mean);
            metrics.insert("rollout_corr/rollout_is_batch_norm_factor".into(), mean);
        } else {
            metrics.insert("rollout_corr/rollout_is_batch_norm_factor".into(), 1.0);
        }
    }
    (w, metrics)
}

fn masked_mean(xs: &[f64], valid: &[bool]) -> f64 {
    let (s, n) = xs
        .iter()
        .zip(valid)
        .filter(|(_, &v)| v)
        .fold((0.0, 0usize), |(s, n), (&x, _)| (s + x, n + 1));
    if n == 0 {
        0.0
    } else {
        s / n as f64
    }
}

/// verl's weight statistics (`{prefix}_mean`, `_max`, `_min`, `_ratio_fraction_high/low`, `_std`,
/// `_eff_sample_size`, `_seq_*`) of raw weights `w` (before truncation).
#[allow(clippy::too_many_arguments)]
fn weight_metrics(
    prefix: &str,
    level: IsLevel,
    rows: &Rows,
    w: &[f64],
    row_log: &[f64],
    valid: &[bool],
    lower: f64,
    upper: f64,
) -> Metrics {
    let mut m = Metrics::new();
    let key = |s: &str| format!("rollout_corr/{prefix}_{s}");
    let n = valid.iter().filter(|&&v| v).count();
    let vals = || w.iter().zip(valid).filter(|(_, &v)| v).map(|(&x, _)| x);
    m.insert(key("mean"), masked_mean(w, valid));
    match level {
        IsLevel::Token => {
            let (_, hi, lo) = mean_max_min(vals()).unwrap_or((0.0, 0.0, 0.0));
            m.insert(key("max"), hi);
            m.insert(key("min"), lo);
            let nn = n.max(1) as f64;
            m.insert(
                key("ratio_fraction_high"),
                vals().filter(|&x| x > upper).count() as f64 / nn,
            );
            m.insert(
                key("ratio_fraction_low"),
                vals().filter(|&x| x < lower).count() as f64 / nn,
            );
        }
        _ => {
            let (_, hi, lo) = mean_max_min(row_log.iter().copied()).unwrap_or((0.0, 0.0, 0.0));
            m.insert(key("max"), hi.min(SAFETY_BOUND).exp());
            m.insert(key("min"), lo.exp());
            let nr = row_log.len().max(1) as f64;
            m.insert(
                key("ratio_fraction_high"),
                row_log.iter().filter(|&&x| x > upper.ln()).count() as f64 / nr,
            );
            m.insert(
                key("ratio_fraction_low"),
                row_log.iter().filter(|&&x| x < lower.ln()).count() as f64 / nr,
            );
        }
    }
    let clamped = || vals().map(|x| x.clamp(lower, upper));
    let nn = n.max(1) as f64;
    let cm = clamped().sum::<f64>() / nn;
    let c2 = clamped().map(|x| x * x).sum::<f64>() / nn;
    let std = if n > 1 {
        (c2 - cm * cm).max(0.0).sqrt()
    } else {
        0.0
    };
    m.insert(key("std"), std);
    let ess = if n > 0 {
        let norm2 = clamped().map(|x| (x / (cm + 1e-8)).powi(2)).sum::<f64>() / nn;
        1.0 / norm2
    } else {
        0.0
    };
    m.insert(key("eff_sample_size"), ess);
    let seq: Vec<f64> = (0..rows.len())
        .filter_map(|i| {
            let r = rows.range(i);
            let k = r.clone().filter(|&t| valid[t]).count();
            (k > 0).then(|| r.filter(|&t| valid[t]).map(|t| w[t]).sum::<f64>() / k as f64)
        })
        .collect();
    let (smean, smax, smin) = mean_max_min(seq.iter().copied()).unwrap_or((0.0, 0.0, 0.0));
    let sstd = if seq.len() > 1 {
        (seq.iter().map(|x| (x - smean).powi(2)).sum::<f64>() / (seq.len() - 1) as f64).sqrt()
    } else {
        0.0
    };
    let ns = seq.len().max(1) as f64;
    m.insert(key("seq_mean"), smean);
    m.insert(key("seq_std"), sstd);
    m.insert(key("seq_max"), smax);
    m.insert(key("seq_min"), smin);
    m.insert(
        key("seq_max_deviation"),
        seq.iter().map(|x| (x - 1.0).abs()).fold(0.0, f64::max),
    );
    m.insert(
        key("seq_fraction_high"),
        seq.iter().filter(|&&x| x > upper).count() as f64 / ns,
    );
    m.insert(
        key("seq_fraction_low"),
        seq.iter().filter(|&&x| x < lower).count() as f64 / ns,
    );
    m
}

/// Keep-mask of one rejection option (true on kept tokens); adds its statistic metrics.
fn rejection_keep(
    opt: &RsOption,
    rows: &Rows,
    delta: &[f64],
    valid: &[bool],
    metrics: &mut Metrics,
) -> Vec<bool> {
    let div = |d: f64| opt.div.of(d);
    let pass = |x: f64| x >= opt.lower && x <= opt.upper;
    let mut keep = vec![true; delta.len()];
    let mut stats = Vec::new();
    for i in 0..rows.len() {
        let r = rows.range(i);
        let toks: Vec<usize> = r.clone().filter(|&t| valid[t]).collect();
        match opt.agg {
            RsAgg::Token => {
                for &t in &toks {
                    let x = div(delta[t]);
                    stats.push(x);
                    keep[t] = pass(x);
                }
            }
            agg => {
                if toks.is_empty() {
                    continue;
                }
                let xs = toks.iter().map(|&t| div(delta[t]));
                let x = match agg {
                    RsAgg::SeqSum => xs.sum::<f64>(),
                    RsAgg::SeqMean => xs.sum::<f64>() / toks.len() as f64,
                    _ => xs.fold(0.0, f64::max),
                };
                stats.push(x);
                let k = pass(x);
                for t in r {
                    keep[t] = k;
                }
            }
        }
    }
    let p = format!("rollout_corr/rollout_rs_{}", opt.name);
    let (mean, max, min) = mean_max_min(stats.iter().copied()).unwrap_or((0.0, 0.0, 0.0));
    let n = stats.len().max(1) as f64;
    metrics.insert(format!("{p}_mean"), mean);
    metrics.insert(format!("{p}_max"), max);
    metrics.insert(format!("{p}_min"), min);
    metrics.insert(
        format!("{p}_fraction_high"),
        stats.iter().filter(|&&x| x > opt.upper).count() as f64 / n,
    );
    metrics.insert(
        format!("{p}_fraction_low"),
        stats.iter().filter(|&&x| x < opt.lower).count() as f64 / n,
    );
    keep
}

/// Off-policy diagnostics between a policy's log-probs (`logprobs`: the trainer's ℓ_old per step,
/// or the current ℓ per micro-batch) and the rollout engine's: `rollout_corr/{kl, k3_kl,
/// training_ppl, training_log_ppl, rollout_ppl, rollout_log_ppl, log_ppl_diff, log_ppl_abs_diff,
/// log_ppl_diff_max, log_ppl_diff_min, ppl_ratio, chi2_token, chi2_seq}`. Usable on its own:
/// it needs no correction to be configured. Rows without valid tokens are left out of row means.
pub fn off_policy_metrics(
    offsets: &[usize],
    logprobs: &[f64],
    rollout_logprobs: &[f64],
    mask: Option<&[bool]>,
) -> Result<Metrics> {
    let rows = Rows::new(offsets, 0)?;
    rows.check_finite_tokens("logprobs", logprobs)?;
    rows.check_finite_tokens("rollout_logprobs", rollout_logprobs)?;
    let valid = rows.valid(mask)?;
    let delta: Vec<f64> = logprobs
        .iter()
        .zip(rollout_logprobs)
        .map(|(a, b)| a - b)
        .collect();
    Ok(off_policy_metrics_delta(
        &rows,
        logprobs,
        rollout_logprobs,
        &delta,
        &valid,
    ))
}

fn off_policy_metrics_delta(
    rows: &Rows,
    train: &[f64],
    roll: &[f64],
    delta: &[f64],
    valid: &[bool],
) -> Metrics {
    let mut m = Metrics::new();
    let key = |s: &str| format!("rollout_corr/{s}");
    let toks = || (0..delta.len()).filter(|&t| valid[t]);
    let n = toks().count().max(1) as f64;
    m.insert(key("kl"), toks().map(|t| -delta[t]).sum::<f64>() / n);
    m.insert(
        key("k3_kl"),
        toks()
            .map(|t| {
                let d = delta[t].clamp(-SAFETY_BOUND, SAFETY_BOUND);
                d.exp() - d - 1.0
            })
            .sum::<f64>()
            / n,
    );
    m.insert(
        key("chi2_token"),
        if toks().next().is_some() {
            toks()
                .map(|t| (2.0 * delta[t].clamp(-SAFETY_BOUND, SAFETY_BOUND)).exp())
                .sum::<f64>()
                / n
                - 1.0
        } else {
            0.0
        },
    );
    // Per-row statistics over non-empty rows.
    let mut tr = Vec::new();
    let mut ro = Vec::new();
    let mut seq_sum = Vec::new();
    for i in 0..rows.len() {
        let ts: Vec<usize> = rows.range(i).filter(|&t| valid[t]).collect();
        if ts.is_empty() {
            continue;
        }
        let k = ts.len() as f64;
        tr.push(ts.iter().map(|&t| train[t]).sum::<f64>() / k);
        ro.push(ts.iter().map(|&t| roll[t]).sum::<f64>() / k);
        seq_sum.push(ts.iter().map(|&t| delta[t]).sum::<f64>());
    }
    let mean = |xs: &mut dyn Iterator<Item = f64>| mean_max_min(xs).map_or(0.0, |x| x.0);
    m.insert(
        key("training_ppl"),
        mean(&mut tr.iter().map(|x| (-x).exp())),
    );
    m.insert(key("training_log_ppl"), mean(&mut tr.iter().map(|x| -x)));
    m.insert(key("rollout_ppl"), mean(&mut ro.iter().map(|x| (-x).exp())));
    m.insert(key("rollout_log_ppl"), mean(&mut ro.iter().map(|x| -x)));
    let diff: Vec<f64> = ro.iter().zip(&tr).map(|(r, t)| r - t).collect();
    let (dm, dmax, dmin) = mean_max_min(diff.iter().copied()).unwrap_or((0.0, 0.0, 0.0));
    m.insert(key("log_ppl_diff"), dm);
    m.insert(
        key("log_ppl_abs_diff"),
        mean(&mut diff.iter().map(|x| x.abs())),
    );
    m.insert(key("log_ppl_diff_max"), dmax);
    m.insert(key("log_ppl_diff_min"), dmin);
    m.insert(key("ppl_ratio"), mean(&mut diff.iter().map(|x| x.exp())));
    m.insert(
        key("chi2_seq"),
        if seq_sum.is_empty() {
            0.0
        } else {
            mean(
                &mut seq_sum
                    .iter()
                    .map(|s| (2.0 * s.clamp(-SAFETY_BOUND, SAFETY_BOUND)).exp()),
            ) - 1.0
        },
    );
    m
}

/// IS weights (truncated or masked, without batch normalisation) of log-ratios `delta` at a level;
/// used by bypass mode inside the loss, where ℓ_old is the rollout log-prob.
pub(crate) fn bypass_weights(
    cfg: &AlgoConfig,
    level: IsLevel,
    rows: &Rows,
    delta: &[f64],
    valid: &[bool],
) -> Vec<f64> {
    let mut c = cfg.clone();
    c.rollout_is_batch_normalize = false;
    is_weights(&c, level, rows, delta, valid).0
}
