//! Causal language models (Qwen3, Qwen2/Qwen2.5, Llama) on candle: packed per-token log-probs,
//! backward, AdamW and Hugging Face checkpoints.
//!
//! - [`Model`]: a model of any [`Architecture`] with f32 (or f64) master weights. The
//!   architectures differ only in what their decoder layers hold ([`layer`]), so one type serves
//!   them all and every caller (trainer, sampler, server) takes it;
//!   [`Model::logprobs`] for per-token log-probs of packed (prompt, response) pairs,
//!   [`Model::forward_backward`] to accumulate the gradients of a weighted sum of those log-probs;
//!   [`Model::load`] / [`Model::save_hf`] for checkpoints in the Hugging Face layout;
//!   [`Model::set_activation_recompute`] trades a second forward pass of the layers for activation
//!   memory in the backward pass.
//! - [`layer`]: the decoder layer (named weights, one definition of its math); [`qwen3`],
//!   [`qwen2`] and [`llama`]: what each architecture adds. [`RopeScaling`]: Llama 3.1's rotary
//!   frequency scaling.
//! - [`lora`]: LoRA adapters ([`LoraConfig`], [`Model::add_lora`], [`Model::load_adapter`],
//!   [`Model::save_adapter`] in PEFT's layout, [`Model::merge_lora`]); with adapters on, only
//!   they are trainable.
//! - [`generate::Decoder`]: the KV-cache decoder sampling runs on.
//! - [`ModelConfig`]: the configuration, read from a Hugging Face `config.json`.
//! - [`parse_device`]: `cpu`, `cuda` or `cuda:N` (CUDA with the `cuda` feature); [`memory_peak`]
//!   for the peak device memory.
//! - [`mixed_logprobs`]: per-token log-probs under a weighted mixture of several models' logits.
//! - [`MemoryEstimate`]: what a model of a configuration needs (weights, and for its
//!   [`Workload`] a decoder copy or gradients and optimizer state), checked against the device's
//!   available memory before anything is allocated.
//! - [`AdamW`], [`LrSchedule`]: the optimizer (verl/torch semantics) and learning-rate schedules.
//! - [`golden`]: the golden fixtures' format (transformers' float64 references).
//! - [`gguf::convert`]: a llama.cpp GGUF file (Llama, Qwen2, Qwen3) as a Hugging Face model
//!   directory.
#![warn(missing_docs)]

mod checkpoint;
mod config;
mod device;
pub mod generate;
pub mod gguf;
pub mod golden;
pub mod layer;
pub mod llama;
pub mod lora;
mod memory;
mod mixed;
mod model;
pub mod ops;
mod optim;
mod pack;
pub mod qwen2;
pub mod qwen3;

pub use candle_core::{DType, Device};
pub use checkpoint::{SaveOptions, TOKENIZER_FILES};
pub use config::{Architecture, ModelConfig, RopeScaling};
pub use device::{memory_peak, parse_device, reset_memory_peak};
pub use lora::{LoraConfig, LoraTarget};
pub use memory::{available_memory, MemoryEstimate, Workload};
pub use mixed::mixed_logprobs;
pub use model::{HeldWeights, Model, Param, TokenLogProbs};
pub use optim::{AdamW, AdamWConfig, LrSchedule, StepReport};
pub use pack::{micro_batches, SeqPair};

/// Errors of the model crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An invalid or unsupported model configuration.
    #[error("{0}")]
    Config(String),
    /// A checkpoint that cannot be read or written (missing, extra or mis-shaped tensors, ...).
    #[error("{0}")]
    Checkpoint(String),
    /// Invalid input to a model call (token ids, gradient lengths, ...).
    #[error("{0}")]
    Input(String),
    /// Not enough memory for the model, with the estimate and what is available.
    #[error("{0}")]
    Memory(String),
    /// A file-system error, with the path it concerns.
    #[error("{0}")]
    Io(String),
    /// An error of the tensor library.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// The worker thread pool cannot be started.
    #[error("cannot start the worker threads: {0}")]
    Threads(String),
}

/// Result type of the model crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Runs candle's elementwise CPU ops on the calling thread (`CANDLE_NUM_THREADS=1`) unless the
/// environment already sets `CANDLE_NUM_THREADS`. candle's own pool for them busy-waits between
/// ops and so competes with the rayon threads of the matrix multiplies and of this crate's
/// kernels; on two cores it took most of the time of a small model's training step. Call it
/// first thing in `main`.
///
/// # Safety
///
/// It sets an environment variable, so no other thread may read or write the environment while
/// it runs: call it before spawning any thread.
pub unsafe fn keep_candle_elementwise_on_caller() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        // SAFETY: the caller guarantees that no other thread touches the environment.
        unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    }
}

/// Runs `f` on a worker thread of the current rayon pool (directly when the caller already is
/// one) and returns its result. The kernels' parallel loops and the matrix multiplies started from
/// a worker run their first share on that worker and, with one thread, run inline; started from
/// any other thread, each one is handed to the pool and the caller sleeps until it is done, two
/// thread switches per op (about a fifth of the tiny benchmark model's single-threaded training
/// step). The model's forward, backward and decoding entry points call it; a caller may wrap a
/// longer stretch of work.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}

/// The worker threads to start for a request of `threads` (0: the default pool over every
/// core): at most the machine's cores unless `force` (more threads than cores only contend), and
/// the warning to give when the request was capped.
pub fn worker_threads(threads: usize, force: bool) -> (usize, Option<String>) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if threads > cores && !force {
        let warning = format!(
            "{threads} worker threads requested on a machine with {cores} cores: using {cores} \
             (force it with [trainer] force_threads = true or --force-threads)"
        );
        (cores, Some(warning))
    } else {
        (threads, None)
    }
}

/// Runs `f` on a worker of a pool of worker threads ([`worker_threads`]; 0: rayon's global pool;
/// the warning of a capped request goes to stderr). The process environment is left alone: every
/// kernel runs inside the pool, whose size bounds the parallelism whatever split a kernel chooses.
/// `f` may fail with any error that this crate's error converts into.
pub fn with_threads<T: Send, E: From<Error> + Send>(
    threads: usize,
    force: bool,
    f: impl FnOnce() -> std::result::Result<T, E> + Send,
) -> std::result::Result<T, E> {
    let (threads, warning) = worker_threads(threads, force);
    if let Some(w) = warning {
        eprintln!("warning: {w}");
    }
    if threads == 0 {
        return on_pool(f);
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Error::Threads(e.to_string()))?
        .install(f)
}

#[cfg(test)]
mod tests {
    use super::on_pool;

    #[test]
    fn on_pool_runs_on_a_worker_of_the_current_pool() {
        assert!(on_pool(|| rayon::current_thread_index().is_some()));
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("a one-thread pool");
        // Inside a pool it runs inline, on that pool's worker.
        let (outer, inner) = pool.install(|| {
            let outer = std::thread::current().id();
            (outer, on_pool(|| std::thread::current().id()))
        });
        assert_eq!(outer, inner);
        assert_eq!(pool.install(|| on_pool(rayon::current_num_threads)), 1);
    }
}
