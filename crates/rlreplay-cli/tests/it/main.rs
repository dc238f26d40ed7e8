//! The integration tests of the `rlreplay` binary, one module per area, built as one test binary:
//! every binary links the whole dependency tree, so one per file made linking most of the build.
//! The modules' tests run concurrently in one process; one that changes process-wide state (the
//! environment, the working directory) must not disturb the others.

mod adapter_cli;
mod audit_policy_cli;
mod common;
mod compute_cli;
mod convert_cli;
mod data_cli;
mod device_cli;
mod eval_cli;
mod generate_cli;
mod logprobs_cli;
mod model_guards;
mod prepare_cli;
mod ranks_cli;
mod remote_cli;
mod replay_cli;
mod serve_cli;
mod train_toy;
mod verify_cli;
