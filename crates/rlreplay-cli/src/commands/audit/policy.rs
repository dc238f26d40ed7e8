//! `rlreplay audit --policy`: the policy's log-probs of every logged response, step after step,
//! and the off-policy statistics of `rlreplay_audit` against the logged behaviour log-probs.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use rlreplay_algo::{AlgoConfig, IsLevel, IsMode, Metrics, RsThreshold};
use rlreplay_audit::stats::{threshold_label, AuditConfig, CORRECTIONS};
use rlreplay_audit::{Outputs, PolicyAudit};
use rlreplay_data::{
    read_footer, AuditStats, AuditSums, Dataset, ReadOptions, RolloutBatch, StepIter,
};
use rlreplay_dist::{describe, Collective, DataParallel, Options, Placement, ERROR_CODE};
use rlreplay_model::{with_threads, DType, Device, ModelConfig, SeqPair};
use serde::Serialize;

use super::{progress, Args};

/// The options of `rlreplay audit` that need `--policy`.
#[derive(clap::Args)]
pub struct PolicyArgs {
    /// Audit the logged behaviour against this policy (a Hugging Face Qwen3, Qwen2 or Llama directory): its
    /// log-probs of every logged response, importance weights, ESS, KL and what each rollout
    /// correction would do, per step and over the range.
    #[arg(long, value_name = "MODEL")]
    pub policy: Option<PathBuf>,
    /// A PEFT LoRA adapter directory applied to the policy.
    #[arg(long, value_name = "DIR", requires = "policy")]
    pub adapter: Option<PathBuf>,
    /// Temperature of the policy's log-probs [default: the temperature logged with the rows,
    /// else 1].
    #[arg(long, requires = "policy")]
    pub temperature: Option<f64>,
    /// Directory of the plots (log-ratio histograms, ESS and KL per step, truncated fractions
    /// per threshold), PNG and SVG.
    #[arg(long, value_name = "DIR", requires = "policy")]
    pub out: Option<PathBuf>,
    /// Per-row Parquet table (uid, step, row, log-ratios, weights, flags) to join with the
    /// dataset.
    #[arg(long, value_name = "FILE.parquet", requires = "policy")]
    pub rows_out: Option<PathBuf>,
    /// IS level of the verl `rollout_corr/*` metrics: token, sequence or geometric.
    #[arg(long, default_value = "token", requires = "policy")]
    pub rollout_is: String,
    /// IS thresholds C to study (repeat or separate by commas); the first one is the verl
    /// metrics' `rollout_is_threshold`.
    #[arg(
        long = "rollout-is-threshold",
        visible_alias = "is-threshold",
        value_delimiter = ',',
        default_value = "2.0",
        requires = "policy"
    )]
    pub thresholds: Vec<f64>,
    /// Lower IS bound [default: 1/C for each threshold C].
    #[arg(long, requires = "policy")]
    pub rollout_is_threshold_lower: Option<f64>,
    /// What the verl metrics' IS does outside the bounds: truncate or mask.
    #[arg(long, default_value = "truncate", requires = "policy")]
    pub rollout_is_mode: String,
    /// Normalise the verl metrics' IS weights by their batch mean.
    #[arg(long, requires = "policy")]
    pub rollout_is_batch_normalize: bool,
    /// Rejection-sampling options, comma separated (token_k1, seq_mean_k3, ...).
    #[arg(long, requires = "policy")]
    pub rollout_rs: Option<String>,
    /// Rejection-sampling thresholds: one number, or "u" / "lower_upper" entries separated by
    /// commas.
    #[arg(long, requires = "policy")]
    pub rollout_rs_threshold: Option<String>,
    /// A row succeeded when its score is at least this.
    #[arg(long, default_value_t = 0.5, requires = "policy")]
    pub success_reward_threshold: f64,
    /// Most tokens packed into one forward pass.
    #[arg(long, default_value_t = 8192, requires = "policy")]
    pub max_batch_tokens: usize,
    /// Compute dtype: f32, bf16 or f64.
    #[arg(long, default_value = "f32", requires = "policy")]
    pub dtype: String,
    /// Device: auto (CUDA 0 when built with CUDA and present, else the CPU), cpu, or cuda:N.
    #[arg(long, default_value = "auto", requires = "policy")]
    pub device: String,
    /// Worker threads; 0 uses every core.
    #[arg(long, default_value_t = 0, requires = "policy")]
    pub threads: usize,
    /// Start --threads worker threads even when the machine has fewer cores (else capped to
    /// them, with a warning).
    #[arg(long, requires = "policy")]
    pub force_threads: bool,
}

