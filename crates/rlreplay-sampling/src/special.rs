//! Special token ids read from a model directory instead of constants: the ids that end a
//! response.

use std::path::Path;

use serde_json::Value;

use tokenizers::Tokenizer;

use crate::error::{Error, Result};

/// The token ids that end a response, read from a Hugging Face model directory, first seen
/// first: `eos_token_id` of `generation_config.json` and of `config.json` (one id or a list),
/// then the `eos_token` and `pad_token` of `tokenizer_config.json` looked up in `tokenizer`'s
/// vocabulary (the directory's `tokenizer.json`). Empty when the directory names none.
pub fn stop_ids(dir: &Path, tokenizer: Option<&Tokenizer>) -> Result<Vec<u32>> {
    stop_ids_with(
        dir,
        tokenizer.map(|t| move |token: &str| Ok(t.token_to_id(token))),
    )
}

/// [`stop_ids`] without loading a tokenizer: the `eos_token` and `pad_token` of
/// `tokenizer_config.json` are looked up in the `added_tokens` (then the `model.vocab`) of the
/// directory's `tokenizer.json`, parsed for those fields alone. Costs a JSON scan of
/// `tokenizer.json` only when `tokenizer_config.json` names a token.
pub fn stop_ids_from_files(dir: &Path) -> Result<Vec<u32>> {
    let file = dir.join("tokenizer.json");
    let mut table: Option<TokenTable> = None;
    let lookup = |token: &str| -> Result<Option<u32>> {
        if table.is_none() {
            table = Some(TokenTable::read(&file)?);
        }
        Ok(table.as_mut().and_then(|t| t.id(&file, token)))
    };
    stop_ids_with(dir, file.is_file().then_some(lookup))
}

/// The special tokens of a `tokenizer.json`, and its vocabulary when asked for a token that is
/// not special.
struct TokenTable {
    added: Vec<AddedToken>,
    vocab: Option<std::collections::HashMap<String, u32>>,
}

#[derive(serde::Deserialize)]
struct AddedToken {
    id: u32,
    content: String,
}

impl TokenTable {
    fn read(path: &Path) -> Result<Self> {
        #[derive(serde::Deserialize)]
        struct Added {
            #[serde(default)]
            added_tokens: Vec<AddedToken>,
        }
        let added: Added = parse_file(path)?;
        Ok(Self {
            added: added.added_tokens,
            vocab: None,
        })
    }

    /// The id of `token`: an added token's, else the vocabulary's (read on first need; a file
    /// whose vocabulary does not parse as a map names no such token).
    fn id(&mut self, path: &Path, token: &str) -> Option<u32> {
        if let Some(t) = self.added.iter().find(|t| t.content == token) {
            return Some(t.id);
        }
        #[derive(serde::Deserialize)]
        struct Model {
            vocab: std::collections::HashMap<String, u32>,
        }
        #[derive(serde::Deserialize)]
        struct File {
            model: Model,
        }
        let vocab = self.vocab.get_or_insert_with(|| {
            parse_file::<File>(path)
                .map(|f| f.model.vocab)
                .unwrap_or_default()
        });
        vocab.get(token).copied()
    }
}

/// A JSON file parsed into `T`.
fn parse_file<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_slice(&text).map_err(|source| Error::Json {
        path: path.to_owned(),
        source,
    })
}

/// [`stop_ids`] with `lookup` turning a token into its id.
fn stop_ids_with(
    dir: &Path,
    mut lookup: Option<impl FnMut(&str) -> Result<Option<u32>>>,
) -> Result<Vec<u32>> {
    let mut ids: Vec<u32> = Vec::new();
    let mut push = |id: u32| {
        if !ids.contains(&id) {
            ids.push(id);
        }
    };
    for file in ["generation_config.json", "config.json"] {
        let Some(json) = read_json(&dir.join(file))? else {
            continue;
        };
        match json.get("eos_token_id") {
            Some(Value::Number(n)) => n
                .as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .map(&mut push),
            Some(Value::Array(list)) => {
                for v in list {
                    if let Some(id) = v.as_u64().and_then(|v| u32::try_from(v).ok()) {
                        push(id);
                    }
                }
                None
            }
            _ => None,
        };
    }
    if let (Some(lookup), Some(json)) =
        (&mut lookup, read_json(&dir.join("tokenizer_config.json"))?)
    {
        for key in ["eos_token", "pad_token"] {
            let token = match json.get(key) {
                Some(Value::String(s)) => Some(s.as_str()),
                Some(Value::Object(o)) => o.get("content").and_then(Value::as_str),
                _ => None,
            };
            if let Some(id) = token.map(&mut *lookup).transpose()?.flatten() {
                push(id);
            }
        }
    }
    Ok(ids)
}

/// A JSON file's value; `None` when the file does not exist.
fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    let value = serde_json::from_str(&text).map_err(|source| Error::Json {
        path: path.to_owned(),
        source,
    })?;
    Ok(Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_come_from_the_generation_config_then_the_model_config() {
        let dir = tempfile::tempdir().unwrap();
        assert!(stop_ids(dir.path(), None).unwrap().is_empty());
        std::fs::write(dir.path().join("config.json"), r#"{"eos_token_id": 7}"#).unwrap();
        assert_eq!(stop_ids(dir.path(), None).unwrap(), [7]);
        std::fs::write(
            dir.path().join("generation_config.json"),
            r#"{"eos_token_id": [9, 7]}"#,
        )
        .unwrap();
        assert_eq!(stop_ids(dir.path(), None).unwrap(), [9, 7]);
        std::fs::write(dir.path().join("config.json"), "{").unwrap();
        let e = stop_ids(dir.path(), None).unwrap_err();
        assert!(format!("{e:#}").contains("config.json"), "{e:#}");
    }

    #[test]
    fn files_alone_name_the_tokens_of_the_tokenizer_config() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(
            d.join("tokenizer_config.json"),
            r#"{"eos_token": "<|end|>", "pad_token": {"content": "b"}}"#,
        )
        .unwrap();
        assert!(stop_ids_from_files(d).unwrap().is_empty());
        std::fs::write(
            d.join("tokenizer.json"),
            r#"{"added_tokens": [{"id": 5, "content": "<|end|>", "special": true}],
                "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}}"#,
        )
        .unwrap();
        assert_eq!(stop_ids_from_files(d).unwrap(), [5, 1]);
        std::fs::write(d.join("tokenizer.json"), "{").unwrap();
        let e = stop_ids_from_files(d).unwrap_err();
        assert!(format!("{e:#}").contains("tokenizer.json"), "{e:#}");
    }
}
