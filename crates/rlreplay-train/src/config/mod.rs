//! The one configuration of both training fronts (`rlreplay replay`, `rlreplay train`): one TOML
//! file, unknown keys refused, `--set section.key=value` overrides parsed as TOML values, keys that
//! moved still read (with a warning naming the new key), and the resolved form saved in the run
//! directory.
//!
//! Every section means the same in both fronts. A few keys belong to one kind of rollout source
//! only ([`SourceKind::keys`]): the logged dataset and its schedule (`[data] path`, `[schedule]`)
//! to replay, the prompt set and its sampling (`[data] train_files`, `[rollout] n`, `[toy]`, ...)
//! to online training; setting one in the other front is an error naming it.
//!
//! The module is a leaf of the crate: the sources, the teacher contexts and the toy task read
//! their settings from it, never the reverse. Here the schema; in `source_kind.rs` the kinds of
//! source and what each needs; in `self_distillation.rs` the `[self_distillation]` section and
//! its template syntax; in `document.rs` the TOML document (the file, the overrides, the moved
//! keys, the resolved form); in `validate.rs` what the types alone do not express; in `runs.rs`
//! the configurations of earlier runs (resume, the replay of an online run).

mod document;
mod runs;
mod self_distillation;
mod source_kind;
#[cfg(test)]
mod tests;
mod validate;

use std::path::{Path, PathBuf};

use rlreplay_algo::AlgoConfig;
use rlreplay_data::StepRange;
use rlreplay_model::{AdamWConfig, DType, LoraConfig, LrSchedule};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub use document::{apply_override, edit_document, move_deprecated, MOVED};
pub use runs::MAY_CHANGE_ON_RESUME;
pub use self_distillation::{
    format_template, ContextConfig, ContextMode, SelfDistillationSection, TeacherRegularization,
    Truncation, FEEDBACK_TEMPLATE, REFERENCE_TEMPLATE, REPROMPT_TEMPLATE, SOLUTION_TEMPLATE,
};
pub use source_kind::SourceKind;

/// The whole configuration of a training run.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The policy to train.
    #[serde(default)]
    pub model: ModelSection,
    /// The training data: a logged rollout dataset (replay) or a prompt set (online), and the
    /// validation prompts.
    #[serde(default)]
    pub data: DataSection,
    /// Which logged rollouts each trainer step consumes, in which order (replay).
    #[serde(default)]
    pub schedule: ScheduleSection,
    /// The toy arithmetic task (online, `[data] task = "toy"`).
    #[serde(default)]
    pub toy: ToyTask,
    /// How rollouts are (or were) sampled.
    #[serde(default)]
    pub rollout: RolloutSection,
    /// Validation mean@k on the validation prompts.
    #[serde(default)]
    pub validation: ValidationSection,
    /// Advantage estimator, policy loss, rollout correction (the keys of `rlreplay compute`).
    #[serde(default)]
    pub algorithm: AlgoConfig,
    /// Self-distillation (`loss_mode = "rlsd"` / `"rlrt"`): teacher contexts and the teacher.
    #[serde(default)]
    pub self_distillation: SelfDistillationSection,
    /// Optimizer and learning-rate schedule.
    #[serde(default)]
    pub optim: OptimSection,
    /// Batch sizes, mini-batches, PPO epochs and micro-batch packing.
    #[serde(default)]
    pub batch: BatchSection,
    /// Reward dispatch (online rollouts and validation).
    #[serde(default)]
    pub reward: RewardSection,
    /// Run length, checkpoints, seed, threads, run directory.
    #[serde(default)]
    pub trainer: TrainerSection,
    /// The kind of rollout source the configuration was read for (not a key: the front decides).
    #[serde(skip)]
    pub source: SourceKind,
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

