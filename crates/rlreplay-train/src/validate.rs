//! Validation mean@k: `val_n` samples of every validation prompt from the policy being trained,
//! scored by the reward dispatch; the mean reward over all of them and per data source (a failed
//! reward scores 0).

use std::collections::BTreeMap;
use std::sync::Arc;

use rlreplay_model::generate::Decoder;
use rlreplay_model::Model;
use rlreplay_reward::RewardDispatch;
use rlreplay_sampling::chat::ChatTokenizer;
use rlreplay_sampling::engine::generate;
use rlreplay_sampling::sampling::SamplingParams;

use crate::config::Config;
use crate::error::Result;
use crate::prompts::{reward_of, Prompt};
use crate::source::online::step_seed;

/// One validation: mean@k over every sample, and per data source.
#[derive(Debug, Clone, PartialEq)]
pub struct Validation {
    /// Mean reward over every sample of every prompt.
    pub mean: f64,
    /// Mean reward per data source.
    pub per_source: BTreeMap<String, f64>,
}

/// Validates a policy on a fixed prompt set.
pub struct Validator {
    chat: Arc<ChatTokenizer>,
    prompts: Vec<Prompt>,
    params: SamplingParams,
    val_n: usize,
    max_batch: usize,
    seed: u64,
    rewards: RewardDispatch,
}

impl Validator {
    /// A validator of `prompts` with the `[validation]`, `[rollout]` limits and `[reward]` of
    /// `cfg`.
    pub fn new(
        cfg: &Config,
        chat: Arc<ChatTokenizer>,
        prompts: Vec<Prompt>,
        stop_ids: &[u32],
    ) -> Result<Self> {
        let v = &cfg.validation;
        Ok(Self {
            chat,
            prompts,
            params: SamplingParams {
                temperature: v.val_temperature as f32,
                top_p: v.val_top_p as f32,
                top_k: cfg.rollout.top_k,
                max_new_tokens: cfg.rollout.max_response_length,
                stop_ids: stop_ids.to_vec(),
                seed: 0,
            },
            val_n: v.val_n,
            max_batch: cfg.rollout.max_batch,
            seed: cfg.trainer.seed,
            rewards: cfg.reward.dispatch()?,
        })
    }

    /// The number of validation prompts.
    pub fn len(&self) -> usize {
        self.prompts.len()
    }

    /// Whether there is no validation prompt.
    pub fn is_empty(&self) -> bool {
        self.prompts.is_empty()
    }

    /// Validates `policy` at trainer step `step` (the step seeds the sampling).
    pub fn run(&self, step: u64, policy: &Model) -> Result<Validation> {
        let params = SamplingParams {
            seed: step_seed(self.seed, step, 2),
            ..self.params.clone()
        };
        let decoder = Decoder::new(policy)?;
        let ids: Vec<Vec<u32>> = self.prompts.iter().map(|p| p.ids.clone()).collect();
        let gens = generate(&decoder, &ids, self.val_n, &params, self.max_batch, |_| {})?;
        let mut sums: BTreeMap<String, (f64, usize)> = BTreeMap::new();
        for g in &gens {
            let item = &self.prompts[g.prompt].item;
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
        Ok(Validation {
            mean: total / gens.len().max(1) as f64,
            per_source,
        })
    }
}
