//! Shared helpers: tiny random models saved as Hugging Face directories, in-process servers on
//! 127.0.0.1 port 0, and JSON requests.

use std::path::{Path, PathBuf};

use rlreplay_model::generate::Decoder;
use rlreplay_model::{DType, Device, LoraConfig, Model, ModelConfig};
use rlreplay_serve::{BoundServer, ServeConfig, ServerHandle};
use serde_json::Value;

/// A random tiny Qwen3 (vocab 512, context 4096) saved into `dir`, with end-of-sequence id 7.
pub fn tiny_model(dir: &Path, seed: u64) -> Model {
    let mut cfg = ModelConfig::tiny();
    cfg.extra.insert("eos_token_id".into(), Value::from(7));
    let model = Model::new_random(cfg, seed, DType::F32, &Device::Cpu).unwrap();
    model.save_hf(dir).unwrap();
    model
}

/// A one-layer random model with Qwen3's vocabulary and the real tokenizer files.
pub fn qwen3_vocab_model(dir: &Path) -> Model {
    let mut cfg = ModelConfig {
        vocab_size: 151_936,
        hidden_size: 32,
        intermediate_size: 64,
        num_hidden_layers: 1,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: 16,
        ..ModelConfig::tiny()
    };
    cfg.extra
        .insert("eos_token_id".into(), serde_json::json!([151645, 151643]));
    let model = Model::new_random(cfg, 5, DType::F32, &Device::Cpu).unwrap();
    model.save_hf(dir).unwrap();
    let tok = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/qwen3");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tok.join(f), dir.join(f))
            .expect("the Qwen3 tokenizer files (run scripts/install-tokenizer.sh)");
    }
    model
}

/// A LoRA adapter of rank `r` on `targets` for the model saved in `base`, with a non-zero
/// `lora_B` drawn from `seed` (a fresh adapter's is zero), saved into `dir` as PEFT writes it.
pub fn save_adapter(base: &Path, dir: &Path, r: usize, targets: &[&str], seed: u64) {
    let mut m = Model::load(base, DType::F32, &Device::Cpu).unwrap();
    m.add_lora(LoraConfig::new(r, 2.0 * r as f64, targets).unwrap(), seed)
        .unwrap();
    for i in 0..m.params().len() {
        let p = m.params()[i].clone();
        if p.name.contains("lora_B") {
            let bytes: Vec<u8> = (0..p.var.elem_count())
                .flat_map(|j| {
                    let x = ((seed as usize * 31 + i * 13 + j * 7) as f32 * 0.37).sin();
                    (0.05 * x).to_le_bytes()
                })
                .collect();
            m.set_weight_bytes(i, DType::F32, &bytes).unwrap();
        }
    }
    m.save_adapter(dir, &base.display().to_string()).unwrap();
}

/// The decoder of the model saved in `base` with the adapter of `adapter` loaded
/// ([`Model::load_adapter`]): what a request on that adapter must sample.
pub fn adapter_decoder(base: &Path, adapter: &Path) -> Decoder {
    let mut m = Model::load(base, DType::F32, &Device::Cpu).unwrap();
    m.load_adapter(adapter).unwrap();
    Decoder::new(&m).unwrap()
}

/// Serves `model` on 127.0.0.1, any free port.
pub fn serve(model: &Path, tweak: impl FnOnce(&mut ServeConfig)) -> ServerHandle {
    let mut cfg = ServeConfig::new(model);
    cfg.port = 0;
    tweak(&mut cfg);
    BoundServer::bind(cfg).unwrap().spawn().unwrap()
}

/// The decoder of a saved model, for local reference generations.
pub fn decoder(model: &Model) -> Decoder {
    Decoder::new(model).unwrap()
}

/// A response: status and JSON body.
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

fn read(r: Result<ureq::Response, ureq::Error>) -> Reply {
    let resp = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("transport error: {e}"),
    };
    let status = resp.status();
    let text = resp.into_string().unwrap();
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    Reply { status, body }
}

/// POSTs JSON.
pub fn post(url: &str, path: &str, body: &Value) -> Reply {
    read(ureq::post(&format!("{url}{path}")).send_json(body.clone()))
}

/// POSTs raw bytes.
pub fn post_raw(url: &str, path: &str, body: &[u8], headers: &[(&str, &str)]) -> Reply {
    let mut req = ureq::post(&format!("{url}{path}")).set("content-type", "application/json");
    for (k, v) in headers {
        req = req.set(k, v);
    }
    read(req.send_bytes(body))
}

/// GETs.
pub fn get(url: &str, path: &str) -> Reply {
    read(ureq::get(&format!("{url}{path}")).call())
}

/// The ids in vLLM `token_id:N` strings.
pub fn placeholder_ids(tokens: &Value) -> Vec<u32> {
    tokens
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            t.as_str()
                .unwrap()
                .strip_prefix("token_id:")
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect()
}

/// A JSON array of numbers as f32s.
pub fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// A JSON array of numbers as u32s.
pub fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}
