//! The online loop: draw prompts -> generate `n` rollouts each -> score -> (RLSD) teacher contexts
//! -> advantages -> update in mini-batches -> write the step's rollouts as a shard -> validate,
//! checkpoint, publish results.
//!
//! Every random choice derives from the seed and the step (prompt order per epoch, one sampling
//! seed per step), so the sampler's position is the only state a resume needs besides the weights
//! and the optimizer.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rlreplay_algo::{
    compute_advantages, policy_loss, rollout_correction, AlgoConfig, MetricAccumulator, MicroBatch,
    Normalizer,
};
use rlreplay_data::{write_shard, RolloutBatch};
use rlreplay_eval::chat::{ChatOptions, ChatTokenizer, Message};
use rlreplay_eval::dataset::{read_prompts, PromptItem};
use rlreplay_eval::engine::{generate, Generation};
use rlreplay_eval::sampling::SamplingParams;
use rlreplay_model::generate::Decoder;
use rlreplay_model::TOKENIZER_FILES;
use rlreplay_model::{
    micro_batches, AdamW, AdamWConfig, DType, Device, LrSchedule, Qwen3, SeqPair,
};
use rlreplay_reward::{RewardDispatch, RewardOutcome};
use rlreplay_train::config::{Dtype, LrScheduleKind};
use rlreplay_train::rundir::{latest_checkpoint, write_atomic, Metrics, RunDir, TRAINER_STATE};
use rlreplay_train::trainer::OPTIMIZER_STATE;
use serde::{Deserialize, Serialize};

use crate::config::{OnlineConfig, TeacherRegularization};
use crate::context::{
    build_contexts, context_metrics, encode_teacher_prompt, math_feedback, ContextRow,
    TeacherContext,
};
use crate::teacher::ema_update;
use crate::teacher_lp::teacher_logprobs;
use crate::toy;

/// Directory of the EMA teacher inside a checkpoint.
const EMA_TEACHER: &str = "ema_teacher";
/// Files of a Hugging Face model directory copied to the run root for the best checkpoint.
const HF_FILES: [&str; 5] = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
];

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The resolved configuration.
    pub config: OnlineConfig,
    /// The configuration as the user wrote it (file text) and the overrides, for the
    /// hyper-parameter table's `Source` column.
    pub provenance: Provenance,
    /// The run directory.
    pub out: PathBuf,
    /// Continue from the latest complete checkpoint.
    pub resume: bool,
    /// Stop (with a checkpoint) once this step is done.
    pub stop_after: Option<u64>,
}

/// Where configuration values came from.
#[derive(Debug, Clone, Default)]
pub struct Provenance {
    /// The configuration file's path and text.
    pub file: Option<(PathBuf, String)>,
    /// `section.key=value` overrides.
    pub overrides: Vec<String>,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// Steps done in total.
    pub global_step: u64,
    /// `(step, mean@k)` of every validation.
    pub validations: Vec<(u64, f64)>,
    /// The best validation `(step, mean@k)`.
    pub best: Option<(u64, f64)>,
    /// Metrics of the last step.
    pub last_metrics: Metrics,
}

/// The prompt sampler's position: epoch and index into that epoch's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SamplerState {
    /// Current epoch (0-based).
    pub epoch: u64,
    /// Prompts of the epoch already drawn.
    pub position: usize,
}

/// Trainer state saved in every checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Steps completed.
    pub global_step: u64,
    /// Prompt sampler position after the last completed step.
    pub sampler: SamplerState,
    /// Optimizer updates applied.
    pub optimizer_steps: u64,
    /// Optimizer updates skipped (non-finite loss or gradient).
    pub skipped_updates: u64,
    /// Rewards that failed (errors) so far.
    pub reward_errors: u64,
    /// Rewards that timed out so far.
    pub reward_timeouts: u64,
    /// `(step, mean@k)` of every validation so far.
    pub validations: Vec<(u64, f64)>,
    /// The best validation so far.
    pub best: Option<(u64, f64)>,
}

/// The seeded order of one epoch's prompts.
fn epoch_order(n: usize, seed: u64, epoch: u64, shuffle: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if shuffle {
        let mut rng =
            rand::rngs::StdRng::seed_from_u64(seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        order.shuffle(&mut rng);
    }
    order
}

/// Draws `count` prompt indices, continuing into the next epoch when one runs out.
pub fn draw_prompts(
    state: &mut SamplerState,
    n: usize,
    count: usize,
    seed: u64,
    shuffle: bool,
) -> Vec<usize> {
    let mut out = Vec::with_capacity(count);
    let mut order = epoch_order(n, seed, state.epoch, shuffle);
    while out.len() < count && n > 0 {
        if state.position >= n {
            state.epoch += 1;
            state.position = 0;
            order = epoch_order(n, seed, state.epoch, shuffle);
        }
        out.push(order[state.position]);
        state.position += 1;
    }
    out
}

/// One prompt ready for generation.
#[derive(Debug, Clone)]
struct Prompt {
    item: PromptItem,
    ids: Vec<u32>,
}

/// A seed for one purpose at one step.
fn step_seed(seed: u64, step: u64, purpose: u64) -> u64 {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (step << 8) ^ purpose);
    rng.random()
}

fn compute_dtype(d: Dtype) -> DType {
    match d {
        Dtype::F32 => DType::F32,
        Dtype::Bf16 => DType::BF16,
        Dtype::F64 => DType::F64,
    }
}

