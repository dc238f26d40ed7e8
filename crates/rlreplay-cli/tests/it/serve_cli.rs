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

/// A PEFT adapter of rank 2 on the attention projections of the model saved in `base`, with a
/// non-zero `lora_B`, saved into `dir`.
fn save_adapter(base: &std::path::Path, dir: &std::path::Path) {
    let mut m = Model::load(base, DType::F32, &Device::Cpu).unwrap();
    let cfg = rlreplay_model::LoraConfig::new(2, 4.0, &["q_proj", "v_proj"]).unwrap();
    m.add_lora(cfg, 1).unwrap();
    for i in 0..m.params().len() {
        let n = m.params()[i].var.elem_count();
        let bytes: Vec<u8> = (0..n)
            .flat_map(|j| (0.05 * ((i * 13 + j * 7) as f32 * 0.37).sin()).to_le_bytes())
            .collect();
        m.set_weight_bytes(i, DType::F32, &bytes).unwrap();
    }
    m.save_adapter(dir, "base").unwrap();
}

#[test]
fn serve_serves_the_adapters_of_its_flags_in_every_spelling() {
    let tmp = tempfile::tempdir().unwrap();
    let (base, pol) = (tmp.path().join("base"), tmp.path().join("pol"));
    Model::new_random(ModelConfig::tiny(), 1, DType::F32, &Device::Cpu)
        .unwrap()
        .save_hf(&base)
        .unwrap();
    save_adapter(&base, &pol);
    let p = pol.to_str().unwrap();
    let json = format!("{{\"name\": \"c\", \"path\": {p:?}}}");
    let (mut child, url) = common::serve(&[
        "--model",
        base.to_str().unwrap(),
        "--served-model-name",
        "base",
        "--enable-lora",
        "--adapter",
        p,
        "--lora-modules",
        &format!("b={p}"),
        &json,
    ]);
    let models: serde_json::Value = ureq::get(&format!("{url}/v1/models"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["base", "b", "c", "pol"]);
    let tokens = |model: &str| -> serde_json::Value {
        let r: serde_json::Value = ureq::post(&format!("{url}/v1/completions"))
            .send_json(serde_json::json!({"model": model, "prompt": [1, 2, 3],
                "max_tokens": 8, "seed": 0, "return_token_ids": true, "logprobs": 0}))
            .unwrap()
            .into_json()
            .unwrap();
        r["choices"][0]["logprobs"]["token_logprobs"].clone()
    };
    // One adapter under three names samples one thing; the base model another.
    assert_eq!(tokens("pol"), tokens("b"));
    assert_eq!(tokens("pol"), tokens("c"));
    assert_ne!(tokens("pol"), tokens("base"));
    child.kill().unwrap();
    child.wait().unwrap();
    // Bad adapter flags stop the start, naming the adapter.
    for (flags, named) in [
        (vec!["--lora-modules", "=x"], "NAME=DIR"),
        (vec!["--lora-modules", "{\"name\": \"x\"}"], "\"path\""),
        (
            vec!["--adapter", "missing=/nonexistent"],
            "adapter `missing`",
        ),
        (
            vec!["--adapter", p, "--adapter", p],
            "two adapters are named `pol`",
        ),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_rlreplay"))
            .args(["serve", "--model", base.to_str().unwrap(), "--port", "0"])
            .args(&flags)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{flags:?}: {err}");
        assert!(err.contains(named), "{flags:?}: {err}");
        assert!(!err.contains("listening"), "{flags:?}: {err}");
    }
}
