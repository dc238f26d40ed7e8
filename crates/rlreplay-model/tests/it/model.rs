//! Model behaviour on random tiny configurations: gradients reach every parameter, finite
//! differences, packing, micro-batch accumulation, checkpoints and optimizer state.

use candle_core::{Tensor, Var};

use super::golden::flat;
use rlreplay_model::{
    mixed_logprobs, AdamW, AdamWConfig, Architecture, DType, Device, Model, ModelConfig,
    RopeScaling, SaveOptions, SeqPair,
};

/// A very small configuration for finite differences: GQA 4:2, head_dim != hidden/heads.
fn micro(tied: bool) -> ModelConfig {
    ModelConfig {
        vocab_size: 40,
        hidden_size: 16,
        intermediate_size: 24,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 8,
        tie_word_embeddings: tied,
        max_position_embeddings: 64,
        ..ModelConfig::tiny()
    }
}

/// [`micro`] as a Llama with biases on all four attention projections and llama3 rotary scaling
/// (its three frequency bands all present at head width 8).
fn micro_llama(tied: bool) -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Llama,
        attention_bias: true,
        rope_theta: 100.0,
        rope_scaling: RopeScaling::Llama3 {
            factor: 4.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 32,
        },
        ..micro(tied)
    }
}

/// Deterministic pseudo-random token ids below `vocab`.
fn ids(seed: u32, n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (seed.wrapping_mul(2_654_435_761).wrapping_add(i * 40_503) >> 7) % vocab as u32)
        .collect()
}

fn batch(vocab: usize) -> Vec<(Vec<u32>, Vec<u32>)> {
    vec![
        (ids(1, 4, vocab), ids(2, 5, vocab)),
        (ids(3, 2, vocab), ids(4, 1, vocab)),
        (ids(5, 6, vocab), ids(6, 3, vocab)),
    ]
}

fn as_pairs(b: &[(Vec<u32>, Vec<u32>)]) -> Vec<SeqPair<'_>> {
    b.iter().map(|(p, r)| SeqPair::new(p, r)).collect()
}

fn weights(n: usize) -> Vec<f64> {
    (0..n).map(|i| ((i * 7 % 11) as f64 - 5.0) / 5.0).collect()
}

/// A random model whose norm weights are also perturbed, so that their gradients are generic.
fn random_model(cfg: ModelConfig, dtype: DType) -> Model {
    let model = Model::new_random(cfg, 7, dtype, &Device::Cpu).unwrap();
    for (i, p) in model.params().iter().enumerate() {
        if p.var.rank() == 1 {
            let n = p.var.elem_count();
            let v: Vec<f64> = (0..n)
                .map(|j| 1.0 + 0.1 * (((i + j) % 5) as f64 - 2.0))
                .collect();
            let t = Tensor::from_vec(v, n, &Device::Cpu).unwrap();
            p.var.set(&t.to_dtype(p.var.dtype()).unwrap()).unwrap();
        }
    }
    model
}

#[test]
fn every_parameter_gets_a_nonzero_gradient() {
    let cases = [(true, false), (false, false), (true, true), (false, true)];
    for ((tied, recompute), llama) in cases.into_iter().flat_map(|c| [(c, false), (c, true)]) {
        let b = batch(40);
        let cfg = if llama {
            micro_llama(tied)
        } else {
            micro(tied)
        };
        let mut model = random_model(cfg, DType::F32);
        model.set_activation_recompute(recompute);
        assert_eq!(model.activation_recompute(), recompute);
        let n: usize = b.iter().map(|(_, r)| r.len()).sum();
        model
            .forward_backward(&as_pairs(&b), &weights(n), 1.0)
            .unwrap();
        for (p, g) in model.params().iter().zip(model.grads()) {
            let g = g
                .as_ref()
                .unwrap_or_else(|| panic!("{} has no gradient", p.name));
            assert_eq!(g.dtype(), DType::F32, "{}", p.name);
            let max = flat(g).iter().fold(0.0f64, |m, x| m.max(x.abs()));
            assert!(
                max > 0.0,
                "{} (tied={tied}, recompute={recompute}, llama={llama}) has an all-zero gradient",
                p.name
            );
        }
        assert!(model.grad_norm().unwrap() > 0.0);
        model.zero_grad();
        assert!(model.grads().iter().all(Option::is_none));
        assert_eq!(model.grad_norm().unwrap(), 0.0);
    }
}