/// The online trainer.
pub struct Trainer {
    cfg: OnlineConfig,
    out: PathBuf,
    /// The initial model's directory: the tokenizer files of every saved model come from it.
    initial: PathBuf,
    chat: ChatTokenizer,
    train: Vec<Prompt>,
    val: Vec<Prompt>,
    stop_ids: Vec<u32>,
    policy: Qwen3,
    opt: AdamW,
    lr: LrSchedule,
    /// Frozen initial model (trust region) or the EMA teacher.
    teacher: Option<Qwen3>,
    teacher_decoder: Option<Decoder>,
    rewards: RewardDispatch,
    state: TrainerState,
    run: RunDir,
}

impl Trainer {
    /// Prepares a run: run directory, tokenizer and prompts, the policy (fresh or from the latest
    /// checkpoint), the optimizer and the teacher.
    pub fn new(opts: &RunOptions) -> Result<Self> {
        let cfg = opts.config.clone();
        let out = opts.out.clone();
        fs::create_dir_all(out.join("results"))
            .with_context(|| format!("cannot create run directory {}", out.display()))?;
        let dtype = compute_dtype(cfg.model.dtype);
        let device = cfg.device()?;
        let initial = match &cfg.model.path {
            Some(p) => p.clone(),
            None => {
                let dir = out.join("initial");
                if !dir.join("model.safetensors").is_file() {
                    make_toy_model(&cfg, &dir)?;
                }
                dir
            }
        };
        // A best-model candidate newer than the checkpoint being resumed from is stale.
        let cand = out.join(".best-candidate");
        if cand.exists() {
            fs::remove_dir_all(&cand)?;
        }
        let chat = ChatTokenizer::from_dir(&initial)?;
        let (train, val) = load_prompts(&cfg, &chat)?;
        if train.is_empty() {
            bail!("no training prompt is left after filtering over-long prompts");
        }
        let stop_ids: Vec<u32> = [toy::IM_END, toy::ENDOFTEXT]
            .iter()
            .filter_map(|t| chat.tokenizer.token_to_id(t))
            .collect();
        if stop_ids.is_empty() {
            bail!("the tokenizer has neither <|im_end|> nor <|endoftext|>: no stop token");
        }
        let resume = if opts.resume {
            latest_checkpoint(&out)?
        } else {
            None
        };
        if !opts.resume
            && out
                .join("checkpoints")
                .join("latest_checkpointed_iteration.txt")
                .exists()
        {
            bail!(
                "{} already holds a run; pass --resume to continue it or choose another directory",
                out.display()
            );
        }
        let (policy, state, opt_path) = match &resume {
            Some((step, dir)) => {
                let text = fs::read_to_string(dir.join(TRAINER_STATE))?;
                let state: TrainerState = serde_json::from_str(&text)
                    .with_context(|| format!("{}", dir.join(TRAINER_STATE).display()))?;
                if state.global_step != *step {
                    bail!(
                        "{}: trainer state is for step {}",
                        dir.display(),
                        state.global_step
                    );
                }
                (
                    Qwen3::load(dir, dtype, &device)?,
                    state,
                    Some(dir.join(OPTIMIZER_STATE)),
                )
            }
            None => (
                Qwen3::load(&initial, dtype, &device)?,
                TrainerState {
                    global_step: 0,
                    sampler: SamplerState::default(),
                    optimizer_steps: 0,
                    skipped_updates: 0,
                    reward_errors: 0,
                    reward_timeouts: 0,
                    validations: Vec::new(),
                    best: None,
                },
                None,
            ),
        };
        let o = &cfg.optim;
        let adamw = AdamWConfig {
            beta1: o.betas[0],
            beta2: o.betas[1],
            eps: o.eps,
            weight_decay: o.weight_decay,
            max_grad_norm: Some(o.grad_clip),
        };
        let opt = match opt_path {
            Some(p) => AdamW::load(&p, &policy)?,
            None => AdamW::new(&policy, adamw),
        };
        // The schedule advances once per RL step (after its mini-batches), as verl's actor does.
        let total = cfg.trainer.total_training_steps;
        let lr = match o.lr_schedule {
            LrScheduleKind::Constant => LrSchedule::Constant { lr: o.lr },
            LrScheduleKind::Warmup => LrSchedule::Warmup {
                lr: o.lr,
                warmup_steps: o.lr_warmup_steps,
            },
            LrScheduleKind::Cosine => LrSchedule::Cosine {
                lr: o.lr,
                warmup_steps: o.lr_warmup_steps,
                total_steps: total,
                min_lr_ratio: o.min_lr_ratio,
            },
        };
        let teacher = if cfg.uses_teacher() {
            let dir = match (&resume, cfg.self_distillation.teacher_regularization) {
                (Some((_, d)), TeacherRegularization::Ema) => d.join(EMA_TEACHER),
                _ => initial.clone(),
            };
            Some(Qwen3::load(&dir, dtype, &device)?)
        } else {
            None
        };
        let teacher_decoder = match (&teacher, cfg.self_distillation.teacher_regularization) {
            (Some(t), TeacherRegularization::TrustRegion) => Some(Decoder::new(t)?),
            _ => None,
        };
        let mut rewards = RewardDispatch::default()
            .with_rules_str(&cfg.reward.rules)
            .map_err(anyhow::Error::msg)
            .context("[reward] rules")?;
        rewards.limits.time = std::time::Duration::from_secs_f64(cfg.reward.timeout_s);
        let run = RunDir::open(&out, state.global_step)?;
        write_atomic(&out.join("config.toml"), cfg.to_toml()?.as_bytes())?;
        // The table records where each value came from at the start of the run; a resume keeps it.
        let hp = out.join("results/hyperparameters.csv");
        if resume.is_none() || !hp.is_file() {
            write_hyperparameters(&cfg, &opts.provenance, &hp)?;
        }
        let t = Self {
            cfg,
            out,
            initial,
            chat,
            train,
            val,
            stop_ids,
            policy,
            opt,
            lr,
            teacher,
            teacher_decoder,
            rewards,
            state,
            run,
        };
        t.log(&format!(
            "{} at step {}: {} training and {} validation prompts",
            if resume.is_some() {
                "resumed"
            } else {
                "started"
            },
            t.state.global_step,
            t.train.len(),
            t.val.len()
        ))?;
        Ok(t)
    }

