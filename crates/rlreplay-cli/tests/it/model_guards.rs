//! Models that cannot work are refused or flagged before they do harm: a configuration too large
//! for the machine's memory is refused with the estimate before anything is allocated, and NaN
//! weights are warned about.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rlreplay_model::{DType, Device, Model, ModelConfig};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rlreplay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(args)
        .output()
        .unwrap()
}

/// A model directory whose config.json describes vocab 16,777,216 x hidden 8,192 (137 G
/// parameters, 513 GiB of f32 weights), with an empty weight file: nothing may be read or
/// allocated before the refusal.
fn oversized(dir: &Path) {
    let cfg = ModelConfig {
        vocab_size: 16_777_216,
        hidden_size: 8_192,
        intermediate_size: 8_192,
        num_hidden_layers: 1,
        num_attention_heads: 64,
        num_key_value_heads: 8,
        head_dim: 128,
        ..ModelConfig::tiny()
    };
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), cfg.to_hf_json().to_string()).unwrap();
    std::fs::write(dir.join("model.safetensors"), b"").unwrap();
}

#[test]
fn oversized_models_are_refused_with_the_estimate() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    oversized(&model);
    let m = model.to_str().unwrap();
    let input = tmp.path().join("in.jsonl");
    std::fs::write(
        &input,
        "{\"prompt_token_ids\": [1], \"response_token_ids\": [2]}\n",
    )
    .unwrap();
    let prompts = tmp.path().join("p.jsonl");
    std::fs::write(&prompts, "{\"prompt\": \"What is 2+3?\"}\n").unwrap();
    let tokenizer = root().join(".cache/qwen3");
    let data = root().join("crates/rlreplay-eval/tests/fixtures/verl_val.parquet");
    let (gen_out, eval_out) = (tmp.path().join("gen"), tmp.path().join("eval"));
    let runs: [(&str, Vec<&str>); 3] = [
        (
            "logprobs",
            vec!["logprobs", "--model", m, "--input", input.to_str().unwrap()],
        ),
        (
            "generate",
            vec![
                "generate",
                "--model",
                m,
                "--tokenizer",
                tokenizer.to_str().unwrap(),
                "--prompts",
                prompts.to_str().unwrap(),
                "--out",
                gen_out.to_str().unwrap(),
            ],
        ),
        (
            "eval",
            vec![
                "eval",
                "--model",
                m,
                "--tokenizer",
                tokenizer.to_str().unwrap(),
                "--data",
                data.to_str().unwrap(),
                "--out",
                eval_out.to_str().unwrap(),
            ],
        ),
    ];
    for (what, args) in runs {
        let o = rlreplay(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{what}: {err}");
        assert!(
            err.contains("the model needs at least")
                && err.contains("before activations")
                && err.contains("137.")
                && err.contains("weights 513.")
                && err.contains("more than the"),
            "{what}: {err}"
        );
        if what != "logprobs" {
            assert!(err.contains("decoder copy"), "{what}: {err}");
        }
    }
}

#[test]
fn nan_weights_are_warned_about() {
    let tmp = tempfile::tempdir().unwrap();
    let fixture = root().join("crates/rlreplay-model/tests/fixtures/tiny_tied");
    let model = Model::load(&fixture, DType::F32, &Device::Cpu).unwrap();
    let norm = model
        .params()
        .iter()
        .find(|p| p.name == "model.norm.weight")
        .unwrap();
    norm.var
        .set(&(norm.var.as_tensor() * f64::NAN).unwrap())
        .unwrap();
    let dir = tmp.path().join("nan");
    model.save_hf(&dir).unwrap();
    let input = tmp.path().join("in.jsonl");
    std::fs::write(
        &input,
        "{\"prompt_token_ids\": [1, 2], \"response_token_ids\": [3, 4]}\n",
    )
    .unwrap();
    let o = rlreplay(&[
        "logprobs",
        "--model",
        dir.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let line: serde_json::Value =
        serde_json::from_slice(o.stdout.split(|&b| b == b'\n').next().unwrap()).unwrap();
    assert_eq!(line["logprobs"], serde_json::json!([null, null]));
    assert!(
        err.contains("warning:")
            && err.contains("tensor model.norm.weight holds")
            && err.contains("NaN or infinite"),
        "{err}"
    );
    assert!(
        err.contains("2 log-prob(s) or entropies are NaN (written as null)"),
        "{err}"
    );
}

/// The index the binary gives mimalloc's purge-delay option (`main.rs` sets it for the training
/// commands) is mimalloc's: its default is the documented 1000 ms.
#[test]
fn the_purge_delay_option_index_is_mimallocs() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: reading an option only initialises it from the environment.
    let delay = unsafe { libmimalloc_sys::mi_option_get(15) };
    assert_eq!(delay, 1000, "mimalloc's default purge delay is 1000 ms");
}
