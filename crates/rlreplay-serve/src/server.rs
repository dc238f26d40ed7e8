//! The HTTP server: routes, authentication, body limits and JSON errors, over the engine thread of
//! [`crate::worker`].

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{to_bytes, Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{header, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rlreplay_model::generate::Decoder;
use rlreplay_model::{DType, Device, Model, ModelConfig};
use rlreplay_sampling::sampling::LogprobMode;
use serde::Serialize;
use tokio::sync::oneshot;

use crate::conn::ConnLimits;
use crate::protocol::control::{
    ContinueGeneration, LoadLoraAdapter, LoraUpdateResult, ModelInfo, PauseGeneration, ServerInfo,
    StatusResponse, UnloadLoraAdapter, UpdateWeights, UpdateWeightsFromDisk, UpdateWeightsResponse,
    WeightVersion,
};
use crate::protocol::openai::{
    CompletionRequest, CompletionResponse, ErrorInfo, ModelCard, ModelList,
};
use crate::protocol::sglang::{self, GenerateOutput, GenerateRequest};
use crate::protocol::{parse_body, FieldError};
use crate::request::{Limits, Tokens};
use crate::worker::{Command, JobResult, Pause, UnknownAdapter, Worker};
use crate::{Error, Result};

/// Settings of `rlreplay serve`.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Hugging Face model directory.
    pub model: PathBuf,
    /// Tokenizer directory (default: the model directory; none found: token ids only).
    pub tokenizer: Option<PathBuf>,
    /// Address to bind (loopback by default).
    pub host: String,
    /// Port (0: any free port).
    pub port: u16,
    /// Required `Authorization: Bearer` key, if any.
    pub api_key: Option<String>,
    /// Which distribution returned log-probs are of.
    pub logprobs_mode: LogprobMode,
    /// Sequences of one served model (the base model or an adapter) decoded together at most.
    pub max_num_seqs: usize,
    /// Longest prompt plus completion (default: the model's `max_position_embeddings`).
    pub max_model_len: Option<usize>,
    /// The model name requests may give (default: the model path as given).
    pub served_model_name: Option<String>,
    /// The weight version reported before the first update.
    pub weight_version: String,
    /// Largest request body in bytes.
    pub max_body_bytes: usize,
    /// Compute dtype.
    pub dtype: DType,
    /// Largest `n`.
    pub max_n: usize,
    /// Most prompts in one request (more: 400).
    pub max_prompts_per_request: usize,
    /// Most samples in one request, `n` times its prompts (more: 400).
    pub max_seqs_per_request: usize,
    /// Connections served at once; more wait in the listen backlog until one closes.
    pub max_connections: usize,
    /// Longest time from the first byte of a request to the end of its headers; a connection
    /// that overruns it is closed.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight and no traffic for this long is closed.
    pub idle_timeout: Duration,
    /// LoRA adapters served next to the base model from the start: name and PEFT adapter
    /// directory. Each holds a copy of the base weights with the adapter merged.
    pub adapters: Vec<(String, PathBuf)>,
}

impl ServeConfig {
    /// The defaults for a model directory: 127.0.0.1:8000, processed log-probs, 256 sequences,
    /// 64 MiB bodies, f32; requests of at most 8192 prompts and 16384 samples, `n` up to 1024;
    /// 512 connections, 10 s to send a request's headers, idle connections closed after 30 s.
    pub fn new(model: impl Into<PathBuf>) -> Self {
        Self {
            model: model.into(),
            tokenizer: None,
            host: "127.0.0.1".into(),
            port: 8000,
            api_key: None,
            logprobs_mode: LogprobMode::Processed,
            max_num_seqs: 256,
            max_model_len: None,
            served_model_name: None,
            weight_version: "default".into(),
            max_body_bytes: 64 << 20,
            dtype: DType::F32,
            max_n: 1024,
            max_prompts_per_request: 8192,
            max_seqs_per_request: 16384,
            max_connections: 512,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            adapters: Vec::new(),
        }
    }

    /// The name requests give for the base model: `served_model_name`, else the model path.
    pub fn model_name(&self) -> String {
        self.served_model_name
            .clone()
            .unwrap_or_else(|| self.model.display().to_string())
    }
}

impl ServeConfig {
    /// Refuses settings with which the server could not serve a request (a zero limit, a
    /// context shorter than one prompt token plus one generated token).
    pub fn check(&self) -> Result<()> {
        let at_least_one = |what: &str, value: usize| {
            if value == 0 {
                Err(Error::Config(format!("{what} must be at least 1, got 0")))
            } else {
                Ok(())
            }
        };
        at_least_one("max_num_seqs (--max-num-seqs)", self.max_num_seqs)?;
        at_least_one("max_n", self.max_n)?;
        at_least_one(
            "max_prompts_per_request (--max-prompts-per-request)",
            self.max_prompts_per_request,
        )?;
        at_least_one(
            "max_seqs_per_request (--max-seqs-per-request)",
            self.max_seqs_per_request,
        )?;
        at_least_one("max_body_bytes (--max-body-mib)", self.max_body_bytes)?;
        at_least_one("max_connections (--max-connections)", self.max_connections)?;
        if let Some(len) = self.max_model_len {
            if len < 2 {
                return Err(Error::Config(format!(
                    "max_model_len (--max-model-len) must be at least 2 (a prompt token and a \
                     generated token), got {len}"
                )));
            }
        }
        if u32::try_from(self.max_connections).is_err() {
            return Err(Error::Config(format!(
                "max_connections (--max-connections) must be at most {}, got {}",
                u32::MAX,
                self.max_connections
            )));
        }
        let base = self.model_name();
        let mut names = std::collections::HashSet::new();
        for (name, dir) in &self.adapters {
            check_adapter_name(name, &base).map_err(Error::Config)?;
            if !names.insert(name) {
                return Err(Error::Config(format!(
                    "two adapters are named `{name}` (--adapter / --lora-modules); the second is \
                     {}",
                    dir.display()
                )));
            }
        }
        for (name, flag, d) in [
            (
                "header_read_timeout",
                "header-read-timeout-secs",
                self.header_read_timeout,
            ),
            ("idle_timeout", "idle-timeout-secs", self.idle_timeout),
        ] {
            if d.is_zero() {
                return Err(Error::Config(format!(
                    "{name} (--{flag}) must be above zero"
                )));
            }
        }
        Ok(())
    }
}

/// Refuses an adapter name requests could not select: empty, or the base model's name.
fn check_adapter_name(name: &str, base: &str) -> std::result::Result<(), String> {
    if name.is_empty() {
        return Err("an adapter name must not be empty".into());
    }
    if name == base {
        return Err(format!(
            "the adapter name `{name}` is the base model's name: requests could not select it"
        ));
    }
    Ok(())
}

/// Most alternatives per token in `logprobs` / `top_logprobs_num` (vLLM's default `max_logprobs`).
pub const MAX_LOGPROBS: usize = 20;

/// The shared state of the handlers.
struct AppState {
    tx: mpsc::Sender<Command>,
    limits: Limits,
    tokens: Tokens,
    cfg: ServeConfig,
    model_config: ModelConfig,
    model_path: Arc<Mutex<String>>,
    /// The served LoRA adapters: name to directory.
    adapters: Mutex<BTreeMap<String, String>>,
    next_id: AtomicU64,
    started: u64,
    /// Serialises weight updates and adapter loads and unloads.
    update: tokio::sync::Mutex<()>,
}

impl AppState {
    fn send(&self, cmd: Command) -> std::result::Result<(), ApiError> {
        self.tx
            .send(cmd)
            .map_err(|_| ApiError::internal("the engine thread has stopped"))
    }

    async fn ask<T>(&self, cmd: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T, ApiError> {
        let (tx, rx) = oneshot::channel();
        self.send(cmd(tx))?;
        rx.await
            .map_err(|_| ApiError::internal("the engine thread has stopped"))
    }

    /// The served adapters: name to directory.
    fn adapters(&self) -> BTreeMap<String, String> {
        self.adapters.lock().map(|a| a.clone()).unwrap_or_default()
    }

    /// The base model's name.
    fn model_name(&self) -> String {
        self.limits.model_name.clone().unwrap_or_default()
    }

    /// The adapter a completions request's `model` selects: `None` for the base model (or no
    /// name); an unknown name is a 404 naming it, as vLLM answers.
    fn resolve_model(&self, model: Option<&str>) -> std::result::Result<Option<String>, ApiError> {
        let base = self.model_name();
        match model {
            None => Ok(None),
            Some(m) if m == base => Ok(None),
            Some(m) if self.adapters().contains_key(m) => Ok(Some(m.to_owned())),
            Some(m) => Err(ApiError::bad(FieldError::new(
                "model",
                format!(
                    "the model `{m}` does not exist (this server serves `{base}`{})",
                    self.adapter_list(" and the LoRA adapters ")
                ),
            ))),
        }
    }

    /// The adapter a generate request's `lora_path` names, when it is served: a 400 otherwise.
    fn resolve_lora_path(
        &self,
        name: Option<String>,
    ) -> std::result::Result<Option<String>, ApiError> {
        match name {
            Some(n) if !self.adapters().contains_key(&n) => Err(ApiError::bad(FieldError::new(
                "lora_path",
                format!(
                    "the LoRA adapter `{n}` is not loaded (loaded: {})",
                    match self.adapter_list("") {
                        l if l.is_empty() => "none".into(),
                        l => l,
                    }
                ),
            ))),
            other => Ok(other),
        }
    }

    /// `` `a`, `b` `` after `lead`, or nothing without adapters.
    fn adapter_list(&self, lead: &str) -> String {
        let names: Vec<String> = self.adapters().keys().map(|n| format!("`{n}`")).collect();
        if names.is_empty() {
            String::new()
        } else {
            format!("{lead}{}", names.join(", "))
        }
    }
}

/// The model's end-of-sequence ids: `eos_token_id` of `config.json` and of
/// `generation_config.json` (an id or a list), as vLLM stops on both.
pub fn eos_ids(model_dir: &Path, cfg: &ModelConfig) -> Vec<u32> {
    let mut ids = Vec::new();
    let mut add = |v: Option<&serde_json::Value>| {
        let vals = match v {
            Some(serde_json::Value::Array(a)) => a.clone(),
            Some(v) => vec![v.clone()],
            None => Vec::new(),
        };
        for v in vals {
            if let Some(id) = v.as_u64().and_then(|i| u32::try_from(i).ok()) {
                if !ids.contains(&id) && (id as usize) < cfg.vocab_size {
                    ids.push(id);
                }
            }
        }
    };
    add(cfg.extra.get("eos_token_id"));
    if let Ok(text) = std::fs::read_to_string(model_dir.join("generation_config.json")) {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
            add(v.get("eos_token_id"));
        }
    }
    ids
}

/// Loads the weights of `dir` for decoding.
fn load_decoder(dir: &Path, dtype: DType) -> Result<(ModelConfig, Decoder)> {
    let model = Model::load(dir, dtype, &Device::Cpu)
        .map_err(|e| Error::Model(format!("loading {}: {e}", dir.display())))?;
    let cfg = model.config().clone();
    let decoder =
        Decoder::new(&model).map_err(|e| Error::Model(format!("preparing the decoder: {e}")))?;
    Ok((cfg, decoder))
}

/// Loads the base weights of `base` with the PEFT adapter of `adapter` merged, for decoding: the
/// samples are those of a [`Decoder`] of the base model with [`Model::load_adapter`]. A bad
/// adapter is an [`Error::Adapter`] naming the file, tensor, module and shapes.
pub fn load_adapter_decoder(base: &Path, adapter: &Path, dtype: DType) -> Result<Decoder> {
    let mut model = Model::load(base, dtype, &Device::Cpu)
        .map_err(|e| Error::Model(format!("loading the base model {}: {e}", base.display())))?;
    model
        .load_adapter(adapter)
        .map_err(|e| Error::Adapter(format!("{}: {e}", adapter.display())))?;
    Decoder::new(&model).map_err(|e| Error::Model(format!("preparing the decoder: {e}")))
}

/// A server bound to its address, not yet serving.
pub struct BoundServer {
    listener: tokio::net::TcpListener,
    app: Router,
    limits: ConnLimits,
    runtime: tokio::runtime::Runtime,
    worker: std::thread::JoinHandle<()>,
}

impl BoundServer {
    /// Loads the model, starts the engine thread and binds `host:port`.
    pub fn bind(cfg: ServeConfig) -> Result<Self> {
        cfg.check()?;
        let max_connections = u32::try_from(cfg.max_connections)
            .map_err(|_| Error::Config("max_connections is out of range".into()))?;
        let (model_config, decoder) = load_decoder(&cfg.model, cfg.dtype)?;
        let tok_dir = cfg.tokenizer.clone().unwrap_or_else(|| cfg.model.clone());
        let tok_file = tok_dir.join("tokenizer.json");
        let tokenizer = if tok_file.exists() {
            Some(
                tokenizers::Tokenizer::from_file(&tok_file)
                    .map_err(|e| Error::Model(format!("loading {}: {e}", tok_file.display())))?,
            )
        } else if cfg.tokenizer.is_some() {
            return Err(Error::Model(format!(
                "{} does not exist",
                tok_file.display()
            )));
        } else {
            None
        };
        let max_model_len = cfg
            .max_model_len
            .unwrap_or(model_config.max_position_embeddings)
            .min(model_config.max_position_embeddings);
        let model_name = cfg.model_name();
        let limits = Limits {
            vocab_size: model_config.vocab_size,
            max_model_len,
            eos_ids: eos_ids(&cfg.model, &model_config),
            max_n: cfg.max_n,
            max_prompts: cfg.max_prompts_per_request,
            max_seqs: cfg.max_seqs_per_request,
            max_logprobs: MAX_LOGPROBS,
            model_name: Some(model_name),
        };
        let model_path = Arc::new(Mutex::new(cfg.model.display().to_string()));
        let (tx, rx) = mpsc::channel();
        let mut w = Worker::new(
            decoder,
            cfg.max_num_seqs,
            cfg.logprobs_mode,
            cfg.weight_version.clone(),
            model_path.clone(),
        );
        let mut adapters = BTreeMap::new();
        for (name, dir) in &cfg.adapters {
            let decoder = load_adapter_decoder(&cfg.model, dir, cfg.dtype).map_err(|e| {
                Error::Adapter(format!("adapter `{name}` ({}): {e}", dir.display()))
            })?;
            w.add_adapter(name.clone(), Box::new(decoder));
            adapters.insert(name.clone(), dir.display().to_string());
        }
        let worker = std::thread::Builder::new()
            .name("rlreplay-engine".into())
            .spawn(move || w.run(rx))
            .map_err(|e| Error::Io(format!("starting the engine thread: {e}")))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| Error::Io(format!("starting the async runtime: {e}")))?;
        let addr = format!("{}:{}", cfg.host, cfg.port);
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(&addr))
            .map_err(|e| Error::Io(format!("binding {addr}: {e}")))?;
        let conn_limits = ConnLimits {
            max_connections,
            header_read_timeout: cfg.header_read_timeout,
            idle_timeout: cfg.idle_timeout,
        };
        let state = Arc::new(AppState {
            tx,
            limits,
            tokens: Tokens::new(tokenizer),
            model_config,
            model_path,
            adapters: Mutex::new(adapters),
            next_id: AtomicU64::new(0),
            started: now(),
            update: tokio::sync::Mutex::new(()),
            cfg,
        });
        Ok(Self {
            listener,
            app: router(state),
            limits: conn_limits,
            runtime,
            worker,
        })
    }

    /// The bound address (the actual port when bound to port 0).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener
            .local_addr()
            .map_err(|e| Error::Io(format!("reading the bound address: {e}")))
    }

    /// Serves until `shutdown` resolves, then stops the engine thread.
    pub fn serve_until(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        let Self {
            listener,
            app,
            limits,
            runtime,
            worker,
        } = self;
        runtime.block_on(crate::conn::serve(listener, app, limits, shutdown));
        // Dropping the runtime drops the router and with it the last sender: the engine stops.
        drop(runtime);
        let _ = worker.join();
        Ok(())
    }

    /// Serves on a background thread; the handle stops it.
    pub fn spawn(self) -> Result<ServerHandle> {
        let addr = self.local_addr()?;
        let (tx, rx) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("rlreplay-serve".into())
            .spawn(move || {
                let _ = self.serve_until(async {
                    let _ = rx.await;
                });
            })
            .map_err(|e| Error::Io(format!("starting the server thread: {e}")))?;
        Ok(ServerHandle {
            addr,
            stop: Some(tx),
            thread: Some(thread),
        })
    }
}

