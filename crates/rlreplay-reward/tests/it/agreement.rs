//! Agreement with math-verify 0.9.0 on the committed differential-testing cases: math-verify's own
//! test-suite pairs plus generated model-style outputs (`scripts/diff_math_verify.py generate`),
//! and real reference answers (MATH solutions, GSM8K rationales) plus hand-written endings of the
//! categories that once disagreed (`scripts/diff_math_verify.py real`), and the hand-labelled
//! model endings of `data/intent_labels.jsonl` (`scripts/intent_agreement.py grade`).

use rlreplay_reward::{verify_batch, MathVerifier, Mode};

const FILES: [(&str, &str); 3] = [
    (
        "math_verify_cases",
        include_str!("../data/math_verify_cases.jsonl"),
    ),
    (
        "math_verify_real",
        include_str!("../data/math_verify_real.jsonl"),
    ),
    ("intent_labels", include_str!("../data/intent_labels.jsonl")),
];

/// Minimum agreement asserted per mode: every verdict (the measured level).
const MIN_AGREEMENT: [(Mode, &str, f64); 2] =
    [(Mode::Maxrl, "maxrl", 1.0), (Mode::Default, "default", 1.0)];

#[derive(serde::Deserialize)]
struct Case {
    #[serde(alias = "category")]
    source: String,
    gold: String,
    pred: String,
    maxrl: bool,
    default: bool,
}

fn check(file: &str, text: &str) {
    let cases: Vec<Case> = text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("{file} line {}: {e}", i + 1))
        })
        .collect();
    let pairs: Vec<(String, String)> = cases
        .iter()
        .map(|c| (c.gold.clone(), c.pred.clone()))
        .collect();
    for (mode, name, floor) in MIN_AGREEMENT {
        let verdicts = verify_batch(&MathVerifier::new(mode), &pairs);
        let mut bad = 0;
        for (c, v) in cases.iter().zip(&verdicts) {
            let expected = if mode == Mode::Maxrl {
                c.maxrl
            } else {
                c.default
            };
            if v.correct != expected {
                bad += 1;
                eprintln!(
                    "[{name}] [{}] gold={:?} pred={:?} math-verify={expected}",
                    c.source, c.gold, c.pred
                );
            }
        }
        let agreement = 1.0 - bad as f64 / cases.len() as f64;
        eprintln!(
            "{file} {name}: {}/{} agree ({:.2}%)",
            cases.len() - bad,
            cases.len(),
            100.0 * agreement
        );
        assert!(
            agreement >= floor,
            "{file} {name}: agreement {agreement:.4} below {floor}"
        );
    }
}

#[test]
fn agrees_with_math_verify() {
    for (file, text) in FILES {
        check(file, text);
    }
}
