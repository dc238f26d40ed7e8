//! Writing, reading, aliases, step selection and synthetic data.

use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Float64Builder, Int64Builder, Int8Builder, LargeListBuilder, ListBuilder,
};
use arrow_array::{ArrayRef, BooleanArray, Int32Array, StringArray};
use rlreplay_data::synth::{generate, write_dataset, SynthConfig};
use rlreplay_data::{
    read_footer, read_shard, read_shard_reusing, write_shard, AuditSums, Dataset, IssueKind,
    ReadOptions, ShardWriter, StepRange, StopIds,
};

use crate::common::{small_batch, small_config, write_columns};

#[test]
fn the_footer_gives_the_log_prob_column_and_the_largest_token_id() {
    let dir = tempfile::tempdir().unwrap();
    let b = small_batch();
    let path = write_shard(dir.path(), &b).unwrap();
    let f = read_footer(&path).unwrap();
    assert_eq!(f.rows, b.len());
    assert_eq!(f.log_probs, "rollout_log_probs");
    let max = b
        .prompt_tokens
        .iter()
        .chain(&b.response_tokens)
        .max()
        .copied()
        .unwrap();
    assert_eq!(f.max_token_id.map(|m| m.1), Some(i64::from(max)));
}

#[test]
fn policy_versions_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = small_batch();
    assert!(b.policy_version.iter().all(Option::is_none));
    for (i, v) in b.policy_version.iter_mut().enumerate() {
        *v = (i % 3 != 0).then_some(i as u64);
    }
    let path = write_shard(dir.path(), &b).unwrap();
    let opts = ReadOptions {
        eos: vec![999],
        ..ReadOptions::new([])
    };
    let (back, _) = read_shard(&path, 1, &opts).unwrap();
    assert_eq!(back.policy_version, b.policy_version);
    assert_eq!(back.select(&[2, 1]).policy_version, [Some(2), Some(1)]);
}

#[test]
fn write_then_read_is_identity() {
    let dir = tempfile::tempdir().unwrap();
    let b = small_batch();
    let path = write_shard(dir.path(), &b).unwrap();
    assert_eq!(path, dir.path().join("data/step-0001.parquet"));
    let (back, report) = read_shard(
        &path,
        1,
        &ReadOptions {
            eos: vec![999],
            ..ReadOptions::new([])
        },
    )
    .unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(back.source, path);
    let mut expected = b.clone();
    expected.source = path;
    assert_eq!(back, expected);
    assert_eq!(report.rows_read, 16);
    assert_eq!(
        report.truncated,
        Some((0..b.len()).filter(|&i| b.truncated(i, &[999])).count())
    );
    // No temp file left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path().join("data"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1);
}

/// Every shard rlreplay writes names its stop ids in its footer; shards written without them
/// name none, and a footer value that does not parse is an error naming the file.
#[test]
fn datasets_carry_their_stop_ids() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SynthConfig {
        steps: 2,
        eos: 999,
        ..small_config()
    };
    let files = write_dataset(dir.path(), &cfg, |_| {}).unwrap();
    let ds = Dataset::open(dir.path().to_str().unwrap()).unwrap();
    let named = StopIds::new([999], "rlreplay synth");
    assert_eq!(ds.stop_ids().unwrap(), Some(named.clone()));
    assert_eq!(read_footer(&files[1]).unwrap().stop_ids, Some(named));
    let stop = StopIds::new([2, 7], "models/x");
    let other = tempfile::tempdir().unwrap();
    let b = small_batch();
    ShardWriter::new(other.path())
        .stop_ids(stop.clone())
        .write(&b)
        .unwrap();
    let ds = Dataset::open(other.path().to_str().unwrap()).unwrap();
    assert_eq!(ds.stop_ids().unwrap(), Some(stop));
    let bare = tempfile::tempdir().unwrap();
    write_shard(bare.path(), &b).unwrap();
    let ds = Dataset::open(bare.path().to_str().unwrap()).unwrap();
    assert_eq!(ds.stop_ids().unwrap(), None);
}