/// A server running on a background thread (see [`BoundServer::spawn`]); stops when dropped.
pub struct ServerHandle {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServerHandle {
    /// The address it serves on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://host:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops serving and waits for the threads.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// Resolves on Ctrl-C or SIGTERM (for [`BoundServer::serve_until`]).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn router(state: Arc<AppState>) -> Router {
    let protected = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/generate", post(generate))
        .route("/update_weights_from_disk", post(update_weights_from_disk))
        .route("/update_weights", post(update_weights))
        .route("/v1/load_lora_adapter", post(load_lora_adapter))
        .route("/v1/unload_lora_adapter", post(unload_lora_adapter))
        .route("/load_lora_adapter", post(load_lora_adapter))
        .route("/unload_lora_adapter", post(unload_lora_adapter))
        .route("/pause_generation", post(pause_generation))
        .route("/continue_generation", post(continue_generation))
        .route("/pause", post(pause))
        .route("/resume", post(resume))
        .route("/get_weight_version", get(get_weight_version))
        .route("/get_model_info", get(get_model_info))
        .route("/get_server_info", get(get_server_info))
        .route("/flush_cache", get(flush_cache).post(flush_cache))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .route("/health", get(health))
        .route("/health_generate", get(health))
        .merge(protected)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// An HTTP error in the shape of the endpoint's protocol.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    param: Option<String>,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, param: Option<String>, message: impl Into<String>) -> Self {
        Self {
            status,
            param,
            message: message.into(),
        }
    }

