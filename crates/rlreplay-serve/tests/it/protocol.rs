//! Protocol conformance: request and response bodies in the documented vLLM and SGLang shapes
//! (`tests/fixtures`) parse into the crate's types and are written back field for field, and the
//! server's own responses have exactly the fields of those shapes.

use std::path::PathBuf;

use rlreplay_serve::protocol::control::{
    LoadLoraAdapter, LoraUpdateResult, ModelInfo, UnloadLoraAdapter, UpdateWeightsFromDisk,
    UpdateWeightsResponse,
};
use rlreplay_serve::protocol::openai::{
    parse_token_placeholder, CompletionRequest, CompletionResponse, ErrorResponse,
};
use rlreplay_serve::protocol::sglang::{self, GenerateOutput, GenerateRequest};
use rlreplay_serve::protocol::{parse_body, Prompt};
use rlreplay_serve::request::{Limits, Tokens};
use serde_json::{json, Value};

use crate::common::*;

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn qwen3_limits() -> Limits {
    Limits {
        vocab_size: 151_936,
        max_model_len: 40_960,
        eos_ids: vec![151_645, 151_643],
        max_n: 1024,
        max_prompts: 8192,
        max_seqs: 16384,
        max_logprobs: 20,
        model_name: Some("Qwen/Qwen3-4B".into()),
    }
}

/// `ours` has exactly the object keys of `theirs`, recursively (lists element by element, up to
/// the shorter one).
fn same_fields(ours: &Value, theirs: &Value, at: &str) {
    match (ours, theirs) {
        // Maps of token to log-prob: keyed by the tokens sampled.
        (Value::Object(a), Value::Object(b)) if at.contains("top_logprobs[") => {
            assert_eq!(a.len(), b.len(), "entries of {at}");
        }
        (Value::Object(a), Value::Object(b)) => {
            let ka: Vec<_> = a.keys().collect();
            let kb: Vec<_> = b.keys().collect();
            assert_eq!(ka, kb, "fields of {at}");
            for (k, v) in b {
                same_fields(&a[k], v, &format!("{at}.{k}"));
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                same_fields(x, y, &format!("{at}[{i}]"));
            }
        }
        // Values may differ, and optional ones may be null on one side only.
        (Value::Null, _) | (_, Value::Null) => {}
        (a, b) => assert_eq!(
            std::mem::discriminant(a),
            std::mem::discriminant(b),
            "type of {at}: {a} vs {b}"
        ),
    }
}

/// Parses `name` as `T` and writes it back unchanged.
fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(name: &str) -> T {
    let v = fixture(name);
    let text = v.to_string();
    let parsed: T = if v.is_object() {
        parse_body(text.as_bytes()).unwrap()
    } else {
        serde_json::from_str(&text).unwrap()
    };
    // Through text: log-probs are f32 and written as f32.
    let back: Value = serde_json::from_str(&serde_json::to_string(&parsed).unwrap()).unwrap();
    assert_eq!(back, v, "{name}");
    parsed
}

#[test]
fn vllm_request_and_response_fixtures_parse_and_write_back() {
    let req: CompletionRequest = round_trip("vllm_completion_request.json");
    assert!(matches!(&req.prompt, Prompt::Batch(b) if b.len() == 2));
    let job = req.to_job(&qwen3_limits(), &Tokens::new(None)).unwrap();
    assert_eq!(
        (job.n, job.prompts.len(), job.top_logprobs),
        (2, 2, Some(0))
    );
    let spec = &job.prompts[0].spec;
    assert_eq!((spec.top_k, spec.top_p, spec.seed), (0, 1.0, 42));
    assert_eq!(spec.stop_ids, [151_645, 151_643]);
    // A client reads token ids and log-probs from a vLLM response.
    let resp: CompletionResponse = round_trip("vllm_completion_response.json");
    let c = &resp.choices[1];
    let lp = c.logprobs.as_ref().unwrap();
    let ids: Vec<u32> = lp
        .tokens
        .iter()
        .map(|t| parse_token_placeholder(t).unwrap())
        .collect();
    assert_eq!(Some(ids), c.token_ids);
    assert_eq!(lp.token_logprobs, [Some(-1.2), Some(-0.01)]);
    assert_eq!(c.finish_reason.as_deref(), Some("stop"));
    assert_eq!(c.stop_reason, Some(json!(151_645)));
    let err: ErrorResponse = round_trip("vllm_error.json");
    assert_eq!(err.error.param.as_deref(), Some("n"));
}

