//! `POST /generate`, the SGLang native subset: `input_ids` with `sampling_params`, output ids with
//! `meta_info` (finish reason, `output_token_logprobs` as `[logprob, id, text]`, weight version).
//!
//! Shapes follow SGLang's `GenerateReqInput` (`python/sglang/srt/managers/io_struct.py`),
//! `SamplingParams` (`srt/sampling/sampling_params.py`), the `meta_info` the tokenizer manager
//! writes, and its error body `{object: "error", message, type, param, code}`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{neutral_only, no_stop_strings, opt_f32, stream_offset, FieldError, OneOrMany, Prompt};
use crate::request::{Completion, Finish, Job, JobPrompt, Limits, Tokens};

/// SGLang's default `max_new_tokens`.
pub const DEFAULT_MAX_NEW_TOKENS: usize = 128;

/// A generate request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateRequest {
    /// Prompts as text (needs the server's tokenizer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<Prompt>,
    /// Prompts as token ids: `[int]` or `[[int]]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_ids: Option<Prompt>,
    /// Sampling settings, one for all prompts or one per prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_params: Option<OneOrMany<SamplingParams>>,
    /// Return `output_token_logprobs` (for all prompts; a per-prompt list must agree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_logprob: Option<OneOrMany<bool>>,
    /// Only -1 (output log-probs only) is supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob_start_len: Option<OneOrMany<i64>>,
    /// Most likely alternatives per generated token (`output_top_logprobs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs_num: Option<OneOrMany<u32>>,
    /// Fill the text slot of each log-prob entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_text_in_logprobs: Option<bool>,
    /// Only `false` is supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Request ids, echoed in `meta_info.id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rid: Option<OneOrMany<String>>,
    /// The LoRA adapter to generate with, by name (one for all prompts; a per-prompt list must
    /// name the same adapter for every prompt); absent or `null`: the base model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_path: Option<OneOrMany<Option<String>>>,
}

sampling_request! {
    /// SGLang's sampling parameters (the subset this server honours).
    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct SamplingParams {
        /// Most generated tokens (default 128; 0 returns no tokens).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub max_new_tokens: Option<usize>,
        /// Seed of the random streams.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub sampling_seed: Option<u64>,
        /// Accepted for compatibility (stop ids are always kept in `output_ids`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub no_stop_trim: Option<bool>,
        /// Extension arguments; this server reads `sample_stream_offset` (see
        /// [`SampleSpec::first_stream`](crate::request::SampleSpec::first_stream)) and rejects other keys.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub custom_params: Option<serde_json::Map<String, Value>>,
    }
}

impl GenerateRequest {
    /// Whether the response is one object (one prompt given as `[int]` or a string, `n` = 1)
    /// rather than a list.
    pub fn single_output(&self, n: usize) -> bool {
        let single = self
            .input_ids
            .as_ref()
            .or(self.text.as_ref())
            .is_some_and(Prompt::is_single);
        single && n == 1
    }

