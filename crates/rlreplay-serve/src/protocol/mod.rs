//! The request and response bodies rlreplay serves (and, as a client, sends and reads): the
//! vLLM / OpenAI completions subset used for RL ([`openai`]), SGLang's native generate API
//! ([`sglang`]) and the weight-update and pause endpoints ([`control`]).
//!
//! Requests reject unknown fields and fields this server cannot honour with an error naming the
//! field; responses carry every field of the documented shapes (absent values as `null`, as the
//! reference servers write them).

/// Declares a request body with, after its own fields, the sampling fields vLLM's completions
/// request and SGLang's `sampling_params` share (the same names, meanings and checks), and their
/// checks: [`check_unsupported`](openai::CompletionRequest::check_unsupported) and
/// [`sample_spec`](openai::CompletionRequest::sample_spec).
macro_rules! sampling_request {
    (
        $(#[$meta:meta])*
        pub struct $name:ident { $($fields:tt)* }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $($fields)*
            /// Samples per prompt (default 1).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub n: Option<usize>,
            /// Sampling temperature (default 1; 0 is greedy).
            #[serde(default, deserialize_with = "opt_f32", skip_serializing_if = "Option::is_none")]
            pub temperature: Option<f32>,
            /// Nucleus mass (default 1).
            #[serde(default, deserialize_with = "opt_f32", skip_serializing_if = "Option::is_none")]
            pub top_p: Option<f32>,
            /// Keep the k most likely tokens (0 or -1: all).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub top_k: Option<i64>,
            /// Only 0 (off) is supported.
            #[serde(default, deserialize_with = "opt_f32", skip_serializing_if = "Option::is_none")]
            pub min_p: Option<f32>,
            /// Stop strings: only empty is supported.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub stop: Option<Value>,
            /// Extra stop token ids (the model's end-of-sequence ids always stop unless
            /// `ignore_eos`).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub stop_token_ids: Option<Vec<u32>>,
            /// Do not stop on the model's end-of-sequence ids.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub ignore_eos: Option<bool>,
            /// Drop special tokens from `text` (default true).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub skip_special_tokens: Option<bool>,
            /// Only 0 is supported.
            #[serde(default, deserialize_with = "opt_f32", skip_serializing_if = "Option::is_none")]
            pub frequency_penalty: Option<f32>,
            /// Only 0 is supported.
            #[serde(default, deserialize_with = "opt_f32", skip_serializing_if = "Option::is_none")]
            pub presence_penalty: Option<f32>,
            /// Only 1 is supported.
            #[serde(default, deserialize_with = "opt_f32", skip_serializing_if = "Option::is_none")]
            pub repetition_penalty: Option<f32>,
        }

        impl $name {
            /// Refuses stop strings and non-neutral penalties, naming the field after `prefix`.
            pub fn check_unsupported(&self, prefix: &str) -> Result<(), FieldError> {
                no_stop_strings(&self.stop).map_err(|m| FieldError::new(format!("{prefix}stop"), m))?;
                neutral_only(
                    prefix,
                    [
                        self.frequency_penalty,
                        self.presence_penalty,
                        self.repetition_penalty,
                        self.min_p,
                    ],
                )
            }

            /// The sampling of each sample of a prompt, checked against `limits`; an error names
            /// the field after `prefix`.
            pub fn sample_spec(
                &self,
                prefix: &str,
                limits: &crate::request::Limits,
                seed: Option<u64>,
                max_new_tokens: usize,
                first_stream: u64,
            ) -> Result<crate::request::SampleSpec, FieldError> {
                crate::request::SampleSpec::new(
                    limits,
                    self.temperature,
                    self.top_p,
                    self.top_k,
                    seed,
                    max_new_tokens,
                    self.stop_token_ids.clone().unwrap_or_default(),
                    self.ignore_eos.unwrap_or(false),
                    first_stream,
                )
                .map_err(|(name, m)| FieldError::new(format!("{prefix}{name}"), m))
            }
        }
    };
}

pub mod control;
pub mod openai;
pub mod sglang;

use serde::de::{Deserializer, Error as _};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A prompt, or a batch of prompts, as token ids or text.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// One prompt as token ids.
    Ids(Vec<u32>),
    /// Several prompts as token ids.
    Batch(Vec<Vec<u32>>),
    /// One prompt as text.
    Text(String),
    /// Several prompts as text.
    Texts(Vec<String>),
}

impl Prompt {
    /// Whether the prompt was given as one prompt (not a list of prompts).
    pub fn is_single(&self) -> bool {
        matches!(self, Self::Ids(_) | Self::Text(_))
    }

    /// The number of prompts.
    pub fn len(&self) -> usize {
        match self {
            Self::Ids(_) | Self::Text(_) => 1,
            Self::Batch(b) => b.len(),
            Self::Texts(t) => t.len(),
        }
    }