    fn bad(e: FieldError) -> Self {
        let status = if e.param == "model" {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::BAD_REQUEST
        };
        Self::new(status, Some(e.param), e.message)
    }

    fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, None, message)
    }

    /// The response: vLLM's envelope under `/v1/`, SGLang's otherwise.
    fn render(self, path: &str) -> Response {
        let code = self.status.as_u16();
        let body = if path.starts_with("/v1/") {
            let kind = match code {
                400 => "BadRequestError",
                401 => "AuthenticationError",
                404 => "NotFoundError",
                405 => "MethodNotAllowedError",
                413 => "RequestTooLargeError",
                _ => "InternalServerError",
            };
            serde_json::to_value(crate::protocol::openai::ErrorResponse {
                error: ErrorInfo {
                    message: self.message,
                    kind: kind.into(),
                    param: self.param,
                    code,
                },
            })
        } else {
            serde_json::to_value(sglang::ErrorResponse {
                object: "error".into(),
                message: self.message,
                kind: self.status.canonical_reason().unwrap_or("Error").to_owned(),
                param: self.param,
                code,
            })
        };
        let body = body.unwrap_or_else(|_| serde_json::json!({"message": "error"}));
        (self.status, Json(body)).into_response()
    }
}

/// A handler's result: JSON, or an error rendered for `path`.
type Reply = std::result::Result<Response, ApiError>;

