//! The replay loop: one trainer step per planned step, checkpoints, resume.
//!
//! One trainer step: read the source shard -> select rows per the schedule -> (when configured)
//! the policy's log-probs before the update and the rollout correction against the logged
//! behaviour log-probs -> advantages over the groups -> mini-batches of whole groups, in order ->
//! per mini-batch: normalisers over the whole mini-batch, micro-batches packed up to the token
//! budget, model log-probs, loss and dL/dℓ from the algorithm layer, backward, then clip and
//! AdamW -> metrics. Every random choice derives from the seeds and the trainer step, so a run
//! continued from a checkpoint is bit-identical to an uninterrupted one.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use rand::seq::SliceRandom;
use rlreplay_algo::metrics::{merge_rule, Merge};
use rlreplay_algo::{
    compute_advantages, off_policy_metrics, policy_loss, rollout_correction, AlgoConfig, LossMode,
    MetricAccumulator, MicroBatch, Normalizer,
};
use rlreplay_data::{resolve_hub_path, Dataset, ReadOptions, RolloutBatch};
use rlreplay_model::{
    micro_batches, AdamW, AdamWConfig, DType, Device, LrSchedule, Qwen3, SeqPair,
};
use serde::{Deserialize, Serialize};

use crate::config::{parse_steps, Dtype, LrScheduleKind, ReplayConfig};
use crate::rundir::{latest_checkpoint, Metrics, RunDir, TRAINER_STATE};
use crate::schedule::{plan, select_rows, step_rng, PlannedStep, SUCCESS_THRESHOLD};

/// Version of the trainer-state format.
const STATE_FORMAT: u32 = 1;
/// File of the optimizer state inside a checkpoint.
pub const OPTIMIZER_STATE: &str = "optimizer.safetensors";

/// How to run the trainer.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The resolved configuration.
    pub config: ReplayConfig,
    /// The run directory.
    pub out: PathBuf,
    /// Continue from the run directory's latest complete checkpoint.
    pub resume: bool,
    /// Stop (with a checkpoint) once this trainer step is done.
    pub stop_after: Option<u64>,
    /// Show a progress bar on the terminal.
    pub progress: bool,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// The run directory.
    pub run_dir: PathBuf,
    /// Trainer steps done in total (including those before a resume).
    pub global_step: u64,
    /// Trainer steps of the whole plan.
    pub planned_steps: u64,
    /// Optimizer updates skipped because the loss or the gradient was not finite.
    pub skipped_updates: u64,
    /// The newest checkpoint written.
    pub last_checkpoint: Option<PathBuf>,
    /// The metrics of the last step run.
    pub last_metrics: Metrics,
}

/// The trainer state stored in every checkpoint (besides the weights and the optimizer).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Format version.
    pub format: u32,
    /// Trainer steps completed: the position in the plan.
    pub global_step: u64,
    /// Source step of every planned trainer step (checked on resume).
    pub plan: Vec<i64>,
    /// Optimizer updates applied.
    pub optimizer_steps: u64,
    /// Optimizer updates skipped (non-finite loss or gradient).
    pub skipped_updates: u64,
    /// Prompt and response tokens trained on so far.
    pub tokens_trained: u64,
    /// Seeds every random choice derives from, with the trainer step (there is no other RNG state).
    pub schedule_seed: u64,
    /// Seed of the model initialisation and mini-batch shuffling.
    pub run_seed: u64,
}

/// Runs (or resumes) a replay.
pub fn run(opts: &RunOptions) -> Result<RunSummary> {
    let threads = opts.config.run.threads;
    if threads > 0 {
        // candle's CPU kernels size their work split from this variable.
        std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
        let pool = rayon_pool(threads)?;
        return pool.install(|| run_inner(opts));
    }
    run_inner(opts)
}

fn rayon_pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("cannot start the worker threads")
}

