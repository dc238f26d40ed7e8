//! Data-parallel training on existing collective engines: MPI ranks on CPU (`mpi` feature) and
//! NCCL on CUDA devices (`nccl` feature), started by `mpirun`, `mpiexec`, `srun` or `torchrun`.
//!
//! - [`Collective`]: rank, world size, local rank, barrier, byte broadcast and all-gather,
//!   deterministic sum-all-reduce, reduce-scatter and all-gather of f32/f64 buffers (the last two
//!   on [`Shards`], for ZeRO-1). [`SingleProcess`] is one process: every collective is the
//!   identity.
//! - [`Placement`]: the launcher, rank and local rank from the environment; the local rank picks
//!   the GPU ([`Placement::device_ordinal`]).
//! - [`partition()`]: the rows of a mini-batch split across ranks, contiguous and token-balanced,
//!   whole groups kept together.
//! - [`all_gather_named`]: named, weighted values (metric states) from every rank.
//! - [`wire`]: the byte encoding of what ranks send each other.
//! - [`DataParallel`]: a model's passes shared out over the ranks by packs of rows, their
//!   per-token outputs gathered, the gradients summed and the optimizer step taken the same on
//!   every rank (ZeRO-1 optionally).
//! - [`init`]: the backend the environment and the build call for.
#![warn(missing_docs)]

pub mod collective;
pub mod data_parallel;
pub mod error;
pub mod launch;
pub mod metrics;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod partition;
pub mod rendezvous;
pub mod wire;

use std::path::PathBuf;
use std::time::Duration;

pub use collective::{sum_in_rank_order, Collective, Shards, SingleProcess};
pub use data_parallel::DataParallel;
pub use error::{DistError, Result};
pub use launch::{Launcher, Placement};
pub use metrics::all_gather_named;
pub use partition::{partition, partition_rows};

/// Default time a collective may wait for the other ranks before the job is aborted (torch's
/// default process-group timeout): long enough for rank 0 to write a large checkpoint while the
/// others wait at the next collective.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// Exit code of a job ended because a collective timed out.
pub const ABORT_CODE: i32 = 70;

/// Exit code of every process of a data-parallel job ended by an error on one rank.
pub const ERROR_CODE: i32 = 2;

/// `" on N ranks (backend)"` for a run log; empty on one process.
pub fn describe(comm: &dyn Collective) -> String {
    if comm.world() == 1 {
        String::new()
    } else {
        format!(" on {} ranks ({})", comm.world(), comm.backend())
    }
}

/// Which collective engine [`init`] starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Engine {
    /// MPI on CPU ranks; a single process when no launcher started this one.
    #[default]
    Cpu,
    /// NCCL between CUDA devices (the unique id travels over MPI when an MPI launcher started
    /// the job, else through a file in the run directory).
    Nccl,
}

/// How [`init`] sets up the collectives.
#[derive(Debug, Clone)]
pub struct Options {
    /// The engine.
    pub engine: Engine,
    /// How long a collective may wait for the other ranks.
    pub timeout: Duration,
    /// Directory shared by the ranks (the run directory) for the NCCL unique id when no MPI
    /// launcher started the job.
    pub rendezvous_dir: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            engine: Engine::Cpu,
            timeout: DEFAULT_TIMEOUT,
            rendezvous_dir: None,
        }
    }
}

/// The collectives for this process: [`SingleProcess`] when no launcher started it, else the
/// backend `opts` asks for. A launcher whose backend this build lacks is an error saying which
/// feature to build with.
pub fn init(opts: &Options) -> Result<Box<dyn Collective>> {
    let placement = Placement::from_env()?;
    match opts.engine {
        Engine::Cpu if placement.world == 1 && placement.launcher == Launcher::Single => {
            Ok(Box::new(SingleProcess::new()))
        }
        Engine::Cpu => init_mpi(&placement, opts),
        Engine::Nccl => init_nccl(placement, opts),
    }
}

/// MPI ranks for a job an MPI launcher started; any other multi-rank start is an error saying
/// what is missing (one body for every build, so that a lint pass with MPI checks it all).
#[cfg_attr(not(feature = "mpi"), allow(unused_variables))]
fn init_mpi(placement: &Placement, opts: &Options) -> Result<Box<dyn Collective>> {
    #[cfg(feature = "mpi")]
    if placement.launcher.is_mpi() {
        return Ok(Box::new(mpi::MpiCollective::init(opts.timeout)?));
    }
    Err(DistError::Unsupported(if cfg!(feature = "mpi") {
        format!(
            "started by {} with {} ranks: CPU ranks need an MPI launcher (mpirun, mpiexec, srun)",
            placement.launcher, placement.world
        )
    } else {
        format!(
            "started by {} as rank {} of {}, but this build has no MPI support; rebuild with \
             `--features mpi` (needs an MPI library such as Open MPI, and libclang)",
            placement.launcher, placement.rank, placement.world
        )
    }))
}

#[cfg(feature = "nccl")]
fn init_nccl(placement: Placement, opts: &Options) -> Result<Box<dyn Collective>> {
    Ok(Box::new(nccl::NcclCollective::init(placement, opts)?))
}

#[cfg(not(feature = "nccl"))]
fn init_nccl(placement: Placement, _opts: &Options) -> Result<Box<dyn Collective>> {
    Err(DistError::Unsupported(format!(
        "NCCL requested (rank {} of {}), but this build has no NCCL support; rebuild with \
         `--features cuda,nccl`",
        placement.rank, placement.world
    )))
}
