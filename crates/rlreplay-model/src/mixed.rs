//! Log-probs under a weighted mixture of several models' logits, in one packed pass per model.

use candle_core::{DType, Tensor, D};

use crate::pack::{Packed, SeqPair};
use crate::{Error, Model, Result};

/// Logits elements per chunk of scored positions (32 MiB per model in f32).
const CHUNK_ELEMS: usize = 1 << 23;

/// Per-token log-probs of the response tokens of `pairs` under mixed logits: for each response
/// token `y_t`, `log softmax((Σ_i w_i · z_i) / τ)[y_t]`, where `z_i` are the logits of model
/// `parts[i].0` at that position and `w_i = parts[i].1`. One vector per pair, as in
/// [`Model::logprobs`].
///
/// Each model runs one packed forward pass without a graph up to its final hidden states; the
/// logits are then formed, mixed and normalised for chunks of scored positions, so the full
/// `[tokens × vocabulary]` matrix is never held. Mixing is in f64 when every model computes in
/// f64, else in f32. All models must share the vocabulary size; the result is on the first model's
/// device.
pub fn mixed_logprobs(
    parts: &[(&Model, f64)],
    pairs: &[SeqPair<'_>],
    temperature: f64,
) -> Result<Vec<Vec<f64>>> {
    let Some(&(first, _)) = parts.first() else {
        return Err(Error::Input("mixed_logprobs: no models to mix".into()));
    };
    let vocab = first.config().vocab_size;
    for (i, &(model, w)) in parts.iter().enumerate() {
        if model.config().vocab_size != vocab {
            return Err(Error::Input(format!(
                "mixed_logprobs: model {i} has a vocabulary of {}, model 0 of {vocab}",
                model.config().vocab_size
            )));
        }
        if !w.is_finite() {
            return Err(Error::Input(format!(
                "mixed_logprobs: weight {i} is not finite ({w})"
            )));
        }
    }
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(Error::Input(format!(
            "mixed_logprobs: temperature must be positive and finite, got {temperature}"
        )));
    }
    // Every model sees the same packing (the limits checked are the smallest of all models).
    let max_positions = parts
        .iter()
        .map(|(m, _)| m.config().max_position_embeddings)
        .min()
        .unwrap_or(0);
    let packed = Packed::new(pairs, vocab, max_positions)?;
    let n = packed.targets.len();
    if n == 0 {
        return Ok(packed.split::<f64>(&[]));
    }
    let mix_dtype = if parts.iter().all(|(m, _)| m.compute_dtype() == DType::F64) {
        DType::F64
    } else {
        DType::F32
    };
    let device = first.device().clone();
    let heads = parts
        .iter()
        .map(|&(m, w)| Ok((m.scoring_hidden(&packed)?, m.lm_head(false)?, w)))
        .collect::<Result<Vec<_>>>()?;
    let chunk = (CHUNK_ELEMS / vocab.max(1)).clamp(1, n);
    let mut out = Vec::with_capacity(n);
    for start in (0..n).step_by(chunk) {
        let len = chunk.min(n - start);
        let mut mixed: Option<Tensor> = None;
        for (hidden, lm_head, w) in &heads {
            let z = hidden
                .narrow(0, start, len)?
                .matmul(&lm_head.t()?)?
                .to_dtype(mix_dtype)?
                .to_device(&device)?;
            let z = (z * (*w / temperature))?;
            mixed = Some(match mixed {
                Some(m) => (m + z)?,
                None => z,
            });
        }
        let logp = candle_nn::ops::log_softmax(&mixed.expect("at least one model"), D::Minus1)?;
        let idx = Tensor::from_slice(&packed.targets[start..start + len], (len, 1), &device)?;
        let lp = logp.gather(&idx, 1)?.squeeze(1)?;
        out.extend(lp.to_dtype(DType::F64)?.to_vec1::<f64>()?);
    }
    Ok(packed.split(&out))
}