    /// The trainer state.
    pub fn state(&self) -> &TrainerState {
        &self.state
    }

    /// Saves `model` in the Hugging Face layout with the initial model's tokenizer files (a resumed
    /// model's own source directory may have been rotated away).
    fn save_model(&self, model: &Qwen3, dir: &Path) -> Result<()> {
        model.save_hf(dir)?;
        for f in TOKENIZER_FILES {
            let (src, dst) = (self.initial.join(f), dir.join(f));
            if src.is_file() && !dst.is_file() {
                fs::copy(&src, &dst).with_context(|| format!("copying {}", src.display()))?;
            }
        }
        Ok(())
    }

    /// Appends a line to `run.log`.
    fn log(&self, line: &str) -> Result<()> {
        let mut f = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.out.join("run.log"))?;
        writeln!(f, "{line}")?;
        Ok(())
    }

    fn sampling(&self, temperature: f64, top_p: f64, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature: temperature as f32,
            top_p: top_p as f32,
            top_k: self.cfg.rollout.top_k,
            max_new_tokens: self.cfg.rollout.max_response_length,
            stop_ids: self.stop_ids.clone(),
            seed,
        }
    }

    /// Validation mean@k: `val_n` samples per validation prompt; the mean reward over all of
    /// them, and per data source (failed rewards score 0).
    pub fn validate(&self, step: u64) -> Result<(f64, BTreeMap<String, f64>)> {
        let v = &self.cfg.validation;
        let params = self.sampling(
            v.val_temperature,
            v.val_top_p,
            step_seed(self.cfg.trainer.seed, step, 2),
        );
        let decoder = Decoder::new(&self.policy)?;
        let ids: Vec<Vec<u32>> = self.val.iter().map(|p| p.ids.clone()).collect();
        let gens = generate(
            &decoder,
            &ids,
            v.val_n,
            &params,
            self.cfg.rollout.max_batch,
            |_| {},
        )?;
        let mut sums: BTreeMap<String, (f64, usize)> = BTreeMap::new();
        for g in &gens {
            let item = &self.val[g.prompt].item;
            let text = self.chat.decode(&g.tokens, true)?;
            let gt = item.ground_truth.as_deref().unwrap_or("");
            let (r, _) = reward_of(&self.rewards.score(&item.data_source, gt, &text));
            let e = sums.entry(item.data_source.clone()).or_default();
            e.0 += r;
            e.1 += 1;
        }
        let total: f64 = sums.values().map(|v| v.0).sum();
        let per_source = sums
            .into_iter()
            .map(|(k, (s, n))| (k, s / n.max(1) as f64))
            .collect();
        Ok((total / gens.len().max(1) as f64, per_source))
    }

    /// Runs until `total_training_steps` (or `stop_after`); returns what happened.
    pub fn run(&mut self, stop_after: Option<u64>) -> Result<RunSummary> {
        let total = self.cfg.trainer.total_training_steps;
        let stop = stop_after.unwrap_or(total).min(total);
        if self.state.global_step == 0
            && self.cfg.validation.val_before_train
            && !self.val.is_empty()
        {
            let (m, _) = self.validate(0)?;
            self.record_validation(0, m)?;
        }
        let mut last_metrics = Metrics::new();
        while self.state.global_step < stop {
            let step = self.state.global_step + 1;
            let mut metrics = self.step(step).with_context(|| format!("step {step}"))?;
            let freq = self.cfg.validation.test_freq;
            if freq > 0 && !self.val.is_empty() && (step.is_multiple_of(freq) || step == total) {
                let (m, per_source) = self.validate(step)?;
                let k = self.cfg.validation.val_n;
                metrics.insert("val-core/mean@k".into(), m);
                for (source, v) in per_source {
                    metrics.insert(format!("val-core/{source}/reward/mean@{k}"), v);
                }
                self.record_validation(step, m)?;
            }
            self.run.log_step(step, &metrics)?;
            self.log(&format!(
                "step {step}: score {:.4} loss {:.5} grad_norm {:.4}{}",
                metrics
                    .get("critic/score/mean")
                    .copied()
                    .unwrap_or(f64::NAN),
                metrics.get("actor/pg_loss").copied().unwrap_or(f64::NAN),
                metrics.get("actor/grad_norm").copied().unwrap_or(f64::NAN),
                metrics
                    .get("val-core/mean@k")
                    .map(|m| format!(" val mean@{} {m:.4}", self.cfg.validation.val_n))
                    .unwrap_or_default()
            ))?;
            let sf = self.cfg.trainer.save_freq;
            if (sf > 0 && step.is_multiple_of(sf)) || step == stop {
                self.save_checkpoint()?;
            }
            last_metrics = metrics;
        }
        Ok(RunSummary {
            global_step: self.state.global_step,
            validations: self.state.validations.clone(),
            best: self.state.best,
            last_metrics,
        })
    }

    fn record_validation(&mut self, step: u64, mean: f64) -> Result<()> {
        self.state.validations.retain(|(s, _)| *s < step);
        self.state.validations.push((step, mean));
        if self.state.best.is_none_or(|(_, b)| mean > b) {
            self.state.best = Some((step, mean));
            // The best policy goes to the run root (HF layout) once its step is checkpointed.
            let tmp = self.out.join(".best-candidate");
            self.save_model(&self.policy, &tmp)?;
            write_atomic(&tmp.join("step.txt"), format!("{step}\n").as_bytes())?;
        }
        self.log(&format!(
            "validation at step {step}: mean@{} = {mean:.4}",
            self.cfg.validation.val_n
        ))?;
        Ok(())
    }

    /// Writes `results/validation_mean{k}.csv`, `results/training_scores.csv` and the plots.
    fn publish_results(&self) -> Result<()> {
        let k = self.cfg.validation.val_n;
        let mut csv = format!("step,val_mean{k},percent\n");
        for (s, m) in &self.state.validations {
            csv.push_str(&format!("{s},{m:.12},{:.2}%\n", m * 100.0));
        }
        let results = self.out.join("results");
        write_atomic(
            &results.join(format!("validation_mean{k}.csv")),
            csv.as_bytes(),
        )?;
        let scores = fs::read(self.out.join("training_scores.csv"))?;
        write_atomic(&results.join("training_scores.csv"), &scores)?;
        rlreplay_train::plot::training_score(&self.run.score_history()?, &results)?;
        Ok(())
    }

    fn save_checkpoint(&mut self) -> Result<()> {
        let step = self.state.global_step;
        let state = serde_json::to_string_pretty(&self.state)?;
        let ema = match self.cfg.self_distillation.teacher_regularization {
            TeacherRegularization::Ema => self.teacher.as_ref(),
            TeacherRegularization::TrustRegion => None,
        };
        let dir = self.run.save_checkpoint(step, self.cfg.trainer.keep, |d| {
            self.save_model(&self.policy, d)?;
            self.opt.save(d.join(OPTIMIZER_STATE))?;
            if let Some(t) = ema {
                self.save_model(t, &d.join(EMA_TEACHER))?;
            }
            write_atomic(&d.join(TRAINER_STATE), state.as_bytes())
        })?;
        self.save_model(&self.policy, &self.out.join("checkpoints").join("last"))?;
        // Promote the best candidate once a checkpoint at or after its step exists.
        let cand = self.out.join(".best-candidate");
        if cand.join("step.txt").is_file() {
            for f in HF_FILES {
                let src = cand.join(f);
                if src.is_file() {
                    let dst = self.out.join(f);
                    fs::copy(&src, dst.with_extension("tmp-best"))?;
                    fs::rename(dst.with_extension("tmp-best"), &dst)?;
                }
            }
            if let Some((s, m)) = self.state.best {
                write_atomic(
                    &self.out.join("best_step.txt"),
                    format!("{s} {m:.12}\n").as_bytes(),
                )?;
            }
            fs::remove_dir_all(&cand)?;
        }
        self.publish_results()?;
        self.log(&format!("checkpoint {}", dir.display()))?;
        Ok(())
    }

    /// One RL step: returns its metrics.
    pub fn step(&mut self, step: u64) -> Result<Metrics> {
        let started = Instant::now();
        let cfg = self.cfg.clone();
        let mut metrics = Metrics::new();
        let mut sampler = self.state.sampler;
        let picks = draw_prompts(
            &mut sampler,
            self.train.len(),
            cfg.batch.train_batch_size,
            cfg.trainer.seed,
            cfg.data.shuffle,
        );
        // Generate.
        let r = &cfg.rollout;
        let params = self.sampling(r.temperature, r.top_p, step_seed(cfg.trainer.seed, step, 1));
        let decoder = Decoder::new(&self.policy)?;
        let ids: Vec<Vec<u32>> = picks.iter().map(|&i| self.train[i].ids.clone()).collect();
        let t_gen = Instant::now();
        let gens: Vec<Generation> = generate(&decoder, &ids, r.n, &params, r.max_batch, |_| {})?;
        drop(decoder);
        metrics.insert("timing_s/gen".into(), t_gen.elapsed().as_secs_f64());
        // Score.
        let mut batch = RolloutBatch::empty(step as i64);
        let mut texts = Vec::with_capacity(gens.len());
        let mut feedback = Vec::with_capacity(gens.len());
        let (mut errors, mut timeouts) = (0u64, 0u64);
        for g in &gens {
            let item = &self.train[picks[g.prompt]].item;
            let text = self.chat.decode(&g.tokens, true)?;
            let gt = item.ground_truth.as_deref().unwrap_or("");
            let (reward, failure) = reward_of(&self.rewards.score(&item.data_source, gt, &text));
            errors += u64::from(failure == Some(RewardFailure::Error));
            timeouts += u64::from(failure == Some(RewardFailure::Timeout));
            feedback.push(math_feedback(
                reward >= cfg.self_distillation.context.success_reward_threshold,
                text.contains("\\boxed{"),
                g.truncated,
                gt,
                cfg.self_distillation.correctness_feedback,
            ));
            batch.push_row(
                &format!("{step}-{}", g.prompt),
                &ids[g.prompt],
                &g.tokens,
                &g.logprobs,
                reward as f32,
                Some(&item.data_source),
                item.ground_truth.as_deref(),
                Some(r.temperature as f32),
                Some(r.top_p as f32),
            );
            texts.push(text);
        }
        self.state.reward_errors += errors;
        self.state.reward_timeouts += timeouts;
        metrics.insert("reward/errors".into(), errors as f64);
        metrics.insert("reward/timeouts".into(), timeouts as f64);
        let truncated = gens.iter().filter(|g| g.truncated).count();
        metrics.insert(
            "response_length/clip_ratio".into(),
            truncated as f64 / gens.len().max(1) as f64,
        );
        write_shard(&self.out.join("rollouts"), &batch).context("writing the step's rollouts")?;

        // Teacher contexts.
        let teacher_prompts = if cfg.uses_teacher() {
            let rows: Vec<ContextRow<'_>> = gens
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    let item = &self.train[picks[g.prompt]].item;
                    ContextRow {
                        uid: &batch.uids[i],
                        messages: &item.messages,
                        response_text: &texts[i],
                        score: f64::from(batch.scores[i]),
                        feedback: Some(feedback[i].as_str()),
                        ground_truth: item.ground_truth.as_deref(),
                    }
                })
                .collect();
            // The teacher's chat template follows the data's thinking switch unless set apart.
            let mut sd_cfg = cfg.self_distillation.context.clone();
            sd_cfg.enable_thinking = sd_cfg.enable_thinking.or(cfg.data.enable_thinking);
            let sd = &sd_cfg;
            let contexts = build_contexts(&rows, sd)?;
            metrics.extend(context_metrics(&contexts));
            let mut dropped = 0usize;
            let mut prompts: Vec<Vec<u32>> = Vec::with_capacity(contexts.len());
            let mut cut = 0usize;
            for c in &contexts {
                if !c.active() {
                    prompts.push(Vec::new());
                    continue;
                }
                match encode_teacher_prompt(c, sd, &self.chat) {
                    Ok(p) => {
                        cut += usize::from(p.truncated);
                        prompts.push(p.ids);
                    }
                    Err(_) => {
                        dropped += 1;
                        prompts.push(Vec::new());
                    }
                }
            }
            metrics.insert(
                "self_distillation/teacher_prompt_truncated".into(),
                cut as f64,
            );
            metrics.insert(
                "self_distillation/teacher_prompt_dropped".into(),
                dropped as f64,
            );
            Some((contexts, prompts))
        } else {
            None
        };

        let applied_before = self.state.optimizer_steps;
        let update = self.update(
            &batch,
            teacher_prompts
                .as_ref()
                .map(|(c, p)| (c.as_slice(), p.as_slice())),
            step,
        )?;
        metrics.extend(update);
        // The EMA teacher follows the student after a step that applied at least one update.
        if let (Some(t), TeacherRegularization::Ema) =
            (&self.teacher, cfg.self_distillation.teacher_regularization)
        {
            if self.state.optimizer_steps > applied_before {
                ema_update(t, &self.policy, cfg.self_distillation.teacher_update_rate)?;
            }
        }
        self.state.sampler = sampler;
        self.state.global_step = step;
        let n = batch.len();
        let resp: Vec<f64> = (0..n).map(|i| batch.response(i).len() as f64).collect();
        stats(&mut metrics, "response_length", &resp);
        let scores: Vec<f64> = batch.scores.iter().map(|&s| f64::from(s)).collect();
        stats(&mut metrics, "critic/score", &scores);
        let tokens = (batch.prompt_tokens.len() + batch.response_tokens.len()) as f64;
        let secs = started.elapsed().as_secs_f64();
        metrics.insert("perf/total_num_tokens".into(), tokens);
        metrics.insert("perf/time_per_step".into(), secs);
        metrics.insert("perf/throughput".into(), tokens / secs.max(1e-9));
        metrics.insert("train/epoch".into(), sampler.epoch as f64);
        metrics.insert(
            "train/skipped_updates_total".into(),
            self.state.skipped_updates as f64,
        );
        metrics.insert(
            "reward/errors_total".into(),
            self.state.reward_errors as f64,
        );
        metrics.insert(
            "reward/timeouts_total".into(),
            self.state.reward_timeouts as f64,
        );
        Ok(metrics)
    }

    /// Advantages, rollout correction, and the mini-batch updates of one step.
    fn update(
        &mut self,
        batch: &RolloutBatch,
        teacher: Option<(&[TeacherContext], &[Vec<u32>])>,
        step: u64,
    ) -> Result<Metrics> {
        let cfg = &self.cfg;
        let mut algo: AlgoConfig = cfg.algorithm.clone();
        algo.global_step = Some(step);
        let tau = cfg.rollout.temperature;
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
        let mb_groups = cfg.batch.ppo_mini_batch_size.unwrap_or(groups.len()).max(1);
        let minibatches: Vec<std::ops::Range<usize>> = groups
            .chunks(mb_groups)
            .map(|c| c[0].start..c[c.len() - 1].end)
            .collect();
        let updates = minibatches.len() * cfg.batch.ppo_epochs as usize;
        let budget = cfg.batch.max_tokens_per_micro_batch;
        let logprobs = |model: &Qwen3, p: &[SeqPair<'_>]| -> Result<Vec<f64>> {
            let mut out = Vec::new();
            for c in micro_batches(p, budget) {
                out.extend(
                    model
                        .logprobs(&p[c], tau, false)?
                        .logprobs
                        .into_iter()
                        .flatten(),
                );
            }
            Ok(out)
        };
        let mut metrics = Metrics::new();
        let rs = !algo.rejection_options()?.is_empty();
        let old: Option<Vec<f64>> = if algo.rollout_is.is_some() || rs || updates > 1 {
            Some(logprobs(&self.policy, &pairs)?)
        } else {
            None
        };
        let correction = match &old {
            Some(o) => Some(rollout_correction(&algo, offsets, o, &rollout, None)?),
            None => None,
        };
        if let Some(c) = &correction {
            metrics.extend(c.metrics.clone());
        }
        let mask: Vec<bool> = correction
            .as_ref()
            .map_or_else(|| vec![true; rollout.len()], |c| c.mask.clone());
        let scores: Vec<f64> = batch.scores.iter().map(|&s| f64::from(s)).collect();
        let adv = compute_advantages(&algo, &batch.uids, &scores, offsets, Some(&mask))?;
        metrics.extend(adv.metrics.clone());
        let sd_active: Option<Vec<bool>> = teacher.map(|(c, p)| {
            c.iter()
                .zip(p)
                .map(|(c, p)| c.active() && !p.is_empty())
                .collect()
        });
        let correct: Vec<bool> = scores
            .iter()
            .map(|&s| s >= cfg.self_distillation.context.success_reward_threshold)
            .collect();
        let lr = self.lr.lr_at(step - 1);
        let mut mb_metrics: Vec<Metrics> = Vec::new();
        let mut grad_norms = Vec::new();
        let mut skipped = 0u64;
        for _epoch in 0..cfg.batch.ppo_epochs {
            for rows in &minibatches {
                let tok = offsets[rows.start]..offsets[rows.end];
                let off = &offsets[rows.start..=rows.end];
                let norm = Normalizer::new(&algo, off, Some(&mask[tok]))?;
                let mut acc = MetricAccumulator::new();
                let mut finite = true;
                for lm in norm.micro_batches() {
                    let r = rows.start + lm.start..rows.start + lm.end;
                    let t = offsets[r.start]..offsets[r.end];
                    let lp_now = logprobs(&self.policy, &pairs[r.clone()])?;
                    let teacher_lp: Option<Vec<f64>> = match teacher {
                        Some((_, prompts)) => {
                            let cur = match cfg.self_distillation.teacher_regularization {
                                TeacherRegularization::TrustRegion => {
                                    Some(Decoder::new(&self.policy)?)
                                }
                                TeacherRegularization::Ema => None,
                            };
                            let ema = match (&self.teacher_decoder, &self.teacher) {
                                (Some(_), _) => None,
                                (None, Some(t)) => Some(Decoder::new(t)?),
                                (None, None) => bail!("self-distillation without a teacher model"),
                            };
                            let tdec = self
                                .teacher_decoder
                                .as_ref()
                                .or(ema.as_ref())
                                .expect("a teacher decoder");
                            let ps: Vec<&[u32]> =
                                prompts[r.clone()].iter().map(Vec::as_slice).collect();
                            let ys: Vec<&[u32]> = (r.clone()).map(|i| batch.response(i)).collect();
                            let lp = teacher_logprobs(
                                tdec,
                                cur.as_ref(),
                                cfg.self_distillation.teacher_update_rate,
                                tau,
                                &ps,
                                &ys,
                            )?;
                            Some(lp.into_iter().flatten().collect())
                        }
                        None => None,
                    };
                    let old_t = old.as_ref().map(|o| o[t.clone()].to_vec());
                    let isw = correction
                        .as_ref()
                        .and_then(|c| c.is_weights.as_ref())
                        .map(|w| w[t.clone()].to_vec());
                    let out = policy_loss(
                        &algo,
                        &norm,
                        &MicroBatch {
                            first_row: lm.start,
                            offsets: &offsets[r.start..=r.end],
                            logprobs: &lp_now,
                            old_logprobs: old_t.as_deref(),
                            rollout_logprobs: Some(&rollout[t.clone()]),
                            token_advantages: &adv.tokens[t.clone()],
                            is_weights: isw.as_deref(),
                            mask: Some(&mask[t.clone()]),
                            teacher_logprobs: teacher_lp.as_deref(),
                            sd_active: sd_active.as_ref().map(|a| &a[r.clone()]),
                            correct: Some(&correct[r.clone()]),
                            ref_logprobs: None,
                        },
                    )?;
                    if !out.loss.is_finite() || out.grad_logprobs.iter().any(|g| !g.is_finite()) {
                        finite = false;
                        break;
                    }
                    for c in micro_batches(&pairs[r.clone()], budget) {
                        let g0 = offsets[r.start + c.start] - t.start;
                        let g1 = offsets[r.start + c.end] - t.start;
                        self.policy.forward_backward(
                            &pairs[r.start + c.start..r.start + c.end],
                            &out.grad_logprobs[g0..g1],
                            tau,
                        )?;
                    }
                    acc.add(&out.metrics, out.valid_tokens as f64);
                }
                if finite {
                    let report = self.opt.step(&mut self.policy, lr)?;
                    grad_norms.push(report.grad_norm);
                    if report.skipped {
                        skipped += 1;
                    } else {
                        self.state.optimizer_steps += 1;
                    }
                    metrics.insert("actor/lr".into(), lr);
                    mb_metrics.push(acc.finish());
                } else {
                    self.policy.zero_grad();
                    skipped += 1;
                }
            }
        }
        self.state.skipped_updates += skipped;
        let mut sums: BTreeMap<String, (f64, usize)> = BTreeMap::new();
        for m in &mb_metrics {
            for (key, v) in m {
                let e = sums.entry(key.clone()).or_default();
                e.0 += v;
                e.1 += 1;
            }
        }
        metrics.extend(sums.into_iter().map(|(key, (s, c))| (key, s / c as f64)));
        if !grad_norms.is_empty() {
            metrics.insert(
                "actor/grad_norm".into(),
                grad_norms.iter().sum::<f64>() / grad_norms.len() as f64,
            );
        }
        metrics.insert("train/skipped_updates".into(), skipped as f64);
        // The column name of the run directory's training_scores.csv.
        metrics.insert("train/skipped_steps".into(), skipped as f64);
        Ok(metrics)
    }
}

