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
use rlreplay_algo::AlgoConfig;
use rlreplay_data::{write_shard, RolloutBatch};
use rlreplay_eval::dataset::{read_prompts, PromptItem};
use rlreplay_model::generate::Decoder;
use rlreplay_model::{AdamW, AdamWConfig, Device, LrSchedule, Model, SeqPair};
use rlreplay_reward::{RewardDispatch, RewardOutcome};
use rlreplay_sampling::chat::{ChatOptions, ChatTokenizer, Message};
use rlreplay_sampling::engine::{generate, Generation};
use rlreplay_sampling::sampling::SamplingParams;
use rlreplay_train::context::rollout_teacher_prompts;
use rlreplay_train::rundir::{
    check_resumed_config, latest_checkpoint, refuse_existing_run, write_atomic, Metrics, RunDir,
    TRAINER_STATE,
};
use rlreplay_train::teacher::{Teacher, TeacherRegularization, EMA_TEACHER};
use rlreplay_train::trainer::{with_threads, OPTIMIZER_STATE};
use rlreplay_train::update::{perf_metrics, stats, update, TeacherInputs, UpdateSettings};
use serde::{Deserialize, Serialize};

use crate::config::OnlineConfig;
use crate::toy;
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

/// The online trainer.
pub struct Trainer {
    cfg: OnlineConfig,
    out: PathBuf,
    chat: ChatTokenizer,
    train: Vec<Prompt>,
    val: Vec<Prompt>,
    stop_ids: Vec<u32>,
    policy: Model,
    opt: AdamW,
    lr: LrSchedule,
    /// Frozen initial model (trust region) or the EMA teacher.
    teacher: Option<Teacher>,
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
        if opts.resume {
            let comparable = |c: &OnlineConfig| {
                let mut c = c.clone();
                c.trainer.save_freq = 0;
                c.trainer.keep = 0;
                c.trainer.dir = None;
                c
            };
            let parse = |t: &str| OnlineConfig::parse(t, &[]);
            check_resumed_config(
                &out,
                &cfg,
                parse,
                comparable,
                "[trainer] save_freq, keep, dir",
            )?;
        } else {
            refuse_existing_run(&out)?;
        }
        fs::create_dir_all(out.join("results"))
            .with_context(|| format!("cannot create run directory {}", out.display()))?;
        let dtype = cfg.model.dtype.candle();
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
        let (mut policy, state, opt_path) = match &resume {
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
                let mut policy = Model::load(dir, dtype, &device)?;
                // Tokenizer files come from the initial model: checkpoint rotation removes the
                // checkpoint this model was loaded from.
                policy.set_source_dir(Some(initial.clone()));
                (policy, state, Some(dir.join(OPTIMIZER_STATE)))
            }
            None => (
                Model::load(&initial, dtype, &device)?,
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
        policy.set_activation_recompute(cfg.model.enable_gradient_checkpointing);
        let opt = match opt_path {
            Some(p) => AdamW::load(&p, &policy)?,
            None => AdamW::new(&policy, cfg.optim.adamw()),
        };
        // The schedule advances once per RL step (after its mini-batches), as verl's actor does.
        let lr = cfg.optim.lr_schedule(cfg.trainer.total_training_steps);
        let sd = &cfg.self_distillation;
        let teacher = if cfg.uses_teacher() {
            let dir = match (&resume, sd.teacher_regularization) {
                (Some((_, d)), TeacherRegularization::Ema) => d.join(EMA_TEACHER),
                _ => initial.clone(),
            };
            let mut model = Model::load(&dir, dtype, &device)?;
            model.set_source_dir(Some(initial.clone()));
            Some(Teacher::new(
                model,
                sd.teacher_regularization,
                sd.teacher_update_rate,
            )?)
        } else {
            None
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
            chat,
            train,
            val,
            stop_ids,
            policy,
            opt,
            lr,
            teacher,
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
            self.policy.save_hf(&tmp)?;
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
        let ema = self
            .teacher
            .as_ref()
            .filter(|t| t.regularization() == TeacherRegularization::Ema)
            .map(Teacher::model);
        let dir = self.run.save_checkpoint(step, self.cfg.trainer.keep, |d| {
            self.policy.save_hf(d)?;
            self.opt.save(d.join(OPTIMIZER_STATE))?;
            if let Some(t) = ema {
                t.save_hf(d.join(EMA_TEACHER))?;
            }
            write_atomic(&d.join(TRAINER_STATE), state.as_bytes())
        })?;
        self.policy
            .save_hf(self.out.join("checkpoints").join("last"))?;
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
        let (mut errors, mut timeouts) = (0u64, 0u64);
        for g in &gens {
            let item = &self.train[picks[g.prompt]].item;
            let text = self.chat.decode(&g.tokens, true)?;
            let gt = item.ground_truth.as_deref().unwrap_or("");
            let (reward, failure) = reward_of(&self.rewards.score(&item.data_source, gt, &text));
            errors += u64::from(failure == Some(RewardFailure::Error));
            timeouts += u64::from(failure == Some(RewardFailure::Timeout));
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
        let prompts = if cfg.uses_teacher() {
            let messages: Vec<&[Message]> = gens
                .iter()
                .map(|g| self.train[picks[g.prompt]].item.messages.as_slice())
                .collect();
            let truncated: Vec<bool> = gens.iter().map(|g| g.truncated).collect();
            // The teacher's chat template follows the data's thinking switch unless set apart.
            let mut sd = cfg.self_distillation.context.clone();
            sd.enable_thinking = sd.enable_thinking.or(cfg.data.enable_thinking);
            let (prompts, m) = rollout_teacher_prompts(
                &batch,
                &messages,
                &texts,
                &truncated,
                cfg.self_distillation.correctness_feedback,
                &sd,
                &self.chat,
            )?;
            metrics.extend(m);
            Some(prompts)
        } else {
            None
        };

        let mut algo: AlgoConfig = cfg.algorithm.clone();
        algo.global_step = Some(step);
        let settings = UpdateSettings {
            temperature: cfg.rollout.temperature,
            ppo_mini_batch_size: cfg.batch.ppo_mini_batch_size,
            ppo_epochs: cfg.batch.ppo_epochs,
            max_tokens_per_micro_batch: cfg.batch.max_tokens_per_micro_batch,
            lr: self.lr.lr_at(step - 1),
        };
        let teacher = match (&self.teacher, &prompts) {
            (Some(t), Some(p)) => Some(TeacherInputs {
                teacher: t,
                prompts: p,
                success_threshold: cfg.algorithm.success_reward_threshold,
            }),
            _ => None,
        };
        let out = update(
            &mut self.policy,
            &mut self.opt,
            &algo,
            &batch,
            &settings,
            teacher.as_ref(),
        )?;
        self.state.optimizer_steps += out.applied;
        self.state.skipped_updates += out.skipped;
        metrics.extend(out.metrics);
        metrics.insert("train/skipped_updates".into(), out.skipped as f64);
        // The column name of the run directory's training_scores.csv.
        metrics.insert("train/skipped_steps".into(), out.skipped as f64);
        self.state.sampler = sampler;
        self.state.global_step = step;
        let n = batch.len();
        let resp: Vec<f64> = (0..n).map(|i| batch.response(i).len() as f64).collect();
        stats(&mut metrics, "response_length", &resp);
        let scores: Vec<f64> = batch.scores.iter().map(|&s| f64::from(s)).collect();
        stats(&mut metrics, "critic/score", &scores);
        let tokens = (batch.prompt_tokens.len() + batch.response_tokens.len()) as u64;
        let secs = started.elapsed().as_secs_f64();
        perf_metrics(&mut metrics, tokens, secs, self.state.skipped_updates);
        metrics.insert("train/epoch".into(), sampler.epoch as f64);
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
    let mut model = Model::new_random(
        cfg.model.toy.config(),
        cfg.model.init_seed,
        cfg.model.dtype.candle(),
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
    with_threads(opts.config.trainer.threads, || {
        let mut t = Trainer::new(opts)?;
        t.run(opts.stop_after)
    })
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