#[test]
fn f64_gradients_match_finite_differences() {
    for (tied, cfg) in [
        (true, micro(true)),
        (false, micro(false)),
        (true, micro_llama(true)),
        (false, micro_llama(false)),
    ] {
        let b = batch(40);
        let n: usize = b.iter().map(|(_, r)| r.len()).sum();
        let w = weights(n);
        let arch = cfg.architecture;
        let mut model = random_model(cfg, DType::F64);
        let temperature = 0.8;
        model
            .forward_backward(&as_pairs(&b), &w, temperature)
            .unwrap();
        let objective = |m: &Model| -> f64 {
            let lp = m.logprobs(&as_pairs(&b), temperature, false).unwrap();
            lp.logprobs
                .iter()
                .flatten()
                .zip(&w)
                .map(|(l, g)| l * g)
                .sum()
        };
        let h = 1e-5;
        let mut worst = 0.0f64;
        let grads: Vec<Vec<f64>> = model
            .grads()
            .iter()
            .map(|g| flat(g.as_ref().unwrap()))
            .collect();
        for (pi, p) in model.params().iter().enumerate() {
            let base = flat(p.var.as_tensor());
            let g = &grads[pi];
            let largest = (0..g.len())
                .max_by(|&a, &b| g[a].abs().total_cmp(&g[b].abs()))
                .unwrap();
            for idx in [largest, (pi * 31 + 5) % g.len()] {
                let set = |delta: f64| {
                    let mut v = base.clone();
                    v[idx] += delta;
                    let t = Tensor::from_vec(v, p.var.shape(), &Device::Cpu).unwrap();
                    p.var.set(&t).unwrap();
                };
                set(h);
                let plus = objective(&model);
                set(-h);
                let minus = objective(&model);
                set(0.0);
                let numeric = (plus - minus) / (2.0 * h);
                let err = (numeric - g[idx]).abs() / g[idx].abs().max(1e-3);
                worst = worst.max(err);
                assert!(
                    err < 1e-5,
                    "{} [{idx}] ({arch:?}, tied={tied}): analytic {} vs numeric {numeric}",
                    p.name,
                    g[idx]
                );
            }
        }
        eprintln!("{arch:?} tied={tied}: worst finite-difference relative error {worst:e}");
    }
}

#[test]
fn packed_batch_equals_each_sequence_alone() {
    let b = batch(512);
    let mut model = random_model(ModelConfig::tiny(), DType::F64);
    let packed = model.logprobs(&as_pairs(&b), 1.0, true).unwrap();
    for (i, (p, r)) in b.iter().enumerate() {
        let alone = model.logprobs(&[SeqPair::new(p, r)], 1.0, true).unwrap();
        for (x, y) in packed.logprobs[i].iter().zip(&alone.logprobs[0]) {
            assert!((x - y).abs() < 1e-12, "pair {i}: {x} vs {y}");
        }
        let (pe, ae) = (packed.entropy.as_ref().unwrap(), alone.entropy.unwrap());
        for (x, y) in pe[i].iter().zip(&ae[0]) {
            assert!((x - y).abs() < 1e-12, "pair {i} entropy: {x} vs {y}");
        }
    }
    // Gradients accumulated over micro-batches equal those of one packed batch.
    let n: usize = b.iter().map(|(_, r)| r.len()).sum();
    let w = weights(n);
    model.forward_backward(&as_pairs(&b), &w, 1.0).unwrap();
    let whole: Vec<Vec<f64>> = model
        .grads()
        .iter()
        .map(|g| flat(g.as_ref().unwrap()))
        .collect();
    model.zero_grad();
    let split = b[0].1.len();
    model
        .forward_backward(&as_pairs(&b[..1]), &w[..split], 1.0)
        .unwrap();
    model
        .forward_backward(&as_pairs(&b[1..]), &w[split..], 1.0)
        .unwrap();
    for ((p, g), want) in model.params().iter().zip(model.grads()).zip(&whole) {
        let got = flat(g.as_ref().unwrap());
        let diff = got
            .iter()
            .zip(want)
            .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            diff < 1e-12,
            "{}: micro-batch accumulation off by {diff:e}",
            p.name
        );
    }
}

