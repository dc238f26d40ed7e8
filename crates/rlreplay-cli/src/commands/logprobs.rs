//! `rlreplay logprobs`.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use rlreplay_model::{parse_device, DType, Model, SeqPair};
use serde::Deserialize;

/// Arguments of `rlreplay logprobs`.
#[derive(clap::Args)]
pub struct Args {
    /// Hugging Face checkpoint directory (config.json and safetensors; Qwen3, Qwen2 or Llama).
    #[arg(long)]
    model: PathBuf,
    /// A PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) applied to
    /// the model.
    #[arg(long, value_name = "DIR")]
    adapter: Option<PathBuf>,
    /// JSONL input, one `{"prompt_token_ids": [...], "response_token_ids": [...]}` per line.
    #[arg(long)]
    input: PathBuf,
    /// JSONL output, one `{"logprobs": [...]}` per input line (default: standard output).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Sampling temperature the logits are divided by.
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    /// Also write the entropy of the next-token distribution at each response token.
    #[arg(long)]
    entropy: bool,
    /// Most tokens packed into one forward pass (a longer single sequence runs alone).
    #[arg(long, default_value_t = 8192)]
    max_batch_tokens: usize,
    /// Compute dtype: f32, bf16 or f64.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Device: cpu, cuda or cuda:N (CUDA needs a binary built with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: String,
}

/// One input line.
#[derive(Deserialize)]
struct Line {
    prompt_token_ids: Vec<u32>,
    response_token_ids: Vec<u32>,
}

/// Runs `rlreplay logprobs`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if !(args.temperature.is_finite() && args.temperature > 0.0) {
        bail!(
            "--temperature must be positive and finite, got {}",
            args.temperature
        );
    }
    if args.max_batch_tokens == 0 {
        bail!("--max-batch-tokens must be at least 1");
    }
    let dtype = match args.dtype.as_str() {
        "f32" => DType::F32,
        "bf16" => DType::BF16,
        "f64" => DType::F64,
        other => bail!("--dtype {other:?} is not one of f32, bf16, f64"),
    };
    let device = parse_device(&args.device).context("--device")?;
    let model = super::load_model(&args.model, args.adapter.as_deref(), dtype, &device)?;
    super::warn_non_finite(&args.model, &model.non_finite_params()?);
    let cfg = model.config();

    let input =
        File::open(&args.input).with_context(|| format!("opening {}", args.input.display()))?;
    let mut out: Box<dyn Write> = match &args.output {
        Some(p) => Box::new(BufWriter::new(
            File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(BufWriter::new(std::io::stdout().lock())),
    };
    let mut batch: Vec<Line> = Vec::new();
    let mut batch_tokens = 0;
    let mut nan = 0usize;
    for (i, line) in BufReader::new(input).lines().enumerate() {
        let where_ = || format!("{} line {}", args.input.display(), i + 1);
        let line = line.with_context(where_)?;
        if line.trim().is_empty() {
            continue;
        }
        let rec: Line = serde_json::from_str(&line).with_context(where_)?;
        for (field, ids) in [
            ("prompt_token_ids", &rec.prompt_token_ids),
            ("response_token_ids", &rec.response_token_ids),
        ] {
            if let Some((j, t)) = ids
                .iter()
                .enumerate()
                .find(|(_, &t)| t as usize >= cfg.vocab_size)
            {
                bail!(
                    "{}: {field}[{j}] = {t} is outside the vocabulary of {}",
                    where_(),
                    cfg.vocab_size
                );
            }
        }
        if rec.prompt_token_ids.is_empty() && !rec.response_token_ids.is_empty() {
            bail!("{}: prompt_token_ids is empty", where_());
        }
        let total = rec.prompt_token_ids.len() + rec.response_token_ids.len();
        if total > cfg.max_position_embeddings {
            bail!(
                "{}: {total} tokens exceed the model's max_position_embeddings = {}",
                where_(),
                cfg.max_position_embeddings
            );
        }
        let fed = SeqPair::new(&rec.prompt_token_ids, &rec.response_token_ids).fed_tokens();
        if !batch.is_empty() && batch_tokens + fed > args.max_batch_tokens {
            flush(&model, &mut batch, &args, &mut out, &mut nan)?;
            batch_tokens = 0;
        }
        batch_tokens += fed;
        batch.push(rec);
    }
    flush(&model, &mut batch, &args, &mut out, &mut nan)?;
    out.flush().context("writing the output")?;
    if nan > 0 {
        eprintln!("warning: {nan} log-prob(s) or entropies are NaN (written as null)");
    }
    Ok(ExitCode::SUCCESS)
}

/// Scores the buffered lines in one packed pass and writes their output lines; counts the NaN
/// values written (as JSON null) in `nan`.
fn flush(
    model: &Model,
    batch: &mut Vec<Line>,
    args: &Args,
    out: &mut dyn Write,
    nan: &mut usize,
) -> anyhow::Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let pairs: Vec<SeqPair<'_>> = batch
        .iter()
        .map(|l| SeqPair::new(&l.prompt_token_ids, &l.response_token_ids))
        .collect();
    let res = model.logprobs(&pairs, args.temperature, args.entropy)?;
    let narrow = model.compute_dtype() != DType::F64;
    // Values are written at the precision they were computed in.
    let values = |v: &[f64]| -> serde_json::Value {
        if narrow {
            v.iter().map(|&x| x as f32).collect::<Vec<f32>>().into()
        } else {
            v.to_vec().into()
        }
    };
    let count = |v: &[Vec<f64>]| v.iter().flatten().filter(|x| x.is_nan()).count();
    *nan += count(&res.logprobs) + res.entropy.as_deref().map_or(0, count);
    for (i, lp) in res.logprobs.iter().enumerate() {
        let mut obj = serde_json::Map::new();
        obj.insert("logprobs".into(), values(lp));
        if let Some(ent) = &res.entropy {
            obj.insert("entropy".into(), values(&ent[i]));
        }
        serde_json::to_writer(&mut *out, &obj).context("writing the output")?;
        out.write_all(b"\n").context("writing the output")?;
    }
    batch.clear();
    Ok(())
}
