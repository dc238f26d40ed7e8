//! The online source: prompts drawn from a prompt set, `n` rollouts each sampled from the policy
//! being trained (in this process, or on inference servers with `[rollout] backend = "remote"`,
//! see [`super::remote`]), scored by the reward dispatch, and written as the step's shard of
//! `RUN_DIR/rollouts` (so an online run is itself a replayable dataset).
//!
//! Every random choice derives from the seed and the step (the prompt order per epoch, one
//! sampling seed per step), so the prompt sampler's position and the reward failure counts are
//! all a resume needs.
//!
//! **Asynchronous RL** (remote only, `[rollout] max_off_policy_steps = k > 0`): the prompts of
//! steps `t + 1 ..= t + k` are sent to the servers before step `t` trains, so their generation
//! overlaps the update; the servers finish requests in flight on the weights they had, so a row
//! of step `t` comes from version `t - 1 - k` at the oldest. A row more than `k` versions older
//! than the weights it trains (`t - 1`) is dropped and counted (`rollout/dropped_stale_rows`);
//! the rest are corrected against their logged behaviour log-probs by the `[algorithm]`
//! rollout-correction settings. `timing_s/gen` is the generation of the step's rows,
//! `timing_s/gen_wait` the part of it the trainer waited for, `timing_s/gen_overlap` the
//! fraction it did not wait for. A resume starts generating afresh from the checkpoint's
//! weights (generations in flight are not checkpointed), so its rows are fresher than those of
//! an uninterrupted run from that point.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rlreplay_data::{RolloutBatch, ShardWriter, StopIds};
use rlreplay_dist::wire::{Reader, Writer};
use rlreplay_dist::Collective;
use rlreplay_model::generate::Decoder;
use rlreplay_model::Model;
use rlreplay_reward::RewardDispatch;
use rlreplay_sampling::chat::ChatTokenizer;
use rlreplay_sampling::engine::{generate_part, Generation};
use rlreplay_sampling::sampling::SamplingParams;
use serde::{Deserialize, Serialize};

use super::remote::{Remote, RemoteSamples};
use super::share::{self, Scored};
use super::{RolloutSource, RolloutStep, SourceContext, StepText};
use crate::config::{Config, RolloutBackend, RolloutSection};
use crate::error::{Error, Result};
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

/// A step whose generation was sent to the servers ahead of its training.
struct Pending {
    step: u64,
    picks: Vec<usize>,
    /// The prompt sampler after this step's draw.
    sampler: SamplerState,
    /// The samples and the seconds their generation took.
    samples: JoinHandle<Result<(RemoteSamples, f64)>>,
}

/// Generation from the policy being trained.
pub struct OnlineSource {
    chat: Arc<ChatTokenizer>,
    prompts: Vec<Prompt>,
    rollout: RolloutSection,
    stop_ids: Vec<u32>,
    /// The stop ids as every rollout shard names them.
    stop: StopIds,
    train_batch_size: usize,
    shuffle: bool,
    seed: u64,
    rewards: RewardDispatch,
    /// `[reward] truncated_score`: the score of a truncated rollout.
    truncated_score: Option<f64>,
    rollouts: PathBuf,
    /// The inference servers, with `[rollout] backend = "remote"`.
    remote: Option<Arc<Remote>>,
    /// Remote: steps sent ahead, oldest first.
    pending: VecDeque<Pending>,
    /// Remote: the prompt sampler after the last step sent.
    ahead: SamplerState,
    /// Seconds the last weight sync took.
    sync_s: Option<f64>,
    state: State,
    /// The data-parallel ranks: each generates its share of a step's groups in process; rank 0
    /// alone talks to the inference servers.
    comm: Rc<dyn Collective>,
}

/// What named the stop ids, as the rollout shards record it.
fn stop_from(cfg: &Config) -> String {
    match (&cfg.data.eos_token_id, &cfg.model.path) {
        (Some(_), _) => "[data] eos_token_id".into(),
        (None, Some(p)) => p.display().to_string(),
        (None, None) => "the run's initial model".into(),
    }
}

