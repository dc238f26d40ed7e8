//! `rlreplay generate` end to end on a random Qwen3 with the real tokenizer's vocabulary.

use std::path::{Path, PathBuf};
use std::process::Command;

use rlreplay_data::{read_shard, shard_path, ReadOptions};
use rlreplay_model::{DType, Device, Model, ModelConfig, SeqPair};

/// A one-layer random model with Qwen3's vocabulary size and tokenizer files.
pub(crate) fn tiny_qwen3(dir: &Path) -> Model {
    let cfg = ModelConfig {
        vocab_size: 151_936,
        hidden_size: 32,
        intermediate_size: 64,
        num_hidden_layers: 1,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: 16,
        ..ModelConfig::tiny()
    };
    let model = Model::new_random(cfg, 5, DType::F32, &Device::Cpu).unwrap();
    model.save_hf(dir).unwrap();
    let tok = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/qwen3");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tok.join(f), dir.join(f))
            .expect("the Qwen3 tokenizer files (run scripts/install-tokenizer.sh)");
    }
    model
}

fn rlreplay(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn generate_writes_a_scored_shard_with_matching_logprobs() {
    let tmp = tempfile::tempdir().unwrap();
    let model_dir = tmp.path().join("model");
    let model = tiny_qwen3(&model_dir);
    let prompts = tmp.path().join("p.jsonl");
    std::fs::write(
        &prompts,
        "{\"prompt\": \"What is 2+3?\", \"data_source\": \"aime25\", \"ground_truth\": \"5\"}\n\
         {\"prompt\": [{\"role\": \"user\", \"content\": \"Hi\"}]}\n",
    )
    .unwrap();
    let out = tmp.path().join("out");
    let run = |out: &Path| {
        rlreplay(&[
            "generate",
            "--model",
            model_dir.to_str().unwrap(),
            "--prompts",
            prompts.to_str().unwrap(),
            "--n",
            "3",
            "--temperature",
            "0.7",
            "--top-p",
            "0.9",
            "--max-new-tokens",
            "6",
            "--seed",
            "11",
            "--out",
            out.to_str().unwrap(),
        ])
    };
    let o = run(&out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let read = |dir: &Path| {
        read_shard(&shard_path(dir, 0), 0, &ReadOptions::new([]))
            .unwrap()
            .0
    };
    let b = read(&out);
    assert_eq!(b.len(), 6);
    assert_eq!(b.groups().len(), 2);
    assert!(b.temperature.iter().all(|&t| t == Some(0.7)));
    assert!(b.top_p.iter().all(|&p| p == Some(0.9)));
    assert_eq!(b.ground_truth[0].as_deref(), Some("5"));
    assert_eq!(b.data_source[3].as_deref(), Some("unknown"));
    // The prompt is the chat-templated rendering.
    assert_eq!(&b.prompt(0)[..3], &[151644, 872, 198]);
    assert_eq!(&b.prompt(0)[b.prompt(0).len() - 3..], &[151644, 77091, 198]);
    // Recorded log-probs are the model's tempered log-probs of the sampled tokens.
    let pairs: Vec<SeqPair> = (0..b.len())
        .map(|i| SeqPair::new(b.prompt(i), b.response(i)))
        .collect();
    let want = model.logprobs(&pairs, 0.7, false).unwrap().logprobs;
    for (i, want_row) in want.iter().enumerate() {
        assert!(!b.response(i).is_empty() && b.response(i).len() <= 6);
        for (a, w) in b.log_probs(i).iter().zip(want_row) {
            assert!((f64::from(*a) - w).abs() < 1e-4, "row {i}: {a} vs {w}");
        }
    }
    // Same seed, same shard contents.
    let out2 = tmp.path().join("out2");
    assert!(run(&out2).status.success());
    let b2 = read(&out2);
    assert_eq!(b.response_tokens, b2.response_tokens);
    assert_eq!(b.rollout_log_probs, b2.rollout_log_probs);
}

#[test]
fn generate_reports_bad_input() {
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("p.jsonl");
    std::fs::write(&prompts, "{\"prompt\": 3}\n").unwrap();
    let o = rlreplay(&[
        "generate",
        "--model",
        tmp.path().to_str().unwrap(),
        "--prompts",
        prompts.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("line 1") && err.contains("`prompt`"), "{err}");
    let o = rlreplay(&[
        "generate",
        "--model",
        "m",
        "--prompts",
        prompts.to_str().unwrap(),
        "--top-p",
        "0",
    ]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("top_p"));
}
