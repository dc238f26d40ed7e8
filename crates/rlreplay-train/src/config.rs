//! The one configuration of both training fronts (`rlreplay replay`, `rlreplay train`): one TOML
//! file, unknown keys refused, `--set section.key=value` overrides parsed as TOML values, keys that
//! moved still read (with a warning naming the new key), and the resolved form saved in the run
//! directory.
//!
//! Every section means the same in both fronts. A few keys belong to one kind of rollout source
//! only ([`SourceKind::keys`]): the logged dataset and its schedule (`[data] path`, `[schedule]`)
//! to replay, the prompt set and its sampling (`[data] train_files`, `[rollout] n`, `[toy]`, ...)
//! to online training; setting one in the other front is an error naming it.

use std::path::{Path, PathBuf};

use rlreplay_algo::AlgoConfig;
use rlreplay_data::StepRange;
use rlreplay_model::{AdamWConfig, DType, LrSchedule};
use serde::{Deserialize, Serialize};

use crate::context::ContextConfig;
use crate::error::{Error, Result};
use crate::source::SourceKind;
use crate::teacher::TeacherRegularization;
use crate::toy::ToyTask;

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
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            path: None,
            dtype: Dtype::F32,
            device: "cpu".into(),
            random: None,
            enable_gradient_checkpointing: false,
        }
    }
}

impl ModelSection {
    /// The device named by `device`.
    pub fn device(&self) -> Result<rlreplay_model::Device> {
        rlreplay_model::parse_device(&self.device)
            .map_err(|e| Error::config("model.device", format!("[model] {e}")))
    }
}

/// The shape of a randomly initialised Qwen3 model; absent keys take the tiny test model's values
/// (the toy task's vocabulary is its tokenizer's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RandomModel {
    /// Vocabulary size; must exceed every token id of the data.
    pub vocab_size: Option<usize>,
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
            vocab_size: None,
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
        let tiny = rlreplay_model::ModelConfig::tiny();
        rlreplay_model::ModelConfig {
            vocab_size: self.vocab_size.unwrap_or(tiny.vocab_size),
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            num_key_value_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            tie_word_embeddings: self.tie_word_embeddings,
            max_position_embeddings: self.max_position_embeddings,
            ..tiny
        }
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
            return Err(Error::config(
                "self_distillation.teacher_update_rate",
                format!(
                    "[self_distillation] teacher_update_rate = {}: must lie in [0, 1]",
                    self.teacher_update_rate
                ),
            ));
        }
        if self.context.max_reprompt_len == 0 {
            return Err(Error::config(
                "self_distillation.max_reprompt_len",
                "[self_distillation] max_reprompt_len must be positive",
            ));
        }
        Ok(())
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

/// Keys that moved, `(old, new)` as dotted paths: they keep working for one release, with a
/// warning naming the new key. Applied in order (a table moves before keys move into it).
pub const MOVED: &[(&str, &str)] = &[
    ("algorithm.temperature", "rollout.temperature"),
    (
        "self_distillation.success_reward_threshold",
        "algorithm.success_reward_threshold",
    ),
    ("checkpoint.save_freq", "trainer.save_freq"),
    ("checkpoint.keep", "trainer.keep"),
    ("run.dir", "trainer.dir"),
    ("run.seed", "trainer.seed"),
    ("run.threads", "trainer.threads"),
    ("model.toy", "model.random"),
    ("model.init_seed", "model.random.seed"),
    ("model.warmup_steps", "toy.warmup_steps"),
    ("model.warmup_lr", "toy.warmup_lr"),
    (
        "model.warmup_correct_fraction",
        "toy.warmup_correct_fraction",
    ),
];

/// What may differ between the configuration a run started with and the one it resumes with.
pub const MAY_CHANGE_ON_RESUME: &str = "[trainer] save_freq, keep, dir, loggers, \
     collective_timeout_s; [optim] shard_optimizer_state; [rollout] endpoints, request_timeout_s, \
     retries, retry_backoff_s";

