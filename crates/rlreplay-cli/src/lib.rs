//! `rlreplay`: read, audit, replay and train on logged LLM rollouts. The command line as a
//! library: the binary (`main.rs`) and the Python package's `rlreplay` command run the same
//! [`run`].

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod commands;

/// Reinforcement-learning post-training of LLM reasoners on logged rollouts.
#[derive(Parser)]
#[command(name = "rlreplay", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Per-step statistics of a rollout dataset.
    Audit(commands::audit::Args),
    /// Check a rollout dataset; exit 1 with a report when it has problems.
    Validate(commands::validate::Args),
    /// Show one rollout row, decoded when a tokenizer is given.
    Show(commands::show::Args),
    /// Write a synthetic rollout dataset in the seed layout.
    Synth(commands::synth::Args),
    /// Advantages, loss, per-token gradients and metrics of one batch given as JSON.
    Compute(commands::compute::Args),
    /// Per-token log-probs of responses under a model (Qwen3, Qwen2, Llama).
    Logprobs(commands::logprobs::Args),
    /// Train a policy on a rollout dataset (exact replay or an off-policy schedule).
    Replay(commands::replay::Args),
    /// Grade predicted answers against gold answers with the math verifier.
    Verify(commands::verify::Args),
    /// Sample completions of a prompt set into a rollout shard.
    Generate(commands::generate::Args),
    /// mean@k, pass@k and maj@k of a policy on a validation set.
    Eval(commands::eval::Args),
    /// Write a benchmark set (GSM8K, MATH, MMLU, ...) as a verl Parquet prompt set.
    Prepare(commands::prepare::Args),
    /// Online RL: generate, score and update a policy (GRPO, RLSD_TR, ...) on a prompt set.
    Train(commands::train::Args),
    /// Write a run directory as a model card: best and last policies, results, artifacts, README.
    Export(commands::export::Args),
    /// Serve a policy over HTTP (vLLM completions and SGLang generate protocols).
    Serve(commands::serve::Args),
    /// Convert a llama.cpp GGUF file (Llama, Qwen2, Qwen3) into a Hugging Face model directory.
    Convert(commands::convert::Args),
    /// Measurements of scripts/gpu-check.sh (golden log-probs, one step's gradient, throughput).
    #[command(hide = true)]
    DeviceCheck(commands::device_check::Args),
}

impl Cli {
    /// Whether the command trains a policy (`replay`, `train`): the binary then keeps freed memory
    /// committed (see `keep_freed_memory_committed` in `main.rs`).
    pub fn trains(&self) -> bool {
        matches!(self.command, Command::Replay(_) | Command::Train(_))
    }
}

/// Runs a parsed command line; an error is printed to stderr as `error: ...` and exits 2.
pub fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Audit(a) => commands::audit::run(a),
        Command::Validate(a) => commands::validate::run(a),
        Command::Show(a) => commands::show::run(a),
        Command::Synth(a) => commands::synth::run(a),
        Command::Compute(a) => commands::compute::run(a),
        Command::Logprobs(a) => commands::logprobs::run(a),
        Command::Replay(a) => commands::replay::run(a),
        Command::Verify(a) => commands::verify::run(a),
        Command::Generate(a) => commands::generate::run(a),
        Command::Eval(a) => commands::eval::run(a),
        Command::Prepare(a) => commands::prepare::run(a),
        Command::Train(a) => commands::train::run(a),
        Command::Export(a) => commands::export::run(a),
        Command::Serve(a) => commands::serve::run(a),
        Command::Convert(a) => commands::convert::run(a),
        Command::DeviceCheck(a) => commands::device_check::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Parses `args` (the program name first) and runs the command, as the binary does: help and
/// version go to stdout with exit code 0, a usage error to stderr with exit code 2, both flushed.
pub fn run_args<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    match Cli::try_parse_from(args) {
        Ok(cli) => run(cli),
        Err(e) => {
            // As clap's `Error::exit`, without leaving the process: a closed pipe is ignored.
            let _ = e.print();
            flush();
            ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
        }
    }
}

/// Flushes stdout and stderr (what `std::process::exit` would, for a caller that carries on).
pub fn flush() {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
}

/// The numeric value of an exit code (an [`ExitCode`] does not expose it).
pub fn exit_code_value(code: ExitCode) -> i32 {
    (0..=u8::MAX)
        .find(|&c| ExitCode::from(c) == code)
        .map_or(1, i32::from)
}