fn json<T: Serialize>(v: &T) -> Reply {
    Ok(Json(v).into_response())
}

/// Reads a body up to the size limit.
async fn read_body(state: &AppState, body: Body) -> std::result::Result<Bytes, ApiError> {
    let limit = state.cfg.max_body_bytes;
    to_bytes(body, limit).await.map_err(|e| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            Some("body".into()),
            format!("the request body is over the limit of {limit} bytes or unreadable: {e}"),
        )
    })
}

/// Parses a JSON body; an empty body is `{}` when `empty_ok`.
fn parse<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    empty_ok: bool,
) -> std::result::Result<T, ApiError> {
    let blank = bytes.iter().all(u8::is_ascii_whitespace);
    parse_body(if blank && empty_ok { b"{}" } else { bytes }).map_err(ApiError::bad)
}

/// Wraps a handler so that its errors come out in the shape of its endpoint.
macro_rules! handler {
    ($name:ident, $inner:ident $(, $arg:ident : $ty:ty)*) => {
        async fn $name(State(s): State<Arc<AppState>>, uri: Uri $(, $arg: $ty)*) -> Response {
            match $inner(&s $(, $arg)*).await {
                Ok(r) => r,
                Err(e) => e.render(uri.path()),
            }
        }
    };
}

handler!(completions, completions_inner, body: Body);
handler!(generate, generate_inner, body: Body);
handler!(update_weights_from_disk, update_from_disk_inner, body: Body);
handler!(update_weights, update_weights_inner, body: Body);
handler!(pause_generation, pause_generation_inner, body: Body);
handler!(continue_generation, continue_inner, body: Body);
handler!(pause, pause_inner, q: Query<HashMap<String, String>>);
handler!(resume, resume_inner);
handler!(get_server_info, server_info_inner);

