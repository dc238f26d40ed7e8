//! Policy losses with their per-token gradients, aggregated with normalisers fixed over the
//! whole mini-batch.

use crate::config::{AggMode, AggNormalizer, AlgoConfig, KlType, PolicyObjective, TeacherRatio};
use crate::correction::{bypass_weights, SAFETY_BOUND};
use crate::error::{AlgoError, Result};
use crate::layout::Rows;
use crate::metrics::{MetricAccumulator, Metrics};
use crate::rlsd::{reweight_token, ReweightStats};

/// Aggregation statistics of one mini-batch, computed once before its first micro-batch.
///
/// With the `global` normaliser (default) every micro-batch is weighted by the mini-batch's
/// statistics (valid tokens, non-empty sequences), so summing the micro-batch losses and gradients
/// gives exactly the mini-batch's. With `verl` each micro-batch of `ppo_micro_batch_size_per_gpu`
/// consecutive rows uses its own statistics and is scaled by `1/Gacc` (Gacc = number of
/// micro-batches), as verl's legacy actor does.
#[derive(Debug, Clone)]
pub struct Normalizer {
    mode: AggMode,
    kind: AggNormalizer,
    micro: usize,
    scale: f64,
    row_valid: Vec<usize>,
}

impl Normalizer {
    /// Statistics of the whole mini-batch (`offsets` and optional validity `mask` of all its rows).
    /// `seq-mean-token-sum-norm` divides by `loss_scale_factor`, or by the longest row of the
    /// mini-batch when it is null (verl uses the padded width).
    pub fn new(cfg: &AlgoConfig, offsets: &[usize], mask: Option<&[bool]>) -> Result<Self> {
        cfg.validate()?;
        let rows = Rows::new(offsets, 0)?;
        let valid = rows.valid(mask)?;
        let row_valid: Vec<usize> = (0..rows.len())
            .map(|i| valid[rows.range(i)].iter().filter(|&&v| v).count())
            .collect();
        let longest = (0..rows.len())
            .map(|i| rows.range(i).len())
            .max()
            .unwrap_or(0);
        Ok(Self {
            mode: cfg.loss_agg_mode,
            kind: cfg.loss_agg_normalizer,
            micro: cfg.ppo_micro_batch_size_per_gpu.unwrap_or(1).max(1),
            scale: cfg.loss_scale_factor.unwrap_or(longest.max(1) as f64),
            row_valid,
        })
    }

    /// Number of rows of the mini-batch.
    pub fn rows(&self) -> usize {
        self.row_valid.len()
    }

    /// Valid tokens of the mini-batch.
    pub fn valid_tokens(&self) -> usize {
        self.row_valid.iter().sum()
    }

    /// The row ranges of verl's micro-batches (consecutive slices of `ppo_micro_batch_size_per_gpu`
    /// rows; the whole mini-batch as one slice under the `global` normaliser).
    pub fn micro_batches(&self) -> Vec<std::ops::Range<usize>> {
        let n = self.rows();
        let m = match self.kind {
            AggNormalizer::Global => n.max(1),
            AggNormalizer::Verl => self.micro,
        };
        (0..n).step_by(m).map(|s| s..(s + m).min(n)).collect()
    }

    /// Aggregation weight of each valid token of each row of a micro-batch (rows
    /// `first_row..first_row + counts.len()` of the mini-batch, with `counts` valid tokens each).
    fn row_weights(&self, first_row: usize, counts: &[usize]) -> Result<Vec<f64>> {
        let end = first_row + counts.len();
        if end > self.rows() {
            return Err(AlgoError::Shape(format!(
                "micro-batch rows {first_row}..{end} exceed the mini-batch's {} rows",
                self.rows()
            )));
        }
        for (i, (&c, &n)) in counts
            .iter()
            .zip(&self.row_valid[first_row..end])
            .enumerate()
        {
            if c != n {
                return Err(AlgoError::Shape(format!(
                    "row {}: {c} valid tokens in the micro-batch, {n} in the normaliser",
                    first_row + i
                )));
            }
        }
        let (stats_rows, gacc) = match self.kind {
            AggNormalizer::Global => (&self.row_valid[..], 1.0),
            AggNormalizer::Verl => {
                let m = self.micro;
                let expect = m.min(self.rows() - first_row);
                if !first_row.is_multiple_of(m) || counts.len() != expect {
                    return Err(AlgoError::Shape(format!(
                        "with the verl normaliser a micro-batch is {m} consecutive rows starting \
                         at a multiple of {m}; got rows {first_row}..{end}"
                    )));
                }
                (counts, self.rows().div_ceil(m) as f64)
            }
        };
        let n_tok: usize = stats_rows.iter().sum();
        let n_seq = stats_rows.iter().filter(|&&c| c > 0).count();
        let inv = |d: f64| if d > 0.0 { 1.0 / (d * gacc) } else { 0.0 };
        Ok(counts
            .iter()
            .map(|&c| match self.mode {
                AggMode::TokenMean => inv(n_tok as f64),
                AggMode::SeqMeanTokenSum => inv(n_seq as f64),
                AggMode::SeqMeanTokenMean => inv((n_seq * c) as f64),
                AggMode::SeqMeanTokenSumNorm => inv(self.scale),
            })
            .collect())
    }
}

