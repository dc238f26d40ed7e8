//! LoRA adapters served next to the base model: selected by `model` (completions) or
//! `lora_path` (generate), they sample what the in-process engine samples with the adapter
//! loaded; loaded and unloaded at run time through vLLM's and SGLang's endpoints; bad adapters
//! and names are 4xx errors naming the problem while the server keeps serving.

use std::path::{Path, PathBuf};
use std::thread;

use rlreplay_model::generate::Decoder;
use rlreplay_model::{DType, Device, Model, ModelConfig};
use rlreplay_sampling::engine::{generate, Generation};
use rlreplay_sampling::sampling::SamplingParams;
use rlreplay_serve::{BoundServer, Error, ServeConfig};
use serde_json::{json, Value};

use crate::common::*;

const PROMPTS: [&[u32]; 2] = [&[1, 2, 3, 4], &[9, 8]];

fn prompts() -> Vec<Vec<u32>> {
    PROMPTS.iter().map(|p| p.to_vec()).collect()
}

/// What `decoder` samples for [`PROMPTS`], 2 each, 12 tokens at temperature 0.9, seed `seed`.
fn local(decoder: &Decoder, seed: u64) -> Vec<Generation> {
    let params = SamplingParams {
        temperature: 0.9,
        top_p: 1.0,
        top_k: 0,
        max_new_tokens: 12,
        stop_ids: vec![7],
        seed,
    };
    generate(decoder, &prompts(), 2, &params, 256, |_| {}).unwrap()
}

/// `(tokens, log-probs)` of each sample of a completions request for [`PROMPTS`] on `model`.
fn completions(url: &str, model: &str, seed: u64) -> Reply {
    post(
        url,
        "/v1/completions",
        &json!({"model": model, "prompt": prompts(), "n": 2, "max_tokens": 12,
                "temperature": 0.9, "seed": seed, "logprobs": 0, "return_token_ids": true}),
    )
}

fn samples_of_completions(r: &Reply) -> Vec<(Vec<u32>, Vec<f32>)> {
    assert_eq!(r.status, 200, "{}", r.body);
    r.body["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                u32s(&c["token_ids"]),
                f32s(&c["logprobs"]["token_logprobs"]),
            )
        })
        .collect()
}

/// The same request on SGLang's `/generate`, with `lora_path` when given.
fn generate_on(url: &str, lora_path: Option<&str>, seed: u64) -> Reply {
    let mut body = json!({"input_ids": prompts(), "return_logprob": true,
        "sampling_params": {"n": 2, "max_new_tokens": 12, "temperature": 0.9,
                            "sampling_seed": seed}});
    if let Some(l) = lora_path {
        body["lora_path"] = json!(l);
    }
    post(url, "/generate", &body)
}

fn samples_of_generate(r: &Reply) -> Vec<(Vec<u32>, Vec<f32>)> {
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let lp: Vec<f32> = o["meta_info"]["output_token_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e[0].as_f64().unwrap() as f32)
                .collect();
            (u32s(&o["output_ids"]), lp)
        })
        .collect()
}

fn want(g: &[Generation]) -> Vec<(Vec<u32>, Vec<f32>)> {
    g.iter()
        .map(|g| (g.tokens.clone(), g.logprobs.clone()))
        .collect()
}

/// A base model and two adapters of other ranks and targets, in one temporary directory.
struct Fixture {
    _tmp: tempfile::TempDir,
    base: PathBuf,
    a: PathBuf,
    b: PathBuf,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    tiny_model(&base, 1);
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    save_adapter(&base, &a, 4, &["q_proj", "v_proj", "down_proj"], 3);
    save_adapter(&base, &b, 2, &["all-linear"], 4);
    Fixture {
        _tmp: tmp,
        base,
        a,
        b,
    }
}

