//! `--adapter DIR` (a PEFT LoRA adapter) on `logprobs`, `generate`, `eval` and `audit --policy`:
//! the base with the adapter computes what the merged weights compute, and an adapter that does
//! not fit the base is refused naming the module and the shapes.

use std::path::{Path, PathBuf};

use candle_core::Tensor;
use rlreplay_data::{read_shard, shard_path, ReadOptions};
use rlreplay_model::{DType, Device, LoraConfig, Model, SeqPair};
use serde_json::Value;

use crate::common::rlreplay;
use crate::generate_cli::tiny_qwen3;

/// Puts adapters with non-zero `B` (so that they change the model) on `model` and saves them to
/// `dir`; returns the model with them.
fn with_adapter(mut model: Model, targets: &[&str], dir: &Path) -> Model {
    model
        .add_lora(LoraConfig::new(2, 4.0, targets).unwrap(), 9)
        .unwrap();
    for (i, p) in model.params().iter().enumerate() {
        if p.name.contains("lora_B") {
            let n = p.var.elem_count();
            let v: Vec<f32> = (0..n)
                .map(|j| (((i * 31 + j * 7) % 13) as f32 - 6.0) * 0.05)
                .collect();
            let t = Tensor::from_vec(v, p.var.dims(), &Device::Cpu).unwrap();
            p.var.set(&t.to_dtype(p.var.dtype()).unwrap()).unwrap();
        }
    }
    model.save_adapter(dir, "base").unwrap();
    model
}

/// The base model directory (with the Qwen3 tokenizer files), its adapter directory, the model
/// with the adapter, and the merged weights' directory.
fn setup(tmp: &Path) -> (PathBuf, PathBuf, Model, PathBuf) {
    let base = tmp.join("base");
    tiny_qwen3(&base);
    let adapter = tmp.join("adapter");
    let loaded = Model::load(&base, DType::F32, &Device::Cpu).unwrap();
    let with = with_adapter(loaded, &["all-linear"], &adapter);
    let merged = tmp.join("merged");
    let mut m = Model::load(&base, DType::F32, &Device::Cpu).unwrap();
    m.load_adapter(&adapter).unwrap();
    m.merge_lora().unwrap();
    m.set_source_dir(Some(base.clone()));
    m.save_hf(&merged).unwrap();
    (base, adapter, with, merged)
}

