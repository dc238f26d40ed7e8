//! The trainer: one loop for every rollout source.
//!
//! One trainer step: the source's rollouts ([`RolloutSource::next_step`]) -> (`batch.shuffle`)
//! the groups in a seeded order -> (`rlsd` / `rlrt`) the teacher contexts -> the update of
//! [`crate::update`] -> metrics -> the source is told the new policy version
//! ([`RolloutSource::on_policy_updated`]) -> validation, checkpoint, published results on their
//! schedules. The trainer owns the policy, the optimizer and its learning-rate schedule, the
//! teacher, the run directory, checkpoints and resume, validation and the best policy. Every
//! random choice derives from the seeds and the trainer step, so a run continued from a checkpoint
//! is bit-identical to an uninterrupted one.

use rlreplay_data::IoContext;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use rand::seq::SliceRandom;
use rlreplay_data::error::chain;
use rlreplay_data::resolve_hub_path;
use rlreplay_dist::{Collective, SingleProcess};
use rlreplay_model::{AdamW, Device, LrSchedule, Model};
use rlreplay_sampling::chat::ChatTokenizer;
use serde::{Deserialize, Serialize};

use crate::config::{Config, Logger, Task, TeacherRegularization, MAY_CHANGE_ON_RESUME};
use crate::context::rollout_teacher_prompts;
use crate::dist;
use crate::error::{Error, Result};
use crate::prompts::{has_validation_prompts, validation_prompts};
use crate::rundir::{
    check_resumed_config, latest_checkpoint, refuse_existing_run, time_breakdown, write_atomic,
    Metrics, Provenance, RunDir, RunLock, TRAINER_STATE,
};
use crate::schedule::step_rng;
use crate::source::{self, RolloutSource, RolloutStep, SourceContext};
use crate::teacher::{Teacher, EMA_TEACHER};
use crate::toy;
use crate::update::{perf_metrics, stats, update, TeacherInputs, UpdateSettings};
use crate::validate::Validator;

/// Version of the trainer-state format.
const STATE_FORMAT: u32 = 2;
/// File of the optimizer state inside a checkpoint.
pub const OPTIMIZER_STATE: &str = "optimizer.safetensors";

/// How to run the trainer.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The resolved configuration (its [`Config::source`] picks the rollout source).
    pub config: Config,
    /// The configuration file as the user wrote it and the overrides, for the hyper-parameter
    /// table's `Source` column.
    pub provenance: Provenance,
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
    pub fn new(config: Config, out: &Path) -> Self {
        Self {
            config,
            provenance: Provenance::default(),
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
    /// Trainer steps of the whole run.
    pub planned_steps: u64,
    /// Optimizer updates skipped because the loss or the gradient was not finite.
    pub skipped_updates: u64,
    /// The newest checkpoint written.
    pub last_checkpoint: Option<PathBuf>,
    /// The metrics of the last step run.
    pub last_metrics: Metrics,
    /// The mean of each `timing_s/*` metric over the steps this process ran (validation time
    /// spread over all of them): where a step's time goes, for [`crate::rundir::time_breakdown`].
    pub mean_timings: Metrics,
    /// `(step, mean@k)` of every validation.
    pub validations: Vec<(u64, f64)>,
    /// The best validation `(step, mean@k)`.
    pub best: Option<(u64, f64)>,
}

/// The trainer state stored in every checkpoint (besides the weights, the optimizer and the EMA
/// teacher).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Format version.
    pub format: u32,
    /// Trainer steps completed.
    pub global_step: u64,
    /// Optimizer updates applied.
    pub optimizer_steps: u64,
    /// Optimizer updates skipped (non-finite loss or gradient).
    pub skipped_updates: u64,
    /// Prompt and response tokens trained on so far.
    pub tokens_trained: u64,
    /// `(step, mean@k)` of every validation so far.
    pub validations: Vec<(u64, f64)>,
    /// The best validation so far.
    pub best: Option<(u64, f64)>,
    /// The rollout source's position ([`RolloutSource::state`]).
    pub source: serde_json::Value,
}

/// Runs (or resumes) a training run on `opts.config.trainer.threads` worker threads, as one rank
/// of a data-parallel job when a launcher (`mpirun`, `srun`) started this process
/// ([`dist::connect`]). With several ranks, an error on one rank is printed with its rank and
/// ends the whole job, so that the others do not wait for it.
pub fn run(opts: &RunOptions) -> Result<RunSummary> {
    let t = &opts.config.trainer;
    rlreplay_model::with_threads(t.threads, t.force_threads, || {
        let comm: Rc<dyn Collective> = dist::connect(&opts.config, &opts.out)?.into();
        let result = Trainer::on_ranks(opts, comm.clone())
            .and_then(|mut t| t.run(opts.stop_after, opts.progress));
        match result {
            Err(e) if comm.world() > 1 => {
                eprintln!("rank {}: error: {}", comm.rank(), chain(&e));
                comm.abort(rlreplay_dist::ERROR_CODE)
            }
            r => r,
        }
    })
}

