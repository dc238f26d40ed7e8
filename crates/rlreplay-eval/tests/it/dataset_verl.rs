//! Reading a validation set in verl's Parquet layout (fixture written by
//! `fixtures/make_verl_fixture.py`).

use std::path::PathBuf;

use rlreplay_eval::dataset::read_prompts;
use rlreplay_sampling::chat::Message;

#[test]
fn reads_verl_parquet() {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/verl_val.parquet");
    let items = read_prompts(&p).unwrap();
    assert_eq!(items.len(), 4);
    let sources: Vec<&str> = items.iter().map(|i| i.data_source.as_str()).collect();
    assert_eq!(sources, ["aime25", "aime25", "minerva", "sciknoweval"]);
    assert_eq!(items[2].ground_truth.as_deref(), Some("\\frac{1}{2}"));
    assert_eq!(items[1].index, 1);
    assert_eq!(
        items[0].messages,
        [Message::user(
            "What is 2+3?\nPlease reason step by step, and put your final answer within \\boxed{{}}."
        )]
    );
    assert_eq!(items[3].messages.len(), 2);
    assert_eq!(items[3].messages[0].role, "system");
    assert_eq!(items[3].ground_truth.as_deref(), Some("B"));
}

#[test]
fn not_parquet_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.parquet");
    std::fs::write(&p, b"not parquet").unwrap();
    let err = format!("{:#}", read_prompts(&p).unwrap_err());
    assert!(err.contains("bad.parquet"), "{err}");
}
