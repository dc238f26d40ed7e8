//! Helpers shared by the tests of the `rlreplay` binary: the tiny random-model replay setup,
//! `mpirun` ranks, and `rlreplay serve` on a free loopback port.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use rlreplay_data::synth::{write_dataset, SynthConfig};

/// The `[model.random]` table of the tiny random Qwen3 the replay tests train: a vocabulary of
/// 64 ids, two layers of width 32.
pub const TINY_RANDOM_MODEL: &str = "[model.random]
vocab_size = 64
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
head_dim = 8
";

/// Writes into `dir` a synthetic dataset over the tiny model's vocabulary (end of sequence 1):
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
/// more ranks than cores). Only the `mpi` build runs tests on ranks.
#[cfg(feature = "mpi")]
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

/// Starts `rlreplay serve ARGS --port 0` and waits for the address it prints on its first line:
/// the process and its URL. The rest of its log is read in the background, so that it never
/// blocks on a full pipe.
pub fn serve(args: &[&str]) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .arg("serve")
        .args(args)
        .args(["--port", "0"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let line = lines.next().unwrap().unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();
    std::thread::spawn(move || lines.for_each(drop));
    (child, url)
}
