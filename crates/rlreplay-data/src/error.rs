//! Errors of the data crate.

use std::path::PathBuf;

use crate::report::Issue;
use crate::steps::StepRange;

/// Every error the data crate reports: bad shards (file, row, column), datasets that cannot be
/// found, hub answers that are refused, files that cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A problem in a shard, with its file and, where known, row and column.
    #[error(transparent)]
    Issue(#[from] Issue),
    /// A strict read found several problems: the first, and how many more.
    #[error("{more} more problem(s) in {}: {first}", path.display())]
    MoreIssues {
        /// The shard.
        path: PathBuf,
        /// The number of problems besides the first.
        more: usize,
        /// The first problem.
        first: Box<Issue>,
    },
    /// A dataset glob that does not parse.
    #[error("invalid glob `{spec}`")]
    Glob {
        /// The glob.
        spec: String,
        /// The glob crate's error.
        source: glob::PatternError,
    },
    /// A path a glob matched cannot be read.
    #[error("reading glob `{spec}`")]
    GlobEntry {
        /// The glob.
        spec: String,
        /// The glob crate's error.
        source: glob::GlobError,
    },
    /// A dataset glob that matches no Parquet file.
    #[error("glob `{spec}` matches no .parquet file")]
    GlobEmpty {
        /// The glob.
        spec: String,
    },
    /// A dataset path that does not exist.
    #[error("{spec}: no such file or directory")]
    NotFound {
        /// The path.
        spec: String,
    },
    /// A dataset directory without Parquet files.
    #[error("{}: no .parquet files", dir.display())]
    NoParquetFiles {
        /// The directory.
        dir: PathBuf,
    },
    /// Two shards of a dataset hold the same step.
    #[error("two shards hold step {step}: {} and {}", first.display(), second.display())]
    DuplicateStep {
        /// The step.
        step: i64,
        /// One shard.
        first: PathBuf,
        /// The other.
        second: PathBuf,
    },
    /// The step range selects no shard of the dataset.
    #[error("{spec}: no Parquet shard in step range {steps}")]
    NoShardInRange {
        /// The dataset.
        spec: String,
        /// The range.
        steps: StepRange,
    },
    /// A step the dataset does not have.
    #[error("{spec}: no shard for step {step}")]
    NoShard {
        /// The dataset.
        spec: String,
        /// The step.
        step: i64,
    },
    /// A shard whose step is neither in its file name nor in its `step` column's statistics.
    #[error(
        "{}: cannot tell the shard's step: the file name has no step number (step-NNNN.parquet) \
         and the `step` column is missing or holds several steps",
        path.display()
    )]
    UnknownStep {
        /// The shard.
        path: PathBuf,
    },
    /// A file that does not open as Parquet.
    #[error("{}: not a readable Parquet file", path.display())]
    NotParquet {
        /// The file.
        path: PathBuf,
        /// The Parquet reader's error.
        source: parquet::errors::ParquetError,
    },
    /// A shard footer whose stop-id metadata does not parse.
    #[error("{}: footer key `{}`: {message}", path.display(), crate::stop::STOP_IDS_KEY)]
    BadStopIds {
        /// The shard.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A file operation that failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// A temporary file that cannot be renamed into place.
    #[error("renaming {} to {}", from.display(), to.display())]
    Rename {
        /// The temporary file.
        from: PathBuf,
        /// The destination.
        to: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Writing a shard failed (nothing is left behind: the temporary file is removed).
    #[error("writing {}", path.display())]
    WriteShard {
        /// The shard.
        path: PathBuf,
        /// What failed.
        source: Box<Error>,
    },
    /// A zstd level the Parquet writer does not accept.
    #[error("invalid zstd level {level}")]
    ZstdLevel {
        /// The level.
        level: i32,
        /// The Parquet writer's error.
        source: parquet::errors::ParquetError,
    },
    /// A batch whose column lengths or offsets disagree.
    #[error("inconsistent batch for step {step}: column lengths or offsets disagree")]
    InconsistentBatch {
        /// The batch's step.
        step: i64,
    },
    /// A token id or offset that does not fit the schema's int32.
    #[error("{what} does not fit int32")]
    Int32 {
        /// `token id` or `token offset (too many tokens in one shard)`.
        what: &'static str,
    },
    /// The Parquet writer failed.
    #[error(transparent)]
    Parquet(#[from] parquet::errors::ParquetError),
    /// Arrow refused the columns.
    #[error(transparent)]
    Arrow(#[from] arrow_schema::ArrowError),
    /// A synthetic-dataset setting out of range.
    #[error("{0}")]
    Synth(&'static str),
    /// `tokenizer.json` cannot be loaded.
    #[error("loading tokenizer {}: {error}", path.display())]
    LoadTokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// The tokenizer library's error.
        error: tokenizers::Error,
    },
    /// A hub path that is not `hf://datasets/OWNER/NAME` or `hf://OWNER/NAME` of allowed
    /// characters.
    #[error(
        "invalid hub path `{spec}`: {why} (expected hf://datasets/OWNER/NAME or hf://OWNER/NAME, \
         optionally @REVISION)"
    )]
    HubPath {
        /// The path as given.
        spec: String,
        /// What is wrong with it.
        why: String,
    },
    /// The hub refused the repository or answered something that is refused (an unreadable
    /// listing, an unsafe file name or commit).
    #[error("{repo}: {why}")]
    HubRefused {
        /// The hub path.
        repo: String,
        /// What was refused.
        why: String,
    },
    /// No file of the repository matches.
    #[error("{repo}: no file in the repository matches")]
    HubNoMatch {
        /// The hub path.
        repo: String,
    },
    /// The hub cannot be reached and nothing is cached.
    #[error(
        "{repo}: cannot list the repository at {endpoint} ({why}), and nothing is cached in {}",
        cache.display()
    )]
    HubUnreachable {
        /// The hub path.
        repo: String,
        /// The endpoint.
        endpoint: String,
        /// Why it cannot be reached.
        why: String,
        /// The cache directory.
        cache: PathBuf,
    },
    /// The hub cannot be reached and no cached file matches.
    #[error("{repo}: no cached file matches")]
    HubNoCachedMatch {
        /// The hub path.
        repo: String,
    },
    /// Downloading one file of a repository failed.
    #[error("{repo}: downloading {name}")]
    HubDownload {
        /// The hub path.
        repo: String,
        /// The file's name in the repository.
        name: String,
        /// What failed.
        source: Box<Error>,
    },
    /// A hub request answered with an error status.
    #[error("{url} answered {code}")]
    HubStatus {
        /// The URL.
        url: String,
        /// The HTTP status.
        code: u16,
    },
    /// A hub request that failed before an answer.
    #[error("{url}")]
    HubRequest {
        /// The URL.
        url: String,
        /// The HTTP client's error.
        source: Box<ureq::Error>,
    },
    /// A hub file answer that is refused (no ETag, an unsafe ETag).
    #[error("{url}: {why}")]
    HubFile {
        /// The URL.
        url: String,
        /// What is wrong with the answer.
        why: String,
    },
    /// A download whose size differs from the announced one.
    #[error("{url}: received {received} bytes, the hub announced {announced}")]
    HubSize {
        /// The URL.
        url: String,
        /// Bytes received.
        received: u64,
        /// Bytes announced.
        announced: u64,
    },
}