#[test]
fn sglang_request_and_response_fixtures_parse_and_write_back() {
    let req: GenerateRequest = round_trip("sglang_generate_request.json");
    let job = req.to_job(&qwen3_limits(), &Tokens::new(None)).unwrap();
    assert_eq!(
        (job.n, job.prompts.len(), job.top_logprobs),
        (1, 2, Some(0))
    );
    assert_eq!(job.prompts[1].spec.seed, 7);
    assert!(!req.single_output(1));
    let outs: Vec<GenerateOutput> = round_trip("sglang_generate_response.json");
    let m = &outs[1].meta_info;
    let lps = m.output_token_logprobs.as_ref().unwrap();
    assert_eq!(lps[1].1, 151_645);
    assert_eq!(lps[1].0, Some(-0.01));
    assert_eq!(m.finish_reason.as_ref().unwrap().kind, "stop");
    let _: sglang::ErrorResponse = round_trip("sglang_error.json");
    let up: UpdateWeightsFromDisk = round_trip("sglang_update_weights_from_disk_request.json");
    assert_eq!(up.weight_version.as_deref(), Some("12"));
    let _: UpdateWeightsResponse = round_trip("sglang_update_weights_from_disk_response.json");
}

#[test]
fn lora_adapter_fixtures_parse_and_the_server_answers_in_their_shape() {
    let load: LoadLoraAdapter = round_trip("vllm_load_lora_adapter_request.json");
    assert_eq!(load.load_inplace, Some(true));
    let load: LoadLoraAdapter = round_trip("sglang_load_lora_adapter_request.json");
    assert_eq!(load.lora_name, "lora0");
    let _: UnloadLoraAdapter = round_trip("sglang_unload_lora_adapter_request.json");
    let result: LoraUpdateResult = round_trip("sglang_lora_update_result.json");
    assert_eq!(result.loaded_adapters["lora0"], "/adapters/lora0");
    let tmp = tempfile::tempdir().unwrap();
    let (base, adapter) = (tmp.path().join("base"), tmp.path().join("lora0"));
    tiny_model(&base, 1);
    save_adapter(&base, &adapter, 2, &["q_proj"], 1);
    let server = serve(&base, |_| {});
    let mut req = fixture("sglang_load_lora_adapter_request.json");
    req["lora_path"] = json!(adapter);
    let r = post(&server.url(), "/load_lora_adapter", &req);
    assert_eq!(r.status, 200, "{}", r.body);
    let want = fixture("sglang_lora_update_result.json");
    same_fields(&r.body, &want, "sglang load_lora_adapter");
    let r = post(
        &server.url(),
        "/unload_lora_adapter",
        &fixture("sglang_unload_lora_adapter_request.json"),
    );
    let mut unloaded = want.clone();
    unloaded["loaded_adapters"] = json!({});
    assert_eq!(r.body, unloaded);
    let mut req = fixture("vllm_load_lora_adapter_request.json");
    req["lora_path"] = json!(adapter);
    let r = post(&server.url(), "/v1/load_lora_adapter", &req);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.body,
        json!("Success: LoRA adapter 'sql_adapter' added successfully.")
    );
}