fn run_inner(opts: &RunOptions) -> Result<RunSummary> {
    let mut t = Trainer::new(opts)?;
    let bar = if opts.progress {
        let bar = ProgressBar::new(t.plan.len() as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} step {pos}/{len} [{bar:30}] {elapsed_precise} eta {eta} {msg}",
            )
            .expect("valid progress template")
            .progress_chars("=> "),
        );
        bar.set_position(t.state.global_step);
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut last_metrics = Metrics::new();
    let mut last_checkpoint = None;
    let cfg = opts.config.clone();
    let total = t.plan.len() as u64;
    let stop = opts.stop_after.unwrap_or(total).min(total);
    while t.state.global_step < stop {
        let planned = t.plan[t.state.global_step as usize];
        let metrics = t.step(&planned).with_context(|| {
            format!(
                "trainer step {} (dataset step {})",
                planned.global_step, planned.source_step
            )
        })?;
        t.run.log_step(planned.global_step, &metrics)?;
        bar.set_position(planned.global_step);
        bar.set_message(format!(
            "score {:.3} loss {:.4} {:.0} tok/s",
            metrics
                .get("critic/score/mean")
                .copied()
                .unwrap_or(f64::NAN),
            metrics.get("actor/pg_loss").copied().unwrap_or(f64::NAN),
            metrics.get("perf/throughput").copied().unwrap_or(0.0)
        ));
        last_metrics = metrics;
        let s = t.state.global_step;
        let freq = cfg.checkpoint.save_freq;
        if (freq > 0 && s % freq == 0) || s == stop {
            last_checkpoint = Some(t.save_checkpoint()?);
            t.run.plot()?;
        }
    }
    bar.finish_and_clear();
    Ok(RunSummary {
        run_dir: opts.out.clone(),
        global_step: t.state.global_step,
        planned_steps: total,
        skipped_updates: t.state.skipped_updates,
        last_checkpoint,
        last_metrics,
    })
}

/// A replay in progress.
struct Trainer {
    cfg: ReplayConfig,
    algo: AlgoConfig,
    dataset: Dataset,
    plan: Vec<PlannedStep>,
    model: Qwen3,
    opt: AdamW,
    lr: LrSchedule,
    state: TrainerState,
    run: RunDir,
}

fn lr_schedule(cfg: &ReplayConfig, total_steps: u64) -> LrSchedule {
    let o = &cfg.optim;
    match o.lr_schedule {
        LrScheduleKind::Constant => LrSchedule::Constant { lr: o.lr },
        LrScheduleKind::Warmup => LrSchedule::Warmup {
            lr: o.lr,
            warmup_steps: o.lr_warmup_steps,
        },
        LrScheduleKind::Cosine => LrSchedule::Cosine {
            lr: o.lr,
            warmup_steps: o.lr_warmup_steps,
            total_steps,
            min_lr_ratio: o.min_lr_ratio,
        },
    }
}

fn adamw_config(cfg: &ReplayConfig) -> AdamWConfig {
    AdamWConfig {
        beta1: cfg.optim.betas[0],
        beta2: cfg.optim.betas[1],
        eps: cfg.optim.eps,
        weight_decay: cfg.optim.weight_decay,
        max_grad_norm: Some(cfg.optim.grad_clip),
    }
}

fn compute_dtype(d: Dtype) -> DType {
    match d {
        Dtype::F32 => DType::F32,
        Dtype::Bf16 => DType::BF16,
        Dtype::F64 => DType::F64,
    }
}

/// The files of a Hugging Face model directory that loading needs.
fn model_file(name: &str) -> bool {
    name.ends_with(".safetensors")
        || (name.ends_with(".json") && !name.contains('/'))
        || name == "tokenizer.model"
}

/// A run directory that already holds a run (so a fresh start would mix two runs).
fn holds_a_run(dir: &Path) -> bool {
    dir.join("metrics.jsonl").exists() || dir.join("checkpoints").is_dir()
}

