//! The interface of a trainable causal language model: what the optimizer, the trainers, the
//! teachers and checkpointing use, whatever the architecture.

use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::generate::Decoder;
use crate::{Model, ModelConfig, Param, Result, SaveOptions, SeqPair, TokenLogProbs};

/// A causal language model with master weights and gradient buffers: packed per-token log-probs,
/// their backward pass, Hugging Face checkpoints and a KV-cache decoder for sampling.
///
/// [`Model`] implements it for every architecture of [`crate::Architecture`] (one decoder-layer
/// definition); an architecture whose layers differ in kind (mixture of experts, other norms)
/// implements it with its own forward pass.
pub trait CausalLm: Send + Sync {
    /// The configuration (sizes, architecture, special token ids).
    fn config(&self) -> &ModelConfig;
    /// The dtype the forward pass computes in.
    fn compute_dtype(&self) -> DType;
    /// The device holding the weights.
    fn device(&self) -> &Device;
    /// Every trainable parameter, by Hugging Face name.
    fn params(&self) -> &[Param];
    /// The accumulated gradient of each parameter (same order as [`CausalLm::params`]).
    fn grads(&self) -> &[Option<Tensor>];
    /// Mutable access to the gradient buffers (clipping, scaling, all-reduce).
    fn grads_mut(&mut self) -> &mut [Option<Tensor>];
    /// Clears the accumulated gradients.
    fn zero_grad(&mut self);
    /// The global L2 norm of the accumulated gradients.
    fn grad_norm(&self) -> Result<f64>;
    /// Per-token log-probs (and entropies) of the response tokens of `pairs`, without a graph.
    fn logprobs(
        &self,
        pairs: &[SeqPair<'_>],
        temperature: f64,
        entropy: bool,
    ) -> Result<TokenLogProbs>;
    /// Accumulates the gradient of `Σ g_t · ℓ_t` over the response tokens; returns the `ℓ_t`.
    fn forward_backward(
        &mut self,
        pairs: &[SeqPair<'_>],
        grad_logprobs: &[f64],
        temperature: f64,
    ) -> Result<Vec<Vec<f64>>>;
    /// Saves a Hugging Face checkpoint directory, atomically.
    fn save_hf_with(&self, dir: &Path, opts: &SaveOptions) -> Result<()>;
    /// A snapshot of the weights prepared for incremental decoding.
    fn decoder(&self) -> Result<Decoder>;
}

impl CausalLm for Model {
    fn config(&self) -> &ModelConfig {
        Model::config(self)
    }
    fn compute_dtype(&self) -> DType {
        Model::compute_dtype(self)
    }
    fn device(&self) -> &Device {
        Model::device(self)
    }
    fn params(&self) -> &[Param] {
        Model::params(self)
    }
    fn grads(&self) -> &[Option<Tensor>] {
        Model::grads(self)
    }
    fn grads_mut(&mut self) -> &mut [Option<Tensor>] {
        Model::grads_mut(self)
    }
    fn zero_grad(&mut self) {
        Model::zero_grad(self)
    }
    fn grad_norm(&self) -> Result<f64> {
        Model::grad_norm(self)
    }
    fn logprobs(
        &self,
        pairs: &[SeqPair<'_>],
        temperature: f64,
        entropy: bool,
    ) -> Result<TokenLogProbs> {
        Model::logprobs(self, pairs, temperature, entropy)
    }
    fn forward_backward(
        &mut self,
        pairs: &[SeqPair<'_>],
        grad_logprobs: &[f64],
        temperature: f64,
    ) -> Result<Vec<Vec<f64>>> {
        Model::forward_backward(self, pairs, grad_logprobs, temperature)
    }
    fn save_hf_with(&self, dir: &Path, opts: &SaveOptions) -> Result<()> {
        Model::save_hf_with(self, dir, opts)
    }
    fn decoder(&self) -> Result<Decoder> {
        Decoder::new(self)
    }
}