/// The per-token inputs of one micro-batch (flat arrays, one entry per token of `offsets`).
#[derive(Debug, Clone, Copy, Default)]
pub struct MicroBatch<'a> {
    /// Index of this micro-batch's first row in the mini-batch.
    pub first_row: usize,
    /// Row offsets (`rows + 1` entries; may be a slice of the mini-batch's offsets).
    pub offsets: &'a [usize],
    /// Current policy log-probs ℓ (the variable of the gradient).
    pub logprobs: &'a [f64],
    /// ℓ_old; `None` means on-policy (ℓ_old = sg(ℓ), ratio exactly 1).
    pub old_logprobs: Option<&'a [f64]>,
    /// Rollout-engine log-probs (bypass mode and REINFORCE's `actor/ppo_kl`).
    pub rollout_logprobs: Option<&'a [f64]>,
    /// Advantages per token (from [`crate::compute_advantages`]).
    pub token_advantages: &'a [f64],
    /// Detached IS weights per token (from [`crate::rollout_correction`]).
    pub is_weights: Option<&'a [f64]>,
    /// Token validity (after rejection sampling); all valid when `None`.
    pub mask: Option<&'a [bool]>,
    /// Teacher log-probs ℓ_T (RLSD).
    pub teacher_logprobs: Option<&'a [f64]>,
    /// Per row: has a teacher context (RLSD `self_distillation_mask`); all true when `None`.
    pub sd_active: Option<&'a [bool]>,
    /// Per row: the rollout is correct (needed by `rlrt`).
    pub correct: Option<&'a [bool]>,
    /// Reference-policy log-probs (KL penalty).
    pub ref_logprobs: Option<&'a [f64]>,
}

/// Loss value, gradient and metrics of one micro-batch.
#[derive(Debug, Clone, PartialEq)]
pub struct LossOutput {
    /// This micro-batch's contribution to the mini-batch loss.
    pub loss: f64,
    /// dL/dℓ per token (0 on invalid tokens).
    pub grad_logprobs: Vec<f64>,
    /// The advantages that entered the loss (after RLSD reweighting).
    pub token_advantages: Vec<f64>,
    /// Valid tokens of the micro-batch (the weight for [`crate::MetricAccumulator::add`]).
    pub valid_tokens: usize,
    /// `actor/*` and `self_distillation/*` metrics.
    pub metrics: Metrics,
}

/// Everything detached: fixed for the gradient.
#[derive(Debug, Clone)]
pub(crate) struct Frozen {
    pub valid: Vec<bool>,
    pub agg: Vec<f64>,
    pub old: Vec<f64>,
    pub adv: Vec<f64>,
    pub is_w: Option<Vec<f64>>,
    pub reference: Option<Vec<f64>>,
    pub behaviour: Option<Vec<f64>>,
}

/// Evaluation of the differentiable part.
#[derive(Debug, Clone, Default)]
pub(crate) struct Eval {
    pub pg: f64,
    pub kl: f64,
    pub loss: f64,
    pub grad: Vec<f64>,
    pub clipped: usize,
    pub clipped_lower: usize,
    pub ppo_kl: f64,
}

/// Per-token PPO loss with dual clip: `(loss, dloss/dℓ, clipped, clipped_lower)`.
pub(crate) fn ppo_token(
    adv: f64,
    logprob: f64,
    old: f64,
    eps_lo: f64,
    eps_hi: f64,
    c: f64,
) -> (f64, f64, bool, bool) {
    let log_ratio = logprob - old;
    let ratio = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp();
    let d_ratio = if log_ratio.abs() <= SAFETY_BOUND {
        ratio
    } else {
        0.0
    };
    let l1 = -adv * ratio;
    let clamped = ratio.clamp(1.0 - eps_lo, 1.0 + eps_hi);
    let l2 = -adv * clamped;
    let clipped = l2 > l1;
    let (lc, dlc) = if clipped {
        let inside = ratio >= 1.0 - eps_lo && ratio <= 1.0 + eps_hi;
        (l2, if inside { -adv * d_ratio } else { 0.0 })
    } else {
        (l1, -adv * d_ratio)
    };
    if adv < 0.0 {
        let l3 = -adv * c;
        if lc > l3 {
            return (l3, 0.0, clipped, true);
        }
    }
    (lc, dlc, clipped, false)
}

