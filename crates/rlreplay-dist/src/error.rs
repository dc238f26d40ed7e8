//! Errors of the distributed layer.

/// Every error the distributed layer reports.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    /// The launcher's environment is incomplete or inconsistent.
    #[error("launcher environment: {0}")]
    Launcher(String),
    /// The run asks for a backend this build does not have.
    #[error("{0}")]
    Unsupported(String),
    /// Buffers or shard layouts that do not fit together.
    #[error("shape: {0}")]
    Shape(String),
    /// A message from another rank that cannot be decoded.
    #[error("from rank {rank}: {msg}")]
    Message {
        /// The sending rank.
        rank: usize,
        /// What is wrong with it.
        msg: String,
    },
    /// A collective did not complete in time.
    #[error("{0}")]
    Timeout(String),
    /// The NCCL unique id could not be exchanged through the run directory.
    #[error("{0}")]
    Io(String),
    /// The collective engine reported an error.
    #[error("{backend}: {msg}")]
    Backend {
        /// `mpi` or `nccl`.
        backend: &'static str,
        /// The engine's message.
        msg: String,
    },
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// A model pass of a data-parallel update failed.
    #[error(transparent)]
    Model(#[from] rlreplay_model::Error),
    /// A collective of a data-parallel update failed (`what` says which).
    #[error("{what}")]
    During {
        /// The collective.
        what: &'static str,
        /// Why it failed.
        source: Box<DistError>,
    },
}

impl DistError {
    /// This error as the cause of the collective `what`.
    pub fn during(self, what: &'static str) -> Self {
        DistError::During {
            what,
            source: Box::new(self),
        }
    }
}

/// Result alias of the distributed layer.
pub type Result<T> = std::result::Result<T, DistError>;