    /// Whether it is an empty list of prompts.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Serialize for Prompt {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Ids(v) => v.serialize(s),
            Self::Batch(v) => v.serialize(s),
            Self::Text(v) => v.serialize(s),
            Self::Texts(v) => v.serialize(s),
        }
    }
}

/// A token id from a JSON value, with the error naming its position.
fn token_id(v: &Value, at: &str) -> Result<u32, String> {
    v.as_u64()
        .and_then(|t| u32::try_from(t).ok())
        .ok_or_else(|| format!("{at}: token ids are integers in 0..2^32, got {v}"))
}

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        let bad = || {
            D::Error::custom(
                "expected token ids ([int] or [[int]]) or text (a string or a list of strings)",
            )
        };
        match &v {
            Value::String(s) => Ok(Self::Text(s.clone())),
            Value::Array(items) if items.is_empty() => Err(D::Error::custom("the prompt is empty")),
            Value::Array(items) => match &items[0] {
                Value::Number(_) => items
                    .iter()
                    .enumerate()
                    .map(|(i, t)| token_id(t, &format!("[{i}]")))
                    .collect::<Result<_, _>>()
                    .map(Self::Ids)
                    .map_err(D::Error::custom),
                Value::Array(_) => items
                    .iter()
                    .enumerate()
                    .map(|(p, ids)| match ids {
                        Value::Array(ids) => ids
                            .iter()
                            .enumerate()
                            .map(|(i, t)| token_id(t, &format!("[{p}][{i}]")))
                            .collect::<Result<Vec<_>, _>>(),
                        other => Err(format!("[{p}]: expected a list of token ids, got {other}")),
                    })
                    .collect::<Result<_, _>>()
                    .map(Self::Batch)
                    .map_err(D::Error::custom),
                Value::String(_) => items
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        s.as_str()
                            .map(str::to_owned)
                            .ok_or_else(|| format!("[{i}]: expected a string, got {s}"))
                    })
                    .collect::<Result<_, _>>()
                    .map(Self::Texts)
                    .map_err(D::Error::custom),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }
}

/// One value, or one per prompt (SGLang's batched fields).
#[derive(Debug, Clone, PartialEq)]
pub enum OneOrMany<T> {
    /// The same value for every prompt.
    One(T),
    /// One value per prompt.
    Many(Vec<T>),
}

impl<T: Clone> OneOrMany<T> {
    /// The value for prompt `i` of `count`, or an error when a list has the wrong length.
    pub fn get(&self, i: usize, count: usize) -> Result<T, String> {
        match self {
            Self::One(v) => Ok(v.clone()),
            Self::Many(v) if v.len() == count => Ok(v[i].clone()),
            Self::Many(v) => Err(format!("has {} entries for {count} prompts", v.len())),
        }
    }
}

impl<T: Serialize> Serialize for OneOrMany<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::One(v) => v.serialize(s),
            Self::Many(v) => v.serialize(s),
        }
    }
}

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for OneOrMany<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::Array(items) => items
                .into_iter()
                .enumerate()
                .map(|(i, v)| from_value(v).map_err(|e| format!("[{i}]: {e}")))
                .collect::<Result<_, _>>()
                .map(Self::Many)
                .map_err(D::Error::custom),
            v => from_value(v).map(Self::One).map_err(D::Error::custom),
        }
    }
}

/// Reads `T` from `v`; an error names the offending field (`temperature: ...`) unless serde's
/// message already does (unknown and missing fields, which [`parse_body`] turns into the param).
fn from_value<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, String> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let msg = e.into_inner().to_string();
        if path == "." || named_field(&msg).is_some() {
            msg
        } else {
            format!("{path}: {msg}")
        }
    })
}

/// An ordered map of token (string) to log-prob, as vLLM writes `top_logprobs` entries: the
/// sampled token first, then the most likely tokens by rank.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopLogprobs(pub Vec<(String, f32)>);

impl Serialize for TopLogprobs {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Keys repeat when the sampled token is also among the most likely: keep the first.
        let mut seen = std::collections::HashSet::new();
        let unique: Vec<_> = self.0.iter().filter(|(k, _)| seen.insert(k)).collect();
        let mut m = s.serialize_map(Some(unique.len()))?;
        for (k, v) in unique {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for TopLogprobs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = TopLogprobs;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of token to log-prob")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<TopLogprobs, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = a.next_entry::<String, f32>()? {
                    out.push((k, v));
                }
                Ok(TopLogprobs(out))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// An optional 32-bit float field: JSON numbers beyond `f32`'s range are refused with their value
/// and the limit, not turned into infinity.
pub(crate) fn opt_f32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f32>, D::Error> {
    match Option::<f64>::deserialize(d)? {
        None => Ok(None),
        // Rounds to the nearest f32; only values beyond its range become infinite.
        Some(v) if (v as f32).is_finite() => Ok(Some(v as f32)),
        Some(v) => Err(D::Error::custom(format!(
            "{v:e} is beyond the largest value this field holds (a 32-bit float), {:e}",
            f32::MAX
        ))),
    }
}

/// An integer field that older OpenAI clients send as a boolean (`true` = 1, `false` = 0), as
/// pydantic accepts it.
pub(crate) fn int_or_bool<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(u32::from(b))),
        Some(v) => v
            .as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .map(Some)
            .ok_or_else(|| D::Error::custom(format!("expected a non-negative integer, got {v}"))),
    }
}