/// `[model]`: a Hugging Face directory, or a randomly initialised model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// Directory holding `config.json`, the safetensors weights and (for everything that renders
    /// or decodes text) the tokenizer files; or `hf://OWNER/NAME`.
    pub path: Option<PathBuf>,
    /// Compute precision.
    pub dtype: Dtype,
    /// `cpu`, or `cuda` / `cuda:N` (a binary built with `--features cuda`).
    pub device: String,
    /// Build a random model of this shape instead of loading `path` (demos, tests, benchmarks,
    /// the toy task).
    pub random: Option<RandomModel>,
    /// Recompute each layer's activations in the backward pass instead of keeping them (less
    /// memory, one more forward pass of the layers; the same gradients), as verl's key.
    pub enable_gradient_checkpointing: bool,
    /// LoRA rank: above 0, fresh adapters of this rank are trained on the frozen base (PEFT's
    /// initialisation, drawn from `[trainer] seed`); 0 trains every weight.
    pub lora_rank: usize,
    /// LoRA scaling numerator: the adapters' output is scaled by `lora_alpha / lora_rank`.
    pub lora_alpha: f64,
    /// The projections that carry adapters: `"all-linear"` or a list of PEFT module names
    /// (`q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`, `up_proj`, `down_proj`).
    pub target_modules: TargetModules,
    /// LoRA dropout: only 0 (dropout is not implemented).
    pub lora_dropout: f64,
    /// A PEFT adapter directory to start from (its rank, alpha and target modules are used;
    /// `lora_rank`, when set, must match).
    pub adapter: Option<PathBuf>,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            path: None,
            dtype: Dtype::F32,
            device: "cpu".into(),
            random: None,
            enable_gradient_checkpointing: false,
            lora_rank: 0,
            lora_alpha: 16.0,
            target_modules: TargetModules::default(),
            lora_dropout: 0.0,
            adapter: None,
        }
    }
}

/// The hub id a model path names: `hf://OWNER/NAME`, or a hub cache directory
/// (`.../models--OWNER--NAME/snapshots/REV`).
pub fn hub_id(path: &Path) -> Option<String> {
    let text = path.to_string_lossy();
    if let Some(id) = text.strip_prefix("hf://") {
        return Some(id.trim_end_matches('/').to_string());
    }
    path.components().find_map(|c| {
        let c = c.as_os_str().to_str()?;
        let (owner, name) = c.strip_prefix("models--")?.split_once("--")?;
        Some(format!("{owner}/{name}"))
    })
}

/// `[model] target_modules`: one name (`"all-linear"`) or a list of module names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TargetModules {
    /// One name, as `"all-linear"`.
    One(String),
    /// Module names.
    Many(Vec<String>),
}

impl Default for TargetModules {
    fn default() -> Self {
        Self::One("all-linear".into())
    }
}

impl TargetModules {
    /// The names as a list.
    pub fn names(&self) -> Vec<&str> {
        match self {
            Self::One(n) => vec![n.as_str()],
            Self::Many(n) => n.iter().map(String::as_str).collect(),
        }
    }
}

impl ModelSection {
    /// Whether the policy is trained through LoRA adapters (fresh ones or `adapter`).
    pub fn uses_lora(&self) -> bool {
        self.lora_rank > 0 || self.adapter.is_some()
    }

    /// The configuration of fresh adapters (`lora_rank` > 0 and no `adapter`), checked.
    pub fn fresh_lora(&self) -> Result<Option<LoraConfig>> {
        if self.lora_rank == 0 || self.adapter.is_some() {
            return Ok(None);
        }
        let err = |key: &'static str| {
            move |e: rlreplay_model::Error| {
                let name = key.trim_start_matches("model.");
                Error::config(key, format!("[model] {name}: {e}"))
            }
        };
        let mut lora = LoraConfig::new(self.lora_rank, 1.0, &self.target_modules.names())
            .map_err(err("model.target_modules"))?;
        lora.lora_alpha = self.lora_alpha;
        lora.lora_dropout = self.lora_dropout;
        let key = if self.lora_dropout == 0.0 {
            "model.lora_alpha"
        } else {
            "model.lora_dropout"
        };
        lora.validate().map_err(err(key))?;
        Ok(Some(lora))
    }

    /// The base model as a PEFT adapter names it (`base_model_name_or_path`): the hub id of
    /// `path` ([`hub_id`]), else the initial model's directory `model_dir` made absolute, else
    /// empty (a random model).
    pub fn base_model_name(&self, model_dir: Option<&Path>) -> String {
        self.path
            .as_deref()
            .and_then(hub_id)
            .or_else(|| {
                model_dir.map(|d| {
                    std::path::absolute(d)
                        .unwrap_or_else(|_| d.to_path_buf())
                        .display()
                        .to_string()
                })
            })
            .unwrap_or_default()
    }

    /// The device named by `device`.
    pub fn device(&self) -> Result<rlreplay_model::Device> {
        rlreplay_model::parse_device(&self.device)
            .map_err(|e| Error::config("model.device", format!("[model] {e}")))
    }
}

