//! `rlreplay serve` in process on 127.0.0.1 (port 0) over random tiny Qwen3 models: completions
//! and generate give the samples `rlreplay generate` gives for the same seed, concurrent requests
//! share decode steps, weight updates, pauses, and bad input answered with 4xx JSON while the
//! server keeps serving.

use std::thread;
use std::time::{Duration, Instant};

use rlreplay_sampling::engine::generate;
use rlreplay_sampling::sampling::SamplingParams;
use serde_json::{json, Value};

use crate::common::*;

fn local_params(
    temperature: f32,
    max_new_tokens: usize,
    seed: u64,
    stop: Vec<u32>,
) -> SamplingParams {
    SamplingParams {
        temperature,
        top_p: 1.0,
        top_k: 0,
        max_new_tokens,
        stop_ids: stop,
        seed,
    }
}

#[test]
fn completions_match_a_local_generation_with_the_same_seed() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path(), 1);
    let server = serve(tmp.path(), |_| {});
    let prompts = vec![vec![1u32, 2, 3, 4], vec![9, 8]];
    let r = post(
        &server.url(),
        "/v1/completions",
        &json!({
            "prompt": prompts, "n": 3, "max_tokens": 10, "temperature": 0.8, "top_p": 1.0,
            "top_k": -1, "seed": 11, "logprobs": 0, "return_tokens_as_token_ids": true,
            "return_token_ids": true
        }),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let want = generate(
        &decoder(&model),
        &prompts,
        3,
        &local_params(0.8, 10, 11, vec![7]),
        256,
        |_| {},
    )
    .unwrap();
    let b = &r.body;
    assert_eq!(b["object"], "text_completion");
    let choices = b["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 6);
    let mut completion_tokens = 0;
    for (i, (c, g)) in choices.iter().zip(&want).enumerate() {
        // Prompt-major: prompt p, sample j at p * n + j.
        assert_eq!(c["index"], i);
        assert_eq!((g.prompt, g.sample), (i / 3, i % 3));
        let ids = u32s(&c["token_ids"]);
        assert_eq!(ids, g.tokens);
        assert_eq!(u32s(&c["prompt_token_ids"]), prompts[i / 3]);
        let lp = &c["logprobs"];
        assert_eq!(placeholder_ids(&lp["tokens"]), g.tokens);
        // Processed log-probs without top-k/top-p are the tempered ones, bit for bit.
        assert_eq!(f32s(&lp["token_logprobs"]), g.logprobs);
        let tops = lp["top_logprobs"].as_array().unwrap();
        assert!(tops.iter().all(|t| t.as_object().unwrap().len() == 1));
        let offsets = u32s(&lp["text_offset"]);
        assert_eq!(offsets[0], 0);
        if g.truncated {
            assert_eq!(c["finish_reason"], "length");
            assert_eq!(ids.len(), 10);
        } else {
            // Id 7 is the model's end-of-sequence id: a stop without a stop_reason.
            assert_eq!(c["finish_reason"], "stop");
            assert_eq!(*ids.last().unwrap(), 7);
        }
        assert_eq!(c["stop_reason"], Value::Null);
        completion_tokens += ids.len();
    }
    assert_eq!(b["usage"]["prompt_tokens"], 6);
    assert_eq!(b["usage"]["completion_tokens"], completion_tokens);
    assert_eq!(b["usage"]["total_tokens"], 6 + completion_tokens);
    // A request stop id gets a stop_reason; ignore_eos runs past id 7.
    let r = post(
        &server.url(),
        "/v1/completions",
        &json!({"prompt": [1, 2], "max_tokens": 30, "ignore_eos": true,
                "stop_token_ids": (0..512).filter(|&t| t % 2 == 0).collect::<Vec<_>>(),
                "return_token_ids": true, "seed": 1}),
    );
    let c = &r.body["choices"][0];
    let ids = u32s(&c["token_ids"]);
    let last = *ids.last().unwrap();
    assert_eq!(last % 2, 0, "{c}");
    assert_eq!(c["stop_reason"], last);
    assert_eq!(c["logprobs"], Value::Null);
}

#[test]
fn generate_speaks_sglang_and_samples_what_completions_samples() {
    let tmp = tempfile::tempdir().unwrap();
    tiny_model(tmp.path(), 1);
    let server = serve(tmp.path(), |_| {});
    let url = server.url();
    let c = post(
        &url,
        "/v1/completions",
        &json!({"prompt": [[5, 6, 7, 8]], "n": 2, "max_tokens": 6, "temperature": 1.0,
                "seed": 4, "return_token_ids": true, "logprobs": 2}),
    );
    let g = post(
        &url,
        "/generate",
        &json!({"input_ids": [5, 6, 7, 8], "sampling_params": {"n": 2, "max_new_tokens": 6,
                "temperature": 1.0, "sampling_seed": 4}, "return_logprob": true,
                "top_logprobs_num": 2}),
    );
    assert_eq!(g.status, 200, "{}", g.body);
    let outs = g.body.as_array().unwrap();
    assert_eq!(outs.len(), 2);
    for (o, ch) in outs.iter().zip(c.body["choices"].as_array().unwrap()) {
        assert_eq!(o["output_ids"], ch["token_ids"]);
        let m = &o["meta_info"];
        assert_eq!(m["weight_version"], "default");
        assert_eq!(m["prompt_tokens"], 4);
        assert_eq!(
            m["completion_tokens"],
            ch["token_ids"].as_array().unwrap().len()
        );
        let entries = m["output_token_logprobs"].as_array().unwrap();
        let lps: Vec<f32> = entries
            .iter()
            .map(|e| e[0].as_f64().unwrap() as f32)
            .collect();
        assert_eq!(lps, f32s(&ch["logprobs"]["token_logprobs"]));
        assert!(entries.iter().all(|e| e[2].is_null()));
        assert_eq!(
            entries.iter().map(|e| e[1].clone()).collect::<Vec<_>>(),
            *ch["token_ids"].as_array().unwrap()
        );
        let top = m["output_top_logprobs"].as_array().unwrap();
        assert!(top.iter().all(|row| row.as_array().unwrap().len() == 2));
        let kind = m["finish_reason"]["type"].as_str().unwrap();
        match ch["finish_reason"].as_str().unwrap() {
            "length" => assert_eq!((kind, &m["finish_reason"]["length"]), ("length", &json!(6))),
            _ => assert_eq!((kind, &m["finish_reason"]["matched"]), ("stop", &json!(7))),
        }
    }
    // One prompt, n = 1: one object, not a list; per-prompt sampling params for a batch.
    let one = post(
        &url,
        "/generate",
        &json!({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}),
    );
    assert!(one.body.is_object(), "{}", one.body);
    assert!(one.body["meta_info"].get("output_token_logprobs").is_none());
    let batch = post(
        &url,
        "/generate",
        &json!({"input_ids": [[1, 2], [3]], "sampling_params": [{"max_new_tokens": 1},
                {"max_new_tokens": 3, "ignore_eos": true}], "rid": ["a", "b"]}),
    );
    let outs = batch.body.as_array().unwrap();
    assert_eq!(outs[0]["meta_info"]["id"], "a");
    assert_eq!(outs[1]["meta_info"]["id"], "b");
    assert_eq!(outs[1]["output_ids"].as_array().unwrap().len(), 3);
    // SGLang allows max_new_tokens = 0.
    let zero = post(
        &url,
        "/generate",
        &json!({"input_ids": [1], "sampling_params": {"max_new_tokens": 0}}),
    );
    assert_eq!(zero.body["output_ids"], json!([]));
}

#[test]
fn text_prompts_and_decoded_tokens_with_the_real_tokenizer() {
    let tmp = tempfile::tempdir().unwrap();
    qwen3_vocab_model(tmp.path());
    let server = serve(tmp.path(), |_| {});
    let r = post(
        &server.url(),
        "/v1/completions",
        &json!({"prompt": "What is 2+3?", "max_tokens": 5, "seed": 3, "logprobs": 1,
                "return_token_ids": true, "ignore_eos": true}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let c = &r.body["choices"][0];
    let tokens = c["logprobs"]["tokens"].as_array().unwrap();
    // Decoded pieces, their offsets add up, the text is their concatenation.
    let pieces: Vec<&str> = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert!(pieces.iter().all(|p| !p.starts_with("token_id:")));
    let offsets = u32s(&c["logprobs"]["text_offset"]);
    let mut at = 0;
    for (p, o) in pieces.iter().zip(offsets) {
        assert_eq!(o as usize, at);
        at += p.chars().count();
    }
    assert_eq!(c["text"].as_str().unwrap(), pieces.concat());
    assert_eq!(r.body["usage"]["prompt_tokens"], 7);
    let info = get(&server.url(), "/get_model_info");
    assert_eq!(info.body["logprobs_mode"], "processed");
    assert_eq!(info.body["vocab_size"], 151_936);
    assert!(info.body["tokenizer_path"].is_string());
    let g = post(
        &server.url(),
        "/generate",
        &json!({"text": "Hi", "sampling_params": {"max_new_tokens": 2, "ignore_eos": true},
                "return_logprob": true, "return_text_in_logprobs": true}),
    );
    let e = &g.body["meta_info"]["output_token_logprobs"][0];
    assert!(e[2].is_string(), "{e}");
}

/// Each bad request of `cases` gets `status` and an error naming `param`.
fn expect_errors(url: &str, cases: &[(&str, &[u8], u16, &str)]) {
    for &(path, body, status, param) in cases {
        let r = post_raw(url, path, body, &[]);
        let what = format!("{path} {}: {}", String::from_utf8_lossy(body), r.body);
        assert_eq!(r.status, status, "{what}");
        let (p, msg) = if path.starts_with("/v1/") {
            assert_eq!(r.body["error"]["code"], status, "{what}");
            (&r.body["error"]["param"], &r.body["error"]["message"])
        } else {
            assert_eq!(r.body["object"], "error", "{what}");
            assert_eq!(r.body["code"], status, "{what}");
            (&r.body["param"], &r.body["message"])
        };
        assert_eq!(p, param, "{what}");
        assert!(!msg.as_str().unwrap().is_empty());
    }
}

#[test]
fn bad_input_is_a_4xx_json_error_naming_the_field_and_the_server_keeps_serving() {
    let tmp = tempfile::tempdir().unwrap();
    tiny_model(tmp.path(), 1);
    let server = serve(tmp.path(), |c| c.max_body_bytes = 4096);
    let url = server.url();
    let big = format!("{{\"prompt\": [{}1]}}", "1, ".repeat(2000));
    expect_errors(
        &url,
        &[
            ("/v1/completions", b"{\"prompt\": [1, 2", 400, "body"),
            ("/v1/completions", b"not json", 400, "body"),
            (
                "/v1/completions",
                b"{\"prompt\": [1], \"foo\": 1}",
                400,
                "foo",
            ),
            ("/v1/completions", b"{\"n\": 2}", 400, "prompt"),
            ("/v1/completions", b"{\"prompt\": [1, 600]}", 400, "prompt"),
            ("/v1/completions", b"{\"prompt\": [1, -3]}", 400, "prompt"),
            ("/v1/completions", b"{\"prompt\": [[1], []]}", 400, "prompt"),
            ("/v1/completions", b"{\"prompt\": []}", 400, "prompt"),
            ("/v1/completions", b"{\"prompt\": [1], \"n\": 0}", 400, "n"),
            ("/v1/completions", b"{\"prompt\": [1], \"n\": -1}", 400, "n"),
            (
                "/v1/completions",
                b"{\"prompt\": [1], \"max_tokens\": 5000}",
                400,
                "max_tokens",
            ),
            (
                "/v1/completions",
                b"{\"prompt\": [1], \"max_tokens\": 0}",
                400,
                "max_tokens",
            ),
            (
                "/v1/completions",
                b"{\"prompt\": [1], \"temperature\": -1}",
                400,
                "temperature",
            ),
            (
                "/v1/completions",
                b"{\"prompt\": [1], \"top_p\": 0}",
                400,
                "top_p",
            ),
            (
                "/v1/completions",
                b"{\"prompt\": [1], \"top_k\": -2}",
                400,
                "top_k",
            ),
            (
                "/v1/completions",
                b"{\"prompt\": [1], \"logprobs\": 21}",
                400,
                "logprobs",
            ),
            (
                "/v1/completions",
                b"{\"prompt\": [1], \"stream\": true}",
                400,
                "stream",
            ),
            (
                "/v1/completions",
                b"{\"prompt\": [1], \"stop\": [\"x\"]}",
                400,
                "stop",
            ),
            (
                "/v1/completions",
                b"{\"prompt\": [1], \"min_p\": 0.1}",
                400,
                "min_p",
            ),
            ("/v1/completions", b"{\"prompt\": \"text\"}", 400, "prompt"),
            (
                "/v1/completions",
                b"{\"prompt\": [1], \"model\": \"other\"}",
                404,
                "model",
            ),
            (
                "/v1/completions",
                b"{\"prompt\": [1], \"vllm_xargs\": {\"x\": 1}}",
                400,
                "vllm_xargs.x",
            ),
            ("/v1/completions", big.as_bytes(), 413, "body"),
            ("/generate", b"{\"input_ids\": [1, 600]}", 400, "input_ids"),
            (
                "/generate",
                b"{\"input_ids\": [1], \"sampling_params\": {\"bogus\": 1}}",
                400,
                "sampling_params.bogus",
            ),
            (
                "/generate",
                b"{\"input_ids\": [1], \"sampling_params\": {\"n\": 0}}",
                400,
                "sampling_params.n",
            ),
            (
                "/generate",
                b"{\"input_ids\": [1], \"sampling_params\": {\"max_new_tokens\": 4096}}",
                400,
                "sampling_params.max_new_tokens",
            ),
            (
                "/generate",
                b"{\"input_ids\": [1], \"sampling_params\": {\"top_p\": 2}}",
                400,
                "sampling_params.top_p",
            ),
            (
                "/generate",
                b"{\"input_ids\": [[1], [2]], \"sampling_params\": [{}]}",
                400,
                "sampling_params",
            ),
            (
                "/generate",
                b"{\"input_ids\": [1], \"logprob_start_len\": 0}",
                400,
                "logprob_start_len",
            ),
            ("/generate", b"{\"sampling_params\": {}}", 400, "input_ids"),
            ("/generate", b"[1, 2]", 400, "body"),
            ("/update_weights_from_disk", b"{}", 400, "model_path"),
            (
                "/update_weights_from_disk",
                b"{\"model_path\": \"x\", \"load_format\": \"pt\"}",
                400,
                "load_format",
            ),
            ("/pause_generation", b"{\"mode\": \"later\"}", 400, "mode"),
        ],
    );
    let r = get(&url, "/no/such/endpoint");
    assert_eq!(r.status, 404);
    assert_eq!(r.body["object"], "error");
    let r = get(&url, "/v1/completions");
    assert_eq!(r.status, 405);
    // Still serving.
    let ok = post(
        &url,
        "/v1/completions",
        &json!({"prompt": [1, 2], "max_tokens": 3}),
    );
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(get(&url, "/health").status, 200);
}

#[test]
fn the_api_key_is_required_except_for_health() {
    let tmp = tempfile::tempdir().unwrap();
    tiny_model(tmp.path(), 1);
    let server = serve(tmp.path(), |c| c.api_key = Some("s3cret".into()));
    let url = server.url();
    let body = b"{\"prompt\": [1], \"max_tokens\": 2}";
    let r = post_raw(&url, "/v1/completions", body, &[]);
    assert_eq!(r.status, 401);
    assert_eq!(r.body["error"]["code"], 401);
    let r = post_raw(
        &url,
        "/v1/completions",
        body,
        &[("authorization", "Bearer wrong")],
    );
    assert_eq!(r.status, 401);
    let r = post_raw(
        &url,
        "/generate",
        b"{\"input_ids\": [1]}",
        &[("authorization", "Bearer wrong")],
    );
    assert_eq!((r.status, &r.body["object"]), (401, &json!("error")));
    let r = post_raw(
        &url,
        "/v1/completions",
        body,
        &[("authorization", "Bearer s3cret")],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(get(&url, "/health").status, 200);
    assert_eq!(get(&url, "/get_weight_version").status, 401);
}

fn info(url: &str) -> Value {
    get(url, "/get_server_info").body
}

/// Polls the server until `cond` holds on its info (at most 20 s).
fn wait_for(url: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let i = info(url);
        if cond(&i) {
            return i;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "timed out: {i}");
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn concurrent_requests_share_every_decode_step() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path(), 1);
    let server = serve(tmp.path(), |_| {});
    let url = server.url();
    // Hold the requests while paused, then release them together: one batch.
    assert_eq!(
        post(&url, "/pause_generation", &json!({"mode": "in_place"})).status,
        200
    );
    let body = |k: u32| {
        json!({"prompt": [k + 1, k + 2, k + 3], "max_tokens": 30, "ignore_eos": true,
               "seed": k, "return_token_ids": true, "logprobs": 0})
    };
    let handles: Vec<_> = (0..8u32)
        .map(|k| {
            let url = url.clone();
            let b = body(k);
            thread::spawn(move || post(&url, "/v1/completions", &b))
        })
        .collect();
    wait_for(&url, |i| i["held_requests"] == 8);
    assert_eq!(post(&url, "/continue_generation", &json!({})).status, 200);
    let replies: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let i = info(&url);
    assert_eq!(i["max_running_requests"], 8, "{i}");
    assert_eq!(i["max_running_seqs"], 8);
    // 8 requests x 29 decode steps each, served by 29 shared steps.
    assert_eq!(i["decode_steps"], 29);
    assert_eq!(i["generated_tokens"], 8 * 30);
    let dec = decoder(&model);
    for (k, r) in replies.iter().enumerate() {
        let c = &r.body["choices"][0];
        let alone = generate(
            &dec,
            &[vec![k as u32 + 1, k as u32 + 2, k as u32 + 3]],
            1,
            &local_params(1.0, 30, k as u64, vec![]),
            1,
            |_| {},
        )
        .unwrap();
        assert_eq!(u32s(&c["token_ids"]), alone[0].tokens);
        for (a, b) in f32s(&c["logprobs"]["token_logprobs"])
            .iter()
            .zip(&alone[0].logprobs)
        {
            assert!((a - b).abs() < 1e-5);
        }
    }
    // Without the pause, requests arriving at any time are served as they come.
    let handles: Vec<_> = (0..8u32)
        .map(|k| {
            let url = url.clone();
            let b = body(k);
            thread::spawn(move || post(&url, "/v1/completions", &b))
        })
        .collect();
    for (k, h) in handles.into_iter().enumerate() {
        let r = h.join().unwrap();
        assert_eq!(
            r.body["choices"][0]["token_ids"],
            replies[k].body["choices"][0]["token_ids"]
        );
    }
}

/// A long SGLang request in a thread.
fn long_request(
    url: &str,
    prompt: Vec<u32>,
    tokens: usize,
) -> thread::JoinHandle<(Value, Instant)> {
    let url = url.to_owned();
    thread::spawn(move || {
        let r = post(
            &url,
            "/generate",
            &json!({"input_ids": prompt, "sampling_params": {"max_new_tokens": tokens,
                    "ignore_eos": true, "sampling_seed": 5}}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        (r.body, Instant::now())
    })
}

#[test]
fn weight_updates_let_requests_in_flight_finish_on_the_old_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let (a_dir, b_dir) = (tmp.path().join("a"), tmp.path().join("b"));
    let a = tiny_model(&a_dir, 1);
    let b = tiny_model(&b_dir, 2);
    let server = serve(&a_dir, |_| {});
    let url = server.url();
    let prompt = vec![3u32, 1, 4, 1, 5];
    let local = |m: &rlreplay_model::Model, n: usize| {
        generate(
            &decoder(m),
            std::slice::from_ref(&prompt),
            1,
            &local_params(1.0, n, 5, vec![]),
            256,
            |_| {},
        )
        .unwrap()
        .remove(0)
        .tokens
    };
    let long = long_request(&url, prompt.clone(), 3000);
    wait_for(&url, |i| i["running_seqs"] == 1);
    let r = post(
        &url,
        "/update_weights_from_disk",
        &json!({"model_path": b_dir, "weight_version": "v1"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["success"], true);
    // The update waited for the batch to empty.
    assert_eq!(info(&url)["running_seqs"], 0);
    let (out, _) = long.join().unwrap();
    // The long request finished on the old weights.
    assert_eq!(out["meta_info"]["weight_version"], "default");
    assert_eq!(u32s(&out["output_ids"]), local(&a, 3000));
    // New requests run on the new weights.
    assert_eq!(
        get(&url, "/get_weight_version").body["weight_version"],
        "v1"
    );
    let after = post(
        &url,
        "/generate",
        &json!({"input_ids": prompt, "sampling_params": {"max_new_tokens": 20,
                "ignore_eos": true, "sampling_seed": 5}}),
    );
    assert_eq!(after.body["meta_info"]["weight_version"], "v1");
    assert_eq!(u32s(&after.body["output_ids"]), local(&b, 20));
    let mi = get(&url, "/get_model_info").body;
    assert_eq!(mi["model_path"], b_dir.display().to_string());
    assert_eq!(mi["weight_version"], "v1");
    // A missing directory or another architecture: 400, the old weights stay.
    for bad in [tmp.path().join("none"), {
        let d = tmp.path().join("other");
        qwen3_vocab_model(&d);
        d
    }] {
        let r = post(
            &url,
            "/update_weights_from_disk",
            &json!({"model_path": bad, "weight_version": "v9"}),
        );
        assert_eq!(r.status, 400, "{}", r.body);
        assert_eq!(r.body["success"], false);
    }
    assert_eq!(
        get(&url, "/get_weight_version").body["weight_version"],
        "v1"
    );
    let again = post(
        &url,
        "/generate",
        &json!({"input_ids": prompt, "sampling_params": {"max_new_tokens": 20,
                "ignore_eos": true, "sampling_seed": 5}}),
    );
    assert_eq!(again.body["output_ids"], after.body["output_ids"]);
    assert_eq!(info(&url)["weight_updates"], 1);
}

#[test]
fn pause_abort_in_place_and_prime_rl_aliases() {
    let tmp = tempfile::tempdir().unwrap();
    let (a_dir, b_dir) = (tmp.path().join("a"), tmp.path().join("b"));
    let a = tiny_model(&a_dir, 1);
    tiny_model(&b_dir, 2);
    let server = serve(&a_dir, |_| {});
    let url = server.url();
    // Abort (SGLang's default mode): the request in flight returns what it has.
    let long = long_request(&url, vec![1, 2, 3], 3000);
    wait_for(&url, |i| i["running_seqs"] == 1);
    assert_eq!(post_raw(&url, "/pause_generation", b"", &[]).status, 200);
    let (out, _) = long.join().unwrap();
    assert_eq!(out["meta_info"]["finish_reason"]["type"], "abort");
    let got = out["output_ids"].as_array().unwrap().len();
    assert!(got > 0 && got < 3000, "{got}");
    // Paused: a new request waits until continue.
    let held = long_request(&url, vec![1, 2, 3], 5);
    wait_for(&url, |i| i["held_requests"] == 1 && i["paused"] == true);
    assert_eq!(post(&url, "/continue_generation", &json!({})).status, 200);
    let (out, _) = held.join().unwrap();
    assert_eq!(out["meta_info"]["finish_reason"]["type"], "length");
    // In place: the request stops decoding and continues unchanged after continue.
    let long = long_request(&url, vec![1, 2, 3], 2000);
    wait_for(&url, |i| i["running_seqs"] == 1);
    post(&url, "/pause_generation", &json!({"mode": "in_place"}));
    let t0 = info(&url)["generated_tokens"].clone();
    thread::sleep(Duration::from_millis(50));
    assert_eq!(info(&url)["generated_tokens"], t0);
    post(&url, "/continue_generation", &json!({}));
    let (out, _) = long.join().unwrap();
    let want = generate(
        &decoder(&a),
        &[vec![1, 2, 3]],
        1,
        &local_params(1.0, 2000, 5, vec![]),
        256,
        |_| {},
    )
    .unwrap();
    assert_eq!(u32s(&out["output_ids"]), want[0].tokens);
    // prime-rl: pause (keep), update, resume; the paused request continues on the new weights.
    let long = long_request(&url, vec![1, 2, 3], 2000);
    wait_for(&url, |i| i["running_seqs"] == 1);
    assert_eq!(post_raw(&url, "/pause?mode=keep", b"", &[]).status, 200);
    let r = post(
        &url,
        "/update_weights",
        &json!({"weight_dir": b_dir, "weight_version": "7"}),
    );
    assert_eq!(r.body["success"], true, "{}", r.body);
    assert_eq!(post_raw(&url, "/resume", b"", &[]).status, 200);
    let (out, _) = long.join().unwrap();
    assert_eq!(out["meta_info"]["weight_version"], "7");
    assert_eq!(out["output_ids"].as_array().unwrap().len(), 2000);
    assert_ne!(u32s(&out["output_ids"]), want[0].tokens);
    assert_eq!(post_raw(&url, "/pause?mode=later", b"", &[]).status, 400);
    // vLLM's wait mode: returns once the batch is empty.
    assert_eq!(post_raw(&url, "/pause?mode=wait", b"", &[]).status, 200);
    assert_eq!(info(&url)["paused"], true);
    post_raw(&url, "/resume", b"", &[]);
    assert_eq!(info(&url)["paused"], false);
}
