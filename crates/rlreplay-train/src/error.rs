//! Errors of the training crate.

use std::path::PathBuf;

/// Every error the trainer reports: a configuration key, a file, a checkpoint, a model, a rollout
/// source or a step that failed, with the lower crates' errors as causes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value the trainer refuses; `key` is its dotted name (`optim.lr`).
    #[error("{message}")]
    Config {
        /// The key (or section) at fault, dotted.
        key: String,
        /// What is wrong, naming the key as the configuration file spells it.
        message: String,
    },
    /// A configuration file that cannot be read.
    #[error("cannot read config {}", path.display())]
    ReadConfig {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A configuration file that is refused.
    #[error("in config {}", path.display())]
    InConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: Box<Error>,
    },
    /// A `--set` override that is refused.
    #[error("--set {spec:?}: {message}")]
    Override {
        /// The override as given.
        spec: String,
        /// What is wrong with it.
        message: String,
    },
    /// Configuration text that is not valid TOML or does not fit the schema.
    #[error(transparent)]
    Toml(#[from] toml::de::Error),
    /// The resolved configuration cannot be written as TOML.
    #[error("writing the configuration as TOML")]
    TomlWrite(#[from] toml::ser::Error),
    /// The `[algorithm]` section is refused by the algorithm layer.
    #[error("[algorithm]")]
    Algorithm(#[source] rlreplay_algo::AlgoError),
    /// A self-distillation template that does not format with its placeholders.
    #[error("[self_distillation] {key}: the placeholders are {placeholders}")]
    TemplatePlaceholders {
        /// The template's key.
        key: &'static str,
        /// Its allowed placeholders.
        placeholders: String,
        /// What is wrong with it.
        source: Box<Error>,
    },
    /// A template that does not parse or names an unknown placeholder.
    #[error("template {template:?}: {why}")]
    Template {
        /// The template.
        template: String,
        /// What is wrong with it.
        why: String,
    },
    /// A file operation that failed.
    #[error(transparent)]
    Io(#[from] rlreplay_data::IoError),
    /// A line of a JSON-lines file that does not parse.
    #[error("{} line {line}", path.display())]
    JsonLine {
        /// The file.
        path: PathBuf,
        /// The line (1-based).
        line: usize,
        /// The parse error.
        source: serde_json::Error,
    },
    /// A JSON file that does not parse.
    #[error("{}", path.display())]
    JsonFile {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
    /// A value that does not convert to or from JSON (`what` says which).
    #[error("{what}")]
    Json {
        /// What was converted.
        what: &'static str,
        /// The conversion error.
        source: serde_json::Error,
    },
    /// A run directory that already holds a run.
    #[error(
        "{} already holds a run: pass --resume to continue it, or choose another --out",
        dir.display()
    )]
    ExistingRun {
        /// The run directory.
        dir: PathBuf,
    },
    /// A run directory locked by another process.
    #[error(
        "{} is in use by another rlreplay process ({holder}): wait for it to finish or choose \
         another --out",
        dir.display()
    )]
    Locked {
        /// The run directory.
        dir: PathBuf,
        /// `pid N`, or `pid unknown`.
        holder: String,
    },
    /// A file or directory an export needs that the run directory lacks.
    #[error("{} is missing: {why}", path.display())]
    MissingRunFile {
        /// The missing file or directory.
        path: PathBuf,
        /// What it is and what its absence means.
        why: String,
    },
    /// A file of a run directory that cannot be used.
    #[error("{}: {why}", path.display())]
    BadRunFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// A run directory without a complete checkpoint: it holds no policy to export.
    #[error(
        "{}: no complete checkpoint (no global_step_N/{}): the run stopped before its first \
         checkpoint, so there is no policy to export",
        dir.display(),
        crate::rundir::TRAINER_STATE
    )]
    NoCheckpoint {
        /// The run's checkpoints directory.
        dir: PathBuf,
    },
    /// A checkpoint asked for that the run does not keep.
    #[error(
        "{}: no complete checkpoint global_step_{step} (complete checkpoints: {})",
        dir.display(),
        available.iter().map(|s| format!("global_step_{s}")).collect::<Vec<_>>().join(", ")
    )]
    CheckpointNotFound {
        /// The run's checkpoints directory.
        dir: PathBuf,
        /// The step asked for.
        step: u64,
        /// The steps of the complete checkpoints.
        available: Vec<u64>,
    },
    /// A checkpoint choice that is none of `best`, `last`, `global_step_N`.
    #[error("checkpoint {0:?}: expected best, last or global_step_N")]
    CheckpointChoice(String),
    /// An export destination that is refused.
    #[error("{}: {why}", dir.display())]
    CardDir {
        /// The destination.
        dir: PathBuf,
        /// Why it is refused.
        why: String,
    },
    /// A run directory a trainer is writing.
    #[error(
        "{} is being written by another rlreplay process ({holder}): export it once the run has \
         finished or stopped",
        dir.display()
    )]
    RunInUse {
        /// The run directory.
        dir: PathBuf,
        /// `pid N`, or `pid unknown`.
        holder: String,
    },
    /// `--resume` with a configuration that differs from the run's.
    #[error(
        "--resume: the configuration differs from the run's {}: {} (only {may_change} may change)",
        path.display(),
        changed.join("; ")
    )]
    ConfigChanged {
        /// The run's saved configuration.
        path: PathBuf,
        /// What changed, one entry per key.
        changed: Vec<String>,
        /// The keys that may change on resume.
        may_change: String,
    },
    /// `--resume` with a saved configuration that cannot be read.
    #[error("--resume: {}", path.display())]
    SavedConfig {
        /// The run's saved configuration.
        path: PathBuf,
        /// What is wrong with it.
        source: Box<Error>,
    },
    /// A checkpoint that cannot be written (nothing is left behind: its temporary directory is
    /// removed and the previous checkpoint stays the latest).
    #[error("writing checkpoint of step {step}")]
    WriteCheckpoint {
        /// The trainer step.
        step: u64,
        /// What failed.
        source: Box<Error>,
    },
    /// A checkpoint written without its trainer state.
    #[error("checkpoint of step {step} lacks {}", crate::rundir::TRAINER_STATE)]
    IncompleteCheckpoint {
        /// The trainer step.
        step: u64,
    },
    /// A checkpoint whose model or optimizer cannot be loaded.
    #[error("loading checkpoint {}", dir.display())]
    LoadCheckpoint {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The model crate's error.
        source: rlreplay_model::Error,
    },
    /// A checkpoint's trainer state of another format or step.
    #[error("{}: unexpected trainer state (format {format}, step {step})", path.display())]
    TrainerState {
        /// The trainer-state file.
        path: PathBuf,
        /// Its format.
        format: u32,
        /// Its step.
        step: u64,
    },
    /// A rollout source's checkpoint state that differs from the run's.
    #[error("{0}")]
    SourceStateChanged(&'static str),
    /// A step number that does not fit the event file's int64.
    #[error("step {0} does not fit int64")]
    StepRange(u64),
    /// `[model] path` cannot be resolved (a hub path that cannot be downloaded).
    #[error("[model] path = {}", path.display())]
    ModelPath {
        /// The path as configured.
        path: PathBuf,
        /// The data crate's error.
        source: Box<rlreplay_data::Error>,
    },
    /// A model directory that cannot be loaded.
    #[error("loading the model {}", dir.display())]
    LoadModel {
        /// The model directory.
        dir: PathBuf,
        /// The model crate's error.
        source: rlreplay_model::Error,
    },
    /// `[model] adapter` that cannot be loaded onto the initial model.
    #[error("[model] adapter = {}", dir.display())]
    LoadAdapter {
        /// The adapter directory.
        dir: PathBuf,
        /// The model crate's error.
        source: rlreplay_model::Error,
    },
    /// The teacher's model directory that cannot be loaded.
    #[error("loading the teacher {}", dir.display())]
    LoadTeacher {
        /// The teacher's directory.
        dir: PathBuf,
        /// The model crate's error.
        source: rlreplay_model::Error,
    },
    /// `[model.random]` cannot be built.
    #[error("[model] random")]
    RandomModel(#[source] rlreplay_model::Error),
    /// The toy task's initial model cannot be created.
    #[error("creating the toy task's model")]
    ToyModel(#[source] Box<Error>),
    /// A model directory that lacks the tokenizer files a feature needs.
    #[error("{0}")]
    NoTokenizer(String),
    /// No end-of-sequence id in the configuration, the dataset or the model directory.
    #[error(
        "[data] eos_token_id: neither the dataset nor the model names an end-of-sequence token \
         (eos_token_id in config.json or generation_config.json, eos_token in \
         tokenizer_config.json); set it"
    )]
    NoEos,
    /// A teacher that does not fit its student or its inputs.
    #[error("{0}")]
    Teacher(String),
    /// A trainer step that failed.
    #[error("trainer step {step}")]
    Step {
        /// The trainer step.
        step: u64,
        /// What failed.
        source: Box<Error>,
    },
    /// A failure while handling the rows of one source step (`origin` names it).
    #[error("{origin}")]
    InStep {
        /// The step's origin (`dataset step 4`, `step 7`).
        origin: String,
        /// What failed.
        source: Box<Error>,
    },
    /// A step of rollouts the trainer cannot use (`origin` names it).
    #[error("{origin}: {why}")]
    Rollouts {
        /// The step's origin.
        origin: String,
        /// What is wrong with it.
        why: String,
    },
    /// `[data] path` cannot be opened as a rollout dataset.
    #[error("[data] path = {path:?}")]
    Dataset {
        /// The path as configured.
        path: String,
        /// The data crate's error.
        source: Box<rlreplay_data::Error>,
    },
    /// A dataset step that cannot be read.
    #[error("dataset step {step}")]
    DatasetStep {
        /// The dataset step.
        step: i64,
        /// The data crate's error.
        source: Box<rlreplay_data::Error>,
    },
    /// A trainer step past the end of the replay schedule.
    #[error("trainer step {0} is past the schedule's end")]
    PastSchedule(u64),
    /// The prompt set that is empty once over-long prompts are dropped.
    #[error("no training prompt is left after filtering over-long prompts")]
    NoPrompts,
    /// A prompt over `max_prompt_length`.
    #[error("{set} prompt {index} has {tokens} tokens, over max_prompt_length = {max}")]
    PromptTooLong {
        /// `training` or `validation`.
        set: &'static str,
        /// The prompt's index in its file.
        index: usize,
        /// Its number of tokens.
        tokens: usize,
        /// `[data] max_prompt_length`.
        max: usize,
    },
    /// A teacher prompt that cannot be cut to `max_reprompt_len`.
    #[error("{0}")]
    TeacherPrompt(String),
    /// A row whose text cannot be decoded or used to build a teacher context.
    #[error("row {row}: {why}")]
    Row {
        /// The row in its step.
        row: usize,
        /// What is wrong with it.
        why: String,
    },
    /// A row's prompt or response that cannot be decoded.
    #[error("{origin}: row {row}: decoding the {what}")]
    Decode {
        /// The step's origin.
        origin: String,
        /// The row.
        row: usize,
        /// `prompt` or `response`.
        what: &'static str,
        /// The tokenizer's error.
        source: Box<rlreplay_sampling::Error>,
    },
    /// Generation ahead that went wrong (steps out of order, a panicked thread).
    #[error("{0}")]
    Generation(String),
    /// The step's rollouts cannot be written into the run directory.
    #[error("writing the step's rollouts")]
    WriteRollouts(#[source] Box<rlreplay_data::Error>),
    /// An inference server refused a request (4xx).
    #[error("{0}")]
    ServerRefused(String),
    /// An inference server returned a sample that cannot be trained on
    /// (`[rollout] invalid_samples = "error"`).
    #[error("{0} ([rollout] invalid_samples = \"drop\" drops such groups instead)")]
    InvalidSample(String),
    /// No rollout endpoint is left.
    #[error(
        "no rollout endpoint is left (the last checkpoint is intact; start the servers and \
         continue with --resume): {}",
        failures.join("; ")
    )]
    NoEndpoint {
        /// `URL: why` of every endpoint.
        failures: Vec<String>,
    },
    /// The policy cannot be written for the inference servers.
    #[error("writing the policy to {}", dir.display())]
    WritePolicy {
        /// The directory.
        dir: PathBuf,
        /// The model crate's error.
        source: rlreplay_model::Error,
    },
    /// An error of the rollout data layer.
    #[error(transparent)]
    Data(#[from] rlreplay_data::Error),
    /// An error of the model layer.
    #[error(transparent)]
    Model(#[from] rlreplay_model::Error),
    /// An error of the algorithm layer.
    #[error(transparent)]
    Algo(#[from] rlreplay_algo::AlgoError),
    /// A tokenizer, chat-template or sampling error.
    #[error(transparent)]
    Sampling(#[from] rlreplay_sampling::Error),
    /// An error of the prompt sets (evaluation crate).
    #[error(transparent)]
    Eval(Box<rlreplay_eval::Error>),
    /// A plot that cannot be drawn.
    #[error(transparent)]
    Plot(#[from] rlreplay_plot::PlotError),
    /// A TensorBoard event file that cannot be written.
    #[error(transparent)]
    Tensorboard(#[from] rlreplay_tensorboard::Error),
    /// A tensor operation that failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// A collective of the distributed layer that failed.
    #[error(transparent)]
    Dist(#[from] rlreplay_dist::DistError),
    /// Something the data-parallel ranks cannot do or do not agree on.
    #[error("{0}")]
    Ranks(String),
}

impl From<rlreplay_eval::Error> for Error {
    fn from(e: rlreplay_eval::Error) -> Self {
        Error::Eval(Box::new(e))
    }
}

impl Error {
    /// A configuration error at `key`.
    pub(crate) fn config(key: impl Into<String>, message: impl Into<String>) -> Error {
        Error::Config {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Result type of the training crate.
pub type Result<T> = std::result::Result<T, Error>;
