//! End-to-end check against a PyTorch float64 reference (`scripts/golden_replay.py`): two trainer
//! steps of MaxRL + REINFORCE (token-mean) with AdamW and gradient clipping on a tiny Qwen3 give
//! the reference's losses, gradient norms and weights.

use std::path::{Path, PathBuf};

use rlreplay_data::{write_shard, RolloutBatch};
use rlreplay_model::{DType, Device, Model};
use rlreplay_train::{run, Config, RunOptions, SourceKind};
use serde::Deserialize;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/golden")
}

#[derive(Deserialize)]
struct Row {
    uid: String,
    prompt: Vec<u32>,
    response: Vec<u32>,
    rollout_log_probs: Vec<f32>,
    score: f32,
}

#[derive(Deserialize)]
struct Rollouts {
    eos: u32,
    steps: std::collections::BTreeMap<String, Vec<Row>>,
}

#[derive(Deserialize)]
struct StepExpect {
    pg_loss: f64,
    grad_norm: f64,
}

#[derive(Deserialize)]
struct Expected {
    lr: f64,
    weight_decay: f64,
    grad_clip: f64,
    steps: Vec<StepExpect>,
}

fn replay(dtype: &str) -> (tempfile::TempDir, Vec<serde_json::Value>, Model) {
    let tmp = tempfile::tempdir().unwrap();
    let rollouts: Rollouts =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("rollouts.json")).unwrap())
            .unwrap();
    let expected: Expected =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected.json")).unwrap())
            .unwrap();
    let data = tmp.path().join("data");
    for (step, rows) in &rollouts.steps {
        let mut b = RolloutBatch::empty(step.parse().unwrap());
        for r in rows {
            b.push_row(
                &r.uid,
                &r.prompt,
                &r.response,
                &r.rollout_log_probs,
                r.score,
                None,
                None,
                None,
                None,
            );
        }
        write_shard(&data, &b).unwrap();
    }
    let text = format!(
        r#"
[model]
path = "{model}"
dtype = "{dtype}"
[data]
path = "{data}"
eos_token_id = {eos}
[algorithm]
adv_estimator = "maxrl"
loss_mode = "reinforce"
loss_agg_mode = "token-mean"
[optim]
lr = {lr}
weight_decay = {wd}
grad_clip = {clip}
"#,
        model = fixtures().join("model").display(),
        data = data.display(),
        eos = rollouts.eos,
        lr = expected.lr,
        wd = expected.weight_decay,
        clip = expected.grad_clip,
    );
    let out = tmp.path().join("run");
    let cfg = Config::parse(&text, &[], SourceKind::Logged).unwrap();
    run(&RunOptions::new(cfg, &out)).unwrap();
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let model = Model::load(
        out.join("checkpoints/global_step_2"),
        DType::F64,
        &Device::Cpu,
    )
    .unwrap();
    (tmp, metrics, model)
}

fn check(dtype: &str, loss_tol: f64, weight_tol: f64) {
    let expected: Expected =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected.json")).unwrap())
            .unwrap();
    let (_tmp, metrics, model) = replay(dtype);
    for (m, e) in metrics.iter().zip(&expected.steps) {
        let loss = m["actor/pg_loss"].as_f64().unwrap();
        let gn = m["actor/grad_norm"].as_f64().unwrap();
        assert!(
            (loss - e.pg_loss).abs() <= loss_tol * e.pg_loss.abs().max(1.0),
            "{dtype} loss {loss} vs {}",
            e.pg_loss
        );
        assert!(
            (gn - e.grad_norm).abs() <= loss_tol * e.grad_norm,
            "{dtype} grad norm {gn} vs {}",
            e.grad_norm
        );
    }
    let golden =
        candle_core::safetensors::load(fixtures().join("expected.safetensors"), &Device::Cpu)
            .unwrap();
    let mut worst = (0.0f64, String::new());
    for p in model.params() {
        let want = golden[&p.name]
            .to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let got = p
            .var
            .as_tensor()
            .to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        for (a, b) in got.iter().zip(&want) {
            let d = (a - b).abs();
            if d > worst.0 {
                worst = (d, p.name.clone());
            }
        }
    }
    assert!(
        worst.0 <= weight_tol,
        "{dtype}: largest weight difference {} in {}",
        worst.0,
        worst.1
    );
}

#[test]
fn two_steps_match_pytorch_in_f64() {
    check("f64", 1e-9, 1e-9);
}

#[test]
fn two_steps_match_pytorch_in_f32() {
    check("f32", 1e-4, 2e-5);
}
