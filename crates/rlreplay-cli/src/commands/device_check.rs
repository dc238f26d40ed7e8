//! `rlreplay device-check` (hidden): the measurements behind `scripts/gpu-check.sh`, each printing
//! one JSON object. `golden`: the golden fixtures' log-probs on the device (f32 and bf16) against
//! their float64 references. `step`: the model side of one replay step (gradient of the per-token
//! loss coefficients, clipping, AdamW) on the device against the CPU in f32. `throughput`:
//! forward+backward tokens/s, peak device memory and MFU of a random model of a named shape on
//! packed sequences, optionally with the AdamW step (a full replay step).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::safetensors::load;
use rlreplay_model::golden::{self, max_abs_diff, Golden};
use rlreplay_model::{
    memory_peak, parse_device, reset_memory_peak, AdamW, AdamWConfig, DType, Device, Model,
    ModelConfig, SeqPair,
};
use serde_json::{json, Value};

/// Arguments of `rlreplay device-check`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    check: Check,
}

#[derive(clap::Subcommand)]
enum Check {
    /// Log-probs of the golden fixtures on the device (f32, bf16) against float64 references.
    Golden(FixtureArgs),
    /// One replay step's gradient and AdamW update on the device against the CPU in f32.
    Step(FixtureArgs),
    /// Forward+backward tokens/s, peak memory and MFU of a random model on packed sequences.
    Throughput(ThroughputArgs),
}

#[derive(clap::Args)]
struct FixtureArgs {
    /// Directory of the golden fixtures (`NAME/` checkpoints and `NAME.golden.json`).
    #[arg(long)]
    fixtures: PathBuf,
    /// Device: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cuda")]
    device: String,
}

/// Model shapes of the throughput check.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Shape {
    /// Qwen3-0.6B: 28 layers, hidden 1024, 16/8 heads of 128, tied embeddings.
    #[value(name = "qwen3-0.6b")]
    Qwen3_0_6b,
    /// Qwen3-4B: 36 layers, hidden 2560, 32/8 heads of 128, tied embeddings.
    #[value(name = "qwen3-4b")]
    Qwen3_4b,
    /// The tiny test model (CPU runs of the script).
    Tiny,
}

impl Shape {
    fn config(self) -> ModelConfig {
        let qwen3 = |hidden, intermediate, layers, heads| ModelConfig {
            vocab_size: 151_936,
            hidden_size: hidden,
            intermediate_size: intermediate,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: 8,
            head_dim: 128,
            tie_word_embeddings: true,
            max_position_embeddings: 40_960,
            ..ModelConfig::tiny()
        };
        match self {
            Shape::Qwen3_0_6b => qwen3(1024, 3072, 28, 16),
            Shape::Qwen3_4b => qwen3(2560, 9728, 36, 32),
            Shape::Tiny => ModelConfig::tiny(),
        }
    }
}

/// How the backward pass treats activations.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// The whole autograd graph is kept.
    Full,
    /// Gradient checkpointing: each layer is recomputed in the backward pass.
    Recompute,
}

#[derive(clap::Args)]
struct ThroughputArgs {
    /// Device: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cuda")]
    device: String,
    /// Model shape.
    #[arg(long, value_enum, default_value = "qwen3-0.6b")]
    shape: Shape,
    /// Packed sequences per step.
    #[arg(long, default_value_t = 4)]
    seqs: usize,
    /// Tokens per sequence (prompt + response).
    #[arg(long, default_value_t = 4096)]
    seq_len: usize,
    /// Prompt tokens of each sequence (the rest is the scored response).
    #[arg(long, default_value_t = 512)]
    prompt_len: usize,
    /// Compute dtype: bf16 or f32 (f32 master weights and optimizer state either way).
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Modes measured, in order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "full,recompute"
    )]
    modes: Vec<Mode>,
    /// Untimed steps before the timed ones (kernel loading, allocator warm-up).
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Timed steps per mode.
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Also apply AdamW in every step (a full replay step, moments included).
    #[arg(long)]
    optimizer: bool,
    /// Dense peak of the device in TFLOP/s for the compute dtype (H100/H200 SXM bf16: 989.4).
    #[arg(long, default_value_t = 989.4)]
    peak_tflops: f64,
}

/// Runs `rlreplay device-check`.
pub fn run(args: Args) -> Result<ExitCode> {
    let out = match args.check {
        Check::Golden(a) => golden(&a)?,
        Check::Step(a) => step(&a)?,
        Check::Throughput(a) => throughput(&a)?,
    };
    println!("{out}");
    Ok(ExitCode::SUCCESS)
}

fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 => "bf16",
        DType::F64 => "f64",
        _ => "f32",
    }
}

