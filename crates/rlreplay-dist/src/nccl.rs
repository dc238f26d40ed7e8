//! The NCCL backend (cudarc through candle): one process per GPU, the local rank picks the
//! device.
//!
//! **Rendezvous.** Rank 0 creates the 128-byte NCCL unique id. Under an MPI launcher (with the
//! `mpi` feature) it travels by MPI broadcast, and MPI also carries the byte collectives and
//! the failure diagnosis; otherwise (torchrun) it goes through the run directory
//! ([`crate::rendezvous`]), and rank 0 removes the file once the communicator is up.
//!
//! **Sums.** NCCL's own `Sum`: every rank gets the same bits, but the grouping depends on
//! NCCL's algorithm (ring, tree, NVLS) and protocol, so runs are reproducible only with them
//! pinned (`NCCL_ALGO=Ring NCCL_PROTO=Simple NCCL_NVLS_ENABLE=0`) and the same number of GPUs.
//! The rank-ordered sums of the MPI backend are what the CPU tests compare bit for bit.
//!
//! **Failure.** Each collective is followed by an event that is polled against the timeout;
//! with MPI, the report names the ranks that did not answer (as the MPI backend does), without
//! it the rank prints what it waited for and exits, and the launcher ends the others.

use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits,
};
use candle_core::cuda_backend::cudarc::nccl::safe::{Comm, Id, NcclType, ReduceOp};
use candle_core::cuda_backend::CudaDType;
use candle_core::{CpuStorage, CudaStorage, DType, Device, Layout, Shape, Tensor};

use crate::collective::{check_root, Collective, Shards};
use crate::error::{DistError, Result};
use crate::launch::Placement;
use crate::{rendezvous, Options};

/// Data-parallel ranks on NCCL, one CUDA device each.
pub struct NcclCollective {
    comm: Comm,
    stream: Arc<CudaStream>,
    device: Device,
    placement: Placement,
    timeout: Duration,
    /// MPI for the unique id, the byte collectives and the failure report, when an MPI
    /// launcher started the job. Last: it finalizes MPI after the communicator is gone.
    #[cfg(feature = "mpi")]
    host: Option<crate::mpi::MpiCollective>,
}

impl std::fmt::Debug for NcclCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclCollective")
            .field("placement", &self.placement)
            .field("timeout", &self.timeout)
            .finish()
    }
}

fn nccl_err(e: impl std::fmt::Debug) -> DistError {
    DistError::Backend {
        backend: "nccl",
        msg: format!("{e:?}"),
    }
}

impl NcclCollective {
    /// Joins the NCCL communicator on the device of this process's local rank.
    pub fn init(placement: Placement, opts: &Options) -> Result<Self> {
        #[cfg(feature = "mpi")]
        let host = if placement.launcher.is_mpi() {
            Some(crate::mpi::MpiCollective::init(opts.timeout)?)
        } else {
            None
        };
        #[cfg(feature = "mpi")]
        let placement = match &host {
            Some(h) => h.placement().clone(),
            None => placement,
        };
        let visible = CudaContext::device_count().map_err(nccl_err)? as usize;
        let ordinal = placement.device_ordinal(visible)?;
        let device = Device::new_cuda(ordinal)?;
        let stream = device.as_cuda_device()?.cuda_stream();
        let (rank, world) = (placement.rank, placement.world);
        let mut id_bytes: Vec<u8> = Vec::new();
        if rank == 0 {
            let id = Id::new().map_err(nccl_err)?;
            id_bytes = id.internal().iter().map(|&c| c as u8).collect();
        }
        #[cfg(feature = "mpi")]
        let via_mpi = host.is_some();
        #[cfg(not(feature = "mpi"))]
        let via_mpi = false;
        let file = if via_mpi {
            #[cfg(feature = "mpi")]
            if let Some(h) = &host {
                h.broadcast_bytes(0, &mut id_bytes)?;
            }
            None
        } else {
            let dir = opts.rendezvous_dir.as_deref().ok_or_else(|| {
                DistError::Unsupported(
                    "NCCL without an MPI launcher exchanges its unique id through the run \
                     directory, and none was given"
                        .into(),
                )
            })?;
            let key = rendezvous::launch_key(|k| std::env::var(k).ok());
            let path = rendezvous::path(dir, "nccl-id", &key);
            if rank == 0 {
                rendezvous::publish(&path, &id_bytes)?;
            } else {
                id_bytes = rendezvous::wait_for(&path, opts.timeout)?;
            }
            Some(path)
        };
        let internal: [std::ffi::c_char; 128] = id_bytes
            .iter()
            .map(|&b| b as std::ffi::c_char)
            .collect::<Vec<_>>()
            .try_into()
            .map_err(|v: Vec<_>| DistError::Message {
                rank: 0,
                msg: format!("NCCL unique id of {} bytes, expected 128", v.len()),
            })?;
        let comm =
            Comm::from_rank(stream.clone(), rank, world, Id::uninit(internal)).map_err(nccl_err)?;
        if let (0, Some(path)) = (rank, file) {
            // Every rank has joined, so every rank has read the id.
            let _ = std::fs::remove_file(path);
        }
        Ok(Self {
            comm,
            stream,
            device,
            placement,
            timeout: opts.timeout,
            #[cfg(feature = "mpi")]
            host,
        })
    }

