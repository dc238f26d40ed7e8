//! `rlreplay verify`.

use std::process::ExitCode;

/// Arguments of `rlreplay verify`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `rlreplay verify`.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`rlreplay verify` is not available in this build yet")
}
