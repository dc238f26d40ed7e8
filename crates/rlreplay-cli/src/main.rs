//! The `rlreplay` binary: [`rlreplay_cli::run`] with mimalloc and the process-wide settings
//! that must be made before any thread starts.

use std::process::ExitCode;

use clap::Parser;
use rlreplay_cli::Cli;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // SAFETY: no other thread exists yet.
    unsafe { rlreplay_model::keep_candle_elementwise_on_caller() };
    let cli = Cli::parse();
    if cli.trains() {
        // Training steps free and reallocate the same buffers; elsewhere (audit, say) mimalloc's
        // default keeps the peak resident memory lower.
        // SAFETY: still no other thread.
        unsafe { rlreplay_model::keep_freed_memory_committed() };
    }
    rlreplay_cli::run(cli)
}
