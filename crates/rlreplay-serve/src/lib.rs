//! `rlreplay serve`: the sampling engine as an HTTP server that speaks the protocols RL trainers
//! already use with vLLM and SGLang, so a trainer can send generation to it, to vLLM or to SGLang
//! alike.
//!
//! - `POST /v1/completions`: the vLLM / OpenAI completions subset used for RL (token-id prompts,
//!   `n`, `logprobs` with `return_tokens_as_token_ids`, `return_token_ids`), see
//!   [`protocol::openai`].
//! - `POST /generate`: SGLang's native API (`input_ids`, `sampling_params`, `return_logprob`), see
//!   [`protocol::sglang`].
//! - Control: `POST /update_weights_from_disk {model_path, weight_version}`,
//!   `/pause_generation {mode}`, `/continue_generation`, `GET /get_weight_version`,
//!   `/get_model_info`, `/get_server_info`, `/health`, `/flush_cache`; prime-rl's aliases
//!   `POST /update_weights {weight_dir}`, `/pause?mode=abort|keep|wait`, `/resume`; and
//!   `GET /v1/models`. See [`protocol::control`].
//! - LoRA adapters: vLLM's `POST /v1/load_lora_adapter {lora_name, lora_path, load_inplace}` and
//!   `/v1/unload_lora_adapter {lora_name}` (plain-text answers), SGLang's `POST /load_lora_adapter`
//!   and `/unload_lora_adapter` (`{success, error_message, loaded_adapters}`), and adapters given
//!   at start ([`ServeConfig::adapters`]). A completions request selects an adapter by `model`, a
//!   generate request by `lora_path`; `GET /v1/models` lists them with the base model as
//!   `parent`.
//!
//! **Batching.** Every request's prompts join the continuous batch of the model they run on
//! ([`rlreplay_sampling::engine`]; the base model and each adapter have one, stepped in turn):
//! each decode step serves every live sequence of every request on that model, and prompts join
//! and leave between steps. At most `max_num_seqs` sequences of one model decode at once: a
//! prompt with a larger `n` joins in pieces of at most `max_num_seqs` samples, each admitted when
//! there is room.
//!
//! **Adapters.** An adapter is served by the base weights with the adapter merged, a full copy of
//! the base weights per adapter, so its samples are those of the in-process engine for the base
//! model with the adapter loaded. Loading builds that copy off the engine thread and then swaps it
//! in; an adapter loaded under a name in use (vLLM's `load_inplace`) replaces it for new requests
//! while the requests in flight finish on the old one. A weight update merges every served adapter
//! into the new weights. A bad adapter is a 400 naming the file, tensor, module and shapes.
//!
//! **Random streams.** Sample `j` of the `p`-th prompt of a request with seed `S` draws from the
//! ChaCha8 stream `p * n + j` of `S`, the streams `rlreplay generate --seed S` uses for the same
//! prompts, so a request reproduces a local generation (up to float rounding of batches of
//! another shape). A request without a seed gets a random one. The extension argument
//! `sample_stream_offset` (`vllm_xargs` in completions, `sampling_params.custom_params` in
//! generate) shifts the streams, so a prompt list spread over several servers gets the streams it
//! would get on one.
//!
//! **Log-probs.** `--logprobs-mode processed` (the default, as prime-rl and verl configure vLLM)
//! returns the log-prob of each token under the distribution it was drawn from: after temperature
//! and after the top-k/top-p restriction renormalised. `raw` returns `log softmax(z)` of the
//! unscaled logits. The trainer's behaviour log-probs are compared with the policy's
//! `log softmax(z / τ)` over the full vocabulary: with `top_p = 1` and `top_k` off (0 or -1)
//! `processed` equals that exactly; with a restriction every kept token's processed log-prob is
//! higher by `-ln(kept mass)`, so the importance ratio is not 1 even on-policy. SGLang returns
//! `log softmax(z / τ)` before the restriction; vLLM's default is `raw_logprobs`.
//!
//! **Weight updates.** `update_weights_from_disk` loads the new directory while generation goes
//! on; the requests in flight finish on the old weights, requests that arrive during the update
//! wait and run on the new ones, and the call returns once the new weights serve (so every sample
//! comes from one weight version, which `meta_info.weight_version` reports). With
//! `abort_all_requests` the requests in flight end at once (finish reason `abort`, with the tokens
//! generated so far). While generation is paused in place (`pause_generation` with mode
//! `in_place` or `retract`, prime-rl's `/pause?mode=keep`) the weights are swapped at once and the
//! paused requests continue on the new weights after `continue_generation`: their earlier tokens
//! come from the old weights.
//!
//! **What a client cannot do to the others.** A request whose client goes away (the connection
//! closes) is cancelled whole, every sample of every prompt. A weight update runs in a task of its
//! own and finishes or fails whatever its client does. A request carries at most
//! `max_prompts_per_request` prompts and `max_seqs_per_request` samples (`n` times the prompts);
//! more is a 400. At most `max_connections` connections are served at once (more wait in the
//! listen backlog); a connection is closed when a request's headers take longer than
//! `header_read_timeout` from their first byte, or when it has no request in flight and no
//! traffic for `idle_timeout`. See [`ServeConfig`] for the defaults.
//!
//! **Bad input** gets a 4xx JSON error naming the field (vLLM's `{"error": {...}}` under `/v1/`,
//! SGLang's `{object: "error", ...}` elsewhere) and the server keeps serving: malformed JSON,
//! unknown fields, token ids outside the vocabulary, `n = 0`, `max_tokens` beyond the context, a
//! body over the size limit (413), a wrong API key (401).
#![warn(missing_docs)]

#[cfg(feature = "server")]
mod conn;
pub mod protocol;
pub mod request;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "server")]
pub mod worker;

#[cfg(feature = "server")]
pub use server::{BoundServer, ServeConfig, ServerHandle};

/// Errors of the server crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The model or tokenizer cannot be loaded.
    #[error("{0}")]
    Model(String),
    /// Binding, serving or a thread failed.
    #[error("{0}")]
    Io(String),
    /// A LoRA adapter cannot be served: missing or corrupt files, or a rank, targets or shapes
    /// that do not fit the base model (the message names the file, tensor, module and shapes).
    #[error("{0}")]
    Adapter(String),
    /// A setting of [`ServeConfig`] is out of range.
    #[cfg(feature = "server")]
    #[error("{0}")]
    Config(String),
}

/// Result type of the server crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
