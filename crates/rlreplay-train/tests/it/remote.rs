//! The remote rollout source against `rlreplay serve` on 127.0.0.1 (ephemeral ports): a
//! synchronous remote run equals the local backend bit for bit, prompts fail over to the servers
//! left, and bad endpoints or protocols are named.

use rlreplay_data::error::chain;
use std::path::Path;

use rlreplay_serve::{BoundServer, ServeConfig, ServerHandle};
use rlreplay_train::{run, Config, RunOptions, RunSummary, SourceKind};

fn toy_config(overrides: &[String]) -> Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/toy-arith.toml");
    let mut all: Vec<String> = [
        "trainer.total_training_steps=3",
        "trainer.save_freq=3",
        "validation.test_freq=0",
        "validation.val_before_train=false",
        "toy.warmup_steps=5",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    all.extend(overrides.iter().cloned());
    Config::load(&path, &all, SourceKind::Online).unwrap().0
}

fn train(cfg: Config, out: &Path) -> rlreplay_train::Result<RunSummary> {
    run(&RunOptions::new(cfg, out))
}

fn serve(model: &Path) -> ServerHandle {
    let mut cfg = ServeConfig::new(model);
    cfg.port = 0;
    BoundServer::bind(cfg).unwrap().spawn().unwrap()
}

fn remote(urls: &[String], protocol: &str) -> Vec<String> {
    let list: Vec<String> = urls.iter().map(|u| format!("{u:?}")).collect();
    vec![
        "rollout.backend=\"remote\"".into(),
        format!("rollout.endpoints=[{}]", list.join(", ")),
        format!("rollout.protocol=\"{protocol}\""),
        "rollout.retries=1".into(),
        "rollout.retry_backoff_s=0.01".into(),
        "rollout.request_timeout_s=60".into(),
    ]
}

fn weights(run: &Path) -> Vec<u8> {
    std::fs::read(run.join("checkpoints/global_step_3/model.safetensors")).unwrap()
}

#[test]
fn synchronous_remote_equals_local_and_fails_over() {
    let local = tempfile::tempdir().unwrap();
    train(toy_config(&[]), local.path()).unwrap();
    // The servers start from any model of the architecture: the trainer sends its own initial
    // weights before the first step.
    let model = local.path().join("checkpoints/global_step_3");
    let (a, b) = (serve(&model), serve(&model));
    let urls = [a.url(), b.url()];
    for protocol in ["openai", "sglang"] {
        let out = tempfile::tempdir().unwrap();
        let s = train(toy_config(&remote(&urls, protocol)), out.path()).unwrap();
        assert_eq!(
            weights(out.path()),
            weights(local.path()),
            "{protocol}: remote weights differ from local"
        );
        let marker = out.path().join("weights/step_3/STABLE");
        assert_eq!(std::fs::read_to_string(marker).unwrap(), "3\n");
        assert!(!out.path().join("weights/step_2").exists());
        assert!(s.last_metrics["timing_s/gen"] > 0.0);
        // Each logged row records the policy version that generated it.
        let shard = out.path().join("rollouts/data/step-0002.parquet");
        let (rows, _) =
            rlreplay_data::read_shard(&shard, 2, &rlreplay_data::ReadOptions::new([])).unwrap();
        assert!(rows.policy_version.iter().all(|&v| v == Some(1)));
    }
    // One endpoint down from the start: everything runs on the other, with the same result.
    let out = tempfile::tempdir().unwrap();
    let dead = "http://127.0.0.1:9".to_string();
    train(
        toy_config(&remote(&[dead.clone(), urls[1].clone()], "openai")),
        out.path(),
    )
    .unwrap();
    assert_eq!(weights(out.path()), weights(local.path()));
    // No endpoint left: the error names each and why.
    let out = tempfile::tempdir().unwrap();
    let err = train(
        toy_config(&remote(std::slice::from_ref(&dead), "openai")),
        out.path(),
    )
    .unwrap_err();
    let msg = chain(&err);
    assert!(
        msg.contains("no rollout endpoint is left") && msg.contains(&dead),
        "{msg}"
    );
    // A server that does not speak the protocol: the refusal is named.
    let out = tempfile::tempdir().unwrap();
    let mut cfg = toy_config(&remote(&[urls[0].clone()], "openai"));
    cfg.rollout.endpoints = vec![format!("{}/nothing", urls[0])];
    let err = train(cfg, out.path()).unwrap_err();
    let msg = chain(&err);
    assert!(msg.contains("refused the request (404)"), "{msg}");
    a.shutdown();
    b.shutdown();
}