/// The files of a Hugging Face model directory that loading needs.
fn model_file(name: &str) -> bool {
    name.ends_with(".safetensors")
        || (name.ends_with(".json") && !name.contains('/'))
        || name == "tokenizer.model"
}

/// Where a run starts: the checkpoint and the initial policy every rank starts from, and rank 0's
/// lock on the run directory.
struct Start {
    /// The run directory's lock, held by rank 0.
    lock: Option<RunLock>,
    /// The checkpoint to continue from: its trainer step and directory.
    resume_from: Option<(u64, PathBuf)>,
    /// The initial policy's directory ([`initial_model_dir`]).
    model_dir: Option<PathBuf>,
}

impl Start {
    /// Rank 0 locks the run directory, checks on resume that the configuration is unchanged (else
    /// refuses to overwrite an earlier run), finds the latest checkpoint, and creates the run
    /// directory and the initial policy's; the other ranks follow once it has.
    fn prepare(opts: &RunOptions, cfg: &Config, comm: &dyn Collective) -> Result<Self> {
        let out = &opts.out;
        let root = comm.is_root();
        let lock = root.then(|| RunLock::acquire(out)).transpose()?;
        let resume_from = if !root {
            None
        } else if opts.resume {
            let kind = cfg.source;
            let parse = |t: &str| Config::parse(t, &[], kind);
            check_resumed_config(out, cfg, parse, Config::comparable, MAY_CHANGE_ON_RESUME)?;
            latest_checkpoint(out)?
        } else {
            refuse_existing_run(out)?;
            None
        };
        let mut model_dir = None;
        if root {
            std::fs::create_dir_all(out).at("cannot create run directory", out)?;
            model_dir = initial_model_dir(cfg, out)?;
        }
        // The others start once rank 0 has prepared the run directory.
        let resume_from = dist::resume_point(comm, resume_from, out)?;
        if !root {
            model_dir = initial_model_dir(cfg, out)?;
        }
        Ok(Self {
            lock,
            resume_from,
            model_dir,
        })
    }
}

/// The directory of the initial policy: `[model] path` (a Hugging Face hub path is downloaded),
/// or the toy task's generated model in `RUN_DIR/initial`; `None` for a `[model.random]` policy
/// of a source that draws no prompts.
pub(crate) fn initial_model_dir(cfg: &Config, out: &Path) -> Result<Option<PathBuf>> {
    if let Some(path) = &cfg.model.path {
        let dir = resolve_hub_path(&path.to_string_lossy(), &model_file).map_err(|source| {
            Error::ModelPath {
                path: path.clone(),
                source: Box::new(source),
            }
        })?;
        return Ok(Some(dir));
    }
    if cfg.prompt_task() == Some(Task::Toy) {
        let dir = out.join("initial");
        if !dir.join("model.safetensors").is_file() {
            let random = cfg.model.random.clone().unwrap_or_else(toy::default_model);
            toy::make_model(&random, &cfg.toy, cfg.model.dtype.candle(), &dir)
                .map_err(|e| Error::ToyModel(Box::new(e)))?;
        }
        return Ok(Some(dir));
    }
    Ok(None)
}

/// Whether the run validates: on a schedule or before training, with validation prompts.
fn validates(cfg: &Config) -> bool {
    let v = &cfg.validation;
    (v.test_freq > 0 || v.val_before_train) && has_validation_prompts(cfg)
}

/// The policy's tokenizer and chat template, when something renders or decodes text (the
/// source's prompts, the teacher contexts, validation) and the initial policy has a directory;
/// a directory without the tokenizer files is refused.
fn chat_tokenizer(cfg: &Config, model_dir: Option<&Path>) -> Result<Option<Arc<ChatTokenizer>>> {
    let uses_teacher = cfg.uses_teacher();
    let wants_chat = cfg.source.draws_prompts() || uses_teacher || validates(cfg);
    let Some(dir) = model_dir.filter(|_| wants_chat) else {
        return Ok(None);
    };
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        if !dir.join(f).is_file() {
            return Err(Error::NoTokenizer(format!(
                "the model directory has no {f} (prompts and responses are rendered and decoded \
                 with it{}): {}",
                if uses_teacher {
                    format!(
                        "; [algorithm] loss_mode = {:?} builds the teacher contexts",
                        cfg.algorithm.loss_mode.name()
                    )
                } else {
                    String::new()
                },
                dir.join(f).display()
            )));
        }
    }
    Ok(Some(Arc::new(ChatTokenizer::from_dir(dir)?)))
}

