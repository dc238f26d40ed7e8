//! The integration tests of `rlreplay-train`, one module per area, built as one test binary: every
//! binary links the whole dependency tree, so one per file made linking most of the build. The
//! modules' tests run concurrently in one process; one that changes process-wide state (the
//! environment, the working directory) must not disturb the others.

mod errors;
mod golden;
mod lora;
mod presets;
mod remote;
mod replay;
mod replay_rlsd;
mod run_dir;
mod toy_learns;
