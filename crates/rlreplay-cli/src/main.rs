//! The `rlreplay` binary: [`rlreplay_cli::run`] with mimalloc and the process-wide settings
//! that must be made before any thread starts.

use std::process::ExitCode;

use clap::Parser;
use rlreplay_cli::Cli;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (its value in the `mi_option_e` enum of mimalloc 3's
/// `mimalloc.h`; the Rust bindings name no constant for it; the integration tests check it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Tells mimalloc to keep the memory the process frees committed for reuse instead of returning
/// it to the OS after its purge delay (1 s by default; `MIMALLOC_PURGE_DELAY=-1`), unless the
/// environment sets `MIMALLOC_PURGE_DELAY` itself. A training step frees and allocates the same
/// large activation and gradient buffers again and again; returned pages are page-faulted and
/// zeroed by the kernel on their next use (on a Qwen3-0.6B-shaped layer's forward+backward, 440 K
/// minor page faults and a sixth of the CPU time). The resident set then stays at its peak
/// instead of shrinking between steps, and a job that streams through differently sized buffers
/// (`rlreplay audit`) peaks higher, so only the training commands use it.
///
/// # Safety
///
/// mimalloc's option setters are not thread-safe: call it before spawning any thread.
unsafe fn keep_freed_memory_committed() {
    // SAFETY: the caller guarantees that no other thread runs; `mi_option_set_default` only
    // stores the value, and only when the option was not set from the environment.
    unsafe { libmimalloc_sys::mi_option_set_default(MI_OPTION_PURGE_DELAY, -1) };
}

fn main() -> ExitCode {
    // SAFETY: no other thread exists yet.
    unsafe { rlreplay_model::keep_candle_elementwise_on_caller() };
    let cli = Cli::parse();
    if cli.trains() {
        // Training steps free and reallocate the same buffers; elsewhere (audit, say) mimalloc's
        // default keeps the peak resident memory lower.
        // SAFETY: still no other thread.
        unsafe { keep_freed_memory_committed() };
    }
    rlreplay_cli::run(cli)
}
