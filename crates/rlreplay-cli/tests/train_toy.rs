//! `rlreplay train` on the toy preset: artifacts, the rollouts as a dataset, stop and resume.

use std::path::Path;

use rlreplay_train::rundir::read_metrics;
use std::process::Command;

fn rlreplay(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(args)
        .output()
        .expect("the rlreplay binary runs")
}

fn preset() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../configs/toy-arith.toml")
        .display()
        .to_string()
}

/// A very short run of the toy preset: 4 steps, validation and checkpoints every 2.
const SHORT: [&str; 12] = [
    "--set",
    "trainer.total_training_steps=4",
    "--set",
    "trainer.save_freq=2",
    "--set",
    "validation.test_freq=2",
    "--set",
    "toy.warmup_steps=2",
    "--set",
    "batch.train_batch_size=4",
    "--set",
    "toy.val_prompts=5",
];

#[test]
fn toy_run_writes_the_artifacts_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let out_s = out.display().to_string();
    let config = preset();
    let mut args = vec![
        "train",
        "--config",
        &config,
        "--out",
        &out_s,
        "--stop-after",
        "2",
    ];
    args.extend(SHORT);
    let o = rlreplay(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out
        .join("checkpoints/global_step_2/trainer_state.json")
        .is_file());
    // A second fresh run into the same directory is refused.
    let o = rlreplay(&args);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--resume"));

    let mut resume = vec!["train", "--out", &out_s, "--resume"];
    resume.extend(SHORT);
    let o = rlreplay(&resume);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("trained 4 steps"), "{stdout}");

    for f in [
        "config.toml",
        "run.log",
        "metrics.jsonl",
        "config.json",
        "model.safetensors",
        "best_step.txt",
        "checkpoints/last/model.safetensors",
        "checkpoints/last/tokenizer.json",
        "results/validation_mean8.csv",
        "results/training_scores.csv",
        "results/hyperparameters.csv",
        "results/training_score.png",
        "results/training_score.svg",
        "rollouts/data/step-0001.parquet",
        "rollouts/data/step-0004.parquet",
    ] {
        assert!(out.join(f).is_file(), "missing {f}");
    }
    let val = std::fs::read_to_string(out.join("results/validation_mean8.csv")).unwrap();
    let lines: Vec<&str> = val.lines().collect();
    assert_eq!(lines[0], "step,val_mean8,percent");
    let steps: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split(',').next().unwrap())
        .collect();
    assert_eq!(steps, ["0", "2", "4"], "{val}");
    let hp = std::fs::read_to_string(out.join("results/hyperparameters.csv")).unwrap();
    assert!(hp.starts_with("Section,Parameter,Value,Source\n"));
    assert!(
        hp.contains("trainer,total_training_steps,4,override"),
        "{hp}"
    );
    assert!(hp.contains("rollout,n,8,config"), "{hp}");
    assert!(hp.contains("default"), "{hp}");
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 4);

    // The rollouts form a valid dataset.
    let rollouts = out.join("rollouts").display().to_string();
    let o = rlreplay(&["validate", &rollouts]);
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn bad_configs_are_refused_with_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run").display().to_string();
    let config = preset();
    let o = rlreplay(&[
        "train",
        "--config",
        &config,
        "--out",
        &out,
        "--set",
        "rollout.bogus=1",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("bogus"));
}

#[test]
fn stop_and_resume_equals_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let config = preset();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let (a_s, b_s) = (a.display().to_string(), b.display().to_string());
    let mut straight = vec!["train", "--config", &config, "--out", &a_s];
    straight.extend(SHORT);
    assert!(rlreplay(&straight).status.success());
    let mut first = vec![
        "train",
        "--config",
        &config,
        "--out",
        &b_s,
        "--stop-after",
        "1",
    ];
    first.extend(SHORT);
    assert!(rlreplay(&first).status.success());
    let mut rest = vec!["train", "--out", &b_s, "--resume"];
    rest.extend(SHORT);
    let o = rlreplay(&rest);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        read_metrics(&a, false).unwrap(),
        read_metrics(&b, false).unwrap()
    );
    let weights =
        |run: &Path| std::fs::read(run.join("checkpoints/last/model.safetensors")).unwrap();
    assert!(
        weights(&a) == weights(&b),
        "final weights differ after a resume"
    );
}

#[test]
fn kill_minus_nine_then_resume_finishes_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let out_s = out.display().to_string();
    let config = preset();
    let mut args = vec!["train", "--config", &config, "--out", &out_s];
    args.extend(SHORT);
    args.extend(["--set", "trainer.total_training_steps=8"]);
    for delay_ms in [300u64, 900] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rlreplay"))
            .args(&args)
            .args(if delay_ms > 300 {
                &["--resume"][..]
            } else {
                &[][..]
            })
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        let _ = child.kill(); // SIGKILL
        child.wait().unwrap();
    }
    let mut resume = args.clone();
    resume.push("--resume");
    let o = rlreplay(&resume);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("trained 8 steps"));
    let steps: Vec<u64> = read_metrics(&out, false)
        .unwrap()
        .iter()
        .map(|v| v["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, (1..=8).collect::<Vec<_>>());
}

/// `total_training_steps = 0` (and `--stop-after 0`) is refused before the run directory is
/// created, instead of exiting 0 and printing paths that do not exist.
#[test]
fn zero_steps_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = run.display().to_string();
    let config = preset();
    let o = rlreplay(&[
        "train",
        "--config",
        &config,
        "--out",
        &out,
        "--set",
        "trainer.total_training_steps=0",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("total_training_steps = 0: must be at least 1"),
        "{err}"
    );
    let o = rlreplay(&[
        "train",
        "--config",
        &config,
        "--out",
        &out,
        "--stop-after",
        "0",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--stop-after"));
    assert!(!run.exists());
}
