//! `rlreplay replay`.

use std::process::ExitCode;

/// Arguments of `rlreplay replay`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `rlreplay replay`.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`rlreplay replay` is not available in this build yet")
}
