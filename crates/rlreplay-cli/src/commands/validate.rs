//! `rlreplay validate`.

use std::process::ExitCode;

/// Arguments of `rlreplay validate`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `rlreplay validate`.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`rlreplay validate` is not available in this build yet")
}
