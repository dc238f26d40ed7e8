//! Forward+backward speed of the Qwen3 model on the CPU, and the peak memory of long-response
//! log-probs. Run through `bench/model.sh`, which also times PyTorch eager on the same shapes.
//!
//! `cargo bench -p rlreplay-model --bench model -- MODE [ITERS]`, MODE one of:
//! - `tiny`: vocab 512, hidden 128, 2 layers, 4/2 heads of 32, MLP 384, 4 × 256 tokens;
//! - `small`: Qwen3 proportions with the full 151,936 vocabulary: hidden 256, MLP 768, 2 layers,
//!   4/2 heads of 128, tied embeddings, 4 × 256 tokens;
//! - `dir DIR [ITERS]`: the model saved in the Hugging Face directory DIR (for example the
//!   converted SmolLM2-135M-Instruct), 4 × 256 tokens (`SHAPE=1x1024`: one sequence of 1,024);
//! - `logprobs-rss`: log-probs of one 4096-token response through a 151,936 × 2560 lm_head, then
//!   the peak resident memory of the process;
//! - `recompute-rss [on|off]`: one forward+backward of a 4096-token sequence through 8 layers
//!   (hidden 256, MLP 768, 4/2 heads of 64, vocab 8192) with per-layer activation recompute on or
//!   off, then the time and the peak resident memory of the process (run each in its own process);
//! - `gemm [ITERS]`: the f32 matrix-multiply peak of the `gemm` crate the kernels and candle use,
//!   at `RAYON_NUM_THREADS` threads, on a square shape and the shapes of a Qwen3-0.6B layer;
//! - `layer [ITERS]`: forward+backward of one Qwen3-0.6B-shaped decoder layer (hidden 1024, MLP
//!   3072, 16/8 heads of 128) on 4 × 512 packed tokens, with a 1024-token vocabulary, in GFLOP/s
//!   of useful work (`6 × tokens × weights` plus `12 × D` per causal query-key pair and head).
//!
//! `tiny`, `small` and `layer` keep freed memory committed (`MIMALLOC_PURGE_DELAY=-1`, set by
//! running again with it when the environment does not set it) as the training commands of the
//! `rlreplay` binary do; the memory modes keep mimalloc's defaults.

use candle_core::{DType, Device, Tensor};
use rlreplay_model::{ops, Model, ModelConfig, SeqPair};
use std::time::Instant;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Sequences per step and tokens per sequence.
const BATCH: usize = 4;
const SEQ_LEN: usize = 256;

fn small_config() -> ModelConfig {
    ModelConfig {
        vocab_size: 151_936,
        hidden_size: 256,
        intermediate_size: 768,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 128,
        ..ModelConfig::tiny()
    }
}

/// Deterministic token ids below `vocab`.
fn token_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 33) % vocab as u64) as u32
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Peak resident set size of this process in MiB (Linux `VmHWM`).
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

fn bench_model(name: &str, cfg: ModelConfig, iters: usize) -> anyhow::Result<()> {
    bench_loaded(
        name,
        Model::new_random(cfg, 0, DType::F32, &Device::Cpu)?,
        iters,
    )
}

fn bench_loaded(name: &str, mut model: Model, iters: usize) -> anyhow::Result<()> {
    let vocab = model.config().vocab_size;
    let (batch, seq_len) = shape()?;
    let ids: Vec<Vec<u32>> = (0..batch)
        .map(|b| token_ids(seq_len, vocab, b as u64))
        .collect();
    // Prompt = first token, response = the rest: every next-token position is scored, as in the
    // PyTorch side.
    let pairs: Vec<SeqPair<'_>> = ids.iter().map(|s| SeqPair::new(&s[..1], &s[1..])).collect();
    let n_targets = batch * (seq_len - 1);
    let grad = vec![1.0 / n_targets as f64; n_targets];
    let mut fwd = Vec::new();
    let mut fwd_bwd = Vec::new();
    for i in 0..=iters {
        let t0 = Instant::now();
        model.logprobs(&pairs, 1.0, false)?;
        let t1 = Instant::now();
        model.zero_grad();
        model.forward_backward(&pairs, &grad, 1.0)?;
        let t2 = Instant::now();
        if i > 0 {
            fwd.push((t1 - t0).as_secs_f64() * 1e3);
            fwd_bwd.push((t2 - t1).as_secs_f64() * 1e3);
        }
    }
    let (f, fb) = (median(fwd), median(fwd_bwd));
    println!(
        "rlreplay config={name} threads={} tokens={} fwd_ms={f:.1} fwd_bwd_ms={fb:.1} \
         fwd_bwd_tok_s={:.0} peak_rss_mib={:.0}",
        rayon::current_num_threads(),
        batch * seq_len,
        (batch * seq_len) as f64 / fb * 1e3,
        peak_rss_mib()
    );
    Ok(())
}

