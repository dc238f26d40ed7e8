//! Generation on inference servers (`[rollout] backend = "remote"`): `rlreplay serve`, vLLM or
//! SGLang, spoken to over vLLM's `POST /v1/completions` or SGLang's `POST /generate` with token-id
//! prompts.
//!
//! - **Spreading.** A step's prompts are cut into contiguous chunks, one per live endpoint, sent
//!   at once. Each chunk carries the step's seed and the offset of its first sample
//!   (`sample_stream_offset`), so on `rlreplay serve` every sample draws from the random stream it
//!   would draw from in the trainer's own engine, whatever the number of endpoints.
//! - **Failures.** A transport error, a 5xx, an aborted sample or an answer of the wrong shape is
//!   retried on the same endpoint `retries` times with exponential backoff; then the endpoint is
//!   dropped for the rest of the run and its chunk goes to the others. A 4xx (the server refuses
//!   the request) stops the run at once with the server's message. When no endpoint is left the
//!   step fails naming every endpoint and why, before anything of the step is trained or saved,
//!   so the last checkpoint stays intact.
//! - **Weight sync** (`weight_sync = "disk"`): the policy of version `v` is written as an HF
//!   directory `weights_dir/step_v` (atomically: a temporary sibling renamed into place), then a
//!   `STABLE` marker holding `v`, then every live endpoint is told
//!   `POST /update_weights_from_disk {model_path, weight_version: "v"}`. An endpoint that fails
//!   the update is dropped (it would serve stale weights). Older directories are removed once
//!   every endpoint serves the new one. Before the first step the initial policy is sent the same
//!   way, so the servers start from the trainer's weights.
//! - **LoRA policies** (the policy carries adapters): only the adapter is written, as a PEFT
//!   directory (`adapter_config.json`, `adapter_model.safetensors`) in the same `step_v` scheme
//!   with its `STABLE` marker, and every endpoint loads it next to the base model it serves (which
//!   must be the policy's base model): vLLM with `POST /v1/load_lora_adapter {lora_name:
//!   "policy", lora_path, load_inplace: true}`, replacing the adapter in place under one name, as
//!   verl and prime-rl drive vLLM; SGLang, which refuses a name already loaded, with
//!   `POST /load_lora_adapter` under a name per version (`policy-v{v}`), the previous version's
//!   adapter unloaded once the new one serves. Generation requests then select the adapter
//!   (`model` for vLLM, `lora_path` for SGLang), and each sample records the version whose
//!   adapter it asked for.
//! - **Versions.** Each sample records the version its endpoint served: SGLang's
//!   `meta_info.weight_version` when it is a number, else the version served when the request
//!   was sent.
//!   With `weight_sync = "none"` versions are unknown.

use rlreplay_data::IoContext;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rlreplay_model::Model;
use rlreplay_sampling::engine::Generation;
use rlreplay_sampling::sampling::SamplingParams;
use rlreplay_serve::protocol::control::{
    LoadLoraAdapter, LoraUpdateResult, UnloadLoraAdapter, UpdateWeightsFromDisk,
    UpdateWeightsResponse,
};
use rlreplay_serve::protocol::openai::{parse_token_placeholder, CompletionRequest};
use rlreplay_serve::protocol::sglang::{self, GenerateOutput, GenerateRequest};
use rlreplay_serve::protocol::{OneOrMany, Prompt, STREAM_OFFSET_KEY};

use crate::config::{InvalidSamples, RolloutProtocol, RolloutSection, WeightSync};
use crate::error::{Error, Result};

/// The environment variable whose value is sent as `Authorization: Bearer` to every endpoint.
pub const API_KEY_ENV: &str = "RLREPLAY_API_KEY";

/// The marker written last into a weights directory: the directory is complete.
pub const STABLE: &str = "STABLE";

