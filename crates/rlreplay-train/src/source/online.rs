//! The online source: prompts drawn from a prompt set, `n` rollouts each sampled from the policy
//! being trained (in this process, or on inference servers with `[rollout] backend = "remote"`,
//! see [`super::remote`]), scored by the reward dispatch, and written as the step's shard of
//! `RUN_DIR/rollouts` (so an online run is itself a replayable dataset).
//!
//! Every random choice derives from the seed and the step (the prompt order per epoch, one
//! sampling seed per step), so the prompt sampler's position and the reward failure counts are
//! all a resume needs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rlreplay_data::{write_shard, RolloutBatch};
use rlreplay_model::generate::Decoder;
use rlreplay_model::Model;
use rlreplay_reward::RewardDispatch;
use rlreplay_sampling::chat::ChatTokenizer;
use rlreplay_sampling::engine::{generate, Generation};
use rlreplay_sampling::sampling::SamplingParams;
use serde::{Deserialize, Serialize};

use super::remote::{Remote, RemoteSamples};
use super::{RolloutSource, RolloutStep, SourceContext, StepText};
use crate::config::{RolloutBackend, RolloutSection};
use crate::prompts::{reward_of, training_prompts, Prompt, RewardFailure};
use crate::rundir::Metrics;

/// The prompt sampler's position: epoch and index into that epoch's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SamplerState {
    /// Current epoch (0-based).
    pub epoch: u64,
    /// Prompts of the epoch already drawn.
    pub position: usize,
}

/// The online source's part of a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
struct State {
    /// The prompt sampler after the last completed step.
    sampler: SamplerState,
    /// Rewards that failed (errors) so far.
    reward_errors: u64,
    /// Rewards that timed out so far.
    reward_timeouts: u64,
}

/// The seeded order of one epoch's prompts.
fn epoch_order(n: usize, seed: u64, epoch: u64, shuffle: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if shuffle {
        let mut rng =
            rand::rngs::StdRng::seed_from_u64(seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        order.shuffle(&mut rng);
    }
    order
}

/// Draws `count` prompt indices, continuing into the next epoch when one runs out.
pub fn draw_prompts(
    state: &mut SamplerState,
    n: usize,
    count: usize,
    seed: u64,
    shuffle: bool,
) -> Vec<usize> {
    let mut out = Vec::with_capacity(count);
    let mut order = epoch_order(n, seed, state.epoch, shuffle);
    while out.len() < count && n > 0 {
        if state.position >= n {
            state.epoch += 1;
            state.position = 0;
            order = epoch_order(n, seed, state.epoch, shuffle);
        }
        out.push(order[state.position]);
        state.position += 1;
    }
    out
}

/// A seed for one purpose at one trainer step (1: training rollouts, 2: validation).
pub fn step_seed(seed: u64, step: u64, purpose: u64) -> u64 {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (step << 8) ^ purpose);
    rng.random()
}

/// Generation from the policy being trained.
pub struct OnlineSource {
    chat: Arc<ChatTokenizer>,
    prompts: Vec<Prompt>,
    rollout: RolloutSection,
    stop_ids: Vec<u32>,
    train_batch_size: usize,
    shuffle: bool,
    seed: u64,
    rewards: RewardDispatch,
    rollouts: PathBuf,
    /// The inference servers, with `[rollout] backend = "remote"`.
    remote: Option<Remote>,
    state: State,
}

impl OnlineSource {
    /// Reads and encodes the training prompts and sets up the rewards.
    pub fn open(ctx: &SourceContext<'_>) -> Result<Self> {
        let cfg = ctx.config;
        let chat = ctx
            .chat
            .clone()
            .context("the model directory has no tokenizer.json / tokenizer_config.json")?;
        let prompts = training_prompts(cfg, &chat)?;
        if prompts.is_empty() {
            bail!("no training prompt is left after filtering over-long prompts");
        }
        Ok(Self {
            chat,
            prompts,
            rollout: cfg.rollout.clone(),
            stop_ids: ctx.stop_ids.to_vec(),
            train_batch_size: cfg.batch.train_batch_size,
            shuffle: cfg.data.shuffle,
            seed: cfg.trainer.seed,
            rewards: cfg.reward.dispatch()?,
            rollouts: ctx.run_dir.join("rollouts"),
            remote: (cfg.rollout.backend == RolloutBackend::Remote)
                .then(|| Remote::new(&cfg.rollout, ctx.run_dir)),
            state: State::default(),
        })
    }

    /// Training prompts after filtering.
    pub fn prompt_count(&self) -> usize {
        self.prompts.len()
    }
}

impl RolloutSource for OnlineSource {
    fn planned_steps(&self) -> Option<u64> {
        None
    }

