//! The replay loop: one trainer step per planned step, checkpoints, resume.
//!
//! One trainer step: read the source shard -> select rows per the schedule -> (`rlsd` / `rlrt`)
//! decode the rows and build the teacher prompts -> the update of [`crate::update`] -> metrics.
//! Every random choice derives from the seeds and the trainer step, so a run continued from a
//! checkpoint is bit-identical to an uninterrupted one.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, ensure, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use rand::seq::SliceRandom;
use rlreplay_algo::AlgoConfig;
use rlreplay_data::{resolve_hub_path, Dataset, ReadOptions, RolloutBatch};
use rlreplay_model::{parse_device, AdamW, LrSchedule, Model};
use rlreplay_sampling::chat::ChatTokenizer;
use serde::{Deserialize, Serialize};

use crate::config::{parse_steps, uses_teacher, ReplayConfig};
use crate::context::{check_columns, logged_teacher_prompts};
use crate::rundir::{
    check_resumed_config, latest_checkpoint, refuse_existing_run, Metrics, RunDir, TRAINER_STATE,
};
use crate::schedule::{plan, select_rows, step_rng, PlannedStep};
use crate::teacher::{Teacher, TeacherRegularization, EMA_TEACHER};
use crate::update::{perf_metrics, stats, update, TeacherInputs, UpdateSettings};

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

impl RunOptions {
    /// A fresh run of `config` into `out`: no resume, no early stop, no progress bar.
    pub fn new(config: ReplayConfig, out: &Path) -> Self {
        Self {
            config,
            out: out.to_path_buf(),
            resume: false,
            stop_after: None,
            progress: false,
        }
    }
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
    with_threads(opts.config.run.threads, || run_inner(opts))
}

