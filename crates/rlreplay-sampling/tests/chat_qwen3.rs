//! The Qwen3 chat template rendered with the real tokenizer files: texts and token ids as
//! Hugging Face `apply_chat_template` produces them.

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