/// The policy, its optimizer and the trainer state of checkpoint `dir` (of trainer step `step`);
/// the policy's tokenizer files stay those of the initial model's directory `model_dir`.
fn resumed_policy(
    cfg: &Config,
    step: u64,
    dir: &Path,
    model_dir: Option<&Path>,
    device: &Device,
) -> Result<(Model, AdamW, TrainerState)> {
    let load = |source| Error::LoadCheckpoint {
        dir: dir.to_path_buf(),
        source,
    };
    let mut policy = if cfg.model.uses_lora() {
        // A LoRA checkpoint holds the adapters only: they go back onto the initial base.
        let mut base = base_model(cfg, model_dir, device)?;
        base.load_adapter(dir).map_err(load)?;
        base
    } else {
        Model::load(dir, cfg.model.dtype.candle(), device).map_err(load)?
    };
    // Tokenizer files come from the initial model's directory: checkpoint rotation removes the
    // checkpoint this model was loaded from.
    policy.set_source_dir(model_dir.map(Path::to_path_buf));
    let opt = AdamW::load(dir.join(OPTIMIZER_STATE), &policy).map_err(load)?;
    let path = dir.join(TRAINER_STATE);
    let text = std::fs::read_to_string(&path).at("reading", &path)?;
    let state: TrainerState = serde_json::from_str(&text).map_err(|source| Error::JsonFile {
        path: path.clone(),
        source,
    })?;
    if state.format != STATE_FORMAT || state.global_step != step {
        return Err(Error::TrainerState {
            path,
            format: state.format,
            step: state.global_step,
        });
    }
    Ok((policy, opt, state))
}

/// The initial model's weights: `model_dir`, else `[model.random]` (the base under LoRA).
pub(crate) fn base_model(cfg: &Config, model_dir: Option<&Path>, device: &Device) -> Result<Model> {
    let dtype = cfg.model.dtype.candle();
    match (model_dir, &cfg.model.random) {
        (Some(dir), _) => Model::load(dir, dtype, device).map_err(|source| Error::LoadModel {
            dir: dir.to_path_buf(),
            source,
        }),
        (None, Some(r)) => {
            Model::new_random(r.to_config()?, r.seed, dtype, device).map_err(Error::RandomModel)
        }
        (None, None) => Err(Error::config("model", "[model]: give `path` or `random`")),
    }
}

/// The initial policy: the initial model with the run's adapters when LoRA is on (`[model]
/// adapter`, or fresh ones of `[model] lora_rank` drawn from `[trainer] seed`).
fn initial_policy(cfg: &Config, model_dir: Option<&Path>, device: &Device) -> Result<Model> {
    let mut model = base_model(cfg, model_dir, device)?;
    if let Some(dir) = &cfg.model.adapter {
        let adapter = |source| Error::LoadAdapter {
            dir: dir.clone(),
            source,
        };
        model.load_adapter(dir).map_err(adapter)?;
        let r = model.lora_config().map_or(0, |l| l.r);
        if cfg.model.lora_rank != 0 && cfg.model.lora_rank != r {
            return Err(Error::config(
                "model.lora_rank",
                format!(
                    "[model] lora_rank = {} but the adapter {} has rank {r} (leave lora_rank \
                     unset to use the adapter's)",
                    cfg.model.lora_rank,
                    dir.display()
                ),
            ));
        }
    } else if let Some(lora) = cfg.model.fresh_lora()? {
        model.add_lora(lora, cfg.trainer.seed)?;
    }
    Ok(model)
}

/// The initial policy ([`initial_policy`]), a fresh optimizer and the state of step 0.
fn fresh_policy(
    cfg: &Config,
    model_dir: Option<&Path>,
    device: &Device,
) -> Result<(Model, AdamW, TrainerState)> {
    let policy = initial_policy(cfg, model_dir, device)?;
    let opt = AdamW::new(&policy, cfg.optim.adamw());
    let state = TrainerState {
        format: STATE_FORMAT,
        global_step: 0,
        optimizer_steps: 0,
        skipped_updates: 0,
        tokens_trained: 0,
        validations: Vec::new(),
        best: None,
        source: serde_json::Value::Null,
    };
    Ok((policy, opt, state))
}

/// The token ids that end a response: `[data] eos_token_id`, else the model directory's. Empty
/// when the model names none and the source does not sample: its logged rows may name them.
fn stop_ids(cfg: &Config, dir: Option<&Path>, chat: Option<&ChatTokenizer>) -> Result<Vec<u32>> {
    if let Some(ids) = &cfg.data.eos_token_id {
        return Ok(ids.to_vec());
    }
    let ids = match dir {
        Some(dir) => rlreplay_sampling::stop_ids(dir, chat.map(|c| &c.tokenizer))?,
        None => Vec::new(),
    };
    if ids.is_empty() && cfg.source.samples() {
        return Err(Error::NoEos);
    }
    Ok(ids)
}

