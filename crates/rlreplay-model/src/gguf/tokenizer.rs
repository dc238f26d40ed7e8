//! `tokenizer.json` and `tokenizer_config.json` from a GGUF file's byte-level BPE vocabulary
//! (`tokenizer.ggml.model = "gpt2"`).
//!
//! The vocabulary, merges and token types come from the file; the normalizer and pre-tokenizer
//! from the name `tokenizer.ggml.pre` gives them, following the model's own `tokenizer.json`
//! where it is known, else llama.cpp's `llama-vocab.cpp`:
//!
//! - `smollm`: `Digits` (one digit per piece) then `ByteLevel` with the GPT-2 regex, as
//!   SmolLM2's `tokenizer.json` has it and as llama.cpp splits (`\p{N}`, then the GPT-2 regex).
//!   transformers' GGUF loader knows no `smollm` and falls back to `ByteLevel` alone; that gives
//!   the same ids only because the vocabulary has no multi-digit token and no space-digit token,
//!   so the model's own pre-tokenizer is written.
//! - `qwen2`, `deepseek-r1-qwen`: `NFC`, then Qwen2's split regex (isolated) and `ByteLevel`
//!   without its regex, as Qwen2's `tokenizer.json` has it (llama.cpp and transformers' GGUF
//!   loader skip the `NFC`; it only changes text that is not already NFC).
//! - `llama-bpe`, `llama3`, `llama-v3`: Llama 3's split regex, then `ByteLevel` without its regex.
//! - `gpt2`, `gpt-2`: `ByteLevel` with the GPT-2 regex.
//! - `default` (or no `tokenizer.ggml.pre`): llama.cpp's default, four regexes applied in turn
//!   (transformers' loader uses `ByteLevel` alone here, as for `gpt2`).
//!
//! Tokens of type 3 (control) become special added tokens, of type 4 (user-defined) plain added
//! tokens, both matched whole in the text. Like transformers' loader, an ordinary token that is
//! not spelled in the byte-level alphabet is re-spelled from its UTF-8 bytes.

use serde_json::{json, Map, Value};

use super::Meta;
use crate::Result;

/// Control tokens (`tokenizer.ggml.token_type` 3): special added tokens.
const CONTROL: i64 = 3;
/// User-defined tokens (type 4): added tokens that are not special.
const USER_DEFINED: i64 = 4;

/// The GPT-2 pre-tokenizer regex (as llama.cpp writes it).
const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Qwen2's split regex, as in its `tokenizer.json`.
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's split regex, as in its `tokenizer.json`.
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// llama.cpp's default BPE pre-tokenization: these regexes, each splitting the pieces of the last.
const DEFAULT_REGEXES: [&str; 4] = [
    r"[\p{P}\$\+<=>\^~\|]+",
    GPT2_REGEX,
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
];

/// The pre-tokenizer names accepted, for errors.
const KNOWN_PRE: &str =
    "smollm, qwen2, deepseek-r1-qwen, llama-bpe, llama3, llama-v3, gpt2, gpt-2, default";

/// The tokenizer files, and what the summary reports of them.
pub(crate) struct TokenizerFiles {
    /// `tokenizer.json`.
    pub tokenizer: Value,
    /// `tokenizer_config.json`.
    pub config: Value,
    /// The `tokenizer.ggml.pre` name used.
    pub pre: String,
    /// Number of tokens.
    pub tokens: usize,
    /// Number of merges.
    pub merges: usize,
}

/// The character byte `b` is spelled as in a byte-level BPE vocabulary (GPT-2's
/// `bytes_to_unicode`): printable Latin-1 bytes as themselves, the other 68 as U+0100 onwards.
pub(super) fn byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(0x100 + rank).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// Whether `c` is a character of the byte-level alphabet.
fn in_byte_alphabet(c: char) -> bool {
    matches!(u32::from(c), 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0x143)
}

