//! Loading a `tokenizer.json` for decoding rows.

use std::path::{Path, PathBuf};

pub use tokenizers::Tokenizer;

use crate::error::{Error, Result};
use crate::hub::{resolve_hub_path, HubPath};

/// Where the Qwen3 tokenizer is installed inside a checkout (by `scripts/install-tokenizer.sh`).
pub const DEFAULT_TOKENIZER: &str = ".cache/qwen3/tokenizer.json";

/// The default tokenizer file: `$RLREPLAY_TOKENIZER`, else [`DEFAULT_TOKENIZER`] in the current
/// directory or the nearest ancestor that has it.
pub fn default_tokenizer_path() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("RLREPLAY_TOKENIZER") {
        return Some(PathBuf::from(p));
    }
    let cwd = std::env::current_dir().ok()?;
    cwd.ancestors()
        .map(|d| d.join(DEFAULT_TOKENIZER))
        .find(|p| p.is_file())
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
