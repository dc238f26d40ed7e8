//! The integration tests of `rlreplay-serve`, one module per area, built as one test binary: every
//! binary links the whole dependency tree, so one per file made linking most of the build. The
//! modules' tests run concurrently in one process; one that changes process-wide state (the
//! environment, the working directory) must not disturb the others.

mod common;
mod isolation;
mod lora;
mod protocol;
mod server;
