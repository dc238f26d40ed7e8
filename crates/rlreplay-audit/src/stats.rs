//! Off-policy statistics of logged rollouts under a policy: how far the policy is from the
//! behaviour that sampled them, and what each rollout correction would do to each batch.
//!
//! With `δ = ℓ_π − ℓ_μ` per response token (policy minus behaviour log-prob, the trainer's
//! `ℓ_old − ℓ_roll`), one step gives (names under `audit/`):
//! - `log_ratio/{token,seq,geo}/*`: mean, population std, min, max and quantiles (NumPy's linear
//!   interpolation) of `δ` over tokens, of the row sums `Σδ` and of the row means (the log of the
//!   geometric-mean weight).
//! - `kl/{k1,k2,k3}`: token means of `k1 = −δ`, `k2 = δ²/2`, `k3 = e^δ − 1 − δ` (estimates of
//!   KL(μ‖π) from the behaviour's samples); `kl/seq_{k1,k2,k3}`: row means of the same functions
//!   of `Σδ`.
//! - `ess/{token,seq,geo}/batch`: Kish's effective sample size `(Σw)²/(n·Σw²)` (normalised: 1 is
//!   on-policy) of the raw weights over the batch's tokens or rows; `ess/{seq,geo}/group_{mean,min}`:
//!   the same within each prompt group.
//! - `is_{C}/{token,seq,geo}_{truncate,mask}/{tokens,seqs}` for every threshold `C`: the fraction
//!   of tokens and of rows that truncated IS (`w > C`) or masked IS (`w ∉ [lower, C]`) at that
//!   level would change; `is_{C}/{level}_{truncate,mask}/ess`: the ESS of the corrected weights
//!   (over tokens at token level, over rows at sequence and geometric level).
//! - `rs/{tokens,seqs}`: the fraction of tokens and rows the configured rejection sampling
//!   (`rollout_rs`) would reject.
//! - `corr/{seq,geo}_log_ratio_score[_in_group]`: Pearson correlation of the row log-ratio with the
//!   score, over the batch and within groups (both centred on their group means).
//!
//! The core statistics (counts, log-ratio means and stds, KL, correction fractions) are also
//! given for each split `success`, `failure`, `truncated` (cut by the length limit) and
//! `complete`, as `audit/{split}/...`; a split without rows has no entries. Next to them, the verl
//! `rollout_corr/*` metrics come from [`rollout_correction`] on the same arrays, so they equal what
//! the trainer reports for the same policy and batch.
//!
//! [`RangeAudit`] folds the steps into the statistics of the whole range with bounded memory:
//! exact sums, and quantiles exact up to [`EXACT_QUANTILE_VALUES`] values per distribution, then
//! from a DDSketch (relative accuracy [`SKETCH_ALPHA`]); the verl metrics of the range are token-weighted step means (extremes for
//! `max`/`min`).

use std::ops::Range;

use sketches_ddsketch::{Config as SketchConfig, DDSketch};

use rlreplay_algo::correction::{
    is_weight, off_policy_metrics, rollout_correction, Divergence, SAFETY_BOUND,
};
use rlreplay_algo::layout::Rows;
use rlreplay_algo::{AlgoConfig, AlgoError, MetricAccumulator, Metrics, Result};

/// Quantiles reported for every log-ratio distribution, with their metric names.
pub const QUANTILES: &[(f64, &str)] = &[
    (0.01, "p01"),
    (0.05, "p05"),
    (0.25, "p25"),
    (0.5, "p50"),
    (0.75, "p75"),
    (0.95, "p95"),
    (0.99, "p99"),
];

/// The three log-ratio distributions of an audit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogRatio {
    /// `δ` of every token.
    Token = 0,
    /// `Σδ` of every row: the log sequence weight.
    Seq = 1,
    /// `Σδ / tokens` of every row: the log geometric-mean weight.
    Geo = 2,
}

/// Values of a log-ratio distribution a range keeps exactly for its quantiles; beyond, they go
/// to a DDSketch.
pub const EXACT_QUANTILE_VALUES: usize = 1 << 20;

/// Relative accuracy of the range quantiles once they come from the sketch.
pub const SKETCH_ALPHA: f64 = 1e-3;

/// What an audit studies.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditConfig {
    /// The rollout-correction keys (`rollout_is`, `rollout_is_threshold`,
    /// `rollout_is_threshold_lower`, `rollout_is_mode`, `rollout_is_batch_normalize`,
    /// `rollout_rs`, `rollout_rs_threshold`) of the verl `rollout_corr/*` metrics, and
    /// `success_reward_threshold`: a row succeeded when its score is at least it.
    pub correction: AlgoConfig,
    /// Every IS threshold `C` to study; the lower bound of each is `rollout_is_threshold_lower`,
    /// or `1/C`.
    pub thresholds: Vec<f64>,
}

impl AuditConfig {
    /// Checks the thresholds and the correction keys; the error names the key.
    pub fn validate(&self) -> Result<()> {
        self.correction.validate()?;
        let bad = |msg: String| AlgoError::Config {
            key: "rollout_is_threshold",
            msg,
        };
        if self.thresholds.is_empty() {
            return Err(bad("at least one threshold is needed".into()));
        }
        for &c in &self.thresholds {
            if !(c.is_finite() && c > 0.0) {
                return Err(bad(format!("must be positive and finite, got {c}")));
            }
            if let Some(lo) = self.correction.rollout_is_threshold_lower {
                if lo > c {
                    return Err(AlgoError::Config {
                        key: "rollout_is_threshold_lower",
                        msg: format!("{lo} is above the threshold {c}"),
                    });
                }
            }
        }
        Ok(())
    }

    /// The lower bound that goes with threshold `c`.
    pub fn lower(&self, c: f64) -> f64 {
        self.correction
            .rollout_is_threshold_lower
            .unwrap_or(1.0 / c)
    }
}

/// The metric-name label of a threshold (`2`, `1.5`, ...).
pub fn threshold_label(c: f64) -> String {
    format!("{c}")
}

/// One step's rollouts with the policy's log-probs, as flat arrays.
#[derive(Debug, Clone, Copy)]
pub struct StepRollouts<'a> {
    /// Row offsets into the per-token arrays (`rows + 1` entries).
    pub offsets: &'a [usize],
    /// The policy's log-prob of each response token.
    pub logprobs: &'a [f64],
    /// The behaviour policy's (logged) log-prob of each response token.
    pub rollout_logprobs: &'a [f64],
    /// Score of each row.
    pub scores: &'a [f64],
    /// Whether each row was cut by the length limit.
    pub truncated: &'a [bool],
    /// The prompt groups: contiguous row ranges covering every row in order.
    pub groups: &'a [Range<usize>],
}

