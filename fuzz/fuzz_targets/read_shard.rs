//! The rollout-shard reader on arbitrary bytes: every read returns a result (an error naming the
//! file for a bad shard), never takes the process down, and what it returns is consistent.
//!
//! The input is written to `step-0001.parquet` in a private temporary directory (the reader
//! takes paths) and read strictly, leniently and by `validate_shard`. A negative token id is
//! reported as negative, and a readable shard without rows is reported (`empty_shard`) and
//! refused by strict reads.
//!
//! The reader turns a panic inside the Parquet decoder into an "unreadable" error, as it does in
//! production, so such panics are not failures here: each distinct one is printed once
//! (`caught panic: …`) and the run goes on. With `READ_SHARD_PANIC_ABORTS=1` every panic aborts,
//! libFuzzer's default, to collect the decoder's panics as crash inputs.
#![no_main]

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{LazyLock, Mutex, Once};

use libfuzzer_sys::fuzz_target;
use rlreplay_data::{read_shard, validate_shard, IssueKind, ReadOptions, RolloutBatch};

struct Shard {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

static SHARD: LazyLock<Shard> = LazyLock::new(|| {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("step-0001.parquet");
    Shard { _dir: dir, path }
});

static QUIET_PANICS: Once = Once::new();

/// Prints each distinct panic location once instead of aborting; an uncaught panic still aborts
/// (libfuzzer-sys aborts when the target unwinds).
fn report_panics_once() {
    if std::env::var_os("READ_SHARD_PANIC_ABORTS").is_some_and(|v| v == "1") {
        return;
    }
    QUIET_PANICS.call_once(|| {
        let seen = Mutex::new(HashSet::new());
        std::panic::set_hook(Box::new(move |info| {
            let at = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()))
                .unwrap_or_default();
            if seen
                .lock()
                .map(|mut s| s.insert(at.clone()))
                .unwrap_or(false)
            {
                eprintln!("caught panic: {info}");
            }
        }));
    });
}

fn check_consistent(b: &RolloutBatch) {
    let n = b.len();
    assert_eq!(b.prompt_offsets.len(), n + 1);
    assert_eq!(b.response_offsets.len(), n + 1);
    assert_eq!(
        b.prompt_offsets.last().copied(),
        Some(b.prompt_tokens.len())
    );
    assert_eq!(
        b.response_offsets.last().copied(),
        Some(b.response_tokens.len())
    );
    assert_eq!(b.rollout_log_probs.len(), b.response_tokens.len());
    for v in [
        b.uids.len(),
        b.scores.len(),
        b.data_source.len(),
        b.ground_truth.len(),
    ] {
        assert_eq!(v, n);
    }
    assert_eq!(b.temperature.len(), n);
    assert_eq!(b.top_p.len(), n);
    for i in 0..n {
        assert!(b.prompt_offsets[i] <= b.prompt_offsets[i + 1]);
        assert!(b.response_offsets[i] <= b.response_offsets[i + 1]);
    }
}

fuzz_target!(|data: &[u8]| {
    report_panics_once();
    let path = &SHARD.path;
    std::fs::write(path, data).expect("write the shard");
    let strict = ReadOptions::new([151_643]);
    let lenient = ReadOptions {
        lenient: true,
        vocab: Some(151_936),
        ..strict.clone()
    };
    for opts in [strict, lenient] {
        match read_shard(path, 1, &opts) {
            Ok((batch, report)) => {
                check_consistent(&batch);
                assert!(opts.lenient || report.is_clean());
            }
            Err(e) => {
                let msg = format!("{e:#}");
                assert!(
                    msg.contains("step-0001.parquet"),
                    "error without the file: {msg}"
                );
            }
        }
    }
    let report = validate_shard(path, 1, &strict);
    for issue in &report.issues {
        // A negative id is called negative, never "not below the vocabulary size".
        if issue.kind == IssueKind::BadTokenId && issue.message.contains("token id -") {
            assert!(issue.message.contains("negative"), "{issue}");
        }
    }
    // A readable shard without rows is reported, and a strict read refuses it.
    if report.rows_read == 0 && !report.counts.keys().any(|k| k.is_structural()) {
        assert_eq!(report.counts.get(&IssueKind::EmptyShard), Some(&1), "{report}");
        assert!(read_shard(path, 1, &strict).is_err());
    }
});