/// The rollout source of `ctx`, continued after the trainer state's step (from the position its
/// checkpoint stored when `resumed`), and the trainer steps of the whole run:
/// `[trainer] total_training_steps`, at most as many as the source plans.
fn open_source(
    ctx: &SourceContext<'_>,
    state: &TrainerState,
    resumed: bool,
) -> Result<(Box<dyn RolloutSource>, u64)> {
    let mut source = source::open(ctx)?;
    source.start(state.global_step, resumed.then(|| state.source.clone()))?;
    let total = match (
        ctx.config.trainer.total_training_steps,
        source.planned_steps(),
    ) {
        (Some(t), Some(p)) => t.min(p),
        (Some(t), None) => t,
        (None, Some(p)) => p,
        (None, None) => {
            return Err(Error::config(
                "trainer.total_training_steps",
                "[trainer] total_training_steps: the source has no end; set it",
            ))
        }
    };
    Ok((source, total))
}

/// The self-distillation teacher (`rlsd` / `rlrt`) and the tokenizer of its prompts: the initial
/// model of `model_dir`, or the EMA teacher of the `checkpoint` a run resumes from.
fn load_teacher(
    cfg: &Config,
    chat: Option<&Arc<ChatTokenizer>>,
    model_dir: Option<&Path>,
    checkpoint: Option<&Path>,
    device: &Device,
) -> Result<Option<(Teacher, Arc<ChatTokenizer>)>> {
    if !cfg.uses_teacher() {
        return Ok(None);
    }
    let (Some(chat), Some(dir)) = (chat, model_dir) else {
        return Err(Error::config(
            "algorithm.loss_mode",
            format!(
                "[algorithm] loss_mode = {:?} needs [model] path with the tokenizer files",
                cfg.algorithm.loss_mode.name()
            ),
        ));
    };
    let sd = &cfg.self_distillation;
    let ema = checkpoint
        .filter(|_| sd.teacher_regularization == TeacherRegularization::Ema)
        .map(|ckpt| ckpt.join(EMA_TEACHER));
    let teacher_err = |dir: &Path| {
        let dir = dir.to_path_buf();
        move |source| Error::LoadTeacher { dir, source }
    };
    // Under LoRA the teacher is the initial policy too: the base with the initial adapters (an
    // EMA teacher's adapters follow the student's), so it shares no weights with the policy.
    let mut model = match &ema {
        Some(ema) if cfg.model.uses_lora() => {
            let mut base = base_model(cfg, model_dir, device)?;
            base.load_adapter(ema).map_err(teacher_err(ema))?;
            base
        }
        Some(ema) => {
            Model::load(ema, cfg.model.dtype.candle(), device).map_err(teacher_err(ema))?
        }
        None => initial_policy(cfg, model_dir, device)?,
    };
    model.set_source_dir(Some(dir.to_path_buf()));
    let teacher = Teacher::new(model, sd.teacher_regularization, sd.teacher_update_rate)?;
    Ok(Some((teacher, chat.clone())))
}

/// The validator of the run's validation prompts, when it validates and has a tokenizer.
fn validator(
    cfg: &Config,
    chat: Option<&Arc<ChatTokenizer>>,
    stop: &[u32],
) -> Result<Option<Validator>> {
    match chat {
        Some(chat) if validates(cfg) => {
            let prompts = validation_prompts(cfg, chat)?;
            Ok(Some(Validator::new(cfg, chat.clone(), prompts, stop)?))
        }
        _ => Ok(None),
    }
}

/// Rank 0's run directory, opened at trainer step `step`: the resolved configuration written,
/// and the hyper-parameter table unless a resumed run has it.
fn open_run_dir(opts: &RunOptions, cfg: &Config, step: u64, resumed: bool) -> Result<RunDir> {
    let out = &opts.out;
    let run = RunDir::open(out, step, &cfg.trainer.loggers)?;
    run.drop_stale_candidate()?;
    let resolved = cfg.to_toml()?;
    write_atomic(&out.join("config.toml"), resolved.as_bytes())?;
    // The table records where each value came from at the start of the run; a resume keeps it.
    if !resumed || !out.join("results/hyperparameters.csv").is_file() {
        run.write_hyperparameters(&resolved, &opts.provenance)?;
    }
    Ok(run)
}

