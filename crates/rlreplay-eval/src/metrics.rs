//! Evaluation metrics over `n` samples per prompt: mean@n, the unbiased pass@k estimator and
//! maj@k (majority vote over answers grouped by an equivalence relation). Pure functions.

use serde::Serialize;

use crate::error::{Error, Result};

/// Unbiased pass@k of one prompt with `c` correct samples out of `n`:
/// `1 - C(n-c, k) / C(n, k)`, computed as `1 - prod_{i=n-c+1}^{n} (1 - k/i)` (no large binomials).
///
/// Returns `None` when `k == 0`, `k > n` or `c > n`.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> Option<f64> {
    if k == 0 || k > n || c > n {
        return None;
    }
    if n - c < k {
        return Some(1.0);
    }
    let prod: f64 = ((n - c + 1)..=n)
        .map(|i| 1.0 - k as f64 / i as f64)
        .product();
    Some(1.0 - prod)
}

/// The ks reported for `n` samples: 1, 2, 4, … up to `n`, and `n` itself when it is not a power of two.
pub fn ks_for(n: usize) -> Vec<usize> {
    let mut ks: Vec<usize> = std::iter::successors(Some(1usize), |k| k.checked_mul(2))
        .take_while(|&k| k <= n)
        .collect();
    if n > 0 && ks.last() != Some(&n) {
        ks.push(n);
    }
    ks
}

/// The index of the answer chosen by majority vote among `answers`, grouping answers with
/// `equivalent` (each answer joins the first earlier group whose first member it is equivalent to).
/// The largest group wins; ties go to the group whose first member came first. `None` answers
/// (nothing extracted) do not vote. Returns the index of the winning group's first member.
pub fn majority_index<T>(
    answers: &[Option<T>],
    mut equivalent: impl FnMut(&T, &T) -> bool,
) -> Option<usize> {
    // (index of first member, size)
    let mut groups: Vec<(usize, usize)> = Vec::new();
    for (i, a) in answers.iter().enumerate() {
        let Some(a) = a else { continue };
        let found = groups.iter_mut().find(|(first, _)| {
            let rep = answers[*first]
                .as_ref()
                .expect("group representatives have an answer");
            equivalent(rep, a)
        });
        match found {
            Some(g) => g.1 += 1,
            None => groups.push((i, 1)),
        }
    }
    let mut best: Option<(usize, usize)> = None;
    for g in groups {
        if best.is_none_or(|b| g.1 > b.1) {
            best = Some(g);
        }
    }
    best.map(|(first, _)| first)
}

/// maj@k of one prompt: the samples are cut into `n / k` consecutive blocks of `k` (a remainder
/// is dropped); in each block the majority answer ([`majority_index`]) is scored by its sample's
/// correctness (a block without any answer scores 0); the result is the mean over blocks.
/// Samples are i.i.d., so each block is an unbiased draw of a k-sample vote.
///
/// Returns `None` when `k == 0`, `k > n` or `answers` and `correct` differ in length.
pub fn maj_at_k<T>(
    answers: &[Option<T>],
    correct: &[bool],
    k: usize,
    mut equivalent: impl FnMut(&T, &T) -> bool,
) -> Option<f64> {
    let n = answers.len();
    if k == 0 || k > n || correct.len() != n {
        return None;
    }
    let blocks = n / k;
    let mut total = 0.0;
    for b in 0..blocks {
        let range = b * k..(b + 1) * k;
        if let Some(i) = majority_index(&answers[range.clone()], &mut equivalent) {
            if correct[range.start + i] {
                total += 1.0;
            }
        }
    }
    Some(total / blocks as f64)
}

/// The scored samples of one prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptSamples<T> {
    /// The prompt's data source (metrics are grouped by it).
    pub data_source: String,
    /// The reward of each sample.
    pub rewards: Vec<f64>,
    /// The extracted answer of each sample (for maj@k), `None` when nothing was extracted.
    pub answers: Vec<Option<T>>,
    /// The length of each sample and whether it was cut at the token limit.
    pub shapes: Vec<ResponseShape>,
}

