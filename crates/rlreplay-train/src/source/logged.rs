//! The logged source: a rollout dataset replayed along a schedule (`rlreplay replay`).
//!
//! The plan (which dataset step each trainer step reads) is a pure function of the configuration
//! and the dataset's step list, and every choice inside a step derives from `(schedule seed,
//! trainer step)`, so the position in the plan is all a resume needs; the checkpoint stores the
//! plan to refuse a dataset or schedule that changed.

use std::sync::Arc;

use rlreplay_data::{Dataset, ReadOptions, RolloutBatch};
use rlreplay_model::Model;
use rlreplay_sampling::chat::ChatTokenizer;
use serde::{Deserialize, Serialize};

use super::{RolloutSource, RolloutStep, SourceContext};
use crate::config::{parse_steps, ScheduleSection, SelfDistillationSection};
use crate::context::{check_columns, decode_rows};
use crate::error::{Error, Result};
use crate::rundir::Metrics;
use crate::schedule::{plan, select_rows, PlannedStep};

/// A logged rollout dataset read along a schedule.
pub struct LoggedSource {
    dataset: Dataset,
    plan: Vec<PlannedStep>,
    schedule: ScheduleSection,
    read: ReadOptions,
    stop_ids: Vec<u32>,
    success_threshold: f64,
    /// Decodes the rows when the trainer needs their text, with the context settings whose
    /// columns every step must have.
    text: Option<(Arc<ChatTokenizer>, SelfDistillationSection)>,
}

/// The logged source's part of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct State {
    /// Dataset step of every planned trainer step (checked on resume).
    plan: Vec<i64>,
    /// Seed of the schedule's choices.
    schedule_seed: u64,
}