#[test]
fn empty_responses_and_bad_inputs() {
    let mut model = random_model(micro(true), DType::F32);
    let out = model
        .logprobs(&[SeqPair::new(&[1, 2], &[])], 1.0, false)
        .unwrap();
    assert_eq!(out.logprobs, vec![Vec::<f64>::new()]);
    let lp = model
        .forward_backward(&[SeqPair::new(&[1], &[])], &[], 1.0)
        .unwrap();
    assert_eq!(lp, vec![Vec::<f64>::new()]);
    let e = model
        .forward_backward(&[SeqPair::new(&[1], &[2, 3])], &[1.0], 1.0)
        .unwrap_err();
    assert!(e.to_string().contains("1 log-prob gradients for 2"), "{e}");
    let e = model
        .forward_backward(&[SeqPair::new(&[1], &[2])], &[f64::NAN], 1.0)
        .unwrap_err();
    assert!(e.to_string().contains("not finite"), "{e}");
    let e = model
        .logprobs(&[SeqPair::new(&[1], &[400])], 1.0, false)
        .unwrap_err();
    assert!(e.to_string().contains("outside the vocabulary"), "{e}");
    assert!(model
        .logprobs(&[SeqPair::new(&[1], &[2])], 0.0, false)
        .is_err());
}

#[test]
fn random_init_is_deterministic() {
    let a = Model::new_random(micro(false), 3, DType::F32, &Device::Cpu).unwrap();
    let b = Model::new_random(micro(false), 3, DType::F32, &Device::Cpu).unwrap();
    let c = Model::new_random(micro(false), 4, DType::F32, &Device::Cpu).unwrap();
    let emb = |m: &Model| flat(m.params()[0].var.as_tensor());
    assert_eq!(emb(&a), emb(&b));
    assert_ne!(emb(&a), emb(&c));
}

#[test]
fn bf16_compute_keeps_f32_masters_and_tracks_f32() {
    let b = batch(512);
    let f32_model = random_model(ModelConfig::tiny(), DType::F32);
    let mut bf16_model = random_model(ModelConfig::tiny(), DType::BF16);
    assert_eq!(bf16_model.master_dtype(), DType::F32);
    let want = f32_model.logprobs(&as_pairs(&b), 1.0, false).unwrap();
    let n: usize = b.iter().map(|(_, r)| r.len()).sum();
    let got = bf16_model
        .forward_backward(&as_pairs(&b), &weights(n), 1.0)
        .unwrap();
    let diff = got
        .iter()
        .flatten()
        .zip(want.logprobs.iter().flatten())
        .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff < 0.05, "bf16 log-probs differ from f32 by {diff}");
    assert!(bf16_model
        .grads()
        .iter()
        .all(|g| g.as_ref().unwrap().dtype() == DType::F32));
}

fn bits(m: &Model) -> Vec<Vec<u64>> {
    m.params()
        .iter()
        .map(|p| {
            flat(p.var.as_tensor())
                .iter()
                .map(|x| x.to_bits())
                .collect()
        })
        .collect()
}

