//! Reward dispatch by `data_source`: math sets to the math verifier, multiple-choice sets
//! (SciKnowEval, MMLU, SciQ, ARC-Challenge, OpenBookQA) to the MCQ grader, arithmetic to the
//! numeric-answer reward.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::number::number_reward;
use crate::{mcq_reward, Limits, MathVerifier, Mode};

/// Which reward function scores a data source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RewardKind {
    /// The math verifier in the given mode.
    Math(Mode),
    /// The multiple-choice grader.
    Mcq,
    /// The numeric-answer reward ([`crate::number_reward`]): the stated final number, no
    /// expression evaluated.
    Number,
}

impl std::str::FromStr for RewardKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mcq" => Ok(RewardKind::Mcq),
            "number" => Ok(RewardKind::Number),
            "math" | "maxrl" => Ok(RewardKind::Math(Mode::Maxrl)),
            "math-default" | "default" => Ok(RewardKind::Math(Mode::Default)),
            "math-intent" | "intent" => Ok(RewardKind::Math(Mode::Intent)),
            other => Err(format!(
                "unknown reward kind `{other}` (expected math, maxrl, math-default, math-intent, mcq or number)"
            )),
        }
    }
}

/// The outcome of scoring one response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewardOutcome {
    /// The reward (0.0 or 1.0).
    pub reward: f64,
    /// The verifier ran out of time (the reward is then 0).
    pub timed_out: bool,
    /// Why no reward could be computed (e.g. an unparsable gold answer), if so.
    pub error: Option<String>,
}

/// The `data_source` values graded by the multiple-choice grader by default: SciKnowEval and the
/// multiple-choice sets `rlreplay prepare` writes.
pub const MCQ_SOURCES: [&str; 6] = [
    "sciknoweval",
    "mmlu",
    "sciq",
    "arc_challenge",
    "arc_easy",
    "openbookqa",
];

/// The `data_source` values graded by the numeric-answer reward by default: sets whose problems
/// are expressions the math verifier would evaluate for the policy.
pub const NUMBER_SOURCES: [&str; 1] = ["basic_arithmetic"];

/// Maps `data_source` values to reward functions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewardDispatch {
    /// Exact `data_source` -> reward kind.
    pub rules: BTreeMap<String, RewardKind>,
    /// The kind used for sources without a rule.
    pub fallback: RewardKind,
    /// Limits of the math verifier.
    #[serde(skip)]
    pub limits: Limits,
}

impl Default for RewardDispatch {
    /// [`MCQ_SOURCES`] -> MCQ; [`NUMBER_SOURCES`] -> the numeric-answer reward; every other
    /// source (polaris, aime25, beyondaime, minerva, MATH-500, gsm8k, ...) -> the math verifier
    /// with the MaxRL reward, as verl's MaxRL reward manager does.
    fn default() -> Self {
        let rules = MCQ_SOURCES
            .iter()
            .map(|s| (s.to_string(), RewardKind::Mcq))
            .chain(
                NUMBER_SOURCES
                    .iter()
                    .map(|s| (s.to_string(), RewardKind::Number)),
            )
            .collect();
        Self {
            rules,
            fallback: RewardKind::Math(Mode::Maxrl),
            limits: Limits::default(),
        }
    }
}

impl RewardDispatch {
    /// Adds or replaces the rule for `source`.
    pub fn with_rule(mut self, source: &str, kind: RewardKind) -> Self {
        self.rules.insert(source.to_string(), kind);
        self
    }

