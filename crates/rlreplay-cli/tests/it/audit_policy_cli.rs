//! `rlreplay audit --policy` as a process: its statistics against an independent NumPy
//! computation (scripts/golden_audit.py) and against the trainer's rollout-correction metrics,
//! the per-row table and the plots, and bad input refused before any compute.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::{ArrayRef, ListArray, RecordBatch, StringArray};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use rlreplay_data::synth::{write_dataset, SynthConfig};
use rlreplay_data::{read_shard, ReadOptions};
use serde_json::Value;

use crate::common::rlreplay;
#[cfg(feature = "mpi")]
use crate::common::{ranks, tiny_dataset};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/audit")
}

fn policy() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../rlreplay-model/tests/fixtures/tiny_tied")
        .to_string_lossy()
        .into_owned()
}

fn json_lines(o: &Output) -> Vec<Value> {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn close(got: f64, want: f64, rel: f64) -> bool {
    (got - want).abs() <= rel * want.abs().max(1.0)
}

#[test]
fn statistics_match_numpy_on_the_policys_logprobs() {
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("expected.json")).unwrap())
            .unwrap();
    let data = fixture().to_string_lossy().into_owned();
    let pol = policy();
    let lines = json_lines(&rlreplay(&[
        "audit",
        &data,
        "--policy",
        &pol,
        "--eos",
        "1",
        "--dtype",
        "f64",
        "--rollout-is-threshold",
        "2,1.2",
        "--json",
    ]));
    assert_eq!(lines.len(), 4);
    let mut compared = 0;
    for line in &lines {
        // The temperature logged with the rows is the one used.
        assert_eq!(line["temperature"], 0.7);
        let want = if line["summary"] == true {
            &expected["summary"]
        } else {
            &expected["steps"][line["step"].to_string()]
        };
        let want = want.as_object().unwrap();
        assert!(want.len() > 150);
        for (k, w) in want {
            let w = w.as_f64().unwrap();
            let g = line[k]
                .as_f64()
                .unwrap_or_else(|| panic!("{k} missing from {line}"));
            assert!(close(g, w, 1e-9), "{k}: {g} vs NumPy {w}");
            compared += 1;
        }
    }
    assert!(compared > 800, "{compared}");
}

#[test]
fn verl_metrics_equal_the_trainers_rollout_correction() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("replay.toml");
    let rs = "token_k3,seq_mean_k1";
    let rs_t = "0.5,0.8_1.25";
    std::fs::write(
        &cfg,
        format!(
            r#"
[model]
path = "{}"

[data]
path = "{}"
steps = "2..2"
eos_token_id = 1

[rollout]
temperature = 0.7

[algorithm]
adv_estimator = "grpo"
loss_mode = "ppo"
rollout_is = "token"
rollout_is_threshold = 2.0
rollout_rs = "{rs}"
rollout_rs_threshold = "{rs_t}"

[batch]
max_tokens_per_micro_batch = 8192
"#,
            policy(),
            fixture().display()
        ),
    )
    .unwrap();
    let run = tmp.path().join("run");
    let o = rlreplay(&[
        "replay",
        "--config",
        cfg.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let trained = rlreplay_train::rundir::read_metrics(&run, false).unwrap();
    let trained = &trained[0];

    let data = fixture().to_string_lossy().into_owned();
    let pol = policy();
    let lines = json_lines(&rlreplay(&[
        "audit",
        &data,
        "--policy",
        &pol,
        "--steps",
        "2..2",
        "--eos",
        "1",
        "--rollout-rs",
        rs,
        "--rollout-rs-threshold",
        rs_t,
        "--json",
    ]));
    let audited = &lines[0];
    let keys: Vec<&String> = trained
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| k.starts_with("rollout_corr/"))
        .collect();
    assert!(keys.len() > 40, "{keys:?}");
    assert!(keys.iter().any(|k| k.contains("rollout_rs_token_k3")));
    for k in keys {
        let (t, a) = (trained[k].as_f64().unwrap(), audited[k].as_f64().unwrap());
        assert!(close(a, t, 1e-12), "{k}: audit {a}, trainer {t}");
    }
    // The audit's own fractions are the correction's.
    assert_eq!(
        audited["audit/rs/tokens"],
        audited["rollout_corr/rollout_rs_masked_fraction"]
    );
}