/// Why a reward could not be computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RewardFailure {
    /// The reward function failed (unparsable reference, non-finite value).
    Error,
    /// The reward function ran out of time.
    Timeout,
}

/// The reward that enters training: the outcome's reward, or 0 with the reason when it errored,
/// timed out or is not finite.
pub fn reward_of(outcome: &RewardOutcome) -> (f64, Option<RewardFailure>) {
    if outcome.timed_out {
        (0.0, Some(RewardFailure::Timeout))
    } else if outcome.error.is_some() || !outcome.reward.is_finite() {
        (0.0, Some(RewardFailure::Error))
    } else {
        (outcome.reward, None)
    }
}

/// `mean`, `max`, `min` of `xs` under `prefix/`.
fn stats(m: &mut Metrics, prefix: &str, xs: &[f64]) {
    if xs.is_empty() {
        return;
    }
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    m.insert(format!("{prefix}/mean"), mean);
    m.insert(
        format!("{prefix}/max"),
        xs.iter().copied().fold(f64::MIN, f64::max),
    );
    m.insert(
        format!("{prefix}/min"),
        xs.iter().copied().fold(f64::MAX, f64::min),
    );
}

/// The toy task's prompts as prompt items.
fn toy_items(problems: &[toy::Problem]) -> Vec<PromptItem> {
    problems
        .iter()
        .enumerate()
        .map(|(i, p)| PromptItem {
            index: i,
            data_source: "toy".into(),
            messages: vec![Message::user(p.prompt.clone())],
            ground_truth: Some(p.answer.clone()),
        })
        .collect()
}

