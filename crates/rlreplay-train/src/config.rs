//! The replay configuration: one TOML file, unknown keys refused, `--set section.key=value`
//! overrides parsed as TOML values, and the resolved form saved in the run directory.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use rlreplay_algo::AlgoConfig;
use rlreplay_data::StepRange;
use rlreplay_model::{AdamWConfig, DType, LrSchedule};
use serde::{Deserialize, Serialize};

use crate::context::ContextConfig;
use crate::teacher::TeacherRegularization;

/// The whole configuration of a replay run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayConfig {
    /// The policy to train.
    #[serde(default)]
    pub model: ModelSection,
    /// The rollout dataset.
    pub data: DataSection,
    /// Which rollouts each trainer step consumes, in which order.
    #[serde(default)]
    pub schedule: ScheduleSection,
    /// How the logged rollouts were sampled (the temperature of every log-prob).
    #[serde(default)]
    pub rollout: RolloutSection,
    /// Advantage estimator, policy loss, rollout correction (the keys of `rlreplay compute`).
    #[serde(default)]
    pub algorithm: AlgorithmSection,
    /// Self-distillation (`loss_mode = "rlsd"` / `"rlrt"`): teacher contexts and the teacher.
    #[serde(default)]
    pub self_distillation: SelfDistillationSection,
    /// Optimizer and learning-rate schedule.
    #[serde(default)]
    pub optim: OptimSection,
    /// Mini-batches, PPO epochs and micro-batch packing.
    #[serde(default)]
    pub batch: BatchSection,
    /// Checkpoint frequency and rotation.
    #[serde(default)]
    pub checkpoint: CheckpointSection,
    /// Run directory, seed and threads.
    #[serde(default)]
    pub run: RunSection,
}

/// Compute precision of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// 32-bit floats everywhere (CPU default).
    #[default]
    F32,
    /// bf16 compute with f32 master weights (CUDA).
    Bf16,
    /// 64-bit floats everywhere (verification against float64 references).
    F64,
}

impl Dtype {
    /// The candle dtype of this precision.
    pub fn candle(self) -> DType {
        match self {
            Dtype::F32 => DType::F32,
            Dtype::Bf16 => DType::BF16,
            Dtype::F64 => DType::F64,
        }
    }
}

/// `[model]`: a Hugging Face Qwen3 directory, or a randomly initialised model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// Directory holding `config.json` and the safetensors weights.
    pub path: Option<PathBuf>,
    /// Compute precision.
    #[serde(default)]
    pub dtype: Dtype,
    /// `cpu`, or `cuda` / `cuda:N` (a binary built with `--features cuda`).
    #[serde(default = "cpu")]
    pub device: String,
    /// Build a random model of this shape instead of loading `path` (demos, tests, benchmarks).
    pub random: Option<RandomModel>,
    /// Recompute each layer's activations in the backward pass instead of keeping them (less
    /// memory, one more forward pass of the layers; the same gradients), as verl's key.
    #[serde(default)]
    pub enable_gradient_checkpointing: bool,
}

fn cpu() -> String {
    "cpu".into()
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            path: None,
            dtype: Dtype::default(),
            device: cpu(),
            random: None,
            enable_gradient_checkpointing: false,
        }
    }
}

/// The shape of a randomly initialised Qwen3 model; absent keys take the tiny test model's values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RandomModel {
    /// Vocabulary size; must exceed every token id of the dataset.
    pub vocab_size: usize,
    /// Hidden size.
    pub hidden_size: usize,
    /// MLP intermediate size.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention).
    pub num_key_value_heads: usize,
    /// Dimension of one head.
    pub head_dim: usize,
    /// Share the embedding matrix with the LM head.
    pub tie_word_embeddings: bool,
    /// Longest sequence (prompt + response) the model accepts.
    pub max_position_embeddings: usize,
    /// Seed of the initialisation.
    pub seed: u64,
}

