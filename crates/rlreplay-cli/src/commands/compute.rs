//! `rlreplay compute`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use rlreplay_algo::{
    compute_advantages, mini_batch_loss, rollout_correction, AlgoConfig, MicroBatch,
};
use serde::{Deserialize, Serialize};

/// Arguments of `rlreplay compute`.
#[derive(clap::Args)]
pub struct Args {
    /// Batch JSON: `{"config": {...verl keys...}, "rows": [{"uid", "score", "logprobs", ...}]}`.
    #[arg(long)]
    input: PathBuf,
}

/// One response of the input batch.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Row {
    uid: String,
    score: f64,
    logprobs: Vec<f64>,
    old_logprobs: Option<Vec<f64>>,
    rollout_logprobs: Option<Vec<f64>>,
    teacher_logprobs: Option<Vec<f64>>,
    ref_logprobs: Option<Vec<f64>>,
    sd_active: Option<bool>,
}

/// The input file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    #[serde(default)]
    config: AlgoConfig,
    rows: Vec<Row>,
}

/// The output document.
#[derive(Serialize)]
struct Output {
    advantages: Vec<f64>,
    token_advantages: Vec<Vec<f64>>,
    is_weights: Option<Vec<Vec<f64>>>,
    loss: f64,
    grad_logprobs: Vec<Vec<f64>>,
    metrics: BTreeMap<String, f64>,
}

/// Concatenates an optional per-row field; it must be on every row or on none, unless
/// `default_to_logprobs`, where a row without it takes its own `logprobs`.
fn flat(
    rows: &[Row],
    name: &str,
    get: impl Fn(&Row) -> Option<&Vec<f64>>,
    default_to_logprobs: bool,
) -> anyhow::Result<Option<Vec<f64>>> {
    let present = rows.iter().filter(|r| get(r).is_some()).count();
    if present == 0 {
        return Ok(None);
    }
    let mut out = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        match (get(r), default_to_logprobs) {
            (Some(v), _) => {
                if v.len() != r.logprobs.len() {
                    bail!(
                        "row {i}: `{name}` has {} values, `logprobs` has {}",
                        v.len(),
                        r.logprobs.len()
                    );
                }
                out.extend_from_slice(v);
            }
            (None, true) => out.extend_from_slice(&r.logprobs),
            (None, false) => bail!("row {i}: `{name}` is missing (other rows have it)"),
        }
    }
    Ok(Some(out))
}

/// Splits a flat per-token vector into rows.
fn split(offsets: &[usize], xs: &[f64]) -> Vec<Vec<f64>> {
    offsets
        .windows(2)
        .map(|w| xs[w[0]..w[1]].to_vec())
        .collect()
}

fn compute(input: Input) -> anyhow::Result<Output> {
    let cfg = input.config;
    cfg.validate()?;
    let rows = input.rows;
    let mut offsets = vec![0usize];
    for r in &rows {
        offsets.push(offsets[offsets.len() - 1] + r.logprobs.len());
    }
    let logprobs: Vec<f64> = rows.iter().flat_map(|r| r.logprobs.clone()).collect();
    let old = flat(&rows, "old_logprobs", |r| r.old_logprobs.as_ref(), true)?
        .unwrap_or_else(|| logprobs.clone());
    let rollout = flat(
        &rows,
        "rollout_logprobs",
        |r| r.rollout_logprobs.as_ref(),
        false,
    )?;
    let reference = flat(&rows, "ref_logprobs", |r| r.ref_logprobs.as_ref(), false)?;
    let teacher = flat(
        &rows,
        "teacher_logprobs",
        |r| r.teacher_logprobs.as_ref(),
        true,
    )?;
    let sd_active: Vec<bool> = rows
        .iter()
        .map(|r| r.sd_active.unwrap_or(r.teacher_logprobs.is_some()))
        .collect();
    let correct: Vec<bool> = rows
        .iter()
        .map(|r| r.score >= cfg.success_reward_threshold)
        .collect();
    let uids: Vec<&str> = rows.iter().map(|r| r.uid.as_str()).collect();
    let scores: Vec<f64> = rows.iter().map(|r| r.score).collect();

    let mut metrics = BTreeMap::new();
    let (is_weights, mask) = match &rollout {
        Some(roll) => {
            let behaviour = if cfg.bypass_mode { roll } else { &old };
            let c = rollout_correction(&cfg, &offsets, behaviour, roll, None)?;
            metrics.extend(c.metrics);
            let w = if cfg.bypass_mode { None } else { c.is_weights };
            (w, Some(c.mask))
        }
        None => {
            if cfg.rollout_is.is_some() || cfg.rollout_rs.is_some() || cfg.bypass_mode {
                bail!(
                    "rollout_is, rollout_rs and bypass_mode need `rollout_logprobs` on every row"
                );
            }
            (None, None)
        }
    };
    let adv = compute_advantages(&cfg, &uids, &scores, &offsets, mask.as_deref())?;
    metrics.extend(adv.metrics.clone());

    if cfg.loss_mode.needs_teacher() && teacher.is_none() {
        bail!(
            "loss_mode `{}` needs `teacher_logprobs`",
            cfg.loss_mode.name()
        );
    }
    let out = mini_batch_loss(
        &cfg,
        &MicroBatch {
            first_row: 0,
            offsets: &offsets,
            logprobs: &logprobs,
            old_logprobs: Some(&old),
            rollout_logprobs: rollout.as_deref(),
            token_advantages: &adv.tokens,
            is_weights: is_weights.as_deref(),
            mask: mask.as_deref(),
            teacher_logprobs: teacher.as_deref(),
            sd_active: Some(&sd_active),
            correct: Some(&correct),
            ref_logprobs: reference.as_deref(),
        },
    )?;
    metrics.extend(out.metrics);
    Ok(Output {
        advantages: adv.rows,
        token_advantages: split(&offsets, &adv.tokens),
        is_weights: is_weights.map(|w| split(&offsets, &w)),
        loss: out.loss,
        grad_logprobs: split(&offsets, &out.grad_logprobs),
        metrics,
    })
}

/// Runs `rlreplay compute`: prints the batch's advantages, IS weights, loss, per-token gradients
/// and metrics as JSON.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let path = args.input.display().to_string();
    let text = std::fs::read_to_string(&args.input).with_context(|| format!("reading {path}"))?;
    let input: Input = serde_json::from_str(&text).with_context(|| format!("parsing {path}"))?;
    let out = compute(input).with_context(|| format!("computing {path}"))?;
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(ExitCode::SUCCESS)
}
