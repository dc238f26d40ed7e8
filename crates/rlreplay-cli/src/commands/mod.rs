//! One module per subcommand; each exposes `Args` and `run`.

pub mod audit;
pub mod compute;
pub mod eval;
pub mod generate;
pub mod logprobs;
pub mod replay;
pub mod show;
pub mod synth;
pub mod train;
pub mod validate;
pub mod verify;
