//! Differentiable fused kernels for the Qwen3 training graph.
//!
//! Every op takes the packed layout (the tokens of all sequences concatenated, no batch dimension)
//! and has a backward pass. On the CPU, f32 and f64 inputs run hand-written kernels
//! (candle `CustomOp`s with `bwd`). On other devices (CUDA) attention and the log-prob head run
//! memory-lean blockwise versions built from candle's own ops ([`blockwise_packed_causal_attention`],
//! [`blockwise_token_logprobs`]: no `[heads × L × L]` scores and no `[tokens × vocab]` logits kept
//! for the backward pass, which recomputes them block by block); everything else there, and half
//! precision on the CPU, runs the differentiable composite reference in [`composite`].
//!
//! A frozen weight (one that does not track gradients, as the base weights under LoRA adapters)
//! gets no gradient on any path: the projections and the log-prob head skip their `dW` products.

mod attention;
mod blockwise;
pub mod composite;
mod cpu;
pub(crate) mod decode;
mod frozen;
mod linear;
mod logprobs;
mod mlp;
mod norm;
mod norm_rope;
mod rope;
mod swiglu;

use candle_core::{bail, Result, Tensor};
use cpu::kernel_applies;
use std::sync::Mutex;

pub use blockwise::{LOGIT_ELEMS, SCORE_ELEMS};
pub use cpu::exp_f32_slice;

/// Whether the blockwise ops replace the CPU kernels and the composite reference: on every device
/// but the CPU (and, in unit tests, wherever `force_blockwise` asks for them).
fn blockwise_applies(t: &Tensor) -> bool {
    !t.device().is_cpu() || forced_blockwise()
}

#[cfg(not(test))]
fn forced_blockwise() -> bool {
    false
}

#[cfg(test)]
thread_local! {
    static FORCE_BLOCKWISE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(test)]
fn forced_blockwise() -> bool {
    FORCE_BLOCKWISE.with(|f| f.get())
}

/// Runs `f` with the blockwise ops on every device (the CUDA code path, on the CPU).
#[cfg(test)]
pub(crate) fn force_blockwise<R>(f: impl FnOnce() -> R) -> R {
    FORCE_BLOCKWISE.with(|flag| {
        let before = flag.replace(true);
        let out = f();
        flag.set(before);
        out
    })
}

/// Tokens per chunk of the lm_head in the composite fallback of [`token_logprobs`].
const LOGPROB_CHUNK: usize = 128;

/// RMSNorm over the last dimension, `x / sqrt(mean(x²) + eps) * weight`, computed in f32 when `x`
/// is half precision (Hugging Face Qwen3 semantics). `x: [.., H]`, `weight: [H]`.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let h = x.dims().last().copied().unwrap_or(0);
    if x.rank() == 0 || weight.dims() != [h] {
        bail!(
            "rms_norm: weight shape {:?} does not match the last dimension of x {:?}",
            weight.dims(),
            x.dims()
        );
    }
    if kernel_applies(&[x, weight]) {
        x.contiguous()?
            .apply_op2(&weight.contiguous()?, norm::RmsNorm { eps })
    } else {
        composite::rms_norm(x, weight, eps)
    }
}

/// Rotary position embedding, rotate-half convention: `x * cos + rotate_half(x) * sin` with the
/// `[T, D/2]` tables duplicated to `D`. `x: [T, heads, D]`.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    check_rope(x, cos, sin)?;
    if kernel_applies(&[x]) && cos.device().is_cpu() && sin.device().is_cpu() {
        let (cos, sin) = rope_tables(x, cos, sin)?;
        x.contiguous()?.apply_op3(&cos, &sin, rope::Rope)
    } else {
        composite::rope(x, cos, sin)
    }
}