fn byte_level(add_prefix_space: bool, trim_offsets: bool, use_regex: bool) -> Value {
    json!({
        "type": "ByteLevel",
        "add_prefix_space": add_prefix_space,
        "trim_offsets": trim_offsets,
        "use_regex": use_regex
    })
}

fn split(regex: &str) -> Value {
    json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false})
}

/// The normalizer and pre-tokenizer of a `tokenizer.ggml.pre` name.
fn pre_tokenizer(meta: &Meta, pre: &str) -> Result<(Value, Value)> {
    Ok(match pre {
        "smollm" => (
            Value::Null,
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                byte_level(false, true, true),
            ]}),
        ),
        "qwen2" | "deepseek-r1-qwen" => (
            json!({"type": "NFC"}),
            json!({"type": "Sequence", "pretokenizers": [
                split(QWEN2_REGEX),
                byte_level(false, false, false),
            ]}),
        ),
        "llama-bpe" | "llama3" | "llama-v3" => (
            Value::Null,
            json!({"type": "Sequence", "pretokenizers": [
                split(LLAMA3_REGEX),
                byte_level(false, true, false),
            ]}),
        ),
        "gpt2" | "gpt-2" => (Value::Null, byte_level(false, true, true)),
        "default" => {
            let mut steps: Vec<Value> = DEFAULT_REGEXES.iter().map(|r| split(r)).collect();
            steps.push(byte_level(false, true, false));
            (
                Value::Null,
                json!({"type": "Sequence", "pretokenizers": steps}),
            )
        }
        other => {
            return Err(meta.err(format!(
                "tokenizer.ggml.pre = {other:?} is not supported (supported: {KNOWN_PRE})"
            )))
        }
    })
}