/// Reads and encodes the training and validation prompts; over-long prompts are dropped (or an
/// error naming the prompt when `filter_overlong_prompts` is off).
fn load_prompts(cfg: &OnlineConfig, chat: &ChatTokenizer) -> Result<(Vec<Prompt>, Vec<Prompt>)> {
    let (mut train, val) = match cfg.data.task.as_str() {
        "toy" => {
            let (t, v) = cfg.toy.split()?;
            (toy_items(&t), toy_items(&v))
        }
        _ => {
            let train = read_prompts(cfg.data.train_files.as_deref().expect("validated"))?;
            let val = match &cfg.data.val_files {
                Some(p) => read_prompts(p)?,
                None => Vec::new(),
            };
            (train, val)
        }
    };
    if cfg.data.train_max_samples > 0 {
        train.truncate(cfg.data.train_max_samples);
    }
    let options = ChatOptions {
        add_generation_prompt: true,
        enable_thinking: cfg.data.enable_thinking,
    };
    let encode = |items: Vec<PromptItem>, what: &str| -> Result<Vec<Prompt>> {
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let ids = chat.encode(&item.messages, options)?;
            if ids.len() > cfg.data.max_prompt_length {
                if cfg.data.filter_overlong_prompts {
                    continue;
                }
                bail!(
                    "{what} prompt {} has {} tokens, over max_prompt_length = {}",
                    item.index,
                    ids.len(),
                    cfg.data.max_prompt_length
                );
            }
            out.push(Prompt { item, ids });
        }
        Ok(out)
    };
    Ok((encode(train, "training")?, encode(val, "validation")?))
}