impl PolicyArgs {
    /// The audit settings; invalid values are errors naming the option.
    fn config(&self) -> Result<AuditConfig> {
        let level = IsLevel::from_name(&self.rollout_is).context("--rollout-is")?;
        let mode = IsMode::from_name(&self.rollout_is_mode).context("--rollout-is-mode")?;
        let Some(&first) = self.thresholds.first() else {
            bail!("--rollout-is-threshold needs at least one value");
        };
        let rs_threshold = self.rollout_rs_threshold.as_ref().map(|t| {
            t.trim()
                .parse::<f64>()
                .map_or_else(|_| RsThreshold::Text(t.clone()), RsThreshold::Number)
        });
        let cfg = AuditConfig {
            correction: AlgoConfig {
                rollout_is: Some(level),
                rollout_is_threshold: first,
                rollout_is_threshold_lower: self.rollout_is_threshold_lower,
                rollout_is_mode: mode,
                rollout_is_batch_normalize: self.rollout_is_batch_normalize,
                rollout_rs: self.rollout_rs.clone(),
                rollout_rs_threshold: rs_threshold,
                success_reward_threshold: self.success_reward_threshold,
                ..AlgoConfig::default()
            },
            thresholds: self.thresholds.clone(),
        };
        cfg.validate().context("audit settings")?;
        Ok(cfg)
    }

    fn dtype(&self) -> Result<DType> {
        Ok(match self.dtype.as_str() {
            "f32" => DType::F32,
            "bf16" => DType::BF16,
            "f64" => DType::F64,
            other => bail!("--dtype {other:?} is not one of f32, bf16, f64"),
        })
    }

    fn device(&self) -> Result<Device> {
        let d = self.device.as_str();
        Ok(match d {
            "auto" => Device::cuda_if_available(0)?,
            "cpu" => Device::Cpu,
            _ => match d.strip_prefix("cuda").map(|n| n.trim_start_matches(':')) {
                Some("") => Device::new_cuda(0).context("--device cuda")?,
                Some(n) => {
                    let n: usize = n
                        .parse()
                        .with_context(|| format!("--device {d:?}: not cuda:N"))?;
                    Device::new_cuda(n).with_context(|| format!("--device {d}"))?
                }
                None => bail!("--device {d:?} is not one of auto, cpu, cuda, cuda:N"),
            },
        })
    }
}

/// Checks a temperature: positive and finite.
fn check_temperature(t: f64, what: &str) -> Result<()> {
    if t == 0.0 {
        bail!(
            "{what} is 0: greedy decoding has no log-probs to compare; give the sampling \
             temperature of the rollouts"
        );
    }
    if !(t.is_finite() && t > 0.0) {
        bail!("{what} must be positive and finite, got {t}");
    }
    Ok(())
}

/// The temperature the rows of a batch were sampled at, when they all logged the same one.
fn logged_temperature(batch: &RolloutBatch) -> Result<Option<f64>> {
    let mut seen: Option<f32> = None;
    for (i, t) in batch.temperature.iter().enumerate() {
        match (t, seen) {
            (None, _) => return Ok(None),
            (Some(t), None) => seen = Some(*t),
            (Some(t), Some(s)) if *t != s => bail!(
                "{}: rows were sampled at several temperatures ({s} and, at row {i}, {t}); \
                 pass --temperature",
                batch.source.display()
            ),
            _ => {}
        }
    }
    // The f32 column holds a decimal setting (0.7): its shortest decimal form is the one meant.
    Ok(seen.map(|t| t.to_string().parse().unwrap_or(f64::from(t))))
}