impl Default for RandomModel {
    fn default() -> Self {
        let t = rlreplay_model::ModelConfig::tiny();
        Self {
            vocab_size: t.vocab_size,
            hidden_size: t.hidden_size,
            intermediate_size: t.intermediate_size,
            num_hidden_layers: t.num_hidden_layers,
            num_attention_heads: t.num_attention_heads,
            num_key_value_heads: t.num_key_value_heads,
            head_dim: t.head_dim,
            tie_word_embeddings: t.tie_word_embeddings,
            max_position_embeddings: t.max_position_embeddings,
            seed: 0,
        }
    }
}

impl RandomModel {
    /// The model configuration of this shape.
    pub fn to_config(&self) -> rlreplay_model::ModelConfig {
        rlreplay_model::ModelConfig {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            num_key_value_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            tie_word_embeddings: self.tie_word_embeddings,
            max_position_embeddings: self.max_position_embeddings,
            ..rlreplay_model::ModelConfig::tiny()
        }
    }
}

/// `[data]`: which rollout dataset, which steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    /// A dataset directory, a directory of shards, one shard or a glob.
    pub path: String,
    /// Trainer steps to replay, `"A..B"` (inclusive); all steps when absent.
    pub steps: Option<String>,
    /// End-of-sequence token id; a response not ending with it is truncated.
    #[serde(default = "default_eos")]
    pub eos_token_id: u32,
    /// Refuse token ids outside the model's vocabulary before training.
    #[serde(default = "default_true")]
    pub vocab_check: bool,
}

/// How the dataset's steps are turned into trainer steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScheduleMode {
    /// Step by step, rows in logged order: the run's own update order.
    #[default]
    Exact,
    /// Each epoch visits the steps in a seeded random order, with groups shuffled inside a step.
    Shuffle,
    /// Trainer step `s` trains on the rollouts of step `s - lag`.
    Lag,
    /// Each trainer step draws its source step from weighted step ranges.
    Mix,
}

/// One weighted step range of a `mix` schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixRange {
    /// Steps `"A..B"` (inclusive).
    pub steps: String,
    /// Relative weight (> 0).
    pub weight: f64,
}

/// `[schedule]`: the order and selection of rollouts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSection {
    /// The schedule mode.
    #[serde(default)]
    pub mode: ScheduleMode,
    /// Seed of every random choice of the schedule.
    #[serde(default)]
    pub seed: u64,
    /// Staleness `k` of the `lag` mode.
    #[serde(default)]
    pub lag: u64,
    /// Keep `k` rollouts per group (seeded choice, logged order kept); 0 keeps all.
    #[serde(default)]
    pub subsample: usize,
    /// Drop groups in which no rollout succeeds (score < 0.5 everywhere).
    #[serde(default)]
    pub drop_solve_none: bool,
    /// Drop groups in which every rollout succeeds (score >= 0.5 everywhere).
    #[serde(default)]
    pub drop_solve_all: bool,
    /// Drop rows whose response does not end with `eos_token_id`.
    #[serde(default)]
    pub drop_truncated: bool,
    /// Passes over the scheduled steps.
    #[serde(default = "default_one")]
    pub epochs: u32,
    /// Weighted step ranges of the `mix` mode.
    #[serde(default)]
    pub mix: Vec<MixRange>,
}

impl Default for ScheduleSection {
    fn default() -> Self {
        Self {
            mode: ScheduleMode::Exact,
            seed: 0,
            lag: 0,
            subsample: 0,
            drop_solve_none: false,
            drop_solve_all: false,
            drop_truncated: false,
            epochs: 1,
            mix: Vec::new(),
        }
    }
}

/// `[rollout]` of a replay: how the logged rollouts were sampled. The key means what it means in
/// `rlreplay train`'s `[rollout]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutSection {
    /// Sampling temperature of the rollouts, the temperature every log-prob is computed at.
    #[serde(default = "default_temperature")]
    pub temperature: f64,
}

impl Default for RolloutSection {
    fn default() -> Self {
        Self {
            temperature: default_temperature(),
        }
    }
}

/// `[algorithm]`: every key of the algorithm layer's configuration.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AlgorithmSection {
    /// The algorithm layer's keys (`adv_estimator`, `loss_mode`, ...), validated by it.
    #[serde(flatten)]
    pub params: toml::Table,
}

