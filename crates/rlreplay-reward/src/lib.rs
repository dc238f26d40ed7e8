//! Rewards: a math answer verifier equivalent to math-verify 0.9.0 and the multiple-choice grader.
//!
//! * [`verify`] / [`MathVerifier`] grade a predicted answer against a gold answer, in the MaxRL
//!   reward configuration ([`Mode::Maxrl`]) or math-verify's library defaults ([`Mode::Default`]).
//! * [`mcq_reward`] scores SciKnowEval multiple-choice responses as the SDPO code does.
//! * [`number_reward`] grades the final number a response states (arithmetic, where the verifier
//!   would evaluate a restated expression).
//! * [`RewardDispatch`] routes a `data_source` to one of them.
//!
//! No Python runs: extraction, LaTeX normalisation, parsing and equivalence are implemented here,
//! with a time limit per answer and bounded input sizes.
#![warn(missing_docs)]

mod compare;
mod dispatch;
pub mod expr;
pub mod extract;
mod intent;
pub mod latex;
mod mcq;
pub mod normalize;
mod number;
mod sets;

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use dispatch::{RewardDispatch, RewardKind, RewardOutcome, MCQ_SOURCES, NUMBER_SOURCES};
pub use mcq::{mcq_reward, McqScore};
pub use number::{canonical_number, number_answer, number_reward};

use expr::{Budget, Stop};
use extract::{extract, Extracted, Target};

/// Which reward configuration to reproduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The MaxRL/verl reward: the gold answer wrapped in `\boxed{}` and extracted as LaTeX; the
    /// prediction extracted as a plain expression, then as LaTeX.
    #[default]
    Maxrl,
    /// math-verify's library defaults: both sides extracted as LaTeX, then as expressions.
    Default,
    /// The MaxRL reward plus the rules of a careful human grader where math-verify's verdict is
    /// wrong (other forms of equal values, typographic forms, option letters, retracted boxes,
    /// truncated reasoning, rounded decimals); see `docs/EVAL.md`.
    Intent,
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "maxrl" => Ok(Mode::Maxrl),
            "default" => Ok(Mode::Default),
            "intent" => Ok(Mode::Intent),
            other => Err(format!(
                "unknown verifier mode `{other}` (expected maxrl, default or intent)"
            )),
        }
    }
}

/// Resource limits of one verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock limit for extracting and comparing one answer pair.
    pub time: Duration,
    /// Longest text examined, in bytes; a longer prediction is cut to its last `max_bytes`
    /// (the answer sits at the end of a response), a longer gold answer is rejected.
    pub max_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            time: Duration::from_secs(1),
            max_bytes: 64 * 1024,
        }
    }
}

/// The result of one verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// The prediction is equivalent to the gold answer.
    pub correct: bool,
    /// The time limit was reached (the verdict is then `false`).
    pub timed_out: bool,
    /// No answer could be extracted from the gold text (the verdict is then `false`).
    pub gold_unparsed: bool,
    /// A nesting or size bound was reached (a gold text over [`Limits::max_bytes`], an
    /// expression nested deeper than the parser's bounds): the text at hand counted as
    /// unparsable, as math-verify's recursion errors do. The reward path grades such answers 0.
    pub bounded: bool,
}

impl Verdict {
    /// 1.0 when correct, else 0.0.
    pub fn reward(&self) -> f64 {
        if self.correct {
            1.0
        } else {
            0.0
        }
    }
}

/// A verifier with a fixed mode and limits.
#[derive(Debug, Clone, Copy, Default)]
pub struct MathVerifier {
    /// Reward configuration.
    pub mode: Mode,
    /// Resource limits per answer.
    pub limits: Limits,
}

impl MathVerifier {
    /// A verifier for `mode` with default limits (1 s per answer).
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            limits: Limits::default(),
        }
    }

    /// Grades `pred` against `gold`.
    pub fn verify(&self, gold: &str, pred: &str) -> Verdict {
        verify(gold, pred, self.mode, &self.limits)
    }
}

fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

fn same(g: &Extracted, p: &Extracted, b: &Budget) -> Result<bool, Stop> {
    match (g, p) {
        (Extracted::Value(g), Extracted::Value(p)) => compare::expr_eq(g, p, b),
        (Extracted::Text(g), Extracted::Text(p)) => {
            let (g, p) = (g.trim(), p.trim());
            Ok(!g.is_empty() && g == p)
        }
        _ => Ok(false),
    }
}

fn run(gold: &str, pred: &str, mode: Mode, b: &Budget) -> Result<(bool, bool), Stop> {
    let (golds, preds) = match mode {
        Mode::Maxrl => (
            extract(&format!("\\boxed{{{gold}}}"), &[Target::Latex], b)?,
            extract(pred, &[Target::Expr, Target::Latex], b)?,
        ),
        Mode::Default => (
            extract(gold, &[Target::Latex, Target::Expr], b)?,
            extract(pred, &[Target::Latex, Target::Expr], b)?,
        ),
        Mode::Intent => return intent::run(gold, pred, b),
    };
    if golds.is_empty() {
        return Ok((false, true));
    }
    for g in &golds {
        for p in &preds {
            // A failed comparison counts as "not equal", as in math-verify.
            match same(g, p, b) {
                Ok(true) => return Ok((true, false)),
                Ok(false) | Err(Stop::Fail) => {}
                Err(Stop::Timeout) => return Err(Stop::Timeout),
            }
        }
    }
    Ok((false, false))
}

/// Grades `pred` against `gold` in `mode` within `limits`. Never panics.
pub fn verify(gold: &str, pred: &str, mode: Mode, limits: &Limits) -> Verdict {
    let mut verdict = Verdict {
        correct: false,
        timed_out: false,
        gold_unparsed: false,
        bounded: false,
    };
    if gold.len() > limits.max_bytes {
        verdict.gold_unparsed = true;
        verdict.bounded = true;
        return verdict;
    }
    let pred = tail(pred, limits.max_bytes);
    // The first call in a process builds the normalisation regexes, not charged to this answer's
    // time limit (each extraction regex is built on first use, outside the limit as well).
    extract::compile_regexes();
    let budget = Budget::new(Instant::now() + limits.time);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run(gold, pred, mode, &budget)
    }));
    match outcome {
        Ok(Ok((correct, gold_unparsed))) => {
            verdict.correct = correct;
            verdict.gold_unparsed = gold_unparsed;
        }
        Ok(Err(Stop::Timeout)) => verdict.timed_out = true,
        Ok(Err(Stop::Fail)) | Err(_) => {}
    }
    verdict.bounded = budget.bounds_hit() > 0;
    verdict
}

/// Grades many `(gold, pred)` pairs in parallel (rayon); verdicts come back in input order.
pub fn verify_batch(verifier: &MathVerifier, pairs: &[(String, String)]) -> Vec<Verdict> {
    use rayon::prelude::*;
    pairs
        .par_iter()
        .map(|(g, p)| verifier.verify(g, p))
        .collect()
}