#[test]
fn adapters_sample_what_the_engine_samples_with_the_adapter_loaded() {
    let f = fixture();
    let server = serve(&f.base, |c| {
        c.served_model_name = Some("base".into());
        c.adapters = vec![("a".into(), f.a.clone()), ("b".into(), f.b.clone())];
    });
    let url = server.url();
    let base = local(&decoder_of(&f.base), 5);
    let a = local(&adapter_decoder(&f.base, &f.a), 5);
    let b = local(&adapter_decoder(&f.base, &f.b), 5);
    assert_ne!(want(&a), want(&base), "the adapter changes nothing");
    assert_ne!(want(&a), want(&b));
    // Requests on the three models at once: each gets its own model's samples, bit for bit.
    let urls = [url.clone(), url.clone(), url.clone()];
    let got: Vec<_> = thread::scope(|s| {
        let hs: Vec<_> = ["base", "a", "b"]
            .iter()
            .zip(&urls)
            .map(|(m, u)| s.spawn(move || samples_of_completions(&completions(u, m, 5))))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got[0], want(&base));
    assert_eq!(got[1], want(&a));
    assert_eq!(got[2], want(&b));
    // The answer names the model that generated it.
    assert_eq!(completions(&url, "a", 5).body["model"], "a");
    // No model: the base model.
    let r = post(
        &url,
        "/v1/completions",
        &json!({"prompt": prompts(), "n": 2, "max_tokens": 12, "temperature": 0.9, "seed": 5,
                "logprobs": 0, "return_token_ids": true}),
    );
    assert_eq!(samples_of_completions(&r), want(&base));
    // SGLang selects the adapter by name in lora_path (one, or the same for every prompt).
    assert_eq!(
        samples_of_generate(&generate_on(&url, Some("a"), 5)),
        want(&a)
    );
    assert_eq!(
        samples_of_generate(&generate_on(&url, None, 5)),
        want(&base)
    );
    let mut body = json!({"input_ids": prompts(), "return_logprob": true,
        "lora_path": ["b", "b"],
        "sampling_params": {"n": 2, "max_new_tokens": 12, "temperature": 0.9,
                            "sampling_seed": 5}});
    assert_eq!(
        samples_of_generate(&post(&url, "/generate", &body)),
        want(&b)
    );
    body["lora_path"] = json!(["a", "b"]);
    let r = post(&url, "/generate", &body);
    assert_eq!((r.status, &r.body["param"]), (400, &json!("lora_path")));
    // /v1/models lists the adapters with the base model as parent, as vLLM does.
    let m = get(&url, "/v1/models").body;
    let cards = m["data"].as_array().unwrap();
    let ids: Vec<&str> = cards.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["base", "a", "b"]);
    assert_eq!(cards[0]["parent"], Value::Null);
    assert_eq!(cards[1]["parent"], "base");
    assert_eq!(cards[1]["root"], f.a.display().to_string());
    // Unknown names: 404 naming the model (vLLM), 400 naming lora_path (SGLang).
    let r = completions(&url, "c", 5);
    assert_eq!(r.status, 404, "{}", r.body);
    let e = &r.body["error"];
    assert_eq!(
        (&e["type"], &e["param"]),
        (&json!("NotFoundError"), &json!("model"))
    );
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("`c` does not exist") && msg.contains("`a`"),
        "{msg}"
    );
    let r = generate_on(&url, Some("c"), 5);
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.body["param"], "lora_path");
    assert!(r.body["message"]
        .as_str()
        .unwrap()
        .contains("`c` is not loaded"));
    // Every request was served on one engine: the counters add up.
    let info = get(&url, "/get_server_info").body;
    assert_eq!(info["running_seqs"], 0);
    assert!(info["generated_tokens"].as_u64().unwrap() > 0);
}

fn decoder_of(dir: &Path) -> Decoder {
    decoder(&Model::load(dir, DType::F32, &Device::Cpu).unwrap())
}