/// Per-token KL penalty and its derivative in ℓ.
pub(crate) fn kl_token(kind: KlType, logprob: f64, reference: f64) -> (f64, f64) {
    let d = logprob - reference;
    match kind {
        KlType::K1 => (d, 1.0),
        KlType::Abs => (d.abs(), d.signum() * f64::from(u8::from(d != 0.0))),
        KlType::Mse => (0.5 * d * d, d),
        KlType::LowVarKl => {
            let kl = (-d).clamp(-SAFETY_BOUND, SAFETY_BOUND);
            let v = kl.exp() - kl - 1.0;
            let in_kl = d.abs() <= SAFETY_BOUND;
            if v > 10.0 {
                (10.0, 0.0)
            } else {
                (v, if in_kl { 1.0 - kl.exp() } else { 0.0 })
            }
        }
    }
}

/// Loss and gradient for given ℓ with everything else frozen.
pub(crate) fn evaluate(cfg: &AlgoConfig, f: &Frozen, logprobs: &[f64]) -> Eval {
    let n = logprobs.len();
    let mut e = Eval {
        grad: vec![0.0; n],
        ..Eval::default()
    };
    let (lo, hi, c) = (cfg.clip_low(), cfg.clip_high(), cfg.clip_ratio_c);
    let mut kl_n = 0usize;
    for t in 0..n {
        if !f.valid[t] {
            continue;
        }
        let w_is = f.is_w.as_ref().map_or(1.0, |w| w[t]);
        let (l, d) = match cfg.loss_mode.objective() {
            PolicyObjective::Reinforce => {
                let base = f.behaviour.as_ref().map_or(f.old[t], |b| b[t]);
                e.ppo_kl += base - logprobs[t];
                (-f.adv[t] * logprobs[t], -f.adv[t])
            }
            PolicyObjective::ClippedRatio => {
                let (l, d, cl, cl_lo) = ppo_token(f.adv[t], logprobs[t], f.old[t], lo, hi, c);
                e.clipped += usize::from(cl);
                e.clipped_lower += usize::from(cl_lo);
                e.ppo_kl += (f.old[t] - logprobs[t]).clamp(-SAFETY_BOUND, SAFETY_BOUND);
                (l, d)
            }
        };
        e.pg += f.agg[t] * l * w_is;
        e.grad[t] = f.agg[t] * d * w_is;
        if let Some(r) = &f.reference {
            let (k, dk) = kl_token(cfg.kl_loss_type, logprobs[t], r[t]);
            e.kl += f.agg[t] * k;
            e.grad[t] += cfg.kl_loss_coef * f.agg[t] * dk;
        }
        kl_n += 1;
    }
    if kl_n > 0 {
        e.ppo_kl /= kl_n as f64;
    }
    e.loss = e.pg
        + if f.reference.is_some() {
            cfg.kl_loss_coef * e.kl
        } else {
            0.0
        };
    e
}

/// Evaluates the policy loss of one micro-batch: value, dL/dℓ per token and metrics.
///
/// The loss is `Σ_t a_t · loss_t` with aggregation weights `a_t` from `norm` (see
/// [`Normalizer`]); `loss_t` is REINFORCE `−Â·ℓ·w` or PPO's clipped `−Â·ρ` times `w` (IS weight),
/// plus `kl_loss_coef·kl_t` when `use_kl_loss`. For `rlsd`/`rlrt` the token advantages are first
/// reweighted with the teacher log-probs (detached). Bypass mode uses the rollout log-probs as ℓ_old
/// (PPO without IS weights; REINFORCE with `min(exp(ℓ − ℓ_roll), C)` weights, detached).
pub fn policy_loss(cfg: &AlgoConfig, norm: &Normalizer, mb: &MicroBatch) -> Result<LossOutput> {
    let (frozen, adv_stats) = prepare(cfg, norm, mb)?;
    let e = evaluate(cfg, &frozen, mb.logprobs);
    let valid_tokens = frozen.valid.iter().filter(|&&v| v).count();
    let mut m = Metrics::new();
    let nv = valid_tokens.max(1) as f64;
    m.insert("actor/pg_loss".into(), e.pg);
    m.insert("actor/ppo_kl".into(), e.ppo_kl);
    if cfg.loss_mode.uses_ratio() {
        m.insert("actor/pg_clipfrac".into(), e.clipped as f64 / nv);
        m.insert(
            "actor/pg_clipfrac_lower".into(),
            e.clipped_lower as f64 / nv,
        );
    }
    if frozen.reference.is_some() {
        m.insert("actor/kl_loss".into(), e.kl);
        m.insert("actor/kl_coef".into(), cfg.kl_loss_coef);
    }
    m.insert(
        "actor/empty_micro_batches".into(),
        f64::from(u8::from(valid_tokens == 0)),
    );
    if let Some((stats, rows)) = adv_stats {
        stats.metrics(
            &mut m,
            cfg.token_reweight_lambda_now(),
            cfg.token_reweight_eps_w,
            cfg.loss_mode.needs_correctness(),
            rows,
        );
    }
    Ok(LossOutput {
        loss: e.loss,
        grad_logprobs: e.grad,
        token_advantages: frozen.adv,
        valid_tokens,
        metrics: m,
    })
}

