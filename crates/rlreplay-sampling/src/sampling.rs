//! Token sampling from logits: temperature, top-k, top-p, and the log-prob of the sampled token
//! under the tempered full-vocabulary distribution `log softmax(z / τ)`, which is what a trainer
//! recomputes (or, on request, under the distribution actually sampled from, or the raw one; see
//! [`LogprobMode`]). Each sequence has its own random stream, so batching does not change results.
//! The exponentials are the model kernels' vectorised f32 `exp` (within 2 ulp; the same values on
//! every x86-64).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rlreplay_model::ops::exp_f32_slice;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

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
            stop_ids: Vec::new(),
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Checks the ranges of the settings.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(Error::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::TopP(self.top_p));
        }
        if self.max_new_tokens == 0 {
            return Err(Error::MaxNewTokens);
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

/// Which distribution a returned log-prob is of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogprobMode {
    /// `log softmax(z / τ)` over the full vocabulary: after temperature, before top-k/top-p (what
    /// the trainer recomputes at temperature τ; SGLang's semantics).
    #[default]
    Tempered,
    /// The distribution the token was drawn from: after temperature and the top-k/top-p
    /// restriction renormalised (vLLM's `processed_logprobs`). Equal to `Tempered` when top-k and
    /// top-p keep every token; greedy decoding gives `log softmax(z)`.
    Processed,
    /// `log softmax(z)`: before temperature and top-k/top-p (vLLM's `raw_logprobs`).
    Raw,
}

/// A sampled token and its log-prob under `log softmax(z / τ)` over the full vocabulary.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    /// The token id.
    pub token: u32,
    /// Its log-prob.
    pub logprob: f32,
    /// `ln` of the tempered probability mass of the tokens top-k and top-p kept (0 when they keep
    /// every token, and for greedy decoding).
    pub log_kept: f32,
}

impl Sampled {
    /// The token's log-prob under `mode`, from the `logits` it was sampled from with `params`.
    pub fn logprob_as(&self, mode: LogprobMode, logits: &[f32], params: &SamplingParams) -> f32 {
        match mode {
            LogprobMode::Tempered => self.logprob,
            LogprobMode::Processed => self.logprob - self.log_kept,
            LogprobMode::Raw if params.temperature == 0.0 || params.temperature == 1.0 => {
                self.logprob
            }
            LogprobMode::Raw => logits[self.token as usize] - log_sum_exp(logits),
        }
    }
}

/// `ln Σ exp(z)` in f64, rounded to f32.
fn log_sum_exp(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&z| f64::from(z - max).exp()).sum();
    max + sum.ln() as f32
}

/// Reusable buffers for [`sample`].
#[derive(Debug, Default)]
pub struct SamplerScratch {
    /// `exp(z / τ - max)` of every id.
    exps: Vec<f32>,
    /// `(probability, id)` pairs, partially ordered by the selections.
    probs: Vec<(f32, u32)>,
    /// Probability mass per bucket (see [`bucket`]).
    mass: Vec<f64>,
    /// The candidates of one bucket.
    sub: Vec<(f32, u32)>,
}

/// Samples one token from `logits` (one row of the vocabulary).
///
/// The tempered distribution is `softmax(z / τ)`. Top-k then top-p keep the most likely tokens
/// (ties broken by lower id) and the token is drawn from the kept set renormalised, walking it in
/// that order; the returned log-prob is always the full-vocabulary one. Greedy (τ = 0) takes the
/// arg-max (lowest id on ties). The kept set and the drawn token are found with a histogram of
/// the probabilities (mass per narrow bucket of values) and a selection inside one bucket
/// (expected `O(vocab)`), never a sort of the vocabulary.
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
    let exps = &mut scratch.exps;
    exps.clear();
    exps.extend(logits.iter().map(|&z| z * inv_t - max_t));
    exp_f32_slice(exps);
    let sum: f64 = exps.iter().map(|&e| f64::from(e)).sum();
    let log_z = max_t + sum.ln() as f32;
    let logprob_of = |i: usize| logits[i] * inv_t - log_z;
    if greedy {
        return Sampled {
            token: arg as u32,
            logprob: logprob_of(arg),
            log_kept: 0.0,
        };
    }
    let (token, kept) = draw(sum, params, rng, scratch);
    Sampled {
        token,
        logprob: logprob_of(token as usize),
        log_kept: if kept >= 1.0 { 0.0 } else { kept.ln() as f32 },
    }
}

