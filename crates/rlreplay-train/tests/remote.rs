//! The remote rollout source against `rlreplay serve` on 127.0.0.1 (ephemeral ports): a
//! synchronous remote run equals the local backend bit for bit, prompts fail over to the servers
//! left, and bad endpoints or protocols are named.

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

fn train(cfg: Config, out: &Path) -> anyhow::Result<RunSummary> {
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
    let msg = format!("{err:#}");
    assert!(
        msg.contains("no rollout endpoint is left") && msg.contains(&dead),
        "{msg}"
    );
    // A server that does not speak the protocol: the refusal is named.
    let out = tempfile::tempdir().unwrap();
    let mut cfg = toy_config(&remote(&[urls[0].clone()], "openai"));
    cfg.rollout.endpoints = vec![format!("{}/nothing", urls[0])];
    let err = train(cfg, out.path()).unwrap_err();
    let msg = format!("{err:#}");
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
    assert!(format!("{e:#}").contains("needs endpoints"), "{e:#}");
    let e = parse(&[
        "rollout.backend=\"remote\"",
        "rollout.endpoints=[\"localhost:1\"]",
    ])
    .unwrap_err();
    assert!(format!("{e:#}").contains("not an http:// URL"), "{e:#}");
    let e = parse(&["rollout.protocol=\"grpc\""]).unwrap_err();
    assert!(format!("{e:#}").contains("protocol"), "{e:#}");
    let c = parse(&["rollout.protocol=\"vllm\""]).unwrap();
    assert_eq!(
        c.rollout.protocol,
        rlreplay_train::config::RolloutProtocol::Openai
    );
}
