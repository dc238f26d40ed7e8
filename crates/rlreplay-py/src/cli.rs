//! The `rlreplay` command of the wheel: the command-line tool of the cargo build, linked into
//! the module (the `cli` feature) and started by `python/rlreplay/__main__.py`.

use std::ffi::OsString;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::prelude::*;

/// Runs the `rlreplay` command line `argv` (the program name first) with the GIL released and
/// returns its exit code, as the binary's: 0 on success, 1 for findings (`validate`), 2 for an
/// error (printed to stderr) or a usage error, 101 when it panics (the message on stderr).
/// stdout and stderr are written and flushed by Rust, not through `sys.stdout`.
#[pyfunction]
pub fn cli_main(py: Python<'_>, argv: Vec<OsString>) -> i32 {
    py.detach(|| {
        let code = catch_unwind(AssertUnwindSafe(|| rlreplay_cli::run_args(argv)));
        rlreplay_cli::flush();
        code.map_or(101, rlreplay_cli::exit_code_value)
    })
}