impl Config {
    /// Reads a configuration file for a `source` front and applies `section.key=value`
    /// overrides; returns it with the deprecation warnings of moved keys.
    ///
    /// Values are parsed as TOML (`1e-6`, `true`, `"text"`, `[0.9, 0.95]`); a value that is not
    /// valid TOML is taken as a string, so `--set model.path=/some/dir` works unquoted.
    pub fn load(
        path: &Path,
        overrides: &[String],
        source: SourceKind,
    ) -> Result<(Self, Vec<String>)> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::ReadConfig {
            path: path.to_owned(),
            source,
        })?;
        Self::parse_reporting(&text, overrides, source).map_err(|e| Error::InConfig {
            path: path.to_owned(),
            source: Box::new(e),
        })
    }

    /// Parses configuration text for a `source` front and applies overrides (see
    /// [`Config::load`]); deprecation warnings are dropped.
    pub fn parse(text: &str, overrides: &[String], source: SourceKind) -> Result<Self> {
        Ok(Self::parse_reporting(text, overrides, source)?.0)
    }

    /// [`Config::parse`], with the deprecation warnings of moved keys ([`MOVED`]).
    pub fn parse_reporting(
        text: &str,
        overrides: &[String],
        source: SourceKind,
    ) -> Result<(Self, Vec<String>)> {
        let (doc, warnings) = edit_document(text, overrides, MOVED)?;
        for other in SourceKind::ALL.into_iter().filter(|&k| k != source) {
            for key in other.keys() {
                if lookup(&doc, key).is_some() {
                    return Err(Error::config(
                        *key,
                        format!(
                            "`{key}` belongs to `{}`: `{}` does not read it",
                            other.command(),
                            source.command()
                        ),
                    ));
                }
            }
        }
        let mut cfg = typed(text, &doc, overrides)?;
        cfg.source = source;
        cfg.resolve();
        cfg.validate()?;
        Ok((cfg, warnings))
    }

    /// Writes out the defaults that depend on the front and the values other sections copy.
    fn resolve(&mut self) {
        if self.source == SourceKind::Online {
            self.data.task = Some(self.data.task());
            self.trainer.total_training_steps = Some(
                self.trainer
                    .total_training_steps
                    .unwrap_or(DEFAULT_ONLINE_STEPS),
            );
        }
        self.self_distillation.context.success_reward_threshold =
            self.algorithm.success_reward_threshold;
    }

    /// Checks what the types alone do not express.
    pub fn validate(&self) -> Result<()> {
        self.algorithm.validate().map_err(Error::Algorithm)?;
        let algo = &self.algorithm;
        if algo.use_kl_loss {
            return Err(Error::config(
                "algorithm.use_kl_loss",
                "[algorithm] use_kl_loss = true: the trainer has no reference policy",
            ));
        }
        let m = &self.model;
        match (self.source, self.data.task()) {
            (SourceKind::Logged, _) => {
                if m.path.is_none() == m.random.is_none() {
                    return Err(Error::config(
                        "model",
                        "[model]: give exactly one of `path` and `random`",
                    ));
                }
                if self.data.path.is_none() {
                    return Err(Error::config(
                        "data.path",
                        "[data] path: the rollout dataset to replay is missing",
                    ));
                }
            }
            (SourceKind::Online, Task::Files) => {
                if self.data.train_files.is_none() || m.path.is_none() {
                    return Err(Error::config(
                        "data.task",
                        "[data] task = \"files\" needs data.train_files and model.path",
                    ));
                }
                if m.random.is_some() {
                    return Err(Error::config(
                        "model.random",
                        "[model] random: the prompt files need the tokenizer of [model] path",
                    ));
                }
            }
            (SourceKind::Online, Task::Toy) => {
                if m.path.is_some() && m.random.is_some() {
                    return Err(Error::config(
                        "model",
                        "[model]: give at most one of `path` and `random`",
                    ));
                }
                if let (None, Some(v)) = (&m.path, m.random.as_ref().and_then(|r| r.vocab_size)) {
                    let toy = crate::toy::vocab().len();
                    if v != toy {
                        return Err(Error::config(
                            "model.random.vocab_size",
                            format!(
                                "[model.random] vocab_size = {v}: the toy tokenizer has {toy} ids"
                            ),
                        ));
                    }
                }
            }
        }
        if algo.loss_mode.needs_teacher() && m.path.is_none() && self.source == SourceKind::Logged {
            return Err(Error::config("algorithm.loss_mode", format!("[algorithm] loss_mode = {:?} needs [model] path: the teacher contexts are decoded \
                 with the model directory's tokenizer.json",
                algo.loss_mode.name())));
        }
        self.self_distillation.validate()?;
        let r = &self.rollout;
        if !(r.temperature > 0.0 && r.temperature.is_finite()) {
            return Err(Error::config(
                "rollout.temperature",
                format!(
                    "[rollout] temperature = {}: must be a finite positive number",
                    r.temperature
                ),
            ));
        }
        if r.n == 0 || r.max_response_length == 0 || r.max_batch == 0 {
            return Err(Error::config(
                "rollout",
                "[rollout] n, max_response_length and max_batch must be at least 1",
            ));
        }
        if r.backend == RolloutBackend::Remote {
            if r.endpoints.is_empty() {
                return Err(Error::config(
                    "rollout.backend",
                    "[rollout] backend = \"remote\" needs endpoints = [\"http://host:port\", ...]",
                ));
            }
            if let Some(e) = r.endpoints.iter().find(|e| !e.starts_with("http://")) {
                return Err(Error::config(
                    "rollout.endpoints",
                    format!("[rollout] endpoints: {e:?} is not an http:// URL"),
                ));
            }
            let timeout_ok = r.request_timeout_s > 0.0 && r.request_timeout_s.is_finite();
            let backoff_ok = r.retry_backoff_s >= 0.0 && r.retry_backoff_s.is_finite();
            if !(timeout_ok && backoff_ok) {
                return Err(Error::config(
                    "rollout.request_timeout_s",
                    "[rollout] request_timeout_s must be positive and retry_backoff_s >= 0",
                ));
            }
        }
        if r.max_off_policy_steps > 0 && r.backend != RolloutBackend::Remote {
            return Err(Error::config(
                "rollout.max_off_policy_steps",
                format!(
                    "[rollout] max_off_policy_steps = {}: asynchronous generation needs \
                 backend = \"remote\"",
                    r.max_off_policy_steps
                ),
            ));
        }
        let unit = |x: f64| x > 0.0 && x <= 1.0;
        if !unit(r.top_p) || !unit(self.validation.val_top_p) {
            return Err(Error::config(
                "rollout.top_p",
                "[rollout] top_p and [validation] val_top_p must lie in (0, 1]",
            ));
        }
        let v = &self.validation;
        if v.val_n == 0 || v.val_temperature.is_nan() || v.val_temperature < 0.0 {
            return Err(Error::config(
                "validation.val_n",
                "[validation] val_n must be >= 1 and val_temperature >= 0",
            ));
        }
        if self.reward.timeout_s.is_nan() || self.reward.timeout_s <= 0.0 {
            return Err(Error::config(
                "reward.timeout_s",
                "[reward] timeout_s must be positive",
            ));
        }
        if let Some(t) = self.reward.truncated_score.filter(|t| !t.is_finite()) {
            return Err(Error::config(
                "reward.truncated_score",
                format!("[reward] truncated_score = {t}: must be a finite number"),
            ));
        }
        let o = &self.optim;
        if !(o.lr >= 0.0 && o.lr.is_finite()) {
            return Err(Error::config(
                "optim.lr",
                format!(
                    "[optim] lr = {}: must be a finite non-negative number",
                    o.lr
                ),
            ));
        }
        if o.grad_clip.is_nan() || o.grad_clip <= 0.0 {
            return Err(Error::config(
                "optim.grad_clip",
                format!("[optim] grad_clip = {}: must be positive", o.grad_clip),
            ));
        }
        if o.betas.iter().any(|b| !(0.0..1.0).contains(b)) {
            return Err(Error::config(
                "optim.betas",
                format!("[optim] betas = {:?}: each must lie in [0, 1)", o.betas),
            ));
        }
        if o.eps.is_nan()
            || o.eps <= 0.0
            || o.weight_decay.is_nan()
            || o.weight_decay < 0.0
            || !(0.0..=1.0).contains(&o.min_lr_ratio)
        {
            return Err(Error::config(
                "optim",
                "[optim]: eps must be > 0, weight_decay >= 0, min_lr_ratio in [0, 1]",
            ));
        }
        let b = &self.batch;
        if b.train_batch_size == 0 || b.ppo_mini_batch_size == Some(0) {
            return Err(Error::config(
                "batch.train_batch_size",
                "[batch] train_batch_size and ppo_mini_batch_size must be at least 1 prompt",
            ));
        }
        if b.ppo_epochs == 0 || self.schedule.epochs == 0 {
            return Err(Error::config(
                "batch.ppo_epochs",
                "[batch] ppo_epochs and [schedule] epochs must be at least 1",
            ));
        }
        if b.max_tokens_per_micro_batch == 0 {
            return Err(Error::config(
                "batch.max_tokens_per_micro_batch",
                "[batch] max_tokens_per_micro_batch = 0: must be positive",
            ));
        }
        if self.trainer.total_training_steps == Some(0) {
            return Err(Error::config(
                "trainer.total_training_steps",
                "[trainer] total_training_steps = 0: must be at least 1",
            ));
        }
        self.toy.validate()?;
        let s = &self.schedule;
        match s.mode {
            ScheduleMode::Mix if s.mix.is_empty() => {
                return Err(Error::config(
                    "schedule.mode",
                    "[schedule] mode = \"mix\" needs a non-empty `mix` list",
                ))
            }
            ScheduleMode::Lag if s.lag == 0 => {
                return Err(Error::config(
                    "schedule.mode",
                    "[schedule] mode = \"lag\" needs lag >= 1",
                ))
            }
            _ => {}
        }
        if !(s.group_fraction > 0.0 && s.group_fraction <= 1.0) {
            return Err(Error::config(
                "schedule.group_fraction",
                format!(
                    "[schedule] group_fraction = {}: must be in (0, 1]",
                    s.group_fraction
                ),
            ));
        }
        for (i, m) in s.mix.iter().enumerate() {
            if !(m.weight > 0.0 && m.weight.is_finite()) {
                return Err(Error::config(
                    "schedule.mix",
                    format!(
                        "[schedule] mix[{i}].weight = {}: must be a finite positive number",
                        m.weight
                    ),
                ));
            }
            parse_steps(&m.steps).map_err(|e| {
                Error::config("schedule.mix", format!("[schedule] mix[{i}].steps: {e}"))
            })?;
        }
        if let Some(r) = &self.data.steps {
            parse_steps(r)
                .map_err(|e| Error::config("data.steps", format!("[data] steps: {e}")))?;
        }
        Ok(())
    }

    /// The replay configuration of the online run in `run_dir`, as TOML text: the run's
    /// resolved configuration (`RUN_DIR/config.toml`) replaying its logged rollouts
    /// (`RUN_DIR/rollouts`) onto its initial policy (`RUN_DIR/initial` after the toy task's
    /// warm-up, else its `[model]`), with the same algorithm, batches, optimizer, schedule and
    /// seed; the online-only keys are dropped and so is `[trainer] dir`. Replayed with the same
    /// build, it trains the online run's policy bit for bit.
    pub fn replay_of_run(run_dir: &Path) -> Result<String> {
        let rollouts = run_dir.join("rollouts");
        if !rollouts.is_dir() {
            return Err(Error::config(
                "data.path",
                format!(
                    "{}: no rollouts to replay: not the directory of an online run \
                     (`rlreplay train` writes them there)",
                    rollouts.display()
                ),
            ));
        }
        let (mut c, _) = Config::load(&run_dir.join("config.toml"), &[], SourceKind::Online)?;
        c.source = SourceKind::Logged;
        c.data.path = Some(rollouts.display().to_string());
        let initial = run_dir.join("initial");
        if initial.join("model.safetensors").is_file() {
            c.model.path = Some(initial);
            c.model.random = None;
        }
        c.trainer.dir = None;
        c.to_toml()
    }

    /// Whether the loss needs a teacher (`rlsd` / `rlrt`).
    pub fn uses_teacher(&self) -> bool {
        self.algorithm.loss_mode.needs_teacher()
    }

    /// The resolved configuration as TOML text: every default written out, without the keys of
    /// the other kind of source.
    pub fn to_toml(&self) -> Result<String> {
        let mut doc = toml::Table::try_from(self)?;
        for other in SourceKind::ALL.into_iter().filter(|&k| k != self.source) {
            for key in other.keys() {
                remove(&mut doc, key);
            }
        }
        Ok(toml::to_string_pretty(&doc)?)
    }

    /// The configuration as it compares on `--resume`: what may change cleared
    /// ([`MAY_CHANGE_ON_RESUME`]).
    pub fn comparable(&self) -> Self {
        let mut c = self.clone();
        c.trainer.save_freq = 0;
        c.trainer.keep = 0;
        c.trainer.dir = None;
        c.trainer.loggers.clear();
        c.trainer.collective_timeout_s = 0;
        c.optim.shard_optimizer_state = false;
        // Where the inference servers run and how they are reached: servers restarted after a
        // failure come back on other hosts or ports.
        c.rollout.endpoints.clear();
        c.rollout.request_timeout_s = 0.0;
        c.rollout.retries = 0;
        c.rollout.retry_backoff_s = 0.0;
        c
    }
}