/// A randomly initialised model: Hugging Face `config.json` keys over the tiny test model's
/// ([`rlreplay_model::ModelConfig::tiny`], a Qwen3; `model_type`, `vocab_size`, `hidden_size`,
/// `num_hidden_layers`, ...: [`rlreplay_model::ModelConfig::SETTABLE_KEYS`]) and the seed of the
/// initialisation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RandomModel {
    /// Seed of the initialisation.
    #[serde(default)]
    pub seed: u64,
    /// The `config.json` keys that differ from the tiny model's.
    #[serde(flatten)]
    pub config: serde_json::Map<String, serde_json::Value>,
}

impl RandomModel {
    /// The model configuration: the tiny model's with [`RandomModel::config`]'s keys; an
    /// unknown key or an invalid shape is an error naming it.
    pub fn to_config(&self) -> Result<rlreplay_model::ModelConfig> {
        rlreplay_model::ModelConfig::tiny()
            .with_hf_keys(&self.config)
            .map_err(|e| Error::config("model.random", format!("[model.random] {e}")))
    }

    /// The `vocab_size` key, when given.
    pub fn vocab_size(&self) -> Option<u64> {
        self.config.get("vocab_size").and_then(|v| v.as_u64())
    }
}

/// Token ids in a configuration: one id or a list (as `eos_token_id` in Hugging Face files).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    /// One id.
    One(u32),
    /// Several ids.
    Many(Vec<u32>),
}

impl TokenIds {
    /// The ids as a list.
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }
}

/// Where online training draws its prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// The built-in toy arithmetic task (`[toy]`).
    Toy,
    /// `train_files` (and `val_files`).
    Files,
}

/// `[data]`: the logged rollout dataset (replay) or the prompt set (online), the validation
/// prompts, and the tokens that end a response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataSection {
    /// Replay: a dataset directory, a directory of shards, one shard, a glob, or
    /// `hf://datasets/OWNER/NAME`.
    pub path: Option<String>,
    /// Replay: dataset steps to replay, `"A..B"` (inclusive); all steps when absent.
    pub steps: Option<String>,
    /// Replay: refuse token ids outside the model's vocabulary before training.
    pub vocab_check: bool,
    /// Token ids that end a response: generation stops at them, and a response that does not end
    /// with one was truncated. Absent: the model's (`eos_token_id` of `generation_config.json`
    /// and `config.json`, the tokenizer's `eos_token` and `pad_token`).
    pub eos_token_id: Option<TokenIds>,
    /// Online: `toy` (the built-in arithmetic task) or `files`; absent: `files` when
    /// `train_files` is given, else `toy`.
    pub task: Option<Task>,
    /// Online: training prompts (verl Parquet or JSON lines).
    pub train_files: Option<PathBuf>,
    /// Validation prompts (verl Parquet or JSON lines).
    pub val_files: Option<PathBuf>,
    /// Online: keep at most this many training prompts (0 = all).
    pub train_max_samples: usize,
    /// Longest prompt in tokens.
    pub max_prompt_length: usize,
    /// Drop prompts longer than `max_prompt_length` (otherwise they are an error).
    pub filter_overlong_prompts: bool,
    /// Online: shuffle the training prompts with the seed each epoch.
    pub shuffle: bool,
    /// Qwen3 thinking switch when rendering prompts (`None` = the template's default); the
    /// teacher's unless `[self_distillation] enable_thinking` sets it apart.
    pub enable_thinking: Option<bool>,
}

