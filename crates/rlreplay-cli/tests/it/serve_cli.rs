//! `rlreplay serve` as a process: binds loopback on the port it is given (0: a free one, printed),
//! serves completions, stops cleanly on SIGTERM, and refuses bad flags.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rlreplay_model::{DType, Device, Model, ModelConfig};

use crate::common;

#[test]
fn serve_binds_loopback_answers_and_stops_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    Model::new_random(ModelConfig::tiny(), 1, DType::F32, &Device::Cpu)
        .unwrap()
        .save_hf(tmp.path())
        .unwrap();
    let (mut child, url) = common::serve(&["--model", tmp.path().to_str().unwrap()]);
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let resp: serde_json::Value = ureq::post(&format!("{url}/v1/completions"))
        .send_json(serde_json::json!({"prompt": [1, 2, 3], "max_tokens": 4, "seed": 0}))
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(resp["choices"].as_array().unwrap().len(), 1);
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn bad_serve_flags_are_errors() {
    let o = Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(["serve", "--model", "/nonexistent", "--port", "0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent"));
    let o = Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(["serve", "--model", "x", "--logprobs-mode", "tempered"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("processed or raw"));
}

#[test]
fn limits_the_server_cannot_serve_with_are_refused_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    Model::new_random(ModelConfig::tiny(), 1, DType::F32, &Device::Cpu)
        .unwrap()
        .save_hf(tmp.path())
        .unwrap();
    let model = tmp.path().to_str().unwrap();
    for (flag, value) in [
        ("--max-body-mib", "17592186044416"),
        ("--max-body-mib", "0"),
        ("--max-model-len", "0"),
        ("--max-model-len", "1"),
        ("--max-num-seqs", "0"),
        ("--max-connections", "0"),
        ("--idle-timeout-secs", "0"),
        ("--header-read-timeout-secs", "0"),
        ("--max-prompts-per-request", "0"),
        ("--max-seqs-per-request", "0"),
    ] {
        // A server that starts despite the flag is stopped after a minute.
        let mut child = Command::new(env!("CARGO_BIN_EXE_rlreplay"))
            .args(["serve", "--model", model, "--port", "0", flag, value])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while child.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(flag), "{flag} {value}: {err}");
        assert!(!err.contains("listening"), "{flag} {value}: {err}");
    }
}