/// Sequences and tokens per sequence of `dir` mode: the `SHAPE` environment variable
/// (`SEQSxLEN`, for example `1x1024` for one packed sequence), by default 4 × 256.
fn shape() -> anyhow::Result<(usize, usize)> {
    let Ok(s) = std::env::var("SHAPE") else {
        return Ok((BATCH, SEQ_LEN));
    };
    let parsed = s
        .split_once('x')
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
    match parsed {
        Some((a, b)) if a > 0 && b > 1 => Ok((a, b)),
        _ => anyhow::bail!("SHAPE={s:?} is not SEQSxLEN (for example 1x1024)"),
    }
}

fn logprobs_rss() -> anyhow::Result<()> {
    let (n, vocab, h) = (4096, 151_936, 2560);
    let dev = Device::Cpu;
    let hidden = Tensor::randn(0f32, 1.0, (n, h), &dev)?;
    let lm_head = Tensor::randn(0f32, 0.02, (vocab, h), &dev)?;
    let targets = token_ids(n, vocab, 7);
    let inputs_mib = ((n + vocab) * h * 4) as f64 / (1 << 20) as f64;
    let before = peak_rss_mib();
    let t0 = Instant::now();
    let (lp, ent) = ops::token_logprobs(&hidden, &lm_head, &targets, 1.0, true)?;
    let mean_lp = lp.mean_all()?.to_scalar::<f32>()?;
    let mean_ent = ent.map(|e| e.mean_all()?.to_scalar::<f32>()).transpose()?;
    println!(
        "rlreplay logprobs tokens={n} vocab={vocab} hidden={h} secs={:.1} mean_logp={mean_lp:.4} \
         mean_entropy={:.4} inputs_mib={inputs_mib:.0} peak_rss_before_mib={before:.0} \
         peak_rss_mib={:.0} full_logits_mib={:.0}",
        t0.elapsed().as_secs_f64(),
        mean_ent.unwrap_or(f32::NAN),
        peak_rss_mib(),
        (n * vocab * 4) as f64 / (1 << 20) as f64
    );
    Ok(())
}

fn recompute_rss(on: bool) -> anyhow::Result<()> {
    let cfg = ModelConfig {
        vocab_size: 8192,
        hidden_size: 256,
        intermediate_size: 768,
        num_hidden_layers: 8,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 64,
        ..ModelConfig::tiny()
    };
    let (vocab, n) = (cfg.vocab_size, 4096);
    let mut model = Model::new_random(cfg, 0, DType::F32, &Device::Cpu)?;
    model.set_activation_recompute(on);
    let ids = token_ids(n, vocab, 3);
    let pairs = [SeqPair::new(&ids[..1], &ids[1..])];
    let grad = vec![1.0 / (n - 1) as f64; n - 1];
    let before = peak_rss_mib();
    let t0 = Instant::now();
    model.forward_backward(&pairs, &grad, 1.0)?;
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "rlreplay fwd_bwd tokens={n} layers=8 hidden=256 recompute={on} threads={} \
         secs={secs:.2} peak_rss_before_mib={before:.0} peak_rss_mib={:.0} grad_norm={:.6}",
        rayon::current_num_threads(),
        peak_rss_mib(),
        model.grad_norm()?
    );
    Ok(())
}

/// Best time of `iters` calls of `f` in seconds.
fn best_secs(iters: usize, mut f: impl FnMut()) -> f64 {
    (0..iters.max(1))
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn gemm_peak(iters: usize) -> anyhow::Result<()> {
    let threads = rayon::current_num_threads();
    let par = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // (name, m, k, n, a transposed, b transposed): dst[m, n] = a[m, k] · b[k, n].
    let shapes = [
        ("square", 2048, 2048, 2048, false, false),
        ("x·Wt up/gate", 2048, 1024, 3072, false, true),
        ("x·Wt down", 2048, 3072, 1024, false, true),
        ("dy·W (grad x)", 2048, 3072, 1024, false, false),
        ("dyt·x (grad W)", 3072, 2048, 1024, true, false),
    ];
    for (name, m, k, n, at, bt) in shapes {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.1).collect();
        let mut dst = vec![0f32; m * n];
        // Row/column strides of a row-major [m, k] (or its transpose stored as [k, m]).
        let (a_cs, a_rs) = if at { (m as isize, 1) } else { (1, k as isize) };
        let (b_cs, b_rs) = if bt { (k as isize, 1) } else { (1, n as isize) };
        let secs = best_secs(iters, || {
            // SAFETY: the three buffers hold m·k, k·n and m·n elements and the strides describe
            // row-major matrices (or their transposes) of exactly those sizes.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    dst.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a.as_ptr(),
                    a_cs,
                    a_rs,
                    b.as_ptr(),
                    b_cs,
                    b_rs,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    par,
                )
            }
        });
        println!(
            "rlreplay gemm f32 threads={threads} shape={name:?} m={m} k={k} n={n} ms={:.1} \
             gflop_s={:.1}",
            secs * 1e3,
            2.0 * (m * k * n) as f64 / secs / 1e9
        );
    }
    Ok(())
}