/// Creates the toy model in `dir`: tokenizer files, a random tiny Qwen3, and the optional
/// supervised warm-up on `\boxed{answer}` targets (correct for `warmup_correct_fraction` of them,
/// a random answer of the task otherwise).
fn make_toy_model(cfg: &OnlineConfig, dir: &Path) -> Result<()> {
    let tmp = dir.with_extension("tmp");
    let _ = fs::remove_dir_all(&tmp);
    toy::write_tokenizer(&tmp)?;
    let chat = ChatTokenizer::from_dir(&tmp)?;
    let mut model = Qwen3::new_random(
        cfg.model.toy.config(),
        cfg.model.init_seed,
        compute_dtype(cfg.model.dtype),
        &Device::Cpu,
    )?;
    if cfg.model.warmup_steps > 0 {
        let (train, _) = cfg.toy.split()?;
        let mut answers: Vec<String> = cfg.toy.all()?.into_iter().map(|p| p.answer).collect();
        answers.sort();
        answers.dedup();
        let end = toy::token_id(toy::IM_END).expect("toy vocabulary has <|im_end|>");
        let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.model.init_seed ^ 0xF0F0);
        let mut opt = AdamW::new(&model, AdamWConfig::default());
        for _ in 0..cfg.model.warmup_steps {
            let mut data = Vec::new();
            for p in &train {
                let prompt =
                    chat.encode(&[Message::user(p.prompt.clone())], ChatOptions::default())?;
                let target = if rng.random_bool(cfg.model.warmup_correct_fraction.clamp(0.0, 1.0)) {
                    format!("\\boxed{{{}}}", p.answer)
                } else {
                    toy::format_only_response(&mut rng, &answers)
                };
                let mut resp = chat.encode_text(&target)?;
                resp.push(end);
                data.push((prompt, resp));
            }
            let pairs: Vec<SeqPair<'_>> = data.iter().map(|(p, r)| SeqPair::new(p, r)).collect();
            let n: usize = data.iter().map(|(_, r)| r.len()).sum();
            let grad = vec![-1.0 / n as f64; n];
            model.forward_backward(&pairs, &grad, 1.0)?;
            opt.step(&mut model, cfg.model.warmup_lr)?;
        }
    }
    let staged = tmp.with_extension("model");
    model.save_hf(&staged)?;
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        fs::copy(tmp.join(f), staged.join(f))?;
    }
    fs::remove_dir_all(&tmp)?;
    if dir.exists() {
        fs::remove_dir_all(dir)?;
    }
    fs::rename(&staged, dir)?;
    Ok(())
}