#[test]
fn remote_settings_are_checked() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/toy-arith.toml");
    let parse = |sets: &[&str]| {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        Config::load(&path, &sets, SourceKind::Online).map(|c| c.0)
    };
    let e = parse(&["rollout.backend=\"remote\""]).unwrap_err();
    assert!(chain(&e).contains("needs endpoints"), "{e:?}");
    let e = parse(&[
        "rollout.backend=\"remote\"",
        "rollout.endpoints=[\"localhost:1\"]",
    ])
    .unwrap_err();
    assert!(chain(&e).contains("not an http:// URL"), "{e:?}");
    let e = parse(&["rollout.protocol=\"grpc\""]).unwrap_err();
    assert!(chain(&e).contains("protocol"), "{e:?}");
    let c = parse(&["rollout.protocol=\"vllm\""]).unwrap();
    assert_eq!(
        c.rollout.protocol,
        rlreplay_train::config::RolloutProtocol::Openai
    );
}

#[test]
fn one_step_off_policy_learns_and_counts_staleness() {
    let model_dir = tempfile::tempdir().unwrap();
    let seed_run = model_dir.path().join("seed");
    train(
        toy_config(&[
            "trainer.total_training_steps=1".into(),
            "trainer.save_freq=1".into(),
        ]),
        &seed_run,
    )
    .unwrap();
    let model = seed_run.join("checkpoints/global_step_1");
    let (a, b) = (serve(&model), serve(&model));
    let urls = [a.url(), b.url()];
    // Hand-checked staleness: steps 1 and 2 are sent before step 1 trains (version 0); step t >= 3
    // is sent after the update of step t - 2. So step 1 trains fresh rows and every later step
    // rows exactly one version old.
    for protocol in ["sglang", "openai"] {
        let out = tempfile::tempdir().unwrap();
        let mut sets = remote(&urls, protocol);
        sets.push("rollout.max_off_policy_steps=1".into());
        let s = train(toy_config(&sets), out.path()).unwrap();
        let m = &s.last_metrics;
        assert_eq!(m["rollout/staleness/mean"], 1.0, "{protocol}: {m:?}");
        assert_eq!(m["rollout/staleness/max"], 1.0);
        assert_eq!(m["rollout/dropped_stale_rows"], 0.0);
        assert!((0.0..=1.0).contains(&m["timing_s/gen_overlap"]));
        for (step, version) in [(1, 0), (2, 0), (3, 1)] {
            let shard = out
                .path()
                .join(format!("rollouts/data/step-{step:04}.parquet"));
            let (rows, _) =
                rlreplay_data::read_shard(&shard, step, &rlreplay_data::ReadOptions::new([]))
                    .unwrap();
            assert!(
                rows.policy_version.iter().all(|&v| v == Some(version)),
                "{protocol} step {step}: {:?}",
                rows.policy_version
            );
        }
    }
    // k = 1 still learns on the toy task.
    let out = tempfile::tempdir().unwrap();
    let mut sets = remote(&urls, "openai");
    sets.extend(
        [
            "rollout.max_off_policy_steps=1",
            "toy.warmup_steps=40",
            "trainer.total_training_steps=20",
            "validation.test_freq=10",
            "validation.val_before_train=true",
            "trainer.save_freq=0",
        ]
        .map(String::from),
    );
    let s = train(toy_config(&sets), out.path()).unwrap();
    let (first, last) = (s.validations[0].1, s.validations.last().unwrap().1);
    assert!(last >= first + 0.1, "{:?}", s.validations);
    a.shutdown();
    b.shutdown();
}