/// Builds the tokenizer files from the metadata. `context` is the model's context length
/// (`model_max_length`).
pub(crate) fn tokenizer_files(meta: &Meta, context: usize) -> Result<TokenizerFiles> {
    let model = meta
        .str("tokenizer.ggml.model")?
        .ok_or_else(|| meta.err("tokenizer.ggml.model is missing"))?;
    if model != "gpt2" {
        return Err(meta.err(format!(
            "tokenizer.ggml.model = {model:?} is not supported (only \"gpt2\", byte-level BPE)"
        )));
    }
    let tokens = meta
        .str_array("tokenizer.ggml.tokens")?
        .ok_or_else(|| meta.err("tokenizer.ggml.tokens is missing"))?;
    if tokens.is_empty() {
        return Err(meta.err("tokenizer.ggml.tokens is empty"));
    }
    let types = match meta.int_array("tokenizer.ggml.token_type")? {
        Some(t) if t.len() != tokens.len() => {
            return Err(meta.err(format!(
                "tokenizer.ggml.token_type has {} entries for {} tokens",
                t.len(),
                tokens.len()
            )))
        }
        Some(t) => t,
        None => vec![1; tokens.len()],
    };
    let pre = meta.str("tokenizer.ggml.pre")?.unwrap_or("default");
    let (normalizer, pre_tokenizer) = pre_tokenizer(meta, pre)?;

    let mut vocab = Map::new();
    let mut added = Vec::new();
    for (id, (&token, &kind)) in tokens.iter().zip(&types).enumerate() {
        let added_token = kind == CONTROL || kind == USER_DEFINED;
        let spelled = if added_token || token.chars().all(in_byte_alphabet) {
            token.to_string()
        } else {
            token.bytes().map(byte_char).collect()
        };
        if added_token {
            added.push(json!({
                "id": id,
                "content": token,
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": kind == CONTROL,
            }));
        }
        vocab.insert(spelled, id.into());
    }

    let merges_in = meta
        .str_array("tokenizer.ggml.merges")?
        .ok_or_else(|| meta.err("tokenizer.ggml.merges is missing"))?;
    let mut merges = Vec::with_capacity(merges_in.len());
    for (i, m) in merges_in.iter().enumerate() {
        let pair = m
            .split_once(' ')
            .filter(|(a, b)| !a.is_empty() && !b.is_empty() && !b.contains(' '));
        let Some((a, b)) = pair else {
            return Err(meta.err(format!(
                "tokenizer.ggml.merges[{i}] = {m:?} is not two tokens separated by a space"
            )));
        };
        for part in [a, b] {
            if !vocab.contains_key(part) {
                return Err(meta.err(format!(
                    "tokenizer.ggml.merges[{i}] = {m:?} names {part:?}, which is not a token"
                )));
            }
        }
        merges.push(json!([a, b]));
    }

    let token_of = |key: &str| -> Result<Option<&str>> {
        let key = format!("tokenizer.ggml.{key}");
        match meta.u64(&key)? {
            None => Ok(None),
            Some(id) => usize::try_from(id)
                .ok()
                .and_then(|i| tokens.get(i).copied())
                .map(Some)
                .ok_or_else(|| {
                    meta.err(format!(
                        "{key} = {id} is outside the {} tokens",
                        tokens.len()
                    ))
                }),
        }
    };
    let bos = token_of("bos_token_id")?;
    let eos = token_of("eos_token_id")?;
    let unk = token_of("unknown_token_id")?;
    let pad = token_of("padding_token_id")?;
    let add_bos = meta.bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false);
    let add_eos = meta.bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let post_processor = template(
        add_bos.then_some(bos).flatten(),
        add_eos.then_some(eos).flatten(),
        &vocab,
    )
    .unwrap_or_else(|| byte_level(true, false, true));

    let n_merges = merges.len();
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": byte_level(true, true, true),
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": merges,
        },
    });

    let mut decoder = Map::new();
    for t in &added {
        let mut entry = t.clone();
        if let Value::Object(e) = &mut entry {
            e.remove("id");
        }
        decoder.insert(t["id"].to_string(), entry);
    }
    let mut config = json!({
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "add_prefix_space": false,
        "added_tokens_decoder": decoder,
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "unk_token": unk,
        "clean_up_tokenization_spaces": false,
        "model_max_length": context,
        "tokenizer_class": "PreTrainedTokenizerFast",
    });
    if let (Some(template), Value::Object(c)) = (meta.str("tokenizer.chat_template")?, &mut config)
    {
        c.insert("chat_template".into(), template.into());
    }
    Ok(TokenizerFiles {
        tokenizer,
        config,
        pre: pre.to_string(),
        tokens: tokens.len(),
        merges: n_merges,
    })
}

/// A post-processor adding `bos` before and `eos` after each sequence (when given), as
/// `tokenizer.ggml.add_bos_token` / `add_eos_token` ask.
fn template(bos: Option<&str>, eos: Option<&str>, vocab: &Map<String, Value>) -> Option<Value> {
    if bos.is_none() && eos.is_none() {
        return None;
    }
    let special = |t: &str, type_id: u32| json!({"SpecialToken": {"id": t, "type_id": type_id}});
    let seq = |s: &str, type_id: u32| json!({"Sequence": {"id": s, "type_id": type_id}});
    let wrap = |s: &str, type_id: u32| -> Vec<Value> {
        let mut out: Vec<Value> = bos.map(|t| special(t, type_id)).into_iter().collect();
        out.push(seq(s, type_id));
        out.extend(eos.map(|t| special(t, type_id)));
        out
    };
    let single = wrap("A", 0);
    let mut pair = wrap("A", 0);
    pair.extend(wrap("B", 1));
    let mut specials = Map::new();
    for t in bos.into_iter().chain(eos) {
        let id = vocab.get(t)?.clone();
        specials.insert(t.to_string(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    Some(json!({
        "type": "TemplateProcessing",
        "single": single,
        "pair": pair,
        "special_tokens": specials,
    }))
}
