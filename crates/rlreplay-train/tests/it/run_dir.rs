//! The run directory of `rlreplay train` obeys the same rules as replay's: a fresh start never
//! overwrites an earlier run, and `--resume` refuses a changed configuration.

use rlreplay_data::error::chain;
use std::path::Path;

use rlreplay_train::{run, RunOptions};
use rlreplay_train::{Config, SourceKind};

/// A two-step toy run that takes a second or two.
fn tiny(overrides: &[&str]) -> Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/toy-arith.toml");
    let mut all = vec![
        "trainer.total_training_steps=2",
        "trainer.save_freq=1",
        "validation.test_freq=0",
        "validation.val_before_train=false",
        "toy.warmup_steps=0",
        "batch.train_batch_size=4",
        "rollout.n=2",
    ];
    all.extend_from_slice(overrides);
    let all: Vec<String> = all.iter().map(|s| s.to_string()).collect();
    Config::load(&path, &all, SourceKind::Online).unwrap().0
}

fn options(config: Config, out: &Path, resume: bool, stop_after: Option<u64>) -> RunOptions {
    RunOptions {
        config,
        provenance: Default::default(),
        out: out.to_path_buf(),
        resume,
        stop_after,
        progress: false,
    }
}

/// Guards that a fresh start into a directory holding an earlier run without a checkpoint is
/// refused, its `metrics.jsonl` intact (the guard used to look at the checkpoint pointer only).
#[test]
fn fresh_start_never_truncates_an_earlier_runs_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path();
    let earlier = "{\"step\":1,\"critic/score/mean\":0.5}\n";
    std::fs::write(out.join("metrics.jsonl"), earlier).unwrap();
    let e = run(&options(tiny(&[]), out, false, None)).unwrap_err();
    assert!(chain(&e).contains("already holds a run"), "{e:?}");
    assert_eq!(
        std::fs::read_to_string(out.join("metrics.jsonl")).unwrap(),
        earlier
    );
}

/// Guards that `--resume` checks the configuration is unchanged (only replay did).
#[test]
fn resume_refuses_a_changed_configuration() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    run(&options(tiny(&[]), &out, false, Some(1))).unwrap();
    let e = run(&options(tiny(&["optim.lr=1e-3"]), &out, true, None)).unwrap_err();
    assert!(chain(&e).contains("configuration differs"), "{e:?}");
    // What may change does not stop it.
    let s = run(&options(tiny(&["trainer.keep=2"]), &out, true, None)).unwrap();
    assert_eq!(s.global_step, 2);
}
