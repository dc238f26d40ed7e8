//! The audit's plots, each as PNG and SVG:
//! - `log_ratio_histogram`, `seq_log_ratio_histogram`: the token log-ratios `δ` and the sequence
//!   log-ratios `Σδ` of the range (from the range's quantile sketch; the central 99.8%);
//! - `ess_kl`: per step, the token log-ratio (mean, p05, p95), the KL estimates k1, k2, k3 and the
//!   normalised ESS of token, sequence and geometric weights;
//! - `truncated_fraction`: per step and threshold, the tokens token-level TIS truncates, the
//!   sequences sequence-level TIS truncates and the sequences geometric MIS masks.

use std::collections::BTreeMap;
use std::path::Path;

use rlreplay_algo::Metrics;

use crate::stats::{threshold_label, AuditConfig, LogRatio, RangeAudit};
use rlreplay_plot::{Histogram, Panel, Series};

use crate::Result;

/// The per-step values the plots need (a few per step, whatever the batch size).
#[derive(Debug, Clone)]
pub struct History {
    labels: Vec<String>,
    steps: Vec<f64>,
    values: BTreeMap<String, Vec<f64>>,
}

const PER_STEP: &[&str] = &[
    "audit/log_ratio/token/mean",
    "audit/log_ratio/token/p05",
    "audit/log_ratio/token/p95",
    "audit/kl/k1",
    "audit/kl/k2",
    "audit/kl/k3",
    "audit/ess/token/batch",
    "audit/ess/seq/batch",
    "audit/ess/geo/batch",
];

/// The corrections of the `truncated_fraction` panels: (metric suffix, panel title).
const FRACTIONS: &[(&str, &str)] = &[
    (
        "token_truncate/tokens",
        "tokens truncated by token-level TIS (w > C)",
    ),
    (
        "seq_truncate/seqs",
        "sequences truncated by sequence-level TIS (w > C)",
    ),
    (
        "geo_mask/seqs",
        "sequences masked by geometric MIS (w outside [lower, C])",
    ),
];

impl History {
    /// An empty history for the thresholds of `cfg`.
    pub fn new(cfg: &AuditConfig) -> Self {
        Self {
            labels: cfg.thresholds.iter().map(|&c| threshold_label(c)).collect(),
            steps: Vec::new(),
            values: BTreeMap::new(),
        }
    }

    fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = PER_STEP.iter().map(|s| s.to_string()).collect();
        for l in &self.labels {
            for (suffix, _) in FRACTIONS {
                keys.push(format!("audit/is_{l}/{suffix}"));
            }
        }
        keys
    }

    /// Records a step's values (`NaN` where a metric is absent).
    pub fn push(&mut self, step: i64, m: &Metrics) {
        self.steps.push(step as f64);
        for k in self.keys() {
            let v = m.get(&k).copied().unwrap_or(f64::NAN);
            self.values.entry(k).or_default().push(v);
        }
    }

    fn series(&self, key: &str, label: &str) -> Series {
        let ys = self.values.get(key).map(Vec::as_slice).unwrap_or(&[]);
        Series {
            label: label.into(),
            points: self.steps.iter().copied().zip(ys.iter().copied()).collect(),
        }
    }
}

fn panel(title: &str, y: &str, series: Vec<Series>) -> Panel {
    Panel {
        title: title.into(),
        x_label: "step".into(),
        y_label: y.into(),
        series,
    }
}

/// A histogram of a log-ratio distribution from its quantile function: `K` equally spaced
/// quantiles each stand for `1/K` of the values.
fn histogram(range: &RangeAudit, which: LogRatio, title: &str, x: &str) -> Option<Histogram> {
    const K: usize = 4000;
    const BINS: usize = 80;
    let n = range.log_ratio_count(which);
    if n == 0 {
        return None;
    }
    let qs: Vec<f64> = (0..K).map(|k| (k as f64 + 0.5) / K as f64).collect();
    let points = range.log_ratio_quantiles(which, &qs);
    let ends = range.log_ratio_quantiles(which, &[0.001, 0.999]);
    let (mut lo, mut hi) = (ends.first().copied()?, ends.last().copied()?);
    if hi - lo < 1e-9 {
        lo -= 1e-3;
        hi += 1e-3;
    }
    let width = (hi - lo) / BINS as f64;
    let edges: Vec<f64> = (0..=BINS).map(|b| lo + b as f64 * width).collect();
    let mut counts = vec![0.0; BINS];
    let per_point = n as f64 / K as f64;
    for p in points {
        if (lo..=hi).contains(&p) {
            let b = (((p - lo) / width) as usize).min(BINS - 1);
            counts[b] += per_point;
        }
    }
    Some(Histogram {
        title: format!("{title}: {n} values, central 99.8%"),
        x_label: x.into(),
        y_label: "count".into(),
        edges,
        counts,
        log_y: true,
    })
}

/// Writes every plot into `dir`.
pub fn write_all(dir: &Path, history: &History, range: &RangeAudit) -> Result<()> {
    for (which, name, title, x) in [
        (
            LogRatio::Token,
            "log_ratio_histogram",
            "token log-ratio",
            "log π/μ per token",
        ),
        (
            LogRatio::Seq,
            "seq_log_ratio_histogram",
            "sequence log-ratio",
            "Σ log π/μ per response",
        ),
    ] {
        if let Some(h) = histogram(range, which, title, x) {
            rlreplay_plot::histogram(dir, name, &h)?;
        }
    }
    let h = history;
    rlreplay_plot::panels(
        dir,
        "ess_kl",
        &[
            panel(
                "token log-ratio log π/μ",
                "log-ratio",
                vec![
                    h.series("audit/log_ratio/token/mean", "mean"),
                    h.series("audit/log_ratio/token/p05", "p05"),
                    h.series("audit/log_ratio/token/p95", "p95"),
                ],
            ),
            panel(
                "KL(μ‖π) estimates per token",
                "nats",
                vec![
                    h.series("audit/kl/k1", "k1"),
                    h.series("audit/kl/k2", "k2"),
                    h.series("audit/kl/k3", "k3"),
                ],
            ),
            panel(
                "normalised effective sample size",
                "ESS / n",
                vec![
                    h.series("audit/ess/token/batch", "token"),
                    h.series("audit/ess/seq/batch", "sequence"),
                    h.series("audit/ess/geo/batch", "geometric"),
                ],
            ),
        ],
    )?;
    let fractions: Vec<Panel> = FRACTIONS
        .iter()
        .map(|(suffix, title)| {
            let series = h
                .labels
                .iter()
                .map(|l| h.series(&format!("audit/is_{l}/{suffix}"), &format!("C = {l}")))
                .collect();
            panel(title, "fraction", series)
        })
        .collect();
    rlreplay_plot::panels(dir, "truncated_fraction", &fractions)?;
    Ok(())
}