/// The `n` most likely tokens of `logits` under `params` (in the sampling order: higher
/// probability, then lower id) and their log-probs under `mode`; under
/// [`LogprobMode::Processed`] a token that top-k or top-p cut has log-prob minus infinity.
/// `sampled` is the draw from the same logits (it carries the kept mass).
pub fn top_logprobs(
    logits: &[f32],
    params: &SamplingParams,
    mode: LogprobMode,
    n: usize,
    sampled: &Sampled,
    scratch: &mut SamplerScratch,
) -> Vec<(u32, f32)> {
    let n = n.min(logits.len());
    if n == 0 {
        return Vec::new();
    }
    let greedy = params.temperature == 0.0;
    let inv_t = if greedy {
        1.0
    } else {
        1.0 / params.temperature
    };
    let max_t = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) * inv_t;
    let exps = &mut scratch.exps;
    exps.clear();
    exps.extend(logits.iter().map(|&z| z * inv_t - max_t));
    exp_f32_slice(exps);
    let sum: f64 = exps.iter().map(|&e| f64::from(e)).sum();
    let log_z = max_t + sum.ln() as f32;
    let probs = &mut scratch.probs;
    fill_probs(probs, exps, sum);
    if n < probs.len() {
        probs.select_nth_unstable_by(n - 1, by_prob_desc);
    }
    let head = &mut probs[..n];
    head.sort_unstable_by(by_prob_desc);
    let raw_lse = (mode == LogprobMode::Raw && !(greedy || params.temperature == 1.0))
        .then(|| log_sum_exp(logits));
    let mut before = 0.0f64;
    head.iter()
        .enumerate()
        .map(|(rank, &(p, id))| {
            let z = logits[id as usize];
            let tempered = z * inv_t - log_z;
            let kept = greedy
                || ((params.top_k == 0 || rank < params.top_k) && before < f64::from(params.top_p));
            before += f64::from(p);
            let lp = match mode {
                LogprobMode::Tempered => tempered,
                LogprobMode::Processed if kept => tempered - sampled.log_kept,
                LogprobMode::Processed => f32::NEG_INFINITY,
                LogprobMode::Raw => raw_lse.map_or(tempered, |lse| z - lse),
            };
            (id, lp)
        })
        .collect()
}

/// `(probability, id)` of every id from `exp(z / τ - max)` and their sum.
fn fill_probs(probs: &mut Vec<(f32, u32)>, exps: &[f32], sum: f64) {
    probs.clear();
    probs.extend(
        exps.iter()
            .enumerate()
            .map(|(i, &e)| ((f64::from(e) / sum) as f32, i as u32)),
    );
}

/// Whether `a` comes before `b` in the sampling order: higher probability, then lower id.
#[inline]
fn before(a: &(f32, u32), b: &(f32, u32)) -> bool {
    match a.0.total_cmp(&b.0) {
        std::cmp::Ordering::Greater => true,
        std::cmp::Ordering::Equal => a.1 < b.1,
        std::cmp::Ordering::Less => false,
    }
}