/// Writes `hyperparameters.csv` (`Section,Parameter,Value,Source`) from the resolved
/// configuration; `Source` is `override`, `config` (set in the file) or `default`.
fn write_hyperparameters(cfg: &OnlineConfig, prov: &Provenance, path: &Path) -> Result<()> {
    let resolved: toml::Table = toml::from_str(&cfg.to_toml()?)?;
    let file: toml::Table = match &prov.file {
        Some((_, text)) => toml::from_str(text).unwrap_or_default(),
        None => toml::Table::new(),
    };
    let overridden: Vec<&str> = prov
        .overrides
        .iter()
        .filter_map(|o| o.split_once('=').map(|(k, _)| k.trim()))
        .collect();
    let mut rows = vec!["Section,Parameter,Value,Source".to_string()];
    let quote = |s: &str| {
        if s.contains([',', '"', '\n']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s.to_string()
        }
    };
    fn flatten(prefix: &str, t: &toml::Table, out: &mut Vec<(String, String)>) {
        for (k, v) in t {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(inner) => flatten(&key, inner, out),
                toml::Value::String(s) => out.push((key, s.clone())),
                other => out.push((key, other.to_string())),
            }
        }
    }
    for (section, v) in &resolved {
        let mut kv = Vec::new();
        match v {
            toml::Value::Table(t) => flatten("", t, &mut kv),
            other => kv.push((String::new(), other.to_string())),
        }
        for (key, value) in kv {
            let full = format!("{section}.{key}");
            let in_file = {
                let mut cur = file.get(section.as_str());
                for part in key.split('.') {
                    cur = cur.and_then(|c| c.as_table()).and_then(|t| t.get(part));
                }
                cur.is_some()
            };
            let source = if overridden.contains(&full.as_str()) {
                "override"
            } else if in_file {
                "config"
            } else {
                "default"
            };
            rows.push(format!(
                "{},{},{},{source}",
                quote(section),
                quote(&key),
                quote(&value)
            ));
        }
    }
    rows.push(String::new());
    write_atomic(path, rows.join("\n").as_bytes())
}