impl Trainer {
    fn new(opts: &RunOptions) -> Result<Self> {
        let cfg = opts.config.clone();
        cfg.validate()?;
        let algo = cfg.algorithm.algo_config()?;
        let out = &opts.out;
        let dataset = Dataset::open(&cfg.data.path)
            .with_context(|| format!("[data] path = {:?}", cfg.data.path))?;
        let available: Vec<i64> = dataset.steps().iter().map(|s| s.0).collect();
        let selected: Vec<i64> = match &cfg.data.steps {
            Some(r) => {
                let r = parse_steps(r)?;
                available
                    .iter()
                    .copied()
                    .filter(|&s| r.contains(s))
                    .collect()
            }
            None => available.clone(),
        };
        let plan = plan(&cfg.schedule, &selected, &available)?;
        let lr = lr_schedule(&cfg, plan.len() as u64);
        let resolved = cfg.to_toml()?;
        let config_path = out.join("config.toml");

        let resume_from = if opts.resume {
            let saved = std::fs::read_to_string(&config_path)
                .with_context(|| format!("--resume: cannot read {}", config_path.display()))?;
            let saved = ReplayConfig::parse(&saved, &[])
                .with_context(|| format!("--resume: {}", config_path.display()))?;
            let comparable = |c: &ReplayConfig| {
                let mut c = c.clone();
                c.checkpoint = Default::default();
                c.run.dir = None;
                c
            };
            ensure!(
                comparable(&saved) == comparable(&cfg),
                "--resume: the configuration differs from the run's {} (only [checkpoint] may change)",
                config_path.display()
            );
            latest_checkpoint(out)?
        } else {
            ensure!(
                !holds_a_run(out),
                "{} already holds a run: pass --resume to continue it, or choose another --out",
                out.display()
            );
            None
        };

        let device = Device::Cpu;
        let dtype = compute_dtype(cfg.model.dtype);
        let (model, opt, state) = match &resume_from {
            Some((step, dir)) => {
                let model = Qwen3::load(dir, dtype, &device)
                    .with_context(|| format!("loading checkpoint {}", dir.display()))?;
                let opt = AdamW::load(dir.join(OPTIMIZER_STATE), &model)?;
                let text = std::fs::read_to_string(dir.join(TRAINER_STATE))?;
                let state: TrainerState = serde_json::from_str(&text)
                    .with_context(|| format!("{}", dir.join(TRAINER_STATE).display()))?;
                ensure!(
                    state.format == STATE_FORMAT && state.global_step == *step,
                    "{}: unexpected trainer state",
                    dir.display()
                );
                let planned: Vec<i64> = plan.iter().map(|p| p.source_step).collect();
                ensure!(
                    state.plan == planned,
                    "{}: the schedule differs from the one the run started with",
                    dir.display()
                );
                (model, opt, state)
            }
            None => {
                let model = match (&cfg.model.path, &cfg.model.random) {
                    (Some(path), _) => {
                        let dir = resolve_hub_path(&path.to_string_lossy(), &model_file)?;
                        Qwen3::load(&dir, dtype, &device)
                            .with_context(|| format!("[model] path = {}", path.display()))?
                    }
                    (None, Some(r)) => Qwen3::new_random(r.to_config(), r.seed, dtype, &device)
                        .context("[model] random")?,
                    (None, None) => bail!("[model]: give `path` or `random`"),
                };
                let opt = AdamW::new(&model, adamw_config(&cfg));
                let state = TrainerState {
                    format: STATE_FORMAT,
                    global_step: 0,
                    plan: plan.iter().map(|p| p.source_step).collect(),
                    optimizer_steps: 0,
                    skipped_updates: 0,
                    tokens_trained: 0,
                    schedule_seed: cfg.schedule.seed,
                    run_seed: cfg.run.seed,
                };
                (model, opt, state)
            }
        };
        let run = RunDir::open(out, state.global_step)?;
        crate::rundir::write_atomic(&config_path, resolved.as_bytes())?;
        Ok(Self {
            cfg,
            algo,
            dataset,
            plan,
            model,
            opt,
            lr,
            state,
            run,
        })
    }

    fn save_checkpoint(&self) -> Result<PathBuf> {
        let state = serde_json::to_string_pretty(&self.state)?;
        self.run
            .save_checkpoint(self.state.global_step, self.cfg.checkpoint.keep, |dir| {
                self.model.save_hf(dir)?;
                self.opt.save(dir.join(OPTIMIZER_STATE))?;
                std::fs::write(dir.join(TRAINER_STATE), state)?;
                Ok(())
            })
    }

    /// Reads and selects the rows of one planned step.
    fn load_batch(&self, ps: &PlannedStep, metrics: &mut Metrics) -> Result<RolloutBatch> {
        let read = ReadOptions {
            lenient: false,
            eos: self.cfg.data.eos_token_id,
            vocab: self
                .cfg
                .data
                .vocab_check
                .then_some(self.model.config().vocab_size as u32),
        };
        let (batch, _report) = self.dataset.read_step(ps.source_step, &read)?;
        let groups = batch.groups();
        let eos = self.cfg.data.eos_token_id;
        let truncated: Vec<bool> = (0..batch.len()).map(|i| batch.truncated(i, eos)).collect();
        let (mut rows, sel) =
            select_rows(&self.cfg.schedule, ps, &groups, &batch.scores, &truncated);
        if self.cfg.batch.shuffle {
            let mut spans: Vec<&[usize]> = Vec::new();
            let mut start = 0;
            for i in 1..=rows.len() {
                if i == rows.len() || batch.uids[rows[i]] != batch.uids[rows[start]] {
                    spans.push(&rows[start..i]);
                    start = i;
                }
            }
            spans.shuffle(&mut step_rng(self.cfg.run.seed, ps.global_step, 4));
            rows = spans.concat();
        }
        for (k, v) in [
            ("groups_in", sel.groups_in),
            ("groups", sel.groups_out),
            ("rows", sel.rows_out),
            ("dropped_solve_none", sel.dropped_solve_none),
            ("dropped_solve_all", sel.dropped_solve_all),
            ("dropped_truncated", sel.dropped_truncated),
            ("dropped_subsample", sel.dropped_subsample),
        ] {
            metrics.insert(format!("schedule/{k}"), v as f64);
        }
        Ok(batch.select(&rows))
    }

