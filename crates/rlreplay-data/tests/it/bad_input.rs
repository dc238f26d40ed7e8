//! Every kind of bad input gives a clear error naming file, row and column (or is skipped and
//! counted by lenient reads), and never a panic.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{Float32Builder, Int32Builder, ListBuilder};
use arrow_array::{ArrayRef, Float32Array, StringArray};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rlreplay_data::{
    read_shard, validate_shard, write_shard, IssueKind, ReadOptions, RolloutBatch,
};

use crate::common::{small_batch, write_columns};

fn strict() -> ReadOptions {
    ReadOptions::new([999])
}

fn lenient() -> ReadOptions {
    ReadOptions {
        lenient: true,
        ..strict()
    }
}

fn shard(dir: &Path, b: &RolloutBatch) -> PathBuf {
    write_shard(dir, b).unwrap()
}

/// Reads strictly, expects an error of `kind` at `row` in `column`, and checks the message names
/// the file, row and column.
fn expect_issue(
    path: &Path,
    opts: &ReadOptions,
    kind: IssueKind,
    row: Option<usize>,
    column: Option<&str>,
) -> String {
    let err = read_shard(path, 1, opts).expect_err("bad input must be an error");
    let issue = err
        .issue()
        .unwrap_or_else(|| panic!("not an Issue: {err:#}"));
    assert_eq!(issue.kind, kind, "{err:#}");
    assert_eq!(issue.row, row, "{err:#}");
    assert_eq!(issue.column.as_deref(), column, "{err:#}");
    let msg = format!("{err:#}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    if let Some(r) = row {
        assert!(msg.contains(&format!("row {r}")), "{msg}");
    }
    if let Some(c) = column {
        assert!(msg.contains(&format!("column `{c}`")), "{msg}");
    }
    msg
}

fn with_log_prob(value: f32) -> RolloutBatch {
    let mut b = small_batch();
    let at = b.response_offsets[5] + 1;
    b.rollout_log_probs[at] = value;
    b
}

#[test]
fn bad_log_probs() {
    for (v, word) in [
        (f32::NAN, "NaN"),
        (f32::INFINITY, "infinite"),
        (f32::NEG_INFINITY, "infinite"),
        (0.25, "positive"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = shard(dir.path(), &with_log_prob(v));
        let msg = expect_issue(
            &path,
            &strict(),
            IssueKind::BadLogProb,
            Some(5),
            Some("rollout_log_probs"),
        );
        assert!(msg.contains(word) && msg.contains("at token 1"), "{msg}");
        // Lenient: the row is dropped, the group becomes smaller (reported, not fatal).
        let (b, report) = read_shard(&path, 1, &lenient()).unwrap();
        assert_eq!((b.len(), report.rows_skipped), (15, 1));
        assert_eq!(report.counts[&IssueKind::BadLogProb], 1);
        assert_eq!(report.counts[&IssueKind::UnequalGroupSize], 1);
        assert!(b
            .rollout_log_probs
            .iter()
            .all(|x| x.is_finite() && *x <= 0.0));
    }
}

#[test]
fn bad_scores() {
    for v in [f32::NAN, f32::INFINITY] {
        let dir = tempfile::tempdir().unwrap();
        let mut b = small_batch();
        b.scores[3] = v;
        let path = shard(dir.path(), &b);
        expect_issue(
            &path,
            &strict(),
            IssueKind::BadScore,
            Some(3),
            Some("score"),
        );
    }
}

#[test]
fn empty_response() {
    let dir = tempfile::tempdir().unwrap();
    let b = small_batch();
    let mut e = RolloutBatch::empty(1);
    for i in 0..b.len() {
        let (r, l): (&[u32], &[f32]) = if i == 6 {
            (&[], &[])
        } else {
            (b.response(i), b.log_probs(i))
        };
        e.push_row(
            &b.uids[i],
            b.prompt(i),
            r,
            l,
            b.scores[i],
            None,
            None,
            None,
            None,
        );
    }
    let path = shard(dir.path(), &e);
    expect_issue(
        &path,
        &strict(),
        IssueKind::EmptyResponse,
        Some(6),
        Some("response_token_ids"),
    );
}

/// A row the trainer cannot score is refused by every read, with the trainer's words.
#[test]
fn empty_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let b = small_batch();
    let mut e = RolloutBatch::empty(1);
    for i in 0..b.len() {
        let p: &[u32] = if i == 5 { &[] } else { b.prompt(i) };
        e.push_row(
            &b.uids[i],
            p,
            b.response(i),
            b.log_probs(i),
            b.scores[i],
            None,
            None,
            None,
            None,
        );
    }
    let path = shard(dir.path(), &e);
    let msg = expect_issue(
        &path,
        &strict(),
        IssueKind::EmptyPrompt,
        Some(5),
        Some("prompt_token_ids"),
    );
    assert!(
        msg.contains("the prompt is empty, so the first response token has no context"),
        "{msg}"
    );
    let report = validate_shard(&path, 1, &strict());
    assert_eq!(report.counts.get(&IssueKind::EmptyPrompt), Some(&1));
}

