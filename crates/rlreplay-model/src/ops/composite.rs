//! Reference implementations of the fused ops built only from differentiable candle primitives.
//!
//! They define the semantics the fast kernels must reproduce, serve as the fallback on devices and
//! dtypes without a custom kernel, and are the baseline of the op tests.

use candle_core::{DType, Result, Tensor, D};

/// Dtype in which norms and softmaxes are computed: f32 for half-precision inputs, else unchanged.
fn compute_dtype(dtype: DType) -> DType {
    match dtype {
        DType::BF16 | DType::F16 => DType::F32,
        other => other,
    }
}

/// RMSNorm as in Hugging Face Qwen3: normalise in (at least) f32, cast back, multiply by `weight`.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let dtype = x.dtype();
    let xf = x.to_dtype(compute_dtype(dtype))?;
    let var = xf.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = xf.broadcast_div(&(var + eps)?.sqrt()?)?.to_dtype(dtype)?;
    normed.broadcast_mul(weight)
}

/// Rotary embedding with the rotate-half convention: `x * cos + rotate_half(x) * sin`, where the
/// `[T, D/2]` tables are duplicated to `D` and broadcast over heads.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let (t, _heads, d) = x.dims3()?;
    let half = d / 2;
    let cos = Tensor::cat(&[cos, cos], D::Minus1)?
        .to_dtype(x.dtype())?
        .reshape((t, 1, d))?;
    let sin = Tensor::cat(&[sin, sin], D::Minus1)?
        .to_dtype(x.dtype())?
        .reshape((t, 1, d))?;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?
}

/// SwiGLU gating: `silu(gate) * up`.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.silu()? * up
}

/// Block-diagonal causal attention over packed sequences with grouped KV heads, one materialised
/// `[L, L]` score block per sequence (softmax in at least f32).
pub fn packed_causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seq_offsets: &[usize],
    scale: f64,
) -> Result<Tensor> {
    let (_t, hq, d) = q.dims3()?;
    let (_, hkv, _) = k.dims3()?;
    let group = hq / hkv;
    let dtype = q.dtype();
    let cdtype = compute_dtype(dtype);
    let mut outs = Vec::with_capacity(seq_offsets.len().saturating_sub(1));
    for w in seq_offsets.windows(2) {
        let (start, len) = (w[0], w[1] - w[0]);
        if len == 0 {
            continue;
        }
        // [Hkv, G*L, D] queries grouped by their KV head; [Hkv, L, D] keys and values.
        let qs = q
            .narrow(0, start, len)?
            .transpose(0, 1)?
            .contiguous()?
            .reshape((hkv, group * len, d))?;
        let ks = k.narrow(0, start, len)?.transpose(0, 1)?.contiguous()?;
        let vs = v.narrow(0, start, len)?.transpose(0, 1)?.contiguous()?;
        let scores = (qs.matmul(&ks.t()?)? * scale)?.to_dtype(cdtype)?;
        let mask: Vec<f32> = (0..group * len)
            .flat_map(|r| {
                let i = r % len;
                (0..len).map(move |j| if j <= i { 0.0 } else { f32::NEG_INFINITY })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (group * len, len), q.device())?.to_dtype(cdtype)?;
        let probs = candle_nn::ops::softmax(&scores.broadcast_add(&mask)?, D::Minus1)?;
        let out = probs.to_dtype(dtype)?.matmul(&vs)?; // [Hkv, G*L, D]
        outs.push(out.reshape((hq, len, d))?.transpose(0, 1)?);
    }
    Tensor::cat(&outs, 0)
}

/// Per-token `log softmax(hidden · lm_headᵀ / τ)[target]` and optionally the entropy, computed in
/// chunks of `chunk` tokens (each chunk's logits stay alive in the autograd graph). A frozen
/// `lm_head` (one that does not track gradients) gets no `dW` product in the backward pass.
pub fn token_logprobs(
    hidden: &Tensor,
    lm_head: &Tensor,
    targets: &[u32],
    temperature: f64,
    want_entropy: bool,
    chunk: usize,
) -> Result<(Tensor, Option<Tensor>)> {
    let (n, _h) = hidden.dims2()?;
    let dtype = hidden.dtype();
    let cdtype = compute_dtype(dtype);
    let mut lps = Vec::new();
    let mut ents = Vec::new();
    let mut start = 0;
    while start < n {
        let len = chunk.max(1).min(n - start);
        let logits = super::matmul_t(&hidden.narrow(0, start, len)?, lm_head)?.to_dtype(cdtype)?;
        let logits = (logits / temperature)?;
        let logp = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let idx = Tensor::from_slice(&targets[start..start + len], (len, 1), hidden.device())?;
        lps.push(logp.gather(&idx, 1)?.squeeze(1)?);
        if want_entropy {
            ents.push((logp.exp()? * &logp)?.sum(1)?.neg()?);
        }
        start += len;
    }
    let lp = Tensor::cat(&lps, 0)?;
    let ent = if want_entropy {
        Some(Tensor::cat(&ents, 0)?)
    } else {
        None
    };
    Ok((lp, ent))
}
