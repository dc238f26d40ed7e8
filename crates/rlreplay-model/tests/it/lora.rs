//! LoRA adapters against PEFT + transformers float64 golden values (`scripts/golden_lora.py
//! generate`: adapters with random non-zero `lora_B` on the tiny Qwen3, Qwen2 and Llama fixtures,
//! attention-only and all-linear targets): log-probs, entropies and the adapters' gradients (f64,
//! f32, bf16); both decoders generating with the adapters; merging; PEFT save/load round trips
//! with PEFT's key names; finite differences; frozen base weights; the configuration's errors and
//! bad adapter directories.

use std::path::{Path, PathBuf};

use candle_core::safetensors::load;
use candle_core::Tensor;
use rlreplay_model::generate::Decoder;
use rlreplay_model::golden::{max_abs_diff, Pair};
use rlreplay_model::lora::{LoraConfig, LoraTarget, PEFT_PREFIX};
use rlreplay_model::{
    AdamW, AdamWConfig, Architecture, DType, Device, Model, ModelConfig, SeqPair,
};
use serde::Deserialize;

use super::golden::{decoder_logprobs, fixtures, flat};

/// The adapter fixtures and their base fixtures.
const ADAPTERS: [(&str, &str); 5] = [
    ("qwen3_tied_attn", "tiny_tied"),
    ("qwen3_untied_all", "tiny_gqa_untied"),
    ("qwen2_untied_mixed", "qwen2_tiny_gqa_untied"),
    ("llama_untied_all", "llama_tiny_gqa_untied"),
    ("llama_tied_attn", "llama_tiny_tied"),
];

/// `lora/NAME.golden.json`.
#[derive(Deserialize)]
struct LoraGolden {
    base: String,
    temperature: f64,
    pairs: Vec<Pair>,
    weights: Vec<f64>,
    logprobs: Vec<Vec<f64>>,
    entropy: Vec<Vec<f64>>,
    /// How far the adapter moves the log-probs from the base model's.
    moved: f64,
}

impl LoraGolden {
    fn pairs(&self) -> Vec<SeqPair<'_>> {
        self.pairs
            .iter()
            .map(|p| SeqPair::new(&p.prompt, &p.response))
            .collect()
    }
}