/// A row longer than the model's positions, when they are given, is refused as the trainer
/// would refuse it.
#[test]
fn rows_beyond_the_models_positions() {
    let dir = tempfile::tempdir().unwrap();
    let b = small_batch();
    let path = shard(dir.path(), &b);
    let longest = (0..b.len())
        .max_by_key(|&i| {
            (
                b.prompt(i).len() + b.response(i).len(),
                std::cmp::Reverse(i),
            )
        })
        .unwrap();
    let total = b.prompt(longest).len() + b.response(longest).len();
    let fits = ReadOptions {
        max_positions: Some(total),
        ..strict()
    };
    assert!(read_shard(&path, 1, &fits).is_ok());
    let opts = ReadOptions {
        max_positions: Some(total - 1),
        ..strict()
    };
    let first = (0..b.len())
        .find(|&i| b.prompt(i).len() + b.response(i).len() > total - 1)
        .unwrap();
    let msg = expect_issue(
        &path,
        &opts,
        IssueKind::TooLong,
        Some(first),
        Some("response_token_ids"),
    );
    assert!(
        msg.contains(&format!("exceed max_position_embeddings = {}", total - 1)),
        "{msg}"
    );
}

#[test]
fn token_ids_at_or_above_vocab() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = small_batch();
    b.response_tokens[b.response_offsets[9]] = 5000;
    let path = shard(dir.path(), &b);
    assert!(
        read_shard(&path, 1, &strict()).is_ok(),
        "no vocabulary given: any u32 id is fine"
    );
    let opts = ReadOptions {
        vocab: Some(1000),
        ..strict()
    };
    let msg = expect_issue(
        &path,
        &opts,
        IssueKind::BadTokenId,
        Some(9),
        Some("response_token_ids"),
    );
    assert!(msg.contains("5000") && msg.contains("1000"), "{msg}");
}

#[test]
fn non_contiguous_groups() {
    let dir = tempfile::tempdir().unwrap();
    let b = small_batch();
    // Group 0's rows split around group 1.
    let order: Vec<usize> = [0, 1, 4, 5, 6, 7, 2, 3].into_iter().chain(8..16).collect();
    let path = shard(dir.path(), &b.select(&order));
    let msg = expect_issue(
        &path,
        &strict(),
        IssueKind::NonContiguousGroup,
        Some(6),
        Some("uid"),
    );
    assert!(msg.contains("began at row 0"), "{msg}");
    let (l, report) = read_shard(&path, 1, &lenient()).unwrap();
    assert_eq!((l.len(), report.rows_skipped), (12, 4));
    assert_eq!(l.groups().len(), 3);
}

#[test]
fn unequal_group_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let b = small_batch();
    let rows: Vec<usize> = (0..16).filter(|&r| r != 10).collect();
    let path = shard(dir.path(), &b.select(&rows));
    expect_issue(
        &path,
        &strict(),
        IssueKind::UnequalGroupSize,
        Some(8),
        Some("uid"),
    );
    let (l, report) = read_shard(&path, 1, &lenient()).unwrap();
    assert_eq!((l.len(), report.rows_skipped), (15, 0));
}