impl AlgorithmSection {
    /// The algorithm layer's configuration, refusing what replay cannot provide (a reference
    /// policy for the KL loss).
    pub fn algo_config(&self) -> Result<AlgoConfig> {
        let algo: AlgoConfig = self.params.clone().try_into().context("[algorithm]")?;
        algo.validate().context("[algorithm]")?;
        if algo.use_kl_loss {
            bail!("[algorithm] use_kl_loss = true: replay has no reference policy");
        }
        Ok(algo)
    }
}

/// `[self_distillation]`: teacher contexts and the teacher (used by `rlsd` / `rlrt`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelfDistillationSection {
    /// Trust-region or EMA teacher.
    #[serde(default)]
    pub teacher_regularization: TeacherRegularization,
    /// α of the trust region, or η of the EMA.
    #[serde(default = "default_teacher_rate")]
    pub teacher_update_rate: f64,
    /// Give the teacher the reference answer in the math feedback (`sibling+feedback` mode).
    #[serde(default)]
    pub correctness_feedback: bool,
    /// Teacher-context construction.
    #[serde(flatten)]
    pub context: ContextConfig,
}

fn default_teacher_rate() -> f64 {
    0.1
}

impl Default for SelfDistillationSection {
    fn default() -> Self {
        Self {
            teacher_regularization: TeacherRegularization::TrustRegion,
            teacher_update_rate: default_teacher_rate(),
            correctness_feedback: false,
            context: ContextConfig::default(),
        }
    }
}

impl SelfDistillationSection {
    /// Checks value ranges and the templates (an unknown placeholder is an error here, at load,
    /// instead of a teacher context dropped on every row).
    pub fn validate(&self) -> Result<()> {
        self.context.validate()?;
        if !(0.0..=1.0).contains(&self.teacher_update_rate) {
            bail!(
                "[self_distillation] teacher_update_rate = {}: must lie in [0, 1]",
                self.teacher_update_rate
            );
        }
        if self.context.max_reprompt_len == 0 {
            bail!("[self_distillation] max_reprompt_len must be positive");
        }
        Ok(())
    }
}

/// Whether `loss_mode` needs teacher log-probs (`rlsd` / `rlrt`).
pub fn uses_teacher(algo: &AlgoConfig) -> bool {
    algo.loss_mode.needs_teacher()
}

/// Learning-rate schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LrScheduleKind {
    /// The same rate at every step.
    #[default]
    Constant,
    /// Linear warm-up over `lr_warmup_steps`, then constant.
    Warmup,
    /// Linear warm-up, then cosine decay to `min_lr_ratio · lr` at the last step.
    Cosine,
}

/// `[optim]`: AdamW and the learning-rate schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimSection {
    /// Peak learning rate.
    #[serde(default = "default_lr")]
    pub lr: f64,
    /// Adam betas.
    #[serde(default = "default_betas")]
    pub betas: [f64; 2],
    /// Adam epsilon.
    #[serde(default = "default_eps")]
    pub eps: f64,
    /// Decoupled weight decay (applied to every parameter).
    #[serde(default = "default_weight_decay")]
    pub weight_decay: f64,
    /// Global gradient-norm clip; a non-finite norm skips the step.
    #[serde(default = "default_one_f64")]
    pub grad_clip: f64,
    /// Learning-rate schedule.
    #[serde(default)]
    pub lr_schedule: LrScheduleKind,
    /// Warm-up steps (optimizer steps).
    #[serde(default)]
    pub lr_warmup_steps: u64,
    /// Final rate of the cosine schedule as a fraction of `lr`.
    #[serde(default)]
    pub min_lr_ratio: f64,
}

impl OptimSection {
    /// The learning-rate schedule over `total_steps` optimizer-schedule steps.
    pub fn lr_schedule(&self, total_steps: u64) -> LrSchedule {
        match self.lr_schedule {
            LrScheduleKind::Constant => LrSchedule::Constant { lr: self.lr },
            LrScheduleKind::Warmup => LrSchedule::Warmup {
                lr: self.lr,
                warmup_steps: self.lr_warmup_steps,
            },
            LrScheduleKind::Cosine => LrSchedule::Cosine {
                lr: self.lr,
                warmup_steps: self.lr_warmup_steps,
                total_steps,
                min_lr_ratio: self.min_lr_ratio,
            },
        }
    }

