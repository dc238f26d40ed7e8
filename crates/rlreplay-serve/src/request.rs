//! A generation request in the engine's terms, whichever protocol it came in: prompts, samples per
//! prompt, sampling settings per prompt; and what comes back for each sample.

use crate::protocol::{FieldError, Prompt};

/// What the served model accepts, for request validation.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Vocabulary size: token ids are `0..vocab_size`.
    pub vocab_size: usize,
    /// Longest prompt plus completion, in tokens.
    pub max_model_len: usize,
    /// End-of-sequence ids: every sample stops on them unless `ignore_eos`.
    pub eos_ids: Vec<u32>,
    /// Largest `n`.
    pub max_n: usize,
    /// Most prompts in one request.
    pub max_prompts: usize,
    /// Most samples in one request, `n` times its prompts.
    pub max_seqs: usize,
    /// Largest number of alternatives per token in `logprobs` / `top_logprobs_num`.
    pub max_logprobs: usize,
    /// The served model name; requests naming another model are rejected.
    pub model_name: Option<String>,
}

/// vLLM's greedy threshold: a temperature below it samples the arg-max.
pub const GREEDY_BELOW: f32 = 1e-5;

/// Sampling settings of one prompt's samples.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleSpec {
    /// Temperature; 0 is greedy.
    pub temperature: f32,
    /// Nucleus mass in `(0, 1]`.
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Seed of the random streams.
    pub seed: u64,
    /// Most generated tokens.
    pub max_new_tokens: usize,
    /// Ids that end a sample: the request's stop ids, then the model's end-of-sequence ids
    /// (unless ignored).
    pub stop_ids: Vec<u32>,
    /// The end-of-sequence ids among `stop_ids` (a stop on them has no `stop_reason`).
    pub eos_ids: Vec<u32>,
    /// Sample `j` of the `p`-th prompt of a request draws from random stream
    /// `first_stream + p * n + j` of `seed`: the streams `rlreplay generate` uses for the same
    /// prompt list, seed and `n` when `first_stream` is 0. A client that spreads one prompt list
    /// over several servers passes the position of its first prompt times `n`, so that every
    /// sample gets the stream it would get on one server.
    pub first_stream: u64,
}

impl SampleSpec {
    /// Checks and resolves the sampling fields of a request (protocol defaults applied by the
    /// caller). Errors name the field.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        limits: &Limits,
        temperature: Option<f32>,
        top_p: Option<f32>,
        top_k: Option<i64>,
        seed: Option<u64>,
        max_new_tokens: usize,
        stop_ids: Vec<u32>,
        ignore_eos: bool,
        first_stream: u64,
    ) -> Result<Self, (&'static str, String)> {
        let temperature = temperature.unwrap_or(1.0);
        if !(temperature >= 0.0 && temperature.is_finite()) {
            return Err((
                "temperature",
                format!("temperature must be a non-negative number, got {temperature}"),
            ));
        }
        let top_p = top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(("top_p", format!("top_p must be in (0, 1], got {top_p}")));
        }
        let top_k = match top_k.unwrap_or(0) {
            -1 | 0 => 0,
            k if k > 0 => k as usize,
            k => {
                return Err((
                    "top_k",
                    format!("top_k must be 0 or -1 (all tokens) or at least 1, got {k}"),
                ))
            }
        };
        let eos_ids = if ignore_eos {
            Vec::new()
        } else {
            limits.eos_ids.clone()
        };
        let mut stop = stop_ids;
        for &e in &eos_ids {
            if !stop.contains(&e) {
                stop.push(e);
            }
        }
        Ok(Self {
            temperature: if temperature < GREEDY_BELOW {
                0.0
            } else {
                temperature
            },
            top_p,
            top_k,
            seed: seed.unwrap_or_else(rand::random),
            max_new_tokens,
            stop_ids: stop,
            eos_ids,
            first_stream,
        })
    }
}

/// One prompt of a job.
#[derive(Debug, Clone, PartialEq)]
pub struct JobPrompt {
    /// Its token ids.
    pub ids: Vec<u32>,
    /// How its samples are drawn.
    pub spec: SampleSpec,
}

/// A validated generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The prompts.
    pub prompts: Vec<JobPrompt>,
    /// Samples per prompt.
    pub n: usize,
    /// With log-probs: this many most likely alternatives per generated token.
    pub top_logprobs: Option<usize>,
}

impl Limits {
    /// Checks that a request's `prompts` (field `param`) are within the per-request bound.
    pub fn check_prompt_count(&self, prompts: usize, param: &str) -> Result<(), FieldError> {
        if prompts > self.max_prompts {
            return Err(FieldError::new(
                param,
                format!(
                    "a request may carry at most {} prompts (the server's --max-prompts-per-request), \
                     got {prompts}",
                    self.max_prompts
                ),
            ));
        }
        Ok(())
    }