#[test]
fn the_server_writes_the_documented_shapes() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    tiny_model(&a, 1);
    tiny_model(&b, 2);
    let server = serve(&a, |c| c.served_model_name = Some("Qwen/Qwen3-4B".into()));
    let url = server.url();
    // The fixture requests with token ids inside the tiny model's vocabulary.
    let mut req = fixture("vllm_completion_request.json");
    req["prompt"] = json!([[1, 2, 3], [4, 5]]);
    req["stop_token_ids"] = json!([7]);
    let r = post(&url, "/v1/completions", &req);
    assert_eq!(r.status, 200, "{}", r.body);
    same_fields(
        &r.body,
        &fixture("vllm_completion_response.json"),
        "completion",
    );
    let mut req = fixture("sglang_generate_request.json");
    req["input_ids"] = json!([[1, 2, 3], [4, 5]]);
    req["sampling_params"]["stop_token_ids"] = json!([7]);
    let r = post(&url, "/generate", &req);
    assert_eq!(r.status, 200, "{}", r.body);
    // Finish reasons carry `length` or `matched` by their type: compare like with like.
    for out in r.body.as_array().unwrap() {
        let kind = out["meta_info"]["finish_reason"]["type"].as_str().unwrap();
        let want = fixture("sglang_generate_response.json");
        let like = want
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["meta_info"]["finish_reason"]["type"] == kind)
            .unwrap()
            .clone();
        same_fields(out, &like, "generate");
    }
    let e = post(&url, "/v1/completions", &json!({"prompt": [1], "n": 0}));
    same_fields(&e.body, &fixture("vllm_error.json"), "vllm error");
    let e = post(
        &url,
        "/generate",
        &json!({"input_ids": [1], "sampling_params": {"top_p": 2}}),
    );
    same_fields(&e.body, &fixture("sglang_error.json"), "sglang error");
    let mut up = fixture("sglang_update_weights_from_disk_request.json");
    up["model_path"] = json!(b);
    let r = post(&url, "/update_weights_from_disk", &up);
    same_fields(
        &r.body,
        &fixture("sglang_update_weights_from_disk_response.json"),
        "update",
    );
    assert_eq!(
        r.body["message"],
        "Succeeded to update model weights. Weight version updated to 12."
    );
    // SGLang's model info fields, then three of ours.
    let info = get(&url, "/get_model_info").body;
    let parsed: ModelInfo = serde_json::from_value(info.clone()).unwrap();
    assert_eq!(parsed.weight_version, "12");
    let mut theirs: Vec<_> = fixture("sglang_model_info.json")
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    theirs.extend(["logprobs_mode", "max_model_len", "vocab_size"].map(String::from));
    let mut ours: Vec<_> = info.as_object().unwrap().keys().cloned().collect();
    ours.sort();
    theirs.sort();
    assert_eq!(ours, theirs);
}

#[test]
fn numbers_beyond_a_32_bit_float_are_refused_with_their_value() {
    let limits = qwen3_limits();
    let e =
        parse_body::<CompletionRequest>(br#"{"prompt": [1], "temperature": 1e308}"#).unwrap_err();
    assert_eq!(e.param, "temperature");
    assert!(e.message.contains("1e308"), "{}", e.message);
    assert!(e.message.contains("3.4028235e38"), "{}", e.message);
    for body in [
        &br#"{"input_ids": [1], "sampling_params": {"temperature": -1e300}}"#[..],
        br#"{"input_ids": [[1], [2]], "sampling_params": [{}, {"top_p": 1e39}]}"#,
    ] {
        let e = parse_body::<GenerateRequest>(body).unwrap_err();
        assert_eq!(e.param, "sampling_params", "{e}");
        assert!(!e.message.contains("inf"), "{e}");
        assert!(e.message.contains("e3"), "{e}");
    }
    // The largest f32 itself is a valid number (and a valid temperature).
    let r: CompletionRequest =
        parse_body(br#"{"prompt": [1], "temperature": 3.4028235e38}"#).unwrap();
    let tokens = Tokens::new(None);
    assert!(r.to_job(&limits, &tokens).is_ok());
}
