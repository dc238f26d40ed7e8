//! `rlreplay compute` on JSON batches.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/compute")
        .join(name)
}

/// Runs `rlreplay compute --input FILE`: exit code, stdout, stderr.
fn compute(name: &str) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(["compute", "--input"])
        .arg(data(name))
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn close(v: &Value, want: f64) -> bool {
    (v.as_f64().unwrap() - want).abs() < 1e-5
}

#[test]
fn example_batch() {
    let (code, out, err) = compute("example.json");
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    // A single rollout is a singleton group: advantage 0, counted.
    assert_eq!(v["advantages"], serde_json::json!([0.0]));
    assert_eq!(v["token_advantages"], serde_json::json!([[0.0, 0.0]]));
    assert_eq!(v["is_weights"], Value::Null);
    assert!(close(&v["loss"], 0.0));
    assert_eq!(v["grad_logprobs"][0].as_array().unwrap().len(), 2);
    let m = &v["metrics"];
    assert!(close(&m["advantage/singleton_groups"], 1.0));
    assert!(close(&m["critic/score/mean"], 1.0));
    // Off-policy diagnostics are logged even without a correction: kl = mean(ℓ_roll − ℓ_old).
    assert!(close(&m["rollout_corr/kl"], (-0.1 + 0.1) / 2.0));
    assert!(m.get("actor/pg_clipfrac").is_some());
}

#[test]
fn rlsd_tr_batch() {
    let (code, out, err) = compute("rlsd_tr.json");
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let adv: Vec<f64> = v["advantages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(adv, vec![0.75, -0.25, -0.25, -0.25]);
    let w = &v["is_weights"];
    assert!(close(&w[0][0], 1.0) && close(&w[1][0], 2.0) && close(&w[2][0], 0.5));
    assert!(close(&v["loss"], -0.054167), "{}", v["loss"]);
    let g = &v["grad_logprobs"];
    assert!(close(&g[0][0], -0.25) && close(&g[1][0], 0.15) && close(&g[2][0], 0.045833));
    assert_eq!(g[3], serde_json::json!([]));
    assert!(close(
        &v["metrics"]["self_distillation/token_reweight_active_token_fraction"],
        2.0 / 3.0
    ));
}

#[test]
fn bad_json_names_line_and_column() {
    let (code, _, err) = compute("bad_json.json");
    assert_eq!(code, 2);
    assert!(
        err.contains("bad_json.json") && err.contains("line 2"),
        "{err}"
    );
}

#[test]
fn unknown_config_key_is_named() {
    let (code, _, err) = compute("unknown_key.json");
    assert_eq!(code, 2);
    assert!(err.contains("clip_ratio_lo"), "{err}");
}

#[test]
fn unknown_estimator_lists_valid_names() {
    let (code, _, err) = compute("unknown_estimator.json");
    assert_eq!(code, 2);
    assert!(err.contains("gpro") && err.contains("maxrl"), "{err}");
}

#[test]
fn nan_and_overflow_are_rejected() {
    for name in ["nan.json", "huge.json"] {
        let (code, _, err) = compute(name);
        assert_eq!(code, 2, "{name}");
        assert!(err.contains(name) && err.contains("line"), "{err}");
    }
}

#[test]
fn out_of_range_value_names_the_key() {
    let (code, _, err) = compute("bad_value.json");
    assert_eq!(code, 2);
    assert!(err.contains("clip_ratio_c"), "{err}");
}

#[test]
fn overflowing_scores_are_an_error() {
    // ±1e308 once gave zero advantages without a word.
    let (code, out, err) = compute("huge_scores.json");
    assert_eq!(code, 2, "{out}");
    assert!(
        err.contains("huge_scores.json")
            && err.contains("standard deviation of group `g`'s scores is inf")
            && err.contains("rescale the rewards"),
        "{err}"
    );
}