    /// The AdamW settings (gradient clipping included).
    pub fn adamw(&self) -> AdamWConfig {
        AdamWConfig {
            beta1: self.betas[0],
            beta2: self.betas[1],
            eps: self.eps,
            weight_decay: self.weight_decay,
            max_grad_norm: Some(self.grad_clip),
        }
    }
}

impl Default for OptimSection {
    fn default() -> Self {
        Self {
            lr: default_lr(),
            betas: default_betas(),
            eps: default_eps(),
            weight_decay: default_weight_decay(),
            grad_clip: 1.0,
            lr_schedule: LrScheduleKind::Constant,
            lr_warmup_steps: 0,
            min_lr_ratio: 0.0,
        }
    }
}

/// `[batch]`: mini-batches (optimizer steps) and micro-batches (memory).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSection {
    /// Prompts (groups) per optimizer step; the whole trainer step when absent.
    pub ppo_mini_batch_size: Option<usize>,
    /// Passes over each trainer step's mini-batches.
    #[serde(default = "default_one")]
    pub ppo_epochs: u32,
    /// Token budget (prompt + response) of one packed micro-batch.
    #[serde(default = "default_micro_tokens")]
    pub max_tokens_per_micro_batch: usize,
    /// Shuffle the groups of a trainer step before splitting it into mini-batches.
    #[serde(default)]
    pub shuffle: bool,
}

impl Default for BatchSection {
    fn default() -> Self {
        Self {
            ppo_mini_batch_size: None,
            ppo_epochs: 1,
            max_tokens_per_micro_batch: default_micro_tokens(),
            shuffle: false,
        }
    }
}

/// `[checkpoint]`: when to save, how many to keep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSection {
    /// Save every `save_freq` trainer steps (and always at the end); 0 saves only at the end.
    #[serde(default)]
    pub save_freq: u64,
    /// Number of complete checkpoints kept; 0 keeps all.
    #[serde(default = "default_keep")]
    pub keep: usize,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        Self {
            save_freq: 0,
            keep: default_keep(),
        }
    }
}

/// `[run]`: where and how the run executes.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    /// Run directory (`--out` overrides it).
    pub dir: Option<PathBuf>,
    /// Seed of the model initialisation and the trainer's random choices.
    #[serde(default)]
    pub seed: u64,
    /// Worker threads; 0 uses every core.
    #[serde(default)]
    pub threads: usize,
}

fn default_true() -> bool {
    true
}
fn default_one() -> u32 {
    1
}
fn default_one_f64() -> f64 {
    1.0
}
fn default_eos() -> u32 {
    151_643
}
fn default_temperature() -> f64 {
    1.0
}
fn default_lr() -> f64 {
    1e-6
}
fn default_betas() -> [f64; 2] {
    [0.9, 0.999]
}
fn default_eps() -> f64 {
    1e-8
}
fn default_weight_decay() -> f64 {
    0.01
}
fn default_micro_tokens() -> usize {
    16_384
}
fn default_keep() -> usize {
    2
}