    /// The CUDA device of this rank; models and gradients must live on it.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Waits for the work queued on the stream so far, against the timeout.
    fn finish(&self, op: &'static str) -> Result<()> {
        let event = self.stream.record_event(None).map_err(nccl_err)?;
        #[cfg(feature = "mpi")]
        if let Some(h) = &self.host {
            h.begin(crate::mpi::Op::AllReduce);
            h.watch(crate::mpi::Op::AllReduce, || event.is_complete());
            return Ok(());
        }
        let start = Instant::now();
        while !event.is_complete() {
            if start.elapsed() > self.timeout {
                eprintln!(
                    "rank {}: NCCL {op} did not complete within {:.0} s; exiting so that the \
                     launcher ends the other ranks",
                    self.placement.rank,
                    self.timeout.as_secs_f64()
                );
                std::process::exit(crate::ABORT_CODE);
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }

    /// Sum-all-reduce of a host buffer through the device.
    fn all_reduce_host<T: NcclType + DeviceRepr + Copy>(&self, buf: &mut [T]) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let mut dev = self.stream.clone_htod(buf).map_err(nccl_err)?;
        self.comm
            .all_reduce_in_place(&mut dev, &ReduceOp::Sum)
            .map_err(nccl_err)?;
        self.finish("all-reduce")?;
        self.stream.memcpy_dtoh(&dev, buf).map_err(nccl_err)?;
        self.stream.synchronize().map_err(nccl_err)
    }

    /// NCCL's reduce-scatter and all-gather take equal pieces: shards are padded to the longest.
    fn reduce_scatter_host<T: NcclType + DeviceRepr + ValidAsZeroBits + Copy + Default>(
        &self,
        input: &[T],
        shards: &Shards,
        out: &mut [T],
    ) -> Result<()> {
        let (world, me) = (self.placement.world, self.placement.rank);
        shards.check(world, input.len(), "reduce-scatter")?;
        let width = shards.ranges().iter().map(|r| r.len()).max().unwrap_or(0);
        if width == 0 {
            return Ok(());
        }
        let mut padded = vec![T::default(); width * world];
        for (r, range) in shards.ranges().iter().enumerate() {
            padded[r * width..r * width + range.len()].copy_from_slice(&input[range.clone()]);
        }
        let send = self.stream.clone_htod(&padded).map_err(nccl_err)?;
        let mut recv: CudaSlice<T> = self.stream.alloc_zeros(width).map_err(nccl_err)?;
        self.comm
            .reduce_scatter(&send, &mut recv, &ReduceOp::Sum)
            .map_err(nccl_err)?;
        self.finish("reduce-scatter")?;
        let mine = self.stream.clone_dtoh(&recv).map_err(nccl_err)?;
        out.copy_from_slice(&mine[..shards.range(me).len()]);
        Ok(())
    }

    fn all_gather_host<T: NcclType + DeviceRepr + ValidAsZeroBits + Copy + Default>(
        &self,
        mine: &[T],
        shards: &Shards,
        out: &mut [T],
    ) -> Result<()> {
        let world = self.placement.world;
        shards.check(world, out.len(), "all-gather")?;
        let width = shards.ranges().iter().map(|r| r.len()).max().unwrap_or(0);
        if width == 0 {
            return Ok(());
        }
        let mut padded = vec![T::default(); width];
        padded[..mine.len()].copy_from_slice(mine);
        let send = self.stream.clone_htod(&padded).map_err(nccl_err)?;
        let mut recv: CudaSlice<T> = self.stream.alloc_zeros(width * world).map_err(nccl_err)?;
        self.comm.all_gather(&send, &mut recv).map_err(nccl_err)?;
        self.finish("all-gather")?;
        let all = self.stream.clone_dtoh(&recv).map_err(nccl_err)?;
        for (r, range) in shards.ranges().iter().enumerate() {
            out[range.clone()].copy_from_slice(&all[r * width..r * width + range.len()]);
        }
        Ok(())
    }
}

/// All-reduce (sum) of a contiguous CUDA tensor on the communicator's stream.
struct AllReduceOp<'a> {
    comm: &'a Comm,
}

