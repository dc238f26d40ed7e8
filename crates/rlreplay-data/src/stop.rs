//! The ids that end a response, as a dataset carries them: every shard rlreplay writes names its
//! stop ids (and the tokenizer or model they came from) in its Parquet footer's key-value
//! metadata, so that reading a dataset never needs the tokenizer that produced it.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The footer key that holds a shard's stop ids (a JSON object `{"ids": [...], "from": "..."}`).
pub const STOP_IDS_KEY: &str = "rlreplay.stop_token_ids";

/// The token ids that end a response, and where they came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopIds {
    /// The ids: a response ending with none of them was cut at the length limit.
    pub ids: Vec<u32>,
    /// The tokenizer, model or option that named them.
    pub from: String,
}

impl StopIds {
    /// Stop ids named by `from`.
    pub fn new(ids: impl Into<Vec<u32>>, from: impl Into<String>) -> Self {
        Self {
            ids: ids.into(),
            from: from.into(),
        }
    }

    /// The footer value.
    pub(crate) fn to_json(&self) -> String {
        // A struct of integers and one string always serialises.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The stop ids a footer's key-value metadata names under [`STOP_IDS_KEY`] (of the shard
    /// `path`, for errors); `None` when it names none.
    pub(crate) fn in_footer(
        path: &Path,
        meta: &parquet::file::metadata::FileMetaData,
    ) -> Result<Option<Self>> {
        meta.key_value_metadata()
            .and_then(|kv| kv.iter().find(|k| k.key == STOP_IDS_KEY))
            .and_then(|k| k.value.as_deref())
            .map(|v| Self::from_json(path, v))
            .transpose()
    }

    /// Parses the footer value of `path`'s [`STOP_IDS_KEY`].
    pub(crate) fn from_json(path: &Path, value: &str) -> Result<Self> {
        let stop: StopIds = serde_json::from_str(value).map_err(|e| Error::BadStopIds {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        if stop.ids.is_empty() {
            return Err(Error::BadStopIds {
                path: path.to_owned(),
                message: "no id in the list".into(),
            });
        }
        Ok(stop)
    }
}

impl std::fmt::Display for StopIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<String> = self.ids.iter().map(u32::to_string).collect();
        write!(f, "{} (from {})", ids.join(", "), self.from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_bad_values() {
        let s = StopIds::new([2, 7], "models/x");
        let p = Path::new("a.parquet");
        assert_eq!(StopIds::from_json(p, &s.to_json()).unwrap(), s);
        for bad in [
            "",
            "[1]",
            r#"{"ids":[],"from":"x"}"#,
            r#"{"ids":[-1],"from":"x"}"#,
        ] {
            let e = StopIds::from_json(p, bad).unwrap_err().to_string();
            assert!(e.contains("a.parquet") && e.contains(STOP_IDS_KEY), "{e}");
        }
    }
}
