//! `rlreplay serve`: the sampling engine as an HTTP server speaking the vLLM completions and
//! SGLang generate protocols, with weight updates from disk and LoRA adapters served next to the
//! base model.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use rlreplay_model::DType;
use rlreplay_sampling::sampling::LogprobMode;
use rlreplay_serve::{BoundServer, ServeConfig};

use super::generate::parse_dtype;

/// Arguments of `rlreplay serve`.
#[derive(clap::Args)]
pub struct Args {
    /// Hugging Face model directory (config.json, safetensors).
    #[arg(long)]
    model: PathBuf,
    /// Directory with tokenizer.json (default: the model directory; without one only token ids
    /// are accepted and text comes back empty).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Address to bind; the default serves this machine only.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Require `Authorization: Bearer <KEY>` on every endpoint but /health.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Which distribution returned log-probs are of: `processed` (after temperature and the
    /// top-k/top-p restriction, renormalised: what was sampled from) or `raw` (log softmax of the
    /// unscaled logits).
    #[arg(long, default_value = "processed", value_parser = parse_mode)]
    logprobs_mode: LogprobMode,
    /// Sequences decoded together at most (per served model: the base and each adapter); a
    /// request with more samples is decoded in turns.
    #[arg(long, default_value_t = 256)]
    max_num_seqs: usize,
    /// Most prompts in one request (more: 400).
    #[arg(long, default_value_t = 8192)]
    max_prompts_per_request: usize,
    /// Most samples in one request, n times its prompts (more: 400).
    #[arg(long, default_value_t = 16384)]
    max_seqs_per_request: usize,
    /// Longest prompt plus completion (default: the model's max_position_embeddings).
    #[arg(long)]
    max_model_len: Option<usize>,
    /// The model name requests may give in `model` (default: --model as given).
    #[arg(long)]
    served_model_name: Option<String>,
    /// The weight version reported before the first update.
    #[arg(long, default_value = "default")]
    weight_version: String,
    /// Largest request body, in MiB.
    #[arg(long, default_value_t = 64)]
    max_body_mib: usize,
    /// Connections served at once; more wait in the listen backlog until one closes (keep it
    /// below the open-file limit, `ulimit -n`).
    #[arg(long, default_value_t = 512)]
    max_connections: usize,
    /// Seconds from the first byte of a request to the end of its headers before the connection
    /// is closed.
    #[arg(long, default_value_t = 10)]
    header_read_timeout_secs: u64,
    /// Seconds a connection may stay open with no request in flight and no traffic.
    #[arg(long, default_value_t = 30)]
    idle_timeout_secs: u64,
    /// Compute dtype: f32 or bf16.
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    dtype: DType,
    /// A PEFT LoRA adapter directory to serve next to the base model, as `DIR` (named by the
    /// directory's last component) or `NAME=DIR`; repeatable. Requests select it by name
    /// (`model` in completions, `lora_path` in generate). Each adapter holds a copy of the base
    /// weights with the adapter merged.
    #[arg(long, value_name = "[NAME=]DIR")]
    adapter: Vec<String>,
    /// vLLM's spelling of --adapter: `NAME=PATH` or vLLM's JSON
    /// `{"name": ..., "path": ...}`; several may follow one flag.
    #[arg(long, value_name = "NAME=PATH", num_args = 1..)]
    lora_modules: Vec<String>,
    /// SGLang's spelling of --adapter: `NAME=PATH`, `PATH` or SGLang's JSON
    /// `{"lora_name": ..., "lora_path": ...}`; several may follow one flag.
    #[arg(long, value_name = "NAME=PATH", num_args = 1..)]
    lora_paths: Vec<String>,
    /// Accepted for compatibility with vLLM and SGLang command lines: adapters are always
    /// enabled.
    #[arg(long)]
    enable_lora: bool,
}

