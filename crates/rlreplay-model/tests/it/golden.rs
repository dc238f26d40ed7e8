//! The model against float64 golden values from Hugging Face transformers
//! (`scripts/golden_model.py generate`), for Qwen3, Qwen2 and Llama (with q/k/v/o biases and llama3
//! rotary scaling), tied and untied: per-token log-probs
//! and entropies, gradients of a weighted sum of log-probs, two AdamW steps with clipping, export
//! of a checkpoint that `scripts/golden_model.py check-rust-save` loads back with transformers,
//! and both sampling decoders against those log-probs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::safetensors::load;
use candle_core::Tensor;
use rlreplay_model::generate::{Decoder, KvCache};
use rlreplay_model::golden::{max_abs_diff, Golden, Pair};
use rlreplay_model::{AdamW, AdamWConfig, Architecture, DType, Device, Model};

const MODELS: [&str; 6] = [
    "tiny_tied",
    "tiny_gqa_untied",
    "qwen2_tiny_tied",
    "qwen2_tiny_gqa_untied",
    "llama_tiny_tied",
    "llama_tiny_gqa_untied",
];

/// The model crate's test fixtures.
pub(crate) fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn golden(name: &str) -> Golden {
    Golden::read(&fixtures().join(format!("{name}.golden.json"))).unwrap()
}

fn load_model(name: &str, dtype: DType) -> Model {
    Model::load(fixtures().join(name), dtype, &Device::Cpu).unwrap()
}

