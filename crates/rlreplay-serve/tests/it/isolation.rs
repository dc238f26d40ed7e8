//! What one client can do to the others: a request abandoned by its client stops at once, a weight
//! update finishes whatever its client does, requests are admitted within the server's bounds,
//! and connections are bounded in number and in how long they may idle or take to send a request.
//! Engine state is observed through `/get_server_info`; time bounds are generous (tens of seconds
//! against work that would take minutes or never end).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::*;

fn info(url: &str) -> Value {
    get(url, "/get_server_info").body
}

/// Polls the server until `cond` holds on its info (at most 30 s).
fn wait_for(url: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let i = info(url);
        if cond(&i) {
            return i;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "timed out: {i}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// Sends a POST of `body` on a raw connection and returns the connection without reading the
/// answer (dropping it is a client going away).
fn send_raw(addr: SocketAddr, path: &str, body: &Value) -> TcpStream {
    let body = body.to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

/// POSTs JSON with a client timeout of `secs`.
fn post_within(url: &str, path: &str, body: &Value, secs: u64) -> Result<ureq::Response, String> {
    ureq::post(&format!("{url}{path}"))
        .timeout(Duration::from_secs(secs))
        .send_json(body.clone())
        .map_err(|e| e.to_string())
}

#[test]
fn a_request_abandoned_by_its_client_stops_every_sample_of_every_prompt() {
    let tmp = tempfile::tempdir().unwrap();
    tiny_model(tmp.path(), 1);
    let server = serve(tmp.path(), |_| {});
    let url = server.url();
    let (n, max_tokens) = (32usize, 4000usize);
    let requests = [
        (
            "/v1/completions",
            json!({"prompt": [[1, 2, 3], [4, 5]], "n": n, "max_tokens": max_tokens,
                   "ignore_eos": true}),
        ),
        (
            "/generate",
            json!({"input_ids": [[1, 2, 3], [4, 5]], "sampling_params": {"n": n,
                   "max_new_tokens": max_tokens, "ignore_eos": true}}),
        ),
    ];
    for (path, body) in requests {
        let before = info(&url)["generated_tokens"].as_u64().unwrap();
        let conn = send_raw(server.addr(), path, &body);
        wait_for(&url, |i| i["running_seqs"] == 2 * n);
        drop(conn);
        // Every sample stops, long before the request would have finished.
        let i = wait_for(&url, |i| {
            i["running_seqs"] == 0 && i["waiting_prompts"] == 0
        });
        let generated = i["generated_tokens"].as_u64().unwrap() - before;
        assert!(
            generated < (2 * n * max_tokens) as u64 / 2,
            "{path}: {generated} tokens generated after the client left"
        );
        // Another client is served.
        let r = post_within(
            &url,
            "/v1/completions",
            &json!({"prompt": [1, 2], "max_tokens": 4}),
            30,
        );
        assert_eq!(r.map(|r| r.status()), Ok(200));
    }
}

#[test]
fn a_weight_update_finishes_on_its_own_when_its_client_gives_up() {
    let tmp = tempfile::tempdir().unwrap();
    let a_dir = tmp.path().join("a");
    tiny_model(&a_dir, 1);
    let server = serve(&a_dir, |_| {});
    let url = server.url();
    // A good update, then one whose config is not JSON: either way the engine must stop holding
    // requests once it is over.
    for (k, (version, good)) in [("v1", true), ("v2", false)].into_iter().enumerate() {
        let dir = tmp.path().join(format!("b{k}"));
        tiny_model(&dir, 2 + k as u64);
        // config.json becomes a pipe: loading blocks on it until it is written, which happens
        // after the client has given up.
        let config = std::fs::read(dir.join("config.json")).unwrap();
        std::fs::remove_file(dir.join("config.json")).unwrap();
        let fifo = dir.join("config.json");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let r = post_within(
            &url,
            "/update_weights_from_disk",
            &json!({"model_path": dir, "weight_version": version}),
            1,
        );
        assert!(
            r.is_err(),
            "the update cannot answer before its config is written"
        );
        // Let the server see the closed connection before the load can go on.
        thread::sleep(Duration::from_secs(1));
        let text = if good { config } else { b"not json".to_vec() };
        thread::spawn(move || std::fs::write(fifo, text));
        let r = post_within(
            &url,
            "/generate",
            &json!({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}}),
            30,
        )
        .unwrap_or_else(|e| panic!("a request after the abandoned update: {e}"));
        let out: Value = r.into_json().unwrap();
        let serving = if good { version } else { "v1" };
        assert_eq!(out["meta_info"]["weight_version"], serving);
        let i = info(&url);
        assert_eq!(
            (&i["held_requests"], &i["paused"]),
            (&json!(0), &json!(false))
        );
        assert_eq!(i["weight_updates"], 1);
    }
}

#[test]
fn requests_are_admitted_within_the_server_bounds() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path(), 1);
    let server = serve(tmp.path(), |c| {
        c.max_num_seqs = 8;
        c.max_prompts_per_request = 4;
        c.max_seqs_per_request = 64;
    });
    let url = server.url();
    // n above max_num_seqs: decoded in turns of at most 8 sequences, with the samples (and
    // random streams) a local generation gives.
    let prompts = vec![vec![3u32, 1, 4], vec![1, 5]];
    let r = post(
        &url,
        "/v1/completions",
        &json!({"prompt": prompts, "n": 30, "max_tokens": 12, "seed": 9,
                "return_token_ids": true}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let i = info(&url);
    assert!(i["max_running_seqs"].as_u64().unwrap() <= 8, "{i}");
    let params = rlreplay_sampling::sampling::SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        max_new_tokens: 12,
        stop_ids: vec![7],
        seed: 9,
    };
    let want =
        rlreplay_sampling::engine::generate(&decoder(&model), &prompts, 30, &params, 256, |_| {})
            .unwrap();
    let choices = r.body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 60);
    for (c, g) in choices.iter().zip(&want) {
        assert_eq!(u32s(&c["token_ids"]), g.tokens);
    }
    // Too many prompts, or too many samples in all: 400 naming the field and the bound.
    let five: Vec<Vec<u32>> = (1..=5).map(|t| vec![t]).collect();
    for (path, body, param, bound) in [
        ("/v1/completions", json!({"prompt": five}), "prompt", "4"),
        (
            "/v1/completions",
            json!({"prompt": [[1], [2], [3]], "n": 30}),
            "n",
            "64",
        ),
        ("/generate", json!({"input_ids": five}), "input_ids", "4"),
        (
            "/generate",
            json!({"input_ids": [[1], [2], [3]], "sampling_params": {"n": 30}}),
            "sampling_params.n",
            "64",
        ),
    ] {
        let r = post(&url, path, &body);
        assert_eq!(r.status, 400, "{path} {body}: {}", r.body);
        let e = if path.starts_with("/v1/") {
            &r.body["error"]
        } else {
            &r.body
        };
        assert_eq!(e["param"], param, "{}", r.body);
        let message = e["message"].as_str().unwrap();
        assert!(message.contains(&format!("at most {bound}")), "{message}");
    }
    // The defaults bound a request too.
    let server = serve(tmp.path(), |_| {});
    let many: Vec<Vec<u32>> = vec![vec![1]; 100_000];
    let r = post(&server.url(), "/v1/completions", &json!({"prompt": many}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.body["error"]["param"], "prompt");
}

/// Whether the server closes `s` within 30 s (reading EOF or a reset), writing `trickle` bytes one
/// at a time every 100 ms meanwhile.
fn closed_by_the_server(mut s: TcpStream, trickle: &[u8]) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    let mut sent = 0;
    while start.elapsed() < Duration::from_secs(30) {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => {}
            Err(_) => return true,
        }
        if sent < trickle.len() {
            if s.write_all(&trickle[sent..sent + 1]).is_err() {
                return true;
            }
            sent += 1;
        }
    }
    false
}

