//! On the toy task, online RL raises validation mean@k for a fixed seed.

use std::path::Path;

use rlreplay_train::{run, RunOptions};
use rlreplay_train::{Config, SourceKind};

fn toy_config(overrides: &[&str]) -> Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/toy-arith.toml");
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    Config::load(&path, &overrides, SourceKind::Online)
        .unwrap()
        .0
}

fn train(cfg: Config, out: &Path) -> rlreplay_train::RunSummary {
    run(&RunOptions {
        config: cfg,
        provenance: Default::default(),
        out: out.to_path_buf(),
        resume: false,
        stop_after: None,
        progress: false,
    })
    .unwrap()
}

#[test]
fn validation_mean_rises_on_the_toy_task() {
    let dir = tempfile::tempdir().unwrap();
    let t0 = std::time::Instant::now();
    let cfg = toy_config(&[
        "trainer.total_training_steps=20",
        "validation.test_freq=10",
        "trainer.save_freq=0",
    ]);
    let s = train(cfg, dir.path());
    eprintln!("{:?} in {:.1}s", s.validations, t0.elapsed().as_secs_f64());
    let steps: Vec<u64> = s.validations.iter().map(|v| v.0).collect();
    assert_eq!(steps, [0, 10, 20]);
    let (first, last) = (s.validations[0].1, s.validations[2].1);
    assert!(last >= first + 0.1, "{:?}", s.validations);
    assert_eq!(s.best.unwrap().0, 20);
}

#[test]
fn rlsd_tr_runs_on_the_toy_task() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = toy_config(&[
        "trainer.total_training_steps=2",
        "validation.test_freq=0",
        "validation.val_before_train=false",
        "algorithm.loss_mode=\"rlsd\"",
        "algorithm.rollout_is=\"token\"",
        "self_distillation.teacher_update_rate=0.1",
    ]);
    let s = train(cfg, dir.path());
    let m = &s.last_metrics;
    for key in [
        "self_distillation/reprompt_sample_fraction",
        "self_distillation/token_reweight_active_token_fraction",
        "self_distillation/token_reweight_w_mean",
        "rollout_corr/kl",
    ] {
        assert!(
            m.get(key).is_some_and(|v| v.is_finite()),
            "{key} missing: {m:?}"
        );
    }
    assert!(m["self_distillation/reprompt_sample_fraction"] > 0.0);
    // EMA teacher: the teacher is saved with the checkpoint.
    let dir = tempfile::tempdir().unwrap();
    let cfg = toy_config(&[
        "trainer.total_training_steps=1",
        "validation.test_freq=0",
        "validation.val_before_train=false",
        "algorithm.loss_mode=\"rlsd\"",
        "self_distillation.teacher_regularization=\"ema\"",
        "self_distillation.context=\"reference\"",
    ]);
    train(cfg, dir.path());
    assert!(dir
        .path()
        .join("checkpoints/global_step_1/ema_teacher/model.safetensors")
        .is_file());
}

/// The full toy preset (30 steps, about a minute in a release build):
/// `cargo test --release -p rlreplay-train --test it -- toy_learns:: --ignored --nocapture`.
#[test]
#[ignore]
fn toy_preset_demo() {
    let dir = tempfile::tempdir().unwrap();
    let t0 = std::time::Instant::now();
    let s = train(toy_config(&[]), dir.path());
    eprintln!("{:?} in {:.1}s", s.validations, t0.elapsed().as_secs_f64());
    eprintln!(
        "{}",
        std::fs::read_to_string(dir.path().join("run.log")).unwrap()
    );
    assert!(
        s.best.unwrap().1 >= s.validations[0].1 + 0.2,
        "{:?}",
        s.validations
    );
}

#[test]
fn truncated_rollouts_take_the_configured_score() {
    // One response token: every rollout that does not stop at once is truncated.
    let dir = tempfile::tempdir().unwrap();
    let cfg = toy_config(&[
        "trainer.total_training_steps=1",
        "validation.test_freq=0",
        "validation.val_before_train=false",
        "rollout.max_response_length=1",
        "reward.truncated_score=-0.5",
    ]);
    let s = train(cfg, dir.path());
    let m = &s.last_metrics;
    assert_eq!(m["critic/score/min"], -0.5, "{m:?}");
    assert!(m["critic/score/max"] <= 1.0, "{m:?}");

    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/toy-arith.toml");
    let e = Config::load(
        &path,
        &["reward.truncated_score=nan".to_string()],
        SourceKind::Online,
    )
    .unwrap_err();
    // The message is the cause under "in config FILE".
    assert!(
        format!("{e:?}").contains("[reward] truncated_score = NaN: must be a finite number"),
        "{e:?}"
    );
}