/// [`rope`](fn@rope) of [`rms_norm`] over every head, `rope(rms_norm(x, weight, eps), cos, sin)` for
/// `x: [T, heads, D]` and `weight: [D]`: on the CPU (f32, f64) one op running both kernels.
pub fn norm_rope(
    x: &Tensor,
    weight: &Tensor,
    eps: f64,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<Tensor> {
    check_rope(x, cos, sin)?;
    if kernel_applies(&[x, weight])
        && weight.dims() == [x.dim(2)?]
        && cos.device().is_cpu()
        && sin.device().is_cpu()
    {
        let (cos, sin) = rope_tables(x, cos, sin)?;
        let op = norm_rope::NormRope { eps, cos, sin };
        x.contiguous()?.apply_op2(&weight.contiguous()?, op)
    } else {
        rope(&rms_norm(x, weight, eps)?, cos, sin)
    }
}

/// The rotary tables in x's dtype, contiguous.
fn rope_tables(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<(Tensor, Tensor)> {
    Ok((
        cos.to_dtype(x.dtype())?.contiguous()?,
        sin.to_dtype(x.dtype())?.contiguous()?,
    ))
}

/// Checks the rotary embedding's arguments: `x: [T, heads, D]` with `D` even, tables `[T, D/2]`.
fn check_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<()> {
    let (t, _heads, d) = x.dims3()?;
    if d % 2 != 0 {
        bail!("rope: head dimension {d} is odd");
    }
    for (name, table) in [("cos", cos), ("sin", sin)] {
        if table.dims() != [t, d / 2] {
            bail!(
                "rope: {name} has shape {:?}, expected [{t}, {}]",
                table.dims(),
                d / 2
            );
        }
    }
    Ok(())
}

/// SwiGLU gating `silu(gate) * up` for tensors of equal shape.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if gate.dims() != up.dims() {
        bail!(
            "swiglu: gate shape {:?} differs from up shape {:?}",
            gate.dims(),
            up.dims()
        );
    }
    if kernel_applies(&[gate, up]) {
        gate.contiguous()?
            .apply_op2(&up.contiguous()?, swiglu::SwiGlu)
    } else {
        composite::swiglu(gate, up)
    }
}

/// The projection `x · Wᵀ` for `x: [T, in]` (or `[T, a, b]`, read as `[T, a·b]`) and
/// `weight: [out, in]`, `[T, out]`: on the CPU (f32, f64) one gemm forward and two backward,
/// straight into `dx` and `dW`; elsewhere candle's matmul. A frozen weight (one that does not
/// track gradients) gets no `dW` product on either path.
pub fn linear(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    project(x, weight, None)
}

/// [`linear`](fn@linear) with its output split into `heads`: `[T, heads, out / heads]`.
pub fn linear_heads(x: &Tensor, weight: &Tensor, heads: usize) -> Result<Tensor> {
    project(x, weight, Some(heads))
}

fn project(x: &Tensor, weight: &Tensor, heads: Option<usize>) -> Result<Tensor> {
    if x.rank() >= 2 && weight.rank() == 2 && kernel_applies(&[x, weight]) {
        return x.contiguous()?.apply_op2(
            &weight.contiguous()?,
            linear::Linear {
                heads,
                weight_grad: weight.track_op(),
            },
        );
    }
    let y = matmul_t(&x.flatten_from(1)?, weight)?;
    match heads {
        Some(h) => {
            let (t, out) = y.dims2()?;
            if h == 0 || out % h != 0 {
                bail!("linear: {out} outputs do not split into {h} heads");
            }
            y.reshape((t, h, out / h))
        }
        None => Ok(y),
    }
}

/// The adapted projection `x · Wᵀ + scale · (x · Aᵀ) · Bᵀ` of a frozen `weight: [out, in]` with
/// the LoRA adapter `a: [r, in]`, `b: [out, r]` (`x` as in [`linear`](fn@linear); the output split into
/// `heads` when given), as one node whose backward pass computes `dx`, `dA` and `dB`: on the CPU
/// (f32, f64) only, so `None` elsewhere or for a weight that tracks gradients.
pub(crate) fn lora_linear(
    x: &Tensor,
    weight: &Tensor,
    a: &Tensor,
    b: &Tensor,
    scale: f64,
    heads: Option<usize>,
) -> Result<Option<Tensor>> {
    if x.rank() < 2 || weight.track_op() || !kernel_applies(&[x, weight, a, b]) {
        return Ok(None);
    }
    let op = linear::LoraLinear {
        w: weight.contiguous()?,
        scale,
        heads,
    };
    Ok(Some(x.contiguous()?.apply_op3(
        &a.contiguous()?,
        &b.contiguous()?,
        op,
    )?))
}

/// `x · Wᵀ` for `x: [T, in]` and `w: [out, in]` through candle's matmul; for a frozen `w` (one
/// that does not track gradients) under an `x` that does, through a node whose backward pass
/// skips the `dW` product.
pub(crate) fn matmul_t(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    if x.track_op() && !w.track_op() {
        frozen::linear(x, w)
    } else {
        x.matmul(&w.t()?)
    }
}

/// The projection with a residual, `residual + x · Wᵀ` (`x` as in [`linear`](fn@linear), `residual:
/// [T, out]`): on the CPU (f32, f64) one op whose gemm accumulates into a copy of the residual
/// and whose backward hands the residual the output gradient; elsewhere `residual + linear(x, W)`.
pub fn linear_add(x: &Tensor, weight: &Tensor, residual: &Tensor) -> Result<Tensor> {
    if x.rank() >= 2 && weight.rank() == 2 && kernel_applies(&[x, weight, residual]) {
        x.contiguous()?.apply_op3(
            &weight.contiguous()?,
            &residual.contiguous()?,
            linear::LinearAdd {
                weight_grad: weight.track_op(),
            },
        )
    } else {
        residual + linear(x, weight)?
    }
}