/// One adapter argument: `NAME=DIR`, `DIR` (named by its last component, or by the whole path
/// as SGLang names it when `name_is_path`), or the JSON objects vLLM (`name`, `path`) and SGLang
/// (`lora_name`, `lora_path`) accept.
fn parse_adapter(arg: &str, name_is_path: bool) -> Result<(String, PathBuf)> {
    let arg = arg.trim();
    if arg.starts_with('{') {
        let v: serde_json::Value =
            serde_json::from_str(arg).with_context(|| format!("adapter {arg}: invalid JSON"))?;
        let field = |keys: [&str; 2]| {
            keys.iter()
                .find_map(|k| v.get(k).and_then(|x| x.as_str()))
                .map(str::to_owned)
        };
        let name = field(["name", "lora_name"]);
        let path = field(["path", "lora_path"]);
        return match (name, path) {
            (Some(n), Some(p)) => Ok((n, PathBuf::from(p))),
            _ => Err(anyhow!(
                "adapter {arg}: expected {{\"name\": ..., \"path\": ...}} (or lora_name, lora_path)"
            )),
        };
    }
    if let Some((name, dir)) = arg.split_once('=') {
        if name.is_empty() || dir.is_empty() {
            return Err(anyhow!("adapter {arg}: expected NAME=DIR"));
        }
        return Ok((name.to_owned(), PathBuf::from(dir)));
    }
    let dir = PathBuf::from(arg);
    if name_is_path {
        return Ok((arg.to_owned(), dir));
    }
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            anyhow!("adapter {arg}: no directory name to serve it under (use NAME=DIR)")
        })?;
    Ok((name, dir))
}

fn parse_mode(s: &str) -> Result<LogprobMode, String> {
    match s {
        "processed" => Ok(LogprobMode::Processed),
        "raw" => Ok(LogprobMode::Raw),
        other => Err(format!(
            "unknown log-prob mode `{other}` (processed or raw)"
        )),
    }
}

/// Runs `rlreplay serve` until interrupted (Ctrl-C or SIGTERM).
pub fn run(args: Args) -> Result<ExitCode> {
    let max_body_bytes = args.max_body_mib.checked_mul(1 << 20).ok_or_else(|| {
        anyhow!(
            "--max-body-mib {} is too large (at most {})",
            args.max_body_mib,
            usize::MAX >> 20
        )
    })?;
    let adapters = (args.adapter.iter().chain(&args.lora_modules))
        .map(|a| parse_adapter(a, false))
        .chain(args.lora_paths.iter().map(|a| parse_adapter(a, true)))
        .collect::<Result<Vec<_>>>()?;
    let _ = args.enable_lora;
    let cfg = ServeConfig {
        adapters,
        tokenizer: args.tokenizer,
        host: args.host,
        port: args.port,
        api_key: args.api_key,
        logprobs_mode: args.logprobs_mode,
        max_num_seqs: args.max_num_seqs,
        max_prompts_per_request: args.max_prompts_per_request,
        max_seqs_per_request: args.max_seqs_per_request,
        max_model_len: args.max_model_len,
        served_model_name: args.served_model_name,
        weight_version: args.weight_version,
        max_body_bytes,
        max_connections: args.max_connections,
        header_read_timeout: Duration::from_secs(args.header_read_timeout_secs),
        idle_timeout: Duration::from_secs(args.idle_timeout_secs),
        dtype: args.dtype,
        ..ServeConfig::new(&args.model)
    };
    let mode = format!("{:?}", cfg.logprobs_mode).to_lowercase();
    let names: Vec<String> = cfg.adapters.iter().map(|(n, _)| n.clone()).collect();
    let server = BoundServer::bind(cfg).context("starting the server")?;
    let addr = server.local_addr()?;
    eprintln!(
        "rlreplay serve: listening on http://{addr} (model {}, {mode} log-probs{})",
        args.model.display(),
        if names.is_empty() {
            String::new()
        } else {
            format!(", LoRA adapters {}", names.join(", "))
        }
    );
    server.serve_until(rlreplay_serve::server::shutdown_signal())?;
    eprintln!("rlreplay serve: stopped");
    Ok(ExitCode::SUCCESS)
}