/// The policy loss of a whole mini-batch, as `rlreplay compute` evaluates a batch: the
/// [`Normalizer`] of all its rows (`batch.offsets`, `batch.mask`), then [`policy_loss`] on each of
/// its [`Normalizer::micro_batches`] (one under the `global` normaliser). Losses are summed,
/// gradients and advantages concatenated, valid tokens counted, and metrics merged by
/// [`MetricAccumulator`] weighted by valid tokens. `batch.first_row` is ignored (the batch is
/// the whole mini-batch).
pub fn mini_batch_loss<'a>(cfg: &AlgoConfig, batch: &MicroBatch<'a>) -> Result<LossOutput> {
    let rows = Rows::new(batch.offsets, 0)?;
    rows.check_tokens("logprobs", batch.logprobs)?;
    rows.check_tokens("token_advantages", batch.token_advantages)?;
    for (field, xs) in [
        ("old_logprobs", batch.old_logprobs),
        ("rollout_logprobs", batch.rollout_logprobs),
        ("is_weights", batch.is_weights),
        ("teacher_logprobs", batch.teacher_logprobs),
        ("ref_logprobs", batch.ref_logprobs),
    ] {
        if let Some(xs) = xs {
            rows.check_tokens(field, xs)?;
        }
    }
    if let Some(m) = batch.mask {
        rows.check_tokens("mask", m)?;
    }
    for (field, xs) in [("sd_active", batch.sd_active), ("correct", batch.correct)] {
        if let Some(xs) = xs {
            rows.check_rows(field, xs)?;
        }
    }
    let norm = Normalizer::new(cfg, batch.offsets, batch.mask)?;
    let mut out = LossOutput {
        loss: 0.0,
        grad_logprobs: Vec::with_capacity(rows.tokens()),
        token_advantages: Vec::with_capacity(rows.tokens()),
        valid_tokens: 0,
        metrics: Metrics::new(),
    };
    let mut acc = MetricAccumulator::new();
    for r in norm.micro_batches() {
        let t = rows.range(r.start).start..rows.range(r.end - 1).end;
        let tokens = |xs: Option<&'a [f64]>| xs.map(|x| &x[t.clone()]);
        let mb = MicroBatch {
            first_row: r.start,
            offsets: &batch.offsets[r.start..=r.end],
            logprobs: &batch.logprobs[t.clone()],
            old_logprobs: tokens(batch.old_logprobs),
            rollout_logprobs: tokens(batch.rollout_logprobs),
            token_advantages: &batch.token_advantages[t.clone()],
            is_weights: tokens(batch.is_weights),
            mask: batch.mask.map(|m| &m[t.clone()]),
            teacher_logprobs: tokens(batch.teacher_logprobs),
            sd_active: batch.sd_active.map(|x| &x[r.clone()]),
            correct: batch.correct.map(|x| &x[r.clone()]),
            ref_logprobs: tokens(batch.ref_logprobs),
        };
        let o = policy_loss(cfg, &norm, &mb)?;
        out.loss += o.loss;
        out.grad_logprobs.extend_from_slice(&o.grad_logprobs);
        out.token_advantages.extend_from_slice(&o.token_advantages);
        out.valid_tokens += o.valid_tokens;
        acc.add(&o.metrics, o.valid_tokens as f64);
    }
    out.metrics = acc.finish();
    Ok(out)
}

type RlsdInfo = Option<(ReweightStats, (usize, usize, usize))>;

