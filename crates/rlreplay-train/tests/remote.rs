//! The remote rollout source against `rlreplay serve` on 127.0.0.1 (ephemeral ports): a
//! synchronous remote run equals the local backend bit for bit, prompts fail over to the servers
//! left, and bad endpoints or protocols are named.

use rlreplay_data::error::chain;
use std::path::Path;

use rlreplay_serve::{BoundServer, ServeConfig, ServerHandle};
use rlreplay_train::{run, Config, RunOptions, RunSummary, SourceKind};

fn toy_config(overrides: &[String]) -> Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/toy-arith.toml");
    let mut all: Vec<String> = [
        "trainer.total_training_steps=3",
        "trainer.save_freq=3",
        "validation.test_freq=0",
        "validation.val_before_train=false",
        "toy.warmup_steps=5",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    all.extend(overrides.iter().cloned());
    Config::load(&path, &all, SourceKind::Online).unwrap().0
}

fn train(cfg: Config, out: &Path) -> rlreplay_train::Result<RunSummary> {
    run(&RunOptions::new(cfg, out))
}

fn serve(model: &Path) -> ServerHandle {
    let mut cfg = ServeConfig::new(model);
    cfg.port = 0;
    BoundServer::bind(cfg).unwrap().spawn().unwrap()
}

fn remote(urls: &[String], protocol: &str) -> Vec<String> {
    let list: Vec<String> = urls.iter().map(|u| format!("{u:?}")).collect();
    vec![
        "rollout.backend=\"remote\"".into(),
        format!("rollout.endpoints=[{}]", list.join(", ")),
        format!("rollout.protocol=\"{protocol}\""),
        "rollout.retries=1".into(),
        "rollout.retry_backoff_s=0.01".into(),
        "rollout.request_timeout_s=60".into(),
    ]
}

fn weights(run: &Path) -> Vec<u8> {
    std::fs::read(run.join("checkpoints/global_step_3/model.safetensors")).unwrap()
}

#[test]
fn synchronous_remote_equals_local_and_fails_over() {
    let local = tempfile::tempdir().unwrap();
    train(toy_config(&[]), local.path()).unwrap();
    // The servers start from any model of the architecture: the trainer sends its own initial
    // weights before the first step.
    let model = local.path().join("checkpoints/global_step_3");
    let (a, b) = (serve(&model), serve(&model));
    let urls = [a.url(), b.url()];
    for protocol in ["openai", "sglang"] {
        let out = tempfile::tempdir().unwrap();
        let s = train(toy_config(&remote(&urls, protocol)), out.path()).unwrap();
        assert_eq!(
            weights(out.path()),
            weights(local.path()),
            "{protocol}: remote weights differ from local"
        );
        let marker = out.path().join("weights/step_3/STABLE");
        assert_eq!(std::fs::read_to_string(marker).unwrap(), "3\n");
        assert!(!out.path().join("weights/step_2").exists());
        assert!(s.last_metrics["timing_s/gen"] > 0.0);
        // Each logged row records the policy version that generated it.
        let shard = out.path().join("rollouts/data/step-0002.parquet");
        let (rows, _) =
            rlreplay_data::read_shard(&shard, 2, &rlreplay_data::ReadOptions::new([])).unwrap();
        assert!(rows.policy_version.iter().all(|&v| v == Some(1)));
    }
    // One endpoint down from the start: everything runs on the other, with the same result.
    let out = tempfile::tempdir().unwrap();
    let dead = "http://127.0.0.1:9".to_string();
    train(
        toy_config(&remote(&[dead.clone(), urls[1].clone()], "openai")),
        out.path(),
    )
    .unwrap();
    assert_eq!(weights(out.path()), weights(local.path()));
    // No endpoint left: the error names each and why.
    let out = tempfile::tempdir().unwrap();
    let err = train(
        toy_config(&remote(std::slice::from_ref(&dead), "openai")),
        out.path(),
    )
    .unwrap_err();
    let msg = chain(&err);
    assert!(
        msg.contains("no rollout endpoint is left") && msg.contains(&dead),
        "{msg}"
    );
    // A server that does not speak the protocol: the refusal is named.
    let out = tempfile::tempdir().unwrap();
    let mut cfg = toy_config(&remote(&[urls[0].clone()], "openai"));
    cfg.rollout.endpoints = vec![format!("{}/nothing", urls[0])];
    let err = train(cfg, out.path()).unwrap_err();
    let msg = chain(&err);
    assert!(msg.contains("refused the request (404)"), "{msg}");
    a.shutdown();
    b.shutdown();
}

