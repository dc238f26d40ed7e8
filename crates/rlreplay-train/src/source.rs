//! Rollout sources: where the rows of each trainer step come from.
//!
//! The [`Trainer`](crate::trainer::Trainer) asks its source for one [`RolloutStep`] per trainer
//! step, trains on it, and calls the source back after every update with the weights it now
//! holds ([`RolloutSource::on_policy_updated`]). A source keeps its own position (the logged
//! plan, the prompt sampler) and hands the trainer the state a checkpoint stores to continue it
//! exactly.
//!
//! - [`logged::LoggedSource`]: a logged rollout dataset read along a schedule (`rlreplay replay`).
//! - [`online::OnlineSource`]: prompts drawn from a prompt set, rollouts sampled from the policy
//!   being trained and scored by the reward dispatch (`rlreplay train`), in this process or, with
//!   `[rollout] backend = "remote"`, on inference servers ([`remote::Remote`]). The backend is a
//!   setting of the online kind rather than a kind of its own: both read the same prompt, reward
//!   and sampling keys, which the key partition of [`SourceKind::keys`] assigns to one front.
//!
//! A new source is one more module here and its arm in [`open`], one more [`SourceKind`] with its
//! answers to the kind's properties, and a front; the trainer does not change.

pub mod logged;
pub mod online;
pub mod remote;
pub mod share;

use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;

use rlreplay_data::RolloutBatch;
use rlreplay_dist::Collective;
use rlreplay_model::Model;
use rlreplay_sampling::chat::{ChatTokenizer, Message};

use crate::config::{Config, SourceKind};
use crate::error::{Error, Result};
use crate::rundir::Metrics;

/// One trainer step's rollouts as a source hands them over.
#[derive(Debug, Clone)]
pub struct RolloutStep {
    /// The rows: prompt and response tokens, behaviour log-probs (`rollout_log_probs`), scores,
    /// prompt groups (`uid`), data sources and reference answers.
    pub batch: RolloutBatch,
    /// Per row: the response ended without an end-of-response token (length limit).
    pub truncated: Vec<bool>,
    /// Per row: the policy version (trainer step of the weights) that generated it, when known.
    pub policy_versions: Vec<Option<u64>>,
    /// Per row: the prompt's messages and the response's text, when the trainer asked for them
    /// ([`SourceContext::needs_text`]).
    pub text: Option<StepText>,
    /// The source's metrics of this step (`schedule/*`, `reward/*`, `timing_s/gen`,
    /// `train/epoch`, ...).
    pub metrics: Metrics,
    /// Where the rows come from, for error messages (a shard's path, `step N`).
    pub origin: String,
    /// The source left this step without rows on purpose (a schedule's filters dropped every
    /// group): the trainer skips it, counted, instead of refusing an empty step.
    pub skip: bool,
}

/// The text of a step's rows, for the teacher contexts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepText {
    /// Per row: the prompt's conversation.
    pub messages: Vec<Vec<Message>>,
    /// Per row: the response decoded without special tokens.
    pub responses: Vec<String>,
}

impl RolloutStep {
    /// Checks that the step has rows and that every per-row field has one entry per row.
    pub fn check(&self) -> Result<()> {
        let n = self.batch.len();
        // An empty step has no loss to take the mean of (it would train on NaN).
        let bad = |why: String| {
            Err(Error::Rollouts {
                origin: self.origin.clone(),
                why,
            })
        };
        if n == 0 {
            return bad("the step has no rows to train on".into());
        }
        let text = self
            .text
            .as_ref()
            .is_none_or(|t| t.messages.len() == n && t.responses.len() == n);
        if !(self.truncated.len() == n && self.policy_versions.len() == n && text) {
            return bad(format!(
                "the step's per-row fields do not match its {n} rows"
            ));
        }
        Ok(())
    }

    /// The step with only `rows`, in that order.
    pub fn select(self, rows: &[usize]) -> Self {
        let pick = |xs: &[bool]| rows.iter().map(|&i| xs[i]).collect();
        Self {
            batch: self.batch.select(rows),
            truncated: pick(&self.truncated),
            policy_versions: rows.iter().map(|&i| self.policy_versions[i]).collect(),
            text: self.text.map(|t| StepText {
                messages: rows.iter().map(|&i| t.messages[i].clone()).collect(),
                responses: rows.iter().map(|&i| t.responses[i].clone()).collect(),
            }),
            metrics: self.metrics,
            origin: self.origin,
            skip: self.skip,
        }
    }
}

/// Where a trainer's rollouts come from.
pub trait RolloutSource {
    /// Trainer steps the source can feed (the logged plan's length); `None` when it has no end.
    fn planned_steps(&self) -> Option<u64>;

    /// Continues after trainer step `step` (0 for a fresh run) from a checkpoint's `state` (what
    /// [`RolloutSource::state`] returned then; `None` for a fresh run). Refuses here what would
    /// fail at the first step.
    fn start(&mut self, step: u64, state: Option<serde_json::Value>) -> Result<()>;

    /// The rollouts of trainer step `step` (1-based). `policy` holds the weights of version
    /// `step - 1`; a source that generates in this process samples from it.
    fn next_step(&mut self, step: u64, policy: &Model) -> Result<RolloutStep>;

    /// Called after the update of trainer step `version`: `policy` now holds the weights of that
    /// version. A source that generates elsewhere sends them there.
    fn on_policy_updated(&mut self, version: u64, policy: &Model) -> Result<()>;

    /// What a checkpoint stores for [`RolloutSource::start`] to continue exactly.
    fn state(&self) -> serde_json::Value;
}

/// What a source is built from.
pub struct SourceContext<'a> {
    /// The resolved configuration.
    pub config: &'a Config,
    /// The run directory.
    pub run_dir: &'a Path,
    /// The policy's tokenizer and chat template, when its model directory has them.
    pub chat: Option<Arc<ChatTokenizer>>,
    /// The token ids that end a response.
    pub stop_ids: &'a [u32],
    /// The policy's vocabulary size.
    pub vocab_size: usize,
    /// The policy's `max_position_embeddings`: a row's prompt and response must fit in it.
    pub max_positions: usize,
    /// Every step must carry its rows' text ([`RolloutStep::text`]): the loss needs teacher
    /// contexts.
    pub needs_text: bool,
    /// The data-parallel ranks the trainer runs on (one process when not started by a
    /// launcher). Every rank's source hands the trainer the whole step.
    pub comm: Rc<dyn Collective>,
}

/// Opens the source of `ctx.config`'s kind.
pub fn open(ctx: &SourceContext<'_>) -> Result<Box<dyn RolloutSource>> {
    Ok(match ctx.config.source {
        SourceKind::Logged => Box::new(logged::LoggedSource::open(ctx)?),
        SourceKind::Online => Box::new(online::OnlineSource::open(ctx)?),
    })
}
