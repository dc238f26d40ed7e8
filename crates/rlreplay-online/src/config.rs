//! The `rlreplay train` configuration: one TOML file, unknown keys refused, `section.key=value`
//! overrides, every default written out in the resolved copy.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use rlreplay_algo::AlgoConfig;
pub use rlreplay_train::config::SelfDistillationSection;
use rlreplay_train::config::{edit_document, uses_teacher, Dtype, OptimSection};
pub use rlreplay_train::teacher::TeacherRegularization;
use serde::{Deserialize, Serialize};

use crate::toy::{ToyModel, ToyTask};

/// The whole online-training configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnlineConfig {
    /// The policy to train.
    #[serde(default)]
    pub model: ModelSection,
    /// Training and validation prompts.
    #[serde(default)]
    pub data: DataSection,
    /// The toy arithmetic task (used when `data.task = "toy"`).
    #[serde(default)]
    pub toy: ToyTask,
    /// Sampling of training rollouts.
    #[serde(default)]
    pub rollout: RolloutSection,
    /// Validation mean@k.
    #[serde(default)]
    pub validation: ValidationSection,
    /// The algorithm layer's keys (`adv_estimator`, `loss_mode`, clip ratios, `rollout_is`, ...).
    #[serde(default)]
    pub algorithm: AlgoConfig,
    /// Self-distillation (RLSD teacher): contexts and teacher regularisation.
    #[serde(default)]
    pub self_distillation: SelfDistillationSection,
    /// AdamW and the learning-rate schedule.
    #[serde(default)]
    pub optim: OptimSection,
    /// Batch sizes.
    #[serde(default)]
    pub batch: BatchSection,
    /// Reward dispatch.
    #[serde(default)]
    pub reward: RewardSection,
    /// Steps, checkpoints, seed, threads, run directory.
    #[serde(default)]
    pub trainer: TrainerSection,
}

/// `[model]`: a Hugging Face directory (weights and tokenizer), or a tiny random toy model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// Model directory (config.json, safetensors, tokenizer files); `None` with the toy task.
    pub path: Option<PathBuf>,
    /// Compute dtype.
    pub dtype: Dtype,
    /// `cpu`, or `cuda` / `cuda:N` (a binary built with `--features cuda`).
    pub device: String,
    /// Size of the random toy model (toy task without `path`).
    pub toy: ToyModel,
    /// Seed of the toy model's initialisation.
    pub init_seed: u64,
    /// Supervised warm-up steps of the toy model before RL, on `\boxed{answer}` targets, so a
    /// random model starts from a small but non-zero success rate.
    pub warmup_steps: u64,
    /// Learning rate of the warm-up.
    pub warmup_lr: f64,
    /// Fraction of warm-up targets that carry the correct answer; the others carry an answer
    /// drawn at random from the task's answers (0 teaches the format only).
    pub warmup_correct_fraction: f64,
    /// Recompute each layer's activations in the backward pass (less memory, same gradients).
    pub enable_gradient_checkpointing: bool,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            path: None,
            dtype: Dtype::F32,
            device: "cpu".into(),
            toy: ToyModel::default(),
            init_seed: 0,
            warmup_steps: 0,
            warmup_lr: 3e-3,
            warmup_correct_fraction: 0.0,
            enable_gradient_checkpointing: false,
        }
    }
}

/// `[data]`: where prompts come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataSection {
    /// `toy` (the built-in arithmetic task) or `files`.
    pub task: String,
    /// Training prompts (verl Parquet or JSONL), with `task = "files"`.
    pub train_files: Option<PathBuf>,
    /// Validation prompts, with `task = "files"`.
    pub val_files: Option<PathBuf>,
    /// Keep at most this many training prompts (0 = all).
    pub train_max_samples: usize,
    /// Longest prompt in tokens.
    pub max_prompt_length: usize,
    /// Drop prompts longer than `max_prompt_length` (otherwise they are an error).
    pub filter_overlong_prompts: bool,
    /// Shuffle the training prompts with the seed each epoch.
    pub shuffle: bool,
    /// Qwen3 thinking switch when rendering prompts (`None` = the template's default).
    pub enable_thinking: Option<bool>,
}