/// The configuration of the edited document `doc` (the file `text` with the `overrides` applied).
/// A key or value the schema refuses is reported where it came from: the override that brought
/// it, or the user's own file with its line (line numbers of the edited document would point
/// nowhere in the file).
fn typed(text: &str, doc: &toml::Table, overrides: &[String]) -> Result<Config> {
    let merged = match toml::from_str::<Config>(&toml::to_string(doc)?) {
        Ok(cfg) => return Ok(cfg),
        Err(e) => e,
    };
    // Deserialized from the table rather than from text, an error names its key, not a line.
    let de = |doc: &toml::Table| Config::deserialize(doc.clone());
    let (file, moved) = edit_document(text, &[], MOVED)?;
    if let Err(e) = de(&file) {
        // The file's own text locates the error when no moved key changes it.
        if moved.is_empty() {
            if let Err(own) = toml::from_str::<Config>(text) {
                return Err(own.into());
            }
        }
        return Err(e.into());
    }
    for (i, o) in overrides.iter().enumerate() {
        if let Err(e) = de(&edit_document(text, &overrides[..=i], MOVED)?.0) {
            return Err(Error::Override {
                spec: o.clone(),
                message: e.to_string().trim_end().to_owned(),
            });
        }
    }
    Err(merged.into())
}