/// A training run in progress.
pub struct Trainer {
    cfg: Config,
    source: Box<dyn RolloutSource>,
    policy: Model,
    opt: AdamW,
    lr: LrSchedule,
    /// Trainer steps of the whole run.
    total: u64,
    /// Self-distillation (`rlsd` / `rlrt`): the teacher and the tokenizer of its prompts.
    teacher: Option<(Teacher, Arc<ChatTokenizer>)>,
    validator: Option<Validator>,
    state: TrainerState,
    /// The run directory, on rank 0 only: the other ranks write nothing.
    run: Option<RunDir>,
    /// The run directory's path.
    out: PathBuf,
    /// The run directory's lock, held by rank 0 for the life of the trainer.
    _lock: Option<RunLock>,
    /// The data-parallel ranks (one process when not started by a launcher).
    comm: Rc<dyn Collective>,
    /// The base model as a LoRA checkpoint names it (`base_model_name_or_path`).
    base_name: String,
}

impl Trainer {
    /// Prepares a run: the run directory (refusing to overwrite an earlier run, or checking on
    /// resume that the configuration is unchanged), the initial policy's directory, tokenizer and
    /// end-of-response ids, the rollout source, the policy and optimizer (fresh or from the latest
    /// checkpoint), the teacher and the validator.
    pub fn new(opts: &RunOptions) -> Result<Self> {
        Self::on_ranks(opts, Rc::new(SingleProcess::new()))
    }

    /// [`Trainer::new`] as one of `comm`'s data-parallel ranks: rank 0 alone checks, locks and
    /// writes the run directory; every rank loads the same initial policy or checkpoint.
    pub fn on_ranks(opts: &RunOptions, comm: Rc<dyn Collective>) -> Result<Self> {
        let cfg = opts.config.clone();
        cfg.validate()?;
        let start = Start::prepare(opts, &cfg, &*comm)?;
        let model_dir = start.model_dir.as_deref();
        let checkpoint = start.resume_from.as_ref().map(|(_, dir)| dir.as_path());
        let resumed = checkpoint.is_some();
        let device = dist::device(&cfg, &*comm)?;
        let chat = chat_tokenizer(&cfg, model_dir)?;
        let (mut policy, opt, state) = match &start.resume_from {
            Some((step, dir)) => resumed_policy(&cfg, *step, dir, model_dir, &device)?,
            None => fresh_policy(&cfg, model_dir, &device)?,
        };
        policy.set_activation_recompute(cfg.model.enable_gradient_checkpointing);
        dist::data_parallel(&*comm, &cfg).shard_masters(&mut policy)?;
        let stop = stop_ids(&cfg, model_dir, chat.as_deref())?;
        let source_context = SourceContext {
            config: &cfg,
            run_dir: &opts.out,
            chat: chat.clone(),
            stop_ids: &stop,
            vocab_size: policy.config().vocab_size,
            max_positions: policy.config().max_position_embeddings,
            needs_text: cfg.uses_teacher(),
            comm: comm.clone(),
        };
        let (source, total) = open_source(&source_context, &state, resumed)?;
        // The schedule advances once per trainer step (after its mini-batches), as verl's actor
        // does.
        let lr = cfg.optim.lr_schedule(total);
        let teacher = load_teacher(&cfg, chat.as_ref(), model_dir, checkpoint, &device)?;
        let validator = validator(&cfg, chat.as_ref(), &stop)?;
        let run = comm
            .is_root()
            .then(|| open_run_dir(opts, &cfg, state.global_step, resumed))
            .transpose()?;
        let base_name = cfg.model.base_model_name(model_dir);
        let t = Self {
            cfg,
            source,
            policy,
            opt,
            lr,
            total,
            teacher,
            validator,
            state,
            run,
            out: opts.out.clone(),
            base_name,
            _lock: start.lock,
            comm,
        };
        t.log_start(resumed)?;
        Ok(t)
    }

    /// Logs where the run starts (rank 0), and how the master weights are sharded when they are.
    fn log_start(&self, resumed: bool) -> Result<()> {
        self.log(&format!(
            "{} at step {} of {}{}{}",
            if resumed { "resumed" } else { "started" },
            self.state.global_step,
            self.total,
            self.validator
                .as_ref()
                .map(|v| format!(", {} validation prompts", v.len()))
                .unwrap_or_default(),
            rlreplay_dist::describe(&*self.comm),
        ))?;
        if let Some(line) =
            dist::data_parallel(&*self.comm, &self.cfg).describe_held_weights(&self.policy)?
        {
            self.log(&line)?;
        }
        Ok(())
    }

    /// Appends a line to the run's log (rank 0).
    fn log(&self, line: &str) -> Result<()> {
        self.run.as_ref().map_or(Ok(()), |r| r.log(line))
    }

    /// The run directory, which only rank 0 opens.
    fn run_dir(&self) -> Result<&RunDir> {
        self.run
            .as_ref()
            .ok_or_else(|| Error::Ranks("only rank 0 writes the run directory".into()))
    }