    /// Checks that `n` samples (field `n_param`) of each of `prompts` prompts are within the
    /// per-request bound.
    pub fn check_samples(&self, prompts: usize, n: usize, n_param: &str) -> Result<(), FieldError> {
        let seqs = prompts.saturating_mul(n);
        if seqs > self.max_seqs {
            return Err(FieldError::new(
                n_param,
                format!(
                    "a request may ask for at most {} samples in all (n x prompts, the server's \
                     --max-seqs-per-request), got {n} x {prompts} = {seqs}",
                    self.max_seqs
                ),
            ));
        }
        Ok(())
    }

    /// Checks prompt `p` (token ids, length) and that `max_new_tokens` fits the context; errors
    /// name `param` (the prompt field) or `max_param`.
    pub fn check_prompt(
        &self,
        ids: &[u32],
        max_new_tokens: usize,
        p: usize,
        param: &str,
        max_param: &str,
    ) -> Result<(), FieldError> {
        if ids.is_empty() {
            return Err(FieldError::new(param, format!("prompt {p} is empty")));
        }
        if let Some((i, &t)) = ids
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= self.vocab_size)
        {
            return Err(FieldError::new(
                param,
                format!(
                    "prompt {p}, position {i}: token id {t} is outside the vocabulary (0..{})",
                    self.vocab_size
                ),
            ));
        }
        if ids.len() >= self.max_model_len {
            return Err(FieldError::new(
                param,
                format!(
                    "this model's maximum context length is {} tokens; prompt {p} has {} tokens",
                    self.max_model_len,
                    ids.len()
                ),
            ));
        }
        if ids.len() + max_new_tokens > self.max_model_len {
            return Err(FieldError::new(
                max_param,
                format!(
                    "{max_param} is too large: {max_new_tokens}; this model's maximum context \
                     length is {} tokens and prompt {p} has {} tokens ({max_new_tokens} > {} - {})",
                    self.max_model_len,
                    ids.len(),
                    self.max_model_len,
                    ids.len()
                ),
            ));
        }
        Ok(())
    }
}

/// Why a sample ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// On stop id `id`; `eos` when it is one of the model's end-of-sequence ids.
    Stop {
        /// The matched id (the last generated token).
        id: u32,
        /// Whether it is an end-of-sequence id.
        eos: bool,
    },
    /// At `max_new_tokens` or the context limit.
    Length,
    /// Aborted (by `pause_generation` with mode `abort` or an update with
    /// `abort_all_requests`); the tokens so far are returned.
    Abort,
}

/// One finished sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// Generated token ids (a final stop id included).
    pub tokens: Vec<u32>,
    /// The log-prob of each generated token (in the server's log-prob mode).
    pub logprobs: Vec<f32>,
    /// Per position, the most likely tokens and their log-probs (empty unless requested).
    pub top: Vec<Vec<(u32, f32)>>,
    /// Why it ended.
    pub finish: Finish,
}

/// The tokenizer of the served model, when it has one: text prompts, decoded text and tokens.
pub struct Tokens {
    tokenizer: Option<tokenizers::Tokenizer>,
}

impl Tokens {
    /// Wraps a tokenizer (or none: text prompts are then rejected and text comes back empty).
    pub fn new(tokenizer: Option<tokenizers::Tokenizer>) -> Self {
        Self { tokenizer }
    }

    /// Whether a tokenizer is loaded.
    pub fn has_tokenizer(&self) -> bool {
        self.tokenizer.is_some()
    }

    /// The prompts of a request as token ids (text is tokenized with special tokens added, as
    /// vLLM does).
    pub fn prompts(&self, prompt: &Prompt, param: &str) -> Result<Vec<Vec<u32>>, FieldError> {
        let encode = |text: &str| -> Result<Vec<u32>, FieldError> {
            let tok = self.tokenizer.as_ref().ok_or_else(|| {
                FieldError::new(
                    param,
                    "text prompts need a tokenizer (start the server with --tokenizer) or send \
                     token ids",
                )
            })?;
            tok.encode(text, true)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| FieldError::new(param, format!("tokenizing failed: {e}")))
        };
        match prompt {
            Prompt::Ids(ids) => Ok(vec![ids.clone()]),
            Prompt::Batch(b) if b.is_empty() => Err(FieldError::new(param, "no prompt given")),
            Prompt::Batch(b) => Ok(b.clone()),
            Prompt::Text(t) => Ok(vec![encode(t)?]),
            Prompt::Texts(ts) => ts.iter().map(|t| encode(t)).collect(),
        }
    }

    /// One token as text (special tokens kept), empty without a tokenizer.
    pub fn piece(&self, id: u32) -> String {
        self.text(&[id], false)
    }

    /// Token ids as text, empty without a tokenizer.
    pub fn text(&self, ids: &[u32], skip_special: bool) -> String {
        self.tokenizer
            .as_ref()
            .and_then(|t| t.decode(ids, skip_special).ok())
            .unwrap_or_default()
    }
}
