//! Conversion of small GGUF files written here with candle's writer: a tiny llama of 2 layers
//! (hidden 64, Q8_0 / Q4_1 / F32 tensors, a small byte-level BPE vocabulary), Qwen2 and Qwen3
//! variants, every supported tensor type, and damaged files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value as G};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use super::*;

const CHAT_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}";

/// Special tokens (types), then the 256 byte-level characters, then the merged tokens.
const SPECIALS: [(&str, i32); 4] = [
    ("<|endoftext|>", 3),
    ("<|im_start|>", 3),
    ("<|im_end|>", 3),
    ("<think>", 4),
];
const MERGES: [&str; 7] = ["1 2", "W h", "Wh a", "Wha t", "Ġ i", "Ġi s", "Ġ +"];

fn vocabulary() -> (Vec<String>, Vec<i32>) {
    let mut tokens: Vec<String> = SPECIALS.iter().map(|(t, _)| t.to_string()).collect();
    let mut types: Vec<i32> = SPECIALS.iter().map(|(_, k)| *k).collect();
    for b in 0..=255u8 {
        tokens.push(tokenizer::byte_char(b).to_string());
        types.push(1);
    }
    for m in MERGES {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    (tokens, types)
}

fn id_of(token: &str) -> u32 {
    let (tokens, _) = vocabulary();
    tokens.iter().position(|t| t == token).unwrap() as u32
}

/// Deterministic values in about [-1, 1].
fn values(shape: &[usize], seed: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| ((i * 7919 + seed * 104_729) as f32 * 0.001).sin())
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

/// llama.cpp's `permute(w, n_head, n_head_kv)` of `convert_hf_to_gguf.py`, on rows.
fn permute_rows(t: &Tensor, heads: usize) -> Tensor {
    let dims = t.dims().to_vec();
    let cols: usize = dims[1..].iter().product();
    t.reshape((heads, 2, dims[0] / heads / 2, cols))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape(dims)
        .unwrap()
}

/// A small GGUF model to write.
#[derive(Clone)]
struct Tiny {
    arch: &'static str,
    layers: usize,
    hidden: usize,
    ffn: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    pre: &'static str,
    lm_head: bool,
    qkv_bias: bool,
    /// Storage type of each weight matrix (norms and biases are F32).
    quant: fn(&str) -> GgmlDType,
    /// GGUF tensors left out.
    drop: Vec<&'static str>,
    /// GGUF tensors added (name, HF-order shape).
    extra: Vec<(&'static str, Vec<usize>)>,
    /// Shapes replaced (name, HF-order shape).
    reshape: Vec<(&'static str, Vec<usize>)>,
    /// Metadata replaced or added.
    meta: Vec<(&'static str, G)>,
    /// Metadata left out.
    drop_meta: Vec<&'static str>,
}

fn q8_q4(name: &str) -> GgmlDType {
    if name == "token_embd.weight" {
        GgmlDType::Q8_0
    } else {
        GgmlDType::Q4_1
    }
}

impl Tiny {
    fn llama() -> Self {
        Self {
            arch: "llama",
            layers: 2,
            hidden: 64,
            ffn: 128,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            pre: "smollm",
            lm_head: false,
            qkv_bias: false,
            quant: q8_q4,
            drop: vec![],
            extra: vec![],
            reshape: vec![],
            meta: vec![],
            drop_meta: vec![],
        }
    }

    fn qwen3() -> Self {
        Self {
            arch: "qwen3",
            head_dim: 32,
            pre: "qwen2",
            ..Self::llama()
        }
    }

    fn qwen2() -> Self {
        Self {
            arch: "qwen2",
            pre: "qwen2",
            qkv_bias: true,
            ..Self::llama()
        }
    }

    fn vocab(&self) -> usize {
        vocabulary().0.len()
    }

    /// The GGUF tensors (name, HF-order shape, whether llama.cpp permutes its rows over how many
    /// heads).
    fn tensors(&self) -> Vec<(String, Vec<usize>, Option<usize>)> {
        let (d, q, kv) = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
        );
        let perm = |h: usize| (self.arch == "llama").then_some(h);
        let mut v = vec![
            ("token_embd.weight".to_string(), vec![self.vocab(), d], None),
            ("output_norm.weight".to_string(), vec![d], None),
        ];
        if self.lm_head {
            v.push(("output.weight".into(), vec![self.vocab(), d], None));
        }
        for n in 0..self.layers {
            let b = |s: &str| format!("blk.{n}.{s}");
            v.push((b("attn_norm.weight"), vec![d], None));
            v.push((b("attn_q.weight"), vec![q, d], perm(self.heads)));
            v.push((b("attn_k.weight"), vec![kv, d], perm(self.kv_heads)));
            v.push((b("attn_v.weight"), vec![kv, d], None));
            v.push((b("attn_output.weight"), vec![d, q], None));
            if self.qkv_bias {
                v.push((b("attn_q.bias"), vec![q], perm(self.heads)));
                v.push((b("attn_k.bias"), vec![kv], perm(self.kv_heads)));
                v.push((b("attn_v.bias"), vec![kv], None));
            }
            if self.arch == "qwen3" {
                v.push((b("attn_q_norm.weight"), vec![self.head_dim], None));
                v.push((b("attn_k_norm.weight"), vec![self.head_dim], None));
            }
            v.push((b("ffn_norm.weight"), vec![d], None));
            v.push((b("ffn_gate.weight"), vec![self.ffn, d], None));
            v.push((b("ffn_up.weight"), vec![self.ffn, d], None));
            v.push((b("ffn_down.weight"), vec![d, self.ffn], None));
        }
        v.retain(|(n, _, _)| !self.drop.contains(&n.as_str()));
        for (name, shape) in &self.reshape {
            if let Some(t) = v.iter_mut().find(|t| t.0 == *name) {
                t.1 = shape.clone();
            }
        }
        for (name, shape) in &self.extra {
            v.push((name.to_string(), shape.clone(), None));
        }
        v
    }

    fn metadata(&self) -> Vec<(String, G)> {
        let (tokens, types) = vocabulary();
        let p = self.arch;
        let u = |v: usize| G::U32(v as u32);
        let mut m: Vec<(String, G)> = vec![
            ("general.architecture".into(), G::String(self.arch.into())),
            ("general.name".into(), G::String("Tiny".into())),
            (format!("{p}.block_count"), u(self.layers)),
            (format!("{p}.context_length"), u(2048)),
            (format!("{p}.embedding_length"), u(self.hidden)),
            (format!("{p}.feed_forward_length"), u(self.ffn)),
            (format!("{p}.attention.head_count"), u(self.heads)),
            (format!("{p}.attention.head_count_kv"), u(self.kv_heads)),
            (format!("{p}.rope.freq_base"), G::F32(100_000.0)),
            (
                format!("{p}.attention.layer_norm_rms_epsilon"),
                G::F32(1e-5),
            ),
            (format!("{p}.vocab_size"), u(tokens.len())),
            ("tokenizer.ggml.model".into(), G::String("gpt2".into())),
            ("tokenizer.ggml.pre".into(), G::String(self.pre.into())),
            (
                "tokenizer.ggml.tokens".into(),
                G::Array(tokens.into_iter().map(G::String).collect()),
            ),
            (
                "tokenizer.ggml.token_type".into(),
                G::Array(types.into_iter().map(G::I32).collect()),
            ),
            (
                "tokenizer.ggml.merges".into(),
                G::Array(MERGES.iter().map(|m| G::String(m.to_string())).collect()),
            ),
            ("tokenizer.ggml.bos_token_id".into(), u(1)),
            ("tokenizer.ggml.eos_token_id".into(), u(2)),
            ("tokenizer.ggml.unknown_token_id".into(), u(0)),
            ("tokenizer.ggml.padding_token_id".into(), u(2)),
            ("tokenizer.ggml.add_bos_token".into(), G::Bool(false)),
            (
                "tokenizer.chat_template".into(),
                G::String(CHAT_TEMPLATE.into()),
            ),
        ];
        if self.head_dim * self.heads != self.hidden {
            m.push((format!("{p}.attention.key_length"), u(self.head_dim)));
            m.push((format!("{p}.attention.value_length"), u(self.head_dim)));
        }
        m.retain(|(k, _)| !self.drop_meta.contains(&k.as_str()));
        for (k, v) in &self.meta {
            match m.iter_mut().find(|(key, _)| key == k) {
                Some(e) => e.1 = v.clone(),
                None => m.push((k.to_string(), v.clone())),
            }
        }
        m
    }

    /// Writes the file; returns each GGUF tensor as written, with its heads of permutation.
    fn write(&self, path: &Path) -> HashMap<String, (QTensor, Option<usize>)> {
        let mut written = HashMap::new();
        let mut order = Vec::new();
        for (i, (name, shape, perm)) in self.tensors().into_iter().enumerate() {
            let hf = values(&shape, i);
            let gguf = match perm {
                Some(h) => permute_rows(&hf, h),
                None => hf,
            };
            let dtype = if shape.len() == 1 {
                GgmlDType::F32
            } else {
                (self.quant)(&name)
            };
            let q = QTensor::quantize(&gguf, dtype).unwrap();
            order.push(name.clone());
            written.insert(name, (q, perm));
        }
        let meta = self.metadata();
        let meta_refs: Vec<(&str, &G)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let tensor_refs: Vec<(&str, &QTensor)> =
            order.iter().map(|n| (n.as_str(), &written[n].0)).collect();
        let mut f = std::fs::File::create(path).unwrap();
        gguf_file::write(&mut f, &meta_refs, &tensor_refs).unwrap();
        written
    }
}

/// A temporary directory with `model.gguf` written from `tiny`, and the output path `out`.
struct Case {
    dir: tempfile::TempDir,
    written: HashMap<String, (QTensor, Option<usize>)>,
}

impl Case {
    fn new(tiny: &Tiny) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let written = tiny.write(&dir.path().join("model.gguf"));
        Self { dir, written }
    }

    fn gguf(&self) -> PathBuf {
        self.dir.path().join("model.gguf")
    }

    fn out(&self) -> PathBuf {
        self.dir.path().join("out")
    }

    fn convert(&self) -> Result<ConvertReport> {
        convert(self.gguf(), self.out(), &ConvertOptions::default())
    }

    fn json(&self, file: &str) -> Value {
        let text = std::fs::read_to_string(self.out().join(file)).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn weights(&self) -> HashMap<String, Tensor> {
        candle_core::safetensors::load(self.out().join("model.safetensors"), &Device::Cpu).unwrap()
    }

    /// What the converter must write for a GGUF tensor: candle's dequantization, rows unpermuted.
    fn expected(&self, gguf: &str) -> Tensor {
        let (q, perm) = &self.written[gguf];
        let t = q.dequantize(&Device::Cpu).unwrap();
        match perm {
            Some(h) => unpermute_rows(&t, *h).unwrap(),
            None => t,
        }
    }

    /// Patches `bytes` into the file at `at`.
    fn patch(&self, at: usize, bytes: &[u8]) {
        let mut data = std::fs::read(self.gguf()).unwrap();
        data[at..at + bytes.len()].copy_from_slice(bytes);
        std::fs::write(self.gguf(), data).unwrap();
    }

    /// The offset just after the length-prefixed string `s` in the file.
    fn after(&self, s: &str) -> usize {
        let data = std::fs::read(self.gguf()).unwrap();
        let mut needle = (s.len() as u64).to_le_bytes().to_vec();
        needle.extend_from_slice(s.as_bytes());
        let at = data
            .windows(needle.len())
            .position(|w| w == needle.as_slice())
            .unwrap_or_else(|| panic!("{s} not in the file"));
        at + needle.len()
    }

    /// Converts, expecting an error containing each of `needles`, and no output left behind.
    fn refused(&self, needles: &[&str]) -> String {
        let err = match self.convert() {
            Ok(_) => panic!("converted, expected an error with {needles:?}"),
            Err(e) => e.to_string(),
        };
        for n in needles {
            assert!(err.contains(n), "error {err:?} does not mention {n:?}");
        }
        assert!(!self.out().exists(), "{err}: output written");
        let left: Vec<_> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "model.gguf")
            .collect();
        assert!(left.is_empty(), "{err}: left behind {left:?}");
        err
    }
}

/// The Hugging Face names of a layer's tensors and the GGUF names they come from.
fn layer_names(n: usize, arch: &str, bias: bool) -> Vec<(String, String)> {
    let mut v = vec![
        ("attn_norm.weight", "input_layernorm.weight"),
        ("ffn_norm.weight", "post_attention_layernorm.weight"),
        ("attn_q.weight", "self_attn.q_proj.weight"),
        ("attn_k.weight", "self_attn.k_proj.weight"),
        ("attn_v.weight", "self_attn.v_proj.weight"),
        ("attn_output.weight", "self_attn.o_proj.weight"),
        ("ffn_gate.weight", "mlp.gate_proj.weight"),
        ("ffn_up.weight", "mlp.up_proj.weight"),
        ("ffn_down.weight", "mlp.down_proj.weight"),
    ];
    if arch == "qwen3" {
        v.push(("attn_q_norm.weight", "self_attn.q_norm.weight"));
        v.push(("attn_k_norm.weight", "self_attn.k_norm.weight"));
    }
    if bias {
        v.push(("attn_q.bias", "self_attn.q_proj.bias"));
        v.push(("attn_k.bias", "self_attn.k_proj.bias"));
        v.push(("attn_v.bias", "self_attn.v_proj.bias"));
    }
    v.into_iter()
        .map(|(g, h)| (format!("blk.{n}.{g}"), format!("model.layers.{n}.{h}")))
        .collect()
}

fn assert_same(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.dims(), b.dims(), "{what}: shape");
    assert_eq!(a.dtype(), b.dtype(), "{what}: dtype");
    let (a, b) = (
        a.to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap(),
        b.to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap(),
    );
    assert!(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        "{what}: values differ"
    );
}

#[test]
fn gguf_tiny_llama_converts_names_shapes_and_values() {
    let tiny = Tiny::llama();
    let case = Case::new(&tiny);
    let report = case.convert().unwrap();
    let w = case.weights();

    let mut expected = vec![
        (
            "token_embd.weight".to_string(),
            "model.embed_tokens.weight".to_string(),
        ),
        ("output_norm.weight".into(), "model.norm.weight".into()),
    ];
    for n in 0..2 {
        expected.extend(layer_names(n, "llama", false));
    }
    let mut names: Vec<&String> = w.keys().collect();
    names.sort();
    let mut want: Vec<&String> = expected.iter().map(|(_, h)| h).collect();
    want.sort();
    assert_eq!(names, want, "tensor names (tied: no lm_head)");
    for (gguf, hf) in &expected {
        assert_same(&w[hf], &case.expected(gguf), hf);
    }
    assert_eq!(w["model.layers.1.self_attn.q_proj.weight"].dims(), [64, 64]);
    assert_eq!(w["model.layers.1.self_attn.k_proj.weight"].dims(), [32, 64]);
    assert_eq!(w["model.layers.0.mlp.down_proj.weight"].dims(), [64, 128]);
    assert_eq!(w["model.embed_tokens.weight"].dims(), [tiny.vocab(), 64]);

    // The un-permuted Q and K are the Hugging Face weights up to quantization error.
    let hf_q = values(&[64, 64], 3);
    let err = (&w["model.layers.0.self_attn.q_proj.weight"] - &hf_q)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(err < 0.1, "q_proj differs from the original by {err}");

    assert_eq!(report.architecture, "llama");
    assert_eq!(report.layers, 2);
    assert_eq!(report.hidden_size, 64);
    assert_eq!(report.vocab_size, tiny.vocab());
    assert!(report.tie_word_embeddings);
    assert_eq!(report.gguf_tensors, 20);
    assert_eq!(report.tensors_written, 20);
    assert_eq!(report.quantization["Q4_1"], 14);
    assert_eq!(report.quantization["Q8_0"], 1);
    assert_eq!(report.quantization["F32"], 5);
    let params: usize = w.values().map(Tensor::elem_count).sum();
    assert_eq!(report.parameters, params as u64);
    assert_eq!(report.dtype, "float32");
    assert_eq!(report.name.as_deref(), Some("Tiny"));
}

#[test]
fn gguf_unpermute_inverts_llama_cpp_permutation() {
    // One head of 8 rows: llama.cpp interleaves the halves, rows 0 4 1 5 2 6 3 7.
    let hf = Tensor::arange(0f32, 24., &Device::Cpu)
        .unwrap()
        .reshape((8, 3))
        .unwrap();
    let gguf = permute_rows(&hf, 1);
    let rows: Vec<f32> = gguf
        .narrow(1, 0, 1)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(rows, [0., 12., 3., 15., 6., 18., 9., 21.]);
    assert_same(&unpermute_rows(&gguf, 1).unwrap(), &hf, "one head");
    // Two heads of 4 rows, and a bias (one column).
    let hf = Tensor::arange(0f32, 16., &Device::Cpu)
        .unwrap()
        .reshape((8, 2))
        .unwrap();
    assert_same(
        &unpermute_rows(&permute_rows(&hf, 2), 2).unwrap(),
        &hf,
        "two heads",
    );
    let bias = Tensor::arange(0f32, 12., &Device::Cpu).unwrap();
    let permuted = permute_rows(&bias, 3);
    assert_eq!(
        permuted.to_vec1::<f32>().unwrap(),
        [0., 2., 1., 3., 4., 6., 5., 7., 8., 10., 9., 11.]
    );
    assert_same(&unpermute_rows(&permuted, 3).unwrap(), &bias, "bias");
    assert!(unpermute_rows(&bias, 5).is_err());
}

#[test]
fn gguf_config_json_describes_the_model() {
    let case = Case::new(&Tiny::llama());
    case.convert().unwrap();
    let c = case.json("config.json");
    let vocab = vocabulary().0.len();
    let want = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "hidden_act": "silu", "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "rope_scaling": null,
        "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
        "attention_bias": false, "attention_dropout": 0.0, "mlp_bias": false, "pretraining_tp": 1,
        "tie_word_embeddings": true, "torch_dtype": "float32", "use_cache": true,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
    });
    assert_eq!(c, want);
    assert_eq!(
        case.json("generation_config.json"),
        serde_json::json!({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2})
    );
}