#[test]
fn rows_table_and_plots() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = tmp.path().join("rows.parquet");
    let plots = tmp.path().join("plots");
    let data = fixture().to_string_lossy().into_owned();
    let pol = policy();
    let o = rlreplay(&[
        "audit",
        &data,
        "--policy",
        &pol,
        "--eos",
        "1",
        "--is-threshold",
        "2",
        "--is-threshold",
        "1.5",
        "--rows-out",
        rows.to_str().unwrap(),
        "--out",
        plots.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    for word in [
        "step",
        "all",
        "success",
        "truncated",
        "token_truncate",
        "geo_mask",
    ] {
        assert!(table.contains(word), "{word} missing from\n{table}");
    }
    for name in [
        "log_ratio_histogram",
        "seq_log_ratio_histogram",
        "ess_kl",
        "truncated_fraction",
    ] {
        let png = std::fs::read(plots.join(format!("{name}.png"))).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        let svg = std::fs::read_to_string(plots.join(format!("{name}.svg"))).unwrap();
        assert!(svg.starts_with("<svg"));
    }

    let file = std::fs::File::open(&rows).unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
    assert_eq!(
        reader.metadata().num_row_groups(),
        3,
        "one row group per step"
    );
    let meta = reader
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .unwrap();
    assert!(meta.iter().any(|kv| kv.key == "rlreplay.audit"
        && kv.value.as_deref().is_some_and(|v| v.contains("[2.0,1.5]"))));
    // (uid, step, row, length, truncated, seq log-ratio, seq weight, tokens above, seq above)
    type Row = (String, i64, i64, i64, bool, f64, f64, i64, bool);
    let mut got: Vec<Row> = Vec::new();
    for b in reader.build().unwrap().map(Result::unwrap) {
        let col = |n: &str| b.column_by_name(n).unwrap_or_else(|| panic!("{n}")).clone();
        let (uid, steps, row, len, trunc, seq, w, above, seq_above) = (
            col("uid"),
            col("step"),
            col("row"),
            col("response_length"),
            col("response_truncated"),
            col("seq_log_ratio"),
            col("seq_weight"),
            col("tokens_above_1_5"),
            col("seq_above_1_5"),
        );
        for i in 0..b.num_rows() {
            got.push((
                uid.as_string::<i32>().value(i).to_string(),
                steps.as_primitive::<Int64Type>().value(i),
                row.as_primitive::<Int64Type>().value(i),
                len.as_primitive::<Int64Type>().value(i),
                trunc.as_boolean().value(i),
                seq.as_primitive::<Float64Type>().value(i),
                w.as_primitive::<Float64Type>().value(i),
                above.as_primitive::<Int64Type>().value(i),
                seq_above.as_boolean().value(i),
            ));
        }
    }
    let mut got = got.into_iter();
    for step in 1..=3i64 {
        let shard = fixture().join(format!("data/step-{step:04}.parquet"));
        let opts = ReadOptions {
            eos: vec![1],
            ..ReadOptions::new([])
        };
        let (ds, _) = read_shard(&shard, step, &opts).unwrap();
        for i in 0..ds.len() {
            let r = got.next().unwrap();
            assert_eq!(r.0, ds.uids[i]);
            assert_eq!((r.1, r.2), (step, i as i64));
            assert_eq!(r.3 as usize, ds.response(i).len());
            assert_eq!(r.4, ds.truncated(i, &[1]));
            assert!(close(r.6, r.5.clamp(-20.0, 20.0).exp(), 1e-12));
            assert_eq!(r.8, r.6 > 1.5);
            assert!(r.7 as usize <= ds.response(i).len());
        }
    }
    assert!(got.next().is_none());
    // No temporary file is left next to the table.
    let names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

/// Runs a failing audit and returns its error text; no row table may appear.
fn refused(dir: &Path, data: &str, extra: &[&str]) -> String {
    let rows = dir.join("refused.parquet");
    let pol = policy();
    let mut args = vec![
        "audit",
        data,
        "--policy",
        &pol,
        "--eos",
        "1",
        "--rows-out",
        rows.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = rlreplay(&args);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(!rows.exists());
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `dir/wide`: two steps of token ids beyond the tiny policy's 96-token vocabulary.
fn wide_dataset(dir: &Path) -> PathBuf {
    let wide = dir.join("wide");
    let synth = SynthConfig {
        steps: 2,
        prompts: 2,
        group: 2,
        vocab: 500,
        mean_len: 8.0,
        max_len: 16,
        prompt_len: 4,
        eos: 1,
        seed: 3,
        ..SynthConfig::default()
    };
    write_dataset(&wide, &synth, |_| {}).unwrap();
    wide
}

#[test]
fn bad_input_is_refused_before_any_compute() {
    let tmp = tempfile::tempdir().unwrap();
    let data = fixture().to_string_lossy().into_owned();

    // Token ids beyond the policy's 96-token vocabulary.
    let wide = wide_dataset(tmp.path());
    let e = refused(tmp.path(), wide.to_str().unwrap(), &[]);
    assert!(e.contains("outside the vocabulary"), "{e}");
    assert!(
        e.contains("step-0001.parquet") && e.contains("vocab_size = 96"),
        "{e}"
    );
    assert!(e.contains("_token_ids`"), "{e}");

    // Temperature 0.
    let e = refused(tmp.path(), &data, &["--temperature", "0"]);
    assert!(e.contains("--temperature is 0"), "{e}");
    let e = refused(tmp.path(), &data, &["--temperature=-1"]);
    assert!(e.contains("positive"), "{e}");

    // A dataset without behaviour log-probs.
    let bare = tmp.path().join("bare");
    std::fs::create_dir_all(bare.join("data")).unwrap();
    let ids = |v: Vec<Vec<i32>>| -> ArrayRef {
        Arc::new(ListArray::from_iter_primitive::<
            arrow_array::types::Int32Type,
            _,
            _,
        >(
            v.into_iter().map(|r| Some(r.into_iter().map(Some)))
        ))
    };
    let batch = RecordBatch::try_from_iter([
        (
            "uid",
            Arc::new(StringArray::from(vec!["a", "a"])) as ArrayRef,
        ),
        ("prompt_token_ids", ids(vec![vec![2, 3], vec![2, 3]])),
        ("response_token_ids", ids(vec![vec![4, 1], vec![5, 1]])),
        (
            "score",
            Arc::new(arrow_array::Float32Array::from(vec![1.0, 0.0])) as ArrayRef,
        ),
    ])
    .unwrap();
    let f = std::fs::File::create(bare.join("data/step-0001.parquet")).unwrap();
    let mut w = ArrowWriter::try_new(f, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let e = refused(tmp.path(), bare.to_str().unwrap(), &[]);
    assert!(
        e.contains("rollout_log_probs") && e.contains("behaviour log-probs"),
        "{e}"
    );
    assert!(e.contains("step-0001.parquet"), "{e}");

    // Settings that cannot work.
    let e = refused(tmp.path(), &data, &["--rollout-is-threshold", "0"]);
    assert!(e.contains("rollout_is_threshold"), "{e}");
    let e = refused(tmp.path(), &data, &["--rollout-is", "bogus"]);
    assert!(e.contains("rollout_is"), "{e}");
    let e = refused(
        tmp.path(),
        &data,
        &["--rollout-rs", "token_k9", "--rollout-rs-threshold", "1"],
    );
    assert!(e.contains("token_k9"), "{e}");
    let o = rlreplay(&["audit", &data, "--policy", &policy(), "--lenient"]);
    assert_eq!(o.status.code(), Some(2));
    let o = rlreplay(&["audit", &data, "--rows-out", "x.parquet"]);
    assert_eq!(o.status.code(), Some(2), "--rows-out needs --policy");
}

/// Every file under `dir`, by path relative to it, with its bytes, sorted.
#[cfg(feature = "mpi")]
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                out.push((p.strip_prefix(root).unwrap().to_path_buf(), bytes));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// `audit --policy` of `data` with `extra` options on one process and on two ranks: the same
/// stdout (`--json` and the table), the same row table and plots, byte for byte; nothing but
/// what one process writes.
#[cfg(feature = "mpi")]
fn two_ranks_equal_one_process(data: &Path, extra: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let pol = policy();
    let data = data.to_string_lossy();
    for json in [true, false] {
        let mut outs = Vec::new();
        for n in [1, 2] {
            let dir = tmp.path().join(format!("{n}-{json}"));
            std::fs::create_dir_all(&dir).unwrap();
            let rows = dir.join("rows.parquet");
            let plots = dir.join("plots");
            let mut args = vec![
                "audit",
                &data,
                "--policy",
                &pol,
                "--eos",
                "1",
                "--threads",
                "1",
                "--is-threshold",
                "2,1.5",
                "--rows-out",
                rows.to_str().unwrap(),
                "--out",
                plots.to_str().unwrap(),
            ];
            args.extend_from_slice(extra);
            if json {
                args.push("--json");
            }
            let o = if n == 1 {
                rlreplay(&args)
            } else {
                ranks(n, &args)
            };
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let err = String::from_utf8_lossy(&o.stderr).into_owned();
            assert_eq!(err.matches("audited ").count(), 1, "{err}");
            if n == 2 {
                assert!(err.contains("on 2 ranks (mpi)"), "{err}");
            }
            outs.push((o.stdout, files(&dir)));
        }
        let (one, two) = (&outs[0], &outs[1]);
        assert!(!one.0.is_empty());
        assert_eq!(
            String::from_utf8_lossy(&one.0),
            String::from_utf8_lossy(&two.0),
            "stdout"
        );
        let names = |f: &[(PathBuf, Vec<u8>)]| f.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
        assert_eq!(names(&one.1), names(&two.1));
        assert_eq!(one.1.len(), 9, "{:?}", names(&one.1));
        for ((name, a), (_, b)) in one.1.iter().zip(&two.1) {
            assert!(a == b, "{} differs", name.display());
        }
    }
}

#[cfg(feature = "mpi")]
#[test]
fn two_ranks_audit_like_one_process_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    // Three groups of four rows a step, packs of at most 64 tokens: several packs per rank.
    let data = tiny_dataset(&tmp.path().join("data"), 2, 3, 4, 5);
    two_ranks_equal_one_process(&data, &["--max-batch-tokens", "64"]);
}

#[cfg(feature = "mpi")]
#[test]
fn fewer_groups_than_ranks_audit_like_one_process() {
    let tmp = tempfile::tempdir().unwrap();
    // One group a step in one pack: rank 1 has nothing to compute.
    let data = tiny_dataset(&tmp.path().join("data"), 2, 1, 4, 5);
    two_ranks_equal_one_process(&data, &[]);
}

#[cfg(feature = "mpi")]
#[test]
fn bad_input_on_two_ranks_is_one_message() {
    let tmp = tempfile::tempdir().unwrap();
    let data = fixture().to_string_lossy().into_owned();
    let pol = policy();
    let rows = tmp.path().join("rows.parquet");
    let base = [
        "audit",
        &data,
        "--policy",
        &pol,
        "--eos",
        "1",
        "--rows-out",
        rows.to_str().unwrap(),
    ];
    let wide = wide_dataset(tmp.path());
    let wide_s = wide.to_string_lossy().into_owned();
    let mut wide_args = base.to_vec();
    wide_args[1] = &wide_s;
    for (args, want) in [
        (
            [&base[..], &["--temperature", "0"]].concat(),
            "--temperature is 0",
        ),
        (wide_args, "outside the vocabulary"),
    ] {
        let o = ranks(2, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{err}");
        assert_eq!(err.matches(want).count(), 1, "{err}");
        assert!(!err.contains("rank 1: error"), "{err}");
        assert!(
            o.stdout.is_empty(),
            "{}",
            String::from_utf8_lossy(&o.stdout)
        );
        assert!(!rows.exists());
    }
}

/// A build without MPI started as one of several ranks refuses to audit: rank 0 says why, the
/// others stop quietly, and nothing is written.
#[cfg(not(feature = "mpi"))]
#[test]
fn a_launched_rank_without_mpi_support_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = tmp.path().join("rows.parquet");
    let data = fixture().to_string_lossy().into_owned();
    for rank in ["0", "1"] {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_rlreplay"))
            .args(["audit", &data, "--policy", &policy(), "--eos", "1"])
            .args(["--rows-out", rows.to_str().unwrap()])
            .env("OMPI_COMM_WORLD_RANK", rank)
            .env("OMPI_COMM_WORLD_SIZE", "2")
            .env("OMPI_COMM_WORLD_LOCAL_RANK", rank)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        if rank == "0" {
            assert!(
                err.contains("rank 0 of 2, but this build has no MPI support"),
                "{err}"
            );
        } else {
            assert!(err.is_empty(), "{err}");
        }
        assert!(o.stdout.is_empty());
        assert!(!rows.exists());
    }
}