impl ReplayConfig {
    /// Reads a configuration file and applies `section.key=value` overrides.
    ///
    /// Values are parsed as TOML (`1e-6`, `true`, `"text"`, `[0.9, 0.95]`); a value that is not
    /// valid TOML is taken as a string, so `--set model.path=/some/dir` works unquoted.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        Self::parse(&text, overrides).with_context(|| format!("in config {}", path.display()))
    }

    /// [`ReplayConfig::load`], with the deprecation warnings of moved keys.
    pub fn load_reporting(path: &Path, overrides: &[String]) -> Result<(Self, Vec<String>)> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        Self::parse_reporting(&text, overrides)
            .with_context(|| format!("in config {}", path.display()))
    }

    /// Parses configuration text and applies overrides (see [`ReplayConfig::load`]).
    pub fn parse(text: &str, overrides: &[String]) -> Result<Self> {
        Ok(Self::parse_reporting(text, overrides)?.0)
    }

    /// [`ReplayConfig::parse`], with the deprecation warnings of moved keys ([`REPLAY_MOVED`]).
    pub fn parse_reporting(text: &str, overrides: &[String]) -> Result<(Self, Vec<String>)> {
        let (edited, warnings) = edit_document(text, overrides, REPLAY_MOVED)?;
        let mut cfg: ReplayConfig = toml::from_str(&edited)?;
        cfg.validate()?;
        // Write every key of the algorithm layer out, defaults included.
        let algo = cfg.algorithm.algo_config()?;
        cfg.algorithm.params = toml::Table::try_from(&algo)?;
        cfg.self_distillation.context.success_reward_threshold = algo.success_reward_threshold;
        Ok((cfg, warnings))
    }

    /// Checks value ranges that the types alone do not express.
    pub fn validate(&self) -> Result<()> {
        if self.model.path.is_none() == self.model.random.is_none() {
            bail!("[model]: give exactly one of `path` and `random`");
        }
        let algo = self.algorithm.algo_config()?;
        if uses_teacher(&algo) && self.model.path.is_none() {
            bail!(
                "[algorithm] loss_mode = {:?} needs [model] path: the teacher contexts are decoded \
                 with the model directory's tokenizer.json",
                algo.loss_mode.name()
            );
        }
        self.self_distillation.validate()?;
        if !(self.rollout.temperature > 0.0 && self.rollout.temperature.is_finite()) {
            bail!(
                "[rollout] temperature = {}: must be a positive number",
                self.rollout.temperature
            );
        }
        let o = &self.optim;
        if !(o.lr >= 0.0 && o.lr.is_finite()) {
            bail!("[optim] lr = {}: must be a non-negative number", o.lr);
        }
        if o.grad_clip.is_nan() || o.grad_clip <= 0.0 {
            bail!("[optim] grad_clip = {}: must be positive", o.grad_clip);
        }
        if o.betas.iter().any(|b| !(0.0..1.0).contains(b)) {
            bail!("[optim] betas = {:?}: each must lie in [0, 1)", o.betas);
        }
        if o.eps.is_nan()
            || o.eps <= 0.0
            || o.weight_decay.is_nan()
            || o.weight_decay < 0.0
            || !(0.0..=1.0).contains(&o.min_lr_ratio)
        {
            bail!("[optim]: eps must be > 0, weight_decay >= 0, min_lr_ratio in [0, 1]");
        }
        if self.batch.ppo_mini_batch_size == Some(0) {
            bail!("[batch] ppo_mini_batch_size = 0: must be at least 1 prompt");
        }
        if self.batch.ppo_epochs == 0 || self.schedule.epochs == 0 {
            bail!("[batch] ppo_epochs and [schedule] epochs must be at least 1");
        }
        if self.batch.max_tokens_per_micro_batch == 0 {
            bail!("[batch] max_tokens_per_micro_batch = 0: must be positive");
        }
        let s = &self.schedule;
        match s.mode {
            ScheduleMode::Mix if s.mix.is_empty() => {
                bail!("[schedule] mode = \"mix\" needs a non-empty `mix` list")
            }
            ScheduleMode::Lag if s.lag == 0 => {
                bail!("[schedule] mode = \"lag\" needs lag >= 1")
            }
            _ => {}
        }
        for (i, m) in s.mix.iter().enumerate() {
            if !(m.weight > 0.0 && m.weight.is_finite()) {
                bail!(
                    "[schedule] mix[{i}].weight = {}: must be positive",
                    m.weight
                );
            }
            parse_steps(&m.steps).with_context(|| format!("[schedule] mix[{i}].steps"))?;
        }
        if let Some(r) = &self.data.steps {
            parse_steps(r).context("[data] steps")?;
        }
        Ok(())
    }

    /// The resolved configuration as TOML text (every default written out).
    pub fn to_toml(&self) -> Result<String> {
        Ok(toml::to_string_pretty(self)?)
    }
}

