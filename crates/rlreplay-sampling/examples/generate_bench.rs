//! Sampling throughput on a random Qwen3 model, or on the model already in `MODEL_DIR` (a real
//! one such as SmolLM2-135M-Instruct) when it holds a `config.json`: saves the random model (for
//! the transformers side of `bench/generate.sh`), samples `batch` prompts of `prompt_len` random tokens for exactly
//! `new_tokens` tokens each (no stop ids), and prints one JSON line with tokens/s and the process
//! CPU time (user + system, all threads, from `/proc/self/stat`; `null` where unavailable) of the
//! timed run.
//!
//! Usage: `generate_bench MODEL_DIR [batch] [prompt_len] [new_tokens]`.

use std::time::Instant;

use rand::{Rng, SeedableRng};
use rlreplay_model::generate::Decoder;
use rlreplay_model::{DType, Device, Model, ModelConfig};
use rlreplay_sampling::engine::generate;
use rlreplay_sampling::sampling::SamplingParams;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The benchmark model: 4 layers, hidden 256, 8/4 heads of 32, MLP 768, vocab 8192.
fn bench_config() -> ModelConfig {
    ModelConfig {
        vocab_size: 8192,
        hidden_size: 256,
        intermediate_size: 768,
        num_hidden_layers: 4,
        num_attention_heads: 8,
        num_key_value_heads: 4,
        head_dim: 32,
        ..ModelConfig::tiny()
    }
}

/// CPU seconds (user + system, all threads) of this process so far, on Linux.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name: state is field 3, utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace().skip(11);
    let ticks = |f: Option<&str>| f.and_then(|v| v.parse::<f64>().ok());
    // Clock ticks are 1/100 s on Linux (USER_HZ).
    Some((ticks(fields.next())? + ticks(fields.next())?) / 100.0)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args
        .get(1)
        .ok_or("usage: generate_bench MODEL_DIR [batch] [prompt_len] [new_tokens]")?;
    let num = |i: usize, default: usize| -> Result<usize> {
        args.get(i).map_or(Ok(default), |s| {
            s.parse()
                .map_err(|e| format!("argument {i}: {s}: {e}").into())
        })
    };
    let (batch, prompt_len, new_tokens) = (num(2, 16)?, num(3, 32)?, num(4, 128)?);
    let model = if std::path::Path::new(dir).join("config.json").is_file() {
        Model::load(dir, DType::F32, &Device::Cpu)?
    } else {
        let model = Model::new_random(bench_config(), 0, DType::F32, &Device::Cpu)?;
        model.save_hf(dir)?;
        model
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let vocab = model.config().vocab_size as u32;
    let prompts: Vec<Vec<u32>> = (0..batch)
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
    let decoder = Decoder::new(&model)?;
    // Warm-up, then the timed run.
    generate(
        &decoder,
        &prompts[..1],
        1,
        &SamplingParams {
            max_new_tokens: 4,
            ..params.clone()
        },
        batch,
        |_| {},
    )?;
    let (start, cpu_start) = (Instant::now(), cpu_seconds());
    let gens = generate(&decoder, &prompts, 1, &params, batch, |_| {})?;
    let secs = start.elapsed().as_secs_f64();
    let cpu = match (cpu_start, cpu_seconds()) {
        (Some(a), Some(b)) => format!("{:.3}", b - a),
        _ => "null".to_string(),
    };
    let tokens: usize = gens.iter().map(|g| g.tokens.len()).sum();
    println!(
        "{{\"impl\": \"rlreplay\", \"batch\": {batch}, \"prompt_len\": {prompt_len}, \"new_tokens\": {new_tokens}, \"tokens\": {tokens}, \"seconds\": {secs:.4}, \"cpu_seconds\": {cpu}, \"tokens_per_s\": {:.1}}}",
        tokens as f64 / secs
    );
    Ok(())
}
