//! `rlreplay audit`: the logged columns per step, and with `--policy` the off-policy statistics
//! of a policy against the logged behaviour.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rlreplay_data::{AuditStats, AuditSums, Dataset, ReadOptions, StepRange};
use serde::Serialize;

use super::eos::EosArgs;

/// Arguments of `rlreplay audit`.
#[derive(clap::Args)]
pub struct Args {
    /// Dataset: a directory (DIR/data/step-NNNN.parquet or *.parquet), a file, a glob, or
    /// hf://datasets/OWNER/NAME.
    pub path: String,
    /// Steps to audit, inclusive: A..B, A.., ..B or A.
    #[arg(long, default_value = "..")]
    pub steps: StepRange,
    /// One JSON object per step on stdout, then one with "summary": true.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub eos: EosArgs,
    /// Tokenizer or model (tokenizer.json, its directory, or hf://OWNER/NAME) whose directory
    /// names the end-of-sequence ids.
    #[arg(long)]
    pub tokenizer: Option<String>,
    /// Skip bad rows instead of stopping at the first problem.
    #[arg(long, conflicts_with = "policy")]
    pub lenient: bool,
    #[command(flatten)]
    pub policy: policy::PolicyArgs,
}

#[derive(Serialize)]
struct StepLine<'a> {
    step: i64,
    file: &'a str,
    #[serde(flatten)]
    stats: AuditStats,
    rows_skipped: usize,
}

#[derive(Serialize)]
struct SummaryLine {
    summary: bool,
    steps: usize,
    #[serde(flatten)]
    stats: AuditStats,
    rows_skipped: usize,
}

/// A progress bar on stderr, drawn only when stderr is a terminal.
pub(crate) fn progress(len: usize, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len as u64);
    if std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::stderr());
        if let Ok(style) =
            ProgressStyle::with_template("{msg} [{elapsed_precise}] {wide_bar} {pos}/{len} ({eta})")
        {
            bar.set_style(style);
        }
        bar.set_message(what.to_owned());
    } else {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar
}

mod policy;

fn table_row(label: &str, s: &AuditStats) -> String {
    format!(
        "{label:>8} {:>6} {:>6} {:>5.1} {:>6.3} {:>6.3} {:>6.3} {:>7.1} {:>8.1} {:>6} {:>6} {:>8.4}",
        s.rows,
        s.groups,
        s.group_size,
        s.score_mean,
        s.solve_none,
        s.solve_all,
        s.prompt_len_mean,
        s.resp_len_mean,
        s.resp_len_max,
        s.truncated.map_or_else(|| "?".into(), |t| format!("{t:.4}")),
        s.logprob_mean
    )
}

/// Runs `rlreplay audit`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.policy.policy.is_some() {
        return policy::run(args);
    }
    let ds = Dataset::open_steps(&args.path, args.steps)?;
    let eos = args
        .eos
        .resolve(args.tokenizer.as_deref(), Some(&ds), None)?;
    let eos_ids = eos.as_ref().map(|e| e.ids.as_slice());
    let opts = ReadOptions {
        lenient: args.lenient,
        eos: eos_ids.unwrap_or_default().to_vec(),
        vocab: None,
        max_positions: None,
    };
    let shards = ds.steps();
    let bar = progress(shards.len(), "audit");
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if !args.json {
        writeln!(
            out,
            "{:>8} {:>6} {:>6} {:>5} {:>6} {:>6} {:>6} {:>7} {:>8} {:>6} {:>6} {:>8}",
            "step",
            "rows",
            "groups",
            "size",
            "score",
            "none",
            "all",
            "prompt",
            "resp",
            "max",
            "trunc",
            "logprob"
        )?;
    }
    let mut total = AuditSums::default();
    let mut skipped = 0;
    let mut steps = ds.iter(StepRange::ALL, opts);
    while let Some(item) = steps.next() {
        let (batch, report) = item?;
        let sums = AuditSums::of_batch(&batch, eos_ids);
        total.merge(&sums);
        skipped += report.rows_skipped;
        let stats = sums.stats();
        bar.suspend(|| -> anyhow::Result<()> {
            if args.json {
                let file = batch.source.to_string_lossy();
                serde_json::to_writer(
                    &mut out,
                    &StepLine {
                        step: batch.step,
                        file: &file,
                        stats,
                        rows_skipped: report.rows_skipped,
                    },
                )?;
                writeln!(out)?;
            } else {
                writeln!(out, "{}", table_row(&batch.step.to_string(), &stats))?;
            }
            if report.rows_skipped > 0 {
                eprintln!(
                    "step {}: skipped {} bad row(s)",
                    batch.step, report.rows_skipped
                );
            }
            Ok(())
        })?;
        bar.inc(1);
        steps.recycle(batch);
    }
    bar.finish_and_clear();
    let stats = total.stats();
    if args.json {
        serde_json::to_writer(
            &mut out,
            &SummaryLine {
                summary: true,
                steps: total.steps,
                stats,
                rows_skipped: skipped,
            },
        )?;
        writeln!(out)?;
    } else {
        writeln!(out, "{}", table_row("all", &stats))?;
        match &eos {
            Some(eos) => writeln!(out, "{eos}")?,
            None => writeln!(out, "{}", super::eos::UNKNOWN)?,
        }
    }
    Ok(ExitCode::SUCCESS)
}