/// Stop strings: only an absent or empty value is accepted (this server stops on token ids).
pub(crate) fn no_stop_strings(v: &Option<Value>) -> Result<(), String> {
    match v {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(s)) if s.is_empty() => Ok(()),
        Some(Value::Array(a)) if a.is_empty() => Ok(()),
        Some(_) => {
            Err("stop strings are not supported; stop on token ids with stop_token_ids".into())
        }
    }
}

/// Key of the extension arguments (`vllm_xargs`, SGLang's `custom_params`) that shifts the random
/// streams of a request (see [`crate::request::SampleSpec::first_stream`]).
pub const STREAM_OFFSET_KEY: &str = "sample_stream_offset";

/// The stream offset of a request's extension arguments (0 without); other keys are rejected.
pub(crate) fn stream_offset(
    args: Option<&serde_json::Map<String, Value>>,
    param: &str,
) -> Result<u64, FieldError> {
    let mut offset = 0;
    for (k, v) in args.into_iter().flatten() {
        let param = format!("{param}.{k}");
        if k != STREAM_OFFSET_KEY {
            return Err(FieldError::new(
                param,
                format!("unknown extension argument (supported: {STREAM_OFFSET_KEY})"),
            ));
        }
        offset = v.as_u64().ok_or_else(|| {
            FieldError::new(&param, format!("expected a non-negative integer, got {v}"))
        })?;
    }
    Ok(offset)
}

/// Checks that `frequency_penalty`, `presence_penalty`, `repetition_penalty` and `min_p` (in
/// that order, under `prefix`) are absent or at their neutral value: this server applies none.
pub(crate) fn neutral_only(prefix: &str, values: [Option<f32>; 4]) -> Result<(), FieldError> {
    let names = [
        ("frequency_penalty", 0.0),
        ("presence_penalty", 0.0),
        ("repetition_penalty", 1.0),
        ("min_p", 0.0),
    ];
    for ((name, neutral), v) in names.into_iter().zip(values) {
        if let Some(v) = v.filter(|&v| v != neutral) {
            return Err(FieldError::new(
                format!("{prefix}{name}"),
                format!("only {neutral} is supported, got {v}"),
            ));
        }
    }
    Ok(())
}

/// A validation failure of one request field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The offending field (dotted path).
    pub param: String,
    /// What is wrong with it.
    pub message: String,
}

impl FieldError {
    /// An error of field `param`.
    pub fn new(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            param: param.into(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.param, self.message)
    }
}

/// Parses a JSON body into `T`, naming the offending field in the error (`sampling_params.top_p`)
/// or `body` for malformed JSON.
pub fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, FieldError> {
    // serde also reads structs from arrays (fields by position): only objects are requests.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(FieldError::new("body", "expected a JSON object"));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let parsed = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let msg = inner.to_string();
        let param = if inner.is_syntax() || inner.is_eof() {
            "body".to_owned()
        } else {
            // Unknown and missing fields are reported at the level of their object.
            // (The path of an unknown field already ends with it; a missing one's does not.)
            match (path.as_str(), named_field(&msg)) {
                (".", Some(f)) => f,
                (".", None) => "body".to_owned(),
                (p, Some(f)) if p != f && !p.ends_with(&format!(".{f}")) => format!("{p}.{f}"),
                (p, _) => p.to_owned(),
            }
        };
        FieldError::new(param, msg)
    })?;
    de.end().map_err(|e| {
        FieldError::new(
            "body",
            format!("trailing characters after the JSON value: {e}"),
        )
    })?;
    Ok(parsed)
}

/// The field named by serde's "unknown field `x`" or "missing field `x`" messages.
fn named_field(msg: &str) -> Option<String> {
    let rest = msg
        .strip_prefix("unknown field `")
        .or_else(|| msg.strip_prefix("missing field `"))?;
    Some(rest[..rest.find('`')?].to_owned())
}

/// The `f32` log-prob as the protocols write it: vLLM clamps to -9999 (JSON has no infinity).
pub(crate) fn clamp_logprob(lp: f32) -> f32 {
    if lp.is_nan() {
        -9999.0
    } else {
        lp.max(-9999.0)
    }
}
