//! The trainer's side of data parallelism: the collectives a run's configuration calls for,
//! each rank's device, the resume point every rank shares, the step's timings reduced over the
//! ranks, and the [`DataParallel`] passes of an update as `[optim]` shards them.
//!
//! Every rank holds the whole trainer step (the same rows in the same order) and a full replica
//! of the policy; [`DataParallel`] splits the model passes by packs of rows and gathers their
//! per-token outputs (`ℓ_old`, the current log-probs, the teacher's log-probs of `rlsd` / `rlrt`
//! over packs of the teacher contexts) in row order. The rollout correction, the advantages over
//! whole groups, the loss normalisers (token and sequence counts of the whole mini-batch), the
//! loss, its per-token gradient and the loss metrics are then computed from the same numbers on
//! every rank: the loss is the single-process loss, bit for bit, and so is the update.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rlreplay_algo::MetricAccumulator;
use rlreplay_dist::{all_gather_named, Collective, DataParallel, Engine, Options};

use crate::config::{Config, TeacherRegularization};
use crate::error::{Error, Result};
use crate::rundir::{checkpoint_dir, Metrics, TIMING_PREFIXES};

/// The collectives of this process: one process unless a launcher (`mpirun`, `srun`) started
/// it, else MPI ranks on CPU or NCCL between the CUDA devices `[model] device` names (the NCCL
/// unique id travels through `out` when no MPI launcher started the job). A multi-rank start of
/// a build without the backend is an error, never independent runs writing one directory.
pub fn connect(cfg: &Config, out: &Path) -> Result<Box<dyn Collective>> {
    let engine = if cfg.model.device()?.is_cuda() {
        Engine::Nccl
    } else {
        Engine::Cpu
    };
    let opts = Options {
        engine,
        timeout: Duration::from_secs(cfg.trainer.collective_timeout_s.max(1)),
        rendezvous_dir: Some(out.to_path_buf()),
    };
    Ok(rlreplay_dist::init(&opts)?)
}

/// The device of this rank: `[model] device`, where a bare `cuda` on several ranks is the GPU
/// of the local rank among the visible ones (`CUDA_VISIBLE_DEVICES`; device 0 when the
/// launcher gave each process one, as `srun --gpus-per-task=1` does).
pub fn device(cfg: &Config, comm: &dyn Collective) -> Result<rlreplay_model::Device> {
    let device = cfg.model.device()?;
    if comm.world() == 1 || !device.is_cuda() || cfg.model.device.trim() != "cuda" {
        return Ok(device);
    }
    let ordinal = comm.placement().visible_device_ordinal()?;
    rlreplay_model::parse_device(&format!("cuda:{ordinal}"))
        .map_err(|e| Error::config("model.device", format!("[model] device: {e}")))
}

/// The checkpoint every rank starts from: rank 0's `resume_from` (found in the run directory
/// that rank 0 alone checks), sent to the others once rank 0 has prepared the run directory.
pub fn resume_point(
    comm: &dyn Collective,
    resume_from: Option<(u64, PathBuf)>,
    out: &Path,
) -> Result<Option<(u64, PathBuf)>> {
    if comm.world() == 1 {
        return Ok(resume_from);
    }
    let code = resume_from.as_ref().map_or(0, |(s, _)| s + 1);
    Ok(match comm.broadcast_u64(0, code)? {
        0 => None,
        s => Some((s - 1, checkpoint_dir(out, s - 1))),
    })
}

/// Reduces the step's timings (`timing_s/*`, `perf/*`: each rank measures its own) over the
/// ranks by their kind (means, `max`/`min` extremes); the other metrics are computed from the
/// same numbers on every rank and stay as they are.
pub fn reduce_timings(comm: &dyn Collective, metrics: &mut Metrics) -> Result<()> {
    if comm.world() == 1 {
        return Ok(());
    }
    let local: Metrics = metrics
        .iter()
        .filter(|(k, _)| TIMING_PREFIXES.iter().any(|p| k.starts_with(p)))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    let mut acc = MetricAccumulator::new();
    acc.add(&local, 1.0);
    let mine: Vec<(&str, f64, f64)> = acc.state().collect();
    let mut all = MetricAccumulator::new();
    for (name, v, w) in all_gather_named(comm, &mine)? {
        all.merge_state(&name, v, w);
    }
    metrics.extend(all.finish());
    Ok(())
}

/// The passes of `comm`'s ranks as `cfg` shards the optimizer: ZeRO-1 with
/// `[optim] shard_optimizer_state`, the master weights too unless something reads them after
/// every update (an EMA teacher; rank 0 writing each policy for inference servers).
pub fn data_parallel<'a>(comm: &'a dyn Collective, cfg: &Config) -> DataParallel<'a> {
    let shard = cfg.optim.shard_optimizer_state;
    let ema = cfg.uses_teacher()
        && cfg.self_distillation.teacher_regularization == TeacherRegularization::Ema;
    DataParallel::new(comm)
        .sharded(shard)
        .with_sharded_masters(shard && !ema && !cfg.source.needs_whole_weights(&cfg.rollout))
}