/// The gated half of the SwiGLU MLP, `swiglu(x · W_gateᵀ, x · W_upᵀ)` for `x: [T, H]` and
/// `w_gate`, `w_up: [I, H]`: on the CPU (f32, f64) one op whose backward writes `dx` with one
/// accumulating gemm; elsewhere [`linear`](fn@linear) twice and [`swiglu`](fn@swiglu).
pub fn gated_up(x: &Tensor, w_gate: &Tensor, w_up: &Tensor) -> Result<Tensor> {
    if x.rank() == 2
        && w_gate.rank() == 2
        && w_gate.dims() == w_up.dims()
        && kernel_applies(&[x, w_gate, w_up])
    {
        x.contiguous()?.apply_op3(
            &w_gate.contiguous()?,
            &w_up.contiguous()?,
            mlp::GatedUp::new(w_gate.track_op() || w_up.track_op()),
        )
    } else {
        swiglu(&linear(x, w_gate)?, &linear(x, w_up)?)
    }
}

/// Checks the packed-attention arguments and returns `(T, Hq, Hkv, D)`.
fn check_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seq_offsets: &[usize],
) -> Result<(usize, usize, usize, usize)> {
    let (t, hq, d) = q.dims3()?;
    let (tk, hkv, dk) = k.dims3()?;
    if k.dims() != v.dims() {
        bail!(
            "packed_causal_attention: k shape {:?} differs from v shape {:?}",
            k.dims(),
            v.dims()
        );
    }
    if tk != t || dk != d || hkv == 0 || hq % hkv != 0 {
        bail!(
            "packed_causal_attention: q {:?} and k/v {:?} are incompatible \
             (same T and D, q heads a multiple of kv heads)",
            q.dims(),
            k.dims()
        );
    }
    if seq_offsets.first() != Some(&0)
        || seq_offsets.last() != Some(&t)
        || seq_offsets.windows(2).any(|w| w[0] > w[1])
    {
        bail!(
            "packed_causal_attention: seq_offsets must start at 0, be non-decreasing and end at \
             T={t}, got {seq_offsets:?}"
        );
    }
    Ok((t, hq, hkv, d))
}

/// Block-diagonal causal attention over packed sequences: token `i` of sequence `s` attends to
/// tokens `0..=i` of the same sequence; query head `h` uses KV head `h / (Hq / Hkv)`.
/// `q: [T, Hq, D]`, `k, v: [T, Hkv, D]`, `seq_offsets`: sequence boundaries (`[0, .., T]`).
/// Returns `[T, Hq, D]`.
pub fn packed_causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seq_offsets: &[usize],
    scale: f64,
) -> Result<Tensor> {
    let (t, _hq, _hkv, _d) = check_attention(q, k, v, seq_offsets)?;
    if t == 0 {
        return q.zeros_like();
    }
    if blockwise_applies(q) {
        return blockwise::attention(q, k, v, seq_offsets, scale, SCORE_ELEMS);
    }
    if kernel_applies(&[q, k, v]) {
        let op = attention::PackedAttention {
            offsets: seq_offsets.to_vec(),
            scale,
            lse: Mutex::new(None),
        };
        q.contiguous()?
            .apply_op3(&k.contiguous()?, &v.contiguous()?, op)
    } else {
        composite::packed_causal_attention(q, k, v, seq_offsets, scale)
    }
}

/// Checks the log-prob head's arguments and returns `N`.
fn check_logprobs(
    hidden: &Tensor,
    lm_head: &Tensor,
    targets: &[u32],
    temperature: f64,
) -> Result<usize> {
    let (n, h) = hidden.dims2()?;
    let (vocab, hw) = lm_head.dims2()?;
    if hw != h {
        bail!(
            "token_logprobs: lm_head {:?} does not match hidden {:?}",
            lm_head.dims(),
            hidden.dims()
        );
    }
    if targets.len() != n {
        bail!(
            "token_logprobs: {} targets for {n} hidden rows",
            targets.len()
        );
    }
    if let Some((row, &tok)) = targets
        .iter()
        .enumerate()
        .find(|(_, &tok)| tok as usize >= vocab)
    {
        bail!("token_logprobs: target {tok} at row {row} is outside the vocabulary of {vocab}");
    }
    if !(temperature.is_finite() && temperature > 0.0) {
        bail!("token_logprobs: temperature must be positive and finite, got {temperature}");
    }
    Ok(n)
}

/// Splits a `[N, 3]` head output into the log-probs and, when `want_entropy`, the entropies.
fn head_columns(out: &Tensor, want_entropy: bool) -> Result<(Tensor, Option<Tensor>)> {
    let column = |i: usize| out.narrow(1, i, 1)?.squeeze(1);
    let ent = if want_entropy {
        Some(column(logprobs::COL_ENTROPY)?)
    } else {
        None
    };
    Ok((column(logprobs::COL_LOGP)?, ent))
}