/// Descending probability, then ascending id.
fn by_prob_desc(a: &(f32, u32), b: &(f32, u32)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// Ranges at most this long are sorted and scanned instead of partitioned.
const SCAN_LEN: usize = 24;

/// Finds the first position `r` of the sampling order of `items` whose cumulative probability
/// `start + mass(..=r)` reaches `threshold` (`>=`, or `>` when `strict`). Rearranges `items` so that
/// `items[..r]` holds the `r` items before it (in any order) and `items[r]` is that item, and
/// returns `(r, start + mass(..=r))`; `None` when the total mass does not reach `threshold` (`items` is
/// then rearranged arbitrarily). Quickselect with the mass of each side summed while
/// partitioning: expected `O(len)`.
fn cross(
    items: &mut [(f32, u32)],
    start: f64,
    threshold: f64,
    strict: bool,
) -> Option<(usize, f64)> {
    let reached = |m: f64| {
        if strict {
            m > threshold
        } else {
            m >= threshold
        }
    };
    let (mut lo, mut hi) = (0usize, items.len());
    let mut acc = start;
    let mut rounds = 0usize;
    // Invariant: items[..lo] come before items[lo..hi], which come before items[hi..];
    // acc = mass(items[..lo]) has not reached the threshold; the answer lies in lo..hi.
    while hi - lo > SCAN_LEN && rounds < 64 {
        rounds += 1;
        let range = &mut items[lo..hi];
        let n = range.len();
        // Median of three as the pivot, moved to the end.
        let (a, b, c) = (0, n / 2, n - 1);
        let mid = if before(&range[a], &range[b]) == before(&range[b], &range[c]) {
            b
        } else if before(&range[b], &range[a]) == before(&range[a], &range[c]) {
            a
        } else {
            c
        };
        range.swap(mid, n - 1);
        let pivot = range[n - 1];
        let mut store = 0;
        let mut mass = 0.0f64;
        for i in 0..n - 1 {
            if before(&range[i], &pivot) {
                mass += f64::from(range[i].0);
                range.swap(store, i);
                store += 1;
            }
        }
        range.swap(store, n - 1);
        if reached(acc + mass) {
            hi = lo + store;
        } else {
            acc += mass;
            let with_pivot = acc + f64::from(pivot.0);
            if reached(with_pivot) {
                return Some((lo + store, with_pivot));
            }
            acc = with_pivot;
            lo += store + 1;
        }
    }
    let range = &mut items[lo..hi];
    range.sort_unstable_by(by_prob_desc);
    for (i, p) in range.iter().enumerate() {
        acc += f64::from(p.0);
        if reached(acc) {
            return Some((lo + i, acc));
        }
    }
    None
}

/// The position of the last item of `items` in the sampling order.
fn last_in_order(items: &[(f32, u32)]) -> usize {
    (1..items.len()).fold(0, |best, i| {
        if before(&items[best], &items[i]) {
            i
        } else {
            best
        }
    })
}

/// Draws a token from the (top-k, top-p restricted) distribution held in `scratch.exps` (with sum
/// `sum`); returns it with the probability mass of the kept tokens (1 without a restriction).
fn draw(
    sum: f64,
    params: &SamplingParams,
    rng: &mut impl Rng,
    scratch: &mut SamplerScratch,
) -> (u32, f64) {
    let exps = &scratch.exps;
    let vocab = exps.len();
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
        for (i, &e) in exps.iter().enumerate() {
            acc += f64::from(e);
            if acc > target {
                return (i as u32, 1.0);
            }
        }
        return (exps.iter().rposition(|&e| e > 0.0).unwrap_or(0) as u32, 1.0);
    }
    let probs = &mut scratch.probs;
    fill_probs(probs, exps, sum);
    // The top-k candidates, then the shortest prefix of them (in sampling order) reaching top-p.
    if top_k < vocab {
        probs.select_nth_unstable_by(top_k - 1, by_prob_desc);
    }
    let head = &mut probs[..top_k];
    let mass = &mut scratch.mass;
    mass.clear();
    mass.resize(BUCKETS, 0.0);
    for p in head.iter() {
        mass[bucket(p.0)] += f64::from(p.0);
    }
    // Buckets before `cut` are kept whole; `sub[..kept_in_cut]` are the kept tokens of `cut`.
    let sub = &mut scratch.sub;
    let (mut above, mut cut) = (0.0f64, BUCKETS);
    for (b, &m) in mass.iter().enumerate() {
        if above + m >= top_p {
            cut = b;
            break;
        }
        above += m;
    }
    let (kept_mass, kept_in_cut) = if cut < BUCKETS {
        gather(sub, head, cut);
        match cross(sub, above, top_p, false) {
            Some((r, m)) => (m, r + 1),
            None => (
                above + sub.iter().map(|p| f64::from(p.0)).sum::<f64>(),
                sub.len(),
            ),
        }
    } else {
        sub.clear();
        (above, 0)
    };
    // Inverse CDF over the kept tokens in sampling order: find the bucket, then the token.
    let target = u * kept_mass;
    let mut acc = 0.0f64;
    for (b, &m) in mass[..cut].iter().enumerate() {
        if acc + m > target {
            gather(sub, head, b);
            let token = match cross(sub, acc, target, true) {
                Some((r, _)) => sub[r].1,
                None => sub[last_in_order(sub)].1,
            };
            return (token, kept_mass);
        }
        acc += m;
    }
    if kept_in_cut > 0 {
        let kept = &mut sub[..kept_in_cut];
        if let Some((r, _)) = cross(kept, acc, target, true) {
            return (kept[r].1, kept_mass);
        }
        return (kept[last_in_order(kept)].1, kept_mass);
    }
    // Rounding at the end of the distribution: the last kept token in sampling order.
    let last = (0..cut).rev().find(|&b| mass[b] > 0.0).unwrap_or(0);
    gather(sub, head, last);
    (sub[last_in_order(sub)].1, kept_mass)
}