#[test]
fn save_and_reload_bit_identical_single_and_sharded() {
    let tmp = tempfile::tempdir().unwrap();
    let model = random_model(micro(false), DType::F32);
    let single = tmp.path().join("single");
    model.save_hf(&single).unwrap();
    assert!(single.join("model.safetensors").exists());
    assert!(single.join("generation_config.json").exists());
    let reloaded = Model::load(&single, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(bits(&model), bits(&reloaded));
    assert_eq!(reloaded.config().torch_dtype.as_deref(), Some("float32"));

    // Sharded, then saved again over the same directory (atomic replacement).
    let sharded = tmp.path().join("sharded");
    let opts = SaveOptions {
        dtype: None,
        max_shard_bytes: 4096,
    };
    model.save_hf_with(&sharded, &opts).unwrap();
    model.save_hf_with(&sharded, &opts).unwrap();
    assert!(sharded.join("model.safetensors.index.json").exists());
    assert!(!sharded.join("model.safetensors").exists());
    let shards = std::fs::read_dir(&sharded)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("model-")
        })
        .count();
    assert!(shards > 2, "{shards} shards");
    let reloaded = Model::load(&sharded, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(bits(&model), bits(&reloaded));
    let leftovers = std::fs::read_dir(tmp.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with('.')
        })
        .count();
    assert_eq!(leftovers, 0);

    // bf16 storage: loads back as the bf16-rounded weights; tokenizer files follow the model.
    std::fs::write(single.join("tokenizer.json"), "{}").unwrap();
    let from_dir = Model::load(&single, DType::F32, &Device::Cpu).unwrap();
    let half = tmp.path().join("half");
    let opts = SaveOptions {
        dtype: Some(DType::BF16),
        ..SaveOptions::default()
    };
    from_dir.save_hf_with(&half, &opts).unwrap();
    assert!(half.join("tokenizer.json").exists());
    let reloaded = Model::load(&half, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(reloaded.config().torch_dtype.as_deref(), Some("bfloat16"));
    let a = flat(
        &model.params()[1]
            .var
            .as_tensor()
            .to_dtype(DType::BF16)
            .unwrap(),
    );
    assert_eq!(a, flat(reloaded.params()[1].var.as_tensor()));
}

#[test]
fn loading_names_missing_extra_and_misshaped_tensors() {
    let tmp = tempfile::tempdir().unwrap();
    let model = random_model(micro(false), DType::F32);
    let dir = tmp.path().join("m");
    model.save_hf(&dir).unwrap();
    let file = dir.join("model.safetensors");
    let original = candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
    let err_with = |edit: &dyn Fn(&mut std::collections::HashMap<String, Tensor>)| {
        let mut t = original.clone();
        edit(&mut t);
        candle_core::safetensors::save(&t, &file).unwrap();
        match Model::load(&dir, DType::F32, &Device::Cpu) {
            Ok(_) => String::from("loaded"),
            Err(e) => e.to_string(),
        }
    };
    let e = err_with(&|t| {
        t.remove("model.layers.1.mlp.up_proj.weight");
    });
    assert!(
        e.contains("model.layers.1.mlp.up_proj.weight is missing"),
        "{e}"
    );
    let e = err_with(&|t| {
        t.insert(
            "model.extra.weight".into(),
            Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap(),
        );
    });
    assert!(e.contains("unexpected tensor model.extra.weight"), "{e}");
    let e = err_with(&|t| {
        t.insert(
            "model.norm.weight".into(),
            Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap(),
        );
    });
    assert!(
        e.contains("model.norm.weight has shape [3], expected [16]"),
        "{e}"
    );
    let e = err_with(&|t| {
        let w = Tensor::zeros(16, DType::U8, &Device::Cpu).unwrap();
        t.insert("model.norm.weight".into(), w);
    });
    assert!(e.contains("model.norm.weight has dtype"), "{e}");

    // An index may not point outside the model directory.
    std::fs::remove_file(&file).unwrap();
    let index = serde_json::json!({"weight_map": {"model.norm.weight": "../outside.safetensors"}});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let e = Model::load(&dir, DType::F32, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a file inside the model directory"), "{e}");
    let index = serde_json::json!({"weight_map": {"model.norm.weight": "model-1.safetensors"}});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let e = Model::load(&dir, DType::F32, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"model-1.safetensors\", which does not exist"),
        "{e}"
    );
    std::fs::remove_file(dir.join("model.safetensors.index.json")).unwrap();
    let e = Model::load(&dir, DType::F32, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("neither model.safetensors"), "{e}");
}

