//! Times the verifier, per answer and in both modes, on input files of the `verify_latex` fuzz
//! target (gold answer, NUL, prediction; without a NUL the text is both) and prints the slowest
//! calls and how many overran the time limit. A warm-up call first builds the lazily compiled
//! regexes; its time is printed separately.
//!
//! `cargo run --release -p rlreplay-reward --example verify_slowest -- [--limit-ms MS] FILE_OR_DIR...`

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rlreplay_reward::{verify, Limits, Mode};

fn files(arg: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    if arg.is_dir() {
        let entries = std::fs::read_dir(arg).map_err(|e| format!("{}: {e}", arg.display()))?;
        for entry in entries {
            let path = entry.map_err(|e| format!("{}: {e}", arg.display()))?.path();
            if path.is_file() {
                out.push(path);
            }
        }
    } else {
        out.push(arg.to_path_buf());
    }
    Ok(())
}

fn main() -> Result<(), String> {
    let usage = "usage: verify_slowest [--limit-ms MS] FILE_OR_DIR...";
    let mut limits = Limits::default();
    let mut paths = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--limit-ms" {
            let ms = args.next().ok_or(usage)?;
            limits.time = Duration::from_millis(ms.parse().map_err(|e| format!("MS: {e}"))?);
        } else {
            files(Path::new(&a), &mut paths)?;
        }
    }
    if paths.is_empty() {
        return Err(usage.into());
    }
    let start = Instant::now();
    verify("1", "1", Mode::Maxrl, &limits);
    verify("1", "1", Mode::Default, &limits);
    println!("warm-up (regex compilation): {:?}", start.elapsed());

    let mut times = Vec::new();
    for path in &paths {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let text = String::from_utf8_lossy(&bytes);
        let (gold, pred) = text.split_once('\0').unwrap_or((&text, &text));
        for mode in [Mode::Maxrl, Mode::Default] {
            let start = Instant::now();
            let v = verify(gold, pred, mode, &limits);
            times.push((start.elapsed(), mode, v.timed_out, path));
        }
    }
    times.sort_by_key(|t| std::cmp::Reverse(t.0));
    let over = times.iter().filter(|t| t.0 > limits.time).count();
    let timed_out = times.iter().filter(|t| t.2).count();
    println!(
        "{} calls on {} files, limit {:?}: slowest {:?}, {timed_out} timed out, {over} over the limit",
        times.len(),
        paths.len(),
        limits.time,
        times[0].0,
    );
    for (took, mode, timed_out, path) in times.iter().take(10) {
        println!(
            "{took:>12.3?}  {mode:<7?} timed_out={timed_out:<5} {}",
            path.display()
        );
    }
    Ok(())
}