fn bench_layer(iters: usize) -> anyhow::Result<()> {
    let cfg = ModelConfig {
        vocab_size: 1024,
        hidden_size: 1024,
        intermediate_size: 3072,
        num_hidden_layers: 1,
        num_attention_heads: 16,
        num_key_value_heads: 8,
        head_dim: 128,
        ..ModelConfig::tiny()
    };
    let (seqs, len) = (4, 512);
    let (h, i, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let (hq, hkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let layer_weights = h * hq * d * 2 + h * hkv * d * 2 + 3 * h * i;
    let tokens = seqs * len;
    let pairs_per_head = seqs * len * (len + 1) / 2;
    let layer_flop =
        6.0 * (tokens * layer_weights) as f64 + 12.0 * (d * hq * pairs_per_head) as f64;
    let head_flop = 6.0 * (seqs * (len - 1) * cfg.vocab_size * h) as f64;
    let vocab = cfg.vocab_size;
    let mut model = Model::new_random(cfg, 0, DType::F32, &Device::Cpu)?;
    let ids: Vec<Vec<u32>> = (0..seqs).map(|b| token_ids(len, vocab, b as u64)).collect();
    let pairs: Vec<SeqPair<'_>> = ids.iter().map(|s| SeqPair::new(&s[..1], &s[1..])).collect();
    let n_targets = seqs * (len - 1);
    let grad = vec![1.0 / n_targets as f64; n_targets];
    let mut times = Vec::new();
    for it in 0..=iters {
        model.zero_grad();
        let t0 = Instant::now();
        model.forward_backward(&pairs, &grad, 1.0)?;
        if it > 0 {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    let secs = median(times);
    println!(
        "rlreplay layer hidden={h} mlp={i} heads={hq}/{hkv}x{d} tokens={tokens} threads={} \
         fwd_bwd_ms={:.1} layer_gflop={:.1} head_gflop={:.1} gflop_s={:.1}",
        rayon::current_num_threads(),
        secs * 1e3,
        layer_flop / 1e9,
        head_flop / 1e9,
        (layer_flop + head_flop) / secs / 1e9
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    // SAFETY: no other thread exists yet.
    unsafe { rlreplay_model::keep_candle_elementwise_on_caller() };
    // `cargo bench` appends `--bench`; ignore flags.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let mode = args.first().map_or("tiny", String::as_str);
    let iters = |default| -> anyhow::Result<usize> {
        Ok(args
            .get(1)
            .map(|s| s.parse())
            .transpose()?
            .unwrap_or(default))
    };
    if matches!(mode, "tiny" | "small" | "layer" | "dir")
        && std::env::var_os("MIMALLOC_PURGE_DELAY").is_none()
    {
        // As `rlreplay replay` and `train` set for their training steps (not for the memory
        // modes): freed memory stays committed. mimalloc reads it at start, so run again with it.
        let status = std::process::Command::new(std::env::current_exe()?)
            .args(std::env::args_os().skip(1))
            .env("MIMALLOC_PURGE_DELAY", "-1")
            .status()?;
        std::process::exit(status.code().unwrap_or(1));
    }
    match mode {
        "tiny" => bench_model("tiny", ModelConfig::tiny(), iters(5)?),
        "small" => bench_model("small", small_config(), iters(2)?),
        "dir" => {
            let dir = args
                .get(1)
                .ok_or_else(|| anyhow::anyhow!("dir takes a model directory"))?;
            let iters = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(2);
            let model = Model::load(dir, DType::F32, &Device::Cpu)?;
            bench_loaded(dir, model, iters)
        }
        "logprobs-rss" => logprobs_rss(),
        "gemm" => gemm_peak(iters(5)?),
        "layer" => bench_layer(iters(3)?),
        "recompute-rss" => match args.get(1).map(String::as_str) {
            Some("on") => recompute_rss(true),
            Some("off") | None => recompute_rss(false),
            Some(other) => anyhow::bail!("recompute-rss takes on or off, got {other:?}"),
        },
        other => anyhow::bail!(
            "unknown mode {other:?} (tiny, small, dir DIR, logprobs-rss, recompute-rss [on|off], \
             gemm, layer)"
        ),
    }
}
