//! Devices by name (`cpu`, `cuda`, `cuda:N`), and the CUDA memory pool: freed memory is kept for
//! reuse, and its high-water mark is what the device check reports as peak memory.

use candle_core::Device;

use crate::{Error, Result};

/// The device named `spec`: `cpu`, `cuda` (the first GPU) or `cuda:N`. A CUDA device keeps the
/// memory it frees in its pool for later allocations instead of returning it to the driver at
/// every synchronisation. Naming a CUDA device in a build without the `cuda` feature is an error
/// that says how to build one.
pub fn parse_device(spec: &str) -> Result<Device> {
    let spec = spec.trim();
    let ordinal = match spec {
        "cpu" => return Ok(Device::Cpu),
        "cuda" => 0,
        _ => spec
            .strip_prefix("cuda:")
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| {
                Error::Config(format!("device {spec:?}: expected cpu, cuda or cuda:N"))
            })?,
    };
    if !candle_core::utils::cuda_is_available() {
        return Err(Error::Config(format!(
            "device {spec:?}: this rlreplay was built without CUDA; build it with \
             `cargo build --release --features cuda` (scripts/check-cuda-build.sh does this \
             without a CUDA installation)"
        )));
    }
    let device =
        Device::new_cuda(ordinal).map_err(|e| Error::Config(format!("device {spec:?}: {e}")))?;
    cuda::keep_freed_memory(&device)?;
    Ok(device)
}

/// Bytes of device memory in use: `(peak since the last reset, total on the device)` for a CUDA
/// device (the peak is the high-water mark of its memory pool, where every tensor lives); `None`
/// on the CPU.
pub fn memory_peak(device: &Device) -> Result<Option<(u64, u64)>> {
    cuda::memory_peak(device)
}

/// Starts a new peak for [`memory_peak`] (no-op on the CPU).
pub fn reset_memory_peak(device: &Device) -> Result<()> {
    cuda::reset_memory_peak(device)
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{result, sys};
    use candle_core::Device;

    use crate::{Error, Result};

    fn err(e: impl std::fmt::Display) -> Error {
        Error::Config(format!("CUDA memory pool: {e}"))
    }

    /// The default memory pool of `device`'s GPU (where candle's stream-ordered allocations go).
    fn pool(device: &Device) -> Result<Option<sys::CUmemoryPool>> {
        let Device::Cuda(dev) = device else {
            return Ok(None);
        };
        let ctx = dev.cuda_stream().context().clone();
        ctx.bind_to_thread().map_err(err)?;
        // SAFETY: `cu_device` is the device handle of a live context.
        let pool = unsafe { result::device::get_default_mem_pool(ctx.cu_device()) }.map_err(err)?;
        Ok(Some(pool))
    }

    /// Sets an attribute of the pool of `device` whose value is a `u64`.
    fn set(device: &Device, attr: sys::CUmemPool_attribute, mut value: u64) -> Result<()> {
        if let Some(pool) = pool(device)? {
            // SAFETY: `pool` is a valid pool; the attribute's value type is `cuuint64_t`.
            unsafe { result::mem_pool::set_attribute(pool, attr, (&mut value as *mut u64).cast()) }
                .map_err(err)?;
        }
        Ok(())
    }

    pub(super) fn keep_freed_memory(device: &Device) -> Result<()> {
        set(
            device,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            u64::MAX,
        )
    }

    pub(super) fn memory_peak(device: &Device) -> Result<Option<(u64, u64)>> {
        let (Some(pool), Device::Cuda(dev)) = (pool(device)?, device) else {
            return Ok(None);
        };
        let mut peak = 0u64;
        // SAFETY: `pool` is a valid pool; the attribute's value type is `cuuint64_t`.
        unsafe {
            result::mem_pool::get_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                (&mut peak as *mut u64).cast(),
            )
        }
        .map_err(err)?;
        let total = dev.cuda_stream().context().total_mem().map_err(err)?;
        Ok(Some((peak, total as u64)))
    }

    pub(super) fn reset_memory_peak(device: &Device) -> Result<()> {
        set(
            device,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
            0,
        )
    }
}

#[cfg(not(feature = "cuda"))]
mod cuda {
    use candle_core::Device;

    use crate::Result;

    pub(super) fn keep_freed_memory(_: &Device) -> Result<()> {
        Ok(())
    }

    pub(super) fn memory_peak(_: &Device) -> Result<Option<(u64, u64)>> {
        Ok(None)
    }

    pub(super) fn reset_memory_peak(_: &Device) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_cuda_needs_the_feature() {
        assert!(parse_device("cpu").unwrap().is_cpu());
        assert!(parse_device(" cpu ").unwrap().is_cpu());
        for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", ""] {
            let err = parse_device(bad).unwrap_err().to_string();
            assert!(err.contains("expected cpu, cuda or cuda:N"), "{bad}: {err}");
        }
        if !candle_core::utils::cuda_is_available() {
            for spec in ["cuda", "cuda:1"] {
                let err = parse_device(spec).unwrap_err().to_string();
                assert!(err.contains("built without CUDA"), "{err}");
                assert!(err.contains("--features cuda"), "{err}");
            }
        }
        assert_eq!(memory_peak(&Device::Cpu).unwrap(), None);
        reset_memory_peak(&Device::Cpu).unwrap();
    }
}