#[test]
fn dataset_layouts_and_step_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SynthConfig {
        steps: 5,
        ..small_config()
    };
    let files = write_dataset(dir.path(), &cfg, |_| {}).unwrap();
    assert_eq!(files.len(), 5);
    let spec = dir.path().to_str().unwrap();
    let ds = Dataset::open(spec).unwrap();
    assert_eq!(
        ds.steps().iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );
    // The data/ directory itself, a glob, and one file.
    let data = dir.path().join("data");
    assert_eq!(
        Dataset::open(data.to_str().unwrap()).unwrap().steps().len(),
        5
    );
    let glob = format!("{}/step-000[2-3].parquet", data.display());
    assert_eq!(
        Dataset::open(&glob)
            .unwrap()
            .steps()
            .iter()
            .map(|s| s.0)
            .collect::<Vec<_>>(),
        vec![2, 3]
    );
    assert_eq!(
        Dataset::open(files[3].to_str().unwrap()).unwrap().steps()[0].0,
        4
    );
    // Inclusive ranges.
    let ds2 = Dataset::open_steps(spec, "2..4".parse().unwrap()).unwrap();
    assert_eq!(
        ds2.steps().iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![2, 3, 4]
    );
    let opts = ReadOptions {
        eos: vec![999],
        ..ReadOptions::new([])
    };
    let read: Vec<i64> = ds
        .iter("4..".parse().unwrap(), opts.clone())
        .map(|r| r.unwrap().0.step)
        .collect();
    assert_eq!(read, vec![4, 5]);
    let (b3, _) = ds.read_step(3, &opts).unwrap();
    assert_eq!(
        b3.response_tokens,
        generate(&cfg, 3).unwrap().response_tokens
    );
    assert!(ds.read_step(9, &opts).is_err());
    assert!(Dataset::open_steps(spec, StepRange::new(7, 9)).is_err());
    assert!(Dataset::open("/nonexistent/rollouts").is_err());
}

#[test]
fn recycled_batches_read_like_fresh_ones() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SynthConfig {
        steps: 4,
        ..small_config()
    };
    write_dataset(dir.path(), &cfg, |_| {}).unwrap();
    let ds = Dataset::open(dir.path().to_str().unwrap()).unwrap();
    let opts = ReadOptions {
        eos: vec![999],
        ..ReadOptions::new([])
    };
    // Each step is decoded into the buffers of the step before it.
    let mut steps = ds.iter(StepRange::ALL, opts.clone());
    let mut seen = Vec::new();
    while let Some(item) = steps.next() {
        let (batch, report) = item.unwrap();
        assert!(report.is_clean(), "{report}");
        let (fresh, _) = ds.read_step(batch.step, &opts).unwrap();
        assert_eq!(batch, fresh);
        seen.push(batch.step);
        steps.recycle(batch);
    }
    assert_eq!(seen, vec![1, 2, 3, 4]);
    // A spare from another step's batch, with data left in it, is emptied before use.
    let path = ds.shard(2).unwrap();
    let (spare, _) = ds.read_step(4, &opts).unwrap();
    let (back, _) = read_shard_reusing(path, 2, &opts, Some(spare)).unwrap();
    assert_eq!(back, ds.read_step(2, &opts).unwrap().0);
}

#[test]
fn synth_is_deterministic_and_shaped_like_the_seed() {
    let cfg = SynthConfig {
        prompts: 32,
        seed: 3,
        ..SynthConfig::default()
    };
    let a = generate(&cfg, 1).unwrap();
    assert_eq!(a, generate(&cfg, 1).unwrap());
    assert_ne!(
        a.response_tokens,
        generate(&cfg, 2).unwrap().response_tokens
    );
    assert_eq!(a.len(), 32 * 16);
    assert_eq!(a.groups().len(), 32);
    let s = AuditSums::of_batch(&a, Some(&[cfg.eos])).stats();
    assert!(
        (1200.0..1600.0).contains(&s.resp_len_mean),
        "{}",
        s.resp_len_mean
    );
    assert!(s.resp_len_max <= 4096);
    let t = s.truncated.unwrap();
    assert!(t > 0.0 && t < 0.05, "{t}");
    assert!((s.logprob_mean + 1.0 / 3.0).abs() < 0.01);
    assert!(a
        .rollout_log_probs
        .iter()
        .all(|&x| x <= 0.0 && x.is_finite()));
    assert!(s.solve_none > 0.0 && s.solve_all > 0.0);
}

