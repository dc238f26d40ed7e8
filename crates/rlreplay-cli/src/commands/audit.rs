//! `rlreplay audit`.

use std::process::ExitCode;

/// Arguments of `rlreplay audit`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `rlreplay audit`.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`rlreplay audit` is not available in this build yet")
}
