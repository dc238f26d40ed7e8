//! RLSD token reweighting of advantages by a teacher's log-probs, and the trust-region teacher's
//! logit mixing.

use crate::correction::SAFETY_BOUND;
use crate::metrics::Metrics;

/// λ at a 1-based step: `λ0` without decay (`decay_steps` null or ≤ 0, or step unknown), else
/// `λ0·max(0, 1 − max(step − 1, 0)/D)`.
pub fn decayed_lambda(lambda0: f64, decay_steps: Option<i64>, step: Option<u64>) -> f64 {
    match (decay_steps, step) {
        (Some(d), Some(s)) if d > 0 => {
            let done = s.saturating_sub(1) as f64;
            lambda0 * (1.0 - done / d as f64).max(0.0)
        }
        _ => lambda0,
    }
}

/// Reweighting of one token: returns `(Â, w_raw, w_clip)`.
///
/// `Δ = ℓ_T − ℓ` (`rlsd`) or `ℓ − ℓ_T` (`rlrt`), `w_raw = exp(clamp(sign(A)·Δ, ±20))`,
/// `w_clip = clamp(w_raw, max(0, 1 − ε_w), 1 + ε_w)`, `Â = A·((1 − λ) + λ·w_clip)`.
/// An inactive token keeps `Â = A` (its weights are reported as 1).
pub fn reweight_token(
    advantage: f64,
    logprob: f64,
    teacher_logprob: f64,
    lambda: f64,
    eps_w: f64,
    reversed: bool,
    active: bool,
) -> (f64, f64, f64) {
    if !active {
        return (advantage, 1.0, 1.0);
    }
    let delta = if reversed {
        logprob - teacher_logprob
    } else {
        teacher_logprob - logprob
    };
    let sign = if advantage > 0.0 {
        1.0
    } else if advantage < 0.0 {
        -1.0
    } else {
        0.0
    };
    let w_raw = (sign * delta).clamp(-SAFETY_BOUND, SAFETY_BOUND).exp();
    let w_clip = w_raw.clamp((1.0 - eps_w).max(0.0), 1.0 + eps_w);
    (
        advantage * ((1.0 - lambda) + lambda * w_clip),
        w_raw,
        w_clip,
    )
}

/// Running statistics of the reweighting over active tokens, reported as
/// `self_distillation/token_reweight_*`.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReweightStats {
    pub valid: usize,
    pub active: usize,
    pub w_sum: f64,
    pub w_sq: f64,
    pub w_clip_sum: f64,
    pub clipped: usize,
}

impl ReweightStats {
    pub fn add(&mut self, w_raw: f64, w_clip: f64, eps_w: f64) {
        self.active += 1;
        self.w_sum += w_raw;
        self.w_sq += w_raw * w_raw;
        self.w_clip_sum += w_clip;
        if w_raw < (1.0 - eps_w).max(0.0) || w_raw > 1.0 + eps_w {
            self.clipped += 1;
        }
    }

    /// The metrics; `rows_context`/`rows_correct`/`rows` count rows with a teacher context, correct
    /// rows, and all rows of the micro-batch.
    pub fn metrics(
        &self,
        m: &mut Metrics,
        lambda: f64,
        eps_w: f64,
        reversed: bool,
        rows: (usize, usize, usize),
    ) {
        let p = "self_distillation/token_reweight_";
        let (ctx, correct, n) = rows;
        let nr = n.max(1) as f64;
        m.insert(format!("{p}is_rlrt"), f64::from(u8::from(reversed)));
        m.insert(format!("{p}lambda"), lambda);
        m.insert(format!("{p}eps_w"), eps_w);
        m.insert(
            format!("{p}active_token_fraction"),
            self.active as f64 / self.valid.max(1) as f64,
        );
        m.insert(format!("{p}context_sample_fraction"), ctx as f64 / nr);
        m.insert(format!("{p}correct_sample_fraction"), correct as f64 / nr);
        let (mean, std, cmean, frac) = if self.active == 0 {
            (1.0, 0.0, 1.0, 0.0)
        } else {
            let k = self.active as f64;
            let mean = self.w_sum / k;
            (
                mean,
                (self.w_sq / k - mean * mean).max(0.0).sqrt(),
                self.w_clip_sum / k,
                self.clipped as f64 / k,
            )
        };
        m.insert(format!("{p}w_mean"), mean);
        m.insert(format!("{p}w_std"), std);
        m.insert(format!("{p}w_clipped_mean"), cmean);
        m.insert(format!("{p}w_clip_frac"), frac);
        m.insert(
            "self_distillation/empty_target_batch".into(),
            f64::from(u8::from(ctx == 0)),
        );
    }
}

/// Log-probs of the trust-region teacher over one vocabulary slice: the logits are mixed,
/// `z_T = (1 − α)·z_ref + α·z_cur`, then `log_softmax(z_T / τ)`. Returns `None` when the slices
/// differ in length, are empty, or hold a non-finite value.
pub fn trust_region_logprobs(
    ref_logits: &[f64],
    cur_logits: &[f64],
    alpha: f64,
    temperature: f64,
) -> Option<Vec<f64>> {
    if ref_logits.len() != cur_logits.len() || ref_logits.is_empty() {
        return None;
    }
    let z: Vec<f64> = ref_logits
        .iter()
        .zip(cur_logits)
        .map(|(r, c)| ((1.0 - alpha) * r + alpha * c) / temperature)
        .collect();
    if z.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + z.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
    Some(z.iter().map(|x| x - lse).collect())
}