#[test]
fn connections_are_bounded_in_time_and_in_number() {
    let tmp = tempfile::tempdir().unwrap();
    tiny_model(tmp.path(), 1);
    let server = serve(tmp.path(), |c| {
        c.header_read_timeout = Duration::from_secs(1);
        c.idle_timeout = Duration::from_secs(2);
    });
    let addr = server.addr();
    // Headers sent a byte at a time: cut off at the header deadline although bytes keep coming.
    let slow = format!(
        "GET /health HTTP/1.1\r\nHost: test\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(400)
    );
    let s = TcpStream::connect(addr).unwrap();
    assert!(closed_by_the_server(s, slow.as_bytes()), "slow headers");
    // A connection that never sends a byte, and one idle after a request, are closed.
    let s = TcpStream::connect(addr).unwrap();
    assert!(closed_by_the_server(s, b""), "a silent connection");
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    assert!(
        closed_by_the_server(s, b""),
        "an idle kept-alive connection"
    );
    // A request in flight for longer than both timeouts (held while generation is paused) is not
    // cut off.
    let url = server.url();
    assert_eq!(post(&url, "/pause_generation", &json!({})).status, 200);
    let held = {
        let url = url.clone();
        thread::spawn(move || {
            post_within(&url, "/v1/completions", &json!({"prompt": [1, 2]}), 60).map(|r| r.status())
        })
    };
    wait_for(&url, |i| i["held_requests"] == 1);
    thread::sleep(Duration::from_secs(4));
    assert_eq!(post(&url, "/continue_generation", &json!({})).status, 200);
    assert_eq!(held.join().unwrap(), Ok(200));

    // At most max_connections at once: the next waits until one closes.
    let server = serve(tmp.path(), |c| c.max_connections = 2);
    let url = server.url();
    let idle: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(server.addr()).unwrap())
        .collect();
    let health = |secs| {
        ureq::get(&format!("{url}/health"))
            .timeout(Duration::from_secs(secs))
            .call()
            .map(|r| r.status())
            .map_err(|e| e.to_string())
    };
    assert!(health(2).is_err(), "a third connection is served");
    drop(idle);
    assert_eq!(health(30), Ok(200));
}