/// The value at a dotted `path` of a TOML document.
fn lookup<'a>(doc: &'a toml::Table, path: &str) -> Option<&'a toml::Value> {
    let mut parts = path.split('.');
    let mut cur = doc.get(parts.next()?)?;
    for p in parts {
        cur = cur.as_table()?.get(p)?;
    }
    Some(cur)
}

/// Removes the value at a dotted `path` and returns it; a table left empty by the removal goes
/// too.
fn remove(doc: &mut toml::Table, path: &str) -> Option<toml::Value> {
    match path.split_once('.') {
        None => doc.remove(path),
        Some((head, rest)) => {
            let inner = doc.get_mut(head)?.as_table_mut()?;
            let value = remove(inner, rest);
            if inner.is_empty() {
                doc.remove(head);
            }
            value
        }
    }
}

/// Sets the value at a dotted `path`, creating the tables on the way.
fn insert(doc: &mut toml::Table, path: &str, value: toml::Value) -> Result<()> {
    let mut table = doc;
    let parts: Vec<&str> = path.split('.').collect();
    for p in &parts[..parts.len() - 1] {
        table = table
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .ok_or_else(|| Error::config(*p, format!("`{p}` is not a section")))?;
    }
    table.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

/// Configuration text with the deprecated keys of `moved` in their new places and then the
/// `--set` overrides applied (an override of a deprecated key sets its new key), and the
/// deprecation warnings.
pub fn edit_document(
    text: &str,
    overrides: &[String],
    moved: &[(&str, &str)],
) -> Result<(toml::Table, Vec<String>)> {
    let mut doc: toml::Table = toml::from_str(text)?;
    let mut warnings = move_deprecated(&mut doc, moved)?;
    for o in overrides {
        let spec = match o.split_once('=') {
            Some((key, value)) => match renamed(key.trim(), moved) {
                Some(new) => {
                    warnings.push(deprecation(key.trim(), &new));
                    format!("{new}={value}")
                }
                None => o.clone(),
            },
            None => o.clone(),
        };
        apply_override(&mut doc, &spec)?;
    }
    Ok((doc, warnings))
}

/// The new place of `key` when it is, or lies under, a deprecated key of `moved`.
fn renamed(key: &str, moved: &[(&str, &str)]) -> Option<String> {
    moved.iter().find_map(|(old, new)| {
        if key == *old {
            Some(new.to_string())
        } else {
            key.strip_prefix(old)
                .and_then(|rest| rest.strip_prefix('.'))
                .map(|rest| format!("{new}.{rest}"))
        }
    })
}

fn deprecation(old: &str, new: &str) -> String {
    format!("{old} is deprecated and will be removed in the next release: use {new}")
}

/// Moves every deprecated key `old` of `moved` in `doc` to its `new` place and returns one warning
/// for each; both keys set to different values is an error.
pub fn move_deprecated(doc: &mut toml::Table, moved: &[(&str, &str)]) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    for (old, new) in moved {
        let Some(value) = remove(doc, old) else {
            continue;
        };
        match lookup(doc, new) {
            Some(v) if *v != value => {
                return Err(Error::config(
                    *new,
                    format!("{old} = {value} and {new} = {v} are both set: keep only {new}"),
                ))
            }
            _ => insert(doc, new, value)?,
        }
        warnings.push(deprecation(old, new));
    }
    Ok(warnings)
}