impl Default for DataSection {
    fn default() -> Self {
        Self {
            path: None,
            steps: None,
            vocab_check: true,
            eos_token_id: None,
            task: None,
            train_files: None,
            val_files: None,
            train_max_samples: 0,
            max_prompt_length: 2048,
            filter_overlong_prompts: true,
            shuffle: true,
            enable_thinking: None,
        }
    }
}

impl DataSection {
    /// The online prompt task: `task`, or `files` when `train_files` is given, else `toy`.
    pub fn task(&self) -> Task {
        self.task.unwrap_or(if self.train_files.is_some() {
            Task::Files
        } else {
            Task::Toy
        })
    }
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
    /// Trainer step `s` trains on the rollouts of step `s - lag` (on its own while no such step
    /// exists), so the policy is `lag` updates ahead of the one that sampled its rows.
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

/// `[schedule]`: the order and selection of logged rollouts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScheduleSection {
    /// The schedule mode.
    pub mode: ScheduleMode,
    /// Seed of every random choice of the schedule.
    pub seed: u64,
    /// Staleness `k` of the `lag` mode.
    pub lag: u64,
    /// Keep `k` rollouts per group (seeded choice, logged order kept); 0 keeps all.
    pub subsample: usize,
    /// Keep this fraction of each step's groups (seeded choice, logged order kept, at least
    /// one), after the group filters; 1 keeps all.
    pub group_fraction: f64,
    /// Drop groups in which no rollout succeeds (every score below
    /// `[algorithm] success_reward_threshold`).
    pub drop_solve_none: bool,
    /// Drop groups in which every rollout succeeds (every score at least the threshold).
    pub drop_solve_all: bool,
    /// Drop rows whose response does not end with an end-of-response token.
    pub drop_truncated: bool,
    /// Passes over the scheduled steps.
    pub epochs: u32,
    /// Weighted step ranges of the `mix` mode.
    pub mix: Vec<MixRange>,
}

impl Default for ScheduleSection {
    fn default() -> Self {
        Self {
            mode: ScheduleMode::Exact,
            seed: 0,
            lag: 0,
            subsample: 0,
            group_fraction: 1.0,
            drop_solve_none: false,
            drop_solve_all: false,
            drop_truncated: false,
            epochs: 1,
            mix: Vec::new(),
        }
    }
}

/// `[rollout]`: how rollouts are sampled (online) or were sampled (replay: `temperature`), and
/// the generation limits of training rollouts and validation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutSection {
    /// Sampling temperature of the rollouts, the temperature every log-prob is computed at.
    pub temperature: f64,
    /// Online: rollouts per prompt.
    pub n: usize,
    /// Online: nucleus threshold.
    pub top_p: f64,
    /// Top-k (0 = off).
    pub top_k: usize,
    /// Longest generated response in tokens; a response that reaches it is truncated.
    pub max_response_length: usize,
    /// Sequences decoded at once.
    pub max_batch: usize,
    /// Online: where generation runs, in this process or on inference servers.
    pub backend: RolloutBackend,
    /// Remote: the servers' base URLs (`http://host:port`); prompts are spread over them.
    pub endpoints: Vec<String>,
    /// Remote: the protocol the servers speak.
    pub protocol: RolloutProtocol,
    /// Remote: how the servers get each new policy.
    pub weight_sync: WeightSync,
    /// Remote, `weight_sync = "disk"`: where each policy version is written as an HF directory
    /// the servers can read (default `RUN_DIR/weights`).
    pub weights_dir: Option<PathBuf>,
    /// Remote: seconds one generation or weight-update request may take.
    pub request_timeout_s: f64,
    /// Remote: attempts on one endpoint after its first failure, before its requests move to
    /// the other endpoints.
    pub retries: u32,
    /// Remote: seconds before the first retry; doubled at each further one.
    pub retry_backoff_s: f64,
    /// Remote: generate this many steps ahead of training (0: synchronous); a row more than
    /// this many versions older than the weights it trains is dropped.
    pub max_off_policy_steps: u64,
    /// Remote: what to do with a sample the servers return that `rlreplay validate` would
    /// refuse (an empty response, a positive log-prob, more tokens than `max_response_length`,
    /// a token id outside the vocabulary).
    pub invalid_samples: InvalidSamples,
}

