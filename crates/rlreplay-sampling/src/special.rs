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
    if let (Some(tokenizer), Some(json)) =
        (tokenizer, read_json(&dir.join("tokenizer_config.json"))?)
    {
        for key in ["eos_token", "pad_token"] {
            let token = match json.get(key) {
                Some(Value::String(s)) => Some(s.as_str()),
                Some(Value::Object(o)) => o.get("content").and_then(Value::as_str),
                _ => None,
            };
            if let Some(id) = token.and_then(|t| tokenizer.token_to_id(t)) {
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
}