/// What one threshold's corrections do to one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RowFlags {
    /// Tokens whose weight is above `C` (truncated by token TIS, masked by token MIS).
    pub tokens_above: usize,
    /// Tokens whose weight is below the lower bound (masked by token MIS).
    pub tokens_below: usize,
    /// The sequence weight is above `C`.
    pub seq_above: bool,
    /// The sequence weight is below the lower bound.
    pub seq_below: bool,
    /// The geometric-mean weight is above `C`.
    pub geo_above: bool,
    /// The geometric-mean weight is below the lower bound.
    pub geo_below: bool,
}

/// Per-row statistics of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct RowAudit {
    /// Response tokens.
    pub tokens: usize,
    /// `Σδ`: log of the sequence importance weight.
    pub seq_log_ratio: f64,
    /// `Σδ / tokens` (0 for an empty row): log of the geometric-mean weight.
    pub mean_log_ratio: f64,
    /// Largest token log-ratio (0 for an empty row).
    pub max_token_log_ratio: f64,
    /// Smallest token log-ratio (0 for an empty row).
    pub min_token_log_ratio: f64,
    /// `exp(clamp(Σδ, ±20))`.
    pub seq_weight: f64,
    /// `exp(clamp(Σδ / tokens, ±20))`.
    pub geo_weight: f64,
    /// Mean `k1` of the row's tokens.
    pub kl_k1: f64,
    /// Mean `k3` of the row's tokens.
    pub kl_k3: f64,
    /// Whether the score reaches the success threshold.
    pub success: bool,
    /// Whether the response was cut by the length limit.
    pub truncated: bool,
    /// Tokens the configured rejection sampling rejects (`None` without `rollout_rs`).
    pub rs_rejected_tokens: Option<usize>,
    /// One entry per threshold, in [`AuditConfig::thresholds`] order.
    pub flags: Vec<RowFlags>,
}

/// The statistics of one step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepAudit {
    /// `audit/*` and `rollout_corr/*` metrics.
    pub metrics: Metrics,
    /// One entry per row.
    pub rows: Vec<RowAudit>,
}

/// The splits of the core statistics.
const SPLITS: [&str; 5] = ["", "success", "failure", "truncated", "complete"];

fn split_of(row: &RowAudit) -> [bool; 5] {
    [
        true,
        row.success,
        !row.success,
        row.truncated,
        !row.truncated,
    ]
}

/// The six corrections studied at each threshold, by metric name.
pub const CORRECTIONS: [&str; 6] = [
    "token_truncate",
    "token_mask",
    "seq_truncate",
    "seq_mask",
    "geo_truncate",
    "geo_mask",
];

/// Count, sum and sum of squares.
#[derive(Debug, Clone, Copy, Default)]
struct Moments {
    n: f64,
    sum: f64,
    sq: f64,
}

impl Moments {
    fn add(&mut self, x: f64) {
        self.n += 1.0;
        self.sum += x;
        self.sq += x * x;
    }

    fn merge(&mut self, o: &Moments) {
        self.n += o.n;
        self.sum += o.sum;
        self.sq += o.sq;
    }

    fn mean(&self) -> f64 {
        if self.n > 0.0 {
            self.sum / self.n
        } else {
            0.0
        }
    }

    /// Population standard deviation.
    fn std(&self) -> f64 {
        if self.n > 0.0 {
            let m = self.mean();
            (self.sq / self.n - m * m).max(0.0).sqrt()
        } else {
            0.0
        }
    }
}

/// Additive statistics of a set of rows (one split of one or more steps).
#[derive(Debug, Clone, Default)]
struct Sums {
    rows: usize,
    tokens: usize,
    token: Moments,
    seq: Moments,
    geo: Moments,
    /// Token sums of k1, k2, k3.
    k: [f64; 3],
    /// Row sums of k1, k2, k3 of `Σδ`.
    seq_k: [f64; 3],
    /// Per threshold and correction: (tokens, rows) changed.
    changed: Vec<[(usize, usize); 6]>,
    /// Rejected (tokens, rows) under `rollout_rs`.
    rs: (usize, usize),
}

impl Sums {
    fn new(thresholds: usize) -> Self {
        Self {
            changed: vec![[(0, 0); 6]; thresholds],
            ..Self::default()
        }
    }

    /// Adds a row with the moments and the k1, k2, k3 sums of its token log-ratios.
    fn add_row(&mut self, row: &RowAudit, token: &Moments, k: &[f64; 3]) {
        self.rows += 1;
        self.tokens += row.tokens;
        self.token.merge(token);
        for (a, b) in self.k.iter_mut().zip(k) {
            *a += b;
        }
        if row.tokens > 0 {
            self.seq.add(row.seq_log_ratio);
            self.geo.add(row.mean_log_ratio);
            for (j, div) in [Divergence::K1, Divergence::K2, Divergence::K3]
                .into_iter()
                .enumerate()
            {
                self.seq_k[j] += div.of(row.seq_log_ratio);
            }
        }
        let n = row.tokens;
        for (c, f) in self.changed.iter_mut().zip(&row.flags) {
            let masked = f.tokens_above + f.tokens_below;
            let per_row = [
                (f.tokens_above, f.tokens_above > 0),
                (masked, masked > 0),
                (if f.seq_above { n } else { 0 }, f.seq_above),
                (
                    if f.seq_above || f.seq_below { n } else { 0 },
                    f.seq_above || f.seq_below,
                ),
                (if f.geo_above { n } else { 0 }, f.geo_above),
                (
                    if f.geo_above || f.geo_below { n } else { 0 },
                    f.geo_above || f.geo_below,
                ),
            ];
            for (acc, (tokens, hit)) in c.iter_mut().zip(per_row) {
                acc.0 += tokens;
                acc.1 += usize::from(hit);
            }
        }
        if let Some(r) = row.rs_rejected_tokens {
            self.rs.0 += r;
            self.rs.1 += usize::from(r > 0);
        }
    }

    fn merge(&mut self, o: &Sums) {
        self.rows += o.rows;
        self.tokens += o.tokens;
        self.token.merge(&o.token);
        self.seq.merge(&o.seq);
        self.geo.merge(&o.geo);
        for j in 0..3 {
            self.k[j] += o.k[j];
            self.seq_k[j] += o.seq_k[j];
        }
        for (a, b) in self.changed.iter_mut().zip(&o.changed) {
            for (x, y) in a.iter_mut().zip(b) {
                x.0 += y.0;
                x.1 += y.1;
            }
        }
        self.rs.0 += o.rs.0;
        self.rs.1 += o.rs.1;
    }

