//! The data commands end to end: synth, audit (table and JSON), validate, show.

use std::path::Path;
use std::process::{Command, Output};

fn rlreplay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(args)
        .output()
        .expect("run rlreplay")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn synth(dir: &Path, vocab: &str, eos: &str) {
    let out = dir.to_str().unwrap();
    let args = vec![
        "synth",
        "--out",
        out,
        "--steps",
        "3",
        "--prompts",
        "8",
        "--group",
        "4",
        "--mean-len",
        "40",
        "--max-len",
        "64",
        "--vocab",
        vocab,
        "--eos",
        eos,
        "--seed",
        "5",
    ];
    let o = rlreplay(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn synth_then_audit_json() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path(), "1000", "999");
    assert!(dir.path().join("data/step-0003.parquet").is_file());
    let d = dir.path().to_str().unwrap();
    let o = rlreplay(&["audit", d, "--json", "--eos", "999", "--steps", "2..3"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["step"], 2);
    assert_eq!(lines[1]["step"], 3);
    assert!(lines[0]["file"]
        .as_str()
        .unwrap()
        .ends_with("step-0002.parquet"));
    for key in [
        "rows",
        "groups",
        "group_size",
        "score_mean",
        "solve_none",
        "solve_all",
        "prompt_len_mean",
        "resp_len_mean",
        "resp_len_max",
        "truncated",
        "logprob_mean",
    ] {
        assert!(lines[0].get(key).is_some(), "missing {key}");
        assert!(lines[2].get(key).is_some(), "summary missing {key}");
    }
    assert_eq!(lines[0]["rows"], 32);
    assert_eq!(lines[0]["groups"], 8);
    assert_eq!(lines[0]["group_size"], 4.0);
    assert_eq!(lines[2]["summary"], true);
    assert_eq!(lines[2]["rows"], 64);
    assert!(lines[2]["resp_len_max"].as_u64().unwrap() <= 64);
    assert!(lines[2]["logprob_mean"].as_f64().unwrap() < 0.0);
    // Human table: header, 3 steps, summary, the end-of-sequence ids used.
    let o = rlreplay(&["audit", d, "--eos", "999"]);
    assert!(o.status.success());
    let table = stdout(&o);
    assert_eq!(table.lines().count(), 6, "{table}");
    assert!(table
        .lines()
        .nth(4)
        .unwrap()
        .trim_start()
        .starts_with("all"));
    assert_eq!(
        table.lines().last().unwrap(),
        "end of sequence: 999 (from --eos)"
    );
}

#[test]
fn validate_clean_and_broken() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path(), "1000", "999");
    let d = dir.path().to_str().unwrap();
    let o = rlreplay(&["validate", d, "--vocab", "1000", "--eos", "999"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("OK"));
    // A vocabulary smaller than the ids: every shard fails.
    let o = rlreplay(&["validate", d, "--vocab", "10", "--eos", "999"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("bad_token_id"), "{}", stdout(&o));
    // A truncated shard: named in the report; lenient does not rescue an unreadable file.
    let shard = dir.path().join("data/step-0002.parquet");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() / 3]).unwrap();
    let o = rlreplay(&["validate", d, "--eos", "999"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("step-0002.parquet"), "{}", stdout(&o));
    assert_eq!(
        rlreplay(&["validate", d, "--lenient", "--eos", "999"])
            .status
            .code(),
        Some(1)
    );
    // Audit stops with the error (exit 2) naming the file.
    let o = rlreplay(&["audit", d, "--eos", "999"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("step-0002.parquet"));
    let o = rlreplay(&["validate", "/nonexistent/data", "--eos", "999"]);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn show_a_row() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path(), "1000", "999");
    let d = dir.path().to_str().unwrap();
    let o = rlreplay(&[
        "show",
        d,
        "--step",
        "2",
        "--row",
        "5",
        "--eos",
        "999",
        "--tokenizer",
        "/nonexistent/tokenizer.json",
    ]);
    assert!(!o.status.success());
    let o = Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(["show", d, "--step", "2", "--row", "5", "--eos", "999"])
        .env("RLREPLAY_TOKENIZER", "/nonexistent/tokenizer.json")
        .output()
        .unwrap();
    // With an explicit default that does not exist, raw ids are shown.
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = stdout(&o);
    assert!(s.contains("step:        2   row: 5"), "{s}");
    assert!(s.contains("response ids"), "{s}");
    assert!(s.contains("log-probs:"), "{s}");
    let o = rlreplay(&["show", d, "--step", "2", "--row", "500", "--eos", "999"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("has 32 rows"));
}

#[test]
fn show_decodes_with_the_real_tokenizer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/qwen3/tokenizer.json");
    if !root.is_file() {
        eprintln!("skipped: run scripts/install-tokenizer.sh first");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path(), "151643", "151643");
    let d = dir.path().to_str().unwrap();
    let o = rlreplay(&[
        "show",
        d,
        "--row",
        "0",
        "--tokenizer",
        root.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = stdout(&o);
    assert!(
        s.contains("--- prompt ---") && s.contains("--- response ---"),
        "{s}"
    );
}

#[test]
fn synth_refuses_a_non_empty_out_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let shape = |prompts: &str, steps: &str| {
        vec![
            "synth",
            "--out",
            d,
            "--steps",
            steps,
            "--prompts",
            prompts,
            "--group",
            "4",
            "--mean-len",
            "10",
            "--max-len",
            "16",
            "--vocab",
            "100",
            "--eos",
            "99",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>()
    };
    let run = |args: &[String]| rlreplay(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let rows = || {
        let o = rlreplay(&["audit", d, "--json", "--eos", "99"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let summary: serde_json::Value =
            serde_json::from_str(stdout(&o).lines().last().unwrap()).unwrap();
        (
            summary["steps"].as_u64().unwrap(),
            summary["rows"].as_u64().unwrap(),
        )
    };
    assert!(run(&shape("16", "2")).status.success());
    assert_eq!(rows(), (2, 128));
    // 64 rows per step must not silently become 4 in step 1 (and a mixed dataset).
    let o = run(&shape("1", "1"));
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("is not empty") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(rows(), (2, 128));
    // Forced: the old shards are gone, the dataset is exactly the new one.
    let mut forced = shape("1", "1");
    forced.push("--force".into());
    assert!(run(&forced).status.success());
    assert_eq!(rows(), (1, 4));
    assert!(!dir.path().join("data/step-0002.parquet").exists());
}

#[test]
fn validate_reports_zero_row_shards() {
    let dir = tempfile::tempdir().unwrap();
    let path =
        rlreplay_data::write_shard(dir.path(), &rlreplay_data::RolloutBatch::empty(1)).unwrap();
    let d = dir.path().to_str().unwrap();
    let o = rlreplay(&["validate", d, "--eos", "1"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let out = stdout(&o);
    assert!(
        out.contains("empty_shard") && out.contains("holds no rows"),
        "{out}"
    );
    assert!(out.contains(&path.display().to_string()), "{out}");
    // Reading it for training fails with the same problem instead of an empty step.
    let err =
        rlreplay_data::read_shard(&path, 1, &rlreplay_data::ReadOptions::new([])).unwrap_err();
    assert!(format!("{err:#}").contains("holds no rows"), "{err:#}");
}

/// A hub download that fails says why in `validate` as in `audit`: the cause is not lost.
#[test]
fn a_failed_hub_download_names_its_cause() {
    use std::io::{BufRead, BufReader, Write};
    // A hub that lists one shard and answers 500 to everything else.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let mut reader = BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
            }
            let (status, body) = if line.contains("/api/") {
                (
                    "200 OK",
                    r#"{"sha":"0123456789abcdef0123456789abcdef01234567","siblings":[{"rfilename":"data/step-0001.parquet"}]}"#,
                )
            } else {
                ("500 Internal Server Error", "down")
            };
            let _ = write!(
                s,
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let home = tempfile::tempdir().unwrap();
    let run = |cmd: &str| {
        Command::new(env!("CARGO_BIN_EXE_rlreplay"))
            .args([cmd, "hf://datasets/a/b", "--eos", "1"])
            .env("HF_ENDPOINT", &endpoint)
            .env("HF_HOME", home.path())
            .output()
            .unwrap()
    };
    let audit = String::from_utf8_lossy(&run("audit").stderr).into_owned();
    assert!(audit.contains("answered 500"), "{audit}");
    let o = run("validate");
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    assert!(
        out.contains("downloading data/step-0001.parquet") && out.contains("answered 500"),
        "{out}"
    );
}

#[test]
fn hub_paths_with_a_query_are_refused_before_any_request() {
    // Nothing listens on the endpoint: a request would report it unreachable instead.
    let o = Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(["validate", "hf://datasets/a/b?x=1", "--eos", "1"])
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .env("HF_HOME", tempfile::tempdir().unwrap().path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    assert!(
        out.contains("invalid hub path") && out.contains("'?'"),
        "{out}"
    );
}

/// The end-of-sequence ids of the model-less commands come from `--eos`, else from the special
/// tokens of the `--tokenizer` (or model) directory, else from the dataset (every shard rlreplay
/// writes names them), else from the installed tokenizer; without any, truncation is unknown
/// and the rest is reported. No built-in id, and no tokenizer found around the working directory.
#[test]
fn end_of_sequence_ids_come_from_the_tokenizer_or_eos() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path(), "1000", "999");
    let d = dir.path().to_str().unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    std::fs::write(model.join("config.json"), r#"{"eos_token_id": [999, 7]}"#).unwrap();
    let m = model.to_str().unwrap();
    // The model directory's ids count truncated responses as --eos does.
    let by_flag = rlreplay(&["audit", d, "--json", "--eos", "999,7"]);
    let by_model = rlreplay(&["audit", d, "--json", "--tokenizer", m]);
    assert!(
        by_model.status.success(),
        "{}",
        String::from_utf8_lossy(&by_model.stderr)
    );
    assert_eq!(stdout(&by_flag), stdout(&by_model));
    let other = rlreplay(&["audit", d, "--json", "--eos", "7"]);
    assert_ne!(stdout(&other), stdout(&by_model), "the ids must matter");
    // The reports say which ids were used and where they came from.
    let o = rlreplay(&["validate", d, "--tokenizer", m]);
    assert!(o.status.success(), "{}", stdout(&o));
    assert!(
        stdout(&o).contains(&format!("end of sequence: 999, 7 (from {m})")),
        "{}",
        stdout(&o)
    );
    let o = rlreplay(&["audit", d, "--eos", "999"]);
    assert!(
        stdout(&o).contains("end of sequence: 999 (from --eos)"),
        "{}",
        stdout(&o)
    );
    // synth writes the first id the directory names.
    let again = tempfile::tempdir().unwrap();
    let o = rlreplay(&[
        "synth",
        "--out",
        again.path().to_str().unwrap(),
        "--steps",
        "1",
        "--prompts",
        "2",
        "--group",
        "2",
        "--vocab",
        "1000",
        "--tokenizer",
        m,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&format!("end of sequence: 999, from {m}")),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // A directory the user names that names none: an error naming the way out.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let o = rlreplay(&["validate", d, "--tokenizer", empty.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("names no end-of-sequence token") && err.contains("--eos"),
        "{err}"
    );
    // On a machine with no tokenizer anywhere (an empty home, no $RLREPLAY_TOKENIZER), even
    // from inside a checkout that has one: the dataset's own ids, for every command.
    let home = tempfile::tempdir().unwrap();
    let bare = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_rlreplay"))
            .args(args)
            .env_remove("RLREPLAY_TOKENIZER")
            .env_remove("XDG_CACHE_HOME")
            .env("HOME", home.path())
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap()
    };
    let named = "end of sequence: 999 (from the dataset; written by rlreplay synth)";
    for cmd in ["validate", "audit", "show"] {
        let o = bare(&[cmd, d]);
        assert!(
            o.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(stdout(&o).contains(named), "{cmd}: {}", stdout(&o));
    }
    let by_999 = rlreplay(&["audit", d, "--json", "--eos", "999"]);
    assert_eq!(stdout(&bare(&["audit", d, "--json"])), stdout(&by_999));
    // The dataset's ids come before the installed tokenizer's.
    let installed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/qwen3");
    let o = Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(["audit", d])
        .env("RLREPLAY_TOKENIZER", installed.join("tokenizer.json"))
        .output()
        .unwrap();
    assert!(stdout(&o).contains(named), "{}", stdout(&o));
    // A dataset that names none (written by another tool): truncation is unknown, the rest is
    // reported, and nothing fails.
    let foreign = tempfile::tempdir().unwrap();
    let mut b = rlreplay_data::RolloutBatch::empty(1);
    b.push_row(
        "u",
        &[1, 2],
        &[3, 4],
        &[-0.5, -0.5],
        1.0,
        None,
        None,
        None,
        None,
    );
    rlreplay_data::write_shard(foreign.path(), &b).unwrap();
    let f = foreign.path().to_str().unwrap();
    for cmd in ["validate", "audit", "show"] {
        let o = bare(&[cmd, f]);
        assert!(
            o.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            stdout(&o).contains("end of sequence: unknown") && stdout(&o).contains("--eos"),
            "{cmd}: {}",
            stdout(&o)
        );
    }
    let o = bare(&["audit", f, "--json"]);
    let last: serde_json::Value = serde_json::from_str(stdout(&o).lines().last().unwrap()).unwrap();
    assert!(last["truncated"].is_null() && last["rows"] == 1, "{last}");
    // The installed Qwen3 tokenizer names <|im_end|> and <|endoftext|>.
    if installed.join("tokenizer.json").is_file() {
        let o = Command::new(env!("CARGO_BIN_EXE_rlreplay"))
            .args(["audit", f])
            .env("RLREPLAY_TOKENIZER", installed.join("tokenizer.json"))
            .output()
            .unwrap();
        assert!(
            stdout(&o).contains("end of sequence: 151645, 151643"),
            "{}",
            stdout(&o)
        );
    } else {
        eprintln!("skipped the installed tokenizer: run scripts/install-tokenizer.sh first");
    }
}