/// Item 1: log-probs and entropies of every fixture, f32 and bf16 on the device.
fn golden(a: &FixtureArgs) -> Result<Value> {
    let device = parse_device(&a.device)?;
    let goal = [(DType::F32, 1e-4), (DType::BF16, 5e-2)];
    let mut per_fixture = BTreeMap::new();
    let mut worst = BTreeMap::new();
    for (name, g) in golden::fixtures(&a.fixtures)? {
        let mut row = BTreeMap::new();
        for (dtype, _) in goal {
            let model = Model::load(a.fixtures.join(&name), dtype, &device)?;
            let lp = model.logprobs(&g.pairs(), g.temperature, true)?;
            let d_lp = max_abs_diff(&lp.logprobs, &g.logprobs);
            let d_ent = max_abs_diff(lp.entropy.as_deref().unwrap_or_default(), &g.entropy);
            let w = worst.entry(dtype_name(dtype)).or_insert(0.0f64);
            *w = w.max(d_lp);
            row.insert(
                dtype_name(dtype),
                json!({"logprob_max_abs_err": d_lp, "entropy_max_abs_err": d_ent}),
            );
        }
        per_fixture.insert(name, row);
    }
    let meets = goal
        .iter()
        .all(|(dt, tol)| worst.get(dtype_name(*dt)).is_some_and(|w| w <= tol));
    Ok(json!({
        "device": a.device,
        "fixtures": per_fixture,
        "logprob_max_abs_err": worst,
        "goal": {"f32": 1e-4, "bf16": 5e-2},
        "meets_goal": meets,
    }))
}

/// Flattened f64 values of every gradient (or weight) tensor of a model, in parameter order.
fn flat(tensors: impl IntoIterator<Item = candle_core::Tensor>) -> Result<Vec<f64>> {
    let mut out = Vec::new();
    for t in tensors {
        out.extend(t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?);
    }
    Ok(out)
}

/// `‖a − b‖ / ‖b‖`.
fn rel_l2(a: &[f64], b: &[f64]) -> f64 {
    let diff: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let norm: f64 = b.iter().map(|y| y * y).sum();
    (diff / norm.max(f64::MIN_POSITIVE)).sqrt()
}

/// Gradient and update of one step of `name` in `dtype` on `device`: `(gradient, Δweights)`.
fn one_step(dir: &Path, g: &Golden, dtype: DType, device: &Device) -> Result<(Vec<f64>, Vec<f64>)> {
    let mut model = Model::load(dir, dtype, device)?;
    let before = flat(model.params().iter().map(|p| p.var.as_tensor().clone()))?;
    model.forward_backward(&g.pairs(), &g.weights, g.temperature)?;
    let grad = flat(model.grads().iter().flatten().cloned())?;
    let mut opt = AdamW::new(&model, g.adamw.config());
    opt.step(&mut model, g.adamw.lr)?;
    let after = flat(model.params().iter().map(|p| p.var.as_tensor().clone()))?;
    let update = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    Ok((grad, update))
}

/// Item 2: one replay step (the golden per-token coefficients, clipping, AdamW) on the device in
/// f32 and bf16 against the same step on the CPU in f32, and against transformers' f64 gradient.
fn step(a: &FixtureArgs) -> Result<Value> {
    let device = parse_device(&a.device)?;
    let mut per_fixture = BTreeMap::new();
    let mut worst: BTreeMap<String, f64> = BTreeMap::new();
    for (name, g) in golden::fixtures(&a.fixtures)? {
        let dir = a.fixtures.join(&name);
        let (cpu_grad, cpu_update) = one_step(&dir, &g, DType::F32, &Device::Cpu)?;
        let reference = load(
            a.fixtures.join(format!("{name}.grads.safetensors")),
            &Device::Cpu,
        )?;
        let cpu_model = Model::load(&dir, DType::F32, &Device::Cpu)?;
        let f64_grad = flat(
            cpu_model
                .params()
                .iter()
                .map(|p| reference.get(&p.name).cloned().context(p.name.clone()))
                .collect::<Result<Vec<_>>>()?,
        )?;
        let mut row = BTreeMap::new();
        row.insert(
            "cpu_f32".to_string(),
            json!({"grad_rel_err_vs_f64": rel_l2(&cpu_grad, &f64_grad)}),
        );
        for dtype in [DType::F32, DType::BF16] {
            let (grad, update) = one_step(&dir, &g, dtype, &device)?;
            let (eg, eu) = (rel_l2(&grad, &cpu_grad), rel_l2(&update, &cpu_update));
            let key = dtype_name(dtype);
            for (what, v) in [("grad", eg), ("update", eu)] {
                let w = worst.entry(format!("{key}_{what}")).or_insert(0.0);
                *w = w.max(v);
            }
            row.insert(
                format!("{}_{key}", a.device),
                json!({
                    "grad_rel_err_vs_cpu_f32": eg,
                    "update_rel_err_vs_cpu_f32": eu,
                    "grad_rel_err_vs_f64": rel_l2(&grad, &f64_grad),
                }),
            );
        }
        per_fixture.insert(name, row);
    }
    Ok(json!({
        "device": a.device,
        "what": "forward_backward with the fixture's per-token coefficients, global-norm clipping \
                 and one AdamW step; relative L2 errors of the gradient and of the weight update",
        "fixtures": per_fixture,
        "worst_rel_err_vs_cpu_f32": worst,
    }))
}