    /// Inserts the core statistics under `prefix` (`audit/` or `audit/{split}/`).
    fn insert(&self, m: &mut Metrics, prefix: &str, labels: &[String], rs: bool) {
        let key = |s: &str| format!("{prefix}{s}");
        m.insert(key("rows"), self.rows as f64);
        m.insert(key("tokens"), self.tokens as f64);
        if self.rows == 0 {
            return;
        }
        for (name, mom) in [
            ("token", &self.token),
            ("seq", &self.seq),
            ("geo", &self.geo),
        ] {
            m.insert(key(&format!("log_ratio/{name}/mean")), mom.mean());
            m.insert(key(&format!("log_ratio/{name}/std")), mom.std());
        }
        let nt = self.tokens.max(1) as f64;
        let nr = self.seq.n.max(1.0);
        for (j, k) in ["k1", "k2", "k3"].iter().enumerate() {
            m.insert(key(&format!("kl/{k}")), self.k[j] / nt);
            m.insert(key(&format!("kl/seq_{k}")), self.seq_k[j] / nr);
        }
        let rows = self.rows as f64;
        for (label, c) in labels.iter().zip(&self.changed) {
            for (name, &(tokens, seqs)) in CORRECTIONS.iter().zip(c) {
                m.insert(
                    key(&format!("is_{label}/{name}/tokens")),
                    tokens as f64 / nt,
                );
                m.insert(key(&format!("is_{label}/{name}/seqs")), seqs as f64 / rows);
            }
        }
        if rs {
            m.insert(key("rs/tokens"), self.rs.0 as f64 / nt);
            m.insert(key("rs/seqs"), self.rs.1 as f64 / rows);
        }
    }
}

/// Running `log Σ exp(x)`.
#[derive(Debug, Clone, Copy)]
struct LogSumExp {
    max: f64,
    sum: f64,
}

impl Default for LogSumExp {
    fn default() -> Self {
        Self {
            max: f64::NEG_INFINITY,
            sum: 0.0,
        }
    }
}

impl LogSumExp {
    fn add(&mut self, x: f64) {
        if x > self.max {
            self.sum = self.sum * (self.max - x).exp() + 1.0;
            self.max = x;
        } else {
            self.sum += (x - self.max).exp();
        }
    }

    fn merge(&mut self, o: &LogSumExp) {
        if o.max == f64::NEG_INFINITY {
            return;
        }
        if o.max > self.max {
            self.sum = self.sum * (self.max - o.max).exp() + o.sum;
            self.max = o.max;
        } else {
            self.sum += o.sum * (o.max - self.max).exp();
        }
    }

    fn value(&self) -> f64 {
        self.max + self.sum.ln()
    }
}

/// Kish's normalised ESS from log-weights: `Σw`, `Σw²` in log space and the count.
#[derive(Debug, Clone, Copy, Default)]
struct Ess {
    n: f64,
    w: LogSumExp,
    w2: LogSumExp,
}

impl Ess {
    /// Adds a weight given by its (already clamped) log.
    fn add(&mut self, log_w: f64) {
        self.n += 1.0;
        self.w.add(log_w);
        self.w2.add(2.0 * log_w);
    }

    fn merge(&mut self, o: &Ess) {
        self.n += o.n;
        self.w.merge(&o.w);
        self.w2.merge(&o.w2);
    }

    fn value(&self) -> Option<f64> {
        (self.n > 0.0).then(|| (2.0 * self.w.value() - self.w2.value() - self.n.ln()).exp())
    }
}

/// Kish's normalised ESS from plain sums of weights (0 when every weight is 0).
#[derive(Debug, Clone, Copy, Default)]
struct PlainEss {
    n: f64,
    w: f64,
    w2: f64,
}

impl PlainEss {
    fn add(&mut self, w: f64) {
        self.n += 1.0;
        self.w += w;
        self.w2 += w * w;
    }

    fn merge(&mut self, o: &PlainEss) {
        self.n += o.n;
        self.w += o.w;
        self.w2 += o.w2;
    }

    fn value(&self) -> f64 {
        if self.w2 > 0.0 {
            self.w * self.w / (self.n * self.w2)
        } else {
            0.0
        }
    }
}

/// Sums of a Pearson correlation of centred or raw pairs.
#[derive(Debug, Clone, Copy, Default)]
struct Corr {
    n: f64,
    x: f64,
    y: f64,
    xy: f64,
    xx: f64,
    yy: f64,
}

impl Corr {
    fn add(&mut self, x: f64, y: f64) {
        self.n += 1.0;
        self.x += x;
        self.y += y;
        self.xy += x * y;
        self.xx += x * x;
        self.yy += y * y;
    }

    fn merge(&mut self, o: &Corr) {
        self.n += o.n;
        self.x += o.x;
        self.y += o.y;
        self.xy += o.xy;
        self.xx += o.xx;
        self.yy += o.yy;
    }

    /// The correlation, `None` when either side has no variance.
    fn value(&self) -> Option<f64> {
        if self.n < 2.0 {
            return None;
        }
        let cov = self.xy - self.x * self.y / self.n;
        let vx = self.xx - self.x * self.x / self.n;
        let vy = self.yy - self.y * self.y / self.n;
        // A side whose variance is rounding noise of its squares is constant.
        (vx > 1e-12 * self.xx && vy > 1e-12 * self.yy)
            .then(|| (cov / (vx * vy).sqrt()).clamp(-1.0, 1.0))
    }
}

/// Batch-level statistics that only the whole batch (no split) reports.
#[derive(Debug, Clone, Default)]
struct BatchSums {
    /// ESS of token, sequence and geometric weights.
    ess: [Ess; 3],
    /// Sum, count and minimum of the per-group ESS (sequence, geometric).
    group_ess: [(f64, f64, f64); 2],
    /// Per threshold and level: ESS after truncation and after masking.
    corrected: Vec<[(PlainEss, PlainEss); 3]>,
    /// Correlations: (seq, geo) × (raw, in group).
    corr: [Corr; 4],
}

impl BatchSums {
    fn new(thresholds: usize) -> Self {
        Self {
            group_ess: [(0.0, 0.0, f64::INFINITY); 2],
            corrected: vec![Default::default(); thresholds],
            ..Self::default()
        }
    }

