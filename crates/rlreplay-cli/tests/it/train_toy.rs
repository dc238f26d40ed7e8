//! `rlreplay train` on the toy preset: artifacts, the rollouts as a dataset, stop and resume.

use std::path::{Path, PathBuf};
use std::process::Output;

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

    // The rollouts form a valid dataset that names the run's stop ids.
    let rollouts = out.join("rollouts").display().to_string();
    let o = rlreplay(&["validate", &rollouts]);
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("(from the dataset; written by "),
        "{}",
        String::from_utf8_lossy(&o.stdout)
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

/// The files of a card directory, relative to it, sorted.
fn card_files(dir: &Path) -> Vec<String> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
            if entry.file_type().unwrap().is_dir() {
                walk(&entry.path(), &format!("{name}/"), out);
            } else {
                out.push(name);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, "", &mut out);
    out.sort();
    out
}

/// The YAML front matter of a model card: the text between the two `---` lines.
fn front_matter(readme: &str) -> &str {
    let body = readme.strip_prefix("---\n").expect("front matter opens");
    &body[..body.find("\n---\n").expect("front matter closes")]
}

/// `rlreplay export` of a two-step toy run: the card's layout, loadable policies, the
/// model-index, the checkpoint choices, and the refusals (existing card, missing pieces), none
/// of which leaves anything behind.
#[test]
fn export_writes_the_model_card_layout() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let run_s = run.display().to_string();
    let config = preset();
    let mut args = vec!["train", "--config", &config, "--out", &run_s];
    args.extend([
        "--set",
        "trainer.total_training_steps=2",
        "--set",
        "trainer.save_freq=1",
        "--set",
        "trainer.keep=0",
        "--set",
        "validation.test_freq=1",
        "--set",
        "toy.warmup_steps=2",
        "--set",
        "batch.train_batch_size=4",
        "--set",
        "toy.val_prompts=5",
    ]);
    let o = rlreplay(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let card = dir.path().join("Qwen3-toy-GRPO");
    let card_s = card.display().to_string();
    let o = rlreplay(&["export", &run_s, "--out", &card_s, "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["root"], "best");
    assert_eq!(report["last_step"], 2);
    assert!(report["note"].is_null());

    let files = card_files(&card);
    for f in [
        "README.md",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "checkpoints/last/config.json",
        "checkpoints/last/model.safetensors",
        "checkpoints/last/tokenizer.json",
        "results/validation_mean8.csv",
        "results/training_scores.csv",
        "results/hyperparameters.csv",
        "results/export_note.csv",
        "results/training_score.png",
        "results/training_score.svg",
        "artifacts/config.toml",
        "artifacts/metrics.jsonl",
        "artifacts/run.log",
        "artifacts/trainer_state.json",
        "artifacts/best_step.txt",
        "artifacts/latest_checkpointed_iteration.txt",
    ] {
        assert!(files.iter().any(|x| x == f), "missing {f} in {files:?}");
    }
    // Neither optimizer nor trainer state among the policies, no temporary directory left.
    assert!(!files.iter().any(|f| f.contains("optimizer")), "{files:?}");
    assert!(!card.join("checkpoints/last/trainer_state.json").exists());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    for f in [
        "results/validation_mean8.csv",
        "results/hyperparameters.csv",
    ] {
        assert_eq!(
            std::fs::read(card.join(f)).unwrap(),
            std::fs::read(run.join(f)).unwrap(),
            "{f}"
        );
    }

    // Both policies load.
    let cpu = candle_core::Device::Cpu;
    for d in [card.clone(), card.join("checkpoints/last")] {
        rlreplay_model::Model::load(&d, candle_core::DType::F32, &cpu)
            .unwrap_or_else(|e| panic!("{}: {e}", d.display()));
    }
    // The root holds the best policy (the run root's), the last one the final checkpoint's.
    let best: Vec<String> = std::fs::read_to_string(run.join("best_step.txt"))
        .unwrap()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert_eq!(report["root_step"].as_u64().unwrap().to_string(), best[0]);
    assert_eq!(
        std::fs::read(card.join("model.safetensors")).unwrap(),
        std::fs::read(run.join("model.safetensors")).unwrap()
    );
    assert_eq!(
        std::fs::read(card.join("checkpoints/last/model.safetensors")).unwrap(),
        std::fs::read(run.join("checkpoints/global_step_2/model.safetensors")).unwrap()
    );

    // The model-index holds the best validation, as the CSV writes it.
    let val = std::fs::read_to_string(card.join("results/validation_mean8.csv")).unwrap();
    let best_row: Vec<&str> = val
        .lines()
        .find(|l| l.split(',').next() == Some(best[0].as_str()))
        .unwrap()
        .split(',')
        .collect();
    let readme = std::fs::read_to_string(card.join("README.md")).unwrap();
    let front = front_matter(&readme);
    for key in [
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags:",
        "model-index:",
        "- name: \"Qwen3-toy-GRPO\"",
        "type: \"mean@8\"",
        "name: \"toy\"",
    ] {
        assert!(front.contains(key), "{key} not in\n{front}");
    }
    let value = front
        .lines()
        .find_map(|l| l.trim().strip_prefix("value: "))
        .unwrap();
    assert_eq!(value, best_row[1], "{front}");
    assert_eq!(
        value.parse::<f64>().unwrap(),
        best[1].parse::<f64>().unwrap()
    );
    for section in [
        "# Qwen3-toy-GRPO",
        "## Performance",
        "## Validation Mean@8",
        "## Training Recipe",
        "## Detailed Training Hyperparameters",
        "## Raw result and artifact files",
        "## Usage",
        "## Source",
        "| Section | Parameter | Value | Source |",
        "| trainer | total_training_steps | 2 | override |",
        "- `results/export_note.csv`",
        "grpo (ppo loss)",
    ] {
        assert!(readme.contains(section), "{section} not in\n{readme}");
    }
    for row in val.lines().skip(1) {
        let c: Vec<&str> = row.split(',').collect();
        let line = format!("| {} | {} | {} |", c[0], c[1], c[2]);
        assert!(readme.contains(&line), "{line} not in\n{readme}");
    }
    let note = std::fs::read_to_string(card.join("results/export_note.csv")).unwrap();
    assert!(note.starts_with("field,value\n"), "{note}");
    for row in [
        "exported_checkpoint,best".to_string(),
        format!("best_step,{}", best[0]),
        format!("best_val_mean8,{}", best_row[1]),
        "final_step,2".to_string(),
        format!("rlreplay_version,{}", env!("CARGO_PKG_VERSION")),
    ] {
        assert!(note.lines().any(|l| l == row), "{row} not in\n{note}");
    }

    // An existing non-empty card directory is refused, and left as it was.
    let o = rlreplay(&["export", &run_s, "--out", &card_s, "--checkpoint", "last"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("not empty") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(card_files(&card), files);

    // --force replaces it; --checkpoint last puts the final policy at the root.
    let o = rlreplay(&[
        "export",
        &run_s,
        "--out",
        &card_s,
        "--checkpoint",
        "last",
        "--force",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("root policy:  last (step 2"), "{stdout}");
    assert_eq!(
        std::fs::read(card.join("model.safetensors")).unwrap(),
        std::fs::read(card.join("checkpoints/last/model.safetensors")).unwrap()
    );
    let readme = std::fs::read_to_string(card.join("README.md")).unwrap();
    assert!(readme.contains("`--checkpoint last`"), "{readme}");
    let final_row = val.lines().last().unwrap().split(',').nth(1).unwrap();
    assert!(
        front_matter(&readme).contains(&format!("value: {final_row}")),
        "{readme}"
    );

    // A checkpoint of another step, and one the run does not have.
    let other = dir.path().join("step1");
    let other_s = other.display().to_string();
    let o = rlreplay(&[
        "export",
        &run_s,
        "--out",
        &other_s,
        "--checkpoint",
        "global_step_1",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        std::fs::read(other.join("model.safetensors")).unwrap(),
        std::fs::read(run.join("checkpoints/global_step_1/model.safetensors")).unwrap()
    );
    let missing = dir.path().join("step7");
    let missing_s = missing.display().to_string();
    let o = rlreplay(&[
        "export",
        &run_s,
        "--out",
        &missing_s,
        "--checkpoint",
        "global_step_7",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("global_step_7") && err.contains("global_step_1, global_step_2"),
        "{err}"
    );
    assert!(!missing.exists());

    // A run that never validated: the root holds the last policy, and the card says so.
    std::fs::remove_file(run.join("best_step.txt")).unwrap();
    std::fs::remove_file(run.join("results/validation_mean8.csv")).unwrap();
    let plain = dir.path().join("plain");
    let plain_s = plain.display().to_string();
    let o = rlreplay(&["export", &run_s, "--out", &plain_s]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("never validated"));
    let readme = std::fs::read_to_string(plain.join("README.md")).unwrap();
    assert!(readme.contains("The run never validated"), "{readme}");
    assert!(!front_matter(&readme).contains("model-index"), "{readme}");
    assert!(!plain.join("results/validation_mean8.csv").exists());

    // Missing pieces are named, and nothing is written.
    let empty = dir.path().join("nothing");
    let empty_s = empty.display().to_string();
    std::fs::rename(
        run.join("results/hyperparameters.csv"),
        dir.path().join("hp.csv"),
    )
    .unwrap();
    let o = rlreplay(&["export", &run_s, "--out", &empty_s]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("results/hyperparameters.csv is missing"),
        "{err}"
    );
    assert!(!empty.exists());
    std::fs::remove_dir_all(run.join("checkpoints")).unwrap();
    let o = rlreplay(&["export", &run_s, "--out", &empty_s]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no complete checkpoint"), "{err}");
    assert!(!empty.exists());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// The metrics of a step that only the sampler knows (generation, rewards, the prompt sampler's
/// epoch, timings) or that only an online run computes (validation on the toy task's prompts).
fn generation_only(key: &str) -> bool {
    [
        "timing_s/",
        "rollout/",
        "reward/",
        "val-core/",
        "val-aux/",
        "perf/",
    ]
    .iter()
    .any(|p| key.starts_with(p))
        || key == "train/epoch"
}

/// A short online toy run with the extra arguments `more` into `dir/online`, then the replay of
/// its rollouts (`replay --from-run`) into `dir/replay`; both succeed. Returns the two run
/// directories and the replay's output.
fn online_then_replay(dir: &Path, more: &[&str]) -> (PathBuf, PathBuf, Output) {
    let online = dir.join("online");
    let online_s = online.display().to_string();
    let config = preset();
    let mut args = vec!["train", "--config", &config, "--out", &online_s];
    args.extend(SHORT);
    args.extend(more);
    let o = rlreplay(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let replay = dir.join("replay");
    let replay_s = replay.display().to_string();
    let o = rlreplay(&[
        "replay",
        "--from-run",
        &online_s,
        "--out",
        &replay_s,
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    (online, replay, o)
}

/// Replaying an online run's own rollouts onto its initial policy with its configuration trains
/// its policy bit for bit: every checkpoint's weights and optimizer state, and every metric that
/// does not come from generation.
#[test]
fn replay_from_run_reproduces_the_online_run_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let (online, replay, o) = online_then_replay(
        dir.path(),
        &["--set", "trainer.save_freq=1", "--set", "trainer.keep=4"],
    );
    let (online_s, replay_s) = (online.display().to_string(), replay.display().to_string());
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("trained 4/4 steps"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let kept = rlreplay_train::rundir::complete_checkpoints(&online.join("checkpoints")).unwrap();
    assert_eq!(
        kept,
        rlreplay_train::rundir::complete_checkpoints(&replay.join("checkpoints")).unwrap()
    );
    assert!(kept.len() >= 2 && kept.contains(&4), "{kept:?}");
    for step in kept {
        for file in ["model.safetensors", "optimizer.safetensors"] {
            let read = |run: &Path| {
                std::fs::read(run.join(format!("checkpoints/global_step_{step}/{file}"))).unwrap()
            };
            assert!(
                read(&online) == read(&replay),
                "step {step}: {file} differs"
            );
        }
    }
    let (a, b) = (
        read_metrics(&online, false).unwrap(),
        read_metrics(&replay, false).unwrap(),
    );
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        let (x, y) = (x.as_object().unwrap(), y.as_object().unwrap());
        // Every metric of the online step that generation does not decide, the same bits (the
        // replay adds its schedule's own).
        let keep = |m: &serde_json::Map<String, serde_json::Value>| -> Vec<(String, String)> {
            m.iter()
                .filter(|(k, _)| !generation_only(k) && x.contains_key(*k))
                .map(|(k, v)| (k.clone(), v.to_string()))
                .collect()
        };
        assert_eq!(keep(x), keep(y));
    }
    // A study varies what it likes on top (here the learning rate), and the run directory's
    // own configuration continues a stopped replay.
    let varied = dir.path().join("varied");
    let varied_s = varied.display().to_string();
    let o = rlreplay(&[
        "replay",
        "--from-run",
        &online_s,
        "--out",
        &varied_s,
        "--quiet",
        "--set",
        "optim.lr=1e-5",
        "--stop-after",
        "2",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = rlreplay(&["replay", "--out", &varied_s, "--resume", "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let saved = std::fs::read_to_string(varied.join("config.toml")).unwrap();
    assert!(
        saved.contains("lr = 1e-5") || saved.contains("lr = 0.00001"),
        "{saved}"
    );
    // Not an online run: the error names what is missing.
    let o = rlreplay(&["replay", "--from-run", &replay_s, "--out", &varied_s]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("rollouts"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Online RL through LoRA adapters: the run checkpoints adapters in the PEFT layout, and the
/// replay of its rollouts trains the same adapters, bit for bit.
#[test]
fn an_online_lora_run_and_its_replay_train_the_same_adapters() {
    let dir = tempfile::tempdir().unwrap();
    let (online, replay, _) = online_then_replay(
        dir.path(),
        &["--set", "model.lora_rank=4", "--set", "optim.lr=1e-3"],
    );
    for file in ["adapter_model.safetensors", "optimizer.safetensors"] {
        let read = |run: &Path| std::fs::read(run.join("checkpoints/global_step_4").join(file));
        let (a, b) = (read(&online), read(&replay));
        assert!(a.is_ok() && a.ok() == b.ok(), "{file} differs");
    }
    assert!(!online.join("checkpoints/last/model.safetensors").exists());
}

/// A step's time is broken down by phase in its metrics, with verl's names.
#[test]
fn a_steps_time_is_broken_down_by_phase() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let out_s = out.display().to_string();
    let config = preset();
    let mut args = vec!["train", "--config", &config, "--out", &out_s];
    args.extend(SHORT);
    let o = rlreplay(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let metrics = read_metrics(&out, true).unwrap();
    for m in &metrics {
        for key in [
            "timing_s/gen",
            "timing_s/reward",
            "timing_s/update",
            "timing_s/update_actor",
            "timing_s/step",
        ] {
            assert!(m[key].as_f64().is_some_and(|t| t >= 0.0), "{key}: {m}");
        }
        let parts = m["timing_s/gen"].as_f64().unwrap()
            + m["timing_s/reward"].as_f64().unwrap()
            + m["timing_s/update"].as_f64().unwrap();
        assert!(parts <= m["timing_s/step"].as_f64().unwrap() + 1e-3, "{m}");
    }
    // Validation every 2 steps.
    assert!(
        metrics[1]["timing_s/testing"].as_f64().is_some(),
        "{}",
        metrics[1]
    );
}
