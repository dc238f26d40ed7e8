//! `POST /v1/completions`, the vLLM / OpenAI subset used for RL: token-id prompts, `n` samples
//! each, per-token log-probs with `tokens` as `token_id:N`, prompt-major choices.
//!
//! Shapes follow vLLM's `CompletionRequest` / `CompletionResponse`
//! (`vllm/entrypoints/openai/completion/protocol.py`) and its error envelope
//! `{"error": {message, type, param, code}}`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    clamp_logprob, int_or_bool, neutral_only, no_stop_strings, opt_f32, stream_offset, FieldError,
    Prompt, TopLogprobs,
};
use crate::request::{Completion, Finish, Job, JobPrompt, Limits, Tokens};

/// vLLM's default `max_tokens` (also used when the field is `null`).
pub const DEFAULT_MAX_TOKENS: usize = 16;

sampling_request! {
    /// A completions request (the fields an RL client sends; others are rejected).
    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct CompletionRequest {
        /// Served model name (checked when given): the base model's or a LoRA adapter's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub model: Option<String>,
        /// Token ids (`[int]` or `[[int]]`) or text.
        pub prompt: Prompt,
        /// Most generated tokens per sample (default 16).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub max_tokens: Option<usize>,
        /// Seed of the request's random streams (random when absent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub seed: Option<i64>,
        /// Return log-probs, with this many most likely alternatives per token.
        #[serde(
            default,
            deserialize_with = "int_or_bool",
            skip_serializing_if = "Option::is_none"
        )]
        pub logprobs: Option<u32>,
        /// Write `logprobs.tokens` as `token_id:N`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub return_tokens_as_token_ids: Option<bool>,
        /// Return `token_ids` and `prompt_token_ids` in each choice.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub return_token_ids: Option<bool>,
        /// Accepted for compatibility (no stop strings are matched).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub include_stop_str_in_output: Option<bool>,
        /// Only `false` is supported.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub echo: Option<bool>,
        /// Only `false` is supported.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub stream: Option<bool>,
        /// Accepted and ignored (end-user id).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub user: Option<String>,
        /// Accepted and ignored (this server keeps no prefix cache).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub cache_salt: Option<String>,
        /// Echoed as the response id when given.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub request_id: Option<String>,
        /// vLLM's extension arguments; this server reads `sample_stream_offset` (see
        /// [`SampleSpec::first_stream`](crate::request::SampleSpec::first_stream)) and rejects other keys.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub vllm_xargs: Option<serde_json::Map<String, Value>>,
    }
}

impl Default for Prompt {
    fn default() -> Self {
        Self::Batch(Vec::new())
    }
}

fn check(ok: bool, param: &str, message: impl FnOnce() -> String) -> Result<(), FieldError> {
    if ok {
        Ok(())
    } else {
        Err(FieldError::new(param, message()))
    }
}

impl CompletionRequest {
    /// Checks the request against the served model and turns it into a job. Text prompts are
    /// tokenized with `tokens` (an error without a tokenizer).
    pub fn to_job(&self, limits: &Limits, tokens: &Tokens) -> Result<Job, FieldError> {
        check(self.echo != Some(true), "echo", || {
            "echo is not supported".into()
        })?;
        check(self.stream != Some(true), "stream", || {
            "streaming is not supported; send stream=false".into()
        })?;
        self.check_unsupported("")?;
        if let (Some(want), Some(served)) = (&self.model, &limits.model_name) {
            if want != served {
                return Err(FieldError::new(
                    "model",
                    format!("the model `{want}` does not exist (this server serves `{served}`)"),
                ));
            }
        }
        let n = self.n.unwrap_or(1);
        check(n >= 1, "n", || format!("n must be at least 1, got {n}"))?;
        check(n <= limits.max_n, "n", || {
            format!("n must be at most {}, got {n}", limits.max_n)
        })?;
        let max_tokens = self.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        check(max_tokens >= 1, "max_tokens", || {
            format!("max_tokens must be at least 1, got {max_tokens}")
        })?;
        if let Some(k) = self.logprobs {
            check(k as usize <= limits.max_logprobs, "logprobs", || {
                format!(
                    "at most {} log-probs per token can be returned, got {k}",
                    limits.max_logprobs
                )
            })?;
        }
        let first_stream = stream_offset(self.vllm_xargs.as_ref(), "vllm_xargs")?;
        limits.check_prompt_count(self.prompt.len(), "prompt")?;
        limits.check_samples(self.prompt.len(), n, "n")?;
        let prompts = tokens.prompts(&self.prompt, "prompt")?;
        let spec = self.sample_spec(
            "",
            limits,
            self.seed.map(|s| s as u64),
            max_tokens,
            first_stream,
        )?;
        let prompts = prompts
            .into_iter()
            .enumerate()
            .map(|(p, ids)| {
                limits.check_prompt(&ids, max_tokens, p, "prompt", "max_tokens")?;
                Ok(JobPrompt {
                    ids,
                    spec: spec.clone(),
                })
            })
            .collect::<Result<Vec<_>, FieldError>>()?;
        Ok(Job {
            prompts,
            n,
            top_logprobs: self.logprobs.map(|k| k as usize),
        })
    }
}

/// A completions response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionResponse {
    /// `cmpl-...`.
    pub id: String,
    /// Always `text_completion`.
    pub object: String,
    /// Unix time of the request.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// Prompt-major: prompt `p`, sample `j` at index `p * n + j`.
    pub choices: Vec<CompletionChoice>,
    /// Token counts.
    pub usage: Usage,
    /// Always `null`.
    #[serde(default)]
    pub system_fingerprint: Option<String>,
}