    fn merge(&mut self, o: &BatchSums) {
        for (a, b) in self.ess.iter_mut().zip(&o.ess) {
            a.merge(b);
        }
        for (a, b) in self.group_ess.iter_mut().zip(&o.group_ess) {
            a.0 += b.0;
            a.1 += b.1;
            a.2 = a.2.min(b.2);
        }
        for (a, b) in self.corrected.iter_mut().zip(&o.corrected) {
            for (x, y) in a.iter_mut().zip(b) {
                x.0.merge(&y.0);
                x.1.merge(&y.1);
            }
        }
        for (a, b) in self.corr.iter_mut().zip(&o.corr) {
            a.merge(b);
        }
    }

    fn insert(&self, m: &mut Metrics, labels: &[String]) {
        for (name, e) in ["token", "seq", "geo"].iter().zip(&self.ess) {
            if let Some(v) = e.value() {
                m.insert(format!("audit/ess/{name}/batch"), v);
            }
        }
        for (name, &(sum, n, min)) in ["seq", "geo"].iter().zip(&self.group_ess) {
            if n > 0.0 {
                m.insert(format!("audit/ess/{name}/group_mean"), sum / n);
                m.insert(format!("audit/ess/{name}/group_min"), min);
            }
        }
        for (label, c) in labels.iter().zip(&self.corrected) {
            for (level, (trunc, mask)) in ["token", "seq", "geo"].iter().zip(c) {
                if trunc.n > 0.0 {
                    m.insert(
                        format!("audit/is_{label}/{level}_truncate/ess"),
                        trunc.value(),
                    );
                    m.insert(format!("audit/is_{label}/{level}_mask/ess"), mask.value());
                }
            }
        }
        let names = [
            "seq_log_ratio_score",
            "geo_log_ratio_score",
            "seq_log_ratio_score_in_group",
            "geo_log_ratio_score_in_group",
        ];
        for (name, c) in names.iter().zip(&self.corr) {
            if let Some(v) = c.value() {
                m.insert(format!("audit/corr/{name}"), v);
            }
        }
    }
}

/// Everything one step contributes to a range.
struct StepParts {
    audit: StepAudit,
    splits: Vec<Sums>,
    batch: BatchSums,
    /// Token, sequence and geometric log-ratios, sorted.
    sorted: [Vec<f64>; 3],
    /// Valid tokens (the weight of the step's verl metrics in a range).
    tokens: usize,
}

/// Linear-interpolation quantile of sorted values (NumPy's default).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let h = (sorted.len() - 1) as f64 * q;
    let lo = h.floor() as usize;
    let hi = h.ceil() as usize;
    sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
}

fn check_groups(groups: &[Range<usize>], rows: usize) -> Result<()> {
    let mut next = 0;
    for g in groups {
        if g.start != next || g.end <= g.start {
            return Err(AlgoError::Shape(format!(
                "groups must be non-empty contiguous row ranges covering 0..{rows}; got {g:?} after row {next}"
            )));
        }
        next = g.end;
    }
    if next != rows {
        return Err(AlgoError::Shape(format!(
            "groups cover rows 0..{next}, the batch has {rows}"
        )));
    }
    Ok(())
}

