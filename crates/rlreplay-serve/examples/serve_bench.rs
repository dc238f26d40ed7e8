//! `serve` throughput: tokens/s of `rlreplay serve` under `c` concurrent requests, against the
//! in-process engine decoding the same prompts as one batch, on a random Qwen3 model (4 layers,
//! hidden 256, vocab 8192, as `bench/generate.sh`), or on the model directory in the `MODEL`
//! environment variable (for example `models/smollm2-135m-instruct`).
//!
//! For each concurrency the in-process run and the server run alternate `rounds` times (the
//! machine may be loaded by other work; interleaving lets both see the same load). Each request
//! is one prompt of `prompt_len` random tokens generating exactly `new_tokens` tokens
//! (temperature 1, top-p 0.95, `ignore_eos`); every client thread sends `per_client` requests one
//! after the other. Prints one JSON line per run.
//!
//! Usage: `serve_bench [prompt_len=32] [new_tokens=128] [per_client=2] [rounds=2] [c...=1 8 32]`.

use std::time::Instant;

use rand::{Rng, SeedableRng};
use rlreplay_model::generate::Decoder;
use rlreplay_model::{DType, Device, Model, ModelConfig};
use rlreplay_sampling::engine::generate;
use rlreplay_sampling::sampling::SamplingParams;
use rlreplay_serve::{BoundServer, ServeConfig};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<std::result::Result<_, _>>()?;
    let arg = |i: usize, d: usize| args.get(i).copied().unwrap_or(d);
    let (prompt_len, new_tokens, per_client, rounds) =
        (arg(0, 32), arg(1, 128), arg(2, 2), arg(3, 2));
    let levels: Vec<usize> = if args.len() > 4 {
        args[4..].to_vec()
    } else {
        vec![1, 8, 32]
    };
    let cfg = ModelConfig {
        vocab_size: 8192,
        hidden_size: 256,
        intermediate_size: 768,
        num_hidden_layers: 4,
        num_attention_heads: 8,
        num_key_value_heads: 4,
        head_dim: 32,
        ..ModelConfig::tiny()
    };
    let dir = tempfile::tempdir()?;
    let model_dir = match std::env::var_os("MODEL") {
        Some(m) => std::path::PathBuf::from(m),
        None => {
            Model::new_random(cfg, 0, DType::F32, &Device::Cpu)?.save_hf(dir.path())?;
            dir.path().to_path_buf()
        }
    };
    let model = Model::load(&model_dir, DType::F32, &Device::Cpu)?;
    let vocab = model.config().vocab_size as u32;
    let decoder = Decoder::new(&model)?;
    let mut server_cfg = ServeConfig::new(&model_dir);
    server_cfg.port = 0;
    let server = BoundServer::bind(server_cfg)?.spawn()?;
    let url = format!("{}/v1/completions", server.url());
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let max_c = levels.iter().copied().max().unwrap_or(1);
    let prompts: Vec<Vec<u32>> = (0..max_c * per_client)
        .map(|_| {
            (0..prompt_len)
                .map(|_| rng.random_range(0..vocab))
                .collect()
        })
        .collect();
    let params = SamplingParams {
        temperature: 1.0,
        top_p: 0.95,
        top_k: 0,
        max_new_tokens: new_tokens,
        stop_ids: vec![],
        seed: 0,
    };
    // Warm-up both paths.
    generate(&decoder, &prompts[..1], 1, &params, 1, |_| {})?;
    ureq::post(&url).send_json(serde_json::json!({"prompt": prompts[0], "max_tokens": 4}))?;
    for &c in &levels {
        for round in 0..rounds {
            // In process: the same requests, `c` at a time as one batch.
            let t = Instant::now();
            let mut tokens = 0;
            for k in 0..per_client {
                let batch = &prompts[k * c..(k + 1) * c];
                let gens = generate(&decoder, batch, 1, &params, c, |_| {})?;
                tokens += gens.iter().map(|g| g.tokens.len()).sum::<usize>();
            }
            let secs = t.elapsed().as_secs_f64();
            println!(
                "{}",
                serde_json::json!({"path": "engine", "concurrency": c, "round": round,
                    "tokens": tokens, "seconds": secs, "tokens_per_s": tokens as f64 / secs})
            );
            // Over HTTP: `c` client threads.
            let t = Instant::now();
            let handles: Vec<_> = (0..c)
                .map(|i| {
                    let url = url.clone();
                    let mine: Vec<Vec<u32>> = (0..per_client)
                        .map(|k| prompts[k * c + i].clone())
                        .collect();
                    std::thread::spawn(move || -> usize {
                        let mut n = 0;
                        for p in mine {
                            let body = serde_json::json!({"prompt": p,
                                "max_tokens": new_tokens, "temperature": 1.0, "top_p": 0.95,
                                "ignore_eos": true, "seed": 0, "logprobs": 0,
                                "return_tokens_as_token_ids": true});
                            let r: serde_json::Value = ureq::post(&url)
                                .send_json(body)
                                .expect("request")
                                .into_json()
                                .expect("json");
                            n += r["usage"]["completion_tokens"].as_u64().expect("usage") as usize;
                        }
                        n
                    })
                })
                .collect();
            let tokens: usize = handles.into_iter().map(|h| h.join().expect("client")).sum();
            let secs = t.elapsed().as_secs_f64();
            println!(
                "{}",
                serde_json::json!({"path": "serve", "concurrency": c, "round": round,
                    "tokens": tokens, "seconds": secs, "tokens_per_s": tokens as f64 / secs})
            );
        }
    }
    server.shutdown();
    Ok(())
}
