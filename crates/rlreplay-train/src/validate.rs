//! Validation mean@k: `val_n` samples of every validation prompt from the policy being trained,
//! scored by the reward dispatch; the mean reward over all of them and per data source (a failed
//! reward scores 0). On data-parallel ranks each rank generates and scores its share of the
//! prompts (as the online source shares a step's groups, [`crate::source::share`]) and the
//! rewards are gathered in prompt order, so every rank computes the numbers one process does.

use std::collections::BTreeMap;
use std::sync::Arc;

use rlreplay_dist::Collective;
use rlreplay_model::generate::Decoder;
use rlreplay_model::Model;
use rlreplay_reward::RewardDispatch;
use rlreplay_sampling::chat::ChatTokenizer;
use rlreplay_sampling::engine::generate_part;
use rlreplay_sampling::sampling::SamplingParams;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::prompts::{reward_of, Prompt};
use crate::source::online::step_seed;
use crate::source::share;

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

    /// Validates `policy` at trainer step `step` (the step seeds the sampling) on `comm`'s ranks;
    /// every rank calls it and gets the same result.
    pub fn run(&self, step: u64, policy: &Model, comm: &dyn Collective) -> Result<Validation> {
        let params = SamplingParams {
            seed: step_seed(self.seed, step, 2),
            ..self.params.clone()
        };
        let lens: Vec<usize> = self.prompts.iter().map(|p| p.ids.len()).collect();
        let max_new = params.max_new_tokens;
        let mine = share::split(&lens, self.val_n, max_new, comm.world(), comm.rank());
        let ids: Vec<Vec<u32>> = self.prompts[mine.clone()]
            .iter()
            .map(|p| p.ids.clone())
            .collect();
        let mut rewards = Vec::new();
        if !ids.is_empty() {
            let decoder = Decoder::new(policy)?;
            let gens = generate_part(
                &decoder,
                &ids,
                mine.start,
                self.val_n,
                &params,
                self.max_batch,
                |_| {},
            )?;
            for g in &gens {
                let item = &self.prompts[mine.start + g.prompt].item;
                let text = self.chat.decode(&g.tokens, true)?;
                let gt = item.ground_truth.as_deref().unwrap_or("");
                rewards.push(reward_of(&self.rewards.score(&item.data_source, gt, &text)).0);
            }
        }
        // Prompt-major on every rank, the ranks' prompts in order: row `i` is of prompt
        // `i / val_n`.
        let rewards = share::share_f64(comm, rewards)?;
        if rewards.len() != self.prompts.len() * self.val_n {
            return Err(Error::Ranks(format!(
                "validation gathered {} rewards for {} prompts of {} samples",
                rewards.len(),
                self.prompts.len(),
                self.val_n
            )));
        }
        let mut sums: BTreeMap<String, (f64, usize)> = BTreeMap::new();
        for (i, r) in rewards.iter().enumerate() {
            let item = &self.prompts[i / self.val_n].item;
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
            mean: total / rewards.len().max(1) as f64,
            per_source,
        })
    }
}