#[test]
fn optimizer_state_round_trips_and_skips_non_finite_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let b = batch(40);
    let n: usize = b.iter().map(|(_, r)| r.len()).sum();
    let mut model = random_model(micro(true), DType::F32);
    let mut opt = AdamW::new(&model, AdamWConfig::default());
    model
        .forward_backward(&as_pairs(&b), &weights(n), 1.0)
        .unwrap();
    let report = opt.step(&mut model, 1e-3).unwrap();
    assert!(!report.skipped && report.grad_norm > 0.0);
    assert!(model.grads().iter().all(Option::is_none));

    let path = tmp.path().join("optim.safetensors");
    opt.save(&path).unwrap();
    let mut restored = AdamW::load(&path, &model).unwrap();
    assert_eq!(restored.steps(), 1);
    assert_eq!(restored.config(), opt.config());
    // The same next step from the saved and the live state gives bit-identical weights.
    let mut twin = Model::load(
        {
            let d = tmp.path().join("twin");
            model.save_hf(&d).unwrap();
            d
        },
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    for m in [&mut model, &mut twin] {
        m.forward_backward(&as_pairs(&b), &weights(n), 1.0).unwrap();
    }
    opt.step(&mut model, 1e-3).unwrap();
    restored.step(&mut twin, 1e-3).unwrap();
    assert_eq!(bits(&model), bits(&twin));

    // A non-finite gradient norm skips the update and clears the gradients.
    let before = bits(&model);
    model
        .forward_backward(&as_pairs(&b), &weights(n), 1.0)
        .unwrap();
    let g = model.grads()[0].as_ref().unwrap();
    let nan = Var::from_tensor(&(g * f64::NAN).unwrap()).unwrap();
    model.grads_mut()[0] = Some(nan.as_tensor().clone());
    let report = opt.step(&mut model, 1e-3).unwrap();
    assert!(report.skipped && !report.grad_norm.is_finite());
    assert_eq!(bits(&model), before);
    assert!(model.grads().iter().all(Option::is_none));
    assert_eq!(opt.steps(), 2);

    // State for another model is refused, naming the problem.
    let other = random_model(
        ModelConfig {
            intermediate_size: 20,
            ..micro(true)
        },
        DType::F32,
    );
    let e = AdamW::load(&path, &other).unwrap_err().to_string();
    assert!(
        e.contains("optim.safetensors") && e.contains("mlp.gate_proj.weight"),
        "{e}"
    );
}

/// The accumulated gradients of `model`, flattened, in parameter order.
fn all_grads(model: &Model) -> Vec<Vec<f64>> {
    model
        .grads()
        .iter()
        .map(|g| flat(g.as_ref().expect("every parameter has a gradient")))
        .collect()
}

#[test]
fn activation_recompute_gives_the_same_gradients() {
    for tied in [true, false] {
        let b = batch(40);
        let n: usize = b.iter().map(|(_, r)| r.len()).sum();
        let w = weights(n);
        let split = b[0].1.len();
        let mut model = random_model(micro(tied), DType::F64);
        let mut run = |recompute: bool| {
            model.zero_grad();
            model.set_activation_recompute(recompute);
            let lp = model.forward_backward(&as_pairs(&b), &w, 0.7).unwrap();
            let once = all_grads(&model);
            // Two micro-batches accumulate into the same buffers.
            model.zero_grad();
            model
                .forward_backward(&as_pairs(&b[..1]), &w[..split], 0.7)
                .unwrap();
            model
                .forward_backward(&as_pairs(&b[1..]), &w[split..], 0.7)
                .unwrap();
            (lp, once, all_grads(&model))
        };
        let (lp_full, once_full, acc_full) = run(false);
        let (lp_re, once_re, acc_re) = run(true);
        assert_eq!(lp_full, lp_re, "tied={tied}: log-probs differ");
        for (kind, full, re) in [
            ("packed", &once_full, &once_re),
            ("accumulated", &acc_full, &acc_re),
        ] {
            for ((p, a), b) in model.params().iter().zip(full).zip(re) {
                let diff = a
                    .iter()
                    .zip(b)
                    .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
                assert!(
                    diff < 1e-12,
                    "{} (tied={tied}, {kind}): recompute gradient off by {diff:e}",
                    p.name
                );
            }
        }
    }
}