impl Default for DataSection {
    fn default() -> Self {
        Self {
            task: "toy".into(),
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

/// `[rollout]`: sampling of training rollouts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutSection {
    /// Rollouts per prompt.
    pub n: usize,
    /// Sampling temperature (also the temperature of every log-prob).
    pub temperature: f64,
    /// Nucleus threshold.
    pub top_p: f64,
    /// Top-k (0 = off).
    pub top_k: usize,
    /// Longest response in tokens; a response that reaches it is marked truncated.
    pub max_response_length: usize,
    /// Sequences decoded at once.
    pub max_batch: usize,
}

impl Default for RolloutSection {
    fn default() -> Self {
        Self {
            n: 8,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_response_length: 8192,
            max_batch: 256,
        }
    }
}

/// `[validation]`: mean@k on the validation prompts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ValidationSection {
    /// Validate every this many steps (0 = never; the last step is always validated when > 0).
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

/// `[batch]`: sizes count prompts (verl semantics).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchSection {
    /// Prompts per step.
    pub train_batch_size: usize,
    /// Prompts per optimizer step (`None` = the whole step).
    pub ppo_mini_batch_size: Option<usize>,
    /// Passes over each step's rollouts.
    pub ppo_epochs: u32,
    /// Token budget of one forward/backward pass.
    pub max_tokens_per_micro_batch: usize,
}

impl Default for BatchSection {
    fn default() -> Self {
        Self {
            train_batch_size: 32,
            ppo_mini_batch_size: None,
            ppo_epochs: 1,
            max_tokens_per_micro_batch: 16_384,
        }
    }
}

/// `[reward]`: which reward function scores each data source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardSection {
    /// Extra `source=kind` rules (kinds: math, maxrl, math-default, mcq).
    pub rules: String,
    /// Time limit of one verification in seconds; a timeout scores 0 and is counted.
    pub timeout_s: f64,
}

impl Default for RewardSection {
    fn default() -> Self {
        Self {
            rules: String::new(),
            timeout_s: 1.0,
        }
    }
}

/// `[trainer]`: the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainerSection {
    /// RL steps.
    pub total_training_steps: u64,
    /// Checkpoint every this many steps (the last step is always saved).
    pub save_freq: u64,
    /// Complete `global_step_N` checkpoints kept (0 = all).
    pub keep: usize,
    /// Seed of the prompt order and of sampling.
    pub seed: u64,
    /// Worker threads (0 = all cores).
    pub threads: usize,
    /// Run directory (`--out` overrides it).
    pub dir: Option<PathBuf>,
}

impl Default for TrainerSection {
    fn default() -> Self {
        Self {
            total_training_steps: 100,
            save_freq: 10,
            keep: 1,
            seed: 0,
            threads: 0,
            dir: None,
        }
    }
}

/// Keys that moved, `(old, new)`: they keep working for one release, with a warning.
pub const ONLINE_MOVED: &[(&str, &str)] = &[(
    "self_distillation.success_reward_threshold",
    "algorithm.success_reward_threshold",
)];