impl AllReduceOp<'_> {
    fn reduce<T: CudaDType + NcclType + DeviceRepr + ValidAsZeroBits>(
        &self,
        s: &CudaStorage,
        range: (usize, usize),
    ) -> candle_core::Result<CudaStorage> {
        let src = s.as_cuda_slice::<T>()?.slice(range.0..range.1);
        let mut dst = s.device.alloc_zeros::<T>(range.1 - range.0)?;
        self.comm
            .all_reduce(&src, &mut dst, &ReduceOp::Sum)
            .map_err(|e| candle_core::Error::Msg(format!("NCCL all-reduce: {e:?}")))?;
        Ok(CudaStorage::wrap_cuda_slice(dst, s.device.clone()))
    }
}

impl candle_core::CustomOp1 for AllReduceOp<'_> {
    fn name(&self) -> &'static str {
        "nccl-all-reduce"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("NCCL all-reduce of a tensor in host memory")
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let range = l
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("NCCL all-reduce of a strided tensor".into()))?;
        let out = match s.dtype() {
            DType::F32 => self.reduce::<f32>(s, range)?,
            DType::F64 => self.reduce::<f64>(s, range)?,
            DType::BF16 => self.reduce::<half::bf16>(s, range)?,
            DType::F16 => self.reduce::<half::f16>(s, range)?,
            dt => candle_core::bail!("NCCL all-reduce of a {dt:?} tensor"),
        };
        Ok((out, l.shape().clone()))
    }
}

impl Collective for NcclCollective {
    fn backend(&self) -> &'static str {
        "nccl"
    }

    fn placement(&self) -> &Placement {
        &self.placement
    }

    fn abort(&self, code: i32) -> ! {
        #[cfg(feature = "mpi")]
        if let Some(h) = &self.host {
            h.abort(code)
        }
        std::process::exit(code)
    }

    fn barrier(&self) -> Result<()> {
        #[cfg(feature = "mpi")]
        if let Some(h) = &self.host {
            return h.barrier();
        }
        self.all_reduce_host(&mut [0f32])
    }

    fn broadcast_bytes(&self, root: usize, bytes: &mut Vec<u8>) -> Result<()> {
        check_root(root, self.placement.world)?;
        #[cfg(feature = "mpi")]
        if let Some(h) = &self.host {
            return h.broadcast_bytes(root, bytes);
        }
        let mut len = [if self.placement.rank == root {
            bytes.len() as u64
        } else {
            0
        }];
        self.all_reduce_host(&mut len)?;
        bytes.resize(len[0] as usize, 0);
        if bytes.is_empty() {
            return Ok(());
        }
        let mut dev = self.stream.clone_htod(bytes.as_slice()).map_err(nccl_err)?;
        self.comm
            .broadcast_in_place(&mut dev, root as i32)
            .map_err(nccl_err)?;
        self.finish("broadcast")?;
        self.stream
            .memcpy_dtoh(&dev, bytes.as_mut_slice())
            .map_err(nccl_err)?;
        self.stream.synchronize().map_err(nccl_err)
    }

    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        #[cfg(feature = "mpi")]
        if let Some(h) = &self.host {
            return h.all_gather_bytes(mine);
        }
        let world = self.placement.world;
        let mut lens = vec![0u64; world];
        lens[self.placement.rank] = mine.len() as u64;
        self.all_reduce_host(&mut lens)?;
        let width = lens.iter().copied().max().unwrap_or(0) as usize;
        let shards = Shards::from_ranges((0..world).map(|r| r * width..(r + 1) * width).collect())?;
        let mut padded = vec![0u8; width];
        padded[..mine.len()].copy_from_slice(mine);
        let mut all = vec![0u8; width * world];
        self.all_gather_host(&padded, &shards, &mut all)?;
        Ok(lens
            .iter()
            .enumerate()
            .map(|(r, &l)| all[r * width..r * width + l as usize].to_vec())
            .collect())
    }

    fn reduce_scatter_sum_f32(&self, input: &[f32], s: &Shards, out: &mut [f32]) -> Result<()> {
        self.reduce_scatter_host(input, s, out)
    }

    fn reduce_scatter_sum_f64(&self, input: &[f64], s: &Shards, out: &mut [f64]) -> Result<()> {
        self.reduce_scatter_host(input, s, out)
    }

    fn all_gather_f32(&self, mine: &[f32], s: &Shards, out: &mut [f32]) -> Result<()> {
        self.all_gather_host(mine, s, out)
    }

    fn all_gather_f64(&self, mine: &[f64], s: &Shards, out: &mut [f64]) -> Result<()> {
        self.all_gather_host(mine, s, out)
    }

    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()> {
        self.all_reduce_host(buf)
    }

    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()> {
        self.all_reduce_host(buf)
    }

    fn all_reduce_sum_tensor(&self, t: &Tensor) -> Result<Tensor> {
        if !t.device().is_cuda() {
            let on_device = t.to_device(&self.device)?;
            return Ok(self
                .all_reduce_sum_tensor(&on_device)?
                .to_device(t.device())?);
        }
        let out = t
            .contiguous()?
            .apply_op1_no_bwd(&AllReduceOp { comm: &self.comm })?;
        self.finish("all-reduce")?;
        Ok(out)
    }
}