    /// Per-token log-probs of `pairs` under the current weights (no graph), packed into
    /// micro-batches of the token budget; flat, in pair order.
    fn logprobs(&self, pairs: &[SeqPair<'_>]) -> Result<Vec<f64>> {
        let mut out = Vec::new();
        for r in micro_batches(pairs, self.cfg.batch.max_tokens_per_micro_batch) {
            let lp = self
                .model
                .logprobs(&pairs[r], self.cfg.algorithm.temperature, false)?;
            out.extend(lp.logprobs.into_iter().flatten());
        }
        Ok(out)
    }

    fn step(&mut self, ps: &PlannedStep) -> Result<Metrics> {
        let started = Instant::now();
        let mut metrics = Metrics::new();
        let batch = self.load_batch(ps, &mut metrics)?;
        let mut algo = self.algo.clone();
        algo.global_step = Some(ps.global_step);
        let lr = self.lr.lr_at(ps.global_step - 1);
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
        let mb_groups = self
            .cfg
            .batch
            .ppo_mini_batch_size
            .unwrap_or(groups.len())
            .max(1);
        let minibatches: Vec<std::ops::Range<usize>> = groups
            .chunks(mb_groups)
            .map(|c| c[0].start..c[c.len() - 1].end)
            .collect();
        let updates = minibatches.len() * self.cfg.batch.ppo_epochs as usize;

        // ℓ_old (the policy before this step's updates) when the loss or the correction needs it.
        let rs = !algo.rejection_options()?.is_empty();
        let old: Option<Vec<f64>> = if algo.bypass_mode {
            Some(rollout.clone())
        } else if algo.rollout_is.is_some()
            || rs
            || (algo.loss_mode == LossMode::Ppo && updates > 1)
        {
            Some(self.logprobs(&pairs)?)
        } else {
            None
        };
        let old_finite = old.as_ref().is_none_or(|o| o.iter().all(|x| x.is_finite()));
        let correction = match &old {
            Some(o) if old_finite && (algo.rollout_is.is_some() || rs || algo.bypass_mode) => {
                Some(rollout_correction(&algo, offsets, o, &rollout, None)?)
            }
            _ => None,
        };
        let mask: Vec<bool> = match &correction {
            Some(c) => c.mask.clone(),
            None => vec![true; rollout.len()],
        };
        let scores: Vec<f64> = batch.scores.iter().map(|&s| f64::from(s)).collect();
        let adv = compute_advantages(&algo, &batch.uids, &scores, offsets, Some(&mask))?;
        metrics.extend(adv.metrics.clone());

        // A loss whose gradient does not depend on the current log-probs (REINFORCE, or PPO at
        // ratio 1) needs a single forward pass per micro-batch.
        let two_pass = old.is_some() && (algo.loss_mode == LossMode::Ppo || algo.bypass_mode);
        let mut current = vec![f64::NAN; rollout.len()];
        let mut mb_metrics: Vec<Metrics> = Vec::new();
        let mut skipped = 0u64;
        let mut grad_norms = Vec::new();
        for epoch in 0..self.cfg.batch.ppo_epochs {
            for rows in &minibatches {
                let tok = offsets[rows.start]..offsets[rows.end];
                let off = &offsets[rows.start..=rows.end];
                let norm = Normalizer::new(&algo, off, Some(&mask[tok.clone()]))?;
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
                        self.logprobs(&pairs[r.clone()])?
                    } else {
                        sub(&rollout)
                    };
                    if lp_in.iter().any(|x| !x.is_finite()) {
                        finite = false;
                        break;
                    }
                    let old_t = old.as_ref().map(|o| sub(o));
                    let isw = correction
                        .as_ref()
                        .and_then(|c| c.is_weights.as_ref())
                        .map(|w| sub(w));
                    let loss_at = |lp: &[f64]| {
                        policy_loss(
                            &algo,
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
                                ..Default::default()
                            },
                        )
                    };
                    let out = loss_at(&lp_in)?;
                    if !out.loss.is_finite() || out.grad_logprobs.iter().any(|g| !g.is_finite()) {
                        finite = false;
                        break;
                    }
                    let mut lp_now = Vec::with_capacity(t.len());
                    let budget = self.cfg.batch.max_tokens_per_micro_batch;
                    for c in micro_batches(&pairs[r.clone()], budget) {
                        let g0 = offsets[r.start + c.start] - t.start;
                        let g1 = offsets[r.start + c.end] - t.start;
                        let lp = self.model.forward_backward(
                            &pairs[r.start + c.start..r.start + c.end],
                            &out.grad_logprobs[g0..g1],
                            self.cfg.algorithm.temperature,
                        )?;
                        lp_now.extend(lp.into_iter().flatten());
                    }
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
                    let report = self.opt.step(&mut self.model, lr)?;
                    grad_norms.push(report.grad_norm);
                    if report.skipped {
                        skipped += 1;
                    } else {
                        self.state.optimizer_steps += 1;
                    }
                    mb_metrics.push(acc.finish());
                } else {
                    self.model.zero_grad();
                    skipped += 1;
                }
            }
        }
        self.state.skipped_updates += skipped;

        // Off-policy diagnostics: the correction's (on ℓ_old, before rejection); else ℓ_old
        // against the behaviour log-probs; else (and in bypass mode) the log-probs of the first
        // epoch's forward passes, the first mini-batch's being ℓ_old.
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
        if current.iter().all(|x| x.is_finite()) {
            // Mean per-token log-prob of successful and of failed responses under the policy
            // being trained: the replay's learning signal at a glance.
            for (name, win) in [("success", true), ("failure", false)] {
                let (mut sum, mut count) = (0.0, 0usize);
                for i in (0..n).filter(|&i| (batch.scores[i] >= SUCCESS_THRESHOLD) == win) {
                    sum += current[offsets[i]..offsets[i + 1]].iter().sum::<f64>();
                    count += offsets[i + 1] - offsets[i];
                }
                if count > 0 {
                    metrics.insert(format!("replay/logprob_{name}"), sum / count as f64);
                }
            }
        }
        metrics.extend(mean_over_minibatches(&mb_metrics));
        if !grad_norms.is_empty() {
            let gn = grad_norms.iter().sum::<f64>() / grad_norms.len() as f64;
            metrics.insert("actor/grad_norm".into(), gn);
        }
        metrics.insert("actor/lr".into(), lr);
        let eos = self.cfg.data.eos_token_id;
        let resp: Vec<f64> = (0..n).map(|i| batch.response(i).len() as f64).collect();
        let prompt: Vec<f64> = (0..n).map(|i| batch.prompt(i).len() as f64).collect();
        stats(&mut metrics, "response_length", &resp);
        stats(&mut metrics, "prompt_length", &prompt);
        let clipped = (0..n).filter(|&i| batch.truncated(i, eos)).count();
        metrics.insert(
            "response_length/clip_ratio".into(),
            clipped as f64 / n.max(1) as f64,
        );
        let tokens = (batch.prompt_tokens.len() + batch.response_tokens.len()) as u64;
        self.state.tokens_trained += tokens;
        self.state.global_step = ps.global_step;
        let secs = started.elapsed().as_secs_f64();
        metrics.insert("perf/total_num_tokens".into(), tokens as f64);
        metrics.insert("perf/time_per_step".into(), secs);
        metrics.insert("perf/throughput".into(), tokens as f64 / secs.max(1e-9));
        metrics.insert("train/source_step".into(), ps.source_step as f64);
        metrics.insert("train/epoch".into(), f64::from(ps.epoch));
        metrics.insert("train/skipped_updates".into(), skipped as f64);
        metrics.insert(
            "train/skipped_updates_total".into(),
            self.state.skipped_updates as f64,
        );
        metrics.insert(
            "train/optimizer_steps".into(),
            self.state.optimizer_steps as f64,
        );
        Ok(metrics)
    }
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

fn stats(m: &mut Metrics, prefix: &str, xs: &[f64]) {
    let n = xs.len().max(1) as f64;
    m.insert(format!("{prefix}/mean"), xs.iter().sum::<f64>() / n);
    m.insert(
        format!("{prefix}/max"),
        xs.iter().copied().fold(0.0, f64::max),
    );
    m.insert(
        format!("{prefix}/min"),
        xs.iter().copied().reduce(f64::min).unwrap_or(0.0),
    );
}
