//! `rlreplay train` on `rlreplay serve` processes (127.0.0.1, ephemeral ports) that are killed
//! mid-run: with one server left the run finishes on it; with none left it stops with a clear
//! error, the last checkpoint intact, and `--resume` continues on servers started again.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;

/// Settings of a short toy run: `STEPS` steps, a checkpoint after each, no validation.
const STEPS: usize = 8;

fn toy_sets() -> Vec<String> {
    [
        format!("trainer.total_training_steps={STEPS}"),
        "trainer.save_freq=1".into(),
        "validation.test_freq=0".into(),
        "validation.val_before_train=false".into(),
        "toy.warmup_steps=2".into(),
        "batch.train_batch_size=4".into(),
    ]
    .into()
}

fn remote_sets(urls: &[String]) -> Vec<String> {
    let list: Vec<String> = urls.iter().map(|u| format!("{u:?}")).collect();
    vec![
        "rollout.backend=\"remote\"".into(),
        format!("rollout.endpoints=[{}]", list.join(", ")),
        "rollout.retries=1".into(),
        "rollout.retry_backoff_s=0.01".into(),
        "rollout.request_timeout_s=60".into(),
    ]
}

fn preset() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../configs/toy-arith.toml")
        .display()
        .to_string()
}

/// `rlreplay train` with `args` and `--set` for each of `sets`.
fn train(args: &[&str], sets: &[String]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rlreplay"));
    c.arg("train").args(args);
    for s in sets {
        c.args(["--set", s]);
    }
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    c
}

/// An `rlreplay serve` process on a free loopback port.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(model: &Path) -> Self {
        let (child, url) = common::serve(&["--model", model.to_str().unwrap()]);
        Self { child, url }
    }

    /// SIGKILL: the server disappears mid-request.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A model of the toy preset's architecture for the servers to start from (the trainer sends
/// its own weights before the first step).
fn seed_model(dir: &Path) -> PathBuf {
    let out = dir.join("seed");
    let mut sets = toy_sets();
    sets.push("trainer.total_training_steps=1".into());
    let config = preset();
    let o = train(
        &["--config", &config, "--out", out.to_str().unwrap()],
        &sets,
    )
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out.join("checkpoints/global_step_1")
}

