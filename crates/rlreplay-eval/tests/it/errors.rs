//! The evaluation crate's typed errors: the file, line or row, and column of bad input, with the
//! messages users see.

use rlreplay_eval::dataset::read_prompts;
use rlreplay_eval::metrics::{evaluate, PromptSamples, ResponseShape};
use rlreplay_eval::Error;

/// The message with its causes, as the binary prints it.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

#[test]
fn a_bad_json_line_names_the_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.jsonl");
    std::fs::write(&p, "{\"prompt\": \"a\"}\n\n{\"prompt\": 5}\n").unwrap();
    let e = read_prompts(&p).unwrap_err();
    let Error::Line { path, line, source } = &e else {
        panic!("{e:?}")
    };
    assert_eq!((path, *line), (&p, 3));
    assert!(
        matches!(
            **source,
            Error::ColumnType {
                column: "prompt",
                ..
            }
        ),
        "{source:?}"
    );
    assert_eq!(
        chain(&e),
        format!(
            "{}: line 3: column `prompt`: expected a string or a list of messages, found 5",
            p.display()
        )
    );

    std::fs::write(&p, "{\"prompt\": \n").unwrap();
    let e = read_prompts(&p).unwrap_err();
    assert!(matches!(e, Error::LineJson { line: 1, .. }), "{e:?}");
    assert!(chain(&e).starts_with(&format!("{}: line 1: not valid JSON: ", p.display())));

    std::fs::write(&p, "{\"messages\": [{\"role\": \"user\"}]}\n").unwrap();
    let e = read_prompts(&p).unwrap_err();
    assert!(
        chain(&e).ends_with(
            "line 1: column `messages`: message 0 has no string `content`: {\"role\":\"user\"}"
        ),
        "{}",
        chain(&e)
    );
}

#[test]
fn file_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("none.jsonl");
    let e = read_prompts(&missing).unwrap_err();
    assert!(
        matches!(&e, Error::Open { path, .. } if *path == missing),
        "{e:?}"
    );
    assert!(chain(&e).starts_with(&format!("opening {}: ", missing.display())));

    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "\n").unwrap();
    let e = read_prompts(&empty).unwrap_err();
    assert!(matches!(e, Error::NoPrompts { .. }), "{e:?}");
    assert_eq!(e.to_string(), format!("{}: no prompts", empty.display()));

    let not_parquet = dir.path().join("x.parquet");
    std::fs::write(&not_parquet, "not parquet").unwrap();
    let e = read_prompts(&not_parquet).unwrap_err();
    assert!(matches!(e, Error::NotParquet { .. }), "{e:?}");
    assert!(chain(&e).starts_with(&format!(
        "{} is not a readable Parquet file: ",
        not_parquet.display()
    )));
}

#[test]
fn metrics_refuse_ragged_samples() {
    let prompt = |n: usize| PromptSamples {
        data_source: "s".to_owned(),
        rewards: vec![1.0; n],
        answers: vec![Some(1); n],
        shapes: vec![ResponseShape::default(); n],
    };
    let e = evaluate::<i32>(&[], 0.5, |a, b| a == b).unwrap_err();
    assert!(matches!(e, Error::NoSamples));
    let e = evaluate(&[prompt(2), prompt(3)], 0.5, |a, b| a == b).unwrap_err();
    assert!(matches!(
        e,
        Error::SampleCount {
            prompt: 1,
            rewards: 3,
            answers: 3,
            shapes: 3,
            expected: 2
        }
    ));
    assert_eq!(
        e.to_string(),
        "prompt 1: 3 rewards, 3 answers and 3 response shapes, expected 2 of each"
    );
}
