//! Token sampling from logits: temperature, top-k, top-p, and the log-prob of the sampled token
//! under the tempered full-vocabulary distribution `log softmax(z / τ)`, which is what a trainer
//! recomputes. Each sequence has its own random stream, so batching does not change results.

use anyhow::{bail, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Qwen3's end-of-text and end-of-turn ids, the default stop ids.
pub const QWEN3_STOP_IDS: [u32; 2] = [151643, 151645];

/// Sampling settings, stored with the rollouts they produce.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Temperature τ; `0` means greedy decoding (log-probs are then those of τ = 1).
    pub temperature: f32,
    /// Nucleus mass in `(0, 1]`; `1` disables top-p.
    pub top_p: f32,
    /// Keep only the `k` most likely tokens; `0` disables top-k.
    pub top_k: usize,
    /// Maximum number of generated tokens per sequence.
    pub max_new_tokens: usize,
    /// Generation stops after any of these ids (the stop id is kept in the output).
    pub stop_ids: Vec<u32>,
    /// Seed of the per-sequence random streams.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_new_tokens: 1024,
            stop_ids: QWEN3_STOP_IDS.to_vec(),
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Checks the ranges of the settings.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            bail!("temperature must be >= 0, got {}", self.temperature);
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            bail!("top_p must be in (0, 1], got {}", self.top_p);
        }
        if self.max_new_tokens == 0 {
            bail!("max_new_tokens must be >= 1");
        }
        Ok(())
    }

    /// The random stream of sequence `sequence` (for example `prompt_index * n + sample`).
    pub fn rng_for(&self, sequence: u64) -> ChaCha8Rng {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(sequence);
        rng
    }
}

/// A sampled token and its log-prob under `log softmax(z / τ)` over the full vocabulary.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    /// The token id.
    pub token: u32,
    /// Its log-prob.
    pub logprob: f32,
}

/// Reusable buffers for [`sample`].
#[derive(Debug, Default)]
pub struct SamplerScratch {
    probs: Vec<(f32, u32)>,
}

/// Samples one token from `logits` (one row of the vocabulary).
///
/// The tempered distribution is `softmax(z / τ)`. Top-k then top-p keep the most likely tokens
/// (ties broken by lower id) and the token is drawn from the kept set renormalised; the returned
/// log-prob is always the full-vocabulary one. Greedy (τ = 0) takes the arg-max (lowest id on ties).
pub fn sample(
    logits: &[f32],
    params: &SamplingParams,
    rng: &mut impl Rng,
    scratch: &mut SamplerScratch,
) -> Sampled {
    assert!(!logits.is_empty(), "sampling from an empty vocabulary");
    let greedy = params.temperature == 0.0;
    let inv_t = if greedy {
        1.0
    } else {
        1.0 / params.temperature
    };
    // Max of the tempered logits, and arg-max for greedy.
    let (mut arg, mut max) = (0usize, f32::NEG_INFINITY);
    for (i, &z) in logits.iter().enumerate() {
        if z > max {
            max = z;
            arg = i;
        }
    }
    let max_t = max * inv_t;
    let sum: f64 = logits
        .iter()
        .map(|&z| f64::from((z * inv_t - max_t).exp()))
        .sum();
    let log_z = max_t + sum.ln() as f32;
    let logprob_of = |i: usize| logits[i] * inv_t - log_z;
    if greedy {
        return Sampled {
            token: arg as u32,
            logprob: logprob_of(arg),
        };
    }
    let token = draw(logits, inv_t, max_t, sum, params, rng, scratch);
    Sampled {
        token,
        logprob: logprob_of(token as usize),
    }
}