/// Histogram buckets: 128 per octave of probability over 32 octaves, the last one holding every
/// smaller probability.
const BUCKETS: usize = 32 * 128;

/// The bucket of a probability in `[0, 1]`: bucket 0 holds the largest values, and a bucket's
/// values all come before the next bucket's in the sampling order.
#[inline]
fn bucket(p: f32) -> usize {
    // The bits of a non-negative float increase with its value; keep exponent and 7 mantissa bits.
    let top = 1.0f32.to_bits() >> 16;
    let key = (p.to_bits() >> 16).min(top);
    ((top - key) as usize).min(BUCKETS - 1)
}

/// The items of `items` in bucket `b`, into `sub`.
fn gather(sub: &mut Vec<(f32, u32)>, items: &[(f32, u32)], b: usize) {
    sub.clear();
    sub.extend(items.iter().filter(|p| bucket(p.0) == b));
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

    /// The sampler as specified: sort the whole vocabulary, cut at top-k and top-p, walk the kept
    /// tokens in sorted order.
    fn reference_sample(logits: &[f32], sp: &SamplingParams, rng: &mut impl Rng) -> u32 {
        let inv_t = 1.0 / sp.temperature;
        let max_t = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) * inv_t;
        // The sampler's exponential (its values are part of the specification of a draw).
        let mut exps: Vec<f32> = logits.iter().map(|&z| z * inv_t - max_t).collect();
        exp_f32_slice(&mut exps);
        let sum: f64 = exps.iter().map(|&e| f64::from(e)).sum();
        let mut probs: Vec<(f32, u32)> = exps
            .iter()
            .enumerate()
            .map(|(i, &e)| ((f64::from(e) / sum) as f32, i as u32))
            .collect();
        probs.sort_by(by_prob_desc);
        let top_k = if sp.top_k == 0 {
            probs.len()
        } else {
            sp.top_k.min(probs.len())
        };
        let u: f64 = rng.random();
        let (mut kept, mut mass) = (0, 0.0f64);
        for p in &probs[..top_k] {
            kept += 1;
            mass += f64::from(p.0);
            if mass >= f64::from(sp.top_p) {
                break;
            }
        }
        let mut acc = 0.0;
        for p in &probs[..kept] {
            acc += f64::from(p.0);
            if acc > u * mass {
                return p.1;
            }
        }
        probs[kept - 1].1
    }

    #[test]
    fn partial_selection_draws_what_a_full_sort_draws() {
        let mut gen = ChaCha8Rng::seed_from_u64(5);
        let mut scratch = SamplerScratch::default();
        for case in 0..400 {
            let vocab = [1, 2, 7, 50, 300, 3000][case % 6];
            // Flat, peaked and tied (quantised) logits.
            let spread = [0.01f32, 1.0, 8.0][case / 6 % 3];
            let logits: Vec<f32> = (0..vocab)
                .map(|_| {
                    let z = gen.random::<f32>() * spread;
                    if case % 5 == 0 {
                        z.round()
                    } else {
                        z
                    }
                })
                .collect();
            let sp = params(
                [0.6f32, 1.0, 1.3][case % 3],
                [1.0f32, 0.95, 0.5, 0.01][case / 3 % 4],
                [0usize, 1, 5, 100][case / 2 % 4],
            );
            let (mut a, mut b) = (sp.rng_for(case as u64), sp.rng_for(case as u64));
            for _ in 0..20 {
                let got = sample(&logits, &sp, &mut a, &mut scratch).token;
                // Without a restriction both draw in id order (the path is unchanged).
                let want = if sp.top_p >= 1.0 && (sp.top_k == 0 || sp.top_k >= vocab) {
                    got
                } else {
                    reference_sample(&logits, &sp, &mut b)
                };
                assert_eq!(got, want, "case {case}: {sp:?}");
            }
        }
    }

    /// The log-probs of every token under each mode, by a full sort: tempered, processed (the
    /// kept set renormalised, minus infinity outside it) and raw.
    fn reference_logprobs(logits: &[f32], sp: &SamplingParams) -> [Vec<f64>; 3] {
        let t = if sp.temperature == 0.0 {
            1.0
        } else {
            f64::from(sp.temperature)
        };
        let lse = |xs: &[f64]| {
            let m = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            m + xs.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
        };
        let z: Vec<f64> = logits.iter().map(|&x| f64::from(x) / t).collect();
        let raw: Vec<f64> = logits.iter().map(|&x| f64::from(x)).collect();
        let tempered: Vec<f64> = z.iter().map(|x| x - lse(&z)).collect();
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| tempered[b].total_cmp(&tempered[a]).then(a.cmp(&b)));
        let top_k = if sp.top_k == 0 { order.len() } else { sp.top_k };
        let mut kept = vec![false; logits.len()];
        let mut mass = 0.0;
        for &i in order.iter().take(top_k) {
            kept[i] = true;
            mass += tempered[i].exp();
            if mass >= f64::from(sp.top_p) {
                break;
            }
        }
        let processed = (0..logits.len())
            .map(|i| {
                if sp.temperature == 0.0 {
                    tempered[i]
                } else if kept[i] {
                    tempered[i] - mass.ln()
                } else {
                    f64::NEG_INFINITY
                }
            })
            .collect();
        let raw_lp = raw.iter().map(|x| x - lse(&raw)).collect();
        [tempered, processed, raw_lp]
    }

    #[test]
    fn logprob_modes_and_top_logprobs_match_a_full_sort() {
        let logits = [1.0f32, 2.5, 3.0, -1.0, 0.5, 2.0];
        let modes = [
            LogprobMode::Tempered,
            LogprobMode::Processed,
            LogprobMode::Raw,
        ];
        for (t, p, k) in [
            (1.0, 1.0, 0),
            (0.6, 0.8, 0),
            (0.7, 1.0, 3),
            (1.5, 0.5, 4),
            (0.0, 0.9, 2),
        ] {
            let sp = params(t, p, k);
            let want = reference_logprobs(&logits, &sp);
            let mut rng = sp.rng_for(3);
            let mut scratch = SamplerScratch::default();
            for _ in 0..40 {
                let s = sample(&logits, &sp, &mut rng, &mut scratch);
                for (m, w) in modes.iter().zip(&want) {
                    let got = f64::from(s.logprob_as(*m, &logits, &sp));
                    let want = w[s.token as usize];
                    assert!((got - want).abs() < 1e-5, "{sp:?} {m:?}: {got} vs {want}");
                    let top = top_logprobs(&logits, &sp, *m, 4, &s, &mut scratch);
                    assert_eq!(top.len(), 4);
                    // In the sampling order: 2, 1, 5, 0.
                    let ids: Vec<u32> = top.iter().map(|x| x.0).collect();
                    assert_eq!(ids, [2, 1, 5, 0]);
                    for &(id, lp) in &top {
                        let want = w[id as usize];
                        if want.is_infinite() {
                            assert_eq!(lp, f32::NEG_INFINITY);
                        } else {
                            assert!((f64::from(lp) - want).abs() < 1e-5, "{sp:?} {m:?}");
                        }
                    }
                }
                // Processed equals tempered, bit for bit, when nothing is cut.
                if p == 1.0 && k == 0 {
                    assert_eq!(
                        s.logprob_as(LogprobMode::Processed, &logits, &sp),
                        s.logprob
                    );
                }
            }
        }
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