impl LoggedSource {
    /// Opens `[data] path`, selects `[data] steps` and plans the schedule.
    pub fn open(ctx: &SourceContext<'_>) -> Result<Self> {
        let cfg = ctx.config;
        let path = cfg
            .data
            .path
            .as_deref()
            .ok_or_else(|| Error::config("data.path", "[data] path: no rollout dataset"))?;
        let dataset = Dataset::open(path).map_err(|source| Error::Dataset {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
        // The ids that ended the responses: `[data] eos_token_id`, else those the dataset
        // names (every dataset rlreplay writes does), else the model's.
        let dataset_stop = dataset.stop_ids().map_err(|source| Error::Dataset {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
        let stop_ids = match (&cfg.data.eos_token_id, dataset_stop) {
            (None, Some(named)) => named.ids,
            _ => ctx.stop_ids.to_vec(),
        };
        if stop_ids.is_empty() {
            return Err(Error::NoEos);
        }
        let available: Vec<i64> = dataset.steps().iter().map(|s| s.0).collect();
        let selected: Vec<i64> = match &cfg.data.steps {
            Some(r) => {
                let r = parse_steps(r)
                    .map_err(|e| Error::config("data.steps", format!("[data] steps: {e}")))?;
                available
                    .iter()
                    .copied()
                    .filter(|&s| r.contains(s))
                    .collect()
            }
            None => available.clone(),
        };
        let plan = plan(&cfg.schedule, &selected, &available)?;
        let text = if ctx.needs_text {
            let chat = ctx.chat.clone().ok_or_else(|| {
                Error::NoTokenizer(
                    "the model directory has no tokenizer: the rows are decoded with it to build \
                     the teacher contexts"
                        .into(),
                )
            })?;
            Some((chat, cfg.self_distillation.clone()))
        } else {
            None
        };
        Ok(Self {
            dataset,
            plan,
            schedule: cfg.schedule.clone(),
            // The reader's own truncation count (in its report, which the trainer does not read)
            // takes the first end-of-response id; the source judges rows by all of them.
            read: ReadOptions {
                lenient: false,
                eos: stop_ids.clone(),
                vocab: cfg.data.vocab_check.then_some(ctx.vocab_size as u32),
                max_positions: Some(ctx.max_positions),
            },
            stop_ids,
            success_threshold: cfg.algorithm.success_reward_threshold,
            text,
        })
    }

    /// The shard of a planned step, for messages.
    fn origin(&self, ps: &PlannedStep) -> String {
        match self.dataset.shard(ps.source_step) {
            Some(p) => p.display().to_string(),
            None => format!("dataset step {}", ps.source_step),
        }
    }

    fn planned(&self, step: u64) -> Result<PlannedStep> {
        let i = usize::try_from(step.saturating_sub(1)).unwrap_or(usize::MAX);
        self.plan.get(i).copied().ok_or(Error::PastSchedule(step))
    }

    fn read(&self, ps: &PlannedStep) -> Result<RolloutBatch> {
        let (batch, _report) =
            self.dataset
                .read_step(ps.source_step, &self.read)
                .map_err(|source| Error::DatasetStep {
                    step: ps.source_step,
                    source: Box::new(source),
                })?;
        Ok(batch)
    }
}

impl RolloutSource for LoggedSource {
    fn planned_steps(&self) -> Option<u64> {
        Some(self.plan.len() as u64)
    }

    fn start(&mut self, step: u64, state: Option<serde_json::Value>) -> Result<()> {
        let planned: Vec<i64> = self.plan.iter().map(|p| p.source_step).collect();
        if let Some(state) = state {
            let state: State = serde_json::from_value(state).map_err(|source| Error::Json {
                what: "the logged source's checkpoint state",
                source,
            })?;
            if state.plan != planned || state.schedule_seed != self.schedule.seed {
                return Err(Error::SourceStateChanged(
                    "the schedule differs from the one the run started with",
                ));
            }
        }
        // Refuse at startup a dataset whose next step lacks a column the context mode needs.
        if let (Some((_, sd)), Ok(ps)) = (&self.text, self.planned(step + 1)) {
            let batch = self.read(&ps)?;
            check_columns(&batch, sd, &self.origin(&ps))?;
        }
        Ok(())
    }

    fn next_step(&mut self, step: u64, _policy: &Model) -> Result<RolloutStep> {
        let ps = self.planned(step)?;
        let origin = self.origin(&ps);
        let batch = self.read(&ps)?;
        let groups = batch.groups();
        let truncated: Vec<bool> = (0..batch.len())
            .map(|i| {
                batch
                    .response(i)
                    .last()
                    .is_none_or(|t| !self.stop_ids.contains(t))
            })
            .collect();
        let (rows, sel) = select_rows(
            &self.schedule,
            &ps,
            &groups,
            &batch.scores,
            &truncated,
            self.success_threshold,
        );
        let mut metrics = Metrics::new();
        for (k, v) in [
            ("groups_in", sel.groups_in),
            ("groups", sel.groups_out),
            ("rows", sel.rows_out),
            ("dropped_solve_none", sel.dropped_solve_none),
            ("dropped_solve_all", sel.dropped_solve_all),
            ("dropped_truncated", sel.dropped_truncated),
            ("dropped_subsample", sel.dropped_subsample),
            ("dropped_group_fraction", sel.dropped_group_fraction),
        ] {
            metrics.insert(format!("schedule/{k}"), v as f64);
        }
        metrics.insert("train/source_step".into(), ps.source_step as f64);
        metrics.insert("train/epoch".into(), f64::from(ps.epoch));
        let batch = batch.select(&rows);
        let text = match &self.text {
            Some((chat, sd)) => {
                check_columns(&batch, sd, &origin)?;
                Some(decode_rows(&batch, chat, &origin)?)
            }
            None => None,
        };
        Ok(RolloutStep {
            truncated: rows.iter().map(|&i| truncated[i]).collect(),
            policy_versions: batch.policy_version.clone(),
            batch,
            text,
            metrics,
            origin,
            skip: rows.is_empty() && sel.groups_in > 0,
        })
    }

    fn on_policy_updated(&mut self, _version: u64, _policy: &Model) -> Result<()> {
        Ok(())
    }

    fn state(&self) -> serde_json::Value {
        serde_json::json!(State {
            plan: self.plan.iter().map(|p| p.source_step).collect(),
            schedule_seed: self.schedule.seed,
        })
    }
}