/// `[rollout] invalid_samples`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InvalidSamples {
    /// Stop the run with an error naming the endpoint, the sample and what is wrong with it.
    #[default]
    Error,
    /// Drop the sample's whole group (groups stay equal in size) and count it
    /// (`rollout/invalid_samples`, `rollout/dropped_invalid_rows`).
    Drop,
}

/// `[rollout] backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RolloutBackend {
    /// Generation in the trainer's process, from its own weights.
    #[default]
    Local,
    /// Generation on inference servers (`rlreplay serve`, vLLM, SGLang).
    Remote,
}

/// `[rollout] protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RolloutProtocol {
    /// vLLM's OpenAI-compatible `POST /v1/completions` with token-id prompts.
    #[default]
    #[serde(alias = "vllm")]
    Openai,
    /// SGLang's native `POST /generate`.
    Sglang,
}

/// `[rollout] weight_sync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightSync {
    /// After each update: the policy as an HF directory under `weights_dir` (a `STABLE` marker
    /// written last), then `POST /update_weights_from_disk` on every endpoint.
    #[default]
    Disk,
    /// The servers keep their weights (rows then carry no policy version).
    None,
}

impl Default for RolloutSection {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            n: 8,
            top_p: 1.0,
            top_k: 0,
            max_response_length: 8192,
            max_batch: 256,
            backend: RolloutBackend::Local,
            endpoints: Vec::new(),
            protocol: RolloutProtocol::Openai,
            weight_sync: WeightSync::Disk,
            weights_dir: None,
            request_timeout_s: 600.0,
            retries: 3,
            retry_backoff_s: 1.0,
            max_off_policy_steps: 0,
            invalid_samples: InvalidSamples::Error,
        }
    }
}

/// `[validation]`: mean@k on the validation prompts (`[data] val_files`, or the toy task's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ValidationSection {
    /// Validate every this many trainer steps (0 = never; the last step is always validated
    /// when > 0).
    pub test_freq: u64,
    /// Samples per validation prompt (k of mean@k).
    pub val_n: usize,
    /// Validation temperature.
    pub val_temperature: f64,
    /// Validation nucleus threshold.
    pub val_top_p: f64,
    /// Also validate the initial policy (step 0).
    pub val_before_train: bool,
}

impl Default for ValidationSection {
    fn default() -> Self {
        Self {
            test_freq: 10,
            val_n: 16,
            val_temperature: 0.6,
            val_top_p: 0.95,
            val_before_train: false,
        }
    }
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
#[serde(deny_unknown_fields, default)]
pub struct OptimSection {
    /// Peak learning rate.
    pub lr: f64,
    /// Adam betas.
    pub betas: [f64; 2],
    /// Adam epsilon.
    pub eps: f64,
    /// Decoupled weight decay (applied to every parameter).
    pub weight_decay: f64,
    /// Global gradient-norm clip; a non-finite norm skips the step.
    pub grad_clip: f64,
    /// Learning-rate schedule.
    pub lr_schedule: LrScheduleKind,
    /// Warm-up steps (trainer steps: the schedule advances once per trainer step).
    pub lr_warmup_steps: u64,
    /// Final rate of the cosine schedule as a fraction of `lr`.
    pub min_lr_ratio: f64,
    /// ZeRO-1 on several data-parallel ranks: each rank keeps the AdamW moments of its share of
    /// the parameters (whole tensors), gradients are reduce-scattered and the updated
    /// parameters all-gathered. The same weights as without it; checkpoints hold the whole
    /// state either way.
    pub shard_optimizer_state: bool,
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
            lr: 1e-6,
            betas: [0.9, 0.999],
            eps: 1e-8,
            weight_decay: 0.01,
            grad_clip: 1.0,
            lr_schedule: LrScheduleKind::Constant,
            lr_warmup_steps: 0,
            min_lr_ratio: 0.0,
            shard_optimizer_state: false,
        }
    }
}

