//! `rlreplay replay` as a process: kill -9 in the middle of a run, resume, and compare with an
//! uninterrupted run; configuration errors.

use std::path::Path;

use rlreplay_train::rundir::read_metrics;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rlreplay_data::synth::{write_dataset, SynthConfig};

fn rlreplay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(args)
        .output()
        .unwrap()
}

fn setup(dir: &Path, steps: usize) -> String {
    let data = dir.join("data");
    let synth = SynthConfig {
        steps,
        prompts: 8,
        group: 4,
        vocab: 64,
        mean_len: 16.0,
        max_len: 32,
        prompt_len: 6,
        eos: 1,
        pattern_len: 3,
        seed: 11,
        ..SynthConfig::default()
    };
    write_dataset(&data, &synth, |_| {}).unwrap();
    let cfg = dir.join("replay.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
[model.random]
vocab_size = 64
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
head_dim = 8

[data]
path = "{}"
eos_token_id = 1

[algorithm]
adv_estimator = "grpo"
loss_mode = "ppo"

[optim]
lr = 1e-3

[batch]
ppo_mini_batch_size = 4

[checkpoint]
save_freq = 1
keep = 3
"#,
            data.display()
        ),
    )
    .unwrap();
    cfg.to_string_lossy().into_owned()
}

#[test]
fn kill_9_then_resume_matches_an_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 16;
    let cfg = setup(tmp.path(), steps);
    let full = tmp.path().join("full");
    let full_s = full.to_string_lossy();
    let o = rlreplay(&["replay", "--config", &cfg, "--out", &full_s, "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("trained 16/16 steps"));

    let part = tmp.path().join("part");
    let part_s = part.to_string_lossy();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(["replay", "--config", &cfg, "--out", &part_s, "--quiet"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let latest = part.join("checkpoints/latest_checkpointed_iteration.txt");
    let t0 = Instant::now();
    while !latest.exists() && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
    // SIGKILL: no destructor, no flush, possibly in the middle of writing a checkpoint.
    child.kill().unwrap();
    child.wait().unwrap();
    let done: u64 = std::fs::read_to_string(&latest)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(done >= 1);

    let o = rlreplay(&["replay", "--out", &part_s, "--resume", "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        read_metrics(&full, false).unwrap(),
        read_metrics(&part, false).unwrap()
    );
    let w =
        |r: &Path| std::fs::read(r.join("checkpoints/global_step_16/model.safetensors")).unwrap();
    assert_eq!(w(&full), w(&part));
}

#[test]
fn configuration_errors_name_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = setup(tmp.path(), 1);
    let out = tmp.path().join("run");
    let out_s = out.to_string_lossy();
    let o = rlreplay(&[
        "replay",
        "--config",
        &cfg,
        "--out",
        &out_s,
        "--set",
        "optim.lrr=1",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("lrr"));
    let o = rlreplay(&[
        "replay",
        "--config",
        &cfg,
        "--out",
        &out_s,
        "--set",
        "algorithm.adv_estimator=nope",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("adv_estimator"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = rlreplay(&[
        "replay",
        "--config",
        &cfg,
        "--out",
        &out_s,
        "--set",
        "batch.ppo_epochs=\"two\"",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("ppo_epochs"));
    // A typed override works and lands in the saved configuration.
    let o = rlreplay(&[
        "replay",
        "--config",
        &cfg,
        "--out",
        &out_s,
        "--quiet",
        "--set",
        "optim.lr=2e-3",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let saved = std::fs::read_to_string(out.join("config.toml")).unwrap();
    assert!(saved.contains("lr = 0.002"), "{saved}");
}