/// Checks every selected shard's footer before any compute: the behaviour log-prob column is
/// there, and the token ids (from the column statistics) fit the policy's vocabulary.
fn check_shards(ds: &Dataset, cfg: &ModelConfig, policy: &Path) -> Result<()> {
    for (_, path) in ds.steps() {
        let footer = read_footer(&path).with_context(|| {
            "audit --policy compares the policy with the behaviour log-probs logged with every \
             response token"
        })?;
        if let Some((col, id)) = footer.max_token_id {
            if id >= cfg.vocab_size as i64 {
                bail!(
                    "{}: column `{col}` holds token id {id}, outside the vocabulary of the policy \
                     {} (vocab_size = {})",
                    path.display(),
                    policy.display(),
                    cfg.vocab_size
                );
            }
        }
    }
    Ok(())
}

/// Checks a batch's sequence lengths against the policy's positions; the error names the row.
fn check_lengths(batch: &RolloutBatch, cfg: &ModelConfig) -> Result<()> {
    for i in 0..batch.len() {
        let total = batch.prompt(i).len() + batch.response(i).len();
        if total > cfg.max_position_embeddings {
            bail!(
                "{}: row {i}: {total} prompt + response tokens exceed the policy's \
                 max_position_embeddings = {}",
                batch.source.display(),
                cfg.max_position_embeddings
            );
        }
    }
    Ok(())
}

#[derive(Serialize)]
struct StepLine<'a> {
    step: i64,
    file: &'a str,
    temperature: f64,
    #[serde(flatten)]
    stats: AuditStats,
    #[serde(flatten)]
    metrics: &'a Metrics,
}

#[derive(Serialize)]
struct SummaryLine<'a> {
    summary: bool,
    steps: usize,
    temperature: f64,
    #[serde(flatten)]
    stats: AuditStats,
    #[serde(flatten)]
    metrics: &'a Metrics,
}

/// Runs `rlreplay audit --policy`, as one rank of a data-parallel job when a launcher (`mpirun`,
/// `mpiexec`, `srun`) started this process.
pub fn run(args: Args) -> Result<ExitCode> {
    let p = &args.policy;
    let policy = p.policy.clone().context("--policy is required")?;
    let result = with_threads(p.threads, p.force_threads, || on_ranks(&args, &policy));
    match result {
        Err(e) if e.is::<Reported>() => Ok(ExitCode::from(2)),
        r => r,
    }
}

/// An error rank 0 has already printed for every rank (see [`agree`]).
#[derive(Debug)]
struct Reported;

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("reported by rank 0")
    }
}

impl std::error::Error for Reported {}

/// The audit on this process's rank: one process unless a launcher started it, else MPI ranks
/// (a build without MPI started as one of several ranks stops with an error rank 0 prints,
/// never N processes writing one output). An error on one rank after the input was accepted
/// everywhere is printed with its rank and ends the job.
fn on_ranks(args: &Args, policy: &Path) -> Result<ExitCode> {
    let comm = rlreplay_dist::init(&Options::default()).map_err(|e| {
        // Every rank of a launch this build cannot serve fails alike: rank 0 says why.
        match Placement::from_env() {
            Ok(p) if p.rank > 0 => anyhow::Error::new(Reported),
            _ => anyhow::Error::new(e).context("audit --policy on data-parallel ranks"),
        }
    })?;
    match audit(args, policy, &*comm) {
        Err(e) if comm.world() > 1 && !e.is::<Reported>() => {
            eprintln!("rank {}: error: {e:#}", comm.rank());
            comm.abort(ERROR_CODE)
        }
        r => r,
    }
}

/// The outcome on every rank of work that every rank does alike before a compute (reading and
/// checking the input, loading the policy): when any rank failed, rank 0 prints the error once
/// (its own, else the first failing rank's) and every rank stops with exit code 2, so no rank
/// starts what another refused.
fn agree<T>(comm: &dyn Collective, r: Result<T>) -> Result<T> {
    if comm.world() == 1 {
        return r;
    }
    let mine = match &r {
        Ok(_) => Vec::new(),
        Err(e) => [&[1u8][..], format!("{e:#}").as_bytes()].concat(),
    };
    let all = comm.all_gather_bytes(&mine)?;
    let Some((rank, msg)) = all.iter().enumerate().find(|(_, m)| !m.is_empty()) else {
        return r;
    };
    if comm.is_root() {
        let msg = String::from_utf8_lossy(&msg[1..]);
        if rank == 0 {
            eprintln!("error: {msg}");
        } else {
            eprintln!("error: rank {rank}: {msg}");
        }
    }
    // The others exit once rank 0 has said why.
    comm.barrier()?;
    Err(Reported.into())
}