fn f32_lists(rows: &[Vec<f32>]) -> ArrayRef {
    let mut b = ListBuilder::new(Float32Builder::new());
    for r in rows {
        b.values().append_slice(r);
        b.append(true);
    }
    Arc::new(b.finish())
}

fn i32_lists(rows: &[Option<Vec<i32>>]) -> ArrayRef {
    let mut b = ListBuilder::new(Int32Builder::new());
    for r in rows {
        match r {
            Some(r) => {
                b.values().append_slice(r);
                b.append(true);
            }
            None => b.append(false),
        }
    }
    Arc::new(b.finish())
}

fn raw_shard(
    dir: &Path,
    responses: Vec<Option<Vec<i32>>>,
    lps: Vec<Vec<f32>>,
    uid: ArrayRef,
) -> PathBuf {
    let n = responses.len();
    write_columns(
        &dir.join("step-0001.parquet"),
        vec![
            ("uid", uid),
            ("prompt_token_ids", i32_lists(&vec![Some(vec![1, 2]); n])),
            ("response_token_ids", i32_lists(&responses)),
            ("rollout_log_probs", f32_lists(&lps)),
            ("score", Arc::new(Float32Array::from(vec![1.0; n]))),
        ],
    )
}

#[test]
fn lengths_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let uid: ArrayRef = Arc::new(StringArray::from(vec!["a", "a", "b", "b"]));
    let responses = vec![
        Some(vec![3, 999]),
        Some(vec![4, 999]),
        Some(vec![5, 6, 999]),
        Some(vec![7, 999]),
    ];
    let lps = vec![
        vec![-0.1, -0.2],
        vec![-0.1],
        vec![-0.1, -0.2, -0.3],
        vec![-0.1, -0.2],
    ];
    let path = raw_shard(dir.path(), responses, lps, uid);
    let msg = expect_issue(
        &path,
        &strict(),
        IssueKind::LengthMismatch,
        Some(1),
        Some("rollout_log_probs"),
    );
    assert!(msg.contains("1 log-probs for 2 response tokens"), "{msg}");
    let (b, report) = read_shard(&path, 1, &lenient()).unwrap();
    assert_eq!((b.len(), report.rows_skipped), (3, 1));
    // Rows after the dropped one keep their own log-probs.
    assert_eq!(b.log_probs(1), &[-0.1, -0.2, -0.3]);
    assert_eq!(b.response(2), &[7, 999]);
}

#[test]
fn null_values_and_negative_ids() {
    let dir = tempfile::tempdir().unwrap();
    let uid: ArrayRef = Arc::new(StringArray::from(vec![
        Some("a"),
        Some("a"),
        None,
        Some("b"),
    ]));
    let responses = vec![
        Some(vec![3, 999]),
        None,
        Some(vec![5, 999]),
        Some(vec![-7, 999]),
    ];
    let lps = vec![vec![-0.1, -0.2], vec![], vec![-0.1, -0.2], vec![-0.1, -0.2]];
    let path = raw_shard(dir.path(), responses, lps, uid);
    expect_issue(&path, &strict(), IssueKind::NullValue, Some(2), Some("uid"));
    let report = validate_shard(&path, 1, &strict());
    assert_eq!(report.counts[&IssueKind::NullValue], 2, "{report}");
    assert_eq!(report.counts[&IssueKind::BadTokenId], 1, "{report}");
    assert!(report
        .issues
        .iter()
        .any(|i| i.row == Some(1) && i.column.as_deref() == Some("response_token_ids")));
    assert!(report
        .issues
        .iter()
        .any(|i| i.row == Some(3) && i.message.contains("-7")));
    let (b, _) = read_shard(&path, 1, &lenient()).unwrap();
    assert_eq!(b.len(), 1);
}