/// The length of one response and whether it was cut at the token limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResponseShape {
    /// Response tokens.
    pub tokens: usize,
    /// It reached the token limit without a stop token.
    pub truncated: bool,
}

/// The default success threshold: a sample counts as correct for pass@k and maj@k when its reward
/// is at least this (the training configuration's `success_reward_threshold`, the same comparison).
pub const DEFAULT_SUCCESS_THRESHOLD: f64 = 0.5;

/// Metrics of a group of prompts (one data source, or all).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupMetrics {
    /// The data source, or `all`.
    pub data_source: String,
    /// Number of prompts.
    pub prompts: usize,
    /// Samples per prompt.
    pub n: usize,
    /// Mean reward over all samples (mean@n).
    pub mean: f64,
    /// `(k, pass@k)` averaged over prompts.
    pub pass_at_k: Vec<(usize, f64)>,
    /// `(k, maj@k)` averaged over prompts.
    pub maj_at_k: Vec<(usize, f64)>,
    /// Share of the samples with an answer to grade by vote: a `\boxed{}` (math), an
    /// `<answer>` block or a bare answer (multiple choice).
    pub answered: f64,
    /// Mean response length in tokens (verl's `response_length/mean`).
    pub response_length: f64,
    /// Share of the samples cut at the token limit (verl's `response_length/clip_ratio`).
    pub clip_ratio: f64,
}

/// Computes [`GroupMetrics`] per data source (sorted by name) followed by the overall group
/// `all`; a sample is correct when its reward is at least `success_threshold`. Every prompt must
/// have the same number of samples `n >= 1`.
pub fn evaluate<T>(
    prompts: &[PromptSamples<T>],
    success_threshold: f64,
    mut equivalent: impl FnMut(&T, &T) -> bool,
) -> Result<Vec<GroupMetrics>> {
    let n = prompts.first().map_or(0, |p| p.rewards.len());
    if n == 0 {
        return Err(Error::NoSamples);
    }
    for (i, p) in prompts.iter().enumerate() {
        if p.rewards.len() != n || p.answers.len() != n || p.shapes.len() != n {
            return Err(Error::SampleCount {
                prompt: i,
                rewards: p.rewards.len(),
                answers: p.answers.len(),
                shapes: p.shapes.len(),
                expected: n,
            });
        }
    }
    let mut sources: Vec<&str> = prompts.iter().map(|p| p.data_source.as_str()).collect();
    sources.sort_unstable();
    sources.dedup();
    let mut out = Vec::with_capacity(sources.len() + 1);
    for s in sources {
        let group: Vec<&PromptSamples<T>> = prompts.iter().filter(|p| p.data_source == s).collect();
        out.push(group_metrics(
            s,
            &group,
            n,
            success_threshold,
            &mut equivalent,
        ));
    }
    let all: Vec<&PromptSamples<T>> = prompts.iter().collect();
    out.push(group_metrics(
        "all",
        &all,
        n,
        success_threshold,
        &mut equivalent,
    ));
    Ok(out)
}