/// The settings and the dataset, every input check that needs no step read.
struct Checked {
    cfg: AuditConfig,
    dtype: DType,
    device: Device,
    model_cfg: ModelConfig,
    eos: Vec<u32>,
    ds: Dataset,
}

fn check(args: &Args, policy: &Path, comm: &dyn Collective) -> Result<Checked> {
    let p = &args.policy;
    if let Some(t) = p.temperature {
        check_temperature(t, "--temperature")?;
    }
    if p.max_batch_tokens == 0 {
        bail!("--max-batch-tokens must be at least 1");
    }
    let cfg = p.config()?;
    let dtype = p.dtype()?;
    let mut device = p.device()?;
    // A bare `auto` or `cuda` on several ranks is the GPU of the local rank.
    if comm.world() > 1 && device.is_cuda() && matches!(p.device.as_str(), "auto" | "cuda") {
        let ordinal = comm.placement().visible_device_ordinal()?;
        device = Device::new_cuda(ordinal).with_context(|| format!("--device cuda:{ordinal}"))?;
    }
    let model_cfg = ModelConfig::from_hf_json(policy.join("config.json"))
        .with_context(|| format!("reading the policy {}", policy.display()))?;
    let ds = Dataset::open_steps(&args.path, args.steps)?;
    let eos = args
        .eos
        .resolve(args.tokenizer.as_deref(), Some(&ds), Some(policy))?
        .with_context(|| {
            format!(
                "no end-of-sequence id: the dataset and the policy {} name none; pass --eos \
                 ID[,ID...] or --tokenizer",
                policy.display()
            )
        })?
        .ids;
    check_shards(&ds, &model_cfg, policy)?;
    Ok(Checked {
        cfg,
        dtype,
        device,
        model_cfg,
        eos,
        ds,
    })
}

/// The first step and the temperature of the policy's log-probs.
fn first_step(
    args: &Args,
    steps: &mut StepIter<'_>,
    model_cfg: &ModelConfig,
    root: bool,
) -> Result<(RolloutBatch, f64)> {
    let p = &args.policy;
    let Some(first) = steps.next() else {
        bail!("{}: no step selected", args.path);
    };
    let (first, _) = first?;
    let logged = logged_temperature(&first)?;
    let temperature = match (p.temperature, logged) {
        (Some(t), Some(l)) if (t - l).abs() > 1e-6 => {
            if root {
                eprintln!(
                    "warning: the rows were sampled at temperature {l}; the policy's log-probs \
                     are computed at --temperature {t}"
                );
            }
            t
        }
        (Some(t), _) => t,
        (None, Some(l)) => {
            check_temperature(l, "the logged temperature")?;
            l
        }
        (None, None) => 1.0,
    };
    check_lengths(&first, model_cfg)?;
    Ok((first, temperature))
}

/// The next step, its lengths checked; `None` after the last.
fn next_step(steps: &mut StepIter<'_>, model_cfg: &ModelConfig) -> Result<Option<RolloutBatch>> {
    let Some(item) = steps.next() else {
        return Ok(None);
    };
    let (batch, _) = item?;
    check_lengths(&batch, model_cfg)?;
    Ok(Some(batch))
}

