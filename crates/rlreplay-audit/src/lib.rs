//! The off-policy audit of a rollout dataset under a policy: given the policy's per-token
//! log-probs of each step's logged responses, the statistics of [`stats`] per
//! step and over the range, the per-row table ([`rows`]) and the plots ([`plots`]).
//!
//! [`PolicyAudit`] takes one step at a time and keeps only the range sums, the per-step values
//! the plots need and the open row file, so memory does not grow with the number of rows.
#![warn(missing_docs)]

use std::path::{Path, PathBuf};

use rlreplay_algo::{AlgoError, Metrics};
use rlreplay_data::RolloutBatch;

pub mod plots;
pub mod rows;
pub mod stats;

pub use rows::RowsWriter;
pub use stats::{audit_step, AuditConfig, LogRatio, RangeAudit, RowAudit, StepAudit, StepRollouts};

/// Errors of the audit.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// Invalid settings or inputs of the statistics.
    #[error(transparent)]
    Algo(#[from] AlgoError),
    /// The policy's log-probs do not fit the batch.
    #[error("step {step}: {got} policy log-probs for {want} response tokens")]
    Shape {
        /// The step.
        step: i64,
        /// Log-probs given.
        got: usize,
        /// Response tokens of the batch.
        want: usize,
    },
    /// A file that cannot be written, with its path.
    #[error("{}: {msg}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        msg: String,
    },
    /// A plot that cannot be drawn.
    #[error(transparent)]
    Plot(#[from] rlreplay_plot::PlotError),
}

/// Result type of the audit.
pub type Result<T> = std::result::Result<T, AuditError>;

/// Where an audit writes besides its metrics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outputs {
    /// The per-row Parquet table.
    pub rows: Option<PathBuf>,
    /// The directory of the plots (created when missing).
    pub plots: Option<PathBuf>,
}

/// The audit of a range of steps, one step at a time.
#[derive(Debug)]
pub struct PolicyAudit {
    range: RangeAudit,
    eos: Vec<u32>,
    rows: Option<RowsWriter>,
    plots: Option<PathBuf>,
    history: plots::History,
}

impl PolicyAudit {
    /// A new audit; `eos` tells truncated responses (those ending with none of its ids). Opens
    /// the row file (under a temporary name until [`PolicyAudit::finish`]) and creates the plot
    /// directory.
    pub fn new(cfg: AuditConfig, eos: Vec<u32>, out: &Outputs) -> Result<Self> {
        let range = RangeAudit::new(cfg)?;
        let rows = out
            .rows
            .as_deref()
            .map(|p| RowsWriter::create(p, range.config()))
            .transpose()?;
        if let Some(dir) = &out.plots {
            std::fs::create_dir_all(dir).map_err(|e| write_err(dir, e))?;
        }
        Ok(Self {
            history: plots::History::new(range.config()),
            range,
            eos,
            rows,
            plots: out.plots.clone(),
        })
    }

    /// The statistics of one step from the policy's log-probs of its response tokens (flat, in
    /// row order); adds the step to the range, its rows to the row file.
    pub fn add(&mut self, batch: &RolloutBatch, logprobs: &[f64]) -> Result<StepAudit> {
        let want = batch.response_tokens.len();
        if logprobs.len() != want {
            return Err(AuditError::Shape {
                step: batch.step,
                got: logprobs.len(),
                want,
            });
        }
        let rollout: Vec<f64> = batch.rollout_log_probs.iter().map(|&x| x.into()).collect();
        let scores: Vec<f64> = batch.scores.iter().map(|&x| x.into()).collect();
        let truncated: Vec<bool> = (0..batch.len())
            .map(|i| batch.truncated(i, &self.eos))
            .collect();
        let groups = batch.groups();
        let audit = self.range.add(&StepRollouts {
            offsets: &batch.response_offsets,
            logprobs,
            rollout_logprobs: &rollout,
            scores: &scores,
            truncated: &truncated,
            groups: &groups,
        })?;
        if let Some(w) = &mut self.rows {
            w.write_step(batch, &scores, &audit.rows)?;
        }
        self.history.push(batch.step, &audit.metrics);
        Ok(audit)
    }

    /// The statistics of the range so far.
    pub fn summary(&self) -> Metrics {
        self.range.summary()
    }

    /// Closes the row file (moving it into place) and draws the plots; returns the range's
    /// statistics.
    pub fn finish(self) -> Result<Metrics> {
        if let Some(w) = self.rows {
            w.finish()?;
        }
        if let Some(dir) = &self.plots {
            plots::write_all(dir, &self.history, &self.range)?;
        }
        Ok(self.range.summary())
    }
}

fn write_err(path: &Path, e: impl std::fmt::Display) -> AuditError {
    AuditError::Write {
        path: path.to_path_buf(),
        msg: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlreplay_algo::{AlgoConfig, IsLevel};

    fn cfg() -> AuditConfig {
        AuditConfig {
            correction: AlgoConfig {
                rollout_is: Some(IsLevel::Token),
                ..AlgoConfig::default()
            },
            thresholds: vec![2.0],
        }
    }

    fn batch() -> RolloutBatch {
        let mut b = RolloutBatch::empty(7);
        for (i, (resp, score)) in [(&[3u32, 4, 1][..], 1.0), (&[5, 6][..], 0.0)]
            .into_iter()
            .enumerate()
        {
            let lps: Vec<f32> = resp.iter().map(|_| -1.0 - i as f32).collect();
            b.push_row("g", &[2], resp, &lps, score, None, None, None, None);
        }
        b
    }

    #[test]
    fn steps_rows_and_plots() {
        let dir = tempfile::tempdir().unwrap();
        let out = Outputs {
            rows: Some(dir.path().join("rows.parquet")),
            plots: Some(dir.path().join("plots")),
        };
        let mut a = PolicyAudit::new(cfg(), vec![1], &out).unwrap();
        let b = batch();
        let step = a.add(&b, &[-1.0, -0.5, -2.0, -2.0, -1.0]).unwrap();
        assert_eq!(step.rows.len(), 2);
        assert!(!step.rows[0].truncated && step.rows[1].truncated);
        assert_eq!(step.metrics["audit/truncated/rows"], 1.0);
        let e = a.add(&b, &[0.0; 4]).unwrap_err().to_string();
        assert!(
            e.contains("4 policy log-probs for 5 response tokens"),
            "{e}"
        );
        let summary = a.finish().unwrap();
        assert_eq!(summary["audit/steps"], 1.0);
        assert!(dir.path().join("rows.parquet").exists());
        assert!(dir.path().join("plots/ess_kl.svg").exists());
    }

    #[test]
    fn an_unfinished_table_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let out = Outputs {
            rows: Some(dir.path().join("rows.parquet")),
            plots: None,
        };
        let mut a = PolicyAudit::new(cfg(), vec![1], &out).unwrap();
        a.add(&batch(), &[-1.0; 5]).unwrap();
        drop(a);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