fn group_metrics<T>(
    name: &str,
    group: &[&PromptSamples<T>],
    n: usize,
    success_threshold: f64,
    equivalent: &mut impl FnMut(&T, &T) -> bool,
) -> GroupMetrics {
    let m = group.len() as f64;
    let mean = group.iter().flat_map(|p| &p.rewards).sum::<f64>() / (m * n as f64);
    let ks = ks_for(n);
    let correct: Vec<Vec<bool>> = group
        .iter()
        .map(|p| p.rewards.iter().map(|&r| r >= success_threshold).collect())
        .collect();
    let pass = ks
        .iter()
        .map(|&k| {
            let s: f64 = correct
                .iter()
                .map(|c| pass_at_k(n, c.iter().filter(|&&x| x).count(), k).unwrap_or(0.0))
                .sum();
            (k, s / m)
        })
        .collect();
    let maj = ks
        .iter()
        .map(|&k| {
            let s: f64 = group
                .iter()
                .zip(&correct)
                .map(|(p, c)| maj_at_k(&p.answers, c, k, &mut *equivalent).unwrap_or(0.0))
                .sum();
            (k, s / m)
        })
        .collect();
    let samples = m * n as f64;
    let shapes = || group.iter().flat_map(|p| &p.shapes);
    GroupMetrics {
        data_source: name.to_owned(),
        prompts: group.len(),
        n,
        mean,
        pass_at_k: pass,
        maj_at_k: maj,
        answered: group
            .iter()
            .flat_map(|p| &p.answers)
            .filter(|a| a.is_some())
            .count() as f64
            / samples,
        response_length: shapes().map(|s| s.tokens as f64).sum::<f64>() / samples,
        clip_ratio: shapes().filter(|s| s.truncated).count() as f64 / samples,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exact binomial coefficient by integer arithmetic.
    fn binom(n: u128, k: u128) -> u128 {
        if k > n {
            return 0;
        }
        (0..k).fold(1u128, |acc, i| acc * (n - i) / (i + 1))
    }

    #[test]
    fn pass_at_k_matches_exact_combinatorics() {
        for n in 1..=40usize {
            for c in 0..=n {
                for k in 1..=n {
                    let exact = 1.0
                        - binom((n - c) as u128, k as u128) as f64
                            / binom(n as u128, k as u128) as f64;
                    let got = pass_at_k(n, c, k).unwrap();
                    assert!(
                        (got - exact).abs() < 1e-12,
                        "n={n} c={c} k={k}: {got} vs {exact}"
                    );
                }
            }
        }
    }

    #[test]
    fn pass_at_k_edges() {
        assert_eq!(pass_at_k(16, 0, 4), Some(0.0));
        assert_eq!(pass_at_k(16, 16, 1), Some(1.0));
        assert_eq!(pass_at_k(16, 4, 1), Some(0.25));
        assert_eq!(pass_at_k(16, 13, 4), Some(1.0));
        assert_eq!(pass_at_k(4, 1, 0), None);
        assert_eq!(pass_at_k(4, 1, 5), None);
        assert_eq!(pass_at_k(4, 5, 1), None);
        // Large n stays finite and in range.
        let p = pass_at_k(1024, 3, 512).unwrap();
        assert!(p > 0.87 && p < 0.88, "{p}");
    }

    #[test]
    fn ks() {
        assert_eq!(ks_for(16), [1, 2, 4, 8, 16]);
        assert_eq!(ks_for(12), [1, 2, 4, 8, 12]);
        assert_eq!(ks_for(1), [1]);
        assert!(ks_for(0).is_empty());
    }

    #[test]
    fn majority_vote_by_equivalence() {
        let eq = |a: &&str, b: &&str| a.trim() == b.trim();
        let answers = [Some("1"), Some("2"), Some(" 2"), None, Some("1 ")];
        // Tie 2-2: the group seen first ("1") wins.
        assert_eq!(majority_index(&answers, eq), Some(0));
        let answers = [Some("1"), Some("2"), Some(" 2")];
        assert_eq!(majority_index(&answers, eq), Some(1));
        let none: [Option<&str>; 2] = [None, None];
        assert_eq!(majority_index(&none, eq), None);
    }

    #[test]
    fn maj_at_k_blocks() {
        let eq = |a: &i32, b: &i32| a == b;
        let answers = [
            Some(1),
            Some(1),
            Some(2),
            Some(3),
            None,
            None,
            Some(2),
            Some(2),
        ];
        let correct = [true, true, false, false, false, false, false, false];
        assert_eq!(maj_at_k(&answers, &correct, 8, eq), Some(0.0)); // 2 wins 3:2
        assert_eq!(maj_at_k(&answers, &correct, 4, eq), Some(0.5)); // [1 wins], [2 wins]
        assert_eq!(maj_at_k(&answers, &correct, 1, eq), Some(0.25));
        assert_eq!(maj_at_k(&answers, &correct, 3, eq), Some(0.5)); // [1,1,2] -> 1; [3,-,-] -> 3
        assert_eq!(maj_at_k(&answers, &correct[..3], 1, eq), None);
    }

    #[test]
    fn evaluate_groups_by_source() {
        let p = |s: &str, r: [f64; 4], a: [i32; 4]| PromptSamples {
            data_source: s.into(),
            rewards: r.to_vec(),
            answers: a.iter().map(|&x| (x > 0).then_some(x)).collect(),
            shapes: a
                .iter()
                .map(|&x| ResponseShape {
                    tokens: 10 * x as usize,
                    truncated: x == 7,
                })
                .collect(),
        };
        let prompts = [
            p("b", [1.0, 0.0, 0.0, 0.0], [5, 6, 6, 7]),
            p("a", [1.0, 1.0, 1.0, 0.0], [1, 1, 1, 2]),
            p("b", [0.0, 0.0, 0.0, 0.0], [3, 3, 3, 3]),
        ];
        let m = evaluate(&prompts, DEFAULT_SUCCESS_THRESHOLD, |a, b| a == b).unwrap();
        let names: Vec<&str> = m.iter().map(|g| g.data_source.as_str()).collect();
        assert_eq!(names, ["a", "b", "all"]);
        assert_eq!(m[0].mean, 0.75);
        assert_eq!(m[1].mean, 0.125);
        assert_eq!(m[2].mean, 4.0 / 12.0);
        assert_eq!(m[1].pass_at_k, [(1, 0.125), (2, 0.25), (4, 0.5)]);
        assert_eq!(m[0].maj_at_k[2], (4, 1.0));
        assert_eq!(m[1].maj_at_k[2], (4, 0.0));
        assert_eq!(m[2].prompts, 3);
        assert_eq!(
            (m[0].answered, m[0].response_length, m[0].clip_ratio),
            (1.0, 12.5, 0.0)
        );
        let b = &m[1];
        assert_eq!(
            (b.answered, b.response_length, b.clip_ratio),
            (1.0, 45.0, 0.125)
        );
        let zero = [p("z", [0.0; 4], [0, 0, 1, 0])];
        let z = &evaluate(&zero, DEFAULT_SUCCESS_THRESHOLD, |a, b| a == b).unwrap()[0];
        assert_eq!((z.answered, z.response_length), (0.25, 2.5));
        assert!(evaluate::<i32>(&[], DEFAULT_SUCCESS_THRESHOLD, |a, b| a == b).is_err());
        let ragged = [prompts[0].clone(), p("a", [1.0; 4], [1; 4])];
        let mut bad = ragged.clone();
        bad[1].rewards.pop();
        assert!(evaluate(&bad, DEFAULT_SUCCESS_THRESHOLD, |a, b| a == b).is_err());
        let mut bad = ragged.clone();
        bad[0].shapes.pop();
        let e = evaluate(&bad, DEFAULT_SUCCESS_THRESHOLD, |a, b| a == b).unwrap_err();
        assert_eq!(
            e.to_string(),
            "prompt 0: 4 rewards, 4 answers and 3 response shapes, expected 4 of each"
        );
    }

    /// Guards the one success comparison: a reward equal to the threshold is a success for
    /// pass@k and maj@k, as for the training filters (it used to be `r > 0.5`).
    #[test]
    fn a_reward_at_the_threshold_is_correct() {
        let prompts = [PromptSamples {
            data_source: "s".into(),
            rewards: vec![0.5, 0.0],
            answers: vec![Some(1), Some(2)],
            shapes: vec![ResponseShape::default(); 2],
        }];
        let m = evaluate(&prompts, DEFAULT_SUCCESS_THRESHOLD, |a, b| a == b).unwrap();
        assert_eq!(m[0].pass_at_k[0], (1, 0.5));
        let strict = evaluate(&prompts, 0.75, |a, b| a == b).unwrap();
        assert_eq!(strict[0].pass_at_k[0], (1, 0.0));
    }
}