#[test]
fn remote_settings_are_checked() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/toy-arith.toml");
    let parse = |sets: &[&str]| {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        Config::load(&path, &sets, SourceKind::Online).map(|c| c.0)
    };
    let e = parse(&["rollout.backend=\"remote\""]).unwrap_err();
    assert!(chain(&e).contains("needs endpoints"), "{e:?}");
    let e = parse(&[
        "rollout.backend=\"remote\"",
        "rollout.endpoints=[\"localhost:1\"]",
    ])
    .unwrap_err();
    assert!(chain(&e).contains("not an http:// URL"), "{e:?}");
    let e = parse(&["rollout.protocol=\"grpc\""]).unwrap_err();
    assert!(chain(&e).contains("protocol"), "{e:?}");
    let c = parse(&["rollout.protocol=\"vllm\""]).unwrap();
    assert_eq!(
        c.rollout.protocol,
        rlreplay_train::config::RolloutProtocol::Openai
    );
}

#[test]
fn one_step_off_policy_learns_and_counts_staleness() {
    let model_dir = tempfile::tempdir().unwrap();
    let seed_run = model_dir.path().join("seed");
    train(
        toy_config(&[
            "trainer.total_training_steps=1".into(),
            "trainer.save_freq=1".into(),
        ]),
        &seed_run,
    )
    .unwrap();
    let model = seed_run.join("checkpoints/global_step_1");
    let (a, b) = (serve(&model), serve(&model));
    let urls = [a.url(), b.url()];
    // Hand-checked staleness: steps 1 and 2 are sent before step 1 trains (version 0); step t >= 3
    // is sent after the update of step t - 2. So step 1 trains fresh rows and every later step
    // rows exactly one version old.
    for protocol in ["sglang", "openai"] {
        let out = tempfile::tempdir().unwrap();
        let mut sets = remote(&urls, protocol);
        sets.push("rollout.max_off_policy_steps=1".into());
        let s = train(toy_config(&sets), out.path()).unwrap();
        let m = &s.last_metrics;
        assert_eq!(m["rollout/staleness/mean"], 1.0, "{protocol}: {m:?}");
        assert_eq!(m["rollout/staleness/max"], 1.0);
        assert_eq!(m["rollout/dropped_stale_rows"], 0.0);
        assert!((0.0..=1.0).contains(&m["timing_s/gen_overlap"]));
        for (step, version) in [(1, 0), (2, 0), (3, 1)] {
            let shard = out
                .path()
                .join(format!("rollouts/data/step-{step:04}.parquet"));
            let (rows, _) =
                rlreplay_data::read_shard(&shard, step, &rlreplay_data::ReadOptions::new([]))
                    .unwrap();
            assert!(
                rows.policy_version.iter().all(|&v| v == Some(version)),
                "{protocol} step {step}: {:?}",
                rows.policy_version
            );
        }
    }
    // k = 1 still learns on the toy task.
    let out = tempfile::tempdir().unwrap();
    let mut sets = remote(&urls, "openai");
    sets.extend(
        [
            "rollout.max_off_policy_steps=1",
            "toy.warmup_steps=40",
            "trainer.total_training_steps=20",
            "validation.test_freq=10",
            "validation.val_before_train=true",
            "trainer.save_freq=0",
        ]
        .map(String::from),
    );
    let s = train(toy_config(&sets), out.path()).unwrap();
    let (first, last) = (s.validations[0].1, s.validations.last().unwrap().1);
    assert!(last >= first + 0.1, "{:?}", s.validations);
    a.shutdown();
    b.shutdown();
}