#[test]
fn wrongly_typed_columns() {
    let dir = tempfile::tempdir().unwrap();
    let b = small_batch();
    let n = b.len();
    let base = |resp: ArrayRef, score: ArrayRef| {
        vec![
            (
                "uid",
                Arc::new(StringArray::from(b.uids.clone())) as ArrayRef,
            ),
            ("prompt_token_ids", i32_lists(&vec![Some(vec![1]); n])),
            ("response_token_ids", resp),
            ("rollout_log_probs", f32_lists(&vec![vec![-0.5]; n])),
            ("score", score),
        ]
    };
    let p1 = write_columns(
        &dir.path().join("a/step-0001.parquet"),
        base(
            f32_lists(&vec![vec![1.0]; n]),
            Arc::new(Float32Array::from(vec![1.0; n])),
        ),
    );
    let msg = expect_issue(
        &p1,
        &strict(),
        IssueKind::WrongType,
        None,
        Some("response_token_ids"),
    );
    assert!(msg.contains("expected a list of integers"), "{msg}");
    let p2 = write_columns(
        &dir.path().join("b/step-0001.parquet"),
        base(
            i32_lists(&vec![Some(vec![1]); n]),
            Arc::new(StringArray::from(vec!["1.0"; n])),
        ),
    );
    expect_issue(&p2, &strict(), IssueKind::WrongType, None, Some("score"));
    // Wrong types are fatal even for lenient reads.
    assert!(read_shard(&p2, 1, &lenient()).is_err());
}

#[test]
fn masks_must_be_all_ones() {
    let dir = tempfile::tempdir().unwrap();
    let uid: ArrayRef = Arc::new(StringArray::from(vec!["a", "a"]));
    let mut mask = ListBuilder::new(Int32Builder::new());
    mask.values().append_slice(&[1, 1]);
    mask.append(true);
    mask.values().append_slice(&[1, 0]);
    mask.append(true);
    let path = write_columns(
        &dir.path().join("step-0001.parquet"),
        vec![
            ("uid", uid),
            (
                "prompt_token_ids",
                i32_lists(&[Some(vec![1]), Some(vec![1])]),
            ),
            (
                "response_token_ids",
                i32_lists(&[Some(vec![3, 999]), Some(vec![4, 999])]),
            ),
            (
                "rollout_log_probs",
                f32_lists(&[vec![-0.1, -0.2], vec![-0.1, -0.2]]),
            ),
            ("score", Arc::new(Float32Array::from(vec![1.0, 0.0]))),
            ("response_mask", Arc::new(mask.finish())),
        ],
    );
    expect_issue(
        &path,
        &strict(),
        IssueKind::BadMask,
        Some(1),
        Some("response_mask"),
    );
}

#[test]
fn corrupted_and_truncated_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = shard(dir.path(), &small_batch());
    let bytes = std::fs::read(&path).unwrap();
    // Truncated: footer gone.
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let msg = expect_issue(&path, &strict(), IssueKind::Unreadable, None, None);
    assert!(msg.contains("Parquet"), "{msg}");
    assert!(read_shard(&path, 1, &lenient()).is_err());
    // Not Parquet at all.
    std::fs::write(&path, b"uid,score\na,1\n").unwrap();
    expect_issue(&path, &strict(), IssueKind::Unreadable, None, None);
    // Empty file and missing file.
    std::fs::write(&path, b"").unwrap();
    expect_issue(&path, &strict(), IssueKind::Unreadable, None, None);
    expect_issue(
        &dir.path().join("nope.parquet"),
        &strict(),
        IssueKind::Unreadable,
        None,
        None,
    );
    // Page data overwritten with garbage (the footer intact).
    let mut garbled = bytes.clone();
    for b in &mut garbled[8..bytes.len() / 2] {
        *b = 0xAB;
    }
    std::fs::write(&path, &garbled).unwrap();
    assert!(read_shard(&path, 1, &strict()).is_err());
    assert!(!validate_shard(&path, 1, &strict()).is_clean());
}