/// `[batch]`: sizes count prompts (verl semantics); mini-batches are optimizer steps,
/// micro-batches bound memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchSection {
    /// Online: prompts per trainer step.
    pub train_batch_size: usize,
    /// Prompts (groups) per optimizer step; the whole trainer step when absent.
    pub ppo_mini_batch_size: Option<usize>,
    /// Passes over each trainer step's mini-batches.
    pub ppo_epochs: u32,
    /// Token budget (prompt + response) of one packed micro-batch.
    pub max_tokens_per_micro_batch: usize,
    /// Shuffle the groups of a trainer step before splitting it into mini-batches.
    pub shuffle: bool,
}

impl Default for BatchSection {
    fn default() -> Self {
        Self {
            train_batch_size: 32,
            ppo_mini_batch_size: None,
            ppo_epochs: 1,
            max_tokens_per_micro_batch: 16_384,
            shuffle: false,
        }
    }
}

/// `[reward]`: which reward function scores each data source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardSection {
    /// Extra `source=kind` rules (kinds: math, maxrl, math-default, math-intent, mcq, number;
    /// `*=kind` for every source without a rule).
    pub rules: String,
    /// Time limit of one verification in seconds; a timeout scores 0 and is counted.
    pub timeout_s: f64,
    /// Online training: the score of a rollout cut at `max_response_length` without a stop
    /// token, whatever its text (absent: graded like any other). An unfinished response has not
    /// answered; graded by its text, a number it passed on the way can score, and the policy
    /// learns to ramble. Validation always grades the text.
    pub truncated_score: Option<f64>,
}

impl Default for RewardSection {
    fn default() -> Self {
        Self {
            rules: String::new(),
            timeout_s: 1.0,
            truncated_score: None,
        }
    }
}

impl RewardSection {
    /// The reward dispatch of these rules and time limit.
    pub fn dispatch(&self) -> Result<rlreplay_reward::RewardDispatch> {
        let mut rewards = rlreplay_reward::RewardDispatch::default()
            .with_rules_str(&self.rules)
            .map_err(|e| Error::config("reward.rules", format!("[reward] rules: {e}")))?;
        rewards.limits.time = std::time::Duration::from_secs_f64(self.timeout_s);
        Ok(rewards)
    }
}

/// Trainer steps of an online run whose configuration leaves `total_training_steps` out.
pub const DEFAULT_ONLINE_STEPS: u64 = 100;

/// `[trainer]`: the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainerSection {
    /// Trainer steps to run; absent: the whole schedule (replay) or
    /// [`DEFAULT_ONLINE_STEPS`] (online, written out in the resolved configuration).
    pub total_training_steps: Option<u64>,
    /// Checkpoint every this many trainer steps (the last step is always saved); 0 saves only
    /// at the end.
    pub save_freq: u64,
    /// Complete `global_step_N` checkpoints kept (0 = all).
    pub keep: usize,
    /// Seed of the trainer's own random choices (prompt order, sampling, group shuffling).
    pub seed: u64,
    /// Worker threads (0 = every core); more than the machine's cores are capped to them, with
    /// a warning, unless `force_threads`.
    pub threads: usize,
    /// Start `threads` worker threads even when the machine has fewer cores.
    pub force_threads: bool,
    /// Run directory (`--out` overrides it).
    pub dir: Option<PathBuf>,
    /// Where each step's metrics go: `console` (a line per step on standard error), `jsonl`
    /// (`RUN_DIR/metrics.jsonl`), `tensorboard` (event files under `RUN_DIR/tensorboard/`).
    pub loggers: Vec<Logger>,
    /// With several data-parallel ranks: seconds a collective waits for the other ranks before
    /// the job is ended with a report naming the ranks that did not arrive.
    pub collective_timeout_s: u64,
}

