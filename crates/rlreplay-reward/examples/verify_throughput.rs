//! Verifier throughput on a JSONL file of `{"gold", "pred"}` cases, single-threaded; when the
//! cases carry math-verify's verdicts (`"maxrl"`, `"default"`, as `scripts/diff_math_verify.py`
//! writes them), also the agreement with them in the chosen mode, and the disagreements.
//!
//! `cargo run --release -p rlreplay-reward --example verify_throughput -- CASES.jsonl [maxrl|default] [REPS] [--show N]`
//!
//! The first call (which compiles the extraction regexes) is timed separately, then every pair is
//! graded `REPS` times (default 5); the rate is over the repetitions.

use std::time::Instant;

use rlreplay_reward::{MathVerifier, Mode};

fn main() -> Result<(), String> {
    let usage = "usage: verify_throughput CASES.jsonl [maxrl|default] [REPS] [--show N]";
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut show = 0usize;
    if let Some(i) = args.iter().position(|a| a == "--show") {
        let n = args.get(i + 1).ok_or(usage)?;
        show = n.parse().map_err(|e| format!("--show: {e}"))?;
        args.drain(i..i + 2);
    }
    let path = args.first().ok_or(usage)?;
    let mode: Mode = args
        .get(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or_default();
    let reps: usize = args
        .get(2)
        .map(|s| s.parse().map_err(|e| format!("REPS: {e}")))
        .transpose()?
        .unwrap_or(5);
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let mut pairs = Vec::new();
    let mut expected = Vec::new();
    let key = match mode {
        Mode::Default => "default",
        Mode::Maxrl => "maxrl",
        // The intent mode is measured against the human labels.
        Mode::Intent => "label",
    };
    for (i, line) in text.lines().enumerate() {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("{path}: line {}: {e}", i + 1))?;
        let field = |k: &str| {
            v[k].as_str()
                .map(str::to_string)
                .ok_or(format!("{path}: line {}: no `{k}`", i + 1))
        };
        pairs.push((field("gold")?, field("pred")?));
        expected.push(v[key].as_bool());
    }
    let verifier = MathVerifier::new(mode);
    let start = Instant::now();
    verifier.verify("1", "1");
    let first = start.elapsed();
    let mut verdicts = Vec::new();
    let start = Instant::now();
    for _ in 0..reps {
        verdicts = pairs.iter().map(|(g, p)| verifier.verify(g, p)).collect();
    }
    let secs = start.elapsed().as_secs_f64();
    let n = pairs.len() * reps;
    let correct = verdicts.iter().filter(|v| v.correct).count();
    println!(
        "rlreplay: {n} answers in {secs:.3} s = {:.1} answers/s, {:.2} µs/answer ({correct}/{} correct; first call {:.1} ms)",
        n as f64 / secs,
        1e6 * secs / n as f64,
        pairs.len(),
        first.as_secs_f64() * 1e3,
    );
    if expected.iter().all(Option::is_some) {
        let mut bad = 0;
        for ((v, e), (g, p)) in verdicts.iter().zip(&expected).zip(&pairs) {
            if Some(v.correct) != *e {
                bad += 1;
                if bad <= show {
                    let tail: String = p
                        .chars()
                        .rev()
                        .take(160)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect();
                    println!(
                        "  math-verify={} rlreplay={} gold={g:?} pred=…{tail:?}",
                        e.unwrap_or(false),
                        v.correct
                    );
                }
            }
        }
        println!(
            "agreement with math-verify ({key}): {}/{} ({:.3}%)",
            pairs.len() - bad,
            pairs.len(),
            100.0 * (pairs.len() - bad) as f64 / pairs.len() as f64
        );
    }
    Ok(())
}
