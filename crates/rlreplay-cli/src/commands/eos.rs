//! The end-of-sequence ids of the commands that read or write rollouts without a model to train
//! (`validate`, `audit`, `show`, `synth`): `--eos`, else the ids the user's tokenizer (or model)
//! directory names, the dataset names, the policy names, the installed tokenizer names; never a
//! built-in constant, and never a tokenizer found by looking around the working directory.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use rlreplay_data::{default_tokenizer_path, resolve_hub_path, Dataset, HubPath};

/// `--eos`, shared by the commands that tell truncated responses.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct EosArgs {
    /// End-of-sequence ids, comma-separated: a response ending with none of them counts as
    /// truncated. Default, first found: the ids the --tokenizer directory names
    /// (`eos_token_id` of generation_config.json / config.json, `eos_token` and `pad_token` of
    /// tokenizer_config.json), those the dataset's shards name (rlreplay writes them into every
    /// shard), the policy's (audit --policy), then the installed tokenizer's
    /// ($RLREPLAY_TOKENIZER, else ~/.cache/rlreplay/qwen3). Without any, truncation is reported
    /// as unknown.
    #[arg(long, value_delimiter = ',', value_name = "ID[,ID...]")]
    pub eos: Vec<u32>,
}

/// End-of-sequence ids and where they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eos {
    /// The ids.
    pub ids: Vec<u32>,
    /// `--eos`, or the directory or dataset that named them.
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

/// What a report says when no end-of-sequence id is known.
pub const UNKNOWN: &str = "end of sequence: unknown (pass --eos ID[,ID...] or --tokenizer DIR; \
                           the dataset names none): truncation not counted";

impl EosArgs {
    /// The ids, first found: `--eos`; those the directory the user named (`said`: a tokenizer or
    /// model, a `tokenizer.json` file, its directory, or `hf://OWNER/NAME`) names, an error when
    /// it names none; those the dataset's shards name; those the `model` directory names; those
    /// of the installed tokenizer's directory. `None` when nothing names any. Never loads a
    /// tokenizer: the special-token files are read for the ids alone.
    pub fn resolve(
        &self,
        said: Option<&str>,
        dataset: Option<&Dataset>,
        model: Option<&Path>,
    ) -> Result<Option<Eos>> {
        if !self.eos.is_empty() {
            return Ok(Some(Eos {
                ids: self.eos.clone(),
                from: "--eos".into(),
            }));
        }
        if let Some(spec) = said {
            let eos = named_by(spec)?;
            if eos.ids.is_empty() {
                bail!(
                    "{}: names no end-of-sequence token (eos_token_id in config.json or \
                     generation_config.json, eos_token in tokenizer_config.json); pass --eos \
                     ID[,ID...]",
                    eos.from
                );
            }
            return Ok(Some(eos));
        }
        if let Some(stop) = dataset.map(Dataset::stop_ids).transpose()?.flatten() {
            return Ok(Some(Eos {
                ids: stop.ids,
                from: format!("the dataset; written by {}", stop.from),
            }));
        }
        for dir in model
            .map(Path::to_path_buf)
            .into_iter()
            .chain(default_tokenizer_path().filter(|p| p.is_file()))
        {
            let eos = named_by(&dir.to_string_lossy())?;
            if !eos.ids.is_empty() {
                return Ok(Some(eos));
            }
        }
        Ok(None)
    }
}

/// The files of a directory that name its special tokens.
fn special_file(name: &str) -> bool {
    matches!(
        name,
        "tokenizer.json" | "tokenizer_config.json" | "config.json" | "generation_config.json"
    )
}

/// The end-of-sequence ids a tokenizer or model names (none when it names none).
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
    let ids = rlreplay_sampling::stop_ids_from_files(&dir)
        .with_context(|| format!("reading the special tokens of {}", dir.display()))?;
    Ok(Eos {
        ids,
        from: dir.display().to_string(),
    })
}