/// A proxy in front of `upstream` that spoils the first sample of every completion answer as
/// `spoil` does to its choice; everything else passes unchanged.
fn spoiling_proxy(upstream: String, spoil: fn(&mut serde_json::Value)) -> String {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            let upstream = upstream.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(s.try_clone().unwrap());
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                let mut parts = line.split_whitespace();
                let (method, path) = (parts.next().unwrap().to_owned(), parts.next().unwrap());
                let mut len = 0;
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap() == 0 || h == "\r\n" {
                        break;
                    }
                    if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap();
                    }
                }
                let mut body = vec![0; len];
                reader.read_exact(&mut body).unwrap();
                let target = format!("{upstream}{path}");
                let answer = if method == "POST" {
                    ureq::post(&target)
                        .set("Content-Type", "application/json")
                        .send_bytes(&body)
                } else {
                    ureq::get(&target).call()
                };
                let (status, mut text) = match answer {
                    Ok(r) => (r.status(), r.into_string().unwrap()),
                    Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap()),
                    Err(e) => (502, e.to_string()),
                };
                if path.ends_with("/completions") && status == 200 {
                    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
                    spoil(&mut v["choices"][0]);
                    text = v.to_string();
                }
                let mut s = s;
                write!(
                    s,
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                    text.len()
                )
                .unwrap();
            });
        }
    });
    url
}

/// A server returning samples `validate` would refuse (a positive log-prob, an empty response,
/// more tokens than asked for) is never trained on: by default the run stops naming the endpoint
/// and the sample; with `invalid_samples = "drop"` the sample's group is dropped and counted,
/// and the logged rollouts stay valid.
#[test]
fn samples_validate_would_refuse_are_never_trained_on() {
    let seed = tempfile::tempdir().unwrap();
    train(
        toy_config(&[
            "trainer.total_training_steps=1".into(),
            "trainer.save_freq=1".into(),
        ]),
        seed.path(),
    )
    .unwrap();
    let server = serve(&seed.path().join("checkpoints/global_step_1"));
    let positive: fn(&mut serde_json::Value) = |c| c["logprobs"]["token_logprobs"][0] = 0.5.into();
    let empty: fn(&mut serde_json::Value) = |c| {
        c["token_ids"] = serde_json::json!([]);
        c["logprobs"]["token_logprobs"] = serde_json::json!([]);
        c["logprobs"]["tokens"] = serde_json::json!([]);
    };
    let long: fn(&mut serde_json::Value) = |c| {
        for _ in 0..9 {
            c["token_ids"].as_array_mut().unwrap().push(3.into());
            c["logprobs"]["token_logprobs"]
                .as_array_mut()
                .unwrap()
                .push((-1.0).into());
            c["logprobs"]["tokens"]
                .as_array_mut()
                .unwrap()
                .push("token_id:3".into());
        }
    };
    for (spoil, words) in [
        (positive, "log-prob 0.5 at token 0"),
        (empty, "empty response"),
        (long, "over max_response_length = 8"),
    ] {
        let proxy = spoiling_proxy(server.url(), spoil);
        let out = tempfile::tempdir().unwrap();
        let err = train(
            toy_config(&remote(std::slice::from_ref(&proxy), "openai")),
            out.path(),
        )
        .unwrap_err();
        let msg = chain(&err);
        assert!(
            msg.contains(&proxy) && msg.contains("prompt 0 sample 0") && msg.contains(words),
            "{msg}"
        );
        let out = tempfile::tempdir().unwrap();
        let mut sets = remote(&[proxy], "openai");
        sets.push("rollout.invalid_samples=\"drop\"".into());
        let s = train(toy_config(&sets), out.path()).unwrap();
        assert_eq!(s.last_metrics["rollout/invalid_samples"], 1.0, "{words}");
        assert_eq!(
            s.last_metrics["rollout/dropped_invalid_rows"], 8.0,
            "{words}"
        );
        let ds =
            rlreplay_data::Dataset::open(&out.path().join("rollouts").to_string_lossy()).unwrap();
        for (step, shard) in ds.steps() {
            let report =
                rlreplay_data::validate_shard(&shard, step, &rlreplay_data::ReadOptions::new([]));
            assert!(report.is_clean(), "{words}: {report}");
        }
    }
    server.shutdown();
}