/// `POST /v1/load_lora_adapter` and `/load_lora_adapter`.
async fn load_lora_adapter(State(s): State<Arc<AppState>>, uri: Uri, body: Body) -> Response {
    match load_adapter_inner(&s, &uri, body).await {
        Ok(r) => r,
        Err(e) => e.render(uri.path()),
    }
}

/// `POST /v1/unload_lora_adapter` and `/unload_lora_adapter`.
async fn unload_lora_adapter(State(s): State<Arc<AppState>>, uri: Uri, body: Body) -> Response {
    match unload_adapter_inner(&s, &uri, body).await {
        Ok(r) => r,
        Err(e) => e.render(uri.path()),
    }
}

/// Cancels a submitted job when its request goes away before the result.
struct CancelOnDrop<'a> {
    state: &'a AppState,
    id: u64,
    armed: bool,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.state.send(Command::Cancel { id: self.id });
        }
    }
}

/// Submits a job on the base model or `adapter` and waits for it. An adapter unloaded before
/// the job starts is an error of field `param`.
async fn run_job(
    state: &AppState,
    job: Arc<crate::request::Job>,
    adapter: Option<String>,
    param: &str,
) -> std::result::Result<(u64, JobResult), ApiError> {
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = oneshot::channel();
    state.send(Command::Submit {
        id,
        job,
        adapter,
        reply: tx,
    })?;
    let mut guard = CancelOnDrop {
        state,
        id,
        armed: true,
    };
    let result = rx
        .await
        .map_err(|_| ApiError::internal("the engine thread has stopped"))?;
    guard.armed = false;
    match result {
        Ok(r) => Ok((id, r)),
        Err(UnknownAdapter(name)) => Err(ApiError::bad(FieldError::new(
            param,
            format!("the LoRA adapter `{name}` was unloaded before the request started"),
        ))),
    }
}

async fn completions_inner(state: &AppState, body: Body) -> Reply {
    let bytes = read_body(state, body).await?;
    let mut req: CompletionRequest = parse(&bytes, false)?;
    // The base model's name is checked here with the adapters' (`to_job` knows only the base).
    let model = req.model.take();
    let adapter = state.resolve_model(model.as_deref())?;
    let job = Arc::new(
        req.to_job(&state.limits, &state.tokens)
            .map_err(ApiError::bad)?,
    );
    let created = now();
    let (id, result) = run_job(state, job.clone(), adapter.clone(), "model").await?;
    let rid = req
        .request_id
        .clone()
        .unwrap_or_else(|| format!("cmpl-{id:016x}{:016x}", rand::random::<u64>()));
    let model = adapter.unwrap_or_else(|| state.model_name());
    json(&CompletionResponse::new(
        &req,
        &job,
        &result.completions,
        rid,
        created,
        model,
        &state.tokens,
    ))
}

