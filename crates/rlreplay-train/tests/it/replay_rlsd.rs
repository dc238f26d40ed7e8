//! `loss_mode = "rlsd"` in replay: a logged toy dataset (chat-rendered prompts, `\boxed{}`
//! answers, `ground_truth`) replayed with the trust-region and the EMA teacher; determinism,
//! resume, the `self_distillation/*` metrics, and clear errors for what a context mode lacks.

use rlreplay_data::error::chain;
use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rlreplay_data::{write_shard, RolloutBatch};
use rlreplay_model::{DType, Device, Model};
use rlreplay_sampling::chat::{ChatOptions, ChatTokenizer, Message};
use rlreplay_train::rundir::{latest_checkpoint, read_metrics};
use rlreplay_train::toy;
use rlreplay_train::{run, Config, RunOptions, SourceKind};

/// A tiny random Qwen3 over the toy vocabulary with the toy tokenizer files.
pub(crate) fn model_dir(dir: &Path) -> PathBuf {
    let out = dir.join("model");
    let model = Model::new_random(
        toy::model_config(&toy::default_model()).unwrap(),
        5,
        DType::F32,
        &Device::Cpu,
    )
    .expect("random model");
    model.save_hf(&out).unwrap();
    toy::write_tokenizer(&out).unwrap();
    out
}

/// `steps` shards of 4 prompts × 4 rollouts: `\boxed{answer}` (score 1) or a wrong answer.
pub(crate) fn dataset(dir: &Path, model: &Path, steps: i64, ground_truth: bool) -> PathBuf {
    let chat = ChatTokenizer::from_dir(model).unwrap();
    let end = toy::token_id(toy::IM_END).unwrap();
    let out = dir.join(if ground_truth { "data" } else { "data-no-gt" });
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for step in 1..=steps {
        let mut b = RolloutBatch::empty(step);
        for p in 0..4 {
            let (x, y) = (rng.random_range(0..5), rng.random_range(0..5));
            let msgs = [Message::user(format!("{x}+{y}=?"))];
            let prompt = chat.encode(&msgs, ChatOptions::default()).unwrap();
            let answer = (x + y).to_string();
            for r in 0..4 {
                let right = (p + r + step as usize).is_multiple_of(3);
                let text = if right {
                    format!("<think>ok</think>\\boxed{{{answer}}}")
                } else {
                    format!("\\boxed{{{}}}", x + y + 1)
                };
                let mut resp = chat.encode_text(&text).unwrap();
                resp.push(end);
                let lps: Vec<f32> = resp
                    .iter()
                    .map(|_| -rng.random_range(0.05f32..3.0))
                    .collect();
                b.push_row(
                    &format!("{step}-{p}"),
                    &prompt,
                    &resp,
                    &lps,
                    f32::from(u8::from(right)),
                    Some("toy"),
                    ground_truth.then_some(answer.as_str()),
                    Some(1.0),
                    Some(1.0),
                );
            }
        }
        write_shard(&out, &b).unwrap();
    }
    out
}

pub(crate) fn config(model: &Path, data: &Path, extra: &[&str]) -> Config {
    let text = format!(
        r#"
[model]
path = "{}"

[data]
path = "{}"
eos_token_id = {}

[algorithm]
adv_estimator = "grpo"
norm_adv_by_std_in_grpo = false
loss_mode = "rlsd"
rollout_is = "token"
rollout_is_threshold = 2.0

[self_distillation]
teacher_update_rate = 0.1

[optim]
lr = 1e-3

[batch]
ppo_mini_batch_size = 2
max_tokens_per_micro_batch = 256
"#,
        model.display(),
        data.display(),
        toy::token_id(toy::IM_END).unwrap()
    );
    let sets: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    Config::parse(&text, &sets, SourceKind::Logged).unwrap()
}

fn weights(run: &Path) -> Vec<u8> {
    let (_, dir) = latest_checkpoint(run).unwrap().unwrap();
    std::fs::read(dir.join("model.safetensors")).unwrap()
}

