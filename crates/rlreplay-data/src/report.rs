//! Validation findings: what was wrong, where (file, row, column), and per-kind counts.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// How many issues a report keeps verbatim; further ones are only counted.
pub const MAX_KEPT_ISSUES: usize = 50;

/// The kinds of problem the reader detects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IssueKind {
    /// The file is not a readable Parquet file (corrupted or truncated).
    Unreadable,
    /// A required column is absent.
    MissingColumn,
    /// A column has a type the reader cannot use.
    WrongType,
    /// The shard holds no rows (a step with nothing to train on).
    EmptyShard,
    /// A required value is null.
    NullValue,
    /// A response has no tokens.
    EmptyResponse,
    /// A prompt has no tokens (nothing predicts the first response token).
    EmptyPrompt,
    /// A row's prompt and response exceed the model's positions.
    TooLong,
    /// Response ids and log-probs (or a mask) differ in length.
    LengthMismatch,
    /// A log-prob is NaN, infinite or positive.
    BadLogProb,
    /// A score is NaN or infinite.
    BadScore,
    /// A token id is negative, too large for u32, or not below `--vocab`.
    BadTokenId,
    /// A mask column is not all ones over the stored lengths.
    BadMask,
    /// The rows of one uid are not contiguous.
    NonContiguousGroup,
    /// Groups of one step differ in size.
    UnequalGroupSize,
}

impl IssueKind {
    /// Whether the whole file is unusable (as opposed to some rows or groups).
    pub fn is_structural(self) -> bool {
        matches!(
            self,
            IssueKind::Unreadable | IssueKind::MissingColumn | IssueKind::WrongType
        )
    }
}

/// One problem found in a shard, with its location.
#[derive(Debug, Clone, PartialEq, Serialize, thiserror::Error)]
pub struct Issue {
    /// The shard.
    pub file: PathBuf,
    /// Row index within the file (0-based), when the problem is in a row.
    pub row: Option<usize>,
    /// Column name, when the problem is in a column.
    pub column: Option<String>,
    /// What is wrong.
    pub kind: IssueKind,
    /// Human-readable detail.
    pub message: String,
}

impl Issue {
    /// A new issue.
    pub fn new(
        file: &Path,
        row: Option<usize>,
        column: Option<&str>,
        kind: IssueKind,
        message: impl Into<String>,
    ) -> Self {
        Self {
            file: file.to_owned(),
            row,
            column: column.map(str::to_owned),
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(r) = self.row {
            write!(f, ": row {r}")?;
        }
        if let Some(c) = &self.column {
            write!(f, ", column `{c}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// What a read found: row counts, truncated rows, and the problems (kept up to
/// [`MAX_KEPT_ISSUES`], all counted per kind).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ValidationReport {
    /// Rows in the file(s).
    pub rows_read: usize,
    /// Rows dropped because they were bad (lenient reads only).
    pub rows_skipped: usize,
    /// Rows whose response does not end with an end-of-sequence id (counted, not an error);
    /// `None` when the read knew no such id.
    pub truncated: Option<usize>,
    /// Number of issues of each kind.
    pub counts: BTreeMap<IssueKind, usize>,
    /// The first issues, in the order found.
    pub issues: Vec<Issue>,
}

impl ValidationReport {
    /// Records an issue.
    pub fn push(&mut self, issue: Issue) {
        *self.counts.entry(issue.kind).or_default() += 1;
        if self.issues.len() < MAX_KEPT_ISSUES {
            self.issues.push(issue);
        }
    }

    /// Total number of issues.
    pub fn issue_count(&self) -> usize {
        self.counts.values().sum()
    }

    /// Whether no issue was found.
    pub fn is_clean(&self) -> bool {
        self.counts.is_empty()
    }

    /// Adds another report's counts and issues to this one.
    pub fn merge(&mut self, other: ValidationReport) {
        self.rows_read += other.rows_read;
        self.rows_skipped += other.rows_skipped;
        self.truncated = match (self.truncated, other.truncated) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        for (k, n) in other.counts {
            *self.counts.entry(k).or_default() += n;
        }
        let room = MAX_KEPT_ISSUES.saturating_sub(self.issues.len());
        self.issues.extend(other.issues.into_iter().take(room));
    }
}

impl fmt::Display for ValidationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "rows read: {}, rows skipped: {}, truncated (no EOS): {}",
            self.rows_read,
            self.rows_skipped,
            self.truncated
                .map_or_else(|| "unknown".to_string(), |t| t.to_string())
        )?;
        if self.is_clean() {
            return writeln!(f, "no problems found");
        }
        for (k, n) in &self.counts {
            writeln!(
                f,
                "{n:>8} × {}",
                serde_json::to_string(k)
                    .unwrap_or_default()
                    .trim_matches('"')
            )?;
        }
        for i in &self.issues {
            writeln!(f, "  {i}")?;
        }
        let total = self.issue_count();
        if total > self.issues.len() {
            writeln!(f, "  … and {} more", total - self.issues.len())?;
        }
        Ok(())
    }
}
