//! Helpers shared by the tests of the `rlreplay` binary: a synthetic dataset for the tiny
//! random models, the binary as one process and on `mpirun` ranks.
// Each test file uses its own share of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rlreplay_data::synth::{write_dataset, SynthConfig};

/// Writes into `dir` a synthetic dataset over a vocabulary of 64 ids (end of sequence 1):
/// `steps` steps of `prompts` groups of `group` rows, prompts of 6 tokens, responses of 16 on
/// average (at most 32), drawn with `seed`.
pub fn tiny_dataset(dir: &Path, steps: usize, prompts: usize, group: usize, seed: u64) -> PathBuf {
    let synth = SynthConfig {
        steps,
        prompts,
        group,
        vocab: 64,
        mean_len: 16.0,
        max_len: 32,
        prompt_len: 6,
        eos: 1,
        pattern_len: 3,
        seed,
        ..SynthConfig::default()
    };
    write_dataset(dir, &synth, |_| {}).unwrap();
    dir.to_path_buf()
}

/// `rlreplay ARGS` as one process.
pub fn rlreplay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(args)
        .output()
        .unwrap()
}

/// `rlreplay ARGS` on `n` MPI ranks (Open MPI's `mpirun`, allowed to run as root and to start
/// more ranks than cores).
pub fn ranks(n: usize, args: &[&str]) -> Output {
    Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            &n.to_string(),
        ])
        .arg(env!("CARGO_BIN_EXE_rlreplay"))
        .args(args)
        .output()
        .unwrap()
}