async fn generate_inner(state: &AppState, body: Body) -> Reply {
    let bytes = read_body(state, body).await?;
    let req: GenerateRequest = parse(&bytes, false)?;
    let job = Arc::new(
        req.to_job(&state.limits, &state.tokens)
            .map_err(ApiError::bad)?,
    );
    let adapter = req
        .adapter(job.prompts.len())
        .map_err(ApiError::bad)
        .and_then(|a| state.resolve_lora_path(a))?;
    let (id, result) = run_job(state, job.clone(), adapter, "lora_path").await?;
    let fallback = format!("{id:x}");
    let n = job.n;
    let outputs: Vec<GenerateOutput> = result
        .completions
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (p, j) = (i / n, i % n);
            GenerateOutput::new(
                &req,
                &job,
                p,
                c,
                req.rid(p, j, &fallback),
                &result.weight_version,
                result.latency,
                &state.tokens,
            )
        })
        .collect();
    if req.single_output(n) {
        json(&outputs[0])
    } else {
        json(&outputs)
    }
}

/// Loads new weights and swaps them in (see the crate docs for what happens to requests). The
/// update runs in a task of its own: once the engine holds new requests for it, it finishes
/// (swapping the weights or releasing the held requests on the old ones) whether or not the
/// caller stays for the answer.
async fn update(
    state: &Arc<AppState>,
    path: String,
    version: Option<String>,
    abort: bool,
) -> Reply {
    tokio::spawn(run_update(state.clone(), path, version, abort))
        .await
        .map_err(|e| ApiError::internal(format!("the weight update task failed: {e}")))?
}

/// The body of [`update`].
async fn run_update(
    state: Arc<AppState>,
    path: String,
    version: Option<String>,
    abort: bool,
) -> Reply {
    let _one_at_a_time = state.update.lock().await;
    let dir = PathBuf::from(&path);
    let dtype = state.cfg.dtype;
    let served = state.model_config.clone();
    let adapters = state.adapters();
    state
        .ask(|reply| Command::BeginUpdate { abort, reply })
        .await?;
    let loaded = tokio::task::spawn_blocking(move || {
        let (cfg, decoder) = load_decoder(&dir, dtype)?;
        check_same_architecture(&served, &cfg)?;
        // The served adapters, merged into the new weights.
        let mut merged = Vec::with_capacity(adapters.len());
        for (name, adapter) in adapters {
            let d = load_adapter_decoder(&dir, Path::new(&adapter), dtype).map_err(|e| {
                Error::Adapter(format!(
                    "the served LoRA adapter `{name}` does not load onto the new weights (unload \
                     it first): {e}"
                ))
            })?;
            merged.push((name, Box::new(d)));
        }
        Ok::<_, Error>((decoder, merged))
    })
    .await
    .map_err(|e| ApiError::internal(format!("the loading task failed: {e}")))?;
    match loaded {
        Ok((decoder, adapters)) => {
            let held = state
                .ask(|reply| Command::Swap {
                    decoder: Box::new(decoder),
                    adapters,
                    model_path: path,
                    version: version.clone(),
                    reply,
                })
                .await?;
            let mut message = "Succeeded to update model weights.".to_owned();
            if let Some(v) = &version {
                message.push_str(&format!(" Weight version updated to {v}."));
            }
            json(&UpdateWeightsResponse {
                success: true,
                message,
                num_paused_requests: held,
            })
        }
        Err(e) => {
            state.ask(|reply| Command::CancelUpdate { reply }).await?;
            Ok((
                StatusCode::BAD_REQUEST,
                Json(UpdateWeightsResponse {
                    success: false,
                    message: format!("Failed to update weights: {e}. The old weights stay in use."),
                    num_paused_requests: 0,
                }),
            )
                .into_response())
        }
    }
}

/// Rejects weights of another shape than the served model's.
fn check_same_architecture(served: &ModelConfig, new: &ModelConfig) -> Result<()> {
    let shape = |c: &ModelConfig| {
        (
            c.architecture,
            c.vocab_size,
            c.hidden_size,
            c.intermediate_size,
            c.num_hidden_layers,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.tie_word_embeddings,
        )
    };
    if shape(served) != shape(new) {
        return Err(Error::Model(format!(
            "the new weights have another shape (architecture, vocab, hidden, intermediate, \
             layers, heads, kv heads, head dim, tied) = {:?} than the served model's {:?}",
            shape(new),
            shape(served)
        )));
    }
    Ok(())
}

async fn update_from_disk_inner(state: &Arc<AppState>, body: Body) -> Reply {
    let bytes = read_body(state, body).await?;
    let req: UpdateWeightsFromDisk = parse(&bytes, false)?;
    if let Some(f) = &req.load_format {
        if f != "auto" && f != "safetensors" {
            return Err(ApiError::bad(FieldError::new(
                "load_format",
                format!("only auto or safetensors is supported, got {f}"),
            )));
        }
    }
    update(
        state,
        req.model_path,
        req.weight_version,
        req.abort_all_requests.unwrap_or(false),
    )
    .await
}