/// Descending probability, then ascending id.
fn by_prob_desc(a: &(f32, u32), b: &(f32, u32)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

fn draw(
    logits: &[f32],
    inv_t: f32,
    max_t: f32,
    sum: f64,
    params: &SamplingParams,
    rng: &mut impl Rng,
    scratch: &mut SamplerScratch,
) -> u32 {
    let vocab = logits.len();
    let top_k = if params.top_k == 0 {
        vocab
    } else {
        params.top_k.min(vocab)
    };
    let top_p = f64::from(params.top_p);
    let u: f64 = rng.random();
    if top_k == vocab && top_p >= 1.0 {
        // Plain sampling: inverse CDF over the vocabulary in id order.
        let target = u * sum;
        let mut acc = 0.0f64;
        for (i, &z) in logits.iter().enumerate() {
            acc += f64::from((z * inv_t - max_t).exp());
            if acc > target {
                return i as u32;
            }
        }
        return last_positive(logits, inv_t, max_t);
    }
    let probs = &mut scratch.probs;
    probs.clear();
    probs.extend(
        logits
            .iter()
            .enumerate()
            .map(|(i, &z)| (((z * inv_t - max_t).exp() as f64 / sum) as f32, i as u32)),
    );
    // Find the smallest prefix (in sorted order) that holds top-k and reaches top-p, sorting only
    // that prefix: select the best `m` candidates, grow `m` until their mass reaches top-p.
    let mut m = top_k.clamp(1, 64);
    loop {
        if m < vocab {
            probs.select_nth_unstable_by(m - 1, by_prob_desc);
        }
        let head = &mut probs[..m];
        head.sort_unstable_by(by_prob_desc);
        let mass: f64 = head.iter().map(|p| f64::from(p.0)).sum();
        if m >= top_k || mass >= top_p {
            break;
        }
        m = (m * 4).min(top_k);
    }
    // Cut the sorted head at top-p: keep tokens until the cumulative mass reaches top_p.
    let mut kept = 0usize;
    let mut mass = 0.0f64;
    for p in &probs[..m] {
        kept += 1;
        mass += f64::from(p.0);
        if mass >= top_p {
            break;
        }
    }
    let target = u * mass;
    let mut acc = 0.0f64;
    for p in &probs[..kept] {
        acc += f64::from(p.0);
        if acc > target {
            return p.1;
        }
    }
    probs[kept - 1].1
}

/// The last id with a non-zero probability (guards against rounding at the end of the CDF).
fn last_positive(logits: &[f32], inv_t: f32, max_t: f32) -> u32 {
    logits
        .iter()
        .rposition(|&z| (z * inv_t - max_t).exp() > 0.0)
        .unwrap_or(0) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(t: f32, p: f32, k: usize) -> SamplingParams {
        SamplingParams {
            temperature: t,
            top_p: p,
            top_k: k,
            ..Default::default()
        }
    }

    fn counts(logits: &[f32], sp: &SamplingParams, draws: usize) -> Vec<usize> {
        let mut rng = sp.rng_for(0);
        let mut scratch = SamplerScratch::default();
        let mut c = vec![0; logits.len()];
        for _ in 0..draws {
            c[sample(logits, sp, &mut rng, &mut scratch).token as usize] += 1;
        }
        c
    }

    #[test]
    fn logprob_is_tempered_full_vocabulary() {
        let logits = [1.0f32, 2.0, 3.0, -1.0];
        for (t, p, k) in [(1.0, 1.0, 0), (0.6, 0.95, 0), (0.7, 0.5, 2), (2.0, 1.0, 1)] {
            let sp = params(t, p, k);
            let z: Vec<f64> = logits
                .iter()
                .map(|&x| f64::from(x) / f64::from(t))
                .collect();
            let lse = z.iter().map(|x| x.exp()).sum::<f64>().ln();
            let mut rng = sp.rng_for(7);
            let mut scratch = SamplerScratch::default();
            for _ in 0..50 {
                let s = sample(&logits, &sp, &mut rng, &mut scratch);
                let want = z[s.token as usize] - lse;
                assert!((f64::from(s.logprob) - want).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn greedy_takes_argmax() {
        let sp = params(0.0, 1.0, 0);
        let mut rng = sp.rng_for(0);
        let s = sample(
            &[0.0, 5.0, 5.0, 1.0],
            &sp,
            &mut rng,
            &mut SamplerScratch::default(),
        );
        assert_eq!(s.token, 1);
        let lse = (1.0f64 + 2.0 * 5f64.exp() + 1f64.exp()).ln();
        assert!((f64::from(s.logprob) - (5.0 - lse)).abs() < 1e-6);
    }

    #[test]
    fn top_k_and_top_p_restrict_the_support() {
        let logits = [3.0f32, 2.0, 1.0, 0.0, -1.0];
        let c = counts(&logits, &params(1.0, 1.0, 2), 2000);
        assert!(
            c[2..].iter().all(|&x| x == 0) && c[0] > 0 && c[1] > 0,
            "{c:?}"
        );
        // softmax: .636 .234 .086 .032 .012 -> top-p 0.8 keeps the first two (0.87 >= 0.8).
        let c = counts(&logits, &params(1.0, 0.8, 0), 2000);
        assert!(c[2..].iter().all(|&x| x == 0), "{c:?}");
        let c = counts(&logits, &params(1.0, 0.5, 0), 200);
        assert_eq!(c[0], 200);
    }

    #[test]
    fn frequencies_match_the_distribution() {
        let logits = [0.0f32, (2.0f32).ln(), (3.0f32).ln(), f32::NEG_INFINITY];
        for sp in [
            params(1.0, 1.0, 0),
            params(1.0, 0.999, 0),
            params(1.0, 1.0, 3),
        ] {
            let n = 60_000;
            let c = counts(&logits, &sp, n);
            assert_eq!(c[3], 0);
            for (i, want) in [1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0].iter().enumerate() {
                let f = c[i] as f64 / n as f64;
                assert!((f - want).abs() < 0.01, "{sp:?}: {c:?}");
            }
        }
    }

    #[test]
    fn large_vocabulary_top_p_grows_the_candidate_set() {
        // A flat vocabulary: top-p 0.9 needs 90% of 1000 tokens, more than the first guess.
        let logits = vec![0.0f32; 1000];
        let c = counts(&logits, &params(1.0, 0.9, 0), 5000);
        let used = c.iter().filter(|&&x| x > 0).count();
        assert!(c[900..].iter().all(|&x| x == 0), "ties keep the lowest ids");
        assert!(used > 850, "{used}");
    }

    #[test]
    fn streams_are_deterministic_and_distinct() {
        let sp = params(1.0, 1.0, 0);
        let logits = vec![0.0f32; 50];
        let run = |seq: u64| {
            let mut rng = sp.rng_for(seq);
            let mut scratch = SamplerScratch::default();
            (0..20)
                .map(|_| sample(&logits, &sp, &mut rng, &mut scratch).token)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
    }

    #[test]
    fn validation() {
        assert!(params(-1.0, 1.0, 0).validate().is_err());
        assert!(params(1.0, 0.0, 0).validate().is_err());
        assert!(params(1.0, 1.5, 0).validate().is_err());
        assert!(params(f32::NAN, 1.0, 0).validate().is_err());
        assert!(params(0.0, 1.0, 0).validate().is_ok());
    }
}
