//! `rlreplay logprobs` on the tiny transformers-generated checkpoint against its golden values.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../rlreplay-model/tests/fixtures")
}

fn golden() -> serde_json::Value {
    let text = std::fs::read_to_string(fixtures().join("tiny_tied.golden.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Writes the golden pairs as the JSONL input (with a blank line, which is skipped).
fn write_input(dir: &Path) -> PathBuf {
    let g = golden();
    let mut text = String::new();
    for p in g["pairs"].as_array().unwrap() {
        let line = serde_json::json!({
            "prompt_token_ids": p["prompt"], "response_token_ids": p["response"], "uid": "ignored"
        });
        text.push_str(&format!("{line}\n\n"));
    }
    let path = dir.join("in.jsonl");
    std::fs::write(&path, text).unwrap();
    path
}

fn rlreplay(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .arg("logprobs")
        .args(args)
        .output()
        .unwrap()
}

fn assert_close(got: &serde_json::Value, want: &serde_json::Value, tol: f64) {
    let (got, want) = (got.as_array().unwrap(), want.as_array().unwrap());
    assert_eq!(got.len(), want.len());
    for (a, b) in got.iter().zip(want) {
        let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
        assert!((a - b).abs() < tol, "{a} vs {b}");
    }
}

#[test]
fn logprobs_and_entropy_match_golden_in_micro_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let input = write_input(tmp.path());
    let output = tmp.path().join("out.jsonl");
    let model = fixtures().join("tiny_tied");
    let g = golden();
    for max_tokens in ["5", "100000"] {
        let res = rlreplay(&[
            "--model",
            model.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
            "--temperature",
            &g["temperature"].to_string(),
            "--entropy",
            "--max-batch-tokens",
            max_tokens,
        ]);
        assert!(
            res.status.success(),
            "{}",
            String::from_utf8_lossy(&res.stderr)
        );
        let text = std::fs::read_to_string(&output).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), g["pairs"].as_array().unwrap().len());
        for (i, line) in lines.iter().enumerate() {
            assert_close(&line["logprobs"], &g["logprobs"][i], 1e-4);
            assert_close(&line["entropy"], &g["entropy"][i], 1e-4);
        }
    }
    // f64 to standard output, without entropy.
    let res = rlreplay(&[
        "--model",
        model.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--dtype",
        "f64",
    ]);
    assert!(
        res.status.success(),
        "{}",
        String::from_utf8_lossy(&res.stderr)
    );
    let first: serde_json::Value = serde_json::from_str(
        String::from_utf8(res.stdout)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert!(first.get("entropy").is_none());
    assert_eq!(g["temperature"], 1.0);
    assert_close(&first["logprobs"], &g["logprobs"][0], 1e-9);
}

#[test]
fn bad_lines_are_reported_with_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixtures().join("tiny_tied");
    let cases = [
        (
            "{\"prompt_token_ids\": [1], \"response_token_ids\": [2]}\n{\"prompt_token_ids\": [1], \"response_token_ids\": [5000]}\n",
            "line 2: response_token_ids[0] = 5000 is outside the vocabulary",
        ),
        ("{\"prompt_token_ids\": [1]}\n", "line 1"),
        ("{\"prompt_token_ids\": [], \"response_token_ids\": [3]}\n", "prompt_token_ids is empty"),
    ];
    for (text, needle) in cases {
        let input = tmp.path().join("bad.jsonl");
        std::fs::write(&input, text).unwrap();
        let res = rlreplay(&[
            "--model",
            model.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
        ]);
        assert_eq!(res.status.code(), Some(2));
        let err = String::from_utf8_lossy(&res.stderr);
        assert!(err.contains("bad.jsonl") && err.contains(needle), "{err}");
    }
    let res = rlreplay(&["--model", "/nonexistent", "--input", "x.jsonl"]);
    assert_eq!(res.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&res.stderr).contains("config.json"));
}