#[test]
fn bf16_activation_recompute_matches_full_graph() {
    let b = batch(512);
    let n: usize = b.iter().map(|(_, r)| r.len()).sum();
    let mut model = random_model(ModelConfig::tiny(), DType::BF16);
    model
        .forward_backward(&as_pairs(&b), &weights(n), 1.0)
        .unwrap();
    let full = all_grads(&model);
    model.zero_grad();
    model.set_activation_recompute(true);
    model
        .forward_backward(&as_pairs(&b), &weights(n), 1.0)
        .unwrap();
    for ((p, a), g) in model.params().iter().zip(&full).zip(model.grads()) {
        let g = g.as_ref().unwrap();
        assert_eq!(g.dtype(), DType::F32, "{}", p.name);
        let scale = a.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let diff = a
            .iter()
            .zip(flat(g))
            .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
        assert!(diff <= 1e-6 * scale.max(1e-6), "{}: {diff:e}", p.name);
    }
}

#[test]
fn mixed_logprobs_of_one_model_equal_its_logprobs() {
    let mut b = batch(512);
    b.push((ids(9, 3, 512), vec![]));
    let model = random_model(ModelConfig::tiny(), DType::F64);
    for temperature in [1.0, 0.7] {
        let want = model.logprobs(&as_pairs(&b), temperature, false).unwrap();
        let got = mixed_logprobs(&[(&model, 1.0)], &as_pairs(&b), temperature).unwrap();
        assert_eq!(got.len(), b.len());
        assert!(got[b.len() - 1].is_empty());
        for (i, (g, w)) in got.iter().zip(&want.logprobs).enumerate() {
            assert_eq!(g.len(), w.len());
            for (x, y) in g.iter().zip(w) {
                assert!(
                    (x - y).abs() < 1e-10,
                    "pair {i} (τ={temperature}): {x} vs {y}"
                );
            }
        }
    }
}

/// Hand-mixed reference: every model's log-probs of every vocabulary entry at every scored
/// position (`log softmax(z_i)` differs from `z_i` by a per-position constant, which the mixture's
/// softmax removes), mixed and normalised directly.
fn hand_mixed(parts: &[(&Model, f64)], b: &[(Vec<u32>, Vec<u32>)], tau: f64) -> Vec<Vec<f64>> {
    let vocab = parts[0].0.config().vocab_size as u32;
    b.iter()
        .map(|(prompt, response)| {
            (0..response.len())
                .map(|t| {
                    let ctx: Vec<u32> = prompt.iter().chain(&response[..t]).copied().collect();
                    let next: Vec<[u32; 1]> = (0..vocab).map(|v| [v]).collect();
                    let pairs: Vec<SeqPair<'_>> =
                        next.iter().map(|v| SeqPair::new(&ctx, v)).collect();
                    let mut z = vec![0.0f64; vocab as usize];
                    for (m, w) in parts {
                        let lp = m.logprobs(&pairs, 1.0, false).unwrap().logprobs;
                        for (zv, l) in z.iter_mut().zip(lp) {
                            *zv += w * l[0] / tau;
                        }
                    }
                    let max = z.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x));
                    let lse = max + z.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
                    z[response[t] as usize] - lse
                })
                .collect()
        })
        .collect()
}