/// Lines of the run's `metrics.jsonl` (one per trained step).
fn steps_done(run: &Path) -> usize {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// Waits until the run has trained `steps` steps and checkpointed them, or the process ended.
fn wait_for_checkpoint(run: &Path, steps: usize, child: &mut Child) {
    let marker = run.join("checkpoints/latest_checkpointed_iteration.txt");
    let t0 = Instant::now();
    loop {
        let at = std::fs::read_to_string(&marker)
            .ok()
            .and_then(|t| t.trim().parse::<usize>().ok());
        if at.is_some_and(|s| s >= steps) {
            return;
        }
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                std::io::Read::read_to_string(&mut e, &mut err).unwrap();
            }
            panic!("the run ended ({status}) before step {steps}: {err}");
        }
        assert!(t0.elapsed() < Duration::from_secs(600), "no step {steps}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn killing_one_server_mid_run_finishes_on_the_other() {
    let tmp = tempfile::tempdir().unwrap();
    let model = seed_model(tmp.path());
    let (a, b) = (Server::start(&model), Server::start(&model));
    let run = tmp.path().join("run");
    let config = preset();
    let mut child = train(
        &["--config", &config, "--out", run.to_str().unwrap()],
        &[toy_sets(), remote_sets(&[a.url.clone(), b.url.clone()])].concat(),
    )
    .spawn()
    .unwrap();
    wait_for_checkpoint(&run, 1, &mut child);
    let killed_at = steps_done(&run);
    a.kill();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(killed_at < STEPS, "the run had finished before the kill");
    assert_eq!(steps_done(&run), STEPS);
    assert!(run
        .join(format!("checkpoints/global_step_{STEPS}/model.safetensors"))
        .is_file());
    drop(b);
}

#[test]
fn killing_every_server_stops_with_the_checkpoint_intact_and_resume_continues() {
    let tmp = tempfile::tempdir().unwrap();
    let model = seed_model(tmp.path());
    let (a, b) = (Server::start(&model), Server::start(&model));
    let urls = [a.url.clone(), b.url.clone()];
    let run = tmp.path().join("run");
    let run_s = run.to_str().unwrap().to_owned();
    let config = preset();
    let mut child = train(
        &["--config", &config, "--out", &run_s],
        &[toy_sets(), remote_sets(&urls)].concat(),
    )
    .spawn()
    .unwrap();
    wait_for_checkpoint(&run, 2, &mut child);
    a.kill();
    b.kill();
    let o = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "the run finished without servers");
    assert!(
        stderr.contains("no rollout endpoint is left")
            && stderr.contains("--resume")
            && urls.iter().all(|u| stderr.contains(u.as_str())),
        "{stderr}"
    );
    // The last checkpoint is whole: it loads, and the run stopped before the end.
    let at: usize =
        std::fs::read_to_string(run.join("checkpoints/latest_checkpointed_iteration.txt"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
    assert!((2..STEPS).contains(&at), "checkpoint at {at}");
    let last = run.join(format!("checkpoints/global_step_{at}"));
    for f in [
        "model.safetensors",
        "config.json",
        "optimizer.safetensors",
        "trainer_state.json",
    ] {
        assert!(last.join(f).is_file(), "checkpoint {at} lacks {f}");
    }
    rlreplay_model::Model::load(
        &last,
        rlreplay_model::DType::F32,
        &rlreplay_model::Device::Cpu,
    )
    .unwrap();

    // Servers back (on new ports): the run continues from the checkpoint to the end.
    let (c, d) = (Server::start(&model), Server::start(&model));
    let o = train(
        &["--out", &run_s, "--resume"],
        &[toy_sets(), remote_sets(&[c.url.clone(), d.url.clone()])].concat(),
    )
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(steps_done(&run), STEPS);
    let steps: Vec<u64> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(steps, (1..=STEPS as u64).collect::<Vec<_>>());
    assert!(run
        .join(format!("checkpoints/global_step_{STEPS}/model.safetensors"))
        .is_file());
}

/// A LoRA policy trained on a server that serves its base: only the adapter goes to the server
/// after each update, and the run trains the adapters of the same run generating in process.
#[test]
fn a_lora_run_on_a_server_trains_the_adapters_of_the_local_run() {
    let tmp = tempfile::tempdir().unwrap();
    let config = preset();
    let lora: Vec<String> = vec!["model.lora_rank=4".into(), "optim.lr=1e-3".into()];
    let steps = 3;
    let short = [
        format!("trainer.total_training_steps={steps}"),
        "trainer.save_freq=3".into(),
    ];
    let local = tmp.path().join("local");
    let o = train(
        &["--config", &config, "--out", local.to_str().unwrap()],
        &[toy_sets(), lora.clone(), short.to_vec()].concat(),
    )
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The toy task's base is made from the run's seed: the server serves the same weights.
    let server = Server::start(&local.join("initial"));
    let remote = tmp.path().join("remote");
    let o = train(
        &["--config", &config, "--out", remote.to_str().unwrap()],
        &[
            toy_sets(),
            lora,
            short.to_vec(),
            remote_sets(std::slice::from_ref(&server.url)),
        ]
        .concat(),
    )
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ckpt = format!("checkpoints/global_step_{steps}/adapter_model.safetensors");
    assert_eq!(
        std::fs::read(local.join(&ckpt)).unwrap(),
        std::fs::read(remote.join(&ckpt)).unwrap()
    );
    let synced = remote.join(format!("weights/step_{steps}"));
    assert!(synced.join("adapter_model.safetensors").is_file());
    assert!(!synced.join("model.safetensors").exists());
    drop(server);
}
