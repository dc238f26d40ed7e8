//! Rewards and majority-vote answers of generated responses, by data source.

use rlreplay_reward::normalize::{extract_boxed_content, BoxedMode};
use rlreplay_reward::{
    mcq_reward, number_answer, MathVerifier, RewardDispatch, RewardKind, RewardOutcome,
};

/// The answer a response votes for in maj@k, with the reward kind that compares answers.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// How answers of this data source are compared.
    pub kind: RewardKind,
    /// The extracted answer text.
    pub text: String,
}

/// Scores responses and extracts their answers with a [`RewardDispatch`].
#[derive(Debug, Clone, Default)]
pub struct Scorer {
    /// The reward function of each data source.
    pub dispatch: RewardDispatch,
}

impl Scorer {
    /// The reward of `response` (decoded text) against `ground_truth`.
    pub fn score(&self, data_source: &str, ground_truth: &str, response: &str) -> RewardOutcome {
        self.dispatch.score(data_source, ground_truth, response)
    }

    /// The answer `response` votes for: the last `\boxed{}` content for math sources (as verl's
    /// majority vote extracts it), the text of the last `<answer>` block for multiple choice, the
    /// stated number in canonical form for numeric answers.
    pub fn answer(&self, data_source: &str, response: &str) -> Option<Answer> {
        let kind = self.dispatch.kind(data_source);
        let text = match kind {
            RewardKind::Mcq => mcq_reward(response, "").pred,
            RewardKind::Number => number_answer(response)?,
            RewardKind::Math(_) => {
                if !(response.contains("\\boxed") || response.contains("\\fbox")) {
                    return None;
                }
                extract_boxed_content(response, BoxedMode::Last)
            }
        };
        let text = text.trim();
        (!text.is_empty()).then(|| Answer {
            kind,
            text: text.to_owned(),
        })
    }

    /// Whether two answers count as the same vote: the math verifier (in the source's mode, with
    /// `a` as gold) for math, exact equality for multiple choice.
    pub fn equivalent(&self, a: &Answer, b: &Answer) -> bool {
        if a.text == b.text {
            return true;
        }
        match a.kind {
            RewardKind::Mcq | RewardKind::Number => false,
            RewardKind::Math(mode) => {
                MathVerifier {
                    mode,
                    limits: self.dispatch.limits,
                }
                .verify(&a.text, &format!("\\boxed{{{}}}", b.text))
                .correct
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_and_votes() {
        let s = Scorer::default();
        let a = s
            .answer("polaris", "so the answer is \\boxed{\\frac{1}{2}}.")
            .unwrap();
        assert_eq!(a.text, "\\frac{1}{2}");
        let b = s.answer("aime25", "x = \\boxed{0.5}").unwrap();
        assert!(s.equivalent(&a, &b));
        let c = s.answer("aime25", "\\boxed{3}").unwrap();
        assert!(!s.equivalent(&a, &c));
        assert_eq!(s.answer("polaris", "no box, 12"), None);
        let m = s.answer("sciknoweval", "<answer>\nB\n</answer>").unwrap();
        assert_eq!(m.text, "B");
        let m2 = s.answer("sciknoweval", "<answer>b</answer>").unwrap();
        assert!(!s.equivalent(&m, &m2));
        assert_eq!(
            s.score("sciknoweval", "B", "<answer>B</answer>").reward,
            1.0
        );
    }

    /// 8,000 `!` in a response or a ground truth once overflowed the verifier's stack.
    #[test]
    fn long_operator_chains_score_zero() {
        let run = || {
            let s = Scorer::default();
            let chain = format!("\\boxed{{3{}}}", "!".repeat(8000));
            let out = s.score("math", "6", &chain);
            assert_eq!(out.reward, 0.0);
            assert!(out.error.is_some());
            let gold = format!("3{}", "^2".repeat(8000));
            assert_eq!(s.score("math", &gold, "\\boxed{3}").reward, 0.0);
            let a = s.answer("math", &chain).unwrap();
            let b = s.answer("math", "\\boxed{6}").unwrap();
            assert!(!s.equivalent(&a, &b) && !s.equivalent(&b, &a));
        };
        std::thread::Builder::new()
            .stack_size(512 * 1024)
            .spawn(run)
            .unwrap()
            .join()
            .unwrap();
    }
}