    /// Checks the request against the served model and turns it into a job.
    pub fn to_job(&self, limits: &Limits, tokens: &Tokens) -> Result<Job, FieldError> {
        if self.stream == Some(true) {
            return Err(FieldError::new(
                "stream",
                "streaming is not supported; send stream=false",
            ));
        }
        let prompts = match (&self.input_ids, &self.text) {
            (Some(ids), None) => {
                if matches!(ids, Prompt::Text(_) | Prompt::Texts(_)) {
                    return Err(FieldError::new(
                        "input_ids",
                        "expected token ids ([int] or [[int]]); send text in `text`",
                    ));
                }
                limits.check_prompt_count(ids.len(), "input_ids")?;
                tokens.prompts(ids, "input_ids")?
            }
            (None, Some(text)) => {
                if !matches!(text, Prompt::Text(_) | Prompt::Texts(_)) {
                    return Err(FieldError::new(
                        "text",
                        "expected a string or a list of strings",
                    ));
                }
                limits.check_prompt_count(text.len(), "text")?;
                tokens.prompts(text, "text")?
            }
            (Some(_), Some(_)) => {
                return Err(FieldError::new(
                    "input_ids",
                    "give either input_ids or text, not both",
                ))
            }
            (None, None) => {
                return Err(FieldError::new(
                    "input_ids",
                    "either input_ids or text must be given",
                ))
            }
        };
        let param = if self.input_ids.is_some() {
            "input_ids"
        } else {
            "text"
        };
        let count = prompts.len();
        let per_prompt = |name: &str, e: String| FieldError::new(name, e);
        let all_same = |name: &str, vals: Vec<i64>| -> Result<i64, FieldError> {
            match vals.split_first() {
                Some((first, rest)) if rest.iter().all(|v| v == first) => Ok(*first),
                Some(_) => Err(FieldError::new(
                    name,
                    "must be the same for every prompt of a request",
                )),
                None => Ok(0),
            }
        };
        let get = |i: usize| -> Result<SamplingParams, FieldError> {
            self.sampling_params
                .as_ref()
                .map(|s| s.get(i, count))
                .transpose()
                .map(Option::unwrap_or_default)
                .map_err(|e| per_prompt("sampling_params", e))
        };
        let params: Vec<SamplingParams> = (0..count).map(get).collect::<Result<_, _>>()?;
        let n = all_same(
            "sampling_params.n",
            params.iter().map(|p| p.n.unwrap_or(1) as i64).collect(),
        )? as usize;
        if n < 1 || n > limits.max_n {
            return Err(FieldError::new(
                "sampling_params.n",
                format!("n must be in 1..={}, got {n}", limits.max_n),
            ));
        }
        limits.check_samples(count, n, "sampling_params.n")?;
        let flag = |v: &Option<OneOrMany<bool>>, name: &str| -> Result<bool, FieldError> {
            match v {
                None => Ok(false),
                Some(v) => {
                    let vals = (0..count)
                        .map(|i| v.get(i, count).map(i64::from))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| per_prompt(name, e))?;
                    Ok(all_same(name, vals)? != 0)
                }
            }
        };
        let return_logprob = flag(&self.return_logprob, "return_logprob")?;
        if let Some(v) = &self.logprob_start_len {
            for i in 0..count {
                let s = v
                    .get(i, count)
                    .map_err(|e| per_prompt("logprob_start_len", e))?;
                if s != -1 {
                    return Err(FieldError::new(
                        "logprob_start_len",
                        format!("only -1 (output log-probs only) is supported, got {s}"),
                    ));
                }
            }
        }
        let top = match &self.top_logprobs_num {
            None => 0,
            Some(v) => {
                let vals = (0..count)
                    .map(|i| v.get(i, count).map(i64::from))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| per_prompt("top_logprobs_num", e))?;
                all_same("top_logprobs_num", vals)? as usize
            }
        };
        if top > limits.max_logprobs {
            return Err(FieldError::new(
                "top_logprobs_num",
                format!(
                    "at most {} log-probs per token can be returned, got {top}",
                    limits.max_logprobs
                ),
            ));
        }
        if let Some(OneOrMany::Many(r)) = &self.rid {
            if r.len() != count {
                return Err(FieldError::new(
                    "rid",
                    format!("has {} entries for {count} prompts", r.len()),
                ));
            }
        }
        let job_prompts = prompts
            .into_iter()
            .zip(&params)
            .enumerate()
            .map(|(p, (ids, sp))| {
                sp.check_unsupported("sampling_params.")?;
                let first_stream =
                    stream_offset(sp.custom_params.as_ref(), "sampling_params.custom_params")?;
                let max_new = sp.max_new_tokens.unwrap_or(DEFAULT_MAX_NEW_TOKENS);
                let spec = sp.sample_spec(
                    "sampling_params.",
                    limits,
                    sp.sampling_seed,
                    max_new,
                    first_stream,
                )?;
                limits.check_prompt(&ids, max_new, p, param, "sampling_params.max_new_tokens")?;
                Ok(JobPrompt { ids, spec })
            })
            .collect::<Result<Vec<_>, FieldError>>()?;
        Ok(Job {
            prompts: job_prompts,
            n,
            top_logprobs: return_logprob.then_some(top),
        })
    }

    /// The adapter named by `lora_path` for the request's `count` prompts (`None`: the base
    /// model); a list naming different adapters is an error naming the field.
    pub fn adapter(&self, count: usize) -> Result<Option<String>, FieldError> {
        let Some(v) = &self.lora_path else {
            return Ok(None);
        };
        let names = (0..count)
            .map(|i| v.get(i, count))
            .collect::<Result<Vec<_>, String>>()
            .map_err(|e| FieldError::new("lora_path", e))?;
        match names.split_first() {
            Some((first, rest)) if rest.iter().any(|n| n != first) => Err(FieldError::new(
                "lora_path",
                "must name the same adapter for every prompt of a request",
            )),
            Some((first, _)) => Ok(first.clone()),
            None => Ok(None),
        }
    }

    /// The request id of prompt `p`, or a generated one.
    pub fn rid(&self, p: usize, sample: usize, fallback: &str) -> String {
        match &self.rid {
            Some(OneOrMany::One(r)) => r.clone(),
            Some(OneOrMany::Many(r)) => r.get(p).cloned().unwrap_or_else(|| fallback.to_owned()),
            None => format!("{fallback}-{p}-{sample}"),
        }
    }
}

