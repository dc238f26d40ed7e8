//! What one client can do to the others: a request abandoned by its client stops at once, a weight
//! update finishes whatever its client does, requests are admitted within the server's bounds,
//! and connections are bounded in number and in how long they may idle or take to send a request.
//! Engine state is observed through `/get_server_info`; time bounds are generous (tens of seconds
//! against work that would take minutes or never end).

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

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
