//! Per-step audit statistics and their aggregation over steps.

use serde::Serialize;

use crate::batch::RolloutBatch;

/// Sums from which the audit statistics of one or more steps are derived.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AuditSums {
    /// Steps merged in.
    pub steps: usize,
    /// Rows.
    pub rows: usize,
    /// Prompt groups.
    pub groups: usize,
    /// Groups whose mean score is 0.
    pub groups_none: usize,
    /// Groups whose mean score is 1.
    pub groups_all: usize,
    /// Sum of scores.
    pub score_sum: f64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Response tokens.
    pub response_tokens: u64,
    /// Longest response.
    pub resp_len_max: usize,
    /// Rows without a trailing end-of-sequence id; `None` when no such id is known.
    pub truncated: Option<usize>,
    /// Sum of all behaviour log-probs.
    pub logprob_sum: f64,
}

/// Sum of f32 values in f64, in eight independent lanes (vectorisable, and deterministic).
fn sum_f64(xs: &[f32]) -> f64 {
    let mut acc = [0f64; 8];
    let chunks = xs.chunks_exact(8);
    let tail: f64 = chunks.remainder().iter().map(|&x| f64::from(x)).sum();
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += f64::from(x);
        }
    }
    acc.iter().sum::<f64>() + tail
}

impl AuditSums {
    /// The sums of one batch; a response ending with none of the ids of `eos` counts as
    /// truncated (not counted without `eos`).
    pub fn of_batch(b: &RolloutBatch, eos: Option<&[u32]>) -> Self {
        let mut s = AuditSums {
            steps: 1,
            rows: b.len(),
            score_sum: b.scores.iter().map(|&x| f64::from(x)).sum(),
            prompt_tokens: b.prompt_tokens.len() as u64,
            response_tokens: b.response_tokens.len() as u64,
            logprob_sum: sum_f64(&b.rollout_log_probs),
            truncated: eos.map(|eos| (0..b.len()).filter(|&i| b.truncated(i, eos)).count()),
            ..Self::default()
        };
        for i in 0..b.len() {
            s.resp_len_max = s
                .resp_len_max
                .max(b.response_offsets[i + 1] - b.response_offsets[i]);
        }
        for g in b.groups() {
            let n = g.len() as f64;
            let mean = b.scores[g].iter().map(|&x| f64::from(x)).sum::<f64>() / n;
            s.groups += 1;
            s.groups_none += usize::from(mean == 0.0);
            s.groups_all += usize::from(mean == 1.0);
        }
        s
    }

    /// Adds another step's (or set of steps') sums.
    pub fn merge(&mut self, o: &AuditSums) {
        self.truncated = if self.steps == 0 {
            o.truncated
        } else {
            self.truncated.zip(o.truncated).map(|(a, b)| a + b)
        };
        self.steps += o.steps;
        self.rows += o.rows;
        self.groups += o.groups;
        self.groups_none += o.groups_none;
        self.groups_all += o.groups_all;
        self.score_sum += o.score_sum;
        self.prompt_tokens += o.prompt_tokens;
        self.response_tokens += o.response_tokens;
        self.resp_len_max = self.resp_len_max.max(o.resp_len_max);
        self.logprob_sum += o.logprob_sum;
    }

    /// The derived statistics.
    pub fn stats(&self) -> AuditStats {
        let div = |a: f64, b: usize| if b == 0 { 0.0 } else { a / b as f64 };
        AuditStats {
            rows: self.rows,
            groups: self.groups,
            group_size: div(self.rows as f64, self.groups),
            score_mean: div(self.score_sum, self.rows),
            solve_none: div(self.groups_none as f64, self.groups),
            solve_all: div(self.groups_all as f64, self.groups),
            prompt_len_mean: div(self.prompt_tokens as f64, self.rows),
            resp_len_mean: div(self.response_tokens as f64, self.rows),
            resp_len_max: self.resp_len_max,
            truncated: self.truncated.map(|t| div(t as f64, self.rows)),
            logprob_mean: div(self.logprob_sum, self.response_tokens as usize),
        }
    }
}

/// Audit statistics of one step or of a set of steps (the `rlreplay audit --json` fields).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct AuditStats {
    /// Rows.
    pub rows: usize,
    /// Prompt groups (contiguous runs of one uid).
    pub groups: usize,
    /// Mean rows per group.
    pub group_size: f64,
    /// Mean score.
    pub score_mean: f64,
    /// Fraction of groups whose mean score is 0.
    pub solve_none: f64,
    /// Fraction of groups whose mean score is 1.
    pub solve_all: f64,
    /// Mean prompt length in tokens.
    pub prompt_len_mean: f64,
    /// Mean response length in tokens.
    pub resp_len_mean: f64,
    /// Longest response in tokens.
    pub resp_len_max: usize,
    /// Fraction of rows whose response does not end with an end-of-sequence id; `None` (JSON
    /// `null`) when no such id is known.
    pub truncated: Option<f64>,
    /// Mean behaviour log-prob over all response tokens.
    pub logprob_mean: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_checked_statistics() {
        let mut b = RolloutBatch::empty(1);
        let eos = 9;
        b.push_row(
            "a",
            &[1, 2],
            &[5, 9],
            &[-1.0, -1.0],
            1.0,
            None,
            None,
            None,
            None,
        );
        b.push_row(
            "a",
            &[1, 2],
            &[5, 5, 5],
            &[-2.0; 3],
            1.0,
            None,
            None,
            None,
            None,
        );
        b.push_row("b", &[3], &[9], &[-0.5], 0.0, None, None, None, None);
        b.push_row(
            "b",
            &[3],
            &[4, 9],
            &[-0.5, -0.5],
            0.0,
            None,
            None,
            None,
            None,
        );
        let s = AuditSums::of_batch(&b, Some(&[eos])).stats();
        assert_eq!((s.rows, s.groups, s.resp_len_max), (4, 2, 3));
        assert_eq!(s.group_size, 2.0);
        assert_eq!(s.score_mean, 0.5);
        assert_eq!((s.solve_all, s.solve_none), (0.5, 0.5));
        assert_eq!(s.prompt_len_mean, 1.5);
        assert_eq!(s.resp_len_mean, 2.0);
        assert_eq!(s.truncated, Some(0.25));
        assert_eq!(s.logprob_mean, -9.5 / 8.0);
        let mut total = AuditSums::default();
        total.merge(&AuditSums::of_batch(&b, Some(&[eos])));
        total.merge(&AuditSums::of_batch(&b, Some(&[eos])));
        let t = total.stats();
        assert_eq!(t.truncated, Some(0.25));
        // Unknown ids: truncation is not counted, in the step or in a total it joins.
        assert_eq!(AuditSums::of_batch(&b, None).stats().truncated, None);
        let mut mixed = total;
        mixed.merge(&AuditSums::of_batch(&b, None));
        assert_eq!(mixed.stats().truncated, None);
        assert_eq!((t.rows, t.groups), (8, 4));
        assert_eq!(t.logprob_mean, s.logprob_mean);
        assert_eq!(total.steps, 2);
        assert_eq!(AuditSums::default().stats().score_mean, 0.0);
    }
}