/// The name a LoRA policy's adapter is served under on vLLM endpoints (SGLang endpoints serve
/// version `v` as `policy-v{v}`).
pub const POLICY_ADAPTER: &str = "policy";

/// Why a request failed.
enum Failure {
    /// The server refused the request (4xx): retrying cannot help.
    Refused(String),
    /// The endpoint is unreachable, failing (5xx) or answered something unusable.
    Down(String),
    /// The endpoint returned a sample that cannot be trained on.
    Invalid(String),
}

/// A request body as JSON.
fn request_body<T: serde::Serialize>(v: &T) -> Result<serde_json::Value> {
    serde_json::to_value(v).map_err(|source| Error::Json {
        what: "the adapter request",
        source,
    })
}

/// One inference server.
struct Endpoint {
    url: String,
    /// Why it was dropped, once it was.
    failure: Mutex<Option<String>>,
}

impl Endpoint {
    fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn drop_with(&self, why: String) {
        *self.failure.lock().unwrap_or_else(PoisonError::into_inner) = Some(why);
    }
}

/// One sample as a server answered it: tokens, log-probs, finish reason, reported version.
type Sample = (Vec<u32>, Vec<f32>, String, Option<u64>);

/// The samples of a step as the servers returned them.
pub struct RemoteSamples {
    /// One per sample, prompt-major, as the trainer's own engine returns them.
    pub generations: Vec<Generation>,
    /// Per sample: the policy version that generated it, when known.
    pub versions: Vec<Option<u64>>,
    /// Samples found invalid (`[rollout] invalid_samples = "drop"`).
    pub invalid: usize,
    /// Rows dropped with them: their whole groups.
    pub dropped: usize,
}

/// What is wrong with a sample, in the words `rlreplay validate` uses for a row: an empty
/// response, a positive log-prob, more tokens than asked for, a token id outside the vocabulary.
pub fn sample_problem(
    tokens: &[u32],
    logprobs: &[f32],
    max_tokens: usize,
    vocab: usize,
) -> Option<String> {
    if tokens.is_empty() {
        return Some("empty response".into());
    }
    if tokens.len() > max_tokens {
        return Some(format!(
            "{} response tokens, over max_response_length = {max_tokens}",
            tokens.len()
        ));
    }
    if let Some((j, t)) = tokens
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= vocab)
    {
        return Some(format!(
            "response token {j} is {t}, outside the vocabulary of {vocab}"
        ));
    }
    if let Some((j, l)) = logprobs
        .iter()
        .enumerate()
        .find(|(_, &l)| l.is_nan() || l > 0.0)
    {
        return Some(format!(
            "log-prob {l} at token {j} is not a finite non-positive number"
        ));
    }
    None
}

/// A client of a fleet of inference servers; shared by the threads that generate ahead
/// (`max_off_policy_steps > 0`).
pub struct Remote {
    endpoints: Vec<Endpoint>,
    protocol: RolloutProtocol,
    weight_sync: WeightSync,
    weights_dir: PathBuf,
    agent: ureq::Agent,
    api_key: Option<String>,
    retries: u32,
    backoff: Duration,
    /// The policy's vocabulary size: sampled ids must be below it.
    vocab: usize,
    invalid_samples: InvalidSamples,
    /// The version every live endpoint serves, once a sync installed it.
    served: Mutex<Option<u64>>,
    /// The name of the LoRA adapter generation requests select, once a sync of a LoRA policy
    /// loaded it on every live endpoint.
    adapter: Mutex<Option<String>>,
}