/// The audit on `comm`'s ranks. Every rank reads and checks each step; the policy's log-probs of
/// a step are computed as one process packs them, the packs shared out over the ranks
/// ([`DataParallel::logprobs`]) and gathered in row order; rank 0 alone computes the
/// statistics from them, prints and writes, so every number is the single-process one.
fn audit(args: &Args, policy: &Path, comm: &dyn Collective) -> Result<ExitCode> {
    let p = &args.policy;
    let root = comm.is_root();
    // Everything that can be wrong with the input is found, on every rank, before the model is
    // loaded.
    let c = agree(comm, check(args, policy, comm))?;
    let (cfg, model_cfg, eos) = (&c.cfg, &c.model_cfg, &c.eos);
    let opts = ReadOptions {
        lenient: false,
        eos: eos.clone(),
        vocab: u32::try_from(model_cfg.vocab_size).ok(),
        max_positions: Some(model_cfg.max_position_embeddings),
    };
    let mut steps = c.ds.iter(rlreplay_data::StepRange::ALL, opts);
    let (first, temperature) = agree(comm, first_step(args, &mut steps, model_cfg, root))?;
    let outputs = Outputs {
        rows: p.rows_out.clone(),
        plots: p.out.clone(),
    };
    let (mut audit, model) = agree(
        comm,
        (|| -> Result<_> {
            let audit = root
                .then(|| PolicyAudit::new(cfg.clone(), eos.clone(), &outputs))
                .transpose()?;
            let model = super::super::load_model(policy, p.adapter.as_deref(), c.dtype, &c.device)
                .with_context(|| format!("loading the policy {}", policy.display()))?;
            Ok((audit, model))
        })(),
    )?;
    let dp = DataParallel::new(comm);

    let bar = if root {
        progress(c.ds.steps().len(), "audit --policy")
    } else {
        ProgressBar::hidden()
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if root && !args.json {
        writeln!(out, "{}", step_header(cfg))?;
    }
    let started = Instant::now();
    let mut tokens = 0usize;
    let mut logged_sums = AuditSums::default();
    let mut next = Some(first);
    loop {
        let batch = match next.take() {
            Some(b) => b,
            None => match agree(comm, next_step(&mut steps, model_cfg))? {
                Some(b) => b,
                None => break,
            },
        };
        let pairs: Vec<SeqPair<'_>> = (0..batch.len())
            .map(|i| SeqPair::new(batch.prompt(i), batch.response(i)))
            .collect();
        let lp = dp
            .logprobs(&model, &pairs, p.max_batch_tokens, temperature)
            .with_context(|| format!("{}: policy log-probs", batch.source.display()))?;
        drop(pairs);
        tokens += batch.response_tokens.len();
        if let Some(audit) = &mut audit {
            let step = audit
                .add(&batch, &lp)
                .with_context(|| batch.source.display().to_string())?;
            let sums = AuditSums::of_batch(&batch, Some(eos));
            logged_sums.merge(&sums);
            bar.suspend(|| -> Result<()> {
                if args.json {
                    let file = batch.source.to_string_lossy();
                    serde_json::to_writer(
                        &mut out,
                        &StepLine {
                            step: batch.step,
                            file: &file,
                            temperature,
                            stats: sums.stats(),
                            metrics: &step.metrics,
                        },
                    )?;
                    writeln!(out)?;
                } else {
                    writeln!(
                        out,
                        "{}",
                        step_row(&batch.step.to_string(), &step.metrics, cfg)
                    )?;
                }
                Ok(())
            })?;
        }
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        bar.set_message(format!("{:.0} response tokens/s", tokens as f64 / secs));
        bar.inc(1);
        steps.recycle(batch);
    }
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    let Some(audit) = audit else {
        return Ok(ExitCode::SUCCESS);
    };
    let summary = audit.finish()?;
    if args.json {
        serde_json::to_writer(
            &mut out,
            &SummaryLine {
                summary: true,
                steps: logged_sums.steps,
                temperature,
                stats: logged_sums.stats(),
                metrics: &summary,
            },
        )?;
        writeln!(out)?;
    } else {
        writeln!(out, "{}", step_row("all", &summary, cfg))?;
        writeln!(out)?;
        write_tables(&mut out, &summary, cfg, temperature)?;
    }
    eprintln!(
        "audited {} steps, {} rows, {tokens} response tokens in {secs:.1} s ({:.0} tokens/s) \
         at temperature {temperature}{}",
        logged_sums.steps,
        logged_sums.rows,
        tokens as f64 / secs.max(1e-9),
        describe(comm)
    );
    Ok(ExitCode::SUCCESS)
}

fn get(m: &Metrics, k: &str) -> f64 {
    m.get(k).copied().unwrap_or(f64::NAN)
}

fn step_header(cfg: &AuditConfig) -> String {
    let c = threshold_label(cfg.thresholds[0]);
    format!(
        "{:>8} {:>6} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>9} {:>9}",
        "step",
        "rows",
        "tokens",
        "lr_mean",
        "lr_p01",
        "lr_p99",
        "kl_k1",
        "kl_k3",
        "ess_tok",
        "ess_seq",
        format!("tis{c}_tok"),
        format!("tis{c}_seq"),
    )
}

fn step_row(label: &str, m: &Metrics, cfg: &AuditConfig) -> String {
    let c = threshold_label(cfg.thresholds[0]);
    format!(
        "{label:>8} {:>6} {:>8} {:>9.5} {:>9.5} {:>9.5} {:>9.5} {:>9.5} {:>7.4} {:>7.4} {:>9.5} {:>9.5}",
        get(m, "audit/rows"),
        get(m, "audit/tokens"),
        get(m, "audit/log_ratio/token/mean"),
        get(m, "audit/log_ratio/token/p01"),
        get(m, "audit/log_ratio/token/p99"),
        get(m, "audit/kl/k1"),
        get(m, "audit/kl/k3"),
        get(m, "audit/ess/token/batch"),
        get(m, "audit/ess/seq/batch"),
        get(m, &format!("audit/is_{c}/token_truncate/tokens")),
        get(m, &format!("audit/is_{c}/seq_truncate/seqs")),
    )
}

const SPLITS: [(&str, &str); 5] = [
    ("all", "audit/"),
    ("success", "audit/success/"),
    ("failure", "audit/failure/"),
    ("truncated", "audit/truncated/"),
    ("complete", "audit/complete/"),
];

/// The range's tables: the statistics per split, and what each correction changes per split.
fn write_tables(
    out: &mut impl Write,
    m: &Metrics,
    cfg: &AuditConfig,
    temperature: f64,
) -> Result<()> {
    writeln!(out, "range, by split (temperature {temperature}):")?;
    writeln!(
        out,
        "{:>10} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "split", "rows", "tokens", "lr_mean", "lr_std", "seq_lr", "kl_k1", "kl_k3"
    )?;
    for (name, pre) in SPLITS {
        writeln!(
            out,
            "{name:>10} {:>7} {:>9} {:>9.5} {:>9.5} {:>9.4} {:>9.5} {:>9.5}",
            get(m, &format!("{pre}rows")),
            get(m, &format!("{pre}tokens")),
            get(m, &format!("{pre}log_ratio/token/mean")),
            get(m, &format!("{pre}log_ratio/token/std")),
            get(m, &format!("{pre}log_ratio/seq/mean")),
            get(m, &format!("{pre}kl/k1")),
            get(m, &format!("{pre}kl/k3")),
        )?;
    }
    writeln!(
        out,
        "ess: token {:.4}, sequence {:.4} (group mean {:.4}, min {:.4}), geometric {:.4}; \
         corr(seq log-ratio, score) {:.4}, within groups {:.4}",
        get(m, "audit/ess/token/batch"),
        get(m, "audit/ess/seq/batch"),
        get(m, "audit/ess/seq/group_mean"),
        get(m, "audit/ess/seq/group_min"),
        get(m, "audit/ess/geo/batch"),
        get(m, "audit/corr/seq_log_ratio_score"),
        get(m, "audit/corr/seq_log_ratio_score_in_group"),
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "what each correction would change over the range (fraction of tokens; of sequences per split):"
    )?;
    writeln!(
        out,
        "{:>16} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "correction", "C", "tokens", "seqs", "success", "failure", "truncated", "complete"
    )?;
    let mut lines: Vec<(String, String, String)> = Vec::new();
    for &c in &cfg.thresholds {
        let l = threshold_label(c);
        for corr in CORRECTIONS {
            lines.push((corr.into(), l.clone(), format!("is_{l}/{corr}")));
        }
    }
    if cfg
        .correction
        .rejection_options()
        .is_ok_and(|o| !o.is_empty())
    {
        lines.push(("rejection".into(), "-".into(), "rs".into()));
    }
    for (name, c, key) in lines {
        write!(
            out,
            "{name:>16} {c:>7} {:>9.5} {:>9.5}",
            get(m, &format!("audit/{key}/tokens")),
            get(m, &format!("audit/{key}/seqs"))
        )?;
        for (_, pre) in &SPLITS[1..] {
            write!(out, " {:>9.5}", get(m, &format!("{pre}{key}/seqs")))?;
        }
        writeln!(out)?;
    }
    Ok(())
}