fn step_parts(cfg: &AuditConfig, input: &StepRollouts<'_>) -> Result<StepParts> {
    cfg.validate()?;
    let rows = Rows::new(input.offsets, 0)?;
    rows.check_finite_tokens("logprobs", input.logprobs)?;
    rows.check_finite_tokens("rollout_logprobs", input.rollout_logprobs)?;
    rows.check_finite_rows("scores", input.scores)?;
    rows.check_rows("truncated", input.truncated)?;
    check_groups(input.groups, rows.len())?;

    // The verl metric set, exactly as the trainer computes it.
    let c = &cfg.correction;
    let rs = !c.rejection_options()?.is_empty();
    let (mut metrics, rs_mask) = if c.rollout_is.is_some() || rs {
        let rc = rollout_correction(
            c,
            input.offsets,
            input.logprobs,
            input.rollout_logprobs,
            None,
        )?;
        (rc.metrics, rs.then_some(rc.mask))
    } else {
        (
            off_policy_metrics(input.offsets, input.logprobs, input.rollout_logprobs, None)?,
            None,
        )
    };

    let bounds: Vec<(f64, f64)> = cfg.thresholds.iter().map(|&c| (cfg.lower(c), c)).collect();
    let labels: Vec<String> = cfg.thresholds.iter().map(|&c| threshold_label(c)).collect();
    let mut splits: Vec<Sums> = SPLITS.iter().map(|_| Sums::new(bounds.len())).collect();
    let mut batch = BatchSums::new(bounds.len());
    let mut sorted = [
        Vec::with_capacity(rows.tokens()),
        Vec::with_capacity(rows.len()),
        Vec::with_capacity(rows.len()),
    ];
    let mut out_rows = Vec::with_capacity(rows.len());
    for i in 0..rows.len() {
        let r = rows.range(i);
        let n = r.len();
        let mut flags = vec![RowFlags::default(); bounds.len()];
        let (mut sum, mut hi, mut lo) = (0.0, f64::NEG_INFINITY, f64::INFINITY);
        let mut tok = Moments::default();
        let mut k = [0.0; 3];
        for t in r.clone() {
            let d = input.logprobs[t] - input.rollout_logprobs[t];
            sum += d;
            hi = hi.max(d);
            lo = lo.min(d);
            tok.add(d);
            k[0] += Divergence::K1.of(d);
            k[1] += Divergence::K2.of(d);
            k[2] += Divergence::K3.of(d);
            let w = is_weight(d);
            for (f, &(lower, upper)) in flags.iter_mut().zip(&bounds) {
                f.tokens_above += usize::from(w > upper);
                f.tokens_below += usize::from(w < lower);
            }
            for (c, &(lower, upper)) in batch.corrected.iter_mut().zip(&bounds) {
                let (trunc, mask) = &mut c[0];
                trunc.add(w.min(upper));
                mask.add(if (lower..=upper).contains(&w) { w } else { 0.0 });
            }
            batch.ess[0].add(d.clamp(-SAFETY_BOUND, SAFETY_BOUND));
            sorted[0].push(d);
        }
        let (mean, hi, lo) = if n > 0 {
            (sum / n as f64, hi, lo)
        } else {
            (0.0, 0.0, 0.0)
        };
        let (seq_w, geo_w) = (is_weight(sum), is_weight(mean));
        for (f, &(lower, upper)) in flags.iter_mut().zip(&bounds) {
            f.seq_above = n > 0 && seq_w > upper;
            f.seq_below = n > 0 && seq_w < lower;
            f.geo_above = n > 0 && geo_w > upper;
            f.geo_below = n > 0 && geo_w < lower;
        }
        if n > 0 {
            for (c, &(lower, upper)) in batch.corrected.iter_mut().zip(&bounds) {
                for (level, w) in [(1, seq_w), (2, geo_w)] {
                    let (trunc, mask) = &mut c[level];
                    trunc.add(w.min(upper));
                    mask.add(if (lower..=upper).contains(&w) { w } else { 0.0 });
                }
            }
            batch.ess[1].add(sum.clamp(-SAFETY_BOUND, SAFETY_BOUND));
            batch.ess[2].add(mean.clamp(-SAFETY_BOUND, SAFETY_BOUND));
            sorted[1].push(sum);
            sorted[2].push(mean);
        }
        let row = RowAudit {
            tokens: n,
            seq_log_ratio: sum,
            mean_log_ratio: mean,
            max_token_log_ratio: hi,
            min_token_log_ratio: lo,
            seq_weight: seq_w,
            geo_weight: geo_w,
            kl_k1: if n > 0 { k[0] / n as f64 } else { 0.0 },
            kl_k3: if n > 0 { k[2] / n as f64 } else { 0.0 },
            success: input.scores[i] >= cfg.correction.success_reward_threshold,
            truncated: input.truncated[i],
            rs_rejected_tokens: rs_mask
                .as_ref()
                .map(|m| m[r.clone()].iter().filter(|&&keep| !keep).count()),
            flags,
        };
        for (s, inside) in splits.iter_mut().zip(split_of(&row)) {
            if inside {
                s.add_row(&row, &tok, &k);
            }
        }
        out_rows.push(row);
    }

    // Per-group ESS and the in-group correlations.
    for g in input.groups {
        let nonempty: Vec<usize> = g.clone().filter(|&i| out_rows[i].tokens > 0).collect();
        if nonempty.is_empty() {
            continue;
        }
        for (j, log_w) in [
            |r: &RowAudit| r.seq_log_ratio,
            |r: &RowAudit| r.mean_log_ratio,
        ]
        .iter()
        .enumerate()
        {
            let mut e = Ess::default();
            for &i in &nonempty {
                e.add(log_w(&out_rows[i]).clamp(-SAFETY_BOUND, SAFETY_BOUND));
            }
            if let Some(v) = e.value() {
                let ge = &mut batch.group_ess[j];
                ge.0 += v;
                ge.1 += 1.0;
                ge.2 = ge.2.min(v);
            }
        }
        let k = nonempty.len() as f64;
        let score_mean = nonempty.iter().map(|&i| input.scores[i]).sum::<f64>() / k;
        let seq_mean = nonempty
            .iter()
            .map(|&i| out_rows[i].seq_log_ratio)
            .sum::<f64>()
            / k;
        let geo_mean = nonempty
            .iter()
            .map(|&i| out_rows[i].mean_log_ratio)
            .sum::<f64>()
            / k;
        for &i in &nonempty {
            let (row, s) = (&out_rows[i], input.scores[i]);
            batch.corr[0].add(row.seq_log_ratio, s);
            batch.corr[1].add(row.mean_log_ratio, s);
            batch.corr[2].add(row.seq_log_ratio - seq_mean, s - score_mean);
            batch.corr[3].add(row.mean_log_ratio - geo_mean, s - score_mean);
        }
    }

    for s in &mut sorted {
        s.sort_unstable_by(f64::total_cmp);
    }
    for (j, s) in splits.iter().enumerate() {
        let prefix = if SPLITS[j].is_empty() {
            "audit/".to_string()
        } else {
            format!("audit/{}/", SPLITS[j])
        };
        s.insert(&mut metrics, &prefix, &labels, rs);
    }
    batch.insert(&mut metrics, &labels);
    for (name, xs) in ["token", "seq", "geo"].iter().zip(&sorted) {
        if let (Some(&first), Some(&last)) = (xs.first(), xs.last()) {
            metrics.insert(format!("audit/log_ratio/{name}/min"), first);
            metrics.insert(format!("audit/log_ratio/{name}/max"), last);
            for &(q, qn) in QUANTILES {
                metrics.insert(format!("audit/log_ratio/{name}/{qn}"), quantile(xs, q));
            }
        }
    }
    Ok(StepParts {
        audit: StepAudit {
            metrics,
            rows: out_rows,
        },
        splits,
        batch,
        sorted,
        tokens: rows.tokens(),
    })
}

/// The statistics of one step (see the module documentation).
pub fn audit_step(cfg: &AuditConfig, input: &StepRollouts<'_>) -> Result<StepAudit> {
    Ok(step_parts(cfg, input)?.audit)
}

/// Statistics of a range of steps, folded one step at a time with bounded memory.
#[derive(Clone)]
pub struct RangeAudit {
    cfg: AuditConfig,
    labels: Vec<String>,
    steps: usize,
    splits: Vec<Sums>,
    batch: BatchSums,
    /// The token, sequence and geometric log-ratios.
    dists: [Distribution; 3],
    verl: MetricAccumulator,
}

/// The values of a distribution: kept exactly up to a limit, then in a DDSketch.
#[derive(Clone)]
struct Distribution {
    exact: Vec<f64>,
    sketch: Option<DDSketch>,
    limit: usize,
    count: usize,
    min: f64,
    max: f64,
}

