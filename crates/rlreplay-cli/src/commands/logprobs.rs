//! `rlreplay logprobs`.

use std::process::ExitCode;

/// Arguments of `rlreplay logprobs`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `rlreplay logprobs`.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`rlreplay logprobs` is not available in this build yet")
}
