//! Which launcher started this process, and where it placed it: rank, world size and local rank
//! from the launcher's environment, and the GPU the local rank drives.
//!
//! | meaning | torchrun | Open MPI | MPICH (Hydra) | SLURM `srun` |
//! |---|---|---|---|---|
//! | rank | `RANK` | `OMPI_COMM_WORLD_RANK` | `PMI_RANK` | `SLURM_PROCID` |
//! | world | `WORLD_SIZE` | `OMPI_COMM_WORLD_SIZE` | `PMI_SIZE` | `SLURM_STEP_NUM_TASKS` (else `SLURM_NTASKS`) |
//! | local rank | `LOCAL_RANK` | `OMPI_COMM_WORLD_LOCAL_RANK` | `MPI_LOCALRANKID` | `SLURM_LOCALID` |
//! | local size | `LOCAL_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_SIZE` | `MPI_LOCALNRANKS` | `SLURM_STEP_TASKS_PER_NODE` (first entry) |
//!
//! Detection order: torchrun, Open MPI, MPICH, SLURM. torchrun sets its variables explicitly
//! (even inside a SLURM allocation), and `mpirun` inside an allocation sets its own on top of
//! SLURM's; a SLURM step is recognised by `SLURM_PROCID` together with a task count, so a batch
//! script that runs the program directly (no `srun`) is a single process only when
//! `SLURM_PROCID` is absent.

use std::fmt;

use crate::error::{DistError, Result};

/// The program that started this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// No launcher: one process.
    Single,
    /// `torchrun` / `torch.distributed.run` (`RANK`, `WORLD_SIZE`, ...).
    Torchrun,
    /// Open MPI's `mpirun` / `mpiexec` (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// MPICH's Hydra `mpiexec` (`PMI_*`, `MPI_LOCAL*`).
    Mpich,
    /// SLURM's `srun` (`SLURM_PROCID`, ...).
    Slurm,
}

impl Launcher {
    /// True for the launchers that start MPI processes (`mpirun`, `mpiexec`, `srun`).
    pub fn is_mpi(self) -> bool {
        matches!(self, Self::OpenMpi | Self::Mpich | Self::Slurm)
    }
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Single => "single process",
            Self::Torchrun => "torchrun",
            Self::OpenMpi => "Open MPI",
            Self::Mpich => "MPICH",
            Self::Slurm => "SLURM",
        })
    }
}

/// Where the launcher placed this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The launcher.
    pub launcher: Launcher,
    /// This process's rank, `0..world`.
    pub rank: usize,
    /// Number of processes.
    pub world: usize,
    /// Rank among the processes on this node.
    pub local_rank: usize,
    /// Processes on this node, when the launcher says.
    pub local_world: Option<usize>,
}

impl Placement {
    /// One process.
    pub fn single() -> Self {
        Self {
            launcher: Launcher::Single,
            rank: 0,
            world: 1,
            local_rank: 0,
            local_world: Some(1),
        }
    }

    /// The placement described by this process's environment.
    pub fn from_env() -> Result<Self> {
        Self::detect(|k| std::env::var(k).ok())
    }

