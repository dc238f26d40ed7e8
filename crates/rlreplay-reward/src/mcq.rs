//! The SciKnowEval multiple-choice reward, as the SDPO code scores it.

use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// `<answer> X </answer>` at the very end (Python `$`: also before one final newline).
static FORMAT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"<answer>\s*(A|B|C|D)\s*</answer>\n?\z").expect("static regex"));

/// The score of one multiple-choice response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McqScore {
    /// 1.0 when the extracted answer equals the ground truth exactly, else 0.0.
    pub score: f64,
    /// The extracted answer: the text after the last `<answer>` and before the next `</answer>`,
    /// trimmed (the whole response when there is no tag).
    pub pred: String,
    /// The response ends with `<answer>X</answer>` for a letter A–D (does not affect the score).
    pub format_ok: bool,
}

/// Scores `response` against the answer letter `ground_truth` (exact, case-sensitive).
pub fn mcq_reward(response: &str, ground_truth: &str) -> McqScore {
    let after = response.rsplit("<answer>").next().unwrap_or(response);
    let inner = after.split("</answer>").next().unwrap_or(after);
    let pred = inner.trim().to_string();
    let score = if pred == ground_truth { 1.0 } else { 0.0 };
    McqScore {
        score,
        pred,
        format_ok: FORMAT.is_match(response),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdpo_edge_cases() {
        assert_eq!(mcq_reward("B", "B").score, 1.0);
        assert_eq!(mcq_reward("b", "B").score, 0.0);
        assert_eq!(mcq_reward("B: 0.005", "B").score, 0.0);
        assert_eq!(mcq_reward("(B)", "B").score, 0.0);
        let r = mcq_reward("<reasoning>\nx\n</reasoning>\n<answer>\nB\n</answer>", "B");
        assert_eq!((r.score, r.format_ok), (1.0, true));
        let r = mcq_reward("<answer>B</answer> trailing text", "B");
        assert_eq!((r.score, r.format_ok), (1.0, false));
        assert_eq!(
            mcq_reward("<answer>A</answer> <answer>C</answer>", "C").score,
            1.0
        );
        assert_eq!(mcq_reward("<answer> D", "D").score, 1.0);
        assert!(mcq_reward("<answer>A</answer>\n", "A").format_ok);
    }
}