#[test]
fn adapters_load_and_unload_at_run_time_through_vllm_and_sglang_endpoints() {
    let f = fixture();
    let server = serve(&f.base, |c| c.served_model_name = Some("base".into()));
    let url = server.url();
    let a = want(&local(&adapter_decoder(&f.base, &f.a), 6));
    let b = want(&local(&adapter_decoder(&f.base, &f.b), 6));
    // vLLM: a plain-text success message.
    let load = |name: &str, dir: &Path, extra: Value| {
        let mut body = json!({"lora_name": name, "lora_path": dir});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        post(&url, "/v1/load_lora_adapter", &body)
    };
    let r = load("pol", &f.a, json!({}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.body,
        json!("Success: LoRA adapter 'pol' added successfully.")
    );
    assert_eq!(samples_of_completions(&completions(&url, "pol", 6)), a);
    let ids: Vec<Value> = get(&url, "/v1/models").body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].clone())
        .collect();
    assert_eq!(ids, [json!("base"), json!("pol")]);
    // A name already loaded: refused unless load_inplace, as vLLM does.
    let r = load("pol", &f.b, json!({}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.body["error"]["param"], "lora_name");
    assert!(r.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("already been loaded"));
    assert_eq!(samples_of_completions(&completions(&url, "pol", 6)), a);
    let r = load("pol", &f.b, json!({"load_inplace": true}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.as_str().unwrap().contains("replaced"));
    assert_eq!(samples_of_completions(&completions(&url, "pol", 6)), b);
    // The base model's name is not an adapter name.
    let r = load("base", &f.a, json!({}));
    assert_eq!(
        (r.status, &r.body["error"]["param"]),
        (400, &json!("lora_name"))
    );
    // Unload: plain text; again, or an unknown name: 404 in vLLM's envelope.
    let r = post(
        &url,
        "/v1/unload_lora_adapter",
        &json!({"lora_name": "pol"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.body,
        json!("Success: LoRA adapter 'pol' removed successfully.")
    );
    let r = post(
        &url,
        "/v1/unload_lora_adapter",
        &json!({"lora_name": "pol"}),
    );
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.body["error"]["type"], "NotFoundError");
    assert_eq!(r.body["error"]["param"], "lora_name");
    assert_eq!(completions(&url, "pol", 6).status, 404);
    // SGLang: JSON answers with success and the loaded adapters, failures 400 with
    // success = false; a name already loaded is refused.
    let r = post(
        &url,
        "/load_lora_adapter",
        &json!({"lora_name": "x", "lora_path": f.a, "pinned": false}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["success"], true);
    assert_eq!(r.body["error_message"], Value::Null);
    assert_eq!(
        r.body["loaded_adapters"],
        json!({"x": f.a.display().to_string()})
    );
    assert_eq!(samples_of_generate(&generate_on(&url, Some("x"), 6)), a);
    let r = post(
        &url,
        "/load_lora_adapter",
        &json!({"lora_name": "x", "lora_path": f.b}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.body["success"], false);
    assert!(r.body["error_message"]
        .as_str()
        .unwrap()
        .contains("already been loaded"));
    let r = post(&url, "/unload_lora_adapter", &json!({"lora_name": "x"}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (r.body["success"].clone(), r.body["loaded_adapters"].clone()),
        (json!(true), json!({}))
    );
    let r = post(&url, "/unload_lora_adapter", &json!({"lora_name": "x"}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.body["success"], false);
    assert!(r.body["error_message"]
        .as_str()
        .unwrap()
        .contains("`x` cannot be found"));
    // Missing fields and unknown ones name the field.
    let r = post(&url, "/v1/load_lora_adapter", &json!({"lora_name": "y"}));
    assert_eq!(
        (r.status, &r.body["error"]["param"]),
        (400, &json!("lora_path"))
    );
    let r = post(
        &url,
        "/v1/load_lora_adapter",
        &json!({"lora_name": "y", "lora_path": f.a, "scale": 2}),
    );
    assert_eq!(
        (r.status, &r.body["error"]["param"]),
        (400, &json!("scale"))
    );
}

#[test]
fn a_weight_update_merges_the_served_adapters_into_the_new_weights() {
    let f = fixture();
    let server = serve(&f.base, |c| {
        c.adapters = vec![("a".into(), f.a.clone())];
        c.served_model_name = Some("base".into());
    });
    let url = server.url();
    let new = f._tmp.path().join("new");
    tiny_model(&new, 2);
    let r = post(
        &url,
        "/update_weights_from_disk",
        &json!({"model_path": new, "weight_version": "2"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let a = want(&local(&adapter_decoder(&new, &f.a), 8));
    assert_eq!(samples_of_completions(&completions(&url, "a", 8)), a);
    // An adapter loaded afterwards goes onto the new weights too.
    let r = post(
        &url,
        "/v1/load_lora_adapter",
        &json!({"lora_name": "b", "lora_path": f.b}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let b = want(&local(&adapter_decoder(&new, &f.b), 8));
    assert_eq!(samples_of_completions(&completions(&url, "b", 8)), b);
    // An adapter that no longer loads fails the update, naming it; the old weights stay.
    std::fs::remove_dir_all(&f.b).unwrap();
    let r = post(
        &url,
        "/update_weights_from_disk",
        &json!({"model_path": f.base, "weight_version": "3"}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body["message"].as_str().unwrap().contains("`b`"),
        "{}",
        r.body
    );
    assert_eq!(samples_of_completions(&completions(&url, "a", 8)), a);
    assert_eq!(get(&url, "/get_weight_version").body["weight_version"], "2");
}

/// Writes a copy of adapter `from` into `dir` and breaks it with `edit`.
fn broken(from: &Path, dir: &Path, edit: impl FnOnce(&Path)) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    for f in ["adapter_config.json", "adapter_model.safetensors"] {
        std::fs::copy(from.join(f), dir.join(f)).unwrap();
    }
    edit(dir);
    dir.to_path_buf()
}

#[test]
fn bad_adapters_are_400s_naming_the_problem_and_requests_in_flight_are_undisturbed() {
    let f = fixture();
    let root = f._tmp.path();
    let server = serve(&f.base, |c| c.served_model_name = Some("base".into()));
    let url = server.url();
    // An adapter made for another model (hidden size 64): its shapes do not fit.
    let other = root.join("other");
    {
        let mut cfg = ModelConfig::tiny();
        cfg.hidden_size = 64;
        let m = Model::new_random(cfg, 1, DType::F32, &Device::Cpu).unwrap();
        m.save_hf(&other).unwrap();
    }
    let misfit = root.join("misfit");
    save_adapter(&other, &misfit, 4, &["q_proj"], 1);
    let q_a = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
    let weights = "adapter_model.safetensors";
    let config = "adapter_config.json";
    let cases: Vec<(&str, PathBuf, Vec<&str>)> = vec![
        (
            "missing directory",
            root.join("nothing"),
            vec!["nothing", config],
        ),
        (
            "corrupt safetensors",
            broken(&f.a, &root.join("corrupt"), |d| {
                std::fs::write(d.join(weights), b"\x08\0\0\0\0\0\0\0{\"a\":").unwrap()
            }),
            vec![weights, "cannot read safetensors"],
        ),
        (
            "truncated safetensors",
            broken(&f.a, &root.join("truncated"), |d| {
                let bytes = std::fs::read(d.join(weights)).unwrap();
                std::fs::write(d.join(weights), &bytes[..bytes.len() / 2]).unwrap()
            }),
            vec![weights, "cannot read safetensors"],
        ),
        (
            "rank of the configuration is not the tensors'",
            broken(&f.a, &root.join("rank"), |d| {
                let text = std::fs::read_to_string(d.join(config)).unwrap();
                let mut v: Value = serde_json::from_str(&text).unwrap();
                v["r"] = json!(8);
                std::fs::write(d.join(config), v.to_string()).unwrap()
            }),
            vec![
                q_a,
                "[4, 128]",
                "model.layers.0.self_attn.q_proj",
                "rank 8",
                "[8, 128]",
            ],
        ),
        (
            "targets without tensors",
            broken(&f.a, &root.join("targets"), |d| {
                let text = std::fs::read_to_string(d.join(config)).unwrap();
                let mut v: Value = serde_json::from_str(&text).unwrap();
                v["target_modules"] = json!(["q_proj", "v_proj", "down_proj", "up_proj"]);
                std::fs::write(d.join(config), v.to_string()).unwrap()
            }),
            vec!["up_proj", "missing"],
        ),
        (
            "shapes of another model",
            misfit,
            vec![q_a, "[4, 64]", "[128, 128]", "[4, 128]"],
        ),
        (
            "unsupported option",
            broken(&f.a, &root.join("dora"), |d| {
                let text = std::fs::read_to_string(d.join(config)).unwrap();
                let mut v: Value = serde_json::from_str(&text).unwrap();
                v["use_dora"] = json!(true);
                std::fs::write(d.join(config), v.to_string()).unwrap()
            }),
            vec!["use_dora"],
        ),
    ];
    // A long request on the base model runs through every refusal.
    let long_params = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        max_new_tokens: 1000,
        stop_ids: vec![],
        seed: 9,
    };
    let long_want = generate(
        &decoder_of(&f.base),
        &[vec![1, 2, 3]],
        4,
        &long_params,
        256,
        |_| {},
    )
    .unwrap();
    let long = {
        let url = url.clone();
        thread::spawn(move || {
            let r = post(
                &url,
                "/v1/completions",
                &json!({"prompt": [1, 2, 3], "n": 4, "max_tokens": 1000, "ignore_eos": true,
                        "seed": 9, "logprobs": 0, "return_token_ids": true}),
            );
            samples_of_completions(&r)
        })
    };
    let base = local(&decoder_of(&f.base), 9);
    for (what, dir, names) in &cases {
        for path in ["/v1/load_lora_adapter", "/load_lora_adapter"] {
            let r = post(&url, path, &json!({"lora_name": "bad", "lora_path": dir}));
            assert_eq!(r.status, 400, "{what}: {}", r.body);
            let msg = if path.starts_with("/v1/") {
                assert_eq!(r.body["error"]["param"], "lora_path", "{what}");
                r.body["error"]["message"].as_str().unwrap().to_owned()
            } else {
                assert_eq!(r.body["success"], false, "{what}");
                r.body["error_message"].as_str().unwrap().to_owned()
            };
            for n in names {
                assert!(msg.contains(n), "{what}: {n:?} not in {msg}");
            }
        }
    }
    assert_eq!(long.join().unwrap(), want(&long_want));
    // Nothing was loaded; the server serves on.
    assert_eq!(
        get(&url, "/v1/models").body["data"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(completions(&url, "bad", 9).status, 404);
    assert_eq!(
        samples_of_completions(&completions(&url, "base", 9)),
        want(&base)
    );
}

#[test]
fn adapters_given_at_start_are_checked() {
    let f = fixture();
    let bind = |adapters: Vec<(&str, &Path)>| {
        let mut cfg = ServeConfig::new(&f.base);
        cfg.port = 0;
        cfg.served_model_name = Some("base".into());
        cfg.adapters = adapters
            .into_iter()
            .map(|(n, d)| (n.to_owned(), d.to_path_buf()))
            .collect();
        BoundServer::bind(cfg)
            .err()
            .map(|e| (matches!(e, Error::Adapter(_)), e.to_string()))
    };
    let (adapter, msg) = bind(vec![("a", &f.a), ("a", &f.b)]).unwrap();
    assert!(
        !adapter && msg.contains("two adapters are named `a`"),
        "{msg}"
    );
    let (adapter, msg) = bind(vec![("base", &f.a)]).unwrap();
    assert!(!adapter && msg.contains("base model's name"), "{msg}");
    let (adapter, msg) = bind(vec![("", &f.a)]).unwrap();
    assert!(!adapter && msg.contains("empty"), "{msg}");
    let missing = f._tmp.path().join("missing");
    let (adapter, msg) = bind(vec![("m", &missing)]).unwrap();
    assert!(
        adapter && msg.contains("adapter `m`") && msg.contains("missing"),
        "{msg}"
    );
    assert!(bind(vec![("a", &f.a), ("b", &f.b)]).is_none());
}

#[test]
fn requests_in_flight_finish_on_the_adapter_they_started_on() {
    let f = fixture();
    let server = serve(&f.base, |c| {
        c.served_model_name = Some("base".into());
        c.adapters = vec![("x".into(), f.a.clone())];
    });
    let url = server.url();
    let params = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        max_new_tokens: 1500,
        stop_ids: vec![],
        seed: 2,
    };
    let want_a = generate(
        &adapter_decoder(&f.base, &f.a),
        &[vec![1, 2, 3]],
        4,
        &params,
        256,
        |_| {},
    )
    .unwrap();
    let long = {
        let url = url.clone();
        thread::spawn(move || {
            let r = post(
                &url,
                "/v1/completions",
                &json!({"model": "x", "prompt": [1, 2, 3], "n": 4, "max_tokens": 1500,
                        "ignore_eos": true, "seed": 2, "logprobs": 0, "return_token_ids": true}),
            );
            samples_of_completions(&r)
        })
    };
    while get(&url, "/get_server_info").body["running_seqs"] == 0 {
        thread::sleep(std::time::Duration::from_millis(5));
    }
    // Replaced, then unloaded, while it generates: new requests see the change at once.
    let r = post(
        &url,
        "/v1/load_lora_adapter",
        &json!({"lora_name": "x", "lora_path": f.b, "load_inplace": true}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let b = want(&local(&adapter_decoder(&f.base, &f.b), 3));
    assert_eq!(samples_of_completions(&completions(&url, "x", 3)), b);
    let r = post(&url, "/v1/unload_lora_adapter", &json!({"lora_name": "x"}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(completions(&url, "x", 3).status, 404);
    // The request in flight finished on the adapter it started on.
    assert_eq!(long.join().unwrap(), want(&want_a));
    assert_eq!(get(&url, "/get_server_info").body["running_seqs"], 0);
}
