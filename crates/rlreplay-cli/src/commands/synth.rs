//! `rlreplay synth`.

use std::process::ExitCode;

/// Arguments of `rlreplay synth`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `rlreplay synth`.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`rlreplay synth` is not available in this build yet")
}