/// Sets every `lora_B` of `policy` to values drawn from `seed` (a fresh adapter's are zero).
fn set_lora_b(policy: &mut rlreplay_model::Model, seed: u64) {
    for i in 0..policy.params().len() {
        let p = policy.params()[i].clone();
        if p.name.contains("lora_B") {
            let bytes: Vec<u8> = (0..p.var.elem_count())
                .flat_map(|j| {
                    let x = ((seed as usize * 31 + i * 13 + j * 7) as f32 * 0.37).sin();
                    (0.05 * x).to_le_bytes()
                })
                .collect();
            policy
                .set_weight_bytes(i, rlreplay_model::DType::F32, &bytes)
                .unwrap();
        }
    }
}

/// Bytes of the files under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

#[test]
fn a_lora_policy_syncs_only_its_adapter_and_samples_what_the_engine_samples() {
    use rlreplay_model::generate::Decoder;
    use rlreplay_model::{DType, Device, LoraConfig, Model, ModelConfig};
    use rlreplay_sampling::engine::generate;
    use rlreplay_sampling::sampling::SamplingParams;
    use rlreplay_train::config::{RolloutBackend, RolloutProtocol, RolloutSection};
    use rlreplay_train::source::remote::Remote;

    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let mut cfg = ModelConfig::tiny();
    cfg.extra.insert("eos_token_id".into(), 7.into());
    Model::new_random(cfg, 1, DType::F32, &Device::Cpu)
        .unwrap()
        .save_hf(&base)
        .unwrap();
    let server = serve(&base);
    let mut policy = Model::load(&base, DType::F32, &Device::Cpu).unwrap();
    let lora = LoraConfig::new(4, 8.0, &["q_proj", "v_proj", "up_proj"]).unwrap();
    policy.add_lora(lora, 3).unwrap();
    let prompts = vec![vec![1u32, 2, 3, 4], vec![9, 8]];
    let params = SamplingParams {
        temperature: 0.9,
        top_p: 1.0,
        top_k: 0,
        max_new_tokens: 12,
        stop_ids: vec![7],
        seed: 5,
    };
    let local = |policy: &Model| {
        generate(
            &Decoder::new(policy).unwrap(),
            &prompts,
            2,
            &params,
            256,
            |_| {},
        )
        .unwrap()
    };
    let full_bytes = dir_bytes(&base);
    for protocol in [RolloutProtocol::Openai, RolloutProtocol::Sglang] {
        let run = tempfile::tempdir().unwrap();
        let section = RolloutSection {
            backend: RolloutBackend::Remote,
            endpoints: vec![server.url()],
            protocol,
            retries: 0,
            ..Default::default()
        };
        let remote = Remote::new(&section, run.path(), 512);
        let mut before = Vec::new();
        for version in [1u64, 2] {
            set_lora_b(&mut policy, version);
            remote.sync(version, &policy).unwrap();
            // Only the adapter is written, in the same atomic scheme with its marker.
            let dir = run.path().join(format!("weights/step_{version}"));
            let mut files: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            files.sort();
            assert_eq!(
                files,
                ["STABLE", "adapter_config.json", "adapter_model.safetensors"]
            );
            assert!(
                dir_bytes(&dir) * 10 < full_bytes,
                "{protocol:?}: {} bytes written for weights of {full_bytes}",
                dir_bytes(&dir)
            );
            assert!(!run
                .path()
                .join(format!("weights/step_{}", version - 1))
                .exists());
            // The servers sample what the trainer's engine samples with the adapter.
            let got = remote.generate(&prompts, 2, &params).unwrap();
            let want = local(&policy);
            assert_eq!(got.generations, want, "{protocol:?}, version {version}");
            assert!(got.versions.iter().all(|&v| v == Some(version)));
            assert_ne!(want, before, "the new adapter changes nothing");
            before = want;
        }
    }
    // The base model is still served unchanged to requests that name no adapter.
    let plain = Model::load(&base, DType::F32, &Device::Cpu).unwrap();
    let run = tempfile::tempdir().unwrap();
    let section = RolloutSection {
        backend: RolloutBackend::Remote,
        endpoints: vec![server.url()],
        weight_sync: rlreplay_train::config::WeightSync::None,
        retries: 0,
        ..Default::default()
    };
    let got = Remote::new(&section, run.path(), 512)
        .generate(&prompts, 2, &params)
        .unwrap();
    assert_eq!(got.generations, local(&plain));
    server.shutdown();
}