/// Runs (or resumes) an online training run.
pub fn run(opts: &RunOptions) -> Result<RunSummary> {
    let threads = opts.config.trainer.threads;
    let go = || -> Result<RunSummary> {
        let mut t = Trainer::new(opts)?;
        t.run(opts.stop_after)
    };
    if threads > 0 {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .context("cannot start the worker threads")?;
        return pool.install(go);
    }
    go()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_rewards_score_zero_and_are_classified() {
        let ok = RewardOutcome {
            reward: 1.0,
            timed_out: false,
            error: None,
        };
        assert_eq!(reward_of(&ok), (1.0, None));
        let slow = RewardOutcome {
            timed_out: true,
            ..ok.clone()
        };
        assert_eq!(reward_of(&slow), (0.0, Some(RewardFailure::Timeout)));
        let bad = RewardOutcome {
            error: Some("no answer in the reference".into()),
            ..ok.clone()
        };
        assert_eq!(reward_of(&bad), (0.0, Some(RewardFailure::Error)));
        let nan = RewardOutcome {
            reward: f64::NAN,
            ..ok
        };
        assert_eq!(reward_of(&nan).1, Some(RewardFailure::Error));
        // A reference the verifier cannot parse is an error, not a crash.
        let d = RewardDispatch::default();
        assert_eq!(reward_of(&d.score("toy", "", "\\boxed{3}")).0, 0.0);
    }

    #[test]
    fn sampler_walks_epochs_deterministically() {
        let mut s = SamplerState::default();
        let a = draw_prompts(&mut s, 5, 3, 7, true);
        let b = draw_prompts(&mut s, 5, 3, 7, true);
        assert_eq!(
            s,
            SamplerState {
                epoch: 1,
                position: 1
            }
        );
        let mut first: Vec<usize> = a.iter().chain(&b[..2]).copied().collect();
        first.sort_unstable();
        assert_eq!(first, [0, 1, 2, 3, 4], "one epoch covers every prompt once");
        let mut again = SamplerState::default();
        assert_eq!(draw_prompts(&mut again, 5, 3, 7, true), a);
        let mut plain = SamplerState::default();
        assert_eq!(draw_prompts(&mut plain, 3, 4, 7, false), [0, 1, 2, 0]);
    }
}