/// Parses a step selection (`"A..B"`, inclusive; `"A.."`, `"..B"`, `"A"`).
pub fn parse_steps(s: &str) -> std::result::Result<StepRange, String> {
    s.parse()
}

/// Applies one `--set section.key=value` override to a TOML document. The value is parsed as TOML;
/// text that is not TOML is taken as a string.
pub fn apply_override(doc: &mut toml::Table, spec: &str) -> Result<()> {
    let (key, raw) = spec.split_once('=').ok_or_else(|| override_syntax(spec))?;
    let key = key.trim();
    if key.split('.').count() < 2 || key.split('.').any(str::is_empty) {
        return Err(override_syntax(spec));
    }
    insert(doc, key, parse_value(raw.trim())).map_err(|e| Error::Override {
        spec: spec.to_owned(),
        message: e.to_string(),
    })
}

/// The error of an override that is not `section.key=value`.
fn override_syntax(spec: &str) -> Error {
    Error::Override {
        spec: spec.to_owned(),
        message: "expected section.key=value".into(),
    }
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
    use rlreplay_data::error::chain;

    const BASE: &str = r#"
[model]
path = "m"
[data]
path = "d"
"#;

    fn replay(text: &str, sets: &[&str]) -> Result<Config> {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        Config::parse(text, &sets, SourceKind::Logged)
    }

    fn online(text: &str, sets: &[&str]) -> Result<Config> {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        Config::parse(text, &sets, SourceKind::Online)
    }

    #[test]
    fn defaults_fill_in() {
        let c = replay(BASE, &[]).unwrap();
        assert_eq!(c.optim.lr, 1e-6);
        assert_eq!(c.schedule.mode, ScheduleMode::Exact);
        assert_eq!(c.rollout.temperature, 1.0);
        assert_eq!(
            c.data.eos_token_id, None,
            "the model's own end-of-response ids"
        );
        assert_eq!(c.trainer.total_training_steps, None, "the whole schedule");
        let o = online("", &[]).unwrap();
        assert_eq!(o.data.task, Some(Task::Toy));
        assert_eq!(o.trainer.total_training_steps, Some(DEFAULT_ONLINE_STEPS));
    }

    #[test]
    fn loggers_are_named_and_may_change_on_resume() {
        let c = replay(BASE, &[]).unwrap();
        assert_eq!(c.trainer.loggers, [Logger::Console, Logger::Jsonl]);
        let o = online(
            "",
            &["trainer.loggers=[\"console\", \"jsonl\", \"tensorboard\"]"],
        )
        .unwrap();
        assert_eq!(
            o.trainer.loggers,
            [Logger::Console, Logger::Jsonl, Logger::Tensorboard]
        );
        let e = replay(BASE, &["trainer.loggers=[\"wandb\"]"]).unwrap_err();
        assert!(chain(&e).contains("wandb"), "{e:?}");
        let mut t = c.clone();
        t.trainer.loggers = vec![Logger::Tensorboard];
        assert_eq!(t.comparable(), c.comparable());
        // Servers restarted on other ports may be named on resume; the protocol may not change.
        let o = online("", &["rollout.endpoints=[\"http://127.0.0.1:1\"]"]).unwrap();
        let mut t = o.clone();
        t.rollout.endpoints = vec!["http://10.0.0.2:8000".into()];
        t.rollout.retries = 7;
        assert_eq!(t.comparable(), o.comparable());
        t.rollout.protocol = RolloutProtocol::Sglang;
        assert_ne!(t.comparable(), o.comparable());
    }

    #[test]
    fn unknown_key_is_an_error_naming_it() {
        let e = replay(&format!("{BASE}\n[optim]\nlrr = 1.0\n"), &[]).unwrap_err();
        assert!(chain(&e).contains("lrr"), "{e:?}");
        let e = replay(&format!("{BASE}\n[nosuch]\nx = 1\n"), &[]).unwrap_err();
        assert!(chain(&e).contains("nosuch"), "{e:?}");
        let e = online("[rollout]\nbogus = 1\n", &[]).unwrap_err();
        assert!(chain(&e).contains("bogus"), "{e:?}");
    }

    #[test]
    fn overrides_are_typed() {
        let c = replay(
            BASE,
            &[
                "optim.lr=3e-4",
                "schedule.mode=shuffle",
                "optim.betas=[0.9, 0.95]",
                "algorithm.adv_estimator=maxrl",
                "batch.ppo_mini_batch_size=8",
                "data.eos_token_id=[1, 2]",
            ],
        )
        .unwrap();
        assert_eq!(c.optim.lr, 3e-4);
        assert_eq!(c.optim.betas, [0.9, 0.95]);
        assert_eq!(c.schedule.mode, ScheduleMode::Shuffle);
        assert_eq!(c.batch.ppo_mini_batch_size, Some(8));
        assert_eq!(c.algorithm.adv_estimator.name(), "maxrl");
        assert_eq!(c.data.eos_token_id, Some(TokenIds::Many(vec![1, 2])));
        let e = replay(BASE, &["optim.lr=fast"]).unwrap_err();
        assert!(chain(&e).contains("lr"), "{e:?}");
        let e = replay(BASE, &["lr=1"]).unwrap_err();
        assert!(chain(&e).contains("section.key"), "{e:?}");
        let e = replay(BASE, &["algorithm.adv_estimator=nope"]).unwrap_err();
        assert!(chain(&e).contains("adv_estimator"), "{e:?}");
    }

    /// A type error is reported where the value came from: an override names itself, not a
    /// line of the edited document; an error in the file quotes the user's own line.
    #[test]
    fn type_errors_name_their_origin() {
        let e = chain(&replay(BASE, &["optim.lr=1e-5", "batch.ppo_epochs=\"two\""]).unwrap_err());
        assert!(
            e.contains("--set \"batch.ppo_epochs=\\\"two\\\"\"") && e.contains("ppo_epochs"),
            "{e}"
        );
        assert!(!e.contains("line"), "{e}");
        // Line 7 of the user's file, whatever the overrides add to the document.
        let text = format!("{BASE}[optim]\nlr = \"fast\"\n");
        let e = chain(&replay(&text, &["trainer.seed=3"]).unwrap_err());
        assert!(e.contains("line 7") && e.contains("lr = \"fast\""), "{e}");
        // With a moved key the file's lines shift: the error names the key instead.
        let text = format!("{BASE}[run]\nseed = 1\n[optim]\nlr = \"fast\"\n");
        let e = chain(&replay(&text, &[]).unwrap_err());
        assert!(e.contains("optim.lr") && e.contains("string"), "{e}");
    }

    #[test]
    fn resolved_config_round_trips() {
        let c = replay(
            BASE,
            &[
                "schedule.mode=mix",
                "schedule.mix=[{steps=\"1..2\", weight=1.0}]",
            ],
        )
        .unwrap();
        let text = c.to_toml().unwrap();
        assert_eq!(replay(&text, &[]).unwrap(), c);
        assert!(!text.contains("train_batch_size"), "{text}");
        let o = online("", &["rollout.n=4", "trainer.dir=/tmp/x"]).unwrap();
        let text = o.to_toml().unwrap();
        assert_eq!(online(&text, &[]).unwrap(), o);
        assert!(!text.contains("[schedule]"), "{text}");
    }

    /// Guards the one schema: a key of one kind of source is refused by the other front, naming
    /// the front that reads it.
    #[test]
    fn keys_of_the_other_source_are_refused() {
        let e = replay(BASE, &["rollout.n=4"]).unwrap_err();
        assert!(
            chain(&e).contains("`rollout.n` belongs to `rlreplay train`"),
            "{e:?}"
        );
        let e = online("[schedule]\nmode = \"lag\"\n", &[]).unwrap_err();
        assert!(
            chain(&e).contains("`schedule` belongs to `rlreplay replay`"),
            "{e:?}"
        );
        let e = online("", &["data.path=/d"]).unwrap_err();
        assert!(chain(&e).contains("data.path"), "{e:?}");
    }

    /// Guards the one schema: keys that moved (`temperature` to `[rollout]`, the one success
    /// threshold to `[algorithm]`, replay's `[checkpoint]` and `[run]` and online's toy-model
    /// keys) keep working with a warning naming the new key.
    #[test]
    fn moved_keys_warn_and_keep_working() {
        let text = format!(
            "{BASE}\n[algorithm]\ntemperature = 0.7\n\
             [self_distillation]\nsuccess_reward_threshold = 0.8\n\
             [checkpoint]\nsave_freq = 3\nkeep = 4\n[run]\nseed = 5\nthreads = 1\n"
        );
        let (c, warnings) = Config::parse_reporting(&text, &[], SourceKind::Logged).unwrap();
        assert_eq!(c.rollout.temperature, 0.7);
        assert_eq!(c.algorithm.success_reward_threshold, 0.8);
        assert_eq!(c.self_distillation.context.success_reward_threshold, 0.8);
        assert_eq!(
            (c.trainer.save_freq, c.trainer.keep, c.trainer.seed),
            (3, 4, 5)
        );
        assert_eq!(c.trainer.threads, 1);
        assert_eq!(warnings.len(), 6, "{warnings:?}");
        assert!(
            warnings[0].contains("algorithm.temperature")
                && warnings[0].contains("use rollout.temperature"),
            "{warnings:?}"
        );
        assert!(warnings[1].contains("use algorithm.success_reward_threshold"));
        assert!(warnings[2].contains("use trainer.save_freq"));
        // The resolved form names only the new keys and reads back without warnings.
        let (back, w) =
            Config::parse_reporting(&c.to_toml().unwrap(), &[], SourceKind::Logged).unwrap();
        assert_eq!(back, c);
        assert!(w.is_empty(), "{w:?}");
        let e = replay(
            &format!("{BASE}\n[algorithm]\ntemperature = 0.7\n[rollout]\ntemperature = 0.9\n"),
            &[],
        )
        .unwrap_err();
        assert!(chain(&e).contains("keep only rollout.temperature"), "{e:?}");
        // An override of a moved key sets the new key over the file's value.
        let (c, w) = Config::parse_reporting(
            &format!("{BASE}\n[trainer]\nsave_freq = 3\n"),
            &["checkpoint.save_freq=5".into(), "run.seed=2".into()],
            SourceKind::Logged,
        )
        .unwrap();
        assert_eq!((c.trainer.save_freq, c.trainer.seed), (5, 2));
        assert!(w[0].contains("use trainer.save_freq"), "{w:?}");
        let (o, w) = Config::parse_reporting(
            "[model]\ninit_seed = 7\nwarmup_steps = 3\n[model.toy]\nhidden_size = 16\n",
            &[],
            SourceKind::Online,
        )
        .unwrap();
        let random = o.model.random.unwrap();
        assert_eq!((random.hidden_size, random.seed), (16, 7));
        assert_eq!(o.toy.warmup_steps, 3);
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[0].contains("use model.random"), "{w:?}");
    }

    /// Guards that a template typo is refused at load, not found later as self-distillation
    /// silently off for every row.
    #[test]
    fn template_typos_are_refused_at_load() {
        type Parse = fn(&str, &[&str]) -> Result<Config>;
        let fronts: [(Parse, &str); 2] = [(replay, BASE), (online, "")];
        for (parse, base) in fronts {
            let e = parse(
                &format!(
                    "{base}\n[self_distillation]\nreprompt_template = \"{{promt}}{{solution}}\"\n"
                ),
                &[],
            )
            .unwrap_err();
            let e = chain(&e);
            assert!(
                e.contains("reprompt_template") && e.contains("{promt}"),
                "{e}"
            );
        }
    }

    #[test]
    fn bad_values_are_refused() {
        let e = replay(BASE, &["data.steps=\"5..4\""]).unwrap_err();
        assert!(chain(&e).contains("[data] steps"), "{e:?}");
        let e = online("", &["rollout.n=0"]).unwrap_err();
        assert!(e.to_string().contains("[rollout]"), "{e}");
        for f in ["0", "1.5", "nan"] {
            let e = replay(BASE, &[&format!("schedule.group_fraction={f}")]).unwrap_err();
            assert!(e.to_string().contains("group_fraction"), "{e}");
        }
        let e = replay(BASE, &["algorithm.use_kl_loss=true"]).unwrap_err();
        assert!(e.to_string().contains("no reference policy"), "{e}");
        let e = online("", &["algorithm.use_kl_loss=true"]).unwrap_err();
        assert!(e.to_string().contains("no reference policy"), "{e}");
        let e = online("", &["data.task=\"files\""]).unwrap_err();
        assert!(e.to_string().contains("train_files"), "{e}");
        let e = online("", &["model.random.vocab_size=7"]).unwrap_err();
        assert!(e.to_string().contains("toy tokenizer"), "{e}");
        let gpu = online("", &["model.device=\"gpu\""]).unwrap();
        assert!(gpu
            .model
            .device()
            .unwrap_err()
            .to_string()
            .contains("cuda:N"));
    }

    #[test]
    fn presets_parse() {
        let bio = online(include_str!("../../../configs/rlsd-tr-biology.toml"), &[]).unwrap();
        assert!(bio.uses_teacher());
        assert_eq!(bio.batch.train_batch_size, 32);
        assert_eq!(bio.batch.ppo_mini_batch_size, Some(8));
        assert_eq!(bio.rollout.n, 8);
        assert_eq!(bio.validation.val_n, 16);
        assert!(!bio.algorithm.norm_adv_by_std_in_grpo);
        assert_eq!(bio.self_distillation.teacher_update_rate, 0.1);
        assert_eq!(bio.algorithm.clip_high(), 0.28);
        let (toy, w) = Config::parse_reporting(
            include_str!("../../../configs/toy-arith.toml"),
            &[],
            SourceKind::Online,
        )
        .unwrap();
        assert_eq!(toy.data.task(), Task::Toy);
        assert!(w.is_empty(), "{w:?}");
        for preset in [
            include_str!("../../../configs/maxrl-polaris.toml"),
            include_str!("../../../configs/demo.toml"),
        ] {
            let (_, w) = Config::parse_reporting(preset, &[], SourceKind::Logged).unwrap();
            assert!(w.is_empty(), "{w:?}");
        }
    }
}