fn golden(name: &str) -> LoraGolden {
    let path = fixtures().join(format!("lora/{name}.golden.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The base fixture `base` with the adapter fixture `name` loaded onto it.
fn adapted(name: &str, base: &str, dtype: DType) -> Model {
    let mut model = Model::load(fixtures().join(base), dtype, &Device::Cpu).unwrap();
    model
        .load_adapter(fixtures().join("lora").join(name))
        .unwrap();
    model
}

fn bits(t: &Tensor) -> Vec<u64> {
    flat(t).iter().map(|x| x.to_bits()).collect()
}

/// max |a − b| / max |b|.
fn rel_err(a: &[f64], b: &[f64]) -> f64 {
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let diff = a
        .iter()
        .zip(b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
    diff / scale.max(f64::MIN_POSITIVE)
}

#[test]
fn logprobs_match_peft() {
    for (name, base) in ADAPTERS {
        let g = golden(name);
        assert_eq!(g.base, base);
        assert!(g.moved > 1e-3, "{name}: the adapter must matter");
        for (dtype, tol) in [(DType::F64, 1e-9), (DType::F32, 1e-4)] {
            let model = adapted(name, base, dtype);
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
}

#[test]
fn adapter_gradients_match_peft_and_base_weights_get_none() {
    for (name, base) in ADAPTERS {
        let g = golden(name);
        let expected = load(
            fixtures().join(format!("lora/{name}.grads.safetensors")),
            &Device::Cpu,
        )
        .unwrap();
        for recompute in [false, true] {
            let mut model = adapted(name, base, DType::F64);
            model.set_activation_recompute(recompute);
            let lps = model
                .forward_backward(&g.pairs(), &g.weights, g.temperature)
                .unwrap();
            assert!(max_abs_diff(&lps, &g.logprobs) < 1e-9, "{name}");
            // Only the adapters are parameters, and every one of them has its gradient.
            assert_eq!(model.params().len(), expected.len(), "{name}");
            assert_eq!(model.grads().len(), model.params().len());
            assert!(!model.frozen_params().is_empty());
            for (p, grad) in model.params().iter().zip(model.grads()) {
                let want = &expected[&format!("{PEFT_PREFIX}{}", p.name)];
                let grad = grad
                    .as_ref()
                    .unwrap_or_else(|| panic!("{}: no gradient", p.name));
                let e = rel_err(&flat(grad), &flat(want));
                assert!(
                    e < 1e-9,
                    "{name} recompute={recompute}: gradient of {} off by {e:e}",
                    p.name
                );
            }
        }
        // f32 too, at f32 precision.
        let mut model = adapted(name, base, DType::F32);
        model
            .forward_backward(&g.pairs(), &g.weights, g.temperature)
            .unwrap();
        for (p, grad) in model.params().iter().zip(model.grads()) {
            let want = &expected[&format!("{PEFT_PREFIX}{}", p.name)];
            let e = rel_err(&flat(grad.as_ref().unwrap()), &flat(want));
            assert!(e < 1e-4, "{name} f32: gradient of {} off by {e:e}", p.name);
        }
        // bf16 compute (candle's ops, the CUDA path's dtype): f32 masters and gradients, at
        // bf16 precision (8-bit mantissas through two layers: within 7% of the largest
        // gradient here), with and without activation recompute.
        for recompute in [false, true] {
            let mut model = adapted(name, base, DType::BF16);
            model.set_activation_recompute(recompute);
            model
                .forward_backward(&g.pairs(), &g.weights, g.temperature)
                .unwrap();
            for (p, grad) in model.params().iter().zip(model.grads()) {
                let grad = grad.as_ref().unwrap();
                assert_eq!(grad.dtype(), DType::F32, "{}", p.name);
                let want = &expected[&format!("{PEFT_PREFIX}{}", p.name)];
                let e = rel_err(&flat(grad), &flat(want));
                assert!(
                    e < 1e-1,
                    "{name} bf16 recompute={recompute}: gradient of {} off by {e:e}",
                    p.name
                );
            }
        }
    }
}

/// Both decoders merge the adapters into the weights they generate with: their log-probs are the
/// training forward pass's (and PEFT's), to the f32 rounding of the logits the decoders return.
#[test]
fn both_decoders_generate_with_the_adapters() {
    for (name, base) in ADAPTERS {
        let g = golden(name);
        for (dtype, tol) in [(DType::F32, 1e-4), (DType::F64, 1e-6)] {
            let model = adapted(name, base, dtype);
            let dec = Decoder::new(&model).unwrap();
            let got = decoder_logprobs(&dec, &g.pairs, g.temperature);
            let train = model.logprobs(&g.pairs(), g.temperature, false).unwrap();
            let d = max_abs_diff(&got, &train.logprobs);
            assert!(
                d < tol,
                "{name} {dtype:?}: decoder vs training forward {d:e}"
            );
            let d = max_abs_diff(&got, &g.logprobs);
            assert!(d < tol, "{name} {dtype:?}: decoder vs PEFT {d:e}");
        }
    }
}

#[test]
fn merged_weights_give_the_adapter_logprobs() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, base) in ADAPTERS {
        let g = golden(name);
        // f32: the merged weights compute what the base weights and the adapters did.
        let mut model = adapted(name, base, DType::F32);
        let with_adapter = model.logprobs(&g.pairs(), g.temperature, true).unwrap();
        model.merge_lora().unwrap();
        let merged = model.logprobs(&g.pairs(), g.temperature, true).unwrap();
        let d = max_abs_diff(&merged.logprobs, &with_adapter.logprobs);
        assert!(d < 1e-5, "{name} f32: merged vs adapter forward {d:e}");
        let d = max_abs_diff(
            merged.entropy.as_ref().unwrap(),
            with_adapter.entropy.as_ref().unwrap(),
        );
        assert!(d < 1e-5, "{name} f32: merged vs adapter entropies {d:e}");

        let mut model = adapted(name, base, DType::F64);
        let with_adapter = model.logprobs(&g.pairs(), g.temperature, true).unwrap();
        let n_base = model.frozen_params().len();
        let e = model
            .save_hf(tmp.path().join("refused"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("save_adapter") && e.contains("merge_lora"),
            "{e}"
        );
        model.merge_lora().unwrap();
        assert!(model.lora_config().is_none() && model.frozen_params().is_empty());
        assert_eq!(model.params().len(), n_base);
        let out = model.logprobs(&g.pairs(), g.temperature, true).unwrap();
        let d = max_abs_diff(&out.logprobs, &with_adapter.logprobs);
        assert!(d < 1e-12, "{name}: merged vs adapter forward {d:e}");
        let d = max_abs_diff(&out.logprobs, &g.logprobs);
        assert!(d < 1e-9, "{name}: merged log-probs off by {d:e}");
        // Exported as a plain checkpoint, it loads and computes the same.
        let dir = tmp.path().join(name);
        model.save_hf(&dir).unwrap();
        let merged = Model::load(&dir, DType::F64, &Device::Cpu).unwrap();
        let again = merged.logprobs(&g.pairs(), g.temperature, true).unwrap();
        assert_eq!(again.logprobs, out.logprobs, "{name}");
        // A merged model trains every weight again.
        let mut merged = merged;
        merged
            .forward_backward(&g.pairs(), &g.weights, g.temperature)
            .unwrap();
        assert!(merged.grads().iter().all(Option::is_some));
    }
}

#[test]
fn save_and_load_round_trip_bit_identical() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, base) in ADAPTERS {
        for dtype in [DType::F32, DType::F64] {
            let model = adapted(name, base, dtype);
            let dir = tmp.path().join(format!("{name}-{dtype:?}"));
            model.save_adapter(&dir, base).unwrap();
            let cfg: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(dir.join("adapter_config.json")).unwrap(),
            )
            .unwrap();
            assert_eq!(cfg["base_model_name_or_path"], base);
            assert_eq!(cfg["peft_type"], "LORA");
            // PEFT's key names, the very ones PEFT wrote for the fixture, in the master dtype.
            let saved = load(dir.join("adapter_model.safetensors"), &Device::Cpu).unwrap();
            let written = load(
                fixtures()
                    .join("lora")
                    .join(name)
                    .join("adapter_model.safetensors"),
                &Device::Cpu,
            )
            .unwrap();
            let mut keys: Vec<&String> = saved.keys().collect();
            let mut want: Vec<&String> = written.keys().collect();
            keys.sort();
            want.sort();
            assert_eq!(keys, want, "{name}");
            assert!(saved
                .contains_key("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
            assert!(saved.values().all(|t| t.dtype() == dtype));
            let reloaded = adapted_from(&dir, base, dtype);
            assert_eq!(reloaded.lora_config(), model.lora_config());
            assert_eq!(reloaded.params().len(), model.params().len());
            for (a, b) in model.params().iter().zip(reloaded.params()) {
                assert_eq!(a.name, b.name);
                assert_eq!(
                    bits(a.var.as_tensor()),
                    bits(b.var.as_tensor()),
                    "{name} {dtype:?}: {}",
                    a.name
                );
            }
        }
    }
}

fn adapted_from(dir: &Path, base: &str, dtype: DType) -> Model {
    let mut model = Model::load(fixtures().join(base), dtype, &Device::Cpu).unwrap();
    model.load_adapter(dir).unwrap();
    model
}

/// Seeded adapters on each base fixture after one AdamW step, saved with `save_adapter`, with
/// Rust's log-probs of the base's pairs beside them; `RLREPLAY_EXPORT_DIR` keeps them for
/// `scripts/golden_lora.py check-rust-save`, which loads them with PEFT.
#[test]
fn peft_export() {
    let tmp = tempfile::tempdir().unwrap();
    let root = std::env::var_os("RLREPLAY_EXPORT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    for (i, (name, base)) in ADAPTERS.into_iter().enumerate() {
        let g = golden(name);
        let fixture = LoraConfig::read(&fixtures().join("lora").join(name)).unwrap();
        let mut model = Model::load(fixtures().join(base), DType::F32, &Device::Cpu).unwrap();
        let before = model.logprobs(&g.pairs(), g.temperature, false).unwrap();
        model.add_lora(fixture.clone(), 100 + i as u64).unwrap();
        // B = 0: the fresh adapter changes nothing.
        let fresh = model.logprobs(&g.pairs(), g.temperature, false).unwrap();
        assert_eq!(fresh.logprobs, before.logprobs, "{name}");
        let mut opt = AdamW::new(&model, AdamWConfig::default());
        model
            .forward_backward(&g.pairs(), &g.weights, g.temperature)
            .unwrap();
        opt.step(&mut model, 1e-2).unwrap();
        let dir = root.join(name);
        model.save_adapter(&dir, &format!("../../{base}")).unwrap();
        let out = model.logprobs(&g.pairs(), g.temperature, false).unwrap();
        assert!(
            max_abs_diff(&out.logprobs, &before.logprobs) > 1e-4,
            "{name}"
        );
        let reloaded = adapted_from(&dir, base, DType::F32);
        let again = reloaded.logprobs(&g.pairs(), g.temperature, false).unwrap();
        assert_eq!(again.logprobs, out.logprobs, "{name}");
        let json = serde_json::json!({ "logprobs": out.logprobs });
        std::fs::write(dir.join("rust_logprobs.json"), json.to_string()).unwrap();
    }
}

/// A very small configuration for finite differences.
fn micro(arch: Architecture, tied: bool) -> ModelConfig {
    ModelConfig {
        architecture: arch,
        vocab_size: 40,
        hidden_size: 16,
        intermediate_size: 24,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 8,
        tie_word_embeddings: tied,
        attention_bias: arch == Architecture::Llama,
        max_position_embeddings: 64,
        ..ModelConfig::tiny_of(arch)
    }
}

/// A random `micro` model with adapters of `targets` whose `lora_B` are random too.
fn random_adapted(arch: Architecture, tied: bool, targets: &[&str]) -> Model {
    let mut model = Model::new_random(micro(arch, tied), 7, DType::F64, &Device::Cpu).unwrap();
    model
        .add_lora(LoraConfig::new(2, 3.0, targets).unwrap(), 5)
        .unwrap();
    for i in 0..model.params().len() {
        let p = model.params()[i].clone();
        if p.name.contains("lora_B") {
            let n = p.var.elem_count();
            let v: Vec<f64> = (0..n)
                .map(|j| 0.2 * ((i * 13 + j * 7) as f64 * 0.37).sin())
                .collect();
            let t = Tensor::from_vec(v, p.var.shape(), &Device::Cpu).unwrap();
            model.set_weight(i, &t).unwrap();
        }
    }
    model
}

#[test]
fn adapter_gradients_match_finite_differences() {
    let ids = |seed: u32, n: u32| -> Vec<u32> {
        (0..n).map(|i| (seed * 17 + i * 11 + i * i) % 40).collect()
    };
    let b = [
        (ids(1, 4), ids(2, 5)),
        (ids(3, 2), ids(4, 1)),
        (ids(5, 6), ids(6, 3)),
    ];
    let pairs: Vec<SeqPair<'_>> = b.iter().map(|(p, r)| SeqPair::new(p, r)).collect();
    let w: Vec<f64> = (0..9).map(|i| ((i * 7 % 11) as f64 - 5.0) / 5.0).collect();
    let temperature = 0.8;
    for (arch, tied, targets) in [
        (Architecture::Qwen3, true, &["all-linear"][..]),
        (
            Architecture::Llama,
            false,
            &["q_proj", "v_proj", "gate_proj", "down_proj"][..],
        ),
        (
            Architecture::Qwen2,
            false,
            &["k_proj", "o_proj", "up_proj"][..],
        ),
    ] {
        let mut model = random_adapted(arch, tied, targets);
        model.forward_backward(&pairs, &w, temperature).unwrap();
        let objective = |m: &Model| -> f64 {
            let lp = m.logprobs(&pairs, temperature, false).unwrap();
            lp.logprobs
                .iter()
                .flatten()
                .zip(&w)
                .map(|(l, g)| l * g)
                .sum()
        };
        let grads: Vec<Vec<f64>> = model
            .grads()
            .iter()
            .map(|g| flat(g.as_ref().expect("every adapter gets a gradient")))
            .collect();
        let h = 1e-5;
        for (pi, p) in model.params().iter().enumerate() {
            let base = flat(p.var.as_tensor());
            let g = &grads[pi];
            assert!(g.iter().any(|&x| x != 0.0), "{}: all-zero gradient", p.name);
            let largest = (0..g.len())
                .max_by(|&a, &b| g[a].abs().total_cmp(&g[b].abs()))
                .unwrap();
            for idx in [largest, (pi * 31 + 5) % g.len()] {
                let set = |delta: f64| {
                    let mut v = base.clone();
                    v[idx] += delta;
                    p.var
                        .set(&Tensor::from_vec(v, p.var.shape(), &Device::Cpu).unwrap())
                        .unwrap();
                };
                set(h);
                let plus = objective(&model);
                set(-h);
                let minus = objective(&model);
                set(0.0);
                let numeric = (plus - minus) / (2.0 * h);
                let err = (numeric - g[idx]).abs() / g[idx].abs().max(1e-3);
                assert!(
                    err < 1e-5,
                    "{} [{idx}] ({arch:?}): analytic {} vs numeric {numeric}",
                    p.name,
                    g[idx]
                );
            }
        }
    }
}

/// AdamW sees only the adapters: a step moves them and leaves every base weight's bits alone.
#[test]
fn optimizer_updates_only_the_adapters() {
    let mut model = random_adapted(Architecture::Qwen3, false, &["q_proj", "v_proj"]);
    let n_layers = model.config().num_hidden_layers;
    assert_eq!(model.params().len(), n_layers * 2 * 2);
    assert!(model.params().iter().all(|p| p.name.contains(".lora_")));
    let frozen: Vec<Vec<u64>> = model
        .frozen_params()
        .iter()
        .map(|p| bits(p.var.as_tensor()))
        .collect();
    let adapters: Vec<Vec<u64>> = model
        .params()
        .iter()
        .map(|p| bits(p.var.as_tensor()))
        .collect();
    let mut opt = AdamW::new(&model, AdamWConfig::default());
    let (p, r) = ([1u32, 2, 3], [4u32, 5]);
    model
        .forward_backward(&[SeqPair::new(&p, &r)], &[1.0, -0.5], 1.0)
        .unwrap();
    opt.step(&mut model, 1e-2).unwrap();
    assert_eq!(adapters.len(), model.params().len());
    for (i, (p, before)) in model.params().iter().zip(&adapters).enumerate() {
        assert!(opt.moments(i).is_some());
        assert_ne!(&bits(p.var.as_tensor()), before, "{} did not move", p.name);
    }
    for (p, before) in model.frozen_params().iter().zip(&frozen) {
        assert_eq!(&bits(p.var.as_tensor()), before, "{} moved", p.name);
    }
    let held = model.held_weights();
    let all: usize = model
        .params()
        .iter()
        .chain(model.frozen_params())
        .map(|p| p.var.elem_count() * 8)
        .sum();
    assert_eq!(held.masters as usize, all);
}

#[test]
fn configuration_errors_name_what_is_wrong() {
    let err = |r: rlreplay_model::Result<LoraConfig>| r.unwrap_err().to_string();
    let e = err(LoraConfig::new(4, 8.0, &["q_proj", "qkv_proj"]));
    assert!(e.contains("qkv_proj") && e.contains("q_proj"), "{e}");
    let e = err(LoraConfig::new(0, 8.0, &["q_proj"]));
    assert!(e.contains("r = 0") && e.contains("q_proj"), "{e}");
    assert!(LoraConfig::new(4, 8.0, &[]).is_err());
    let all = LoraConfig::new(4, 8.0, &["all-linear"]).unwrap();
    assert_eq!(all.target_modules, LoraTarget::ALL);
    assert_eq!(all.scaling(), 2.0);
    let mut peft = all.to_peft_json("base");
    assert_eq!(LoraConfig::from_peft_json(&peft).unwrap(), all);
    peft["lora_dropout"] = serde_json::json!(0.05);
    let e = LoraConfig::from_peft_json(&peft).unwrap_err().to_string();
    assert!(e.contains("lora_dropout") && e.contains("0.05"), "{e}");
    peft["lora_dropout"] = serde_json::json!(0.0);
    peft["use_dora"] = serde_json::json!(true);
    let e = LoraConfig::from_peft_json(&peft).unwrap_err().to_string();
    assert!(e.contains("use_dora"), "{e}");
    peft["use_dora"] = serde_json::json!(false);
    // PEFT saves "all-linear" as the module paths it resolved to.
    peft["target_modules"] = serde_json::json!([
        "model.layers.0.self_attn.q_proj",
        "model.layers.1.mlp.up_proj"
    ]);
    let cfg = LoraConfig::from_peft_json(&peft).unwrap();
    assert_eq!(cfg.target_modules, [LoraTarget::QProj, LoraTarget::UpProj]);
    peft["target_modules"] = serde_json::json!(["model.layers.0.mlp.q_proj"]);
    assert!(LoraConfig::from_peft_json(&peft).is_err());

    // An adapter of another model's shapes: refused naming the module and both shapes.
    let tmp = tempfile::tempdir().unwrap();
    let mut other = Model::new_random(
        micro(Architecture::Qwen3, true),
        1,
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    other
        .add_lora(LoraConfig::new(2, 4.0, &["v_proj"]).unwrap(), 1)
        .unwrap();
    other
        .save_adapter(tmp.path().join("micro"), "micro")
        .unwrap();
    let mut model = Model::load(fixtures().join("tiny_tied"), DType::F32, &Device::Cpu).unwrap();
    let e = model
        .load_adapter(tmp.path().join("micro"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model.layers.0.self_attn.v_proj")
            && e.contains("[2, 16]")
            && e.contains("[32, 32]"),
        "{e}"
    );
    assert!(model.lora_config().is_none() && model.frozen_params().is_empty());
    // Adapters twice, and saving without any.
    assert!(model.save_adapter(tmp.path().join("none"), "x").is_err());
    assert!(model.merge_lora().is_err());
    model.add_lora(all.clone(), 1).unwrap();
    assert!(model.add_lora(all, 2).is_err());
}

/// A copy of the adapter fixture `name` in `dir`, with its `adapter_config.json` passed through
/// `edit`.
fn adapter_copy(dir: &Path, name: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let from = fixtures().join("lora").join(name);
    std::fs::create_dir_all(dir).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(from.join("adapter_config.json")).unwrap())
            .unwrap();
    edit(&mut cfg);
    std::fs::write(dir.join("adapter_config.json"), cfg.to_string()).unwrap();
    std::fs::copy(
        from.join("adapter_model.safetensors"),
        dir.join("adapter_model.safetensors"),
    )
    .unwrap();
}

/// Bad adapter directories are typed errors naming what is wrong (the file, the module and both
/// shapes, the key), checked before anything is attached: the model is left as it was.
#[test]
fn bad_adapters_are_errors_naming_the_problem() {
    use rlreplay_model::Error;
    let tmp = tempfile::tempdir().unwrap();
    let mut model = Model::load(fixtures().join("tiny_tied"), DType::F32, &Device::Cpu).unwrap();
    let n_params = model.params().len();
    let mut refuse = |dir: &Path| -> Error {
        let e = model.load_adapter(dir).unwrap_err();
        assert!(model.lora_config().is_none() && model.frozen_params().is_empty());
        assert_eq!(model.params().len(), n_params);
        e
    };
    // (how the copy of qwen3_tied_attn (r = 4 on the attention projections) is broken, the
    // error's kind, what its message names)
    type Edit = Box<dyn Fn(&Path)>;
    type Case<'a> = (&'a str, Edit, fn(&Error) -> bool, Vec<&'a str>);
    let config_edit = |edit: fn(&mut serde_json::Value)| -> Edit {
        Box::new(move |dir: &Path| adapter_copy(dir, "qwen3_tied_attn", edit))
    };
    let file_edit = |edit: fn(&Path)| -> Edit {
        Box::new(move |dir: &Path| {
            adapter_copy(dir, "qwen3_tied_attn", |_| {});
            edit(dir)
        })
    };
    let q_a = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
    let cases: Vec<Case<'_>> = vec![
        (
            "no directory",
            Box::new(|_: &Path| {}),
            |e| matches!(e, Error::Io(_)),
            vec!["adapter_config.json"],
        ),
        (
            "no weights",
            file_edit(|d| std::fs::remove_file(d.join("adapter_model.safetensors")).unwrap()),
            |e| matches!(e, Error::Checkpoint(_)),
            vec!["adapter_model.safetensors", "not found"],
        ),
        (
            "corrupt configuration",
            file_edit(|d| std::fs::write(d.join("adapter_config.json"), "{\"r\": 4,").unwrap()),
            |e| matches!(e, Error::Config(_)),
            vec!["adapter_config.json", "invalid JSON"],
        ),
        (
            "corrupt weights",
            file_edit(|d| {
                std::fs::write(
                    d.join("adapter_model.safetensors"),
                    b"\x08\0\0\0\0\0\0\0{\"a\":",
                )
                .unwrap()
            }),
            |e| matches!(e, Error::Checkpoint(_)),
            vec!["adapter_model.safetensors", "cannot read safetensors"],
        ),
        (
            "truncated weights",
            file_edit(|d| {
                let path = d.join("adapter_model.safetensors");
                let bytes = std::fs::read(&path).unwrap();
                std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap()
            }),
            |e| matches!(e, Error::Checkpoint(_)),
            vec!["adapter_model.safetensors", "cannot read safetensors"],
        ),
        (
            "rank of the configuration is not the tensors'",
            config_edit(|c| c["r"] = serde_json::json!(8)),
            |e| matches!(e, Error::Checkpoint(_)),
            vec![
                q_a,
                "[4, 32]",
                "model.layers.0.self_attn.q_proj",
                "[64, 32]",
                "rank 8",
                "[8, 32]",
            ],
        ),
        (
            "a target module without tensors",
            config_edit(|c| {
                c["target_modules"] =
                    serde_json::json!(["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"])
            }),
            |e| matches!(e, Error::Checkpoint(_)),
            vec![
                "base_model.model.model.layers.0.mlp.up_proj.lora_A.weight",
                "missing",
            ],
        ),
        (
            "tensors of a module that is not a target",
            config_edit(|c| c["target_modules"] = serde_json::json!(["q_proj"])),
            |e| matches!(e, Error::Checkpoint(_)),
            vec![
                "unexpected tensor",
                "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight",
            ],
        ),
        (
            "unknown target module",
            config_edit(|c| c["target_modules"] = serde_json::json!(["q_proj", "qkv_proj"])),
            |e| matches!(e, Error::Config(_)),
            vec!["adapter_config.json", "unknown target module", "qkv_proj"],
        ),
        (
            "rank 0",
            config_edit(|c| c["r"] = serde_json::json!(0)),
            |e| matches!(e, Error::Config(_)),
            vec!["adapter_config.json", "r = 0"],
        ),
        (
            "another PEFT method",
            config_edit(|c| c["peft_type"] = serde_json::json!("IA3")),
            |e| matches!(e, Error::Config(_)),
            vec!["peft_type", "IA3"],
        ),
        (
            "integer tensors",
            file_edit(|d| {
                let path = d.join("adapter_model.safetensors");
                let mut tensors = load(&path, &Device::Cpu).unwrap();
                let key = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight";
                let t = tensors[key].to_dtype(DType::U32).unwrap();
                tensors.insert(key.to_string(), t);
                candle_core::safetensors::save(&tensors, &path).unwrap();
            }),
            |e| matches!(e, Error::Checkpoint(_)),
            vec!["layers.1.self_attn.v_proj.lora_B.weight", "U32"],
        ),
    ];
    for (i, (what, make, kind, names)) in cases.into_iter().enumerate() {
        let dir = tmp.path().join(format!("case{i}"));
        make(&dir);
        let e = refuse(&dir);
        let msg = e.to_string();
        assert!(kind(&e), "{what}: wrong kind of error: {e:?}");
        for n in names {
            assert!(msg.contains(n), "{what}: {msg:?} does not name {n:?}");
        }
    }
    // The unbroken adapter still loads onto the model.
    model
        .load_adapter(fixtures().join("lora/qwen3_tied_attn"))
        .unwrap();
    assert_eq!(model.lora_config().unwrap().r, 4);
}