/// Keys that moved, `(old, new)`, as `section.key`: they keep working for one release, with a
/// warning naming the new key.
pub const REPLAY_MOVED: &[(&str, &str)] = &[
    ("algorithm.temperature", "rollout.temperature"),
    (
        "self_distillation.success_reward_threshold",
        "algorithm.success_reward_threshold",
    ),
];

/// Configuration text with the `--set` overrides applied and the deprecated keys of `moved` in
/// their new places, as TOML text (re-parsed by the caller, so that errors carry the offending
/// key and line), and the deprecation warnings. Both training fronts read their files with it.
pub fn edit_document(
    text: &str,
    overrides: &[String],
    moved: &[(&str, &str)],
) -> Result<(String, Vec<String>)> {
    let mut doc: toml::Table = toml::from_str(text)?;
    for o in overrides {
        apply_override(&mut doc, o)?;
    }
    let warnings = move_deprecated(&mut doc, moved)?;
    Ok((toml::to_string(&doc)?, warnings))
}

/// Moves every deprecated key `old` of `moved` in `doc` to its `new` place and returns one warning
/// for each; both keys set to different values is an error.
pub fn move_deprecated(doc: &mut toml::Table, moved: &[(&str, &str)]) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    for (old, new) in moved {
        let (os, ok) = old.split_once('.').expect("section.key");
        let (ns, nk) = new.split_once('.').expect("section.key");
        let Some(value) = doc
            .get_mut(os)
            .and_then(|t| t.as_table_mut())
            .and_then(|t| t.remove(ok))
        else {
            continue;
        };
        let section = doc
            .entry(ns.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .with_context(|| format!("`{ns}` is not a section"))?;
        match section.get(nk) {
            Some(v) if *v != value => {
                bail!("{old} = {value} and {new} = {v} are both set: keep only {new}")
            }
            _ => {
                section.insert(nk.to_string(), value);
            }
        }
        warnings.push(format!(
            "{old} is deprecated and will be removed in the next release: use {new}"
        ));
    }
    Ok(warnings)
}

/// Parses a step selection (`"A..B"`, inclusive; `"A.."`, `"..B"`, `"A"`).
pub fn parse_steps(s: &str) -> Result<StepRange> {
    s.parse().map_err(anyhow::Error::msg)
}