#[test]
fn mixed_logprobs_match_a_hand_mixed_reference() {
    let b = batch(40);
    let student = random_model(micro(true), DType::F64);
    let teacher = Model::new_random(micro(false), 11, DType::F64, &Device::Cpu).unwrap();
    let parts = [(&student, 0.9), (&teacher, 0.1)];
    let tau = 0.8;
    let got = mixed_logprobs(&parts, &as_pairs(&b), tau).unwrap();
    let want = hand_mixed(&parts, &b, tau);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.len(), w.len());
        for (x, y) in g.iter().zip(w) {
            assert!((x - y).abs() < 1e-10, "pair {i}: {x} vs {y}");
        }
    }
    // The mixture is not either model alone.
    let alone = student.logprobs(&as_pairs(&b), tau, false).unwrap();
    assert!(got[0]
        .iter()
        .zip(&alone.logprobs[0])
        .any(|(x, y)| (x - y).abs() > 1e-6));
}

#[test]
fn mixed_logprobs_reject_bad_inputs() {
    let a = random_model(micro(true), DType::F32);
    let other = Model::new_random(ModelConfig::tiny(), 1, DType::F32, &Device::Cpu).unwrap();
    let pairs = [SeqPair::new(&[1, 2], &[3])];
    let err = |parts: &[(&Model, f64)], tau: f64| {
        mixed_logprobs(parts, &pairs, tau).unwrap_err().to_string()
    };
    assert!(err(&[], 1.0).contains("no models"));
    let e = err(&[(&a, 0.5), (&other, 0.5)], 1.0);
    assert!(e.contains("model 1 has a vocabulary of 512"), "{e}");
    assert!(err(&[(&a, f64::NAN)], 1.0).contains("weight 0 is not finite"));
    assert!(err(&[(&a, 1.0)], 0.0).contains("temperature"));
    let e = mixed_logprobs(&[(&a, 1.0)], &[SeqPair::new(&[1], &[40])], 1.0).unwrap_err();
    assert!(e.to_string().contains("outside the vocabulary"), "{e}");
}

/// The bits of a tensor's values as f32 (exact for f32 and bf16).
fn bits32(t: &Tensor) -> Vec<u32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

/// Log-probs of a pass and every gradient after two accumulated micro-batches, as bits.
fn pass_bits(m: &mut Model) -> (Vec<u64>, Vec<Vec<u32>>) {
    let b = batch(m.config().vocab_size);
    let pairs = as_pairs(&b);
    let lp = m.logprobs(&pairs, 0.7, false).unwrap().logprobs.concat();
    m.zero_grad();
    for chunk in [&pairs[..1], &pairs[1..]] {
        let n: usize = chunk.iter().map(|p| p.response.len()).sum();
        m.forward_backward(chunk, &weights(n), 0.7).unwrap();
    }
    let grads = m
        .grads()
        .iter()
        .map(|g| {
            let g = g.as_ref().expect("every parameter gets a gradient");
            assert_eq!(g.dtype(), DType::F32, "gradients stay in the master dtype");
            bits32(g)
        })
        .collect();
    (lp.iter().map(|x| x.to_bits()).collect(), grads)
}

