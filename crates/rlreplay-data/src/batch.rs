//! The in-memory form of one trainer step's rollouts: flat token and log-prob buffers plus offsets.

use std::ops::Range;
use std::path::PathBuf;

/// One trainer step's rollout rows in flat layout.
///
/// Row `i`'s prompt is `prompt_tokens[prompt_offsets[i]..prompt_offsets[i + 1]]`, its response
/// `response_tokens[response_offsets[i]..response_offsets[i + 1]]`, and `rollout_log_probs` holds one
/// behaviour log-prob per response token (same offsets as the response). Rows of one prompt group
/// (same `uid`) are contiguous.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RolloutBatch {
    /// Trainer step (policy version) of the shard.
    pub step: i64,
    /// The file the rows were read from (empty for batches built in memory).
    pub source: PathBuf,
    /// Prompt group id of each row.
    pub uids: Vec<String>,
    /// All prompt tokens, row after row.
    pub prompt_tokens: Vec<u32>,
    /// Row boundaries in `prompt_tokens` (`len() + 1` entries, starting at 0).
    pub prompt_offsets: Vec<usize>,
    /// All response tokens, row after row.
    pub response_tokens: Vec<u32>,
    /// Row boundaries in `response_tokens` and `rollout_log_probs` (`len() + 1` entries).
    pub response_offsets: Vec<usize>,
    /// Behaviour-policy log-prob of each response token.
    pub rollout_log_probs: Vec<f32>,
    /// Raw reward of each row.
    pub scores: Vec<f32>,
    /// Reward-dispatch key of each row, when stored.
    pub data_source: Vec<Option<String>>,
    /// Reference answer of each row, when stored.
    pub ground_truth: Vec<Option<String>>,
    /// Sampling temperature of each row, when stored.
    pub temperature: Vec<Option<f32>>,
    /// Nucleus-sampling threshold of each row, when stored.
    pub top_p: Vec<Option<f32>>,
    /// Policy version (trainer step of the weights) that generated each row, when known: a shard
    /// without the `policy_version` column, or a null, is unknown, never version 0.
    pub policy_version: Vec<Option<u64>>,
}

impl RolloutBatch {
    /// An empty batch for `step` (offset vectors hold their leading 0).
    pub fn empty(step: i64) -> Self {
        Self {
            step,
            prompt_offsets: vec![0],
            response_offsets: vec![0],
            ..Self::default()
        }
    }

    /// Appends one row.
    ///
    /// # Panics
    /// When `response` and `log_probs` differ in length.
    #[allow(clippy::too_many_arguments)]
    pub fn push_row(
        &mut self,
        uid: &str,
        prompt: &[u32],
        response: &[u32],
        log_probs: &[f32],
        score: f32,
        data_source: Option<&str>,
        ground_truth: Option<&str>,
        temperature: Option<f32>,
        top_p: Option<f32>,
    ) {
        assert_eq!(
            response.len(),
            log_probs.len(),
            "one log-prob per response token"
        );
        self.uids.push(uid.to_owned());
        self.prompt_tokens.extend_from_slice(prompt);
        self.prompt_offsets.push(self.prompt_tokens.len());
        self.response_tokens.extend_from_slice(response);
        self.rollout_log_probs.extend_from_slice(log_probs);
        self.response_offsets.push(self.response_tokens.len());
        self.scores.push(score);
        self.data_source.push(data_source.map(str::to_owned));
        self.ground_truth.push(ground_truth.map(str::to_owned));
        self.temperature.push(temperature);
        self.top_p.push(top_p);
        self.policy_version.push(None);
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.scores.len()
    }

