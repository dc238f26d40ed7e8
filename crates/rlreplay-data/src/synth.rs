//! Synthetic rollout datasets in the published layout, for demos, tests and benchmarks.
//!
//! Each step has `prompts` groups of `group` rows. A prompt has a pass rate drawn from
//! Beta(0.5, 0.5) (many prompts always or never solved, as in real runs); each row's score is a
//! Bernoulli draw of it. Response lengths are lognormal with mean `mean_len` (σ = 0.6); a response
//! longer than `max_len` is cut there and has no EOS (about 1.8 % at the defaults), others end with
//! EOS. Log-probs are −Exp(3) (mean −1/3). With `pattern_len > 0` the data is learnable: successful
//! responses start with [`SynthConfig::success_pattern`], failed ones never do.

use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Beta, Distribution, Exp, LogNormal};

use crate::batch::RolloutBatch;
use crate::error::{Error, Result};
use crate::stop::StopIds;
use crate::write::ShardWriter;

/// Settings of a synthetic dataset.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthConfig {
    /// Number of steps (shards), numbered from `first_step`.
    pub steps: usize,
    /// First step number.
    pub first_step: i64,
    /// Prompt groups per step.
    pub prompts: usize,
    /// Rows per group.
    pub group: usize,
    /// Token ids are drawn below this.
    pub vocab: u32,
    /// Mean response length before truncation.
    pub mean_len: f64,
    /// Maximum response length (longer responses are truncated, without EOS).
    pub max_len: usize,
    /// Mean prompt length.
    pub prompt_len: usize,
    /// End-of-sequence id.
    pub eos: u32,
    /// Length of the token pattern that starts every successful response (0: no pattern).
    pub pattern_len: usize,
    /// Random seed; the same seed gives the same dataset.
    pub seed: u64,
}

impl Default for SynthConfig {
    /// The published run's shape: 256 prompts × 16 rollouts, Qwen3 vocabulary and end of sequence
    /// (`<|endoftext|>`, 151643), mean response 1400 tokens capped at 4096.
    fn default() -> Self {
        Self {
            steps: 1,
            first_step: 1,
            prompts: 256,
            group: 16,
            vocab: 151_936,
            mean_len: 1400.0,
            max_len: 4096,
            prompt_len: 150,
            eos: 151_643,
            pattern_len: 0,
            seed: 0,
        }
    }
}

impl SynthConfig {
    /// The tokens every successful response starts with (empty when `pattern_len` is 0): a fixed
    /// sequence of ids below `vocab`, never EOS.
    pub fn success_pattern(&self) -> Vec<u32> {
        (0..self.pattern_len as u32)
            .map(|k| self.avoid_eos((7 + 13 * k) % self.vocab))
            .collect()
    }

    fn avoid_eos(&self, t: u32) -> u32 {
        if t == self.eos {
            (t + 1) % self.vocab
        } else {
            t
        }
    }

    fn check(&self) -> Result<()> {
        let fail = |what| Err(Error::Synth(what));
        if self.vocab < 2 {
            return fail("vocab must be at least 2");
        }
        if self.max_len <= self.pattern_len {
            return fail("max_len must exceed the pattern length");
        }
        if self.mean_len.is_nan() || self.mean_len < 1.0 {
            return fail("mean_len must be at least 1");
        }
        if self.prompts < 1 || self.group < 1 {
            return fail("prompts and group must be at least 1");
        }
        Ok(())
    }
}

/// Generates step `step`'s batch (independent of the other steps: any step can be generated alone).
pub fn generate(cfg: &SynthConfig, step: i64) -> Result<RolloutBatch> {
    cfg.check()?;
    let mut rng =
        StdRng::seed_from_u64(cfg.seed ^ (step as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let sigma = 0.6f64;
    let lengths = LogNormal::new(cfg.mean_len.ln() - sigma * sigma / 2.0, sigma)
        .map_err(|_| Error::Synth("mean_len must be finite"))?;
    let pass = Beta::new(0.5, 0.5).map_err(|_| Error::Synth("invalid distribution constant"))?;
    let lp = Exp::new(3.0f32).map_err(|_| Error::Synth("invalid distribution constant"))?;
    let pattern = cfg.success_pattern();
    let rows = cfg.prompts * cfg.group;
    let mut b = RolloutBatch::empty(step);
    let expected = (cfg.mean_len as usize + 1) * rows;
    b.response_tokens.reserve(expected);
    b.rollout_log_probs.reserve(expected);
    let token = |rng: &mut StdRng| cfg.avoid_eos(rng.random_range(0..cfg.vocab));
    let mut prompt = Vec::new();
    let mut resp = Vec::new();
    let mut lps = Vec::new();
    for p in 0..cfg.prompts {
        let uid = format!("{:032x}", rng.random::<u128>());
        let plen = rng
            .random_range(cfg.prompt_len / 2..=cfg.prompt_len * 3 / 2)
            .max(1);
        prompt.clear();
        prompt.extend((0..plen).map(|_| token(&mut rng)));
        let rate: f64 = pass.sample(&mut rng);
        let answer = format!("{}", p % 100);
        for _ in 0..cfg.group {
            let solved = rng.random_bool(rate.clamp(0.0, 1.0));
            let len = (lengths.sample(&mut rng).round() as usize).max(pattern.len() + 1);
            let truncated = len > cfg.max_len;
            let len = len.min(cfg.max_len);
            resp.clear();
            if solved {
                resp.extend_from_slice(&pattern);
            } else if !pattern.is_empty() {
                // Never start like a success.
                let mut t = token(&mut rng);
                while t == pattern[0] {
                    t = token(&mut rng);
                }
                resp.push(t);
            }
            let body = if truncated { len } else { len - 1 };
            while resp.len() < body {
                resp.push(token(&mut rng));
            }
            if !truncated {
                resp.push(cfg.eos);
            }
            lps.clear();
            lps.extend((0..resp.len()).map(|_| -lp.sample(&mut rng)));
            b.push_row(
                &uid,
                &prompt,
                &resp,
                &lps,
                f32::from(u8::from(solved)),
                Some("synth"),
                Some(&answer),
                Some(1.0),
                Some(1.0),
            );
        }
    }
    Ok(b)
}

/// Writes `cfg.steps` shards into `dir` (`DIR/data/step-NNNN.parquet`), each naming `cfg.eos` as
/// the dataset's stop id, calling `progress` after each; returns the files written.
pub fn write_dataset(
    dir: &Path,
    cfg: &SynthConfig,
    mut progress: impl FnMut(&Path),
) -> Result<Vec<PathBuf>> {
    let writer = ShardWriter::new(dir).stop_ids(StopIds::new([cfg.eos], "rlreplay synth"));
    let mut out = Vec::with_capacity(cfg.steps);
    for k in 0..cfg.steps {
        let batch = generate(cfg, cfg.first_step + k as i64)?;
        let path = writer.write(&batch)?;
        progress(&path);
        out.push(path);
    }
    Ok(out)
}