/// Matrix-multiply FLOPs per token of forward+backward: `6 × (non-embedding weights + lm_head)`
/// plus attention `12 × layers × heads × head_dim × seq_len` (the PaLM convention, no discount for
/// the causal mask).
fn flops_per_token(cfg: &ModelConfig, seq_len: usize) -> f64 {
    let (h, i, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let (hq, hkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let layer = h * hq * d * 2 + h * hkv * d * 2 + 3 * h * i;
    let matmul = cfg.num_hidden_layers * layer + cfg.vocab_size * h;
    6.0 * matmul as f64 + 12.0 * (cfg.num_hidden_layers * hq * d * seq_len) as f64
}

/// Peak device memory since the last reset, in GiB (null on the CPU).
fn peak_gib(device: &Device) -> Result<(Value, Value)> {
    const GIB: f64 = (1u64 << 30) as f64;
    Ok(match memory_peak(device)? {
        Some((peak, total)) => (json!(peak as f64 / GIB), json!(total as f64 / GIB)),
        None => (Value::Null, Value::Null),
    })
}

/// Items 3 and 4: steps of a random model on `seqs × seq_len` packed tokens.
fn throughput(a: &ThroughputArgs) -> Result<Value> {
    anyhow::ensure!(
        a.prompt_len < a.seq_len && a.seqs > 0,
        "--prompt-len must be below --seq-len and --seqs at least 1"
    );
    let device = parse_device(&a.device)?;
    let dtype = match a.dtype.as_str() {
        "bf16" => DType::BF16,
        "f32" => DType::F32,
        other => anyhow::bail!("--dtype {other:?} is not bf16 or f32"),
    };
    let cfg = a.shape.config();
    let vocab = cfg.vocab_size as u64;
    let flops = flops_per_token(&cfg, a.seq_len);
    let started = Instant::now();
    let mut model = Model::new_random_on_device(cfg, dtype, &device)?;
    device.synchronize()?;
    let init_s = started.elapsed().as_secs_f64();
    let params: usize = model.params().iter().map(|p| p.var.elem_count()).sum();
    let seqs: Vec<(Vec<u32>, Vec<u32>)> = (0..a.seqs as u64)
        .map(|s| {
            let tok = |i: u64| ((s * 1_000_003 + i * 7_919) % (vocab - 1) + 1) as u32;
            let all: Vec<u32> = (0..a.seq_len as u64).map(tok).collect();
            (all[..a.prompt_len].to_vec(), all[a.prompt_len..].to_vec())
        })
        .collect();
    let pairs: Vec<SeqPair<'_>> = seqs.iter().map(|(p, r)| SeqPair::new(p, r)).collect();
    let scored = a.seqs * (a.seq_len - a.prompt_len);
    let coefs = vec![1.0 / scored as f64; scored];
    let tokens = a.seqs * a.seq_len;
    let mut opt = AdamW::new(&model, AdamWConfig::default());
    let mut modes = BTreeMap::new();
    for &mode in &a.modes {
        model.set_activation_recompute(mode == Mode::Recompute);
        reset_memory_peak(&device)?;
        let mut times = Vec::new();
        let mut run = || -> Result<()> {
            for i in 0..a.warmup + a.steps {
                let t0 = Instant::now();
                model.forward_backward(&pairs, &coefs, 1.0)?;
                if a.optimizer {
                    opt.step(&mut model, 1e-6)?;
                } else {
                    model.zero_grad();
                }
                device.synchronize()?;
                if i >= a.warmup {
                    times.push(t0.elapsed().as_secs_f64());
                }
            }
            Ok(())
        };
        let outcome = run();
        model.zero_grad();
        let (peak, total) = peak_gib(&device)?;
        let entry = match outcome {
            Ok(()) => {
                let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
                let tps = tokens as f64 / mean;
                json!({
                    "ok": true,
                    "step_s": times,
                    "tokens_per_s": tps,
                    "mfu": tps * flops / (a.peak_tflops * 1e12),
                    "peak_memory_gib": peak,
                    "device_memory_gib": total,
                })
            }
            Err(e) => json!({
                "ok": false,
                "error": format!("{e:#}"),
                "peak_memory_gib": peak,
                "device_memory_gib": total,
            }),
        };
        let key = match mode {
            Mode::Full => "full_graph",
            Mode::Recompute => "gradient_checkpointing",
        };
        modes.insert(key, entry);
    }
    Ok(json!({
        "device": a.device,
        "shape": format!("{:?}", a.shape),
        "params": params,
        "dtype": a.dtype,
        "sequences": a.seqs,
        "seq_len": a.seq_len,
        "prompt_len": a.prompt_len,
        "tokens_per_step": tokens,
        "optimizer_step_included": a.optimizer,
        "warmup_steps": a.warmup,
        "init_s": init_s,
        "flops_per_token": flops,
        "flops_formula": "6 x (non-embedding weights + lm_head) + 12 x layers x heads x head_dim x seq_len",
        "peak_tflops": a.peak_tflops,
        "modes": modes,
    }))
}