/// Applies one `--set section.key=value` override to a TOML document. The value is parsed as TOML;
/// text that is not TOML is taken as a string.
pub fn apply_override(doc: &mut toml::Table, spec: &str) -> Result<()> {
    let (key, raw) = spec
        .split_once('=')
        .with_context(|| format!("--set {spec:?}: expected section.key=value"))?;
    let parts: Vec<&str> = key.trim().split('.').collect();
    if parts.len() < 2 || parts.iter().any(|p| p.is_empty()) {
        bail!("--set {spec:?}: expected section.key=value");
    }
    let value = parse_value(raw.trim());
    let mut table = doc;
    for p in &parts[..parts.len() - 1] {
        let entry = table
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = entry
            .as_table_mut()
            .with_context(|| format!("--set {spec:?}: `{p}` is not a section"))?;
    }
    table.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

fn parse_value(raw: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[model]
path = "m"
[data]
path = "d"
"#;

    #[test]
    fn defaults_fill_in() {
        let c = ReplayConfig::parse(BASE, &[]).unwrap();
        assert_eq!(c.optim.lr, 1e-6);
        assert_eq!(c.schedule.mode, ScheduleMode::Exact);
        assert_eq!(c.rollout.temperature, 1.0);
        assert_eq!(c.data.eos_token_id, 151_643);
    }

    #[test]
    fn unknown_key_is_an_error_naming_it() {
        let e = ReplayConfig::parse(&format!("{BASE}\n[optim]\nlrr = 1.0\n"), &[]).unwrap_err();
        assert!(format!("{e:#}").contains("lrr"), "{e:#}");
        let e = ReplayConfig::parse(&format!("{BASE}\n[nosuch]\nx = 1\n"), &[]).unwrap_err();
        assert!(format!("{e:#}").contains("nosuch"), "{e:#}");
    }

    #[test]
    fn overrides_are_typed() {
        let sets = [
            "optim.lr=3e-4".to_string(),
            "schedule.mode=shuffle".to_string(),
            "optim.betas=[0.9, 0.95]".to_string(),
            "algorithm.adv_estimator=maxrl".to_string(),
            "batch.ppo_mini_batch_size=8".to_string(),
        ];
        let c = ReplayConfig::parse(BASE, &sets).unwrap();
        assert_eq!(c.optim.lr, 3e-4);
        assert_eq!(c.optim.betas, [0.9, 0.95]);
        assert_eq!(c.schedule.mode, ScheduleMode::Shuffle);
        assert_eq!(c.batch.ppo_mini_batch_size, Some(8));
        assert_eq!(
            c.algorithm
                .params
                .get("adv_estimator")
                .and_then(|v| v.as_str()),
            Some("maxrl")
        );
        let e = ReplayConfig::parse(BASE, &["optim.lr=fast".to_string()]).unwrap_err();
        assert!(format!("{e:#}").contains("lr"), "{e:#}");
        let e = ReplayConfig::parse(BASE, &["lr=1".to_string()]).unwrap_err();
        assert!(format!("{e:#}").contains("section.key"), "{e:#}");
    }

    #[test]
    fn resolved_config_round_trips() {
        let c = ReplayConfig::parse(
            BASE,
            &[
                "schedule.mode=mix".into(),
                "schedule.mix=[{steps=\"1..2\", weight=1.0}]".into(),
            ],
        )
        .unwrap();
        let back = ReplayConfig::parse(&c.to_toml().unwrap(), &[]).unwrap();
        assert_eq!(c, back);
    }

    /// Guards the one schema: `temperature` lives under `[rollout]` in both fronts, and the one
    /// success threshold is `[algorithm] success_reward_threshold`; the old places keep working
    /// with a warning naming the new key.
    #[test]
    fn moved_keys_warn_and_keep_working() {
        let text = format!(
            "{BASE}\n[algorithm]\ntemperature = 0.7\n\
             [self_distillation]\nsuccess_reward_threshold = 0.8\n"
        );
        let (c, warnings) = ReplayConfig::parse_reporting(&text, &[]).unwrap();
        assert_eq!(c.rollout.temperature, 0.7);
        let algo = c.algorithm.algo_config().unwrap();
        assert_eq!(algo.success_reward_threshold, 0.8);
        assert_eq!(c.self_distillation.context.success_reward_threshold, 0.8);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[0].contains("use rollout.temperature"),
            "{warnings:?}"
        );
        assert!(warnings[1].contains("use algorithm.success_reward_threshold"));
        // The resolved form names only the new keys and reads back without warnings.
        let (back, w) = ReplayConfig::parse_reporting(&c.to_toml().unwrap(), &[]).unwrap();
        assert_eq!(back, c);
        assert!(w.is_empty(), "{w:?}");
        let e = ReplayConfig::parse(
            &format!("{BASE}\n[algorithm]\ntemperature = 0.7\n[rollout]\ntemperature = 0.9\n"),
            &[],
        )
        .unwrap_err();
        assert!(
            format!("{e:#}").contains("keep only rollout.temperature"),
            "{e:#}"
        );
    }

    /// Guards that a template typo is refused at load, not found later as self-distillation
    /// silently off for every row.
    #[test]
    fn template_typos_are_refused_at_load() {
        let e = ReplayConfig::parse(
            &format!(
                "{BASE}\n[self_distillation]\nreprompt_template = \"{{promt}}{{solution}}\"\n"
            ),
            &[],
        )
        .unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains("reprompt_template") && e.contains("{promt}"),
            "{e}"
        );
    }

    #[test]
    fn bad_step_ranges_are_refused() {
        let e = ReplayConfig::parse(BASE, &["data.steps=\"5..4\"".into()]).unwrap_err();
        assert!(format!("{e:#}").contains("[data] steps"), "{e:#}");
    }
}
