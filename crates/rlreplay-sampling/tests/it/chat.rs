//! Real chat templates and tokenizers — Qwen3's tokenizer files, and SmolLM2-135M-Instruct's as
//! `rlreplay convert` builds them from its GGUF — against what Hugging Face `apply_chat_template`
//! and the tokenizer produce.

use std::path::PathBuf;

use rlreplay_sampling::chat::{ChatOptions, ChatTokenizer, Message};

fn qwen3() -> ChatTokenizer {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/qwen3");
    ChatTokenizer::from_dir(&dir)
        .expect("the Qwen3 tokenizer files (run scripts/install-tokenizer.sh)")
}

const GEN: ChatOptions = ChatOptions {
    add_generation_prompt: true,
    enable_thinking: None,
};

#[test]
fn user_only_default_thinking() {
    let t = qwen3();
    let msgs = [Message::user("What is 1+1?")];
    let text = t.template.render(&msgs, GEN).unwrap();
    assert_eq!(
        text,
        "<|im_start|>user\nWhat is 1+1?<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        t.encode(&msgs, GEN).unwrap(),
        [151644, 872, 198, 3838, 374, 220, 16, 10, 16, 30, 151645, 198, 151644, 77091, 198]
    );
}

#[test]
fn system_user_without_thinking() {
    let t = qwen3();
    let msgs = [Message::system("Be brief."), Message::user("What is 1+1?")];
    let opts = ChatOptions {
        add_generation_prompt: true,
        enable_thinking: Some(false),
    };
    let text = t.template.render(&msgs, opts).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 1+1?<|im_end|>\n\
         <|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    assert_eq!(
        t.encode(&msgs, opts).unwrap(),
        [
            151644, 8948, 198, 3430, 9814, 13, 151645, 198, 151644, 872, 198, 3838, 374, 220, 16,
            10, 16, 30, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271
        ]
    );
    // Thinking explicitly enabled renders like the default.
    let on = ChatOptions {
        add_generation_prompt: true,
        enable_thinking: Some(true),
    };
    assert!(t
        .template
        .render(&msgs, on)
        .unwrap()
        .ends_with("<|im_start|>assistant\n"));
}

#[test]
fn history_thinking_is_stripped_before_the_last_query() {
    let t = qwen3();
    let mut msgs = vec![
        Message::system("Be brief."),
        Message::user("What is 1+1?"),
        Message::new("assistant", "<think>\nhmm\n</think>\n\n2"),
    ];
    let no_gen = ChatOptions {
        add_generation_prompt: false,
        enable_thinking: None,
    };
    assert_eq!(
        t.template.render(&msgs, no_gen).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 1+1?<|im_end|>\n\
         <|im_start|>assistant\n<think>\nhmm\n</think>\n\n2<|im_end|>\n"
    );
    msgs.push(Message::user("And 2+2?"));
    assert_eq!(
        t.template.render(&msgs, GEN).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 1+1?<|im_end|>\n\
         <|im_start|>assistant\n2<|im_end|>\n<|im_start|>user\nAnd 2+2?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
}

#[test]
fn polaris_instruction_keeps_double_braces() {
    let t = qwen3();
    let q = "Find x.\nPlease reason step by step, and put your final answer within \\boxed{{}}.";
    let ids = t.encode(&[Message::user(q)], GEN).unwrap();
    // ` \boxed{{}}.` then `<|im_end|>\n<|im_start|>assistant\n`.
    assert_eq!(
        ids[ids.len() - 10..],
        [1124, 79075, 2979, 3417, 13, 151645, 198, 151644, 77091, 198]
    );
    assert_eq!(
        t.decode(&ids, false).unwrap(),
        t.template.render(&[Message::user(q)], GEN).unwrap()
    );
}

/// SmolLM2-135M-Instruct converted from its GGUF (`scripts/install-smollm2.sh`; required in CI,
/// skipped elsewhere when absent), with transformers' reference values of the same GGUF.
fn smollm2() -> Option<(ChatTokenizer, serde_json::Value)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::var_os("RLREPLAY_SMOLLM2")
        .map_or_else(|| root.join("models/smollm2-135m-instruct"), PathBuf::from);
    if !dir.join("tokenizer.json").is_file() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{}: SmolLM2 is not installed (scripts/install-smollm2.sh)",
            dir.display()
        );
        eprintln!("skipped: {} is not installed", dir.display());
        return None;
    }
    let reference = root.join("crates/rlreplay-model/tests/fixtures/smollm2_reference.json");
    let reference = serde_json::from_str(&std::fs::read_to_string(reference).unwrap()).unwrap();
    Some((ChatTokenizer::from_dir(&dir).unwrap(), reference))
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn smollm2_tokenizer_matches_transformers_gguf_tokenizer() {
    let Some((t, r)) = smollm2() else { return };
    for case in r["tokenizer"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let got = t.encode_text(text).unwrap();
        assert_eq!(got, ids(&case["ids"]), "{text:?}");
        assert_eq!(t.decode(&got, false).unwrap(), case["decoded"], "{text:?}");
    }
}

#[test]
fn smollm2_chat_template_matches_transformers() {
    let Some((t, r)) = smollm2() else { return };
    let chat = &r["chat"];
    let msgs: Vec<Message> = chat["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    let text = t.template.render(&msgs, GEN).unwrap();
    assert_eq!(text, chat["text"].as_str().unwrap());
    assert_eq!(t.encode(&msgs, GEN).unwrap(), ids(&chat["ids"]));
}
