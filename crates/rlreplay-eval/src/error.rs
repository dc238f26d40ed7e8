//! Errors of the evaluation crate.

use std::path::PathBuf;

use serde_json::Value;

/// Every error the evaluation crate reports.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A prompt file cannot be opened.
    #[error("opening {}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A line of a JSON-lines file cannot be read.
    #[error("{}: line {line}", path.display())]
    ReadLine {
        /// The file.
        path: PathBuf,
        /// The line number (1-based).
        line: usize,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A line of a JSON-lines file is not valid JSON.
    #[error("{}: line {line}: not valid JSON", path.display())]
    LineJson {
        /// The file.
        path: PathBuf,
        /// The line number (1-based).
        line: usize,
        /// The parse error.
        source: serde_json::Error,
    },
    /// A line of a JSON-lines file is not a valid prompt row.
    #[error("{}: line {line}", path.display())]
    Line {
        /// The file.
        path: PathBuf,
        /// The line number (1-based).
        line: usize,
        /// What is wrong with the row.
        source: Box<Error>,
    },
    /// A file that does not open as Parquet.
    #[error("{} is not a readable Parquet file", path.display())]
    NotParquet {
        /// The file.
        path: PathBuf,
        /// The Parquet reader's error.
        source: parquet::errors::ParquetError,
    },
    /// A Parquet file's reader cannot be built.
    #[error("reading {}", path.display())]
    ReadParquet {
        /// The file.
        path: PathBuf,
        /// The Parquet reader's error.
        source: parquet::errors::ParquetError,
    },
    /// A record batch of a Parquet file cannot be read.
    #[error("reading {}", path.display())]
    ReadBatch {
        /// The file.
        path: PathBuf,
        /// The Arrow error.
        source: arrow_schema::ArrowError,
    },
    /// A record batch of a Parquet file cannot be turned into JSON rows.
    #[error("{}: converting rows", path.display())]
    ConvertRows {
        /// The file.
        path: PathBuf,
        /// The Arrow error.
        source: arrow_schema::ArrowError,
    },
    /// A Parquet row converted to JSON does not parse back.
    #[error("{}: row {row}: converting to JSON", path.display())]
    RowJson {
        /// The file.
        path: PathBuf,
        /// The row index (0-based).
        row: usize,
        /// The parse error.
        source: serde_json::Error,
    },
    /// A Parquet row is not a valid prompt row.
    #[error("{}: row {row}", path.display())]
    Row {
        /// The file.
        path: PathBuf,
        /// The row index (0-based).
        row: usize,
        /// What is wrong with the row.
        source: Box<Error>,
    },
    /// A prompt file without prompts.
    #[error("{}: no prompts", path.display())]
    NoPrompts {
        /// The file.
        path: PathBuf,
    },
    /// A row that is not a JSON object.
    #[error("a row must be a JSON object, found {found}")]
    NotAnObject {
        /// The row.
        found: Value,
    },
    /// A row without any of the prompt columns.
    #[error("no prompt: expected a `prompt`, `messages`, `problem` or `question` column")]
    NoPrompt,
    /// A column holding a value of the wrong type.
    #[error("column `{column}`: expected {expected}, found {found}")]
    ColumnType {
        /// The column.
        column: &'static str,
        /// What it should hold.
        expected: &'static str,
        /// What it holds.
        found: Value,
    },
    /// A conversation column holding an empty list.
    #[error("column `{column}`: empty conversation")]
    EmptyConversation {
        /// The column.
        column: &'static str,
    },
    /// A message of a conversation without a string field.
    #[error("column `{column}`: message {message} has no string `{field}`: {found}")]
    MessageField {
        /// The column.
        column: &'static str,
        /// The message's index in the conversation.
        message: usize,
        /// The missing field (`role` or `content`).
        field: &'static str,
        /// The message.
        found: Value,
    },
    /// Metrics asked of no samples.
    #[error("no samples to evaluate")]
    NoSamples,
    /// A prompt whose number of rewards, answers or response shapes differs from the first
    /// prompt's.
    #[error(
        "prompt {prompt}: {rewards} rewards, {answers} answers and {shapes} response shapes, \
         expected {expected} of each"
    )]
    SampleCount {
        /// The prompt's index.
        prompt: usize,
        /// Its number of rewards.
        rewards: usize,
        /// Its number of answers.
        answers: usize,
        /// Its number of response shapes.
        shapes: usize,
        /// The number of samples of the first prompt.
        expected: usize,
    },
    /// The model in a directory cannot be loaded (configuration, memory, weights).
    #[error("loading the model in {}", dir.display())]
    LoadModel {
        /// The model directory.
        dir: PathBuf,
        /// The model crate's error.
        source: rlreplay_model::Error,
    },
    /// A prompt cannot be rendered or tokenized.
    #[error("prompt {index}")]
    Prompt {
        /// The prompt's row index.
        index: usize,
        /// The sampling crate's error.
        source: rlreplay_sampling::Error,
    },
    /// A model error.
    #[error(transparent)]
    Model(#[from] rlreplay_model::Error),
    /// A tokenizer, chat-template or sampling error.
    #[error(transparent)]
    Sampling(#[from] rlreplay_sampling::Error),
}

/// Result type of the evaluation crate.
pub type Result<T> = std::result::Result<T, Error>;