#[test]
fn gguf_tokenizer_json_loads_and_encodes() {
    let case = Case::new(&Tiny::llama());
    let report = case.convert().unwrap();
    assert_eq!(report.tokenizer_pre, "smollm");
    assert_eq!(report.merges, MERGES.len());
    let tok = tokenizers::Tokenizer::from_file(case.out().join("tokenizer.json")).unwrap();
    let ids = |text: &str| tok.encode(text, false).unwrap().get_ids().to_vec();

    // One digit per token, although "1 2" is a merge.
    let digits: Vec<u32> = ["1", "2", "3", "4", "5"].iter().map(|d| id_of(d)).collect();
    assert_eq!(ids("12345"), digits);
    let text = "What is 7 + 5?";
    let enc = ids(text);
    assert_eq!(enc[..2], [id_of("What"), id_of("Ġis")]);
    assert!(enc.contains(&id_of("Ġ+")));
    assert_eq!(tok.decode(&enc, false).unwrap(), text);
    let unicode = "naïve ∑ — 日本";
    assert_eq!(tok.decode(&ids(unicode), false).unwrap(), unicode);
    // Control tokens whole and special, user-defined ones whole and not special.
    let chat = ids("<|im_start|>user\nhi<think><|im_end|>");
    assert_eq!(chat[0], 1);
    assert_eq!(chat[chat.len() - 2..], [3, 2]);
    assert_eq!(tok.decode(&chat, true).unwrap(), "user\nhi<think>");
    assert_eq!(tok.get_vocab_size(true), vocabulary().0.len());

    let tc = case.json("tokenizer_config.json");
    assert_eq!(tc["chat_template"], CHAT_TEMPLATE);
    assert_eq!(tc["bos_token"], "<|im_start|>");
    assert_eq!(tc["eos_token"], "<|im_end|>");
    assert_eq!(tc["pad_token"], "<|im_end|>");
    assert_eq!(tc["unk_token"], "<|endoftext|>");
    assert_eq!(tc["add_bos_token"], false);
    assert_eq!(tc["model_max_length"], 2048);
    assert_eq!(tc["added_tokens_decoder"]["1"]["content"], "<|im_start|>");
    assert_eq!(tc["added_tokens_decoder"]["3"]["special"], false);
}

