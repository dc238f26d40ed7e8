//! The training crate's typed errors: each says what failed (the configuration key, the file,
//! the dataset, the run directory) with the messages users see.

use std::path::Path;

use rlreplay_data::error::chain;
use rlreplay_train::{run, Config, Error, RunOptions, SourceKind};

const REPLAY: &str = r#"
[model.random]
vocab_size = 64
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 1
num_attention_heads = 4
num_key_value_heads = 2
head_dim = 8

[data]
path = "no/such/dataset"
eos_token_id = 1
"#;

fn replay(sets: &[&str]) -> rlreplay_train::Result<Config> {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    Config::parse(REPLAY, &sets, SourceKind::Logged)
}

#[test]
fn a_refused_value_names_its_key() {
    let e = replay(&["optim.lr=-1"]).unwrap_err();
    let Error::Config { key, message } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(key, "optim.lr");
    assert_eq!(
        message,
        "[optim] lr = -1: must be a finite non-negative number"
    );
    // An infinite value says so (it used to read as if it were negative).
    let e = replay(&["optim.lr=inf"]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "[optim] lr = inf: must be a finite non-negative number"
    );
    let e = replay(&["rollout.top_p=0"]).unwrap_err();
    assert!(
        matches!(&e, Error::Config { key, .. } if key == "rollout.top_p"),
        "{e:?}"
    );
}

#[test]
fn a_malformed_override_names_itself() {
    let e = replay(&["optim.lr"]).unwrap_err();
    let Error::Override { spec, message } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(
        (spec.as_str(), message.as_str()),
        ("optim.lr", "expected section.key=value")
    );
    assert_eq!(
        e.to_string(),
        "--set \"optim.lr\": expected section.key=value"
    );
}

#[test]
fn a_missing_config_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.toml");
    let e = Config::load(&path, &[], SourceKind::Logged).unwrap_err();
    let Error::ReadConfig { path: p, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(p, &path);
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, format!("{REPLAY}[optim]\nlr = -1\n")).unwrap();
    let e = Config::load(&bad, &[], SourceKind::Logged).unwrap_err();
    let Error::InConfig { path: p, source } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(p, &bad);
    assert!(matches!(**source, Error::Config { .. }), "{source:?}");
    assert_eq!(
        chain(&e),
        format!(
            "in config {}: [optim] lr = -1: must be a finite non-negative number",
            bad.display()
        )
    );
}

#[test]
fn a_missing_dataset_is_a_data_error_under_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let opts = RunOptions::new(replay(&[]).unwrap(), &dir.path().join("run"));
    let e = run(&opts).unwrap_err();
    let Error::Dataset { path, source } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(path, "no/such/dataset");
    assert!(
        matches!(**source, rlreplay_data::Error::NotFound { .. }),
        "{source:?}"
    );
    assert_eq!(
        chain(&e),
        "[data] path = \"no/such/dataset\": no/such/dataset: no such file or directory"
    );
}

#[test]
fn a_second_fresh_start_names_the_run_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("metrics.jsonl"), "{\"step\":1}\n").unwrap();
    let opts = RunOptions::new(replay(&[]).unwrap(), dir.path());
    let e = run(&opts).unwrap_err();
    assert!(
        matches!(&e, Error::ExistingRun { dir: d } if d == Path::new(dir.path())),
        "{e:?}"
    );
}
