//! `rlreplay generate`: sample completions of a prompt set into a rollout shard.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use rlreplay_data::{RolloutBatch, ShardWriter, StopIds};
use rlreplay_eval::dataset::{read_prompts, PromptItem};
use rlreplay_eval::pipeline::{score_generations, Policy};
use rlreplay_eval::scoring::Scorer;
use rlreplay_model::{parse_device, DType};
use rlreplay_reward::RewardDispatch;
use rlreplay_sampling::chat::{ChatOptions, ChatTokenizer};
use rlreplay_sampling::engine::{generate, Generation};
use rlreplay_sampling::sampling::SamplingParams;

/// Options shared by `generate` and `eval`: model, tokenizer, sampling and batching.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Hugging Face model directory (config.json, safetensors; Qwen3, Qwen2 or Llama).
    #[arg(long)]
    pub model: PathBuf,
    /// A PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) applied to
    /// the model.
    #[arg(long, value_name = "DIR")]
    pub adapter: Option<PathBuf>,
    /// Directory with tokenizer.json and tokenizer_config.json (default: the model directory).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Maximum number of generated tokens per response.
    #[arg(long, default_value_t = 1024)]
    pub max_new_tokens: usize,
    /// Keep only the k most likely tokens (0: off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Seed of the per-sequence random streams.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop token ids (comma-separated) [the model's: `eos_token_id` of generation_config.json and
    /// config.json, the tokenizer's `eos_token` and `pad_token`].
    #[arg(long, value_delimiter = ',')]
    pub stop_ids: Option<Vec<u32>>,
    /// Render prompts with `enable_thinking=false` (Qwen3's empty think block).
    #[arg(long)]
    pub no_thinking: bool,
    /// Sequences decoded together.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Compute dtype: f32 or bf16.
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    pub dtype: DType,
    /// Device: cpu, cuda or cuda:N (CUDA needs a binary built with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Reward rules `source=kind,...` added to the defaults (kinds: math, maxrl, math-default,
    /// math-intent, mcq, number; sciknoweval, mmlu, sciq, arc_challenge, arc_easy and openbookqa
    /// are mcq, basic_arithmetic is number, every other source the MaxRL math reward; `*=kind`
    /// changes that fallback).
    #[arg(long, default_value = "")]
    pub reward_rules: String,
}

pub(crate) fn parse_dtype(s: &str) -> Result<DType, String> {
    match s {
        "f32" => Ok(DType::F32),
        "bf16" => Ok(DType::BF16),
        other => Err(format!("unsupported dtype `{other}` (f32 or bf16)")),
    }
}

impl SamplingArgs {
    /// The sampling settings for `temperature` and `top_p`; without `--stop-ids` the stop ids are
    /// filled in by [`SamplingArgs::sample`] from the model's directories.
    pub fn params(&self, temperature: f32, top_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p,
            top_k: self.top_k,
            max_new_tokens: self.max_new_tokens,
            stop_ids: self.stop_ids.clone().unwrap_or_default(),
            seed: self.seed,
        }
    }

    /// The ids the model directory (and the tokenizer directory) name as ends of a response.
    fn model_stop_ids(&self, chat: &ChatTokenizer) -> Result<Vec<u32>> {
        let mut ids = rlreplay_sampling::stop_ids(&self.model, Some(&chat.tokenizer))?;
        if let Some(dir) = &self.tokenizer {
            for id in rlreplay_sampling::stop_ids(dir, Some(&chat.tokenizer))? {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        if ids.is_empty() {
            anyhow::bail!(
                "{}: the model names no end-of-sequence token (eos_token_id in config.json or \
                 generation_config.json, eos_token in tokenizer_config.json); pass --stop-ids",
                self.model.display()
            );
        }
        Ok(ids)
    }

    /// Chat rendering options.
    pub fn chat_options(&self) -> ChatOptions {
        ChatOptions {
            add_generation_prompt: true,
            enable_thinking: self.no_thinking.then_some(false),
        }
    }

    /// The reward scorer.
    pub fn scorer(&self) -> Result<Scorer> {
        let dispatch = RewardDispatch::default()
            .with_rules_str(&self.reward_rules)
            .map_err(anyhow::Error::msg)?;
        Ok(Scorer { dispatch })
    }

    /// Loads the policy, encodes the prompts and samples `n` completions of every prompt, with a
    /// progress bar labelled `what`; generations come back prompt-major.
    pub fn sample(
        &self,
        items: &[PromptItem],
        n: usize,
        params: &mut SamplingParams,
        what: &str,
    ) -> Result<Sampled> {
        let device = parse_device(&self.device).context("--device")?;
        let policy = Policy::load(
            &self.model,
            self.adapter.as_deref(),
            self.tokenizer.as_deref(),
            self.dtype,
            &device,
        )?;
        super::warn_non_finite(&self.model, &policy.non_finite_weights);
        if self.stop_ids.is_none() {
            params.stop_ids = self.model_stop_ids(&policy.chat)?;
        }
        let encoded = policy.encode(items, self.chat_options())?;
        let bar = progress_bar(items.len() * n, what);
        let gens = generate(&policy.decoder, &encoded, n, params, self.batch, |_| {
            bar.inc(1)
        })?;
        bar.finish_and_clear();
        Ok(Sampled {
            policy,
            encoded,
            gens,
        })
    }
}

/// What [`SamplingArgs::sample`] returns.
pub struct Sampled {
    /// The loaded policy.
    pub policy: Policy,
    /// The chat-templated prompt ids, one per prompt.
    pub encoded: Vec<Vec<u32>>,
    /// The completions, prompt-major.
    pub gens: Vec<Generation>,
}

/// A progress bar over `total` completions on stderr.
fn progress_bar(total: usize, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{elapsed_precise}] {wide_bar} {pos}/{len} (eta {eta})",
        )
        .expect("static progress template"),
    );
    bar.set_message(what.to_owned());
    bar
}

