//! Metrics with verl's names, and merging of per-micro-batch metrics.

use std::collections::BTreeMap;

/// Metric name → value.
pub type Metrics = BTreeMap<String, f64>;

/// How a metric combines across micro-batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merge {
    /// Sum (loss contributions and event counts).
    Sum,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Mean weighted by the micro-batch's valid tokens.
    WeightedMean,
}

/// The merge rule of a metric, from its name: loss contributions and counts add up, `max`/`min`
/// metrics take the extreme, everything else is a token-weighted mean (for `*_std` metrics this is
/// the weighted mean of the micro-batch values, not the pooled std).
pub fn merge_rule(name: &str) -> Merge {
    const SUMS: &[&str] = &[
        "actor/pg_loss",
        "actor/kl_loss",
        "actor/empty_micro_batches",
        "self_distillation/empty_target_batch",
    ];
    if SUMS.contains(&name) {
        Merge::Sum
    } else if name.ends_with("_max") || name.ends_with("/max") {
        Merge::Max
    } else if name.ends_with("_min") || name.ends_with("/min") {
        Merge::Min
    } else {
        Merge::WeightedMean
    }
}

/// Merges the metrics of the micro-batches of one mini-batch (see [`merge_rule`]).
#[derive(Debug, Clone, Default)]
pub struct MetricAccumulator {
    acc: BTreeMap<String, (f64, f64)>,
}

impl MetricAccumulator {
    /// An empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one micro-batch's metrics; `weight` is its number of valid tokens.
    pub fn add(&mut self, metrics: &Metrics, weight: f64) {
        for (k, &v) in metrics {
            let e = self.acc.entry(k.clone());
            match merge_rule(k) {
                Merge::Sum => e.or_insert((0.0, 0.0)).0 += v,
                Merge::Max => {
                    let s = e.or_insert((f64::NEG_INFINITY, 0.0));
                    s.0 = s.0.max(v);
                }
                Merge::Min => {
                    let s = e.or_insert((f64::INFINITY, 0.0));
                    s.0 = s.0.min(v);
                }
                Merge::WeightedMean => {
                    let s = e.or_insert((0.0, 0.0));
                    s.0 += v * weight;
                    s.1 += weight;
                }
            }
        }
    }

    /// The state per metric: the running value (the sum, the extreme, or for a weighted mean
    /// the weighted sum) and the total weight (weighted means only; 0 otherwise).
    pub fn state(&self) -> impl Iterator<Item = (&str, f64, f64)> + '_ {
        self.acc.iter().map(|(k, &(v, w))| (k.as_str(), v, w))
    }

    /// Folds one metric's state from another accumulator (as [`MetricAccumulator::state`]
    /// yields it) into this one by the metric's rule: as if that accumulator's micro-batches had
    /// been added here.
    pub fn merge_state(&mut self, name: &str, value: f64, weight: f64) {
        let rule = merge_rule(name);
        let s = self.acc.entry(name.to_string()).or_insert(match rule {
            Merge::Max => (f64::NEG_INFINITY, 0.0),
            Merge::Min => (f64::INFINITY, 0.0),
            _ => (0.0, 0.0),
        });
        match rule {
            Merge::Sum => s.0 += value,
            Merge::Max => s.0 = s.0.max(value),
            Merge::Min => s.0 = s.0.min(value),
            Merge::WeightedMean => {
                s.0 += value;
                s.1 += weight;
            }
        }
    }

    /// Folds every metric of `other` into this one (see [`MetricAccumulator::merge_state`]).
    pub fn merge(&mut self, other: &Self) {
        for (k, v, w) in other.state() {
            self.merge_state(k, v, w);
        }
    }

    /// The merged metrics. A weighted mean whose weights are all 0 is reported as 0.
    pub fn finish(&self) -> Metrics {
        self.acc
            .iter()
            .map(|(k, &(v, w))| {
                let out = match merge_rule(k) {
                    Merge::WeightedMean => {
                        if w > 0.0 {
                            v / w
                        } else {
                            0.0
                        }
                    }
                    _ => v,
                };
                (k.clone(), out)
            })
            .collect()
    }
}

/// Mean, max and min of the values, or `None` for no values.
pub(crate) fn mean_max_min(xs: impl IntoIterator<Item = f64>) -> Option<(f64, f64, f64)> {
    let (mut n, mut s, mut hi, mut lo) = (0usize, 0.0, f64::NEG_INFINITY, f64::INFINITY);
    for x in xs {
        n += 1;
        s += x;
        hi = hi.max(x);
        lo = lo.min(x);
    }
    (n > 0).then(|| (s / n as f64, hi, lo))
}

/// Inserts `{prefix}/mean`, `/max`, `/min` (0 for no values).
pub(crate) fn insert_stats(m: &mut Metrics, prefix: &str, xs: impl IntoIterator<Item = f64>) {
    let (mean, max, min) = mean_max_min(xs).unwrap_or((0.0, 0.0, 0.0));
    m.insert(format!("{prefix}/mean"), mean);
    m.insert(format!("{prefix}/max"), max);
    m.insert(format!("{prefix}/min"), min);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accumulator_merges_by_rule() {
        let mut acc = MetricAccumulator::new();
        let a: Metrics = [
            ("actor/pg_loss".to_string(), 1.0),
            ("actor/pg_clipfrac".to_string(), 0.5),
            ("rollout_corr/rollout_is_max".to_string(), 3.0),
        ]
        .into();
        let b: Metrics = [
            ("actor/pg_loss".to_string(), 2.0),
            ("actor/pg_clipfrac".to_string(), 0.0),
            ("rollout_corr/rollout_is_max".to_string(), 1.0),
        ]
        .into();
        acc.add(&a, 1.0);
        acc.add(&b, 3.0);
        let m = acc.finish();
        assert_eq!(m["actor/pg_loss"], 3.0);
        assert_eq!(m["actor/pg_clipfrac"], 0.125);
        assert_eq!(m["rollout_corr/rollout_is_max"], 3.0);

        // Two accumulators merged give what one would after both halves.
        let (mut left, mut right) = (MetricAccumulator::new(), MetricAccumulator::new());
        left.add(&a, 1.0);
        right.add(&b, 3.0);
        left.merge(&right);
        assert_eq!(left.finish(), m);
    }
}