/// Checks the inputs and computes every detached quantity.
pub(crate) fn prepare(
    cfg: &AlgoConfig,
    norm: &Normalizer,
    mb: &MicroBatch,
) -> Result<(Frozen, RlsdInfo)> {
    cfg.validate()?;
    let rows = Rows::new(mb.offsets, mb.first_row)?;
    rows.check_finite_tokens("logprobs", mb.logprobs)?;
    rows.check_finite_tokens("token_advantages", mb.token_advantages)?;
    for (field, xs) in [
        ("old_logprobs", mb.old_logprobs),
        ("rollout_logprobs", mb.rollout_logprobs),
        ("is_weights", mb.is_weights),
        ("teacher_logprobs", mb.teacher_logprobs),
        ("ref_logprobs", mb.ref_logprobs),
    ] {
        if let Some(xs) = xs {
            rows.check_finite_tokens(field, xs)?;
        }
    }
    for (field, xs) in [("sd_active", mb.sd_active), ("correct", mb.correct)] {
        if let Some(xs) = xs {
            rows.check_rows(field, xs)?;
        }
    }
    let valid = rows.valid(mb.mask)?;
    let counts: Vec<usize> = (0..rows.len())
        .map(|i| valid[rows.range(i)].iter().filter(|&&v| v).count())
        .collect();
    let row_w = norm.row_weights(mb.first_row, &counts)?;
    let mut agg = vec![0.0; rows.tokens()];
    for (i, w) in row_w.iter().enumerate() {
        for t in rows.range(i) {
            if valid[t] {
                agg[t] = *w;
            }
        }
    }
    let missing = |what: &str| AlgoError::Missing(what.to_string());
    let old = if cfg.bypass_mode {
        mb.rollout_logprobs
            .ok_or_else(|| missing("bypass_mode needs rollout_logprobs"))?
            .to_vec()
    } else {
        mb.old_logprobs.unwrap_or(mb.logprobs).to_vec()
    };
    let is_w = if cfg.bypass_mode {
        match (cfg.loss_mode.objective(), cfg.rollout_is) {
            (PolicyObjective::Reinforce, Some(level)) => {
                let delta: Vec<f64> = mb.logprobs.iter().zip(&old).map(|(a, b)| a - b).collect();
                Some(bypass_weights(cfg, level, &rows, &delta, &valid))
            }
            _ => None,
        }
    } else {
        mb.is_weights.map(<[f64]>::to_vec)
    };
    let reference = if cfg.use_kl_loss {
        Some(
            mb.ref_logprobs
                .ok_or_else(|| missing("use_kl_loss needs ref_logprobs"))?
                .to_vec(),
        )
    } else {
        None
    };
    let mut adv = mb.token_advantages.to_vec();
    let mut info = None;
    if let Some(ratio) = cfg.loss_mode.teacher_ratio() {
        let reversed = ratio == TeacherRatio::StudentOverTeacherOnCorrect;
        let teacher = mb
            .teacher_logprobs
            .ok_or_else(|| missing("loss_mode rlsd/rlrt needs teacher_logprobs"))?;
        let correct = match (reversed, mb.correct) {
            (true, None) => return Err(missing("loss_mode rlrt needs per-row `correct`")),
            (_, c) => c,
        };
        let lambda = cfg.token_reweight_lambda_now();
        let eps_w = cfg.token_reweight_eps_w;
        let mut stats = ReweightStats::default();
        let mut ctx = 0;
        for i in 0..rows.len() {
            let has_ctx = mb.sd_active.is_none_or(|a| a[i]);
            let is_correct = correct.is_some_and(|c| c[i]);
            ctx += usize::from(has_ctx);
            let row_active = has_ctx && (!reversed || is_correct);
            for t in rows.range(i) {
                if !valid[t] {
                    continue;
                }
                stats.valid += 1;
                let (a, w_raw, w_clip) = reweight_token(
                    adv[t],
                    mb.logprobs[t],
                    teacher[t],
                    lambda,
                    eps_w,
                    reversed,
                    row_active,
                );
                adv[t] = a;
                if row_active {
                    stats.add(w_raw, w_clip, eps_w);
                }
            }
        }
        let n_correct = correct.map_or(0, |c| c.iter().filter(|&&x| x).count());
        info = Some((stats, (ctx, n_correct, rows.len())));
    }
    let behaviour = mb.rollout_logprobs.map(<[f64]>::to_vec);
    Ok((
        Frozen {
            valid,
            agg,
            old,
            adv,
            is_w,
            reference,
            behaviour,
        },
        info,
    ))
}
