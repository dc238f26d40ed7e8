//! What a model needs in memory before it is built, checked against what its device has free, so
//! that an oversized configuration is refused with the estimate instead of failing mid-allocation.

use std::fmt;

use candle_core::{DType, Device};

use crate::model::master_dtype;
use crate::{Error, ModelConfig, Result};

/// What a model is built for: it decides what is held beside the master weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Forward passes only (log-probs; a teacher or reference model): the master weights.
    Inference,
    /// Sampling: the master weights and the decoder's copy of them in the compute dtype.
    Sampling,
    /// Training with AdamW: master weights, gradients and the two moment estimates, all in the
    /// master dtype.
    Training,
}

/// The memory a model holds for its whole life, by part, in bytes; activations (which depend on
/// the batch) are not included, so this is a lower bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// Number of parameters.
    pub parameters: u128,
    /// Dtype of the master weights, gradients and optimizer state.
    pub master_dtype: DType,
    /// Dtype of the forward pass (and of the decoder's copy).
    pub compute_dtype: DType,
    /// Master weights.
    pub weights: u128,
    /// The decoder's copy of the weights (sampling only).
    pub decoder: u128,
    /// Gradient buffers (training only).
    pub gradients: u128,
    /// AdamW's first and second moments (training only).
    pub optimizer: u128,
}

impl MemoryEstimate {
    /// The estimate for a model of `cfg` computing in `compute` (master weights in f32, or f64 for
    /// an f64 model), used for `workload`.
    pub fn new(cfg: &ModelConfig, compute: DType, workload: Workload) -> Self {
        let master = master_dtype(compute);
        let p = cfg.num_parameters();
        let m = p * master.size_in_bytes() as u128;
        let (decoder, gradients, optimizer) = match workload {
            Workload::Inference => (0, 0, 0),
            Workload::Sampling => (p * compute.size_in_bytes() as u128, 0, 0),
            Workload::Training => (0, m, 2 * m),
        };
        Self {
            parameters: p,
            master_dtype: master,
            compute_dtype: compute,
            weights: m,
            decoder,
            gradients,
            optimizer,
        }
    }

    /// All parts together.
    pub fn total(&self) -> u128 {
        self.weights + self.decoder + self.gradients + self.optimizer
    }

    /// Fails with the estimate when it exceeds `available` bytes (described by `what`, e.g. "free
    /// on cuda:0").
    pub fn check_against(&self, available: u64, what: &str) -> Result<()> {
        if self.total() <= u128::from(available) {
            return Ok(());
        }
        Err(Error::Memory(format!(
            "the model needs at least {self}, more than the {} {what}; choose a smaller model, \
             a lower-precision dtype or a machine with more memory",
            bytes(u128::from(available))
        )))
    }

    /// Fails with the estimate when it exceeds the memory available on `device` (on the CPU the
    /// system's available memory, bounded by the process's cgroup limit; on CUDA the device's
    /// free memory). Passes when the available memory cannot be known.
    pub fn check(&self, device: &Device) -> Result<()> {
        match available_memory(device) {
            Some((free, what)) => self.check_against(free, &what),
            None => Ok(()),
        }
    }
}

impl fmt::Display for MemoryEstimate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |d: DType| d.as_str();
        write!(
            f,
            "{} before activations ({:.2} G parameters: weights {} {}",
            bytes(self.total()),
            self.parameters as f64 / 1e9,
            bytes(self.weights),
            name(self.master_dtype)
        )?;
        if self.decoder > 0 {
            write!(
                f,
                ", decoder copy {} {}",
                bytes(self.decoder),
                name(self.compute_dtype)
            )?;
        }
        if self.gradients > 0 {
            write!(f, ", gradients {}", bytes(self.gradients))?;
        }
        if self.optimizer > 0 {
            write!(f, ", AdamW moments {}", bytes(self.optimizer))?;
        }
        write!(f, ")")
    }
}

/// A byte count in binary units (`512 B`, `1.5 KiB`, `550.0 GiB`).
fn bytes(n: u128) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// The memory available for new allocations on `device`, in bytes, with a description of where
/// it was read; `None` when it cannot be known.
pub fn available_memory(device: &Device) -> Option<(u64, String)> {
    match device {
        Device::Cpu => {
            let sys = sysinfo::System::new_with_specifics(
                sysinfo::RefreshKind::nothing()
                    .with_memory(sysinfo::MemoryRefreshKind::nothing().with_ram()),
            );
            let system = sys.available_memory();
            match sys.cgroup_limits() {
                Some(cg) if cg.free_memory < system => Some((
                    cg.free_memory,
                    "left under this process's cgroup limit".into(),
                )),
                _ if system > 0 => Some((system, "of memory available".into())),
                _ => None,
            }
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => {
            let cuda = device.as_cuda_device().ok()?;
            let (free, _total) = cuda.cuda_stream().context().mem_get_info().ok()?;
            Some((free as u64, "free on the GPU".into()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_by_workload() {
        let cfg = ModelConfig::tiny();
        let p = cfg.num_parameters();
        let inf = MemoryEstimate::new(&cfg, DType::F32, Workload::Inference);
        assert_eq!(inf.total(), 4 * p);
        let sample = MemoryEstimate::new(&cfg, DType::BF16, Workload::Sampling);
        assert_eq!((sample.weights, sample.decoder), (4 * p, 2 * p));
        let train = MemoryEstimate::new(&cfg, DType::F64, Workload::Training);
        assert_eq!(train.total(), 4 * 8 * p);
        assert_eq!(train.master_dtype, DType::F64);
    }

    #[test]
    fn refuses_with_the_estimate() {
        // The shape that once grew to 16 GB of RSS before aborting: vocab 16,777,216 x hidden
        // 8,192 (137 G parameters).
        let cfg = ModelConfig {
            vocab_size: 16_777_216,
            hidden_size: 8_192,
            intermediate_size: 8_192,
            num_hidden_layers: 1,
            num_attention_heads: 64,
            num_key_value_heads: 8,
            head_dim: 128,
            ..ModelConfig::tiny()
        };
        cfg.validate().unwrap();
        let est = MemoryEstimate::new(&cfg, DType::F32, Workload::Training);
        let err = est
            .check_against(16 << 30, "of memory available")
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("2.0 TiB before activations"), "{msg}");
        assert!(
            msg.contains("137.") && msg.contains("G parameters"),
            "{msg}"
        );
        assert!(msg.contains("AdamW moments 1.0 TiB"), "{msg}");
        assert!(
            msg.contains("more than the 16.0 GiB of memory available"),
            "{msg}"
        );
        assert!(est.check(&Device::Cpu).is_err());
        assert!(
            MemoryEstimate::new(&ModelConfig::tiny(), DType::F32, Workload::Training)
                .check(&Device::Cpu)
                .is_ok()
        );
    }

    #[test]
    fn cpu_memory_is_known() {
        let (free, what) = available_memory(&Device::Cpu).unwrap();
        assert!(free > 0, "{what}");
    }

    #[test]
    fn byte_units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(550 << 30), "550.0 GiB");
    }
}
