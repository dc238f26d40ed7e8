//! `rlreplay eval`: mean@k, pass@k and maj@k of a policy on a validation set.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use rlreplay_eval::dataset::read_prompts;
use rlreplay_eval::metrics::{evaluate, PromptSamples, ResponseShape, DEFAULT_SUCCESS_THRESHOLD};
use rlreplay_eval::pipeline::score_generations;
use rlreplay_eval::report;
use serde_json::json;

use super::generate::SamplingArgs;

/// Arguments of `rlreplay eval`.
#[derive(clap::Args)]
pub struct Args {
    /// Validation set: verl Parquet (`prompt` messages, `data_source`,
    /// `reward_model.ground_truth`) or JSON lines.
    #[arg(long)]
    data: PathBuf,
    /// Samples per prompt.
    #[arg(long, default_value_t = 16)]
    n: usize,
    /// Sampling temperature.
    #[arg(long, default_value_t = 0.6)]
    temperature: f32,
    /// Nucleus-sampling mass.
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Output directory for metrics.json, validation_mean<n>.csv and samples.jsonl.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Trainer step written as the first CSV column.
    #[arg(long)]
    step: Option<i64>,
    /// A sample is correct for pass@k and maj@k when its reward is at least this (the training
    /// configuration's `success_reward_threshold`).
    #[arg(long, default_value_t = DEFAULT_SUCCESS_THRESHOLD)]
    success_reward_threshold: f64,
    #[command(flatten)]
    sampling: SamplingArgs,
}

/// Runs `rlreplay eval`.
pub fn run(args: Args) -> Result<ExitCode> {
    if !args.success_reward_threshold.is_finite() {
        bail!(
            "--success-reward-threshold {}: must be a finite number",
            args.success_reward_threshold
        );
    }
    let items = read_prompts(&args.data)?;
    if let Some(it) = items.iter().find(|it| it.ground_truth.is_none()) {
        bail!(
            "{}: row {} has no ground truth (`reward_model.ground_truth` or `ground_truth`)",
            args.data.display(),
            it.index
        );
    }
    let mut params = args.sampling.params(args.temperature, args.top_p);
    params.validate()?;
    let scorer = args.sampling.scorer()?;
    let sampled = args.sampling.sample(&items, args.n, &mut params, "eval")?;
    let (policy, gens) = (sampled.policy, sampled.gens);
    let samples = score_generations(&policy.chat, &items, gens, Some(&scorer))?;
    let per_prompt: Vec<PromptSamples<_>> = samples
        .chunks(args.n)
        .zip(&items)
        .map(|(chunk, item)| PromptSamples {
            data_source: item.data_source.clone(),
            rewards: chunk.iter().map(|s| s.reward.unwrap_or(0.0)).collect(),
            answers: chunk.iter().map(|s| s.answer.clone()).collect(),
            shapes: chunk
                .iter()
                .map(|s| ResponseShape {
                    tokens: s.generation.tokens.len(),
                    truncated: s.generation.truncated,
                })
                .collect(),
        })
        .collect();
    let groups = evaluate(&per_prompt, args.success_reward_threshold, |a, b| {
        scorer.equivalent(a, b)
    })?;
    let table = report::table(&groups);
    print!("{table}");
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let truncated = samples.iter().filter(|s| s.generation.truncated).count();
        let metrics = json!({
            "data": args.data.display().to_string(),
            "model": args.sampling.model.display().to_string(),
            "n": args.n,
            "sampling": params,
            "prompts": items.len(),
            "truncated": truncated,
            "groups": groups.iter().map(report::group_json).collect::<Vec<_>>(),
        });
        let write = |name: &str, text: &str| -> Result<()> {
            let p = out.join(name);
            std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))
        };
        write("metrics.json", &serde_json::to_string_pretty(&metrics)?)?;
        write(
            &format!("validation_mean{}.csv", args.n),
            &report::mean_csv(&groups, args.step),
        )?;
        write("table.txt", &table)?;
        let p = out.join("samples.jsonl");
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(&p).with_context(|| format!("creating {}", p.display()))?,
        );
        for s in &samples {
            let item = &items[s.generation.prompt];
            let line = json!({
                "index": item.index,
                "data_source": item.data_source,
                "sample": s.generation.sample,
                "response": s.text,
                "response_tokens": s.generation.tokens.len(),
                "truncated": s.generation.truncated,
                "answer": s.answer.as_ref().map(|a| &a.text),
                "reward": s.reward,
                "reward_note": s.reward_note,
            });
            writeln!(f, "{line}").with_context(|| format!("writing {}", p.display()))?;
        }
        f.flush()
            .with_context(|| format!("writing {}", p.display()))?;
        eprintln!(
            "wrote metrics.json, validation_mean{}.csv, table.txt and samples.jsonl to {}",
            args.n,
            out.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
