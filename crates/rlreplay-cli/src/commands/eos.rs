//! The end-of-sequence ids of the commands that read or write rollouts without a model to train
//! (`validate`, `audit`, `show`, `synth`): `--eos`, else the ids the tokenizer's (or model's)
//! directory names, else those of the installed tokenizer; never a built-in constant.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use rlreplay_data::{default_tokenizer_path, load_tokenizer, resolve_hub_path, HubPath};

/// `--eos`, shared by the commands that tell truncated responses.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct EosArgs {
    /// End-of-sequence ids, comma-separated: a response ending with none of them counts as
    /// truncated. Default: the ids named by the --tokenizer directory (or the policy's) in
    /// generation_config.json / config.json (`eos_token_id`) and tokenizer_config.json
    /// (`eos_token`, `pad_token`), else by the installed tokenizer's directory
    /// ($RLREPLAY_TOKENIZER or .cache/qwen3).
    #[arg(long, value_delimiter = ',', value_name = "ID[,ID...]")]
    pub eos: Vec<u32>,
}

/// End-of-sequence ids and where they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eos {
    /// The ids.
    pub ids: Vec<u32>,
    /// `--eos`, or the directory that named them.
    pub from: String,
}

impl std::fmt::Display for Eos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<String> = self.ids.iter().map(u32::to_string).collect();
        write!(
            f,
            "end of sequence: {} (from {})",
            ids.join(", "),
            self.from
        )
    }
}

impl EosArgs {
    /// The ids: `--eos`, else those `dir` names (a tokenizer or model: a `tokenizer.json` file,
    /// its directory, or `hf://OWNER/NAME`), else those of the installed tokenizer's directory.
    /// Without any of them, an error naming `--eos` and `--tokenizer`.
    pub fn resolve(&self, dir: Option<&str>) -> Result<Eos> {
        if !self.eos.is_empty() {
            return Ok(Eos {
                ids: self.eos.clone(),
                from: "--eos".into(),
            });
        }
        if let Some(spec) = dir {
            return named_by(spec);
        }
        match default_tokenizer_path().filter(|p| p.is_file()) {
            Some(p) => named_by(&p.to_string_lossy()),
            None => bail!(
                "no end-of-sequence id: pass --eos ID[,ID...], or --tokenizer with a tokenizer or \
                 model directory that names it (no installed tokenizer was found: \
                 $RLREPLAY_TOKENIZER or .cache/qwen3/tokenizer.json)"
            ),
        }
    }
}

/// The files of a directory that name its special tokens.
fn special_file(name: &str) -> bool {
    matches!(
        name,
        "tokenizer.json" | "tokenizer_config.json" | "config.json" | "generation_config.json"
    )
}

/// The end-of-sequence ids a tokenizer or model names.
fn named_by(spec: &str) -> Result<Eos> {
    let dir: PathBuf = if HubPath::parse(spec).is_some() {
        resolve_hub_path(spec, &special_file)?
    } else {
        let p = Path::new(spec);
        if p.is_file() {
            p.parent().unwrap_or(Path::new(".")).to_owned()
        } else {
            p.to_owned()
        }
    };
    if !dir.is_dir() {
        bail!("{}: no such tokenizer or model directory", dir.display());
    }
    let tokenizer = match dir.join("tokenizer.json") {
        t if t.is_file() => Some(load_tokenizer(&t.to_string_lossy())?),
        _ => None,
    };
    let ids = rlreplay_sampling::stop_ids(&dir, tokenizer.as_ref())
        .with_context(|| format!("reading the special tokens of {}", dir.display()))?;
    if ids.is_empty() {
        bail!(
            "{}: names no end-of-sequence token (eos_token_id in config.json or \
             generation_config.json, eos_token in tokenizer_config.json); pass --eos ID[,ID...]",
            dir.display()
        );
    }
    Ok(Eos {
        ids,
        from: dir.display().to_string(),
    })
}