/// One output of a generate request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateOutput {
    /// The decoded sample.
    pub text: String,
    /// The generated token ids (a final stop id included).
    pub output_ids: Vec<u32>,
    /// Everything else.
    pub meta_info: MetaInfo,
}

/// `meta_info` of a [`GenerateOutput`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetaInfo {
    /// The request id.
    pub id: String,
    /// Why the sample ended.
    pub finish_reason: Option<FinishReason>,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Always 0 (no prefix cache).
    #[serde(default)]
    pub cached_tokens: usize,
    /// The weight version that generated the sample.
    pub weight_version: String,
    /// Seconds from the request's arrival to its response.
    #[serde(default)]
    pub e2e_latency: f64,
    /// `[logprob, token id, text or null]` per generated token, with `return_logprob`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_token_logprobs: Option<Vec<LogprobEntry>>,
    /// The most likely tokens per position, with `top_logprobs_num > 0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_top_logprobs: Option<Vec<Vec<LogprobEntry>>>,
}

/// `[logprob, token id, text]`: the log-prob (`null` for minus infinity, as SGLang's JSON
/// encoder writes it), the token, its text with `return_text_in_logprobs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogprobEntry(pub Option<f32>, pub u32, pub Option<String>);

/// SGLang's finish reason: `{"type": "stop", "matched": id}`, `{"type": "length", "length": n}`
/// or `{"type": "abort", "message": ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinishReason {
    /// `stop`, `length` or `abort`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The matched stop id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched: Option<Value>,
    /// The length reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<usize>,
    /// Why it was aborted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl GenerateOutput {
    /// Renders a finished sample of prompt `p` of `job`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        req: &GenerateRequest,
        job: &Job,
        p: usize,
        c: &Completion,
        id: String,
        weight_version: &str,
        e2e_latency: f64,
        tokens: &Tokens,
    ) -> Self {
        let skip_special = req
            .sampling_params
            .as_ref()
            .and_then(|s| s.get(p, job.prompts.len()).ok())
            .and_then(|s| s.skip_special_tokens)
            .unwrap_or(true);
        let with_text = req.return_text_in_logprobs.unwrap_or(false) && tokens.has_tokenizer();
        let entry = |lp: f32, t: u32| {
            LogprobEntry(
                lp.is_finite().then_some(lp),
                t,
                with_text.then(|| tokens.piece(t)),
            )
        };
        let (logprobs, top) = match job.top_logprobs {
            None => (None, None),
            Some(k) => (
                Some(
                    c.tokens
                        .iter()
                        .zip(&c.logprobs)
                        .map(|(&t, &lp)| entry(lp, t))
                        .collect(),
                ),
                (k > 0).then(|| {
                    c.top
                        .iter()
                        .map(|row| row.iter().map(|&(t, lp)| entry(lp, t)).collect())
                        .collect()
                }),
            ),
        };
        let finish = match c.finish {
            Finish::Stop { id, .. } => FinishReason {
                kind: "stop".into(),
                matched: Some(Value::from(id)),
                length: None,
                message: None,
            },
            Finish::Length => FinishReason {
                kind: "length".into(),
                matched: None,
                length: Some(c.tokens.len()),
                message: None,
            },
            Finish::Abort => FinishReason {
                kind: "abort".into(),
                matched: None,
                length: None,
                message: Some("aborted by pause_generation or a weight update".into()),
            },
        };
        Self {
            text: tokens.text(&c.tokens, skip_special),
            output_ids: c.tokens.clone(),
            meta_info: MetaInfo {
                id,
                finish_reason: Some(finish),
                prompt_tokens: job.prompts[p].ids.len(),
                completion_tokens: c.tokens.len(),
                cached_tokens: 0,
                weight_version: weight_version.to_owned(),
                e2e_latency,
                output_token_logprobs: logprobs,
                output_top_logprobs: top,
            },
        }
    }
}

/// SGLang's error body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorResponse {
    /// Always `error`.
    pub object: String,
    /// What went wrong.
    pub message: String,
    /// The HTTP reason phrase (`Bad Request`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// The offending request field.
    pub param: Option<String>,
    /// The HTTP status.
    pub code: u16,
}
