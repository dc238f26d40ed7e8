//! Weight updates, LoRA adapters, pausing and server information: SGLang's endpoints
//! (`/update_weights_from_disk`, `/load_lora_adapter`, `/unload_lora_adapter`,
//! `/pause_generation`, `/continue_generation`, `/get_weight_version`, `/get_model_info`), vLLM's
//! (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`) and prime-rl's aliases
//! (`/update_weights`, `/pause`, `/resume`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `POST /update_weights_from_disk`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateWeightsFromDisk {
    /// A Hugging Face model directory (config.json, safetensors) of the same architecture.
    pub model_path: String,
    /// Only `auto` or `safetensors`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_format: Option<String>,
    /// The version the server reports after the update (unchanged when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_version: Option<String>,
    /// Abort the requests in flight (they return what they generated, finish reason `abort`)
    /// instead of letting them finish on the old weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort_all_requests: Option<bool>,
    /// Accepted for compatibility (there is no prefix cache to flush).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_cache: Option<bool>,
}

/// prime-rl's `POST /update_weights`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateWeights {
    /// The model directory.
    pub weight_dir: String,
    /// The version the server reports after the update (unchanged when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_version: Option<String>,
}

/// Answer of a weight update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpdateWeightsResponse {
    /// Whether the new weights are in place.
    pub success: bool,
    /// What happened.
    pub message: String,
    /// Requests that arrived during the update and waited for the new weights.
    pub num_paused_requests: usize,
}

/// How `pause_generation` treats the requests in flight.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseMode {
    /// Finish them now with what they generated (finish reason `abort`); SGLang's default.
    #[default]
    Abort,
    /// Keep them, with their caches, until `continue_generation`.
    InPlace,
    /// As `in_place` (this server keeps the caches either way).
    Retract,
}

/// `POST /pause_generation` (the body may be empty).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PauseGeneration {
    /// What happens to the requests in flight.
    #[serde(default)]
    pub mode: PauseMode,
}

/// `POST /continue_generation` (the body may be empty).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContinueGeneration {
    /// Accepted for compatibility.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch_empty_cache: Option<bool>,
}

/// Answer of `pause_generation` / `continue_generation`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusResponse {
    /// What happened.
    pub message: String,
    /// Always `ok`.
    pub status: String,
}

/// `GET /get_weight_version`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightVersion {
    /// The version of the weights new requests run on.
    pub weight_version: String,
}

/// `GET /get_model_info`: SGLang's fields, then the log-prob mode and context length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// The directory of the weights in use.
    pub model_path: String,
    /// The tokenizer directory, if any.
    pub tokenizer_path: Option<String>,
    /// Always true.
    pub is_generation: bool,
    /// Always `null`.
    pub preferred_sampling_params: Option<serde_json::Value>,
    /// The version of the weights in use.
    pub weight_version: String,
    /// `processed` or `raw`: the distribution returned log-probs are of.
    pub logprobs_mode: String,
    /// Longest prompt plus completion.
    pub max_model_len: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
}

/// `GET /get_server_info`: counters of the engine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerInfo {
    /// The version of the weights in use.
    pub weight_version: String,
    /// Sequences decoded together at most.
    pub max_num_seqs: usize,
    /// Forward passes run (prefills and decode steps).
    pub forward_passes: u64,
    /// Decode steps run (each serves every live sequence of every request).
    pub decode_steps: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Most sequences one decode step has served.
    pub max_running_seqs: usize,
    /// Most prompt groups one decode step has served (one per prompt of one-prompt requests; a
    /// prompt whose `n` is above `max_num_seqs` runs as several groups).
    pub max_running_requests: usize,
    /// Sequences decoding now.
    pub running_seqs: usize,
    /// Prompt groups waiting for room in the batch (a prompt whose `n` is above `max_num_seqs`
    /// waits as several).
    pub waiting_prompts: usize,
    /// Requests held while generation is paused or the weights are being updated.
    pub held_requests: usize,
    /// Whether generation is paused.
    pub paused: bool,
    /// Weight updates done.
    pub weight_updates: u64,
}

/// `POST /v1/load_lora_adapter` (vLLM's `LoadLoRAAdapterRequest`) and `POST /load_lora_adapter`
/// (SGLang's `LoadLoRAAdapterReqInput`): serve the PEFT adapter directory `lora_path` under
/// `lora_name`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadLoraAdapter {
    /// The name requests select the adapter by (`model` in completions, `lora_path` in generate).
    pub lora_name: String,
    /// A PEFT adapter directory (`adapter_config.json`, `adapter_model.safetensors`).
    pub lora_path: String,
    /// vLLM's: replace an adapter already loaded under `lora_name` (without it that is a 400).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_inplace: Option<bool>,
    /// SGLang's: accepted for compatibility (every adapter stays in memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<bool>,
    /// SGLang's: accepted for compatibility.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_id: Option<String>,
}

/// `POST /v1/unload_lora_adapter` and `POST /unload_lora_adapter`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnloadLoraAdapter {
    /// The adapter's name.
    pub lora_name: String,
    /// SGLang's: accepted for compatibility.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_id: Option<String>,
}

/// SGLang's answer to `/load_lora_adapter` and `/unload_lora_adapter` (200 on success, 400 with
/// `success: false` otherwise). vLLM's endpoints answer a plain-text message instead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoraUpdateResult {
    /// Whether the adapter was loaded (or unloaded).
    pub success: bool,
    /// Why not, on failure.
    #[serde(default)]
    pub error_message: Option<String>,
    /// Every adapter served afterwards: name to directory.
    #[serde(default)]
    pub loaded_adapters: BTreeMap<String, String>,
}