/// One sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    /// Position in `choices`.
    pub index: usize,
    /// The decoded sample (special tokens removed unless `skip_special_tokens` is false).
    pub text: String,
    /// Per-token log-probs, when requested.
    #[serde(default)]
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop` (a stop or end-of-sequence id), `length` or `abort`.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// The stop token id that ended the sample; `null` for an end-of-sequence id or no stop.
    #[serde(default)]
    pub stop_reason: Option<Value>,
    /// The generated token ids, with `return_token_ids`.
    #[serde(default)]
    pub token_ids: Option<Vec<u32>>,
    /// Always `null` (prompt log-probs are not computed).
    #[serde(default)]
    pub prompt_logprobs: Option<Value>,
    /// The prompt's token ids, with `return_token_ids`.
    #[serde(default)]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// OpenAI's completion log-probs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionLogprobs {
    /// Character offset of each token in the concatenation of `tokens`.
    pub text_offset: Vec<usize>,
    /// The log-prob of each generated token.
    pub token_logprobs: Vec<Option<f32>>,
    /// Each token, decoded or as `token_id:N`.
    pub tokens: Vec<String>,
    /// The sampled token and the `logprobs` most likely ones at each position.
    pub top_logprobs: Vec<Option<TopLogprobs>>,
}

/// Token counts of a response.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens, counted once per prompt.
    pub prompt_tokens: usize,
    /// `prompt_tokens + completion_tokens`.
    pub total_tokens: usize,
    /// Generated tokens over all choices.
    pub completion_tokens: usize,
}

/// vLLM's token placeholder: `token_id:N`.
pub fn token_placeholder(id: u32) -> String {
    format!("token_id:{id}")
}

/// The id in a `token_id:N` placeholder.
pub fn parse_token_placeholder(s: &str) -> Option<u32> {
    s.strip_prefix("token_id:")?.parse().ok()
}

impl CompletionResponse {
    /// Renders the finished completions of `job` (prompt-major) as vLLM does.
    pub fn new(
        req: &CompletionRequest,
        job: &Job,
        completions: &[Completion],
        id: String,
        created: u64,
        model: String,
        tokens: &Tokens,
    ) -> Self {
        let as_ids = req.return_tokens_as_token_ids.unwrap_or(false) || !tokens.has_tokenizer();
        let with_ids = req.return_token_ids.unwrap_or(false);
        let skip_special = req.skip_special_tokens.unwrap_or(true);
        let mut usage = Usage::default();
        for p in &job.prompts {
            usage.prompt_tokens += p.ids.len();
        }
        let choices = completions
            .iter()
            .enumerate()
            .map(|(index, c)| {
                usage.completion_tokens += c.tokens.len();
                let prompt = &job.prompts[index / job.n];
                let logprobs = job.top_logprobs.map(|_| {
                    let token = |t: u32| {
                        if as_ids {
                            token_placeholder(t)
                        } else {
                            tokens.piece(t)
                        }
                    };
                    let mut out = CompletionLogprobs::default();
                    let mut offset = 0;
                    for (i, (&t, &lp)) in c.tokens.iter().zip(&c.logprobs).enumerate() {
                        let s = token(t);
                        out.text_offset.push(offset);
                        offset += s.chars().count();
                        out.token_logprobs.push(Some(clamp_logprob(lp)));
                        let mut top = vec![(s.clone(), clamp_logprob(lp))];
                        top.extend(
                            c.top[i]
                                .iter()
                                .map(|&(id, lp)| (token(id), clamp_logprob(lp))),
                        );
                        out.tokens.push(s);
                        out.top_logprobs.push(Some(TopLogprobs(top)));
                    }
                    out
                });
                let (finish_reason, stop_reason) = match c.finish {
                    Finish::Stop { id, eos } => ("stop", (!eos).then(|| Value::from(id))),
                    Finish::Length => ("length", None),
                    Finish::Abort => ("abort", None),
                };
                CompletionChoice {
                    index,
                    text: tokens.text(&c.tokens, skip_special),
                    logprobs,
                    finish_reason: Some(finish_reason.to_owned()),
                    stop_reason,
                    token_ids: with_ids.then(|| c.tokens.clone()),
                    prompt_logprobs: None,
                    prompt_token_ids: with_ids.then(|| prompt.ids.clone()),
                }
            })
            .collect();
        usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
        Self {
            id,
            object: "text_completion".into(),
            created,
            model,
            choices,
            usage,
            system_fingerprint: None,
        }
    }
}

/// vLLM's error body: `{"error": {message, type, param, code}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorResponse {
    /// The error.
    pub error: ErrorInfo,
}

/// The inside of [`ErrorResponse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorInfo {
    /// What went wrong.
    pub message: String,
    /// `BadRequestError`, `NotFoundError`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// The offending request field.
    pub param: Option<String>,
    /// The HTTP status.
    pub code: u16,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
    /// Always `list`.
    pub object: String,
    /// The one served model.
    pub data: Vec<ModelCard>,
}

/// One entry of [`ModelList`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    /// The served model name.
    pub id: String,
    /// Always `model`.
    pub object: String,
    /// Unix time the server started.
    pub created: u64,
    /// Always `rlreplay`.
    pub owned_by: String,
    /// The model path (an adapter's directory for an adapter).
    pub root: Option<String>,
    /// For a LoRA adapter, the base model's name; `null` for the base model.
    #[serde(default)]
    pub parent: Option<String>,
    /// The longest prompt plus completion.
    pub max_model_len: Option<usize>,
}