impl OnlineSource {
    /// Reads and encodes the training prompts and sets up the rewards.
    pub fn open(ctx: &SourceContext<'_>) -> Result<Self> {
        let cfg = ctx.config;
        let chat = ctx.chat.clone().ok_or_else(|| {
            Error::NoTokenizer(
                "the model directory has no tokenizer.json / tokenizer_config.json".into(),
            )
        })?;
        let prompts = training_prompts(cfg, &chat)?;
        if prompts.is_empty() {
            return Err(Error::NoPrompts);
        }
        Ok(Self {
            chat,
            prompts,
            rollout: cfg.rollout.clone(),
            stop_ids: ctx.stop_ids.to_vec(),
            stop: StopIds::new(ctx.stop_ids, stop_from(cfg)),
            train_batch_size: cfg.batch.train_batch_size,
            shuffle: cfg.data.shuffle,
            seed: cfg.trainer.seed,
            rewards: cfg.reward.dispatch()?,
            truncated_score: cfg.reward.truncated_score,
            rollouts: ctx.run_dir.join("rollouts"),
            remote: (cfg.rollout.backend == RolloutBackend::Remote)
                .then(|| Arc::new(Remote::new(&cfg.rollout, ctx.run_dir, ctx.vocab_size))),
            pending: VecDeque::new(),
            ahead: SamplerState::default(),
            sync_s: None,
            state: State::default(),
            comm: ctx.comm.clone(),
        })
    }

    /// The sampling settings of step `step`.
    fn params(&self, step: u64) -> SamplingParams {
        let r = &self.rollout;
        SamplingParams {
            temperature: r.temperature as f32,
            top_p: r.top_p as f32,
            top_k: r.top_k,
            max_new_tokens: r.max_response_length,
            stop_ids: self.stop_ids.clone(),
            seed: step_seed(self.seed, step, 1),
        }
    }

    /// Sends step `step`'s prompts to the servers.
    fn send_ahead(&mut self, remote: &Arc<Remote>, step: u64) {
        let picks = draw_prompts(
            &mut self.ahead,
            self.prompts.len(),
            self.train_batch_size,
            self.seed,
            self.shuffle,
        );
        let prompts: Vec<Vec<u32>> = picks.iter().map(|&i| self.prompts[i].ids.clone()).collect();
        let (remote, n, params) = (remote.clone(), self.rollout.n, self.params(step));
        let samples = std::thread::spawn(move || {
            let t = Instant::now();
            let s = remote.generate(&prompts, n, &params)?;
            Ok((s, t.elapsed().as_secs_f64()))
        });
        self.pending.push_back(Pending {
            step,
            picks,
            sampler: self.ahead,
            samples,
        });
    }

    /// Scores `gens` (`prompt`: the index into `picks`), generated by `versions`; the time it
    /// takes (decoding and rewards) is `timing_s/reward`.
    fn score(
        &self,
        picks: &[usize],
        gens: Vec<Generation>,
        versions: Vec<Option<u64>>,
        metrics: &mut Metrics,
    ) -> Result<Vec<Scored>> {
        let started = Instant::now();
        let scored = gens
            .into_iter()
            .zip(versions)
            .map(|(generation, version)| {
                let item = &self.prompts[picks[generation.prompt]].item;
                let response = self.chat.decode(&generation.tokens, true)?;
                let gt = item.ground_truth.as_deref().unwrap_or("");
                let (reward, failure) = match self.truncated_score {
                    Some(score) if generation.truncated => (score, None),
                    _ => reward_of(&self.rewards.score(&item.data_source, gt, &response)),
                };
                Ok(Scored {
                    generation,
                    version,
                    reward,
                    failure,
                    response,
                })
            })
            .collect();
        metrics.insert("timing_s/reward".into(), started.elapsed().as_secs_f64());
        scored
    }