    /// Whether the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.scores.is_empty()
    }

    /// Prompt tokens of row `i`.
    pub fn prompt(&self, i: usize) -> &[u32] {
        &self.prompt_tokens[self.prompt_offsets[i]..self.prompt_offsets[i + 1]]
    }

    /// Response tokens of row `i`.
    pub fn response(&self, i: usize) -> &[u32] {
        &self.response_tokens[self.response_offsets[i]..self.response_offsets[i + 1]]
    }

    /// Behaviour log-probs of row `i`'s response tokens.
    pub fn log_probs(&self, i: usize) -> &[f32] {
        &self.rollout_log_probs[self.response_offsets[i]..self.response_offsets[i + 1]]
    }

    /// Whether row `i`'s response was cut by the length limit (it ends with none of the ids of
    /// `eos`).
    pub fn truncated(&self, i: usize, eos: &[u32]) -> bool {
        self.response(i).last().is_none_or(|t| !eos.contains(t))
    }

    /// Row ranges of the contiguous runs of equal `uid` (the prompt groups), in row order.
    pub fn groups(&self) -> Vec<Range<usize>> {
        let mut out = Vec::new();
        let mut start = 0;
        for i in 1..=self.uids.len() {
            if i == self.uids.len() || self.uids[i] != self.uids[start] {
                out.push(start..i);
                start = i;
            }
        }
        out
    }

    /// A new batch holding the given rows, in the given order.
    ///
    /// # Panics
    /// When an index is out of range.
    pub fn select(&self, rows: &[usize]) -> RolloutBatch {
        let prompt_total: usize = rows.iter().map(|&i| self.prompt(i).len()).sum();
        let response_total: usize = rows.iter().map(|&i| self.response(i).len()).sum();
        let mut out = RolloutBatch {
            step: self.step,
            source: self.source.clone(),
            uids: Vec::with_capacity(rows.len()),
            prompt_tokens: Vec::with_capacity(prompt_total),
            prompt_offsets: Vec::with_capacity(rows.len() + 1),
            response_tokens: Vec::with_capacity(response_total),
            response_offsets: Vec::with_capacity(rows.len() + 1),
            rollout_log_probs: Vec::with_capacity(response_total),
            scores: Vec::with_capacity(rows.len()),
            data_source: Vec::with_capacity(rows.len()),
            ground_truth: Vec::with_capacity(rows.len()),
            temperature: Vec::with_capacity(rows.len()),
            top_p: Vec::with_capacity(rows.len()),
            policy_version: Vec::with_capacity(rows.len()),
        };
        out.prompt_offsets.push(0);
        out.response_offsets.push(0);
        for &i in rows {
            out.uids.push(self.uids[i].clone());
            out.prompt_tokens.extend_from_slice(self.prompt(i));
            out.prompt_offsets.push(out.prompt_tokens.len());
            out.response_tokens.extend_from_slice(self.response(i));
            out.rollout_log_probs.extend_from_slice(self.log_probs(i));
            out.response_offsets.push(out.response_tokens.len());
            out.scores.push(self.scores[i]);
            out.data_source.push(self.data_source[i].clone());
            out.ground_truth.push(self.ground_truth[i].clone());
            out.temperature.push(self.temperature[i]);
            out.top_p.push(self.top_p[i]);
            out.policy_version.push(self.policy_version[i]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> RolloutBatch {
        let mut b = RolloutBatch::empty(3);
        b.push_row(
            "a",
            &[1, 2],
            &[5, 9],
            &[-0.5, -0.1],
            1.0,
            None,
            None,
            None,
            None,
        );
        b.push_row(
            "a",
            &[1, 2],
            &[6],
            &[-0.2],
            0.0,
            Some("m"),
            None,
            Some(1.0),
            None,
        );
        b.push_row(
            "b",
            &[3],
            &[7, 8, 9],
            &[-1.0, -2.0, -0.0],
            1.0,
            None,
            Some("4"),
            None,
            Some(0.9),
        );
        b
    }

    #[test]
    fn accessors_and_groups() {
        let b = tiny();
        assert_eq!(b.len(), 3);
        assert_eq!(b.prompt(2), &[3]);
        assert_eq!(b.response(2), &[7, 8, 9]);
        assert_eq!(b.log_probs(0), &[-0.5, -0.1]);
        assert_eq!(b.groups(), vec![0..2, 2..3]);
        assert!(b.truncated(1, &[9]));
        assert!(!b.truncated(0, &[9]));
        assert!(RolloutBatch::empty(0).groups().is_empty());
    }

    #[test]
    fn select_reorders_and_copies_all_columns() {
        let b = tiny();
        let s = b.select(&[2, 0]);
        assert_eq!(s.len(), 2);
        assert_eq!(s.uids, vec!["b", "a"]);
        assert_eq!(s.response(0), &[7, 8, 9]);
        assert_eq!(s.log_probs(1), &[-0.5, -0.1]);
        assert_eq!(s.ground_truth[0].as_deref(), Some("4"));
        assert_eq!(s.top_p[0], Some(0.9));
        assert_eq!(b.select(&[0, 1, 2]), b);
    }
}