impl Distribution {
    fn new(limit: usize) -> Self {
        Self {
            exact: Vec::new(),
            sketch: None,
            limit,
            count: 0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }

    fn extend(&mut self, xs: &[f64]) {
        self.count += xs.len();
        for &x in xs {
            self.min = self.min.min(x);
            self.max = self.max.max(x);
        }
        if self.sketch.is_none() && self.exact.len() + xs.len() <= self.limit {
            self.exact.extend_from_slice(xs);
            return;
        }
        let sk = self
            .sketch
            .get_or_insert_with(|| DDSketch::new(SketchConfig::new(SKETCH_ALPHA, 65_536, 1e-12)));
        for x in self.exact.drain(..).chain(xs.iter().copied()) {
            sk.add(x);
        }
        self.exact = Vec::new();
    }

    /// Quantiles (NumPy's linear interpolation while exact), clamped to the extremes.
    fn quantiles(&self, qs: &[f64]) -> Vec<f64> {
        if self.count == 0 {
            return Vec::new();
        }
        match &self.sketch {
            Some(sk) => qs
                .iter()
                .filter_map(|&q| sk.quantile(q).ok().flatten())
                .map(|v| v.clamp(self.min, self.max))
                .collect(),
            None => {
                let mut sorted = self.exact.clone();
                sorted.sort_unstable_by(f64::total_cmp);
                qs.iter().map(|&q| quantile(&sorted, q)).collect()
            }
        }
    }
}

impl std::fmt::Debug for RangeAudit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RangeAudit")
            .field("cfg", &self.cfg)
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

impl RangeAudit {
    /// An empty range; fails on an invalid configuration.
    pub fn new(cfg: AuditConfig) -> Result<Self> {
        cfg.validate()?;
        let n = cfg.thresholds.len();
        Ok(Self {
            labels: cfg.thresholds.iter().map(|&c| threshold_label(c)).collect(),
            cfg,
            steps: 0,
            splits: SPLITS.iter().map(|_| Sums::new(n)).collect(),
            batch: BatchSums::new(n),
            dists: [0; 3].map(|_| Distribution::new(EXACT_QUANTILE_VALUES)),
            verl: MetricAccumulator::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &AuditConfig {
        &self.cfg
    }

    /// Steps added so far.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Computes one step's statistics and adds the step to the range.
    pub fn add(&mut self, input: &StepRollouts<'_>) -> Result<StepAudit> {
        let parts = step_parts(&self.cfg, input)?;
        self.steps += 1;
        for (a, b) in self.splits.iter_mut().zip(&parts.splits) {
            a.merge(b);
        }
        self.batch.merge(&parts.batch);
        for (d, xs) in self.dists.iter_mut().zip(&parts.sorted) {
            d.extend(xs);
        }
        let verl: Metrics = parts
            .audit
            .metrics
            .iter()
            .filter(|(k, _)| k.starts_with("rollout_corr/"))
            .map(|(k, &v)| (k.clone(), v))
            .collect();
        self.verl.add(&verl, parts.tokens as f64);
        Ok(parts.audit)
    }

    /// Quantiles of a log-ratio distribution over the range (exact up to
    /// [`EXACT_QUANTILE_VALUES`] values, then within [`SKETCH_ALPHA`] relative accuracy); empty
    /// when the range has no value. `qs` must lie in `[0, 1]`.
    pub fn log_ratio_quantiles(&self, which: LogRatio, qs: &[f64]) -> Vec<f64> {
        self.dists[which as usize].quantiles(qs)
    }

    /// Number of values of a log-ratio distribution in the range (tokens or non-empty rows).
    pub fn log_ratio_count(&self, which: LogRatio) -> usize {
        self.dists[which as usize].count
    }

    /// The statistics of every step added so far, with `audit/steps`.
    pub fn summary(&self) -> Metrics {
        let mut m = self.verl.finish();
        m.insert("audit/steps".into(), self.steps as f64);
        let rs = self
            .cfg
            .correction
            .rejection_options()
            .is_ok_and(|o| !o.is_empty());
        for (j, s) in self.splits.iter().enumerate() {
            let prefix = if SPLITS[j].is_empty() {
                "audit/".to_string()
            } else {
                format!("audit/{}/", SPLITS[j])
            };
            s.insert(&mut m, &prefix, &self.labels, rs);
        }
        self.batch.insert(&mut m, &self.labels);
        let qs: Vec<f64> = QUANTILES.iter().map(|q| q.0).collect();
        for (name, d) in ["token", "seq", "geo"].iter().zip(&self.dists) {
            if d.count == 0 {
                continue;
            }
            m.insert(format!("audit/log_ratio/{name}/min"), d.min);
            m.insert(format!("audit/log_ratio/{name}/max"), d.max);
            for (&(_, qn), v) in QUANTILES.iter().zip(d.quantiles(&qs)) {
                m.insert(format!("audit/log_ratio/{name}/{qn}"), v);
            }
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlreplay_algo::{IsLevel, IsMode, RsThreshold};

    fn cfg(thresholds: &[f64]) -> AuditConfig {
        AuditConfig {
            correction: AlgoConfig {
                rollout_is: Some(IsLevel::Token),
                rollout_is_threshold: thresholds[0],
                ..AlgoConfig::default()
            },
            thresholds: thresholds.to_vec(),
        }
    }

    /// A batch of `groups` groups of 4 rows with pseudo-random lengths, log-probs and scores.
    struct Batch {
        offsets: Vec<usize>,
        lp: Vec<f64>,
        roll: Vec<f64>,
        scores: Vec<f64>,
        truncated: Vec<bool>,
        groups: Vec<Range<usize>>,
    }

    impl Batch {
        fn new(groups: usize, seed: u64, spread: f64) -> Self {
            let mut state = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let mut next = move || {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 11) as f64 / (1u64 << 53) as f64
            };
            let mut b = Batch {
                offsets: vec![0],
                lp: vec![],
                roll: vec![],
                scores: vec![],
                truncated: vec![],
                groups: vec![],
            };
            for g in 0..groups {
                b.groups.push(4 * g..4 * g + 4);
                for _ in 0..4 {
                    let n = 1 + (next() * 9.0) as usize;
                    for _ in 0..n {
                        let roll = -3.0 * next();
                        b.roll.push(roll);
                        b.lp.push(roll + spread * (next() - 0.5));
                    }
                    b.offsets.push(b.lp.len());
                    b.scores.push(if next() < 0.5 { 1.0 } else { 0.0 });
                    b.truncated.push(next() < 0.3);
                }
            }
            b
        }

        fn input(&self) -> StepRollouts<'_> {
            StepRollouts {
                offsets: &self.offsets,
                logprobs: &self.lp,
                rollout_logprobs: &self.roll,
                scores: &self.scores,
                truncated: &self.truncated,
                groups: &self.groups,
            }
        }
    }

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
    }

    #[test]
    fn hand_checked_single_row() {
        // The spec's TV-L4 row: δ = [0.5, 1.0, −1.0], C = 2.
        let c = cfg(&[2.0]);
        let groups = [Range { start: 0, end: 1 }];
        let input = StepRollouts {
            offsets: &[0, 3],
            logprobs: &[-1.0, -0.5, -2.0],
            rollout_logprobs: &[-1.5, -1.5, -1.0],
            scores: &[1.0],
            truncated: &[false],
            groups: &groups,
        };
        let a = audit_step(&c, &input).unwrap();
        let m = &a.metrics;
        assert!(close(m["audit/log_ratio/token/mean"], 0.5 / 3.0, 1e-12));
        let var = (0.25f64 + 1.0 + 1.0) / 3.0 - (0.5f64 / 3.0).powi(2);
        assert!(close(m["audit/log_ratio/token/std"], var.sqrt(), 1e-12));
        assert!(close(m["audit/log_ratio/token/p50"], 0.5, 1e-12));
        // NumPy: np.quantile([-1, 0.5, 1], 0.25) = -0.25.
        assert!(close(m["audit/log_ratio/token/p25"], -0.25, 1e-12));
        assert!(close(m["audit/log_ratio/seq/mean"], 0.5, 1e-12));
        assert!(close(m["audit/kl/k1"], -0.5 / 3.0, 1e-12));
        assert!(close(m["audit/kl/k2"], 2.25 / 2.0 / 3.0, 1e-12));
        let k3: f64 = [0.5f64, 1.0, -1.0].iter().map(|d| d.exp() - 1.0 - d).sum();
        assert!(close(m["audit/kl/k3"], k3 / 3.0, 1e-12));
        assert!(close(m["rollout_corr/k3_kl"], 0.411628, 1e-6));
        // e^1 > 2 on one token; e^−1 < 1/2 on another.
        assert!(close(
            m["audit/is_2/token_truncate/tokens"],
            1.0 / 3.0,
            1e-12
        ));
        assert!(close(m["audit/is_2/token_mask/tokens"], 2.0 / 3.0, 1e-12));
        assert_eq!(m["audit/is_2/token_truncate/seqs"], 1.0);
        // Σδ = 0.5: the sequence weight e^0.5 is inside [1/2, 2].
        assert_eq!(m["audit/is_2/seq_mask/seqs"], 0.0);
        let w = [0.5f64.exp(), 1.0f64.exp(), (-1.0f64).exp()];
        let ess = w.iter().sum::<f64>().powi(2) / (3.0 * w.iter().map(|x| x * x).sum::<f64>());
        assert!(close(m["audit/ess/token/batch"], ess, 1e-12));
        let t: Vec<f64> = w.iter().map(|x| x.min(2.0)).collect();
        let ess_t = t.iter().sum::<f64>().powi(2) / (3.0 * t.iter().map(|x| x * x).sum::<f64>());
        assert!(close(m["audit/is_2/token_truncate/ess"], ess_t, 1e-12));
        assert_eq!(m["audit/ess/seq/batch"], 1.0);
        assert!(close(
            m["rollout_corr/rollout_is_eff_sample_size"],
            0.823344,
            1e-6
        ));
        let row = &a.rows[0];
        assert_eq!(row.max_token_log_ratio, 1.0);
        assert_eq!(row.min_token_log_ratio, -1.0);
        assert!(close(row.seq_weight, 0.5f64.exp(), 1e-12));
        assert_eq!(row.flags[0].tokens_above, 1);
        assert_eq!(row.flags[0].tokens_below, 1);
        assert!(row.success && !row.truncated);
        // One row: no failure split, and correlations are undefined.
        assert_eq!(m["audit/failure/rows"], 0.0);
        assert!(!m.contains_key("audit/failure/log_ratio/token/mean"));
        assert!(!m.contains_key("audit/corr/seq_log_ratio_score"));
    }

    #[test]
    fn on_policy_rows_change_nothing() {
        let mut b = Batch::new(3, 1, 0.0);
        b.lp = b.roll.clone();
        let m = audit_step(&cfg(&[2.0, 1.1]), &b.input()).unwrap().metrics;
        for (k, v) in m.iter().filter(|(k, _)| k.starts_with("audit/")) {
            if k.ends_with("/rows") || (k.ends_with("/tokens") && !k.contains("/is_")) {
                continue;
            }
            let want = if k.contains("/ess") { 1.0 } else { 0.0 };
            assert!(close(*v, want, 1e-12), "{k} = {v}, want {want}");
        }
        assert!(!m.contains_key("audit/corr/seq_log_ratio_score"));
        for k in [
            "kl",
            "k3_kl",
            "chi2_token",
            "rollout_is_ratio_fraction_high",
        ] {
            assert!(close(m[&format!("rollout_corr/{k}")], 0.0, 1e-12), "{k}");
        }
    }

    #[test]
    fn corrections_agree_with_the_trainers_rollout_correction() {
        let b = Batch::new(6, 7, 2.0);
        for &c in &[2.0, 1.2, 5.0] {
            let a = audit_step(&cfg(&[c]), &b.input()).unwrap().metrics;
            let l = threshold_label(c);
            for (level, name) in [
                (IsLevel::Token, "token"),
                (IsLevel::Sequence, "seq"),
                (IsLevel::Geometric, "geo"),
            ] {
                for mode in [IsMode::Truncate, IsMode::Mask] {
                    let algo = AlgoConfig {
                        rollout_is: Some(level),
                        rollout_is_threshold: c,
                        rollout_is_mode: mode,
                        ..AlgoConfig::default()
                    };
                    let v = rollout_correction(&algo, &b.offsets, &b.lp, &b.roll, None)
                        .unwrap()
                        .metrics;
                    let high = v["rollout_corr/rollout_is_ratio_fraction_high"];
                    let low = v["rollout_corr/rollout_is_ratio_fraction_low"];
                    if level == IsLevel::Token {
                        assert!(close(
                            a[&format!("audit/is_{l}/token_truncate/tokens")],
                            high,
                            1e-12
                        ));
                    } else {
                        let got = a[&format!("audit/is_{l}/{name}_truncate/seqs")];
                        assert!(close(got, high, 1e-12), "{name} {c}: {got} vs {high}");
                        let got = a[&format!("audit/is_{l}/{name}_mask/seqs")];
                        assert!(close(got, high + low, 1e-12));
                    }
                    if mode == IsMode::Mask {
                        let got = a[&format!("audit/is_{l}/{name}_mask/tokens")];
                        let want = v["rollout_corr/rollout_is_masked_fraction"];
                        assert!(close(got, want, 1e-12), "{name} {c}: {got} vs {want}");
                    }
                }
            }
            assert!(close(a["audit/kl/k1"], a["rollout_corr/kl"], 1e-12));
            assert!(close(a["audit/kl/k3"], a["rollout_corr/k3_kl"], 1e-12));
        }
        // Rejection sampling: the audit's fractions are the correction's.
        let mut c = cfg(&[2.0]);
        c.correction.rollout_rs = Some("token_k3,seq_mean_k1".into());
        c.correction.rollout_rs_threshold = Some(RsThreshold::Text("0.05,0.9_1.1".into()));
        let a = audit_step(&c, &b.input()).unwrap();
        let m = &a.metrics;
        assert!(m["audit/rs/tokens"] > 0.0);
        assert!(close(
            m["audit/rs/tokens"],
            m["rollout_corr/rollout_rs_masked_fraction"],
            1e-12
        ));
        assert!(close(
            m["audit/rs/seqs"],
            m["rollout_corr/rollout_rs_seq_masked_fraction"],
            1e-12
        ));
        assert!(a.rows.iter().all(|r| r.rs_rejected_tokens.is_some()));
    }

    #[test]
    fn splits_partition_the_batch() {
        let b = Batch::new(5, 3, 1.5);
        let m = audit_step(&cfg(&[2.0]), &b.input()).unwrap().metrics;
        for (x, y) in [("success", "failure"), ("truncated", "complete")] {
            for what in ["rows", "tokens"] {
                let got = m[&format!("audit/{x}/{what}")] + m[&format!("audit/{y}/{what}")];
                assert_eq!(got, m[&format!("audit/{what}")]);
            }
            for (key, weight) in [
                ("log_ratio/token/mean", "tokens"),
                ("kl/k3", "tokens"),
                ("is_2/token_mask/tokens", "tokens"),
                ("is_2/seq_truncate/seqs", "rows"),
                ("log_ratio/geo/mean", "rows"),
            ] {
                let part =
                    |s: &str| m[&format!("audit/{s}/{key}")] * m[&format!("audit/{s}/{weight}")];
                let all = m[&format!("audit/{key}")] * m[&format!("audit/{weight}")];
                assert!(close(part(x) + part(y), all, 1e-12), "{key}");
            }
        }
    }

    #[test]
    fn a_range_pools_its_steps_exactly() {
        let (a, b) = (Batch::new(4, 11, 1.0), Batch::new(3, 12, 0.5));
        let mut joined = Batch::new(0, 0, 0.0);
        for x in [&a, &b] {
            let base = joined.lp.len();
            let rows = joined.scores.len();
            joined.lp.extend(&x.lp);
            joined.roll.extend(&x.roll);
            joined
                .offsets
                .extend(x.offsets[1..].iter().map(|o| o + base));
            joined.scores.extend(&x.scores);
            joined.truncated.extend(&x.truncated);
            joined
                .groups
                .extend(x.groups.iter().map(|g| g.start + rows..g.end + rows));
        }
        let c = cfg(&[2.0, 1.5]);
        let one = audit_step(&c, &joined.input()).unwrap().metrics;
        // Exact quantiles while the range is small.
        let mut range = RangeAudit::new(c.clone()).unwrap();
        range.add(&a.input()).unwrap();
        range.add(&b.input()).unwrap();
        for (k, v) in one.iter().filter(|(k, _)| k.starts_with("audit/")) {
            assert!(close(range.summary()[k], *v, 1e-10), "{k}");
        }
        // From the sketch beyond the limit.
        let mut range = RangeAudit::new(c.clone()).unwrap();
        range.dists = [0; 3].map(|_| Distribution::new(10));
        range.add(&a.input()).unwrap();
        range.add(&b.input()).unwrap();
        let pooled = range.summary();
        assert_eq!(pooled["audit/steps"], 2.0);
        for (k, v) in one.iter().filter(|(k, _)| k.starts_with("audit/")) {
            let got = pooled[k];
            match QUANTILES.iter().find(|(_, q)| k.ends_with(q)) {
                // The sketch returns a value of rank ⌊q(n−1)⌋ or so, within its relative accuracy.
                Some(&(q, _)) => {
                    let mut xs: Vec<f64> = match k.split('/').nth(2) {
                        Some("token") => joined
                            .lp
                            .iter()
                            .zip(&joined.roll)
                            .map(|(a, b)| a - b)
                            .collect(),
                        _ => (0..joined.scores.len())
                            .map(|i| {
                                let r = joined.offsets[i]..joined.offsets[i + 1];
                                let s: f64 = r.clone().map(|t| joined.lp[t] - joined.roll[t]).sum();
                                if k.contains("/seq/") {
                                    s
                                } else {
                                    s / r.len() as f64
                                }
                            })
                            .collect(),
                    };
                    xs.sort_unstable_by(f64::total_cmp);
                    let h = q * (xs.len() - 1) as f64;
                    let lo = xs[(h.floor() as usize).saturating_sub(1)];
                    let hi = xs[(h.ceil() as usize + 1).min(xs.len() - 1)];
                    let slack = SKETCH_ALPHA * lo.abs().max(hi.abs());
                    assert!(
                        got >= lo - slack && got <= hi + slack,
                        "{k}: {got} not in [{lo}, {hi}]"
                    );
                }
                None => assert!(close(got, *v, 1e-10), "{k}: range {got}, one batch {v}"),
            }
        }
        // verl metrics: token-weighted step means.
        let sa = audit_step(&c, &a.input()).unwrap().metrics;
        let sb = audit_step(&c, &b.input()).unwrap().metrics;
        let (na, nb) = (a.lp.len() as f64, b.lp.len() as f64);
        let k = "rollout_corr/kl";
        assert!(close(
            pooled[k],
            (sa[k] * na + sb[k] * nb) / (na + nb),
            1e-12
        ));
        let k = "rollout_corr/rollout_is_max";
        assert_eq!(pooled[k], sa[k].max(sb[k]));
    }

    #[test]
    fn correlation_follows_the_scores() {
        // Successful rows have higher log-ratios: positive correlation, raw and within groups.
        let mut b = Batch::new(4, 5, 0.2);
        for i in 0..b.scores.len() {
            let shift = if b.scores[i] > 0.5 { 0.3 } else { -0.3 };
            for t in b.offsets[i]..b.offsets[i + 1] {
                b.lp[t] = b.roll[t] + shift;
            }
        }
        let m = audit_step(&cfg(&[2.0]), &b.input()).unwrap().metrics;
        assert!(close(m["audit/corr/geo_log_ratio_score"], 1.0, 1e-9));
        assert!(close(
            m["audit/corr/geo_log_ratio_score_in_group"],
            1.0,
            1e-9
        ));
        assert!(m["audit/corr/seq_log_ratio_score"] > 0.0);
    }

    #[test]
    fn bad_input_is_an_error_naming_the_place() {
        let mut b = Batch::new(2, 9, 1.0);
        b.lp[5] = f64::NAN;
        let e = audit_step(&cfg(&[2.0]), &b.input())
            .unwrap_err()
            .to_string();
        assert!(e.contains("`logprobs` at row"), "{e}");
        let mut b = Batch::new(2, 9, 1.0);
        b.groups = vec![0..3, 4..8];
        assert!(audit_step(&cfg(&[2.0]), &b.input()).is_err());
        let b = Batch::new(2, 9, 1.0);
        for bad in [vec![], vec![0.0], vec![2.0, f64::NAN]] {
            let mut c = cfg(&[2.0]);
            c.thresholds = bad;
            let e = audit_step(&c, &b.input()).unwrap_err().to_string();
            assert!(e.contains("rollout_is_threshold"), "{e}");
        }
    }
}