fn ok(o: &std::process::Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn logprobs_with_an_adapter_are_the_adapted_models() {
    let tmp = tempfile::tempdir().unwrap();
    let (base, adapter, with, _) = setup(tmp.path());
    let input = tmp.path().join("in.jsonl");
    let (prompt, response) = ([151644u32, 872, 198, 17], [18u32, 19, 20, 151645]);
    std::fs::write(
        &input,
        format!(
            "{}\n",
            serde_json::json!({"prompt_token_ids": prompt, "response_token_ids": response})
        ),
    )
    .unwrap();
    let run = |adapter: Option<&Path>| {
        let mut args = vec![
            "logprobs".to_string(),
            "--model".into(),
            base.display().to_string(),
            "--input".into(),
            input.display().to_string(),
        ];
        if let Some(a) = adapter {
            args.extend(["--adapter".into(), a.display().to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out: Value = serde_json::from_str(ok(&rlreplay(&args)).trim()).unwrap();
        out["logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect::<Vec<f64>>()
    };
    let got = run(Some(&adapter));
    let want = with
        .logprobs(&[SeqPair::new(&prompt, &response)], 1.0, false)
        .unwrap()
        .logprobs
        .remove(0);
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-5, "{g} vs {w}");
    }
    assert_ne!(got, run(None), "the adapter changes nothing");

    // An adapter made for another shape is refused before any compute, naming the module and
    // both shapes.
    let other = tmp.path().join("other");
    let wide = Model::new_random(
        rlreplay_model::ModelConfig {
            hidden_size: 48,
            ..with.config().clone()
        },
        1,
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    with_adapter(wide, &["q_proj"], &other);
    let o = rlreplay(&[
        "logprobs",
        "--model",
        &base.display().to_string(),
        "--input",
        &input.display().to_string(),
        "--adapter",
        &other.display().to_string(),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("self_attn.q_proj") && err.contains("[2, 48]") && err.contains("[2, 32]"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // A missing adapter directory is named.
    let o = rlreplay(&[
        "logprobs",
        "--model",
        &base.display().to_string(),
        "--input",
        &input.display().to_string(),
        "--adapter",
        "/nonexistent/adapter",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("/nonexistent/adapter"),
        "{err}"
    );
}

#[test]
fn generate_and_eval_with_an_adapter_sample_the_merged_model() {
    let tmp = tempfile::tempdir().unwrap();
    let (base, adapter, _, merged) = setup(tmp.path());
    let prompts = tmp.path().join("p.jsonl");
    std::fs::write(&prompts, "{\"prompt\": \"What is 2+3?\"}\n").unwrap();
    let generate = |model: &Path, adapter: Option<&Path>, out: &Path| {
        let mut args = vec![
            "generate".to_string(),
            "--model".into(),
            model.display().to_string(),
            "--prompts".into(),
            prompts.display().to_string(),
            "--n".into(),
            "4".into(),
            "--max-new-tokens".into(),
            "8".into(),
            "--seed".into(),
            "3".into(),
            "--out".into(),
            out.display().to_string(),
        ];
        if let Some(a) = adapter {
            args.extend(["--adapter".into(), a.display().to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ok(&rlreplay(&args));
        read_shard(&shard_path(out, 0), 0, &ReadOptions::new([]))
            .unwrap()
            .0
    };
    let a = generate(&base, Some(&adapter), &tmp.path().join("a"));
    let m = generate(&merged, None, &tmp.path().join("m"));
    let b = generate(&base, None, &tmp.path().join("b"));
    assert_eq!(a.response_tokens, m.response_tokens);
    assert_ne!(a.response_tokens, b.response_tokens);
    for i in 0..a.len() {
        for (x, y) in a.log_probs(i).iter().zip(m.log_probs(i)) {
            assert!((x - y).abs() < 1e-4, "{x} vs {y}");
        }
    }
    // eval takes the same flag.
    let data = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../rlreplay-eval/tests/fixtures/verl_val.parquet");
    ok(&rlreplay(&[
        "eval",
        "--model",
        &base.display().to_string(),
        "--adapter",
        &adapter.display().to_string(),
        "--data",
        &data.display().to_string(),
        "--n",
        "2",
        "--max-new-tokens",
        "4",
        "--out",
        &tmp.path().join("eval").display().to_string(),
    ]));
    assert!(tmp.path().join("eval/metrics.json").is_file());
}

#[test]
fn audit_with_an_adapter_audits_the_adapted_policy() {
    let tmp = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../rlreplay-model/tests/fixtures");
    let base = fixtures.join("tiny_tied");
    let adapter = tmp.path().join("adapter");
    let loaded = Model::load(&base, DType::F64, &Device::Cpu).unwrap();
    with_adapter(loaded, &["q_proj", "down_proj"], &adapter);
    let merged = tmp.path().join("merged");
    let mut m = Model::load(&base, DType::F64, &Device::Cpu).unwrap();
    m.load_adapter(&adapter).unwrap();
    m.merge_lora().unwrap();
    m.save_hf(&merged).unwrap();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/audit");
    let audit = |policy: &Path, adapter: Option<&Path>| -> Value {
        let mut args = vec![
            "audit".to_string(),
            data.display().to_string(),
            "--policy".into(),
            policy.display().to_string(),
            "--eos".into(),
            "1".into(),
            "--dtype".into(),
            "f64".into(),
            "--json".into(),
        ];
        if let Some(a) = adapter {
            args.extend(["--adapter".into(), a.display().to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = ok(&rlreplay(&args));
        serde_json::from_str(out.lines().last().unwrap()).unwrap()
    };
    let (a, m, b) = (
        audit(&base, Some(&adapter)),
        audit(&merged, None),
        audit(&base, None),
    );
    let kl = |v: &Value| v["audit/complete/kl/k3"].as_f64().unwrap();
    assert!((kl(&a) - kl(&m)).abs() < 1e-9, "{} vs {}", kl(&a), kl(&m));
    assert!((kl(&a) - kl(&b)).abs() > 1e-6);
}
