//! `rlreplay verify`: ordered JSONL verdicts, both modes, errors naming the bad line.

use std::io::Write;
use std::process::{Command, Stdio};

fn run(input: &str, extra: &[&str]) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cases.jsonl");
    std::fs::write(&path, input).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .arg("verify")
        .arg("--input")
        .arg(&path)
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn verdicts_in_input_order() {
    let mut input = String::new();
    let mut expected = Vec::new();
    for i in 0..200 {
        let ok = i % 3 != 0;
        let pred = if ok {
            format!("so \\boxed{{{i}}}")
        } else {
            format!("so \\boxed{{{}}}", i + 1)
        };
        input.push_str(&serde_json::json!({"gold": i.to_string(), "pred": pred}).to_string());
        input.push('\n');
        expected.push(ok);
    }
    let (ok, stdout, stderr) = run(&input, &[]);
    assert!(ok, "{stderr}");
    let got: Vec<bool> = stdout
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let verdict = v["verdict"].as_bool().unwrap();
            assert_eq!(
                v["reward"].as_f64().unwrap(),
                if verdict { 1.0 } else { 0.0 }
            );
            verdict
        })
        .collect();
    assert_eq!(got, expected);
    assert!(stderr.contains("200 answers"), "{stderr}");
}

#[test]
fn modes_differ_where_math_verify_does() {
    // The gold `\text{(C)}` only matches a boxed `C` under the MaxRL configuration.
    let line = r#"{"gold": "\\text{(C)}", "pred": "\\boxed{C}"}"#;
    let (_, maxrl, _) = run(line, &["--mode", "maxrl"]);
    let (_, default, _) = run(line, &["--mode", "default"]);
    assert!(maxrl.contains("true"), "{maxrl}");
    assert!(default.contains("false"), "{default}");
}

#[test]
fn bad_line_is_an_error_naming_it() {
    let (ok, _, stderr) = run("{\"gold\": \"1\", \"pred\": \"1\"}\n{\"gold\": 1}\n", &[]);
    assert!(!ok);
    assert!(
        stderr.contains("line 2") && stderr.contains("pred"),
        "{stderr}"
    );
    let (ok, _, stderr) = run("not json\n", &[]);
    assert!(!ok);
    assert!(stderr.contains("line 1"), "{stderr}");
}

#[test]
fn reads_standard_input() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(["verify", "--input", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"{\"gold\": \"\\\\frac{1}{2}\", \"pred\": \"The answer is 0.5\"}\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        r#"{"verdict": true, "reward": 1.0}"#
    );
}