async fn update_weights_inner(state: &Arc<AppState>, body: Body) -> Reply {
    let bytes = read_body(state, body).await?;
    let req: UpdateWeights = parse(&bytes, false)?;
    update(state, req.weight_dir, req.weight_version, false).await
}

fn status(message: &str) -> Reply {
    json(&StatusResponse {
        message: message.into(),
        status: "ok".into(),
    })
}

async fn pause_generation_inner(state: &AppState, body: Body) -> Reply {
    let bytes = read_body(state, body).await?;
    let req: PauseGeneration = parse(&bytes, true)?;
    state
        .ask(|reply| Command::Pause {
            mode: req.mode.into(),
            reply,
        })
        .await?;
    status("Generation paused successfully.")
}

async fn continue_inner(state: &AppState, body: Body) -> Reply {
    let bytes = read_body(state, body).await?;
    let _: ContinueGeneration = parse(&bytes, true)?;
    state.ask(|reply| Command::Continue { reply }).await?;
    status("Generation continued successfully.")
}

async fn pause_inner(state: &AppState, q: Query<HashMap<String, String>>) -> Reply {
    let mut mode = Pause::Abort;
    for (k, v) in q.0 {
        if k != "mode" {
            return Err(ApiError::bad(FieldError::new(k, "unknown query parameter")));
        }
        mode = match v.as_str() {
            "abort" => Pause::Abort,
            "keep" => Pause::InPlace,
            "wait" => Pause::Wait,
            other => {
                return Err(ApiError::bad(FieldError::new(
                    "mode",
                    format!("expected abort, keep or wait, got {other}"),
                )))
            }
        };
    }
    state.ask(|reply| Command::Pause { mode, reply }).await?;
    status("Generation paused successfully.")
}

async fn resume_inner(state: &AppState) -> Reply {
    state.ask(|reply| Command::Continue { reply }).await?;
    status("Generation continued successfully.")
}

async fn server_info_inner(state: &AppState) -> Reply {
    let info: ServerInfo = state.ask(|reply| Command::Info { reply }).await?;
    json(&info)
}

async fn get_weight_version(State(s): State<Arc<AppState>>) -> Response {
    match s.ask(|reply| Command::Info { reply }).await {
        Ok(info) => Json(WeightVersion {
            weight_version: info.weight_version,
        })
        .into_response(),
        Err(e) => e.render("/get_weight_version"),
    }
}

async fn get_model_info(State(s): State<Arc<AppState>>) -> Response {
    let info = match s.ask(|reply| Command::Info { reply }).await {
        Ok(i) => i,
        Err(e) => return e.render("/get_model_info"),
    };
    let model_path = s.model_path.lock().map(|p| p.clone()).unwrap_or_default();
    let tokenizer_path = s.tokens.has_tokenizer().then(|| {
        s.cfg
            .tokenizer
            .as_ref()
            .unwrap_or(&s.cfg.model)
            .display()
            .to_string()
    });
    Json(ModelInfo {
        model_path,
        tokenizer_path,
        is_generation: true,
        preferred_sampling_params: None,
        weight_version: info.weight_version,
        logprobs_mode: match s.cfg.logprobs_mode {
            LogprobMode::Raw => "raw",
            LogprobMode::Processed => "processed",
            LogprobMode::Tempered => "tempered",
        }
        .into(),
        max_model_len: s.limits.max_model_len,
        vocab_size: s.limits.vocab_size,
    })
    .into_response()
}

/// The base model, then every adapter (by name, `parent` the base model), as vLLM lists them.
async fn models(State(s): State<Arc<AppState>>) -> Response {
    let name = s.model_name();
    let card = |id: String, root: String, parent: Option<String>| ModelCard {
        id,
        object: "model".into(),
        created: s.started,
        owned_by: "rlreplay".into(),
        root: Some(root),
        parent,
        max_model_len: Some(s.limits.max_model_len),
    };
    let mut data = vec![card(name.clone(), s.cfg.model.display().to_string(), None)];
    for (adapter, dir) in s.adapters() {
        data.push(card(adapter, dir, Some(name.clone())));
    }
    Json(ModelList {
        object: "list".into(),
        data,
    })
    .into_response()
}

/// Whether `path` is one of vLLM's endpoints (plain-text answers, vLLM's error envelope).
fn is_vllm(path: &str) -> bool {
    path.starts_with("/v1/")
}

/// The answer of a LoRA endpoint: vLLM's plain-text message, or SGLang's
/// [`LoraUpdateResult`] (errors of vLLM's endpoints are rendered by the handler).
fn lora_answer(state: &AppState, uri: &Uri, message: String) -> Reply {
    if is_vllm(uri.path()) {
        Ok((StatusCode::OK, message).into_response())
    } else {
        json(&LoraUpdateResult {
            success: true,
            error_message: None,
            loaded_adapters: state.adapters(),
        })
    }
}

