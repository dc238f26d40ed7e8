//! The sampling crate's typed errors: what failed, the file it concerns, and the messages users see.

use std::error::Error as _;

use rlreplay_sampling::chat::ChatTemplate;
use rlreplay_sampling::sampling::SamplingParams;
use rlreplay_sampling::Error;

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
fn out_of_range_settings_name_the_setting() {
    let bad = |p: SamplingParams| p.validate().unwrap_err();
    let e = bad(SamplingParams {
        temperature: -1.0,
        ..Default::default()
    });
    assert!(matches!(e, Error::Temperature(t) if t == -1.0));
    assert_eq!(e.to_string(), "temperature must be >= 0, got -1");
    let e = bad(SamplingParams {
        top_p: 0.0,
        ..Default::default()
    });
    assert!(matches!(e, Error::TopP(_)));
    assert_eq!(e.to_string(), "top_p must be in (0, 1], got 0");
    let e = bad(SamplingParams {
        max_new_tokens: 0,
        ..Default::default()
    });
    assert!(matches!(e, Error::MaxNewTokens));
}

#[test]
fn tokenizer_config_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer_config.json");
    let e = ChatTemplate::from_tokenizer_config(&path).err().unwrap();
    assert!(
        matches!(&e, Error::Read { path: p, .. } if *p == path),
        "{e:?}"
    );
    assert!(e.source().is_some());

    std::fs::write(&path, "{").unwrap();
    let e = ChatTemplate::from_tokenizer_config(&path).err().unwrap();
    assert!(matches!(&e, Error::Json { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!("{} is not valid JSON", path.display())
    );

    std::fs::write(&path, "{}").unwrap();
    let e = ChatTemplate::from_tokenizer_config(&path).err().unwrap();
    assert!(matches!(&e, Error::NoChatTemplate { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!("{} has no `chat_template`", path.display())
    );

    std::fs::write(
        &path,
        r#"{"chat_template": [{"name": "tool_use", "template": ""}]}"#,
    )
    .unwrap();
    let e = ChatTemplate::from_tokenizer_config(&path).err().unwrap();
    assert!(matches!(&e, Error::NoDefaultTemplate { .. }), "{e:?}");

    std::fs::write(&path, r#"{"chat_template": 3}"#).unwrap();
    let e = ChatTemplate::from_tokenizer_config(&path).err().unwrap();
    assert!(matches!(&e, Error::TemplateType { .. }), "{e:?}");

    std::fs::write(&path, r#"{"chat_template": "{% if %}"}"#).unwrap();
    let e = ChatTemplate::from_tokenizer_config(&path).err().unwrap();
    let Error::InFile { path: p, source } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(*p, path);
    assert!(matches!(**source, Error::Compile(_)), "{source:?}");
    let msg = chain(&e);
    assert!(
        msg.starts_with(&format!(
            "in {}: chat template does not compile: ",
            path.display()
        )),
        "{msg}"
    );
}

#[test]
fn a_missing_tokenizer_names_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let e = rlreplay_sampling::chat::ChatTokenizer::from_dir(dir.path())
        .err()
        .unwrap();
    let Error::LoadTokenizer { path, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(*path, dir.path().join("tokenizer.json"));
    assert!(e
        .to_string()
        .starts_with(&format!("loading {}: ", path.display())));
}
