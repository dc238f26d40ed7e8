//! The `intent` mode against the hand-labelled model endings of `data/intent_labels.jsonl`
//! (`scripts/intent_agreement.py`): at least 5 points more agreement with the human labels than
//! math-verify 0.9.0's MaxRL reward (its stored verdicts), and every case math-verify grades as
//! the label does graded the same way.

use rlreplay_reward::{verify_batch, MathVerifier, Mode};

#[derive(serde::Deserialize)]
struct Case {
    id: String,
    gold: String,
    pred: String,
    label: bool,
    maxrl: bool,
}

#[test]
fn intent_beats_math_verify_without_losing_a_case() {
    let cases: Vec<Case> = include_str!("../data/intent_labels.jsonl")
        .lines()
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).unwrap_or_else(|e| panic!("line {}: {e}", i + 1)))
        .collect();
    assert!(cases.len() >= 300, "{} labelled cases", cases.len());
    let pairs: Vec<(String, String)> = cases
        .iter()
        .map(|c| (c.gold.clone(), c.pred.clone()))
        .collect();
    let verdicts = verify_batch(&MathVerifier::new(Mode::Intent), &pairs);
    let mut lost = Vec::new();
    let (mut intent_ok, mut mv_ok) = (0, 0);
    for (c, v) in cases.iter().zip(&verdicts) {
        mv_ok += usize::from(c.maxrl == c.label);
        intent_ok += usize::from(v.correct == c.label);
        if v.correct != c.label {
            eprintln!(
                "[{}] gold={:?} pred={:?} label={} intent={} math-verify={}",
                c.id, c.gold, c.pred, c.label, v.correct, c.maxrl
            );
            if c.maxrl == c.label {
                lost.push(c.id.as_str());
            }
        }
    }
    let n = cases.len() as f64;
    let (intent_pct, mv_pct) = (100.0 * intent_ok as f64 / n, 100.0 * mv_ok as f64 / n);
    eprintln!(
        "intent {intent_ok}/{} ({intent_pct:.1}%), math-verify maxrl {mv_ok}/{} ({mv_pct:.1}%)",
        cases.len(),
        cases.len()
    );
    assert!(
        lost.is_empty(),
        "cases math-verify gets right, lost: {lost:?}"
    );
    assert!(
        intent_pct >= mv_pct + 5.0,
        "intent {intent_pct:.1}% is not 5 points above math-verify's {mv_pct:.1}%"
    );
}
