//! The RLSD_TR biology preset, with only the model, the data files and the run length replaced by
//! `--set` overrides, runs one step end to end on a tiny random Qwen3.

use std::path::Path;

use rlreplay_model::{DType, Device, Model};
use rlreplay_train::toy;
use rlreplay_train::{run, RunOptions};
use rlreplay_train::{Config, SourceKind};

#[test]
fn biology_preset_runs_one_step_with_a_tiny_model() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    Model::new_random(
        toy::model_config(&toy::default_model()).unwrap(),
        3,
        DType::F32,
        &Device::Cpu,
    )
    .unwrap()
    .save_hf(&model)
    .unwrap();
    toy::write_tokenizer(&model).unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    let rows: Vec<String> = ["A", "B", "C", "D"]
        .iter()
        .enumerate()
        .map(|(i, gold)| {
            format!(
                r#"{{"data_source": "biology", "prompt": "Q{i}: A) x B) y C) z D) w. Answer in \\boxed{{}}.", "ground_truth": "{gold}"}}"#
            )
        })
        .collect();
    std::fs::write(&prompts, rows.join("\n")).unwrap();
    let preset = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/rlsd-tr-biology.toml");
    let sets: Vec<String> = [
        format!("model.path={}", model.display()),
        "model.dtype=\"f32\"".into(),
        format!("data.train_files={}", prompts.display()),
        format!("data.val_files={}", prompts.display()),
        "batch.train_batch_size=2".into(),
        "batch.ppo_mini_batch_size=1".into(),
        "rollout.n=4".into(),
        "rollout.max_response_length=6".into(),
        "validation.test_freq=0".into(),
        "trainer.total_training_steps=1".into(),
        "trainer.threads=2".into(),
    ]
    .to_vec();
    let config = Config::load(&preset, &sets, SourceKind::Online).unwrap().0;
    let out = tmp.path().join("run");
    let s = run(&RunOptions {
        config,
        provenance: Default::default(),
        out: out.clone(),
        resume: false,
        stop_after: None,
        progress: false,
    })
    .unwrap();
    assert_eq!(s.global_step, 1);
    let m = &s.last_metrics;
    for key in [
        "self_distillation/reprompt_sample_fraction",
        "self_distillation/token_reweight_lambda",
        "rollout_corr/rollout_is_mean",
        "actor/grad_norm",
    ] {
        assert!(m.get(key).is_some_and(|v| v.is_finite()), "{key}: {m:?}");
    }
    assert_eq!(m["train/skipped_updates"], 0.0);
    assert!(out
        .join("checkpoints/global_step_1/model.safetensors")
        .is_file());
}
