//! `rlreplay convert`: a GGUF file written here (a one-layer Qwen3) becomes a model directory the
//! crate loads; the JSON report; a refused output directory and a damaged file exit 2 with the
//! reason.

use std::path::Path;
use std::process::{Command, Output};

use candle_core::quantized::gguf_file::{self, Value as G};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rlreplay_model::{DType, Model};

fn rlreplay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(args)
        .output()
        .unwrap()
}

/// A one-layer Qwen3 (hidden 32, 2 heads of 16, one key/value head, MLP 64) over a vocabulary
/// of the 256 byte-level characters (spelled as such for the printable ones) and two control
/// tokens, without merges.
fn write_gguf(path: &Path) {
    let mut tokens = vec!["<|im_start|>".to_string(), "<|im_end|>".to_string()];
    let mut types = vec![G::I32(3), G::I32(3)];
    for b in 0..=255u32 {
        let c = match b {
            0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF => char::from_u32(b),
            _ => char::from_u32(0x100 + b),
        };
        tokens.push(c.unwrap().to_string());
        types.push(G::I32(1));
    }
    let vocab = tokens.len();
    let meta: Vec<(&str, G)> = vec![
        ("general.architecture", G::String("qwen3".into())),
        ("qwen3.block_count", G::U32(1)),
        ("qwen3.context_length", G::U32(512)),
        ("qwen3.embedding_length", G::U32(32)),
        ("qwen3.feed_forward_length", G::U32(64)),
        ("qwen3.attention.head_count", G::U32(2)),
        ("qwen3.attention.head_count_kv", G::U32(1)),
        ("qwen3.rope.freq_base", G::F32(1e6)),
        ("qwen3.attention.layer_norm_rms_epsilon", G::F32(1e-6)),
        ("tokenizer.ggml.model", G::String("gpt2".into())),
        ("tokenizer.ggml.pre", G::String("qwen2".into())),
        (
            "tokenizer.ggml.tokens",
            G::Array(tokens.into_iter().map(G::String).collect()),
        ),
        ("tokenizer.ggml.token_type", G::Array(types)),
        ("tokenizer.ggml.merges", G::Array(vec![])),
        ("tokenizer.ggml.eos_token_id", G::U32(1)),
    ];
    let shapes: Vec<(&str, Vec<usize>)> = vec![
        ("token_embd.weight", vec![vocab, 32]),
        ("output_norm.weight", vec![32]),
        ("blk.0.attn_norm.weight", vec![32]),
        ("blk.0.ffn_norm.weight", vec![32]),
        ("blk.0.attn_q.weight", vec![32, 32]),
        ("blk.0.attn_k.weight", vec![16, 32]),
        ("blk.0.attn_v.weight", vec![16, 32]),
        ("blk.0.attn_output.weight", vec![32, 32]),
        ("blk.0.attn_q_norm.weight", vec![16]),
        ("blk.0.attn_k_norm.weight", vec![16]),
        ("blk.0.ffn_gate.weight", vec![64, 32]),
        ("blk.0.ffn_up.weight", vec![64, 32]),
        ("blk.0.ffn_down.weight", vec![32, 64]),
    ];
    let tensors: Vec<(&str, QTensor)> = shapes
        .into_iter()
        .map(|(name, shape)| {
            let t = Tensor::randn(0f32, 0.1, shape.as_slice(), &Device::Cpu).unwrap();
            let dtype = if shape.len() == 1 {
                GgmlDType::F32
            } else {
                GgmlDType::Q8_0
            };
            (name, QTensor::quantize(&t, dtype).unwrap())
        })
        .collect();
    let meta_refs: Vec<(&str, &G)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &meta_refs, &tensor_refs).unwrap();
}

#[test]
fn converts_a_gguf_into_a_loadable_model_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf = tmp.path().join("tiny.gguf");
    write_gguf(&gguf);
    let out = tmp.path().join("model");
    let (g, o) = (gguf.to_str().unwrap(), out.to_str().unwrap());

    let run = rlreplay(&["convert", g, "--out", o, "--dtype", "bf16", "--json"]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(report["architecture"], "qwen3");
    assert_eq!(report["dtype"], "bfloat16");
    assert_eq!(report["quantization"]["Q8_0"], 8);
    assert_eq!(report["tensors_written"], 13);
    let model = Model::load(&out, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(model.config().vocab_size, 258);
    assert_eq!(model.config().torch_dtype.as_deref(), Some("bfloat16"));

    // The human summary; an existing output directory is refused and left alone.
    let again = tmp.path().join("again");
    let run = rlreplay(&["convert", g, "--out", again.to_str().unwrap()]);
    let text = String::from_utf8(run.stdout).unwrap();
    assert!(
        text.contains("qwen3 (qwen3), 1 layers, hidden 32"),
        "{text}"
    );
    assert!(text.contains("13 written as float32"), "{text}");
    let run = rlreplay(&["convert", g, "--out", o]);
    assert_eq!(run.status.code(), Some(2));
    let err = String::from_utf8(run.stderr).unwrap();
    assert!(err.contains("not an empty directory"), "{err}");
    assert!(out.join("model.safetensors").is_file());

    // A damaged file: nothing written.
    let data = std::fs::read(&gguf).unwrap();
    std::fs::write(&gguf, &data[..data.len() / 2]).unwrap();
    let broken = tmp.path().join("broken");
    let run = rlreplay(&["convert", g, "--out", broken.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(2));
    let err = String::from_utf8(run.stderr).unwrap();
    assert!(err.contains("runs past the end of the file"), "{err}");
    assert!(!broken.exists());
}
