//! `rlreplay compute`.

use std::process::ExitCode;

/// Arguments of `rlreplay compute`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `rlreplay compute`.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`rlreplay compute` is not available in this build yet")
}