    /// The placement described by the variables `var` returns (see the module table). An
    /// unparsable or out-of-range value is an error naming the variable.
    pub fn detect(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        // (launcher, rank, world, local rank, local size); the first of each list that is set.
        type Names = (
            Launcher,
            &'static str,
            &'static [&'static str],
            &'static str,
            &'static str,
        );
        const LAUNCHERS: [Names; 4] = [
            (
                Launcher::Torchrun,
                "RANK",
                &["WORLD_SIZE"],
                "LOCAL_RANK",
                "LOCAL_WORLD_SIZE",
            ),
            (
                Launcher::OpenMpi,
                "OMPI_COMM_WORLD_RANK",
                &["OMPI_COMM_WORLD_SIZE"],
                "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
            ),
            (
                Launcher::Mpich,
                "PMI_RANK",
                &["PMI_SIZE"],
                "MPI_LOCALRANKID",
                "MPI_LOCALNRANKS",
            ),
            (
                Launcher::Slurm,
                "SLURM_PROCID",
                &["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"],
                "SLURM_LOCALID",
                "SLURM_STEP_TASKS_PER_NODE",
            ),
        ];
        let number = |name: &str, value: &str| -> Result<usize> {
            // SLURM's per-node task counts look like `4(x2),3`: the first entry is this node's
            // only when the nodes are uniform, which is what a data-parallel run asks for.
            let first = value.split([',', '(']).next().unwrap_or(value).trim();
            first.parse().map_err(|_| {
                DistError::Launcher(format!(
                    "`{name}` = `{value}` is not a non-negative integer"
                ))
            })
        };
        for (launcher, rank_var, world_vars, local_var, local_world_var) in LAUNCHERS {
            let Some(rank) = var(rank_var) else { continue };
            let Some((world_var, world)) = world_vars.iter().find_map(|w| var(w).map(|v| (*w, v)))
            else {
                continue;
            };
            let rank = number(rank_var, &rank)?;
            let world = number(world_var, &world)?;
            if world == 0 || rank >= world {
                return Err(DistError::Launcher(format!(
                    "{launcher}: rank {rank} (`{rank_var}`) is not below the world size {world} \
                     (`{world_var}`)"
                )));
            }
            let local_rank = match var(local_var) {
                Some(v) => number(local_var, &v)?,
                None if world == 1 => 0,
                None => {
                    return Err(DistError::Launcher(format!(
                        "{launcher}: `{local_var}` is not set, so the local rank (which picks \
                         the GPU) is unknown"
                    )))
                }
            };
            let local_world = var(local_world_var)
                .map(|v| number(local_world_var, &v))
                .transpose()?;
            if let Some(lw) = local_world {
                if local_rank >= lw {
                    return Err(DistError::Launcher(format!(
                        "{launcher}: local rank {local_rank} (`{local_var}`) is not below the \
                         local size {lw} (`{local_world_var}`)"
                    )));
                }
            }
            return Ok(Self {
                launcher,
                rank,
                world,
                local_rank,
                local_world,
            });
        }
        Ok(Self::single())
    }

    /// The CUDA device ordinal this process drives among `visible` devices: the local rank, or
    /// device 0 when the launcher gave each process exactly one device (`srun --gpus-per-task=1`
    /// sets `CUDA_VISIBLE_DEVICES` per task). More processes on a node than devices is an error:
    /// two ranks on one GPU would contend for its memory.
    pub fn device_ordinal(&self, visible: usize) -> Result<usize> {
        match visible {
            0 => Err(DistError::Launcher(format!(
                "rank {}: no CUDA device is visible",
                self.rank
            ))),
            1 => Ok(0),
            n if self.local_rank < n => Ok(self.local_rank),
            n => Err(DistError::Launcher(format!(
                "rank {} has local rank {} but only {n} CUDA devices are visible on its node; \
                 start at most {n} processes per node",
                self.rank, self.local_rank
            ))),
        }
    }

    /// [`Placement::device_ordinal`] among the devices this process sees: those
    /// `CUDA_VISIBLE_DEVICES` lists, else (unset) the node's process count, else as many as
    /// the local rank needs.
    pub fn visible_device_ordinal(&self) -> Result<usize> {
        let visible = std::env::var("CUDA_VISIBLE_DEVICES")
            .ok()
            .map(|v| v.split(',').filter(|d| !d.trim().is_empty()).count())
            .or(self.local_world)
            .unwrap_or(self.local_rank + 1);
        self.device_ordinal(visible)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn detect(vars: &[(&str, &str)]) -> Result<Placement> {
        let env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Placement::detect(|k| env.get(k).cloned())
    }

    #[test]
    fn no_launcher_is_one_process() {
        assert_eq!(detect(&[]).unwrap(), Placement::single());
        // A batch script without srun has SLURM's allocation variables but no task id.
        assert_eq!(
            detect(&[("SLURM_NTASKS", "8"), ("SLURM_JOB_ID", "12")]).unwrap(),
            Placement::single()
        );
    }

    #[test]
    fn each_launcher_is_recognised() {
        let ompi = detect(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ])
        .unwrap();
        assert_eq!(
            ompi,
            Placement {
                launcher: Launcher::OpenMpi,
                rank: 3,
                world: 4,
                local_rank: 1,
                local_world: Some(2)
            }
        );
        let mpich = detect(&[
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
            ("MPI_LOCALRANKID", "1"),
            ("MPI_LOCALNRANKS", "2"),
        ])
        .unwrap();
        assert_eq!(
            (mpich.launcher, mpich.rank, mpich.local_rank),
            (Launcher::Mpich, 1, 1)
        );
        let slurm = detect(&[
            ("SLURM_PROCID", "9"),
            ("SLURM_NTASKS", "32"),
            ("SLURM_STEP_NUM_TASKS", "16"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_STEP_TASKS_PER_NODE", "8(x2)"),
        ])
        .unwrap();
        assert_eq!(
            slurm,
            Placement {
                launcher: Launcher::Slurm,
                rank: 9,
                world: 16,
                local_rank: 1,
                local_world: Some(8)
            }
        );
        let torch = detect(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")]).unwrap();
        assert_eq!((torch.launcher, torch.world), (Launcher::Torchrun, 2));
        assert!(Launcher::Slurm.is_mpi() && !Launcher::Torchrun.is_mpi());
    }

    #[test]
    fn mpirun_inside_an_allocation_is_open_mpi() {
        let p = detect(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "0"),
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "5"),
        ])
        .unwrap();
        assert_eq!((p.launcher, p.rank), (Launcher::OpenMpi, 5));
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = detect(&[("PMI_RANK", "x"), ("PMI_SIZE", "2")]).unwrap_err();
        assert!(e.to_string().contains("`PMI_RANK` = `x`"), "{e}");
        let e = detect(&[("RANK", "2"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")]).unwrap_err();
        assert!(e.to_string().contains("not below the world size 2"), "{e}");
        let e = detect(&[("RANK", "1"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert!(e.to_string().contains("`LOCAL_RANK` is not set"), "{e}");
    }

    #[test]
    fn local_rank_picks_the_device() {
        let mut p = Placement::single();
        p.local_rank = 3;
        assert_eq!(p.device_ordinal(8).unwrap(), 3);
        assert_eq!(p.device_ordinal(1).unwrap(), 0);
        assert!(p
            .device_ordinal(2)
            .unwrap_err()
            .to_string()
            .contains("only 2 CUDA devices"));
        assert!(p.device_ordinal(0).is_err());
    }
}
