//! `rlreplay show`.

use std::process::ExitCode;

/// Arguments of `rlreplay show`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `rlreplay show`.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`rlreplay show` is not available in this build yet")
}