/// Per-token log-probabilities `log softmax(hidden · lm_headᵀ / τ)[target]` (`[N]`) and, when
/// `want_entropy`, the entropy of `softmax(hidden · lm_headᵀ / τ)` (`[N]`). The `[N, V]` logits
/// are never held whole. `hidden: [N, H]`, `lm_head: [V, H]`, `targets.len() == N`.
pub fn token_logprobs(
    hidden: &Tensor,
    lm_head: &Tensor,
    targets: &[u32],
    temperature: f64,
    want_entropy: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let n = check_logprobs(hidden, lm_head, targets, temperature)?;
    if n == 0 {
        let empty = Tensor::zeros(0, hidden.dtype(), hidden.device())?;
        let ent = want_entropy.then(|| empty.clone());
        return Ok((empty, ent));
    }
    if blockwise_applies(hidden) {
        let out = blockwise::token_logprobs(
            hidden,
            lm_head,
            targets,
            temperature,
            want_entropy,
            LOGIT_ELEMS,
        )?;
        return head_columns(&out, want_entropy);
    }
    if kernel_applies(&[hidden, lm_head]) {
        let op = logprobs::TokenLogProbs {
            weight_grad: lm_head.track_op(),
            ..logprobs::TokenLogProbs::new(targets.to_vec(), temperature, want_entropy)
        };
        let out = hidden.contiguous()?.apply_op2(&lm_head.contiguous()?, op)?;
        return head_columns(&out, want_entropy);
    }
    composite::token_logprobs(
        hidden,
        lm_head,
        targets,
        temperature,
        want_entropy,
        LOGPROB_CHUNK,
    )
}

/// [`token_logprobs`] without entropy, for a loss `Σ g_t · logp_t` whose weights `g_t` =
/// `grad[t]` are known before the forward pass (training). The CPU kernel then computes the
/// gradients of that loss in the forward pass, one chunk of `[rows × V]` logits at a time (three
/// lm_head gemms instead of four), and the backward pass hands them on when the upstream gradient
/// of the log-probs is `grad`; for any other upstream gradient it backpropagates as
/// [`token_logprobs`] does. Elsewhere it is [`token_logprobs`].
pub fn token_logprobs_for_grad(
    hidden: &Tensor,
    lm_head: &Tensor,
    targets: &[u32],
    temperature: f64,
    grad: &[f64],
) -> Result<Tensor> {
    let n = check_logprobs(hidden, lm_head, targets, temperature)?;
    if grad.len() != n {
        bail!(
            "token_logprobs: {} gradients for {n} hidden rows",
            grad.len()
        );
    }
    if n == 0 || blockwise_applies(hidden) || !kernel_applies(&[hidden, lm_head]) {
        return Ok(token_logprobs(hidden, lm_head, targets, temperature, false)?.0);
    }
    let op = logprobs::TokenLogProbs {
        weight_grad: lm_head.track_op(),
        ..logprobs::TokenLogProbs::with_grad(targets.to_vec(), temperature, grad.to_vec())
    };
    let out = hidden.contiguous()?.apply_op2(&lm_head.contiguous()?, op)?;
    Ok(head_columns(&out, false)?.0)
}

/// [`packed_causal_attention`] through the blockwise op that runs on CUDA, on any device, with at
/// most `block_elems` score elements per block (the CUDA path uses [`SCORE_ELEMS`]).
pub fn blockwise_packed_causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seq_offsets: &[usize],
    scale: f64,
    block_elems: usize,
) -> Result<Tensor> {
    let (t, _hq, _hkv, _d) = check_attention(q, k, v, seq_offsets)?;
    if t == 0 {
        return q.zeros_like();
    }
    blockwise::attention(q, k, v, seq_offsets, scale, block_elems)
}

/// [`token_logprobs`] through the chunked op that runs on CUDA, on any device, with at most
/// `chunk_elems` logits per chunk (the CUDA path uses [`LOGIT_ELEMS`]).
pub fn blockwise_token_logprobs(
    hidden: &Tensor,
    lm_head: &Tensor,
    targets: &[u32],
    temperature: f64,
    want_entropy: bool,
    chunk_elems: usize,
) -> Result<(Tensor, Option<Tensor>)> {
    if check_logprobs(hidden, lm_head, targets, temperature)? == 0 {
        let empty = Tensor::zeros(0, hidden.dtype(), hidden.device())?;
        return Ok((empty.clone(), want_entropy.then_some(empty)));
    }
    let out = blockwise::token_logprobs(
        hidden,
        lm_head,
        targets,
        temperature,
        want_entropy,
        chunk_elems,
    )?;
    head_columns(&out, want_entropy)
}