impl OnlineConfig {
    /// Reads a configuration file and applies `section.key=value` overrides (values parsed as
    /// TOML, or taken as strings when they are not valid TOML).
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        Self::parse(&text, overrides).with_context(|| format!("in config {}", path.display()))
    }

    /// Parses configuration text and applies overrides.
    pub fn parse(text: &str, overrides: &[String]) -> Result<Self> {
        Ok(Self::parse_reporting(text, overrides)?.0)
    }

    /// [`OnlineConfig::parse`], with the deprecation warnings of moved keys ([`ONLINE_MOVED`]).
    pub fn parse_reporting(text: &str, overrides: &[String]) -> Result<(Self, Vec<String>)> {
        let (edited, warnings) = edit_document(text, overrides, ONLINE_MOVED)?;
        let mut cfg: OnlineConfig = toml::from_str(&edited)?;
        cfg.self_distillation.context.success_reward_threshold =
            cfg.algorithm.success_reward_threshold;
        cfg.validate()?;
        Ok((cfg, warnings))
    }

    /// Whether the loss needs a teacher (`rlsd` / `rlrt`).
    pub fn uses_teacher(&self) -> bool {
        uses_teacher(&self.algorithm)
    }

    /// Checks what the types alone do not express.
    pub fn validate(&self) -> Result<()> {
        self.algorithm.validate().context("[algorithm]")?;
        match self.data.task.as_str() {
            "toy" => {}
            "files" => {
                if self.data.train_files.is_none() || self.model.path.is_none() {
                    bail!("[data] task = \"files\" needs data.train_files and model.path");
                }
            }
            other => bail!("[data] task = {other:?}: expected \"toy\" or \"files\""),
        }
        let r = &self.rollout;
        if r.n == 0 || r.max_response_length == 0 || r.max_batch == 0 {
            bail!("[rollout] n, max_response_length and max_batch must be at least 1");
        }
        if !(r.temperature > 0.0 && r.temperature.is_finite()) {
            bail!(
                "[rollout] temperature = {}: must be positive",
                r.temperature
            );
        }
        let unit = |x: f64| x > 0.0 && x <= 1.0;
        if !unit(r.top_p) || !unit(self.validation.val_top_p) {
            bail!("[rollout] top_p and [validation] val_top_p must lie in (0, 1]");
        }
        let non_negative = |x: f64| x >= 0.0;
        if self.validation.val_n == 0 || !non_negative(self.validation.val_temperature) {
            bail!("[validation] val_n must be >= 1 and val_temperature >= 0");
        }
        let b = &self.batch;
        if b.train_batch_size == 0 || b.ppo_mini_batch_size == Some(0) || b.ppo_epochs == 0 {
            bail!("[batch] train_batch_size, ppo_mini_batch_size and ppo_epochs must be >= 1");
        }
        if b.max_tokens_per_micro_batch == 0 {
            bail!("[batch] max_tokens_per_micro_batch must be positive");
        }
        self.self_distillation.validate()?;
        let positive = |x: f64| x > 0.0;
        if !positive(self.reward.timeout_s) {
            bail!("[reward] timeout_s must be positive");
        }
        if !non_negative(self.optim.lr) || !positive(self.optim.grad_clip) {
            bail!("[optim] lr must be >= 0 and grad_clip > 0");
        }
        Ok(())
    }

    /// The device named by `[model] device`.
    pub fn device(&self) -> Result<rlreplay_model::Device> {
        rlreplay_model::parse_device(&self.model.device).map_err(|e| anyhow::anyhow!("[model] {e}"))
    }

    /// The resolved configuration as TOML text.
    pub fn to_toml(&self) -> Result<String> {
        Ok(toml::to_string_pretty(self)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_defaults_overrides_and_refuses_unknown_keys() {
        let cfg = OnlineConfig::parse(
            "[algorithm]\nloss_mode = \"rlsd\"\n[self_distillation]\ncontext = \"reference\"\n",
            &["rollout.n=4".into(), "trainer.dir=/tmp/x".into()],
        )
        .unwrap();
        assert_eq!(cfg.rollout.n, 4);
        assert!(cfg.uses_teacher());
        assert_eq!(
            cfg.self_distillation.context.context,
            rlreplay_train::context::ContextMode::Reference
        );
        assert_eq!(cfg.trainer.dir.as_deref(), Some(Path::new("/tmp/x")));
        let again = OnlineConfig::parse(&cfg.to_toml().unwrap(), &[]).unwrap();
        assert_eq!(again, cfg);
        let e = OnlineConfig::parse("[rollout]\nbogus = 1\n", &[]).unwrap_err();
        assert!(format!("{e:#}").contains("bogus"), "{e:#}");
        let e = OnlineConfig::parse("", &["rollout.n=0".into()]).unwrap_err();
        assert!(e.to_string().contains("[rollout]"), "{e}");
        assert!(OnlineConfig::parse("", &["nodot=1".into()]).is_err());
        assert!(matches!(cfg.device().unwrap(), rlreplay_model::Device::Cpu));
        let gpu = OnlineConfig::parse("", &["model.device=\"gpu\"".into()]).unwrap();
        assert!(gpu.device().unwrap_err().to_string().contains("cuda:N"));
    }

    #[test]
    fn presets_parse() {
        let bio = OnlineConfig::parse(include_str!("../../../configs/rlsd-tr-biology.toml"), &[])
            .unwrap();
        assert!(bio.uses_teacher());
        assert_eq!(bio.batch.train_batch_size, 32);
        assert_eq!(bio.batch.ppo_mini_batch_size, Some(8));
        assert_eq!(bio.rollout.n, 8);
        assert_eq!(bio.validation.val_n, 16);
        assert!(!bio.algorithm.norm_adv_by_std_in_grpo);
        assert_eq!(bio.self_distillation.teacher_update_rate, 0.1);
        assert_eq!(bio.algorithm.clip_high(), 0.28);
        let toy =
            OnlineConfig::parse(include_str!("../../../configs/toy-arith.toml"), &[]).unwrap();
        assert_eq!(toy.data.task, "toy");
    }
}