    /// Step `step`'s rows sampled from `policy` in this process: every rank draws the same
    /// prompts, generates and scores its share of the groups ([`share::split`]), and the ranks
    /// exchange the scored rows. Returns the prompts and every row, in prompt-major order.
    fn generate_here(
        &mut self,
        step: u64,
        policy: &Model,
        metrics: &mut Metrics,
    ) -> Result<(Vec<usize>, Vec<Scored>)> {
        let r = &self.rollout;
        let picks = draw_prompts(
            &mut self.state.sampler,
            self.prompts.len(),
            self.train_batch_size,
            self.seed,
            self.shuffle,
        );
        let lens: Vec<usize> = picks.iter().map(|&i| self.prompts[i].ids.len()).collect();
        let (world, rank) = (self.comm.world(), self.comm.rank());
        let mine = share::split(&lens, r.n, r.max_response_length, world, rank);
        let ids: Vec<Vec<u32>> = picks[mine.clone()]
            .iter()
            .map(|&i| self.prompts[i].ids.clone())
            .collect();
        let t_gen = Instant::now();
        let mut gens = Vec::new();
        if !ids.is_empty() {
            let decoder = Decoder::new(policy)?;
            let params = self.params(step);
            gens = generate_part(
                &decoder,
                &ids,
                mine.start,
                r.n,
                &params,
                r.max_batch,
                |_| {},
            )?;
        }
        metrics.insert("timing_s/gen".into(), t_gen.elapsed().as_secs_f64());
        metrics.insert("rollout/dropped_stale_rows".into(), 0.0);
        metrics.insert("rollout/invalid_samples".into(), 0.0);
        metrics.insert("rollout/dropped_invalid_rows".into(), 0.0);
        for g in &mut gens {
            g.prompt += mine.start;
        }
        let versions = vec![Some(step - 1); gens.len()];
        let scored = self.score(&picks, gens, versions, metrics)?;
        let (rows, _) = share::share(&*self.comm, scored, &[])?;
        Ok((picks, rows))
    }

    /// Step `step`'s rows from the inference servers: rank 0 alone sends the prompts (ahead of
    /// time with `max_off_policy_steps`), drops the rows that are too old, scores the rest and
    /// sends them and its prompt sampler to the other ranks.
    fn generate_remote(
        &mut self,
        step: u64,
        policy: &Model,
        remote: &Arc<Remote>,
        metrics: &mut Metrics,
    ) -> Result<(Vec<usize>, Vec<Scored>)> {
        let mut head = Writer::new();
        let (mut picks, mut mine) = (Vec::new(), Vec::new());
        if self.comm.is_root() {
            let (p, samples) = self.server_samples(step, policy, remote, metrics)?;
            metrics.insert("rollout/invalid_samples".into(), samples.invalid as f64);
            metrics.insert(
                "rollout/dropped_invalid_rows".into(),
                samples.dropped as f64,
            );
            let (gens, versions) = (samples.generations, samples.versions);
            // Rows more than `k` versions older than the weights they train are dropped.
            let oldest = (step - 1).saturating_sub(self.rollout.max_off_policy_steps);
            let before = gens.len();
            let (gens, versions): (Vec<Generation>, Vec<Option<u64>>) = gens
                .into_iter()
                .zip(versions)
                .filter(|(_, v)| v.is_none_or(|v| v >= oldest))
                .unzip();
            metrics.insert(
                "rollout/dropped_stale_rows".into(),
                (before - gens.len()) as f64,
            );
            mine = self.score(&p, gens, versions, metrics)?;
            picks = p;
            head.usize(picks.len());
            picks.iter().for_each(|&i| {
                head.usize(i);
            });
            head.u64(self.state.sampler.epoch)
                .usize(self.state.sampler.position);
        }
        let (rows, heads) = share::share(&*self.comm, mine, &head.finish())?;
        if !self.comm.is_root() {
            let mut r = Reader::new(&heads[0], 0);
            for _ in 0..r.usize()? {
                picks.push(r.usize()?);
            }
            self.state.sampler = SamplerState {
                epoch: r.u64()?,
                position: r.usize()?,
            };
            r.end()?;
        }
        Ok((picks, rows))
    }