impl Remote {
    /// A client of `[rollout] endpoints`; weights go under `weights_dir` (default
    /// `RUN_DIR/weights`); sampled ids must be below `vocab`.
    pub fn new(r: &RolloutSection, run_dir: &Path, vocab: usize) -> Self {
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs_f64(r.request_timeout_s))
            .build();
        Self {
            endpoints: r
                .endpoints
                .iter()
                .map(|u| Endpoint {
                    url: u.trim_end_matches('/').to_string(),
                    failure: Mutex::new(None),
                })
                .collect(),
            protocol: r.protocol,
            weight_sync: r.weight_sync,
            weights_dir: r
                .weights_dir
                .clone()
                .unwrap_or_else(|| run_dir.join("weights")),
            agent,
            api_key: std::env::var(API_KEY_ENV).ok().filter(|k| !k.is_empty()),
            retries: r.retries,
            backoff: Duration::from_secs_f64(r.retry_backoff_s),
            vocab,
            invalid_samples: r.invalid_samples,
            served: Mutex::new(None),
            adapter: Mutex::new(None),
        }
    }

    /// The endpoints still in use.
    fn live(&self) -> Vec<usize> {
        (0..self.endpoints.len())
            .filter(|&i| self.endpoints[i].failure().is_none())
            .collect()
    }

    /// The error once no endpoint is left.
    fn none_left(&self) -> Error {
        let failures: Vec<String> = self
            .endpoints
            .iter()
            .map(|e| format!("{}: {}", e.url, e.failure().as_deref().unwrap_or("?")))
            .collect();
        Error::NoEndpoint { failures }
    }

    /// Sends the policy of `version` when the servers do not serve it yet (a fresh run, a
    /// resume, or after [`Remote::sync`] was skipped).
    pub fn ensure_serving(&self, version: u64, policy: &Model) -> Result<()> {
        if self.weight_sync == WeightSync::Disk && self.served() != Some(version) {
            self.sync(version, policy)?;
        }
        Ok(())
    }

    /// The version the last sync installed.
    fn served(&self) -> Option<u64> {
        *self.served.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The LoRA adapter generation requests select, if any.
    fn adapter(&self) -> Option<String> {
        self.adapter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Writes the policy of `version` under `weights_dir` and has every live endpoint load it
    /// (only its adapter, for a LoRA policy: see the module docs).
    pub fn sync(&self, version: u64, policy: &Model) -> Result<()> {
        if self.weight_sync == WeightSync::None {
            return Ok(());
        }
        let dir = self.weights_dir.join(format!("step_{version}"));
        let lora = policy.lora_config().is_some();
        let written = if lora {
            let base = policy
                .source_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_default();
            policy.save_adapter(&dir, &base)
        } else {
            policy.save_hf(&dir)
        };
        written.map_err(|source| Error::WritePolicy {
            dir: dir.clone(),
            source,
        })?;
        let marker = dir.join(STABLE);
        std::fs::write(&marker, format!("{version}\n")).at("writing", &marker)?;
        let path = std::path::absolute(&dir)
            .at("resolving", &dir)?
            .to_string_lossy()
            .into_owned();
        if lora {
            self.sync_adapter(version, path)?;
        } else {
            self.sync_weights(version, path)?;
        }
        *self.served.lock().unwrap_or_else(PoisonError::into_inner) = Some(version);
        if let Ok(entries) = std::fs::read_dir(&self.weights_dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let old = name
                    .strip_prefix("step_")
                    .and_then(|v| v.parse::<u64>().ok())
                    .is_some_and(|v| v != version);
                if old {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        Ok(())
    }

    /// Has every live endpoint load the full weights of `path` as `version`; an endpoint that
    /// fails is dropped.
    fn sync_weights(&self, version: u64, path: String) -> Result<()> {
        let body = serde_json::to_value(UpdateWeightsFromDisk {
            model_path: path,
            weight_version: Some(version.to_string()),
            ..Default::default()
        })
        .map_err(|source| Error::Json {
            what: "the weight-update request",
            source,
        })?;
        for i in self.live() {
            let url = format!("{}/update_weights_from_disk", self.endpoints[i].url);
            let answer = self.retrying(|| {
                let v = self.post(&url, &body)?;
                let r: UpdateWeightsResponse = serde_json::from_value(v)
                    .map_err(|e| Failure::Down(format!("{url}: unexpected answer: {e}")))?;
                if r.success {
                    Ok(())
                } else {
                    Err(Failure::Down(format!(
                        "{url}: update failed: {}",
                        r.message
                    )))
                }
            });
            match answer {
                Ok(()) => {}
                Err(Failure::Refused(m) | Failure::Down(m) | Failure::Invalid(m)) => {
                    self.endpoints[i].drop_with(m)
                }
            }
        }
        if self.live().is_empty() {
            return Err(self.none_left());
        }
        Ok(())
    }

    /// Has every live endpoint load the PEFT adapter directory `path` of `version` with its
    /// protocol's `load_lora_adapter` (see the module docs); an endpoint that fails is dropped.
    /// Generation requests select the adapter from then on.
    fn sync_adapter(&self, version: u64, path: String) -> Result<()> {
        let (name, load_url, inplace) = match self.protocol {
            RolloutProtocol::Openai => (POLICY_ADAPTER.to_owned(), "/v1/load_lora_adapter", true),
            RolloutProtocol::Sglang => (
                format!("{POLICY_ADAPTER}-v{version}"),
                "/load_lora_adapter",
                false,
            ),
        };
        let load = request_body(&LoadLoraAdapter {
            lora_name: name.clone(),
            lora_path: path,
            load_inplace: inplace.then_some(true),
            ..Default::default()
        })?;
        let unload = |n: &str| {
            request_body(&UnloadLoraAdapter {
                lora_name: n.to_owned(),
                lora_id: None,
            })
        };
        let previous = self.adapter();
        for i in self.live() {
            let base = &self.endpoints[i].url;
            if self.protocol == RolloutProtocol::Sglang {
                // A name left loaded by an earlier run (a resume) would be refused: unloaded
                // first, whatever the answer.
                let _ = self.send(&format!("{base}/unload_lora_adapter"), &unload(&name)?);
            }
            let url = format!("{base}{load_url}");
            let answer = self.retrying(|| {
                let text = self.send(&url, &load)?;
                if self.protocol == RolloutProtocol::Sglang {
                    let r: LoraUpdateResult = serde_json::from_str(&text)
                        .map_err(|e| Failure::Down(format!("{url}: unexpected answer: {e}")))?;
                    if !r.success {
                        return Err(Failure::Down(format!(
                            "{url}: loading the adapter failed: {}",
                            r.error_message.unwrap_or_default()
                        )));
                    }
                }
                Ok(())
            });
            if let Err(Failure::Refused(m) | Failure::Down(m) | Failure::Invalid(m)) = answer {
                self.endpoints[i].drop_with(m);
            }
        }
        if self.live().is_empty() {
            return Err(self.none_left());
        }
        *self.adapter.lock().unwrap_or_else(PoisonError::into_inner) = Some(name.clone());
        if let Some(old) = previous.filter(|p| *p != name) {
            for i in self.live() {
                let url = format!("{}/unload_lora_adapter", self.endpoints[i].url);
                // The old adapter only takes memory now: a failure to unload it is no reason to
                // drop the endpoint.
                let _ = self.send(&url, &unload(&old)?);
            }
        }
        Ok(())
    }

    /// `n` samples of each prompt, spread over the live endpoints (see the module docs).
    pub fn generate(
        &self,
        prompts: &[Vec<u32>],
        n: usize,
        params: &SamplingParams,
    ) -> Result<RemoteSamples> {
        let mut done: Vec<Option<RemoteSamples>> = (0..prompts.len()).map(|_| None).collect();
        // Ranges of prompts still to generate.
        let mut todo = vec![(0, prompts.len())];
        while !todo.is_empty() {
            let live = self.live();
            if live.is_empty() {
                return Err(self.none_left());
            }
            let mut jobs = Vec::new();
            for &(a, b) in &todo {
                let parts = live.len().min(b - a).max(1);
                for (k, &ep) in live.iter().take(parts).enumerate() {
                    let (s, e) = (a + (b - a) * k / parts, a + (b - a) * (k + 1) / parts);
                    jobs.push((ep, s, e));
                }
            }
            let this = self;
            let results: Vec<_> = std::thread::scope(|scope| {
                let handles: Vec<_> = jobs
                    .iter()
                    .map(|&(ep, s, e)| {
                        scope.spawn(move || this.generate_on(ep, &prompts[s..e], s, n, params))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(Failure::Down("request thread panicked".into()))
                        })
                    })
                    .collect()
            });
            todo.clear();
            for (&(ep, s, e), result) in jobs.iter().zip(results) {
                match result {
                    Ok(samples) => done[s] = Some(samples),
                    Err(Failure::Refused(m)) => return Err(Error::ServerRefused(m)),
                    Err(Failure::Invalid(m)) => return Err(Error::InvalidSample(m)),
                    Err(Failure::Down(m)) => {
                        self.endpoints[ep].drop_with(m);
                        todo.push((s, e));
                    }
                }
            }
        }
        let mut out = RemoteSamples {
            generations: Vec::new(),
            versions: Vec::new(),
            invalid: 0,
            dropped: 0,
        };
        for part in done.into_iter().flatten() {
            out.generations.extend(part.generations);
            out.versions.extend(part.versions);
            out.invalid += part.invalid;
            out.dropped += part.dropped;
        }
        Ok(out)
    }

    /// One chunk (prompts `first..first + prompts.len()` of the step) on endpoint `ep`.
    fn generate_on(
        &self,
        ep: usize,
        prompts: &[Vec<u32>],
        first: usize,
        n: usize,
        p: &SamplingParams,
    ) -> std::result::Result<RemoteSamples, Failure> {
        let base = &self.endpoints[ep].url;
        let offset = (first * n) as u64;
        let extra = (offset > 0).then(|| {
            let mut m = serde_json::Map::new();
            m.insert(STREAM_OFFSET_KEY.into(), offset.into());
            m
        });
        let top_k = if p.top_k == 0 { -1 } else { p.top_k as i64 };
        let batch = Prompt::Batch(prompts.to_vec());
        let adapter = self.adapter();
        let (url, body) = match self.protocol {
            RolloutProtocol::Openai => (
                format!("{base}/v1/completions"),
                serde_json::to_value(CompletionRequest {
                    prompt: batch,
                    n: Some(n),
                    max_tokens: Some(p.max_new_tokens),
                    temperature: Some(p.temperature),
                    top_p: Some(p.top_p),
                    top_k: Some(top_k),
                    // vLLM's seed is a signed 64-bit integer: the bits travel unchanged.
                    seed: Some(p.seed as i64),
                    stop_token_ids: Some(p.stop_ids.clone()),
                    logprobs: Some(0),
                    return_tokens_as_token_ids: Some(true),
                    return_token_ids: Some(true),
                    vllm_xargs: extra,
                    model: adapter.clone(),
                    ..Default::default()
                }),
            ),
            RolloutProtocol::Sglang => (
                format!("{base}/generate"),
                serde_json::to_value(GenerateRequest {
                    input_ids: Some(batch),
                    sampling_params: Some(OneOrMany::One(sglang::SamplingParams {
                        max_new_tokens: Some(p.max_new_tokens),
                        temperature: Some(p.temperature),
                        top_p: Some(p.top_p),
                        top_k: Some(top_k),
                        n: Some(n),
                        stop_token_ids: Some(p.stop_ids.clone()),
                        sampling_seed: Some(p.seed),
                        custom_params: extra,
                        ..Default::default()
                    })),
                    return_logprob: Some(OneOrMany::One(true)),
                    lora_path: adapter.clone().map(|a| OneOrMany::One(Some(a))),
                    ..Default::default()
                }),
            ),
        };
        let body = body.map_err(|e| Failure::Refused(format!("{url}: {e}")))?;
        self.retrying(|| {
            // The version served when the request leaves: the servers finish requests in flight
            // on the weights they had (a request that meets an update waits for the new weights
            // and is then tagged one version too old, never too new).
            let sent_at = self.served();
            let v = self.post(&url, &body)?;
            self.parse(&url, v, prompts.len(), first, n, p.max_new_tokens, sent_at)
        })
    }

    /// Runs `attempt` until it succeeds, is refused, or has failed `retries + 1` times, sleeping
    /// `retry_backoff_s`, doubled each time, in between.
    fn retrying<T>(
        &self,
        attempt: impl Fn() -> std::result::Result<T, Failure>,
    ) -> std::result::Result<T, Failure> {
        let mut failures = 0u32;
        loop {
            match attempt() {
                Err(Failure::Down(m)) if failures >= self.retries => return Err(Failure::Down(m)),
                Err(Failure::Down(_)) => {
                    std::thread::sleep(self.backoff * 2u32.saturating_pow(failures));
                    failures += 1;
                }
                other => return other,
            }
        }
    }

    /// POSTs `body` once; the answer as JSON.
    fn post(
        &self,
        url: &str,
        body: &serde_json::Value,
    ) -> std::result::Result<serde_json::Value, Failure> {
        let text = self.send(url, body)?;
        serde_json::from_str(&text)
            .map_err(|e| Failure::Down(format!("{url}: the answer is not JSON: {e}")))
    }

    /// POSTs `body` once; the answer as text (vLLM answers the adapter endpoints in plain text).
    fn send(&self, url: &str, body: &serde_json::Value) -> std::result::Result<String, Failure> {
        let mut req = self.agent.post(url);
        if let Some(k) = &self.api_key {
            req = req.set("Authorization", &format!("Bearer {k}"));
        }
        match req.send_json(body) {
            Ok(resp) => resp
                .into_string()
                .map_err(|e| Failure::Down(format!("{url}: the answer is unreadable: {e}"))),
            Err(ureq::Error::Status(code, resp)) => {
                let text = resp.into_string().unwrap_or_default();
                let text = text.trim();
                Err(if code < 500 {
                    Failure::Refused(format!(
                        "{url} refused the request ({code}): {text} (does the server speak the \
                         configured [rollout] protocol?)"
                    ))
                } else {
                    Failure::Down(format!("{url}: {code}: {text}"))
                })
            }
            Err(e) => Err(Failure::Down(format!("{url}: {e}"))),
        }
    }

    /// Reads a generation answer for `count` prompts of `n` samples of at most `max_tokens`,
    /// sent while version `sent_at` was served; every sample is checked as `validate` checks a
    /// row ([`sample_problem`]).
    #[allow(clippy::too_many_arguments)]
    fn parse(
        &self,
        url: &str,
        v: serde_json::Value,
        count: usize,
        first: usize,
        n: usize,
        max_tokens: usize,
        sent_at: Option<u64>,
    ) -> std::result::Result<RemoteSamples, Failure> {
        let bad = |what: String| Failure::Down(format!("{url}: {what}"));
        let mut samples: Vec<Sample> = Vec::new();
        match self.protocol {
            RolloutProtocol::Openai => {
                let r: rlreplay_serve::protocol::openai::CompletionResponse =
                    serde_json::from_value(v)
                        .map_err(|e| bad(format!("unexpected answer: {e}")))?;
                for (i, c) in r.choices.into_iter().enumerate() {
                    let lp = c
                        .logprobs
                        .ok_or_else(|| bad(format!("choice {i} has no logprobs")))?;
                    let tokens = match c.token_ids {
                        Some(t) => t,
                        None => lp
                            .tokens
                            .iter()
                            .map(|t| parse_token_placeholder(t))
                            .collect::<Option<Vec<u32>>>()
                            .ok_or_else(|| {
                                bad(format!("choice {i}: tokens are not `token_id:N`"))
                            })?,
                    };
                    let logprobs = lp
                        .token_logprobs
                        .iter()
                        .map(|l| l.filter(|x| x.is_finite()))
                        .collect::<Option<Vec<f32>>>()
                        .ok_or_else(|| bad(format!("choice {i}: a log-prob is missing")))?;
                    samples.push((tokens, logprobs, c.finish_reason.unwrap_or_default(), None));
                }
            }
            RolloutProtocol::Sglang => {
                let outs: Vec<GenerateOutput> = match v {
                    serde_json::Value::Array(_) => serde_json::from_value(v),
                    one => serde_json::from_value(one).map(|o| vec![o]),
                }
                .map_err(|e| bad(format!("unexpected answer: {e}")))?;
                for (i, o) in outs.into_iter().enumerate() {
                    let m = o.meta_info;
                    let lp = m
                        .output_token_logprobs
                        .ok_or_else(|| bad(format!("output {i} has no output_token_logprobs")))?;
                    let logprobs = lp
                        .iter()
                        .map(|e| e.0.filter(|x| x.is_finite()))
                        .collect::<Option<Vec<f32>>>()
                        .ok_or_else(|| bad(format!("output {i}: a log-prob is missing")))?;
                    samples.push((
                        o.output_ids,
                        logprobs,
                        m.finish_reason.map(|f| f.kind).unwrap_or_default(),
                        m.weight_version.parse().ok(),
                    ));
                }
            }
        }
        if samples.len() != count * n {
            return Err(bad(format!(
                "{} samples for {count} prompts of {n}",
                samples.len()
            )));
        }
        let mut out = RemoteSamples {
            generations: Vec::with_capacity(samples.len()),
            versions: Vec::with_capacity(samples.len()),
            invalid: 0,
            dropped: 0,
        };
        // Groups holding an invalid sample (`invalid_samples = "drop"`).
        let mut bad_groups = vec![false; count];
        for (i, (tokens, logprobs, finish, reported)) in samples.into_iter().enumerate() {
            if tokens.len() != logprobs.len() {
                return Err(bad(format!(
                    "sample {i}: {} tokens but {} log-probs",
                    tokens.len(),
                    logprobs.len()
                )));
            }
            let truncated = match finish.as_str() {
                "stop" => false,
                "length" => true,
                other => return Err(bad(format!("sample {i} ended with {other:?}"))),
            };
            if let Some(why) = sample_problem(&tokens, &logprobs, max_tokens, self.vocab) {
                match self.invalid_samples {
                    InvalidSamples::Error => {
                        return Err(Failure::Invalid(format!(
                            "{url}: prompt {} sample {}: {why}",
                            first + i / n,
                            i % n
                        )))
                    }
                    InvalidSamples::Drop => {
                        out.invalid += 1;
                        bad_groups[i / n] = true;
                    }
                }
            }
            out.generations.push(Generation {
                prompt: first + i / n,
                sample: i % n,
                tokens,
                logprobs,
                truncated,
            });
            let version = match self.weight_sync {
                WeightSync::None => None,
                // The server's weight version is its base model's: an adapter's version is the
                // one the request asked for.
                WeightSync::Disk if self.adapter().is_some() => sent_at,
                WeightSync::Disk => reported.or(sent_at),
            };
            out.versions.push(version);
        }
        if bad_groups.contains(&true) {
            let before = out.generations.len();
            let keep: Vec<bool> = out
                .generations
                .iter()
                .map(|g| !bad_groups[g.prompt - first])
                .collect();
            let mut k = keep.iter();
            out.generations.retain(|_| *k.next().unwrap_or(&false));
            let mut k = keep.iter();
            out.versions.retain(|_| *k.next().unwrap_or(&false));
            out.dropped = before - out.generations.len();
        }
        Ok(out)
    }
}