    /// The trainer state.
    pub fn state(&self) -> &TrainerState {
        &self.state
    }

    /// The policy being trained.
    pub fn policy(&self) -> &Model {
        &self.policy
    }

    /// Runs until the last trainer step (or `stop_after`), with a checkpoint at the end.
    pub fn run(&mut self, stop_after: Option<u64>, progress: bool) -> Result<RunSummary> {
        let total = self.total;
        let stop = stop_after.unwrap_or(total).min(total);
        let root = self.comm.is_root();
        let bar = if progress && root {
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} step {pos}/{len} [{bar:30}] {elapsed_precise} eta {eta} {msg}",
                )
                .expect("valid progress template")
                .progress_chars("=> "),
            );
            bar.set_position(self.state.global_step);
            bar
        } else {
            ProgressBar::hidden()
        };
        if self.state.global_step == 0
            && self.cfg.validation.val_before_train
            && self.validator.is_some()
        {
            // Rank 0 may save the best policy: it needs the masters whole.
            let comm = self.comm.clone();
            let dp = dist::data_parallel(&*comm, &self.cfg);
            dp.gather_masters(&mut self.policy)?;
            self.validate(0)?;
            dp.shard_masters(&mut self.policy)?;
        }
        let mut last_metrics = Metrics::new();
        let (mut timing_sums, mut steps_run) = (Metrics::new(), 0u64);
        let mut last_checkpoint = None;
        while self.state.global_step < stop {
            let step = self.state.global_step + 1;
            let mut metrics = self.step(step).map_err(|e| Error::Step {
                step,
                source: Box::new(e),
            })?;
            let freq = self.cfg.validation.test_freq;
            let validating = freq > 0 && (step.is_multiple_of(freq) || step == total);
            let sf = self.cfg.trainer.save_freq;
            let saving = (sf > 0 && step.is_multiple_of(sf)) || step == stop;
            // Rank 0 saves the best policy and the checkpoints whole.
            let comm = self.comm.clone();
            let dp = dist::data_parallel(&*comm, &self.cfg);
            if (validating && self.validator.is_some()) || saving {
                dp.gather_masters(&mut self.policy)?;
            }
            if validating {
                let t_test = Instant::now();
                if let Some(v) = self.validate(step)? {
                    metrics.extend(v);
                    metrics.insert("timing_s/testing".into(), t_test.elapsed().as_secs_f64());
                }
            }
            if let Some(run) = &mut self.run {
                run.log_step(step, &metrics)?;
            }
            for (k, v) in metrics.iter().filter(|(k, _)| k.starts_with("timing_s/")) {
                *timing_sums.entry(k.clone()).or_insert(0.0) += v;
            }
            steps_run += 1;
            let get = |k: &str| metrics.get(k).copied().unwrap_or(f64::NAN);
            let line = format!(
                "step {step}: score {:.4} loss {:.5} grad_norm {:.4}{}{}",
                get("critic/score/mean"),
                get("actor/pg_loss"),
                get("actor/grad_norm"),
                metrics
                    .get("val-core/mean@k")
                    .map(|m| format!(" val mean@{} {m:.4}", self.cfg.validation.val_n))
                    .unwrap_or_default(),
                time_breakdown(&metrics, false)
                    .map(|t| format!(" | {t}"))
                    .unwrap_or_default()
            );
            self.log(&line)?;
            if self.cfg.trainer.loggers.contains(&Logger::Console) && root {
                if bar.is_hidden() {
                    eprintln!("{line}");
                } else {
                    bar.println(&line);
                }
            }
            bar.set_position(step);
            bar.set_message(format!(
                "score {:.3} loss {:.4} {:.0} tok/s",
                get("critic/score/mean"),
                get("actor/pg_loss"),
                metrics.get("perf/throughput").copied().unwrap_or(0.0)
            ));
            if saving {
                dp.gather_optimizer_state(&self.policy, &mut self.opt)?;
                if root {
                    last_checkpoint = Some(self.save_checkpoint()?);
                }
            }
            dp.shard_masters(&mut self.policy)?;
            last_metrics = metrics;
        }
        bar.finish_and_clear();
        Ok(RunSummary {
            run_dir: self.out.clone(),
            global_step: self.state.global_step,
            planned_steps: total,
            skipped_updates: self.state.skipped_updates,
            last_checkpoint,
            last_metrics,
            mean_timings: timing_sums
                .into_iter()
                .map(|(k, v)| (k, v / steps_run.max(1) as f64))
                .collect(),
            validations: self.state.validations.clone(),
            best: self.state.best,
        })
    }

    /// Validates the policy at `step` (when the run has validation prompts): records mean@k, and
    /// keeps the policy as the best candidate when it beats every earlier validation. Returns the
    /// `val-core/*` metrics.
    fn validate(&mut self, step: u64) -> Result<Option<Metrics>> {
        let Some(validator) = &self.validator else {
            return Ok(None);
        };
        if validator.is_empty() {
            return Ok(None);
        }
        let v = validator.run(step, &self.policy, &*self.comm)?;
        let k = self.cfg.validation.val_n;
        let mut metrics = Metrics::new();
        metrics.insert("val-core/mean@k".into(), v.mean);
        for (source, m) in &v.per_source {
            metrics.insert(format!("val-core/{source}/reward/mean@{k}"), *m);
        }
        self.state.validations.retain(|(s, _)| *s < step);
        self.state.validations.push((step, v.mean));
        if self.state.best.is_none_or(|(_, b)| v.mean > b) {
            self.state.best = Some((step, v.mean));
            // The best policy goes to the run root once its step is checkpointed.
            if self.comm.is_root() {
                let cand = self.run_dir()?.best_candidate();
                self.save_policy(&self.policy, &cand)?;
                write_atomic(&cand.join("step.txt"), format!("{step}\n").as_bytes())?;
            }
        }
        self.log(&format!(
            "validation at step {step}: mean@{k} = {:.4}",
            v.mean
        ))?;
        Ok(Some(metrics))
    }

    /// Writes `model` (the policy or the EMA teacher) into `dir`: the Hugging Face layout, or
    /// under LoRA the PEFT adapter alone, naming the base model.
    fn save_policy(&self, model: &Model, dir: &Path) -> Result<()> {
        if model.lora_config().is_some() {
            model.save_adapter(dir, &self.base_name)?;
        } else {
            model.save_hf(dir)?;
        }
        Ok(())
    }

    fn save_checkpoint(&mut self) -> Result<PathBuf> {
        let step = self.state.global_step;
        self.state.source = self.source.state();
        let state = serde_json::to_string_pretty(&self.state).map_err(|source| Error::Json {
            what: "the trainer state",
            source,
        })?;
        let ema = self
            .teacher
            .as_ref()
            .map(|(t, _)| t)
            .filter(|t| t.regularization() == TeacherRegularization::Ema)
            .map(Teacher::model);
        let dir = self
            .run_dir()?
            .save_checkpoint(step, self.cfg.trainer.keep, |d| {
                self.save_policy(&self.policy, d)?;
                self.opt.save(d.join(OPTIMIZER_STATE))?;
                if let Some(t) = ema {
                    self.save_policy(t, &d.join(EMA_TEACHER))?;
                }
                write_atomic(&d.join(TRAINER_STATE), state.as_bytes())
            })?;
        self.run_dir()?.publish_policy(&dir, self.state.best)?;
        let k = self.cfg.validation.val_n;
        let validations = self
            .validator
            .as_ref()
            .map(|_| (k, self.state.validations.as_slice()));
        self.run_dir()?.publish_results(validations)?;
        self.log(&format!("checkpoint {}", dir.display()))?;
        Ok(dir)
    }

    /// The step's groups in a seeded random order (`[batch] shuffle`), rows of a group together.
    fn shuffle_groups(&self, step: u64, rollouts: RolloutStep) -> RolloutStep {
        let groups = rollouts.batch.groups();
        let mut spans: Vec<std::ops::Range<usize>> = groups;
        spans.shuffle(&mut step_rng(self.cfg.trainer.seed, step, 4));
        let rows: Vec<usize> = spans.into_iter().flatten().collect();
        rollouts.select(&rows)
    }

    /// One trainer step: returns its metrics.
    pub fn step(&mut self, step: u64) -> Result<Metrics> {
        let started = Instant::now();
        let mut rollouts = self.source.next_step(step, &self.policy)?;
        // A schedule's filters may leave a step without rows (every group all-right or all-wrong
        // under `drop_solve_*`): the step is skipped, counted, and trains nothing.
        if rollouts.skip && rollouts.batch.is_empty() {
            let mut metrics = std::mem::take(&mut rollouts.metrics);
            self.state.global_step = step;
            metrics.insert("train/skipped_steps".into(), 1.0);
            metrics.insert("train/skipped_updates".into(), 0.0);
            metrics.insert(
                "train/optimizer_steps".into(),
                self.state.optimizer_steps as f64,
            );
            let secs = started.elapsed().as_secs_f64();
            metrics.insert("timing_s/step".into(), secs);
            perf_metrics(&mut metrics, 0, secs, self.state.skipped_updates);
            self.source.on_policy_updated(step, &self.policy)?;
            return Ok(metrics);
        }
        rollouts.check()?;
        if self.cfg.batch.shuffle {
            rollouts = self.shuffle_groups(step, rollouts);
        }
        let mut metrics = std::mem::take(&mut rollouts.metrics);
        let RolloutStep {
            batch,
            truncated,
            policy_versions,
            text,
            origin,
            ..
        } = rollouts;
        let cfg = &self.cfg;
        let mut algo = cfg.algorithm.clone();
        algo.global_step = Some(step);
        let threshold = algo.success_reward_threshold;
        let prompts = match (&self.teacher, &text) {
            (Some((_, chat)), Some(text)) => {
                // The teacher's chat template follows the data's thinking switch unless set
                // apart.
                let mut sd = cfg.self_distillation.context.clone();
                sd.enable_thinking = sd.enable_thinking.or(cfg.data.enable_thinking);
                let (p, m) = rollout_teacher_prompts(
                    &batch,
                    text,
                    &truncated,
                    cfg.self_distillation.correctness_feedback,
                    &sd,
                    chat.as_ref(),
                )
                .map_err(|e| Error::InStep {
                    origin: origin.clone(),
                    source: Box::new(e),
                })?;
                metrics.extend(m);
                Some(p)
            }
            (Some(_), None) => {
                return Err(Error::Rollouts {
                    origin,
                    why: "the source gave no text for the teacher contexts".into(),
                })
            }
            _ => None,
        };
        let teacher = match (&self.teacher, &prompts) {
            (Some((t, _)), Some(p)) => Some(TeacherInputs {
                teacher: t,
                prompts: p,
                success_threshold: threshold,
            }),
            _ => None,
        };
        let settings = UpdateSettings {
            temperature: cfg.rollout.temperature,
            ppo_mini_batch_size: cfg.batch.ppo_mini_batch_size,
            ppo_epochs: cfg.batch.ppo_epochs,
            max_tokens_per_micro_batch: cfg.batch.max_tokens_per_micro_batch,
            lr: self.lr.lr_at(step - 1),
        };
        let t_update = Instant::now();
        let dp = dist::data_parallel(&*self.comm, cfg);
        let out = update(
            &dp,
            &mut self.policy,
            &mut self.opt,
            &algo,
            &batch,
            &settings,
            teacher.as_ref(),
        )?;
        metrics.insert("timing_s/update".into(), t_update.elapsed().as_secs_f64());
        metrics.extend(dp.take_metrics());
        dist::reduce_timings(&*self.comm, &mut metrics)?;
        self.state.optimizer_steps += out.applied;
        self.state.skipped_updates += out.skipped;
        let n = batch.len();
        let offsets = &batch.response_offsets;
        if out.current.iter().all(|x| x.is_finite()) {
            // Mean per-token log-prob of successful and of failed responses under the policy
            // being trained: the learning signal at a glance.
            for (name, win) in [("success", true), ("failure", false)] {
                let (mut sum, mut count) = (0.0, 0usize);
                for i in (0..n).filter(|&i| (f64::from(batch.scores[i]) >= threshold) == win) {
                    sum += out.current[offsets[i]..offsets[i + 1]].iter().sum::<f64>();
                    count += offsets[i + 1] - offsets[i];
                }
                if count > 0 {
                    metrics.insert(format!("replay/logprob_{name}"), sum / count as f64);
                }
            }
        }
        metrics.extend(out.metrics);
        let resp: Vec<f64> = (0..n).map(|i| batch.response(i).len() as f64).collect();
        let prompt: Vec<f64> = (0..n).map(|i| batch.prompt(i).len() as f64).collect();
        stats(&mut metrics, "response_length", &resp);
        stats(&mut metrics, "prompt_length", &prompt);
        let clipped = truncated.iter().filter(|&&t| t).count();
        metrics.insert(
            "response_length/clip_ratio".into(),
            clipped as f64 / n.max(1) as f64,
        );
        // Staleness: trainer steps between the weights that generated a row and those it trains.
        let stale: Vec<f64> = policy_versions
            .iter()
            .flatten()
            .map(|&v| (step - 1).saturating_sub(v) as f64)
            .collect();
        if !stale.is_empty() {
            stats(&mut metrics, "rollout/staleness", &stale);
        }
        let tokens = (batch.prompt_tokens.len() + batch.response_tokens.len()) as u64;
        self.state.tokens_trained += tokens;
        self.state.global_step = step;
        let step_s = started.elapsed().as_secs_f64();
        metrics.insert("timing_s/step".into(), step_s);
        perf_metrics(&mut metrics, tokens, step_s, self.state.skipped_updates);
        metrics.insert("train/skipped_updates".into(), out.skipped as f64);
        // The column name of the run directory's training_scores.csv.
        metrics.insert("train/skipped_steps".into(), out.skipped as f64);
        metrics.insert(
            "train/optimizer_steps".into(),
            self.state.optimizer_steps as f64,
        );
        self.source.on_policy_updated(step, &self.policy)?;
        Ok(metrics)
    }
}
