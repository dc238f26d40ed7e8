//! One policy update on a batch of rollouts: the trainer's update step, whatever source the rows came from.
//!
//! The policy's log-probs before the update (`ℓ_old`, when the loss or the correction needs them)
//! -> the rollout correction against the behaviour log-probs -> advantages over the groups ->
//! mini-batches of whole groups, in order -> per mini-batch: normalisers over the whole
//! mini-batch, micro-batches packed up to the token budget, model log-probs (and, for `rlsd` /
//! `rlrt`, the teacher's log-probs of the same response tokens in the teacher contexts), loss and
//! dL/dℓ from the algorithm layer, backward, then clip and AdamW -> metrics. A mini-batch whose
//! loss or gradient is not finite is skipped (its gradients are dropped).

use std::ops::Range;
use std::time::Instant;

use rlreplay_algo::metrics::{merge_rule, Merge};
use rlreplay_algo::{
    compute_advantages, off_policy_metrics, policy_loss, rollout_correction, AlgoConfig,
    MetricAccumulator, MicroBatch, Normalizer,
};
use rlreplay_data::RolloutBatch;
use rlreplay_model::{AdamW, Model, SeqPair};

use crate::error::Result;
use crate::rundir::Metrics;
use crate::teacher::Teacher;
use rlreplay_dist::DataParallel;

/// Batch shape and step settings of one update.
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateSettings {
    /// Temperature of every log-prob.
    pub temperature: f64,
    /// Prompts (groups) per optimizer step; the whole batch when `None`.
    pub ppo_mini_batch_size: Option<usize>,
    /// Passes over the batch's mini-batches.
    pub ppo_epochs: u32,
    /// Token budget (prompt + response) of one packed forward pass.
    pub max_tokens_per_micro_batch: usize,
    /// Learning rate of this update's optimizer steps.
    pub lr: f64,
}

/// What self-distillation adds to an update (`loss_mode = "rlsd"` / `"rlrt"`).
pub struct TeacherInputs<'a> {
    /// The teacher.
    pub teacher: &'a Teacher,
    /// Teacher prompt token ids per row; empty for a row without teacher context.
    pub prompts: &'a [Vec<u32>],
    /// A row is correct when its score is at least this (`rlrt` trains on correct rows only).
    pub success_threshold: f64,
}

/// The result of one update.
#[derive(Debug, Clone)]
pub struct UpdateOutcome {
    /// Advantage, correction, off-policy, loss (`actor/*`, `self_distillation/*`) metrics,
    /// `actor/grad_norm` and `actor/lr`.
    pub metrics: Metrics,
    /// Optimizer steps applied.
    pub applied: u64,
    /// Mini-batch updates skipped (non-finite loss, gradient or log-probs).
    pub skipped: u64,
    /// Per-token log-probs of the first epoch's forward passes, flat in row order (`NaN` where a
    /// mini-batch was skipped before its forward pass).
    pub current: Vec<f64>,
}

