//! The golden fixtures' format (made by `scripts/golden_model.py generate`): for each fixture
//! `NAME`, a checkpoint `NAME/`, `NAME.golden.json` with transformers' float64 references,
//! `NAME.grads.safetensors` (gradients) and `NAME.adamw.safetensors` (weights after two AdamW
//! steps). Read by the model's golden tests and by `rlreplay device-check`.

use std::path::Path;

use serde::Deserialize;

use crate::{AdamWConfig, Error, Result, SeqPair};

/// One (prompt, response) pair of a fixture.
#[derive(Debug, Clone, Deserialize)]
pub struct Pair {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Response token ids.
    pub response: Vec<u32>,
}

/// The optimizer settings of a fixture and torch's results of two AdamW steps.
#[derive(Debug, Clone, Deserialize)]
pub struct AdamWGolden {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Global gradient-norm clip.
    pub max_grad_norm: f64,
    /// Per-token coefficients of the second step.
    pub weights_step2: Vec<f64>,
    /// Gradient norms before clipping, per step.
    pub grad_norms: Vec<f64>,
}

impl AdamWGolden {
    /// The optimizer configuration of these settings.
    pub fn config(&self) -> AdamWConfig {
        AdamWConfig {
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
            max_grad_norm: Some(self.max_grad_norm),
        }
    }
}

/// `NAME.golden.json`: the pairs, the per-token coefficients of the gradient, and transformers'
/// float64 log-probs, entropies and gradient norm.
#[derive(Debug, Clone, Deserialize)]
pub struct Golden {
    /// Sampling temperature of the log-probs.
    pub temperature: f64,
    /// The pairs.
    pub pairs: Vec<Pair>,
    /// Per-token coefficients of the weighted sum whose gradient is the reference.
    pub weights: Vec<f64>,
    /// Per-token log-probs of each response.
    pub logprobs: Vec<Vec<f64>>,
    /// Per-token entropies of each response.
    pub entropy: Vec<Vec<f64>>,
    /// Global norm of the reference gradient.
    pub grad_norm: f64,
    /// Optimizer settings and results.
    pub adamw: AdamWGolden,
}

impl Golden {
    /// Reads a `NAME.golden.json`.
    pub fn read(path: &Path) -> Result<Golden> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Io(format!("reading {}: {e}", path.display())))?;
        serde_json::from_str(&text).map_err(|e| {
            Error::Checkpoint(format!("{}: not a golden fixture: {e}", path.display()))
        })
    }

    /// The pairs as the model takes them.
    pub fn pairs(&self) -> Vec<SeqPair<'_>> {
        self.pairs
            .iter()
            .map(|p| SeqPair::new(&p.prompt, &p.response))
            .collect()
    }
}

/// Every fixture of `dir` (`NAME.golden.json` beside the checkpoint `NAME/`), sorted by name;
/// an error when there is none.
pub fn fixtures(dir: &Path) -> Result<Vec<(String, Golden)>> {
    let listing = |e: std::io::Error| Error::Io(format!("reading {}: {e}", dir.display()));
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(listing)? {
        let path = entry.map_err(listing)?.path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".golden.json"))
        else {
            continue;
        };
        out.push((name.to_string(), Golden::read(&path)?));
    }
    if out.is_empty() {
        return Err(Error::Io(format!(
            "{}: no *.golden.json fixtures",
            dir.display()
        )));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The largest `|a − b|` over rows of per-token values; infinite when the shapes differ.
pub fn max_abs_diff(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    if a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.len() != y.len()) {
        return f64::INFINITY;
    }
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}