#[test]
fn rlsd_replay_is_deterministic_and_logs_self_distillation() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_dir(tmp.path());
    let data = dataset(tmp.path(), &model, 2, true);
    let cfg = config(&model, &data, &[]);
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let s = run(&RunOptions::new(cfg.clone(), &a)).unwrap();
    assert_eq!(s.skipped_updates, 0);
    run(&RunOptions::new(cfg, &b)).unwrap();
    let m = read_metrics(&a, false).unwrap();
    assert_eq!(m.len(), 2);
    assert_eq!(m, read_metrics(&b, false).unwrap());
    assert_eq!(weights(&a), weights(&b));
    for key in [
        "self_distillation/reprompt_sample_fraction",
        "self_distillation/success_group_fraction",
        "self_distillation/teacher_prompt_dropped",
        "self_distillation/token_reweight_active_token_fraction",
        "self_distillation/token_reweight_w_mean",
        "self_distillation/token_reweight_w_clip_frac",
        "rollout_corr/rollout_is_mean",
        "actor/pg_clipfrac",
    ] {
        assert!(m[0][key].is_number(), "{key} missing: {}", m[0]);
    }
    assert!(m[0]["self_distillation/reprompt_sample_fraction"].as_f64() > Some(0.0));
    assert!(m[0]["self_distillation/token_reweight_active_token_fraction"].as_f64() > Some(0.0));
    // The teacher reweights: not every clipped weight is 1.
    assert_ne!(m[0]["self_distillation/token_reweight_w_mean"], 1.0);
}

#[test]
fn rlsd_replay_with_the_ema_teacher_resumes_bit_identically() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_dir(tmp.path());
    let data = dataset(tmp.path(), &model, 3, true);
    let cfg = config(
        &model,
        &data,
        &[
            "self_distillation.teacher_regularization=\"ema\"",
            "self_distillation.context=\"reference\"",
            "checkpoint.save_freq=1",
        ],
    );
    let full = tmp.path().join("full");
    run(&RunOptions::new(cfg.clone(), &full)).unwrap();
    assert!(full
        .join("checkpoints/global_step_3/ema_teacher/model.safetensors")
        .is_file());
    let part = tmp.path().join("part");
    assert_eq!(crate::replay::stop_then_resume(cfg, &part, 1), 3);
    assert_eq!(
        read_metrics(&full, false).unwrap(),
        read_metrics(&part, false).unwrap()
    );
    assert_eq!(weights(&full), weights(&part));
    let ema = |r: &Path| {
        std::fs::read(r.join("checkpoints/global_step_3/ema_teacher/model.safetensors")).unwrap()
    };
    assert_eq!(ema(&full), ema(&part));
    // Reference mode: every row has its teacher context.
    assert_eq!(
        read_metrics(&full, false).unwrap()[0]["self_distillation/reprompt_sample_fraction"],
        1.0
    );
}

#[test]
fn what_a_context_mode_lacks_is_a_clear_error_at_startup() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_dir(tmp.path());
    let data = dataset(tmp.path(), &model, 1, false);
    // Sibling mode needs no ground truth.
    run(&RunOptions::new(
        config(&model, &data, &[]),
        &tmp.path().join("sib"),
    ))
    .unwrap();
    let e = run(&RunOptions::new(
        config(&model, &data, &["self_distillation.context=\"reference\""]),
        &tmp.path().join("ref"),
    ))
    .unwrap_err();
    let msg = chain(&e);
    assert!(
        msg.contains("`ground_truth` column") && msg.contains("step-"),
        "{msg}"
    );
    assert!(!tmp.path().join("ref/metrics.jsonl").exists());
    let e = run(&RunOptions::new(
        config(
            &model,
            &data,
            &[
                "self_distillation.context=\"sibling+feedback\"",
                "self_distillation.correctness_feedback=true",
            ],
        ),
        &tmp.path().join("fb"),
    ))
    .unwrap_err();
    assert!(chain(&e).contains("ground_truth"), "{e:?}");
    // No tokenizer in the model directory.
    std::fs::remove_file(model.join("tokenizer.json")).unwrap();
    let e = run(&RunOptions::new(
        config(&model, &data, &[]),
        &tmp.path().join("tok"),
    ))
    .unwrap_err();
    assert!(chain(&e).contains("tokenizer.json"), "{e:?}");
    // A random model has no tokenizer at all.
    let e = Config::parse(
        &format!(
            "[model.random]\nseed = 1\n[data]\npath = \"{}\"\n[algorithm]\nloss_mode = \"rlsd\"\n",
            data.display()
        ),
        &[],
        SourceKind::Logged,
    )
    .unwrap_err();
    assert!(chain(&e).contains("[model] path"), "{e:?}");
}