/// Arguments of `rlreplay generate`.
#[derive(clap::Args)]
pub struct Args {
    /// Prompts: JSON lines (`prompt` as text or chat messages; optional `data_source`,
    /// `ground_truth`/`reward_model.ground_truth`) or a verl Parquet file.
    #[arg(long)]
    prompts: PathBuf,
    /// Completions per prompt.
    #[arg(long, default_value_t = 1)]
    n: usize,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    /// Nucleus-sampling mass (1: off).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Output directory of the rollout shard.
    #[arg(long, default_value = "rollouts")]
    out: PathBuf,
    /// Trainer step recorded in the shard (its file name).
    #[arg(long, default_value_t = 0)]
    step: i64,
    /// Do not score responses even when prompts have a ground truth.
    #[arg(long)]
    no_reward: bool,
    #[command(flatten)]
    sampling: SamplingArgs,
}

/// Runs `rlreplay generate`.
pub fn run(args: Args) -> Result<ExitCode> {
    let mut params = args.sampling.params(args.temperature, args.top_p);
    params.validate()?;
    let items = read_prompts(&args.prompts)?;
    let Sampled {
        policy,
        encoded,
        gens,
    } = args
        .sampling
        .sample(&items, args.n, &mut params, "generate")?;
    let scorer = if args.no_reward {
        None
    } else {
        Some(args.sampling.scorer()?)
    };
    let samples = score_generations(&policy.chat, &items, gens, scorer.as_ref())?;
    let mut batch = RolloutBatch::empty(args.step);
    let (mut scored, mut truncated, mut tokens, mut reward_sum) = (0usize, 0usize, 0usize, 0.0);
    for s in &samples {
        let g = &s.generation;
        let item = &items[g.prompt];
        scored += usize::from(s.reward.is_some());
        truncated += usize::from(g.truncated);
        tokens += g.tokens.len();
        reward_sum += s.reward.unwrap_or(0.0);
        batch.push_row(
            &format!("{}-{}", args.sampling.seed, item.index),
            &encoded[g.prompt],
            &g.tokens,
            &g.logprobs,
            s.reward.unwrap_or(0.0) as f32,
            Some(&item.data_source),
            item.ground_truth.as_deref(),
            Some(args.temperature),
            Some(args.top_p),
        );
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let from = match &args.sampling.stop_ids {
        Some(_) => "--stop-ids".to_string(),
        None => args.sampling.model.display().to_string(),
    };
    let path = ShardWriter::new(&args.out)
        .stop_ids(StopIds::new(params.stop_ids.clone(), from))
        .write(&batch)?;
    eprintln!(
        "wrote {} rows ({} prompts x {}) to {}: {tokens} response tokens, {truncated} truncated, \
         {scored} scored{}",
        samples.len(),
        items.len(),
        args.n,
        path.display(),
        if scored > 0 {
            format!(", mean reward {:.4}", reward_sum / scored as f64)
        } else {
            String::new()
        }
    );
    Ok(ExitCode::SUCCESS)
}