#[test]
fn dropped_masters_give_the_same_bits_and_halve_the_masters_held() {
    let tmp = tempfile::tempdir().unwrap();
    for tied in [true, false] {
        for (recompute, flip) in [(false, false), (false, true), (true, false), (true, true)] {
            let what = format!("tied={tied} recompute={recompute} flip={flip}");
            let mut full = random_model(micro(tied), DType::BF16);
            let mut part = random_model(micro(tied), DType::BF16);
            full.set_activation_recompute(recompute);
            part.set_activation_recompute(recompute);
            // Keep the masters of the first parameters, about half of the elements (the
            // embedding among them), or (`flip`) of the others: a tied embedding and head then
            // compute from a replica used twice in one graph.
            let sizes: Vec<u64> = full
                .params()
                .iter()
                .map(|p| p.var.elem_count() as u64)
                .collect();
            let total: u64 = sizes.iter().sum();
            let mut at = 0;
            let first_half: Vec<bool> = sizes
                .iter()
                .map(|&s| {
                    at += s;
                    at - s < total / 2
                })
                .collect();
            let keep: Vec<bool> = first_half.iter().map(|&k| k != flip).collect();
            for (i, &k) in keep.iter().enumerate() {
                if !k {
                    part.drop_master(i).unwrap();
                }
            }
            assert!(keep.iter().any(|&k| !k) && keep.iter().any(|&k| k));
            for (i, &k) in keep.iter().enumerate() {
                assert_eq!(part.holds_master(i), k, "{what}");
            }
            assert_eq!(pass_bits(&mut part), pass_bits(&mut full), "{what}");

            // Held bytes: the dropped masters' f32 bytes became bf16 replicas of half the size.
            let (h, f) = (part.held_weights(), full.held_weights());
            assert_eq!(f.replicas, 0);
            assert_eq!(h.masters + 2 * h.replicas, f.masters, "{what}");
            let kept: u64 = (0..sizes.len())
                .filter(|&i| keep[i])
                .map(|i| sizes[i] * 4)
                .sum();
            assert_eq!(h.masters, kept, "{what}");
            assert!(
                (h.masters as f64) < 0.75 * f.masters as f64,
                "{what}: {} of {} bytes of masters kept",
                h.masters,
                f.masters
            );

            // A step updating only the kept masters gives them the bits of the full model's.
            let cfg = AdamWConfig::default();
            let (mut oa, mut ob) = (AdamW::new(&full, cfg), AdamW::new(&part, cfg));
            let norm = full.grad_norm().unwrap();
            oa.step(&mut full, 1e-2).unwrap();
            for (i, g) in part.grads_mut().iter_mut().enumerate() {
                if !keep[i] {
                    *g = None;
                }
            }
            ob.step_with_norm(&mut part, 1e-2, norm).unwrap();
            // The owners' casts sent to the replicas, as data-parallel ranks do.
            for (i, &k) in keep.iter().enumerate() {
                if k {
                    assert_eq!(
                        bits32(part.params()[i].var.as_tensor()),
                        bits32(full.params()[i].var.as_tensor()),
                        "{what}: {}",
                        part.params()[i].name
                    );
                } else {
                    let bytes = full.weight_bytes(i, DType::BF16).unwrap();
                    part.set_weight_bytes(i, DType::BF16, &bytes).unwrap();
                    assert!(!part.holds_master(i));
                }
            }
            assert_eq!(pass_bits(&mut part), pass_bits(&mut full), "{what}");

            // No f32 checkpoint without the masters; the bf16 one is the full model's.
            let err = part.save_hf(tmp.path().join("no")).unwrap_err().to_string();
            assert!(err.contains("replica"), "{err}");
            assert!(!tmp.path().join("no").exists());
            let bf16 = SaveOptions {
                dtype: Some(DType::BF16),
                ..SaveOptions::default()
            };
            let file = |m: &Model, name: &str| {
                let dir = tmp.path().join(name);
                m.save_hf_with(&dir, &bf16).unwrap();
                std::fs::read(dir.join("model.safetensors")).unwrap()
            };
            assert_eq!(file(&part, "part"), file(&full, "full"), "{what}");

            // Restoring the masters (a checkpoint's gather) gives the full model back.
            for (i, &k) in keep.iter().enumerate() {
                if !k {
                    let bytes = full.weight_bytes(i, DType::F32).unwrap();
                    part.set_weight_bytes(i, DType::F32, &bytes).unwrap();
                }
            }
            assert_eq!(part.held_weights(), full.held_weights());
            assert_eq!(bits(&part), bits(&full));
        }
    }
    // f32: the masters are the compute weights.
    let mut m = random_model(micro(true), DType::F32);
    let err = m.drop_master(0).unwrap_err().to_string();
    assert!(err.contains("compute weights"), "{err}");
    assert!(m.holds_master(0));
}