impl Error {
    /// The shard problem this error reports (the first, when a strict read found several).
    pub fn issue(&self) -> Option<&Issue> {
        match self {
            Error::Issue(i) => Some(i),
            Error::MoreIssues { first, .. } => Some(first),
            _ => None,
        }
    }
}

/// A file operation that failed: what was being done (opening, creating, writing, ...), on which
/// file or directory. The error every crate's file operations report, by [`IoContext::at`].
#[derive(Debug, thiserror::Error)]
#[error("{action} {}", path.display())]
pub struct IoError {
    /// What was being done.
    pub action: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// The I/O error.
    #[source]
    pub source: std::io::Error,
}

impl IoError {
    /// `source` while doing `action` on `path`.
    pub fn new(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self {
            action,
            path: path.into(),
            source,
        }
    }
}

/// Names the file of an I/O error: `fs::read(&p).at("reading", &p)?`.
pub trait IoContext<T> {
    /// The error as an [`IoError`]: `action` on `path`.
    fn at(self, action: &'static str, path: impl Into<PathBuf>) -> std::result::Result<T, IoError>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, action: &'static str, path: impl Into<PathBuf>) -> std::result::Result<T, IoError> {
        self.map_err(|source| IoError::new(action, path, source))
    }
}

/// Result type of the data crate.
pub type Result<T> = std::result::Result<T, Error>;

/// An error's message with its causes, as the binary prints it (`outer: inner: ...`).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}