    /// Adds rules from a `source=kind,source=kind` string (kinds: math, maxrl, math-default,
    /// math-intent, mcq, number); the source `*` sets the kind of every source without a rule.
    pub fn with_rules_str(mut self, spec: &str) -> Result<Self, String> {
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (src, kind) = item
                .split_once('=')
                .ok_or_else(|| format!("reward rule `{item}` is not of the form source=kind"))?;
            let kind = kind.trim().parse()?;
            match src.trim() {
                "*" => self.fallback = kind,
                src => {
                    self.rules.insert(src.to_string(), kind);
                }
            }
        }
        Ok(self)
    }

    /// The reward kind for `data_source`.
    pub fn kind(&self, data_source: &str) -> RewardKind {
        self.rules
            .get(data_source)
            .copied()
            .unwrap_or(self.fallback)
    }

    /// Scores `response_text` against `ground_truth` with the function for `data_source`.
    pub fn score(
        &self,
        data_source: &str,
        ground_truth: &str,
        response_text: &str,
    ) -> RewardOutcome {
        match self.kind(data_source) {
            RewardKind::Mcq => RewardOutcome {
                reward: mcq_reward(response_text, ground_truth).score,
                timed_out: false,
                error: None,
            },
            RewardKind::Number => match number_reward(response_text, ground_truth) {
                Ok(reward) => RewardOutcome {
                    reward,
                    timed_out: false,
                    error: None,
                },
                Err(e) => RewardOutcome {
                    reward: 0.0,
                    timed_out: false,
                    error: Some(e),
                },
            },
            RewardKind::Math(mode) => {
                let v = MathVerifier {
                    mode,
                    limits: self.limits,
                }
                .verify(ground_truth, response_text);
                let error = if v.bounded {
                    Some("the verifier's nesting or size bound was reached (graded 0)".to_string())
                } else {
                    v.gold_unparsed.then(|| {
                        format!(
                            "no answer could be extracted from the ground truth {ground_truth:?}"
                        )
                    })
                };
                RewardOutcome {
                    reward: if v.bounded { 0.0 } else { v.reward() },
                    timed_out: v.timed_out,
                    error,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_by_source() {
        let d = RewardDispatch::default();
        assert_eq!(
            d.score("sciknoweval", "B", "<answer>B</answer>").reward,
            1.0
        );
        assert_eq!(d.score("mmlu", "C", "<answer>\nC\n</answer>").reward, 1.0);
        assert_eq!(d.kind("openbookqa"), RewardKind::Mcq);
        assert_eq!(d.kind("arc_easy"), RewardKind::Mcq);
        assert_eq!(d.kind("gsm8k"), RewardKind::Math(Mode::Maxrl));
        assert_eq!(d.kind("basic_arithmetic"), RewardKind::Number);
        assert_eq!(
            d.score("basic_arithmetic", "85", "86 - 1 = \\boxed{{}}")
                .reward,
            0.0
        );
        assert_eq!(d.score("basic_arithmetic", "85", "86 - 1 = 85").reward, 1.0);
        let bad = d.score("basic_arithmetic", "x", "1");
        assert_eq!(
            bad.error.as_deref(),
            Some("the ground truth \"x\" is not a number")
        );
        // The math verifier grades the restated expression right.
        assert_eq!(d.score("math", "85", "86 - 1 is \\boxed{{}}.").reward, 1.0);
        assert_eq!(d.score("polaris", "12", "so \\boxed{12}").reward, 1.0);
        assert_eq!(d.score("aime25", "12", "so \\boxed{13}").reward, 0.0);
        let d = d.with_rules_str("polaris=mcq").unwrap();
        assert_eq!(d.kind("polaris"), RewardKind::Mcq);
        assert!(RewardDispatch::default().with_rules_str("x=nope").is_err());
        let d = RewardDispatch::default()
            .with_rules_str("math500=math-intent")
            .unwrap();
        assert_eq!(d.kind("math500"), RewardKind::Math(Mode::Intent));
        assert_eq!(
            d.score("math500", "4", "$\\boxed{\\text{four}}$").reward,
            1.0
        );
        assert_eq!(d.score("gsm8k", "4", "$\\boxed{\\text{four}}$").reward, 0.0);
        let d = RewardDispatch::default()
            .with_rules_str("*=intent")
            .unwrap();
        assert_eq!(d.kind("gsm8k"), RewardKind::Math(Mode::Intent));
        assert_eq!(d.kind("mmlu"), RewardKind::Mcq);
    }
}