#[test]
fn gguf_pre_tokenizers_split_as_named() {
    // gpt2 keeps digit runs together (the "1 2" merge applies); qwen2 and llama-bpe split them
    // (one digit, up to three).
    for (pre, first) in [
        ("gpt2", "12"),
        ("qwen2", "1"),
        ("llama-bpe", "12"),
        ("default", "12"),
    ] {
        let tiny = Tiny {
            pre,
            ..Tiny::llama()
        };
        let case = Case::new(&tiny);
        case.convert().unwrap();
        let tok = tokenizers::Tokenizer::from_file(case.out().join("tokenizer.json")).unwrap();
        let enc = tok.encode("12345 What is", false).unwrap();
        assert_eq!(enc.get_ids()[0], id_of(first), "{pre}");
        assert_eq!(
            tok.decode(enc.get_ids(), false).unwrap(),
            "12345 What is",
            "{pre}"
        );
    }
}

#[test]
fn gguf_bos_is_added_when_the_file_asks() {
    let tiny = Tiny {
        meta: vec![("tokenizer.ggml.add_bos_token", G::Bool(true))],
        ..Tiny::llama()
    };
    let case = Case::new(&tiny);
    case.convert().unwrap();
    let tok = tokenizers::Tokenizer::from_file(case.out().join("tokenizer.json")).unwrap();
    assert_eq!(tok.encode("hi", true).unwrap().get_ids()[0], 1);
    assert_eq!(case.json("tokenizer_config.json")["add_bos_token"], true);
}