#[test]
fn learnable_pattern_marks_exactly_the_successes() {
    let cfg = SynthConfig {
        vocab: 32,
        eos: 31,
        pattern_len: 3,
        ..small_config()
    };
    let pattern = cfg.success_pattern();
    assert_eq!(pattern.len(), 3);
    assert!(pattern.iter().all(|&t| t < 32 && t != 31));
    let b = generate(&cfg, 1).unwrap();
    for i in 0..b.len() {
        let starts = b.response(i).starts_with(&pattern);
        assert_eq!(starts, b.scores[i] == 1.0, "row {i}");
        assert!(b.response(i).iter().all(|&t| t < 32));
    }
}

fn int_lists(rows: &[Vec<i64>]) -> ArrayRef {
    let mut b = LargeListBuilder::new(Int64Builder::new());
    for r in rows {
        b.values().append_slice(r);
        b.append(true);
    }
    Arc::new(b.finish())
}

fn f64_lists(rows: &[Vec<f64>]) -> ArrayRef {
    let mut b = ListBuilder::new(Float64Builder::new());
    for r in rows {
        b.values().append_slice(r);
        b.append(true);
    }
    Arc::new(b.finish())
}

fn mask_lists(lens: &[usize]) -> ArrayRef {
    let mut b = ListBuilder::new(Int8Builder::new());
    for &n in lens {
        b.values().append_slice(&vec![1; n]);
        b.append(true);
    }
    Arc::new(b.finish())
}

#[test]
fn aliases_int64_large_lists_masks_and_extra_columns() {
    let dir = tempfile::tempdir().unwrap();
    let prompts = vec![vec![1, 2], vec![1, 2], vec![3], vec![3]];
    let responses = vec![vec![5, 9], vec![6], vec![7, 8, 9], vec![4]];
    let lps = vec![
        vec![-0.5, -0.25],
        vec![-1.0],
        vec![-0.1, -0.2, -0.3],
        vec![0.0],
    ];
    let mut acc = BooleanBuilder::new();
    for v in [true, false, true, true] {
        acc.append_value(v);
    }
    let path = write_columns(
        &dir.path().join("global_step_12.parquet"),
        vec![
            (
                "uid",
                Arc::new(StringArray::from(vec!["a", "a", "b", "b"])) as ArrayRef,
            ),
            ("prompt_ids", int_lists(&prompts)),
            ("response_ids", int_lists(&responses)),
            ("old_log_probs", f64_lists(&lps)),
            ("acc", Arc::new(acc.finish())),
            ("response_mask", mask_lists(&[2, 1, 3, 1])),
            ("attention_mask", mask_lists(&[4, 3, 4, 2])),
            ("advantages", Arc::new(Int32Array::from(vec![0, 0, 0, 0]))),
            ("flag", Arc::new(BooleanArray::from(vec![true; 4]))),
        ],
    );
    let ds = Dataset::open(dir.path().to_str().unwrap()).unwrap();
    assert_eq!(ds.steps()[0].0, 12);
    let (b, report) = ds
        .read_step(
            12,
            &ReadOptions {
                eos: vec![9],
                ..ReadOptions::new([])
            },
        )
        .unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(b.source, path);
    assert_eq!(b.response(2), &[7, 8, 9]);
    assert_eq!(b.prompt(1), &[1, 2]);
    assert_eq!(b.log_probs(0), &[-0.5, -0.25]);
    assert_eq!(b.scores, vec![1.0, 0.0, 1.0, 1.0]);
    assert_eq!(b.data_source, vec![None; 4]);
    // No policy_version column: every version is unknown, none is 0.
    assert_eq!(b.policy_version, vec![None; 4]);
    assert_eq!(report.truncated, Some(2));
}

#[test]
fn missing_column_lists_the_columns_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_columns(
        &dir.path().join("step-0001.parquet"),
        vec![
            ("uid", Arc::new(StringArray::from(vec!["a"])) as ArrayRef),
            ("prompt_token_ids", int_lists(&[vec![1]])),
            ("response_token_ids", int_lists(&[vec![2]])),
            (
                "score",
                Arc::new(arrow_array::Float32Array::from(vec![1.0])),
            ),
        ],
    );
    let err = read_shard(&path, 1, &ReadOptions::new([])).unwrap_err();
    let issue = err.issue().unwrap();
    assert_eq!(issue.kind, IssueKind::MissingColumn);
    let msg = err.to_string();
    assert!(msg.contains("step-0001.parquet"), "{msg}");
    assert!(
        msg.contains("rollout_log_probs") && msg.contains("old_log_probs"),
        "{msg}"
    );
    assert!(
        msg.contains("columns found: uid, prompt_token_ids, response_token_ids, score"),
        "{msg}"
    );
}