/// Runs `f` on a pool of `threads` worker threads (0: the default pool over every core). The
/// process environment is left alone: every kernel runs inside the pool, whose size bounds the
/// parallelism whatever split a kernel chooses.
pub fn with_threads<T: Send>(threads: usize, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    if threads == 0 {
        return f();
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("cannot start the worker threads")?
        .install(f)
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
    model: Model,
    opt: AdamW,
    lr: LrSchedule,
    state: TrainerState,
    run: RunDir,
    /// Self-distillation (`rlsd` / `rlrt`): the teacher and the tokenizer that decodes the rows.
    sd: Option<(Teacher, ChatTokenizer)>,
}

/// The files of a Hugging Face model directory that loading needs.
fn model_file(name: &str) -> bool {
    name.ends_with(".safetensors")
        || (name.ends_with(".json") && !name.contains('/'))
        || name == "tokenizer.model"
}

/// How the shards are read: strict, with the configured EOS and (when on) the vocabulary check.
fn read_options(cfg: &ReplayConfig, model: &Model) -> ReadOptions {
    ReadOptions {
        lenient: false,
        eos: cfg.data.eos_token_id,
        vocab: cfg
            .data
            .vocab_check
            .then_some(model.config().vocab_size as u32),
    }
}

/// The shard of a planned step, for error messages.
fn source(dataset: &Dataset, ps: &PlannedStep) -> String {
    match dataset.shard(ps.source_step) {
        Some(p) => p.display().to_string(),
        None => format!("dataset step {}", ps.source_step),
    }
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
        let lr = cfg.optim.lr_schedule(plan.len() as u64);
        let resolved = cfg.to_toml()?;
        let config_path = out.join("config.toml");

        let resume_from = if opts.resume {
            let comparable = |c: &ReplayConfig| {
                let mut c = c.clone();
                c.checkpoint = Default::default();
                c.run.dir = None;
                c
            };
            let parse = |t: &str| ReplayConfig::parse(t, &[]);
            check_resumed_config(out, &cfg, parse, comparable, "[checkpoint]")?;
            latest_checkpoint(out)?
        } else {
            refuse_existing_run(out)?;
            None
        };

        let device = parse_device(&cfg.model.device).map_err(|e| anyhow!("[model] {e}"))?;
        let dtype = cfg.model.dtype.candle();
        let model_dir = match &cfg.model.path {
            Some(path) => Some(
                resolve_hub_path(&path.to_string_lossy(), &model_file)
                    .with_context(|| format!("[model] path = {}", path.display()))?,
            ),
            None => None,
        };
        let (mut model, opt, state) = match &resume_from {
            Some((step, dir)) => {
                let mut model = Model::load(dir, dtype, &device)
                    .with_context(|| format!("loading checkpoint {}", dir.display()))?;
                // Tokenizer files come from the run's model directory: checkpoint rotation
                // removes the checkpoint this model was loaded from.
                model.set_source_dir(model_dir.clone());
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
                let model = match (&model_dir, &cfg.model.random) {
                    (Some(dir), _) => Model::load(dir, dtype, &device)
                        .with_context(|| format!("[model] path = {}", dir.display()))?,
                    (None, Some(r)) => Model::new_random(r.to_config(), r.seed, dtype, &device)
                        .context("[model] random")?,
                    (None, None) => bail!("[model]: give `path` or `random`"),
                };
                let opt = AdamW::new(&model, cfg.optim.adamw());
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
        model.set_activation_recompute(cfg.model.enable_gradient_checkpointing);
        let sd = match &model_dir {
            Some(dir) if uses_teacher(&algo) => {
                for f in ["tokenizer.json", "tokenizer_config.json"] {
                    ensure!(
                        dir.join(f).is_file(),
                        "[algorithm] loss_mode = {:?}: the model directory has no {f} \
                         (the rows are decoded with it to build the teacher contexts): {}",
                        algo.loss_mode.name(),
                        dir.join(f).display()
                    );
                }
                let chat = ChatTokenizer::from_dir(dir)?;
                let sdc = &cfg.self_distillation;
                let teacher_dir = match &resume_from {
                    Some((_, ckpt)) if sdc.teacher_regularization == TeacherRegularization::Ema => {
                        ckpt.join(EMA_TEACHER)
                    }
                    _ => dir.clone(),
                };
                let mut teacher_model = Model::load(&teacher_dir, dtype, &device)
                    .with_context(|| format!("loading the teacher {}", teacher_dir.display()))?;
                teacher_model.set_source_dir(Some(dir.clone()));
                let teacher = Teacher::new(
                    teacher_model,
                    sdc.teacher_regularization,
                    sdc.teacher_update_rate,
                )?;
                Some((teacher, chat))
            }
            _ => None,
        };
        // Refuse at startup a dataset whose next step lacks a column the context mode needs.
        if let (Some(_), Some(ps)) = (&sd, plan.get(state.global_step as usize)) {
            let read = read_options(&cfg, &model);
            let (batch, _) = dataset.read_step(ps.source_step, &read)?;
            check_columns(&batch, &cfg.self_distillation, &source(&dataset, ps))?;
        }
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
            sd,
        })
    }

    fn save_checkpoint(&self) -> Result<PathBuf> {
        let state = serde_json::to_string_pretty(&self.state)?;
        self.run
            .save_checkpoint(self.state.global_step, self.cfg.checkpoint.keep, |dir| {
                self.model.save_hf(dir)?;
                self.opt.save(dir.join(OPTIMIZER_STATE))?;
                if let Some((t, _)) = &self.sd {
                    if t.regularization() == TeacherRegularization::Ema {
                        t.model().save_hf(dir.join(EMA_TEACHER))?;
                    }
                }
                std::fs::write(dir.join(TRAINER_STATE), state)?;
                Ok(())
            })
    }

    /// Reads and selects the rows of one planned step.
    fn load_batch(&self, ps: &PlannedStep, metrics: &mut Metrics) -> Result<RolloutBatch> {
        let (batch, _report) = self
            .dataset
            .read_step(ps.source_step, &read_options(&self.cfg, &self.model))?;
        let groups = batch.groups();
        let eos = self.cfg.data.eos_token_id;
        let truncated: Vec<bool> = (0..batch.len()).map(|i| batch.truncated(i, eos)).collect();
        let (mut rows, sel) = select_rows(
            &self.cfg.schedule,
            ps,
            &groups,
            &batch.scores,
            &truncated,
            self.algo.success_reward_threshold,
        );
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

    fn step(&mut self, ps: &PlannedStep) -> Result<Metrics> {
        let started = Instant::now();
        let mut metrics = Metrics::new();
        let batch = self.load_batch(ps, &mut metrics)?;
        let mut algo = self.algo.clone();
        algo.global_step = Some(ps.global_step);
        let n = batch.len();
        let offsets = &batch.response_offsets;
        let sd = &self.cfg.self_distillation;
        let prompts = match &self.sd {
            Some((_, chat)) => {
                let (p, m) = logged_teacher_prompts(
                    &batch,
                    sd,
                    chat,
                    self.cfg.data.eos_token_id,
                    &source(&self.dataset, ps),
                )?;
                metrics.extend(m);
                Some(p)
            }
            None => None,
        };
        let teacher = match (&self.sd, &prompts) {
            (Some((t, _)), Some(p)) => Some(TeacherInputs {
                teacher: t,
                prompts: p,
                success_threshold: self.algo.success_reward_threshold,
            }),
            _ => None,
        };
        let settings = UpdateSettings {
            temperature: self.cfg.rollout.temperature,
            ppo_mini_batch_size: self.cfg.batch.ppo_mini_batch_size,
            ppo_epochs: self.cfg.batch.ppo_epochs,
            max_tokens_per_micro_batch: self.cfg.batch.max_tokens_per_micro_batch,
            lr: self.lr.lr_at(ps.global_step - 1),
        };
        let out = update(
            &mut self.model,
            &mut self.opt,
            &algo,
            &batch,
            &settings,
            teacher.as_ref(),
        )?;
        let (current, skipped) = (&out.current, out.skipped);
        self.state.optimizer_steps += out.applied;
        self.state.skipped_updates += skipped;
        if current.iter().all(|x| x.is_finite()) {
            // Mean per-token log-prob of successful and of failed responses under the policy
            // being trained: the replay's learning signal at a glance.
            for (name, win) in [("success", true), ("failure", false)] {
                let (mut sum, mut count) = (0.0, 0usize);
                let threshold = self.algo.success_reward_threshold;
                for i in (0..n).filter(|&i| (f64::from(batch.scores[i]) >= threshold) == win) {
                    sum += current[offsets[i]..offsets[i + 1]].iter().sum::<f64>();
                    count += offsets[i + 1] - offsets[i];
                }
                if count > 0 {
                    metrics.insert(format!("replay/logprob_{name}"), sum / count as f64);
                }
            }
        }
        metrics.extend(out.metrics);
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
        perf_metrics(&mut metrics, tokens, secs, self.state.skipped_updates);
        metrics.insert("train/source_step".into(), ps.source_step as f64);
        metrics.insert("train/epoch".into(), f64::from(ps.epoch));
        metrics.insert("train/skipped_updates".into(), skipped as f64);
        metrics.insert(
            "train/optimizer_steps".into(),
            self.state.optimizer_steps as f64,
        );
        Ok(metrics)
    }
}