#[test]
fn gguf_bf16_output_rounds_the_dequantized_values() {
    let case = Case::new(&Tiny::llama());
    let report = convert(
        case.gguf(),
        case.out(),
        &ConvertOptions { dtype: DType::BF16 },
    )
    .unwrap();
    assert_eq!(report.dtype, "bfloat16");
    assert_eq!(case.json("config.json")["torch_dtype"], "bfloat16");
    let w = case.weights();
    for gguf in [
        "token_embd.weight",
        "blk.1.attn_k.weight",
        "output_norm.weight",
    ] {
        let hf = match gguf {
            "token_embd.weight" => "model.embed_tokens.weight",
            "output_norm.weight" => "model.norm.weight",
            _ => "model.layers.1.self_attn.k_proj.weight",
        };
        let want = case.expected(gguf).to_dtype(DType::BF16).unwrap();
        assert_same(&w[hf], &want, hf);
    }
}

#[test]
fn gguf_untied_lm_head_is_written() {
    let case = Case::new(&Tiny {
        lm_head: true,
        ..Tiny::llama()
    });
    let report = case.convert().unwrap();
    assert!(!report.tie_word_embeddings);
    assert_same(
        &case.weights()["lm_head.weight"],
        &case.expected("output.weight"),
        "lm_head",
    );
    assert_eq!(case.json("config.json")["tie_word_embeddings"], false);
}