/// Mutates a small shard's bytes a thousand times (bit flips, byte runs, truncations, inserted
/// bytes): every read returns a result, none panics or aborts.
#[test]
fn mutated_shards_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = small_batch().select(&[0, 1, 2, 3, 4, 5, 6, 7]);
    b.data_source[0] = Some("math".into());
    let path = shard(dir.path(), &b);
    let original = std::fs::read(&path).unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    let (mut ok, mut err) = (0, 0);
    for _ in 0..1000 {
        let mut bytes = original.clone();
        match rng.random_range(0..4) {
            0 => {
                for _ in 0..rng.random_range(1..4) {
                    let i = rng.random_range(0..bytes.len());
                    bytes[i] ^= 1 << rng.random_range(0..8);
                }
            }
            1 => {
                let i = rng.random_range(0..bytes.len());
                let n = rng.random_range(1..16).min(bytes.len() - i);
                let v: u8 = rng.random();
                bytes[i..i + n].fill(v);
            }
            2 => bytes.truncate(rng.random_range(0..bytes.len())),
            _ => {
                let i = rng.random_range(0..bytes.len());
                bytes.insert(i, rng.random());
            }
        }
        std::fs::write(&path, &bytes).unwrap();
        let lenient = rng.random_bool(0.5);
        let opts = ReadOptions {
            lenient,
            ..strict()
        };
        match read_shard(&path, 1, &opts) {
            Ok((batch, _)) => {
                ok += 1;
                // Whatever was read is internally consistent.
                assert_eq!(batch.response_offsets.len(), batch.len() + 1);
                assert_eq!(batch.rollout_log_probs.len(), batch.response_tokens.len());
            }
            Err(e) => {
                err += 1;
                assert!(format!("{e:#}").contains("step-0001.parquet"), "{e:#}");
            }
        }
    }
    assert_eq!(ok + err, 1000);
    assert!(
        err > 500,
        "most mutations must be detected: {ok} ok, {err} errors"
    );
}

#[test]
fn negative_token_ids_are_called_negative() {
    let dir = tempfile::tempdir().unwrap();
    let uid: ArrayRef = Arc::new(StringArray::from(vec!["a", "a"]));
    let responses = vec![Some(vec![3, 999]), Some(vec![-7, 999])];
    let path = raw_shard(dir.path(), responses, vec![vec![-0.1, -0.2]; 2], uid);
    // With and without a vocabulary: the id is negative, not "not below the vocabulary size".
    for vocab in [None, Some(1000)] {
        let opts = ReadOptions { vocab, ..strict() };
        let msg = expect_issue(
            &path,
            &opts,
            IssueKind::BadTokenId,
            Some(1),
            Some("response_token_ids"),
        );
        assert!(
            msg.contains("token id -7 at position 0 is negative"),
            "{msg}"
        );
        assert!(!msg.contains("vocabulary"), "{msg}");
    }
    let opts = ReadOptions {
        vocab: Some(5),
        ..strict()
    };
    let msg = expect_issue(
        &path,
        &opts,
        IssueKind::BadTokenId,
        Some(0),
        Some("response_token_ids"),
    );
    assert!(
        msg.contains("token id 999 at position 1 is not below the vocabulary size 5"),
        "{msg}"
    );
}

#[test]
fn zero_row_shards_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = shard(dir.path(), &RolloutBatch::empty(1));
    let msg = expect_issue(&path, &strict(), IssueKind::EmptyShard, None, None);
    assert!(msg.contains("the shard holds no rows"), "{msg}");
    let report = validate_shard(&path, 1, &strict());
    assert_eq!(report.counts[&IssueKind::EmptyShard], 1, "{report}");
    // Lenient reads count it and return the empty step (not a structural problem).
    let (b, report) = read_shard(&path, 1, &lenient()).unwrap();
    assert!(b.is_empty());
    assert_eq!(report.counts[&IssueKind::EmptyShard], 1);
    assert!(!IssueKind::EmptyShard.is_structural());
}