/// Per-token log-probs of `pairs` under `model` (no graph), packed into micro-batches of
/// `budget` tokens; flat, in pair order.
pub fn packed_logprobs(
    model: &Model,
    pairs: &[SeqPair<'_>],
    budget: usize,
    temperature: f64,
) -> Result<Vec<f64>> {
    Ok(DataParallel::default().logprobs(model, pairs, budget, temperature)?)
}

/// Runs one update of `policy` on `batch` with `algo` (its `global_step` set by the caller):
/// `ppo_epochs` passes over mini-batches of `ppo_mini_batch_size` groups, one optimizer step each.
/// With `teacher`, the loss gets teacher log-probs recomputed at every micro-batch under the
/// current weights, and the EMA teacher follows the policy after an update that applied a step.
/// The model passes run on `dp`'s ranks ([`crate::dist`]); every rank returns the same outcome.
pub fn update(
    dp: &DataParallel<'_>,
    policy: &mut Model,
    opt: &mut AdamW,
    algo: &AlgoConfig,
    batch: &RolloutBatch,
    settings: &UpdateSettings,
    teacher: Option<&TeacherInputs<'_>>,
) -> Result<UpdateOutcome> {
    let tau = settings.temperature;
    let budget = settings.max_tokens_per_micro_batch;
    let lr = settings.lr;
    let n = batch.len();
    let offsets = &batch.response_offsets;
    let rollout: Vec<f64> = batch
        .rollout_log_probs
        .iter()
        .map(|&x| f64::from(x))
        .collect();
    let pairs: Vec<SeqPair<'_>> = (0..n)
        .map(|i| SeqPair::new(batch.prompt(i), batch.response(i)))
        .collect();
    let groups = batch.groups();
    let mb_groups = settings.ppo_mini_batch_size.unwrap_or(groups.len()).max(1);
    let minibatches: Vec<Range<usize>> = groups
        .chunks(mb_groups)
        .map(|c| c[0].start..c[c.len() - 1].end)
        .collect();
    let updates = minibatches.len() * settings.ppo_epochs as usize;
    let mut metrics = Metrics::new();

    // ℓ_old (the policy before this update) when the loss or the correction needs it.
    let rs = !algo.rejection_options()?.is_empty();
    let t_old = Instant::now();
    let old: Option<Vec<f64>> = if algo.bypass_mode {
        Some(rollout.clone())
    } else if algo.rollout_is.is_some() || rs || algo.loss_mode.needs_old_logprobs(updates) {
        let lp = dp.logprobs(policy, &pairs, budget, tau)?;
        metrics.insert(
            "timing_s/old_log_prob".into(),
            t_old.elapsed().as_secs_f64(),
        );
        Some(lp)
    } else {
        None
    };
    let old_finite = old.as_ref().is_none_or(|o| o.iter().all(|x| x.is_finite()));
    let correction = match &old {
        Some(o) if old_finite && (algo.rollout_is.is_some() || rs || algo.bypass_mode) => {
            Some(rollout_correction(algo, offsets, o, &rollout, None)?)
        }
        _ => None,
    };
    let mask: Vec<bool> = match &correction {
        Some(c) => c.mask.clone(),
        None => vec![true; rollout.len()],
    };
    let scores: Vec<f64> = batch.scores.iter().map(|&s| f64::from(s)).collect();
    let adv = compute_advantages(algo, &batch.uids, &scores, offsets, Some(&mask))?;
    metrics.extend(adv.metrics.clone());
    let sd_active: Option<Vec<bool>> =
        teacher.map(|t| t.prompts.iter().map(|p| !p.is_empty()).collect());
    let correct: Option<Vec<bool>> =
        teacher.map(|t| scores.iter().map(|&s| s >= t.success_threshold).collect());

    // The loss needs the current log-probs before the backward pass unless its gradient does not
    // depend on them (REINFORCE, or PPO at ratio 1): then one forward pass per micro-batch does.
    let two_pass =
        teacher.is_some() || algo.bypass_mode || (old.is_some() && algo.loss_mode.uses_ratio());
    let mut current = vec![f64::NAN; rollout.len()];
    let mut mb_metrics: Vec<Metrics> = Vec::new();
    let (mut applied, mut skipped) = (0u64, 0u64);
    let mut grad_norms = Vec::new();
    let t_actor = Instant::now();
    // The teacher's log-probs inside the micro-batches (`timing_s/ref`, not in `update_actor`).
    let mut ref_s = 0.0;
    for epoch in 0..settings.ppo_epochs {
        for rows in &minibatches {
            let tok = offsets[rows.start]..offsets[rows.end];
            let off = &offsets[rows.start..=rows.end];
            let norm = Normalizer::new(algo, off, Some(&mask[tok.clone()]))?;
            let mut acc = MetricAccumulator::new();
            let mut finite = old_finite;
            for lm in norm.micro_batches() {
                if !finite {
                    break;
                }
                let r = rows.start + lm.start..rows.start + lm.end;
                let t = offsets[r.start]..offsets[r.end];
                let sub = |xs: &[f64]| -> Vec<f64> { xs[t.clone()].to_vec() };
                let lp_in = if two_pass {
                    dp.logprobs(policy, &pairs[r.clone()], budget, tau)?
                } else {
                    sub(&rollout)
                };
                if lp_in.iter().any(|x| !x.is_finite()) {
                    finite = false;
                    break;
                }
                let teacher_lp: Option<Vec<f64>> = match teacher {
                    Some(ti) => {
                        let ps: Vec<&[u32]> =
                            ti.prompts[r.clone()].iter().map(Vec::as_slice).collect();
                        let ys: Vec<&[u32]> = r.clone().map(|i| batch.response(i)).collect();
                        let t_ref = Instant::now();
                        let lp = ti.teacher.logprobs(dp, policy, &ps, &ys, tau, budget)?;
                        ref_s += t_ref.elapsed().as_secs_f64();
                        Some(lp.into_iter().flatten().collect())
                    }
                    None => None,
                };
                let old_t = old.as_ref().map(|o| sub(o));
                let isw = correction
                    .as_ref()
                    .and_then(|c| c.is_weights.as_ref())
                    .map(|w| sub(w));
                let loss_at = |lp: &[f64]| {
                    policy_loss(
                        algo,
                        &norm,
                        &MicroBatch {
                            first_row: lm.start,
                            offsets: &offsets[r.start..=r.end],
                            logprobs: lp,
                            old_logprobs: old_t.as_deref(),
                            rollout_logprobs: Some(&rollout[t.clone()]),
                            token_advantages: &adv.tokens[t.clone()],
                            is_weights: isw.as_deref(),
                            mask: Some(&mask[t.clone()]),
                            teacher_logprobs: teacher_lp.as_deref(),
                            sd_active: sd_active.as_ref().map(|a| &a[r.clone()]),
                            correct: correct.as_ref().map(|c| &c[r.clone()]),
                            ref_logprobs: None,
                        },
                    )
                };
                let out = loss_at(&lp_in)?;
                if !out.loss.is_finite() || out.grad_logprobs.iter().any(|g| !g.is_finite()) {
                    finite = false;
                    break;
                }
                let lp_now = dp.forward_backward(
                    policy,
                    &pairs[r.clone()],
                    &out.grad_logprobs,
                    budget,
                    tau,
                )?;
                if lp_now.iter().any(|x| !x.is_finite()) {
                    finite = false;
                    break;
                }
                if epoch == 0 {
                    current[t.clone()].copy_from_slice(&lp_now);
                }
                let out = if two_pass { out } else { loss_at(&lp_now)? };
                acc.add(&out.metrics, out.valid_tokens as f64);
            }
            if finite {
                let report = dp.optimizer_step(policy, opt, lr)?;
                grad_norms.push(report.grad_norm);
                if report.skipped {
                    skipped += 1;
                } else {
                    applied += 1;
                }
                mb_metrics.push(acc.finish());
            } else {
                policy.zero_grad();
                skipped += 1;
            }
        }
    }
    metrics.insert(
        "timing_s/update_actor".into(),
        t_actor.elapsed().as_secs_f64() - ref_s,
    );
    if teacher.is_some() {
        metrics.insert("timing_s/ref".into(), ref_s);
    }
    if let Some(ti) = teacher {
        if applied > 0 {
            ti.teacher.follow(policy)?;
        }
    }

    // Off-policy diagnostics: the correction's (on ℓ_old, before rejection); else ℓ_old against
    // the behaviour log-probs; else (and in bypass mode) the log-probs of the first epoch's
    // forward passes, the first mini-batch's being ℓ_old.
    if let Some(c) = &correction {
        metrics.extend(c.metrics.clone());
    }
    let diagnostics = match (&correction, &old) {
        (Some(_), _) if !algo.bypass_mode => None,
        (_, Some(o)) if !algo.bypass_mode => Some(o.as_slice()),
        _ => current
            .iter()
            .all(|x| x.is_finite())
            .then_some(current.as_slice()),
    };
    if let Some(lp) = diagnostics.filter(|lp| lp.iter().all(|x| x.is_finite())) {
        metrics.extend(off_policy_metrics(offsets, lp, &rollout, None)?);
    }
    metrics.extend(mean_over_minibatches(&mb_metrics));
    if !grad_norms.is_empty() {
        let gn = grad_norms.iter().sum::<f64>() / grad_norms.len() as f64;
        metrics.insert("actor/grad_norm".into(), gn);
    }
    metrics.insert("actor/lr".into(), lr);
    Ok(UpdateOutcome {
        metrics,
        applied,
        skipped,
        current,
    })
}

/// Step metrics from per-mini-batch metrics: extremes for `max`/`min` metrics, means otherwise.
fn mean_over_minibatches(mbs: &[Metrics]) -> Metrics {
    let mut out = Metrics::new();
    for m in mbs {
        for (k, &v) in m {
            let e = out.entry(k.clone()).or_insert(match merge_rule(k) {
                Merge::Max => f64::NEG_INFINITY,
                Merge::Min => f64::INFINITY,
                _ => 0.0,
            });
            match merge_rule(k) {
                Merge::Max => *e = e.max(v),
                Merge::Min => *e = e.min(v),
                _ => *e += v / mbs.len() as f64,
            }
        }
    }
    out
}

/// Inserts the step's `perf/*` metrics (verl's names) for `tokens` trained in `secs` seconds, and
/// the run's total of skipped updates.
pub fn perf_metrics(m: &mut Metrics, tokens: u64, secs: f64, skipped_total: u64) {
    m.insert("perf/total_num_tokens".into(), tokens as f64);
    m.insert("perf/time_per_step".into(), secs);
    m.insert("perf/throughput".into(), tokens as f64 / secs.max(1e-9));
    m.insert("train/skipped_updates_total".into(), skipped_total as f64);
}

/// Inserts `prefix/mean`, `prefix/max` and `prefix/min` of `xs` (0 for an empty `xs`).
pub fn stats(m: &mut Metrics, prefix: &str, xs: &[f64]) {
    let n = xs.len().max(1) as f64;
    m.insert(format!("{prefix}/mean"), xs.iter().sum::<f64>() / n);
    m.insert(
        format!("{prefix}/max"),
        xs.iter().copied().reduce(f64::max).unwrap_or(0.0),
    );
    m.insert(
        format!("{prefix}/min"),
        xs.iter().copied().reduce(f64::min).unwrap_or(0.0),
    );
}