#[test]
fn gguf_llama_attention_biases_are_unpermuted_and_completed() {
    let case = Case::new(&Tiny {
        qkv_bias: true,
        ..Tiny::llama()
    });
    case.convert().unwrap();
    let w = case.weights();
    assert_same(
        &w["model.layers.0.self_attn.q_proj.bias"],
        &case.expected("blk.0.attn_q.bias"),
        "q bias",
    );
    // transformers' attention_bias covers o_proj too: the missing bias is zero.
    let o = &w["model.layers.1.self_attn.o_proj.bias"];
    assert_eq!(o.dims(), [64]);
    assert_eq!(
        o.abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap(),
        0.
    );
    assert_eq!(case.json("config.json")["attention_bias"], true);
}

#[test]
fn gguf_qwen3_and_qwen2_convert_unpermuted_and_load() {
    for tiny in [Tiny::qwen3(), Tiny::qwen2()] {
        let case = Case::new(&tiny);
        let report = case.convert().unwrap();
        assert_eq!(report.architecture, tiny.arch);
        let w = case.weights();
        for n in 0..2 {
            for (gguf, hf) in layer_names(n, tiny.arch, tiny.qkv_bias) {
                assert_same(&w[&hf], &case.expected(&gguf), &hf);
            }
        }
        // Not permuted: the written q_proj is the file's, dequantized.
        let (q, perm) = &case.written["blk.0.attn_q.weight"];
        assert!(perm.is_none());
        assert_same(
            &w["model.layers.0.self_attn.q_proj.weight"],
            &q.dequantize(&Device::Cpu).unwrap(),
            "q_proj",
        );
        let c = case.json("config.json");
        assert_eq!(c["model_type"], tiny.arch);
        assert_eq!(c["head_dim"], tiny.head_dim);
        let model = crate::Model::load(case.out(), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(model.config().head_dim, tiny.head_dim);
        assert_eq!(case.json("tokenizer.json")["normalizer"]["type"], "NFC");
    }
}

#[test]
fn gguf_every_supported_type_dequantizes_exactly() {
    // Rows of 256 for the k-quants; one weight per type.
    fn by_name(name: &str) -> GgmlDType {
        match name {
            "token_embd.weight" => GgmlDType::F16,
            "blk.0.attn_q.weight" => GgmlDType::Q4K,
            "blk.0.attn_k.weight" => GgmlDType::Q5K,
            "blk.0.attn_v.weight" => GgmlDType::Q6K,
            "blk.0.attn_output.weight" => GgmlDType::Q2K,
            "blk.0.ffn_gate.weight" => GgmlDType::Q3K,
            "blk.0.ffn_up.weight" => GgmlDType::Q5_0,
            "blk.0.ffn_down.weight" => GgmlDType::Q5_1,
            "output.weight" => GgmlDType::BF16,
            "blk.1.attn_q.weight" => GgmlDType::Q4_0,
            "blk.1.attn_k.weight" => GgmlDType::F32,
            "blk.1.attn_v.weight" => GgmlDType::Q4_1,
            _ => GgmlDType::Q8_0,
        }
    }
    let tiny = Tiny {
        hidden: 256,
        ffn: 256,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        lm_head: true,
        quant: by_name,
        ..Tiny::llama()
    };
    let case = Case::new(&tiny);
    let report = case.convert().unwrap();
    assert_eq!(report.quantization.len(), 13, "{:?}", report.quantization);
    let w = case.weights();
    let mut all = vec![
        (
            "token_embd.weight".to_string(),
            "model.embed_tokens.weight".to_string(),
        ),
        ("output.weight".into(), "lm_head.weight".into()),
    ];
    all.extend(layer_names(0, "llama", false));
    all.extend(layer_names(1, "llama", false));
    for (gguf, hf) in all {
        assert_same(&w[&hf], &case.expected(&gguf), &hf);
    }
}

#[test]
fn gguf_existing_output_is_refused_unless_empty() {
    let case = Case::new(&Tiny::llama());
    std::fs::create_dir(case.out()).unwrap();
    std::fs::write(case.out().join("keep.txt"), "mine").unwrap();
    let err = case.convert().unwrap_err().to_string();
    assert!(err.contains("not an empty directory"), "{err}");
    assert_eq!(
        std::fs::read_to_string(case.out().join("keep.txt")).unwrap(),
        "mine"
    );
    std::fs::remove_file(case.out().join("keep.txt")).unwrap();
    case.convert().unwrap();
    assert!(case.out().join("model.safetensors").is_file());
}

#[test]
fn gguf_truncated_files_are_refused() {
    let case = Case::new(&Tiny::llama());
    let data = std::fs::read(case.gguf()).unwrap();
    std::fs::write(case.gguf(), &data[..data.len() - 10]).unwrap();
    case.refused(&["model.gguf", "runs past the end of the file", "truncated"]);
    std::fs::write(case.gguf(), &data[..200]).unwrap();
    case.refused(&["model.gguf", "truncated or corrupt"]);
    std::fs::write(case.gguf(), &data[..3]).unwrap();
    case.refused(&["magic number"]);
}

#[test]
fn gguf_bad_magic_and_version_are_refused() {
    let case = Case::new(&Tiny::llama());
    case.patch(0, b"GGML");
    case.refused(&["not a GGUF file"]);
    let case = Case::new(&Tiny::llama());
    case.patch(4, &7u32.to_le_bytes());
    case.refused(&["unsupported GGUF version 7"]);
}

#[test]
fn gguf_absurd_header_counts_are_refused() {
    let case = Case::new(&Tiny::llama());
    case.patch(8, &(1u64 << 40).to_le_bytes());
    case.refused(&["tensors, more than the limit"]);
    let case = Case::new(&Tiny::llama());
    case.patch(8, &60_000u64.to_le_bytes());
    case.refused(&["60000 tensor descriptions", "truncated or corrupt"]);
    let case = Case::new(&Tiny::llama());
    case.patch(16, &(u64::MAX).to_le_bytes());
    case.refused(&["metadata entries, more than the limit"]);
}

#[test]
fn gguf_absurd_lengths_are_refused() {
    // An array length: after the key, its type (u32) and element type (u32).
    let case = Case::new(&Tiny::llama());
    let at = case.after("tokenizer.ggml.tokens") + 8;
    case.patch(at, &(1u64 << 40).to_le_bytes());
    case.refused(&["tokenizer.ggml.tokens", "elements"]);
    // A string length: after the key and its type.
    let case = Case::new(&Tiny::llama());
    let at = case.after("general.architecture") + 4;
    case.patch(at, &(1u64 << 50).to_le_bytes());
    case.refused(&["general.architecture", "truncated or corrupt"]);
    // A tensor's first dimension: after its name and its dimension count.
    let case = Case::new(&Tiny::llama());
    let at = case.after("blk.0.attn_q.weight") + 4;
    case.patch(at, &(1u64 << 62).to_le_bytes());
    case.refused(&["blk.0.attn_q.weight"]);
    // A tensor's data offset: after its name, count, two dimensions and type.
    let case = Case::new(&Tiny::llama());
    let at = case.after("blk.1.ffn_down.weight") + 4 + 16 + 4;
    case.patch(at, &(1u64 << 30).to_le_bytes());
    case.refused(&["blk.1.ffn_down.weight", "runs past the end of the file"]);
}

#[test]
fn gguf_unknown_or_unsupported_types_are_refused() {
    let case = Case::new(&Tiny::llama());
    let at = case.after("blk.0.ffn_up.weight") + 4 + 16;
    case.patch(at, &99u32.to_le_bytes());
    case.refused(&["blk.0.ffn_up.weight", "unknown type id 99"]);
    let case = Case::new(&Tiny::llama());
    case.patch(at, &16u32.to_le_bytes());
    case.refused(&["blk.0.ffn_up.weight", "IQ2_XXS", "cannot be converted"]);
}

#[test]
fn gguf_bad_metadata_is_refused() {
    let cases: Vec<(Tiny, Vec<&str>)> = vec![
        (
            Tiny {
                meta: vec![("general.architecture", G::String("gptneox".into()))],
                ..Tiny::llama()
            },
            vec!["general.architecture", "gptneox", "not supported"],
        ),
        (
            Tiny {
                meta: vec![("general.alignment", G::U32(0))],
                ..Tiny::llama()
            },
            vec!["general.alignment", "power of two"],
        ),
        (
            Tiny {
                meta: vec![("tokenizer.ggml.pre", G::String("mystery".into()))],
                ..Tiny::llama()
            },
            vec!["tokenizer.ggml.pre", "mystery"],
        ),
        (
            Tiny {
                meta: vec![("tokenizer.ggml.model", G::String("llama".into()))],
                ..Tiny::llama()
            },
            vec!["tokenizer.ggml.model", "\"llama\""],
        ),
        (
            Tiny {
                drop_meta: vec!["llama.attention.layer_norm_rms_epsilon"],
                ..Tiny::llama()
            },
            vec!["llama.attention.layer_norm_rms_epsilon is missing"],
        ),
        (
            Tiny {
                meta: vec![("llama.block_count", G::U32(4_000_000_000))],
                ..Tiny::llama()
            },
            vec!["llama.block_count", "out of range"],
        ),
        (
            Tiny {
                meta: vec![("tokenizer.ggml.eos_token_id", G::U32(100_000))],
                ..Tiny::llama()
            },
            vec!["tokenizer.ggml.eos_token_id", "outside"],
        ),
        (
            Tiny {
                meta: vec![(
                    "tokenizer.ggml.merges",
                    G::Array(vec![G::String("Ġ zz".into())]),
                )],
                ..Tiny::llama()
            },
            vec!["tokenizer.ggml.merges[0]", "zz"],
        ),
        (
            Tiny {
                meta: vec![("llama.rope.scaling.type", G::String("yarn".into()))],
                ..Tiny::llama()
            },
            vec!["llama.rope.scaling.type", "yarn"],
        ),
    ];
    for (tiny, needles) in cases {
        Case::new(&tiny).refused(&needles);
    }
}

#[test]
fn gguf_missing_misshaped_or_unexpected_tensors_are_refused() {
    let cases: Vec<(Tiny, Vec<&str>)> = vec![
        (
            Tiny {
                drop: vec!["blk.1.ffn_up.weight"],
                ..Tiny::llama()
            },
            vec![
                "blk.1.ffn_up.weight",
                "model.layers.1.mlp.up_proj.weight",
                "missing",
            ],
        ),
        (
            Tiny {
                reshape: vec![("blk.0.ffn_up.weight", vec![96, 64])],
                ..Tiny::llama()
            },
            vec!["blk.0.ffn_up.weight has shape [96, 64], expected [128, 64]"],
        ),
        (
            Tiny {
                extra: vec![("blk.2.attn_q.weight", vec![64, 64])],
                ..Tiny::llama()
            },
            vec!["unexpected tensor blk.2.attn_q.weight"],
        ),
        (
            Tiny {
                extra: vec![("rope_freqs.weight", vec![8])],
                ..Tiny::llama()
            },
            vec!["rope_freqs.weight", "not supported"],
        ),
        (
            Tiny {
                extra: vec![("blk.0.attn_q_norm.weight", vec![16])],
                ..Tiny::llama()
            },
            vec!["unexpected tensor blk.0.attn_q_norm.weight"],
        ),
    ];
    for (tiny, needles) in cases {
        Case::new(&tiny).refused(&needles);
    }
}