/// A destination of the per-step metrics (`[trainer] loggers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Logger {
    /// One line per step on standard error (above the progress bar).
    Console,
    /// `RUN_DIR/metrics.jsonl`: one JSON object per step, every metric.
    Jsonl,
    /// TensorBoard event files under `RUN_DIR/tensorboard/`: every metric as a scalar at its
    /// step.
    Tensorboard,
}

impl Default for TrainerSection {
    fn default() -> Self {
        Self {
            total_training_steps: None,
            save_freq: 10,
            keep: 1,
            seed: 0,
            threads: 0,
            force_threads: false,
            dir: None,
            loggers: vec![Logger::Console, Logger::Jsonl],
            collective_timeout_s: rlreplay_dist::DEFAULT_TIMEOUT.as_secs(),
        }
    }
}

/// `[toy]`: the toy arithmetic task (online, `[data] task = "toy"`), from which the toy task's
/// module draws its prompts and makes its initial model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToyTask {
    /// Operands are drawn from `0..=max_operand`.
    pub max_operand: u32,
    /// Operators to use, from `+`, `-` (non-negative results) and `*`.
    pub operators: String,
    /// Number of training prompts (drawn with the seed; duplicates removed).
    pub train_prompts: usize,
    /// Number of validation prompts (disjoint from training when enough distinct prompts exist).
    pub val_prompts: usize,
    /// Seed of the draw.
    pub seed: u64,
    /// Supervised warm-up steps of the random model before RL, on `\boxed{answer}` targets, so a
    /// random model starts from a small but non-zero success rate.
    pub warmup_steps: u64,
    /// Learning rate of the warm-up.
    pub warmup_lr: f64,
    /// Fraction of warm-up targets that carry the correct answer; the others carry an answer
    /// drawn at random from the task's answers (0 teaches the format only).
    pub warmup_correct_fraction: f64,
}

impl Default for ToyTask {
    fn default() -> Self {
        Self {
            max_operand: 4,
            operators: "+".into(),
            train_prompts: 25,
            val_prompts: 25,
            seed: 0,
            warmup_steps: 0,
            warmup_lr: 3e-3,
            warmup_correct_fraction: 0.0,
        }
    }
}

impl ToyTask {
    /// Ids of the toy task's tokenizer: the vocabulary size a `[model.random]` of the toy task
    /// must have.
    pub const VOCAB_SIZE: usize = 103;

    /// Checks the warm-up settings.
    pub fn validate(&self) -> Result<()> {
        let lr_ok = self.warmup_lr.is_finite() && self.warmup_lr >= 0.0;
        if !lr_ok || !(0.0..=1.0).contains(&self.warmup_correct_fraction) {
            return Err(Error::config(
                "toy",
                "[toy] warmup_lr must be >= 0 and warmup_correct_fraction in [0, 1]",
            ));
        }
        Ok(())
    }
}

impl Config {
    /// Whether the loss needs a teacher (`rlsd` / `rlrt`).
    pub fn uses_teacher(&self) -> bool {
        self.algorithm.loss_mode.needs_teacher()
    }

    /// The prompt task the source draws from (`[data] task`); `None` for a source that draws no
    /// prompts.
    pub fn prompt_task(&self) -> Option<Task> {
        self.source.draws_prompts().then(|| self.data.task())
    }
}

/// Parses a step selection (`"A..B"`, inclusive; `"A.."`, `"..B"`, `"A"`).
pub fn parse_steps(s: &str) -> std::result::Result<StepRange, String> {
    s.parse()
}