/// A tensor's elements as f64.
pub(crate) fn flat(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// max |a − b| / max |b| over the elements of one tensor.
fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (flat(a), flat(b));
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let diff = a
        .iter()
        .zip(&b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
    diff / scale.max(f64::MIN_POSITIVE)
}

fn check_logprobs(dtype: DType, tol: f64) {
    for name in MODELS {
        let g = golden(name);
        let model = load_model(name, dtype);
        let out = model.logprobs(&g.pairs(), g.temperature, true).unwrap();
        let d_lp = max_abs_diff(&out.logprobs, &g.logprobs);
        let d_ent = max_abs_diff(out.entropy.as_ref().unwrap(), &g.entropy);
        assert!(d_lp < tol, "{name} {dtype:?}: log-probs differ by {d_lp:e}");
        assert!(
            d_ent < tol,
            "{name} {dtype:?}: entropies differ by {d_ent:e}"
        );
    }
}

fn check_grads(dtype: DType, tol: f64) {
    for name in MODELS {
        let g = golden(name);
        let mut model = load_model(name, dtype);
        let expected = load(
            fixtures().join(format!("{name}.grads.safetensors")),
            &Device::Cpu,
        )
        .unwrap();
        let lps = model
            .forward_backward(&g.pairs(), &g.weights, g.temperature)
            .unwrap();
        let d_lp = max_abs_diff(&lps, &g.logprobs);
        assert!(d_lp < tol, "{name} {dtype:?}: log-probs differ by {d_lp:e}");
        assert_eq!(expected.len(), model.params().len());
        for (p, grad) in model.params().iter().zip(model.grads()) {
            let e = rel_err(grad.as_ref().unwrap(), &expected[&p.name]);
            assert!(
                e < tol,
                "{name} {dtype:?}: gradient of {} off by {e:e}",
                p.name
            );
        }
        let norm = model.grad_norm().unwrap();
        assert!(
            (norm - g.grad_norm).abs() < tol * g.grad_norm,
            "{norm} vs {}",
            g.grad_norm
        );
    }
}

#[test]
fn logprobs_f64_match_transformers() {
    check_logprobs(DType::F64, 1e-9);
}

#[test]
fn logprobs_f32_match_transformers() {
    check_logprobs(DType::F32, 1e-4);
}

#[test]
fn gradients_f64_match_transformers() {
    check_grads(DType::F64, 1e-9);
}

#[test]
fn gradients_f32_match_transformers() {
    check_grads(DType::F32, 1e-4);
}

#[test]
fn two_adamw_steps_with_clipping_match_torch() {
    for name in MODELS {
        let g = golden(name);
        let a = &g.adamw;
        let mut model = load_model(name, DType::F64);
        let mut opt = AdamW::new(&model, a.config());
        for (step, weights) in [&g.weights, &a.weights_step2].into_iter().enumerate() {
            model
                .forward_backward(&g.pairs(), weights, g.temperature)
                .unwrap();
            let report = opt.step(&mut model, a.lr).unwrap();
            assert!(!report.skipped);
            let want = a.grad_norms[step];
            assert!(
                (report.grad_norm - want).abs() < 1e-9 * want,
                "{name} step {step}: grad norm {} vs {want}",
                report.grad_norm
            );
        }
        assert_eq!(opt.steps(), 2);
        let expected: HashMap<String, Tensor> = load(
            fixtures().join(format!("{name}.adamw.safetensors")),
            &Device::Cpu,
        )
        .unwrap();
        for p in model.params() {
            let e = rel_err(p.var.as_tensor(), &expected[&p.name]);
            assert!(e < 1e-9, "{name}: {} after two steps off by {e:e}", p.name);
        }
    }
}

/// Loads each fixture, takes one AdamW step, saves with `save_hf` and checks the reload is
/// bit-identical. With `RLREPLAY_EXPORT_DIR` set, the checkpoints and Rust's log-probs of the
/// golden pairs are left there for `scripts/golden_model.py check-rust-save`.
#[test]
fn hf_export() {
    let tmp = tempfile::tempdir().unwrap();
    let root = std::env::var_os("RLREPLAY_EXPORT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    for name in MODELS {
        let g = golden(name);
        let mut model = load_model(name, DType::F32);
        let mut opt = AdamW::new(&model, AdamWConfig::default());
        model
            .forward_backward(&g.pairs(), &g.weights, g.temperature)
            .unwrap();
        opt.step(&mut model, 1e-2).unwrap();
        let dir = root.join(name);
        model.save_hf(&dir).unwrap();
        let reloaded = Model::load(&dir, DType::F32, &Device::Cpu).unwrap();
        for (a, b) in model.params().iter().zip(reloaded.params()) {
            assert_eq!(a.name, b.name);
            let (x, y) = (flat(a.var.as_tensor()), flat(b.var.as_tensor()));
            assert!(
                x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
                "{}",
                a.name
            );
        }
        let out = reloaded.logprobs(&g.pairs(), g.temperature, false).unwrap();
        let json = serde_json::json!({ "logprobs": out.logprobs });
        std::fs::write(dir.join("rust_logprobs.json"), json.to_string()).unwrap();
    }
}

#[test]
fn fixtures_cover_every_architecture() {
    let archs: Vec<Architecture> = MODELS
        .iter()
        .map(|n| load_model(n, DType::F32).config().architecture)
        .collect();
    assert_eq!(
        archs,
        [
            Architecture::Qwen3,
            Architecture::Qwen3,
            Architecture::Qwen2,
            Architecture::Qwen2,
            Architecture::Llama,
            Architecture::Llama
        ]
    );
}

/// Log-probs of the golden pairs from a KV-cache decoder: prefill each prompt, then feed the
/// response token by token.
pub(crate) fn decoder_logprobs(dec: &Decoder, pairs: &[Pair], temperature: f64) -> Vec<Vec<f64>> {
    let log_softmax_at = |row: &[f32], tok: u32| {
        let z: Vec<f64> = row.iter().map(|&v| f64::from(v) / temperature).collect();
        let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + z.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        z[tok as usize] - lse
    };
    pairs
        .iter()
        .map(|p| {
            let mut cache: KvCache = dec.new_cache();
            let mut row = dec.forward_logits(&mut [&mut cache], &[&p.prompt]).unwrap();
            let mut out = Vec::new();
            for (i, &tok) in p.response.iter().enumerate() {
                out.push(log_softmax_at(&row, tok));
                if i + 1 < p.response.len() {
                    row = dec.forward_logits(&mut [&mut cache], &[&[tok]]).unwrap();
                }
            }
            out
        })
        .collect()
}

/// The one-definition rule of the decoder layer: the host f32 decoder (its own kernels over the
/// same weights and rotary tables) and the candle KV-cache decoder (the layer's own forward with
/// cached attention, here in f64) agree with transformers on every architecture.
#[test]
fn both_decoders_match_transformers() {
    for name in MODELS {
        let g = golden(name);
        let host = Decoder::new(&load_model(name, DType::F32)).unwrap();
        let d = max_abs_diff(
            &decoder_logprobs(&host, &g.pairs, g.temperature),
            &g.logprobs,
        );
        assert!(d < 1e-4, "{name}: host decoder off by {d:e}");
        let candle = Decoder::new(&load_model(name, DType::F64)).unwrap();
        let d = max_abs_diff(
            &decoder_logprobs(&candle, &g.pairs, g.temperature),
            &g.logprobs,
        );
        assert!(d < 1e-5, "{name}: candle decoder off by {d:e}");
    }
}

/// SmolLM2-135M-Instruct converted from its GGUF (`scripts/install-smollm2.sh`) against
/// transformers' float64 values of the same file (`scripts/golden_smollm2.py`). CI installs the
/// model; elsewhere the tests are skipped with a note when it is absent.
mod smollm2 {
    use super::*;
    use serde_json::Value;

    /// The installed model directory (`RLREPLAY_SMOLLM2`, else `models/smollm2-135m-instruct`).
    fn model_dir() -> Option<PathBuf> {
        let dir = std::env::var_os("RLREPLAY_SMOLLM2").map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/smollm2-135m-instruct"),
            PathBuf::from,
        );
        if dir.join("model.safetensors").is_file() {
            return Some(dir);
        }
        assert!(
            std::env::var_os("CI").is_none(),
            "{}: SmolLM2 is not installed (scripts/install-smollm2.sh)",
            dir.display()
        );
        eprintln!("skipped: {} is not installed", dir.display());
        None
    }

    fn reference() -> Value {
        let path = fixtures().join("smollm2_reference.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn ids(v: &Value) -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    }

    fn floats(v: &Value) -> Vec<f64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    }

    #[test]
    fn logprobs_match_transformers_at_both_temperatures() {
        let Some(dir) = model_dir() else { return };
        let model = Model::load(&dir, DType::F32, &Device::Cpu).unwrap();
        assert_eq!(model.config().architecture, Architecture::Llama);
        let r = reference();
        let pairs: Vec<(Vec<u32>, Vec<u32>)> = r["logprobs"]["pairs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (ids(&p["prompt"]), ids(&p["response"])))
            .collect();
        let seq: Vec<_> = pairs
            .iter()
            .map(|(p, q)| rlreplay_model::SeqPair::new(p, q))
            .collect();
        for t in floats(&r["logprobs"]["temperatures"]) {
            let key = format!("{t:.1}");
            let want: Vec<Vec<f64>> = r["logprobs"]["pairs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| floats(&p["logprobs"][&key]))
                .collect();
            let got = model.logprobs(&seq, t, false).unwrap();
            let d = max_abs_diff(&got.logprobs, &want);
            eprintln!("temperature {t}: max |Δ log-prob| {d:e}");
            assert!(d <= 1e-4, "temperature {t}: off by {d:e}");
        }
    }

    #[test]
    fn greedy_decoding_matches_transformers() {
        let Some(dir) = model_dir() else { return };
        let model = Model::load(&dir, DType::F32, &Device::Cpu).unwrap();
        let r = reference();
        let g = &r["greedy"];
        let want = ids(&g["tokens"]);
        let margins = floats(&g["top2_margins"]);
        let dec = Decoder::new(&model).unwrap();
        let mut cache = dec.new_cache();
        let mut feed = ids(&r["chat"]["ids"]);
        for (step, (&tok, &margin)) in want.iter().zip(&margins).enumerate() {
            let row = dec.forward_logits(&mut [&mut cache], &[&feed]).unwrap();
            let best = (0..row.len())
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .unwrap() as u32;
            if margin > 1e-3 {
                assert_eq!(best, tok, "step {step} (top-2 margin {margin})");
            }
            // Follow the reference, so one near-tie cannot derail the rest.
            feed = vec![tok];
        }
    }
}
