//! Errors of the algorithm layer.

use std::fmt;

/// Where a non-finite value was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// Name of the input array (e.g. `logprobs`).
    pub field: &'static str,
    /// Row index within the batch passed in (mini-batch row for micro-batches).
    pub row: usize,
    /// Token index within the row, for per-token inputs.
    pub token: Option<usize>,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.token {
            Some(t) => write!(f, "`{}` at row {}, token {}", self.field, self.row, t),
            None => write!(f, "`{}` at row {}", self.field, self.row),
        }
    }
}

/// Every error the algorithm layer reports.
#[derive(Debug, thiserror::Error)]
pub enum AlgoError {
    /// A config value is out of range or inconsistent with another key.
    #[error("config key `{key}`: {msg}")]
    Config {
        /// The offending key.
        key: &'static str,
        /// What is wrong with it.
        msg: String,
    },
    /// A registry name (estimator, loss, aggregation, ...) is not known.
    #[error("unknown {kind} `{name}`; valid: {valid}")]
    UnknownName {
        /// Which registry (`adv_estimator`, `loss_mode`, ...).
        kind: &'static str,
        /// The name that was given.
        name: String,
        /// The valid names, comma separated.
        valid: String,
    },
    /// NaN or infinity in an input.
    #[error("non-finite value {value} in {at}")]
    NonFinite {
        /// Where it was found.
        at: Location,
        /// The value itself.
        value: f64,
    },
    /// Array lengths or offsets that do not fit together.
    #[error("shape: {0}")]
    Shape(String),
    /// An input the selected algorithm needs is missing.
    #[error("missing input: {0}")]
    Missing(String),
    /// An estimator's precondition does not hold for this batch.
    #[error("{0}")]
    Invalid(String),
}

/// Result alias of the algorithm layer.
pub type Result<T> = std::result::Result<T, AlgoError>;
