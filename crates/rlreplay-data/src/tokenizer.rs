//! Loading a `tokenizer.json` for decoding rows.

use std::path::{Path, PathBuf};

pub use tokenizers::Tokenizer;

use crate::error::{Error, Result};
use crate::hub::{resolve_hub_path, HubPath};

/// Where the installed tokenizer lives under the cache directory (by
/// `scripts/install-tokenizer.sh`).
pub const DEFAULT_TOKENIZER: &str = "rlreplay/qwen3/tokenizer.json";

/// The installed tokenizer file: `$RLREPLAY_TOKENIZER`, else [`DEFAULT_TOKENIZER`] under
/// `$XDG_CACHE_HOME` (default `~/.cache`). Never looked for around the working directory.
pub fn default_tokenizer_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RLREPLAY_TOKENIZER") {
        return Some(PathBuf::from(p));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join(DEFAULT_TOKENIZER))
}

/// Loads a tokenizer from a `tokenizer.json` file, a directory holding one, or a hub model
/// (`hf://OWNER/NAME`, downloading only its `tokenizer.json`).
pub fn load_tokenizer(spec: &str) -> Result<Tokenizer> {
    let file = if HubPath::parse(spec).is_some() {
        resolve_hub_path(spec, &|n| n == "tokenizer.json")?.join("tokenizer.json")
    } else {
        let p = Path::new(spec);
        if p.is_dir() {
            p.join("tokenizer.json")
        } else {
            p.to_owned()
        }
    };
    Tokenizer::from_file(&file).map_err(|error| Error::LoadTokenizer { path: file, error })
}
