//! Verifier throughput on a JSONL file of `{"gold", "pred"}` cases, single-threaded.
//!
//! `cargo run --release -p rlreplay-reward --example verify_throughput -- CASES.jsonl [maxrl|default] [REPS]`

use std::time::Instant;

use rlreplay_reward::{MathVerifier, Mode};

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or("usage: verify_throughput CASES.jsonl [maxrl|default] [REPS]")?;
    let mode: Mode = args
        .get(2)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or_default();
    let reps: usize = args
        .get(3)
        .map(|s| s.parse().map_err(|e| format!("REPS: {e}")))
        .transpose()?
        .unwrap_or(5);
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let mut pairs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("{path}: line {}: {e}", i + 1))?;
        let field = |k: &str| {
            v[k].as_str()
                .map(str::to_string)
                .ok_or(format!("{path}: line {}: no `{k}`", i + 1))
        };
        pairs.push((field("gold")?, field("pred")?));
    }
    let verifier = MathVerifier::new(mode);
    let mut correct = 0;
    let start = Instant::now();
    for _ in 0..reps {
        correct = pairs
            .iter()
            .filter(|(g, p)| verifier.verify(g, p).correct)
            .count();
    }
    let secs = start.elapsed().as_secs_f64();
    let n = pairs.len() * reps;
    println!(
        "rlreplay: {n} answers in {secs:.3} s = {:.1} answers/s ({correct}/{} correct)",
        n as f64 / secs,
        pairs.len()
    );
    Ok(())
}