/// A failed LoRA request: vLLM's error envelope, or SGLang's [`LoraUpdateResult`] with
/// `success: false` (status 400).
fn lora_failure(state: &AppState, uri: &Uri, e: ApiError) -> Reply {
    if is_vllm(uri.path()) {
        return Err(e);
    }
    Ok((
        StatusCode::BAD_REQUEST,
        Json(LoraUpdateResult {
            success: false,
            error_message: Some(e.message),
            loaded_adapters: state.adapters(),
        }),
    )
        .into_response())
}

/// `POST /v1/load_lora_adapter` and `/load_lora_adapter`: builds the adapter's decoder off the
/// engine thread, then serves it (in a task of its own, as a weight update).
async fn load_adapter_inner(state: &Arc<AppState>, uri: &Uri, body: Body) -> Reply {
    let bytes = read_body(state, body).await?;
    let req: LoadLoraAdapter = parse(&bytes, false)?;
    let s = state.clone();
    let answer = tokio::spawn(async move { load_adapter_task(&s, req).await })
        .await
        .map_err(|e| ApiError::internal(format!("the adapter loading task failed: {e}")))?;
    match answer {
        Ok(message) => lora_answer(state, uri, message),
        Err(e) => lora_failure(state, uri, e),
    }
}

/// The body of [`load_adapter_inner`]: the success message, or the error.
async fn load_adapter_task(
    state: &AppState,
    req: LoadLoraAdapter,
) -> std::result::Result<String, ApiError> {
    let name = req.lora_name;
    if name.is_empty() || req.lora_path.is_empty() {
        return Err(ApiError::bad(FieldError::new(
            if name.is_empty() {
                "lora_name"
            } else {
                "lora_path"
            },
            "both lora_name and lora_path must be given",
        )));
    }
    check_adapter_name(&name, &state.model_name())
        .map_err(|m| ApiError::bad(FieldError::new("lora_name", m)))?;
    let _one_at_a_time = state.update.lock().await;
    if !req.load_inplace.unwrap_or(false) && state.adapters().contains_key(&name) {
        return Err(ApiError::bad(FieldError::new(
            "lora_name",
            format!(
                "the LoRA adapter `{name}` has already been loaded (send load_inplace: true to \
                 replace it)"
            ),
        )));
    }
    let base = PathBuf::from(
        state
            .model_path
            .lock()
            .map(|p| p.clone())
            .unwrap_or_default(),
    );
    let dir = PathBuf::from(&req.lora_path);
    let dtype = state.cfg.dtype;
    let decoder = tokio::task::spawn_blocking(move || load_adapter_decoder(&base, &dir, dtype))
        .await
        .map_err(|e| ApiError::internal(format!("the adapter loading task failed: {e}")))?
        .map_err(|e| {
            ApiError::bad(FieldError::new(
                "lora_path",
                format!("cannot load the LoRA adapter `{name}`: {e}"),
            ))
        })?;
    let replaced = state
        .ask(|reply| Command::LoadAdapter {
            name: name.clone(),
            decoder: Box::new(decoder),
            reply,
        })
        .await?;
    if let Ok(mut a) = state.adapters.lock() {
        a.insert(name.clone(), req.lora_path);
    }
    Ok(if replaced {
        format!("Success: LoRA adapter '{name}' replaced successfully.")
    } else {
        format!("Success: LoRA adapter '{name}' added successfully.")
    })
}

/// `POST /v1/unload_lora_adapter` and `/unload_lora_adapter`.
async fn unload_adapter_inner(state: &Arc<AppState>, uri: &Uri, body: Body) -> Reply {
    let bytes = read_body(state, body).await?;
    let req: UnloadLoraAdapter = parse(&bytes, false)?;
    let name = req.lora_name;
    let found = {
        let _one_at_a_time = state.update.lock().await;
        let found = state
            .ask(|reply| Command::UnloadAdapter {
                name: name.clone(),
                reply,
            })
            .await?;
        if let Ok(mut a) = state.adapters.lock() {
            a.remove(&name);
        }
        found
    };
    if found {
        lora_answer(
            state,
            uri,
            format!("Success: LoRA adapter '{name}' removed successfully."),
        )
    } else {
        let e = ApiError::new(
            StatusCode::NOT_FOUND,
            Some("lora_name".into()),
            format!("the LoRA adapter `{name}` cannot be found"),
        );
        lora_failure(state, uri, e)
    }
}

async fn flush_cache() -> &'static str {
    "Cache flushed.\n"
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn not_found(uri: Uri) -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        None,
        format!("no endpoint {}", uri.path()),
    )
    .render(uri.path())
}

async fn method_not_allowed(uri: Uri) -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        None,
        format!("method not allowed on {}", uri.path()),
    )
    .render(uri.path())
}

/// Checks `Authorization: Bearer <key>` when the server has a key.
async fn auth(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.cfg.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            let path = req.uri().path().to_owned();
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                Some("authorization".into()),
                "a valid API key is required (Authorization: Bearer <key>)",
            )
            .render(&path);
        }
    }
    next.run(req).await
}