    /// The samples of step `step` from the servers (rank 0) and its prompts.
    fn server_samples(
        &mut self,
        step: u64,
        policy: &Model,
        remote: &Arc<Remote>,
        metrics: &mut Metrics,
    ) -> Result<(Vec<usize>, RemoteSamples)> {
        remote.ensure_serving(step - 1, policy)?;
        let k = self.rollout.max_off_policy_steps;
        let mut next = self.pending.back().map_or(step, |p| p.step + 1);
        while next <= step + k {
            self.send_ahead(remote, next);
            next += 1;
        }
        let p = self
            .pending
            .pop_front()
            .filter(|p| p.step == step)
            .ok_or_else(|| {
                Error::Generation("the steps generated ahead are out of order".into())
            })?;
        let t_wait = Instant::now();
        let (samples, gen_s) = p.samples.join().map_err(|_| {
            Error::Generation(format!("the generation thread of step {step} panicked"))
        })??;
        let wait_s = t_wait.elapsed().as_secs_f64();
        metrics.insert("timing_s/gen".into(), gen_s);
        metrics.insert("timing_s/gen_wait".into(), wait_s);
        metrics.insert(
            "timing_s/gen_overlap".into(),
            if gen_s > 0.0 {
                1.0 - (wait_s / gen_s).min(1.0)
            } else {
                0.0
            },
        );
        if let Some(s) = self.sync_s {
            metrics.insert("timing_s/weight_sync".into(), s);
        }
        self.state.sampler = p.sampler;
        Ok((p.picks, samples))
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
            self.state = serde_json::from_value(state).map_err(|source| Error::Json {
                what: "the online source's checkpoint state",
                source,
            })?;
        }
        self.ahead = self.state.sampler;
        self.pending.clear();
        Ok(())
    }

    fn next_step(&mut self, step: u64, policy: &Model) -> Result<RolloutStep> {
        let mut metrics = Metrics::new();
        let (picks, rows) = match self.remote.clone() {
            None => self.generate_here(step, policy, &mut metrics)?,
            Some(remote) => self.generate_remote(step, policy, &remote, &mut metrics)?,
        };
        if rows.is_empty() {
            return Err(Error::Rollouts {
                origin: format!("step {step}"),
                why: "no row is left: every row is more than max_off_policy_steps versions old \
                      or in a group with an invalid sample"
                    .into(),
            });
        }
        let r = &self.rollout;
        let mut batch = RolloutBatch::empty(step as i64);
        let mut text = StepText::default();
        let (mut errors, mut timeouts) = (0u64, 0u64);
        for s in &rows {
            let g = &s.generation;
            let prompt = picks
                .get(g.prompt)
                .and_then(|&i| self.prompts.get(i))
                .ok_or_else(|| {
                    Error::Ranks(format!(
                        "step {step}: a row of prompt {} of a step of {} prompts",
                        g.prompt,
                        picks.len()
                    ))
                })?;
            let item = &prompt.item;
            errors += u64::from(s.failure == Some(RewardFailure::Error));
            timeouts += u64::from(s.failure == Some(RewardFailure::Timeout));
            batch.push_row(
                &format!("{step}-{}", g.prompt),
                &prompt.ids,
                &g.tokens,
                &g.logprobs,
                s.reward as f32,
                Some(&item.data_source),
                item.ground_truth.as_deref(),
                Some(r.temperature as f32),
                Some(r.top_p as f32),
            );
            text.messages.push(item.messages.clone());
            text.responses.push(s.response.clone());
        }
        let versions: Vec<Option<u64>> = rows.iter().map(|s| s.version).collect();
        batch.policy_version.clone_from(&versions);
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
        if self.comm.is_root() {
            ShardWriter::new(&self.rollouts)
                .stop_ids(self.stop.clone())
                .write(&batch)
                .map_err(|e| Error::WriteRollouts(Box::new(e)))?;
        }
        Ok(RolloutStep {
            truncated: rows.iter().map(|s| s.generation.truncated).collect(),
            policy_versions: versions,
            batch,
            text: Some(text),
            metrics,
            origin: format!("step {step}"),
            skip: false,
        })
    }

    fn on_policy_updated(&mut self, version: u64, policy: &Model) -> Result<()> {
        match &mut self.remote {
            // The next step samples from the trainer's own weights; rank 0 alone talks to the
            // servers.
            None => Ok(()),
            Some(_) if !self.comm.is_root() => Ok(()),
            Some(remote) => {
                let t = Instant::now();
                remote.sync(version, policy)?;
                self.sync_s = Some(t.elapsed().as_secs_f64());
                Ok(())
            }
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