    fn start(&mut self, _step: u64, state: Option<serde_json::Value>) -> Result<()> {
        if let Some(state) = state {
            self.state =
                serde_json::from_value(state).context("the online source's checkpoint state")?;
        }
        Ok(())
    }

    fn next_step(&mut self, step: u64, policy: &Model) -> Result<RolloutStep> {
        let mut metrics = Metrics::new();
        let r = &self.rollout;
        let picks = draw_prompts(
            &mut self.state.sampler,
            self.prompts.len(),
            self.train_batch_size,
            self.seed,
            self.shuffle,
        );
        let params = SamplingParams {
            temperature: r.temperature as f32,
            top_p: r.top_p as f32,
            top_k: r.top_k,
            max_new_tokens: r.max_response_length,
            stop_ids: self.stop_ids.clone(),
            seed: step_seed(self.seed, step, 1),
        };
        let ids: Vec<Vec<u32>> = picks.iter().map(|&i| self.prompts[i].ids.clone()).collect();
        let t_gen = Instant::now();
        let (gens, versions) = match &mut self.remote {
            None => {
                let decoder = Decoder::new(policy)?;
                let gens: Vec<Generation> =
                    generate(&decoder, &ids, r.n, &params, r.max_batch, |_| {})?;
                let versions = vec![Some(step - 1); gens.len()];
                (gens, versions)
            }
            Some(remote) => {
                remote.ensure_serving(step - 1, policy)?;
                let RemoteSamples {
                    generations,
                    versions,
                } = remote.generate(&ids, r.n, &params)?;
                (generations, versions)
            }
        };
        metrics.insert("timing_s/gen".into(), t_gen.elapsed().as_secs_f64());
        let mut batch = RolloutBatch::empty(step as i64);
        let mut text = StepText::default();
        let (mut errors, mut timeouts) = (0u64, 0u64);
        for g in &gens {
            let item = &self.prompts[picks[g.prompt]].item;
            let response = self.chat.decode(&g.tokens, true)?;
            let gt = item.ground_truth.as_deref().unwrap_or("");
            let (reward, failure) =
                reward_of(&self.rewards.score(&item.data_source, gt, &response));
            errors += u64::from(failure == Some(RewardFailure::Error));
            timeouts += u64::from(failure == Some(RewardFailure::Timeout));
            batch.push_row(
                &format!("{step}-{}", g.prompt),
                &ids[g.prompt],
                &g.tokens,
                &g.logprobs,
                reward as f32,
                Some(&item.data_source),
                item.ground_truth.as_deref(),
                Some(r.temperature as f32),
                Some(r.top_p as f32),
            );
            text.messages.push(item.messages.clone());
            text.responses.push(response);
        }
        self.state.reward_errors += errors;
        self.state.reward_timeouts += timeouts;
        metrics.insert("reward/errors".into(), errors as f64);
        metrics.insert("reward/timeouts".into(), timeouts as f64);
        metrics.insert(
            "reward/errors_total".into(),
            self.state.reward_errors as f64,
        );
        metrics.insert(
            "reward/timeouts_total".into(),
            self.state.reward_timeouts as f64,
        );
        metrics.insert("train/epoch".into(), self.state.sampler.epoch as f64);
        write_shard(&self.rollouts, &batch).context("writing the step's rollouts")?;
        Ok(RolloutStep {
            truncated: gens.iter().map(|g| g.truncated).collect(),
            policy_versions: versions,
            batch,
            text: Some(text),
            metrics,
            origin: format!("step {step}"),
        })
    }

    fn on_policy_updated(&mut self, version: u64, policy: &Model) -> Result<()> {
        match &mut self.remote {
            // The next step samples from the trainer's own weights.
            None => Ok(()),
            Some(remote) => remote.sync(version, policy),
        }
    }

    fn state(&self) -> serde_json::Value {
        serde_json::json!(self.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_walks_epochs_deterministically() {
        let mut s = SamplerState::default();
        let a = draw_prompts(&mut s, 5, 3, 7, true);
        let b = draw_prompts(&mut s, 5, 3, 7, true);
        assert_eq!(
            s,
            SamplerState {
                epoch: 1,
                position: 1
            }
        );
        let mut first: Vec<usize> = a.iter().chain(&b[..2]).copied().collect();
        first.sort_unstable();
        assert_eq!(first, [0, 1, 2, 3, 4], "one epoch covers every prompt once");
        let mut again = SamplerState::default();
        assert_eq!(draw_prompts(&mut again, 5, 3, 7, true), a);
        let mut plain = SamplerState::default();
        assert_eq!(draw_prompts(&mut plain, 3, 4, 7, false), [0, 1, 2, 0]);
    }
}
