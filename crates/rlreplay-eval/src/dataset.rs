//! Prompt and validation sets: verl's Parquet layout (`prompt` as a list of chat messages,
//! `data_source`, `reward_model.ground_truth`) and plain JSON lines.
//!
//! A row (a Parquet row or a JSON object on one line) gives:
//! * the conversation: `prompt` (a list of `{role, content}` messages, or a string taken as one
//!   user message), else `messages`, else `problem` or `question` (one user message);
//! * the gold answer, optional: `reward_model.ground_truth`, else `ground_truth`, `answer` or
//!   `gold` (numbers are turned into text);
//! * `data_source`, optional (`unknown` when absent).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::Value;

use rlreplay_sampling::chat::Message;

use crate::error::{Error, Result};

/// The data source given to rows without one.
pub const UNKNOWN_SOURCE: &str = "unknown";

/// One prompt of a prompt or validation set.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptItem {
    /// Row index in the file (0-based, blank JSON lines not counted).
    pub index: usize,
    /// The data source (selects the reward and groups the metrics).
    pub data_source: String,
    /// The conversation to render with the chat template.
    pub messages: Vec<Message>,
    /// The gold answer, when the row has one.
    pub ground_truth: Option<String>,
}

/// Reads a prompt set: Parquet when the file name ends in `.parquet`, JSON lines otherwise.
pub fn read_prompts(path: &Path) -> Result<Vec<PromptItem>> {
    let is_parquet = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("parquet"));
    let items = if is_parquet {
        read_parquet(path)?
    } else {
        read_jsonl(path)?
    };
    if items.is_empty() {
        return Err(Error::NoPrompts {
            path: path.to_owned(),
        });
    }
    Ok(items)
}

fn open(path: &Path) -> Result<File> {
    File::open(path).map_err(|source| Error::Open {
        path: path.to_owned(),
        source,
    })
}

fn read_jsonl(path: &Path) -> Result<Vec<PromptItem>> {
    let file = open(path)?;
    let mut items = Vec::new();
    for (line_no, line) in BufReader::new(file).lines().enumerate() {
        let path = || path.to_owned();
        let line_no = line_no + 1;
        let line = line.map_err(|source| Error::ReadLine {
            path: path(),
            line: line_no,
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(&line).map_err(|source| Error::LineJson {
            path: path(),
            line: line_no,
            source,
        })?;
        let item = item_from_json(&value, items.len()).map_err(|e| Error::Line {
            path: path(),
            line: line_no,
            source: Box::new(e),
        })?;
        items.push(item);
    }
    Ok(items)
}

fn read_parquet(path: &Path) -> Result<Vec<PromptItem>> {
    let file = open(path)?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|source| Error::NotParquet {
            path: path.to_owned(),
            source,
        })?
        .build()
        .map_err(|source| Error::ReadParquet {
            path: path.to_owned(),
            source,
        })?;
    let mut items = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|source| Error::ReadBatch {
            path: path.to_owned(),
            source,
        })?;
        let mut writer = arrow_json::LineDelimitedWriter::new(Vec::new());
        writer
            .write(&batch)
            .and_then(|_| writer.finish())
            .map_err(|source| Error::ConvertRows {
                path: path.to_owned(),
                source,
            })?;
        let text = writer.into_inner();
        for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let row = items.len();
            let value: Value = serde_json::from_slice(line).map_err(|source| Error::RowJson {
                path: path.to_owned(),
                row,
                source,
            })?;
            let item = item_from_json(&value, row).map_err(|e| Error::Row {
                path: path.to_owned(),
                row,
                source: Box::new(e),
            })?;
            items.push(item);
        }
    }
    Ok(items)
}

fn messages_from(list: &[Value], column: &'static str) -> Result<Vec<Message>> {
    if list.is_empty() {
        return Err(Error::EmptyConversation { column });
    }
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let field = |field: &'static str| {
                m.get(field)
                    .and_then(Value::as_str)
                    .ok_or_else(|| Error::MessageField {
                        column,
                        message: i,
                        field,
                        found: m.clone(),
                    })
            };
            Ok(Message::new(field("role")?, field("content")?))
        })
        .collect()
}

fn answer_text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// Builds a [`PromptItem`] from one row given as a JSON object.
pub fn item_from_json(row: &Value, index: usize) -> Result<PromptItem> {
    let obj = row
        .as_object()
        .ok_or_else(|| Error::NotAnObject { found: row.clone() })?;
    let messages = if let Some(p) = obj.get("prompt") {
        match p {
            Value::String(s) => vec![Message::user(s.clone())],
            Value::Array(list) => messages_from(list, "prompt")?,
            other => {
                return Err(Error::ColumnType {
                    column: "prompt",
                    expected: "a string or a list of messages",
                    found: other.clone(),
                })
            }
        }
    } else if let Some(m) = obj.get("messages") {
        let list = m.as_array().ok_or_else(|| Error::ColumnType {
            column: "messages",
            expected: "a list of messages",
            found: m.clone(),
        })?;
        messages_from(list, "messages")?
    } else if let Some((key, q)) = ["problem", "question"]
        .iter()
        .find_map(|k| obj.get(*k).map(|v| (*k, v)))
    {
        let q = q.as_str().ok_or_else(|| Error::ColumnType {
            column: key,
            expected: "a string",
            found: q.clone(),
        })?;
        vec![Message::user(q)]
    } else {
        return Err(Error::NoPrompt);
    };
    let ground_truth = obj
        .get("reward_model")
        .and_then(|r| r.get("ground_truth"))
        .or_else(|| {
            ["ground_truth", "answer", "gold"]
                .iter()
                .find_map(|k| obj.get(*k))
        })
        .and_then(answer_text);
    let data_source = match obj.get("data_source") {
        None | Some(Value::Null) => UNKNOWN_SOURCE.to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(Error::ColumnType {
                column: "data_source",
                expected: "a string",
                found: other.clone(),
            })
        }
    };
    Ok(PromptItem {
        index,
        data_source,
        messages,
        ground_truth,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn row_layouts() {
        let verl = json!({
            "data_source": "aime25",
            "prompt": [{"role": "user", "content": "Q"}],
            "reward_model": {"style": "rule", "ground_truth": "12"},
        });
        let it = item_from_json(&verl, 3).unwrap();
        assert_eq!(it.index, 3);
        assert_eq!(it.data_source, "aime25");
        assert_eq!(it.messages, [Message::user("Q")]);
        assert_eq!(it.ground_truth.as_deref(), Some("12"));

        let plain = json!({"prompt": "Q", "answer": 7});
        let it = item_from_json(&plain, 0).unwrap();
        assert_eq!(it.data_source, UNKNOWN_SOURCE);
        assert_eq!(it.ground_truth.as_deref(), Some("7"));

        let problem = json!({"problem": "P"});
        let it = item_from_json(&problem, 0).unwrap();
        assert_eq!(it.messages, [Message::user("P")]);
        assert_eq!(it.ground_truth, None);
    }

    #[test]
    fn bad_rows_name_the_column() {
        let e = |v: Value| format!("{:#}", item_from_json(&v, 0).unwrap_err());
        assert!(e(json!([1])).contains("JSON object"));
        assert!(e(json!({"x": 1})).contains("no prompt"));
        assert!(e(json!({"prompt": 5})).contains("`prompt`"));
        assert!(e(json!({"prompt": [{"role": "user"}]})).contains("`content`"));
        assert!(e(json!({"prompt": []})).contains("empty"));
        assert!(e(json!({"prompt": "q", "data_source": 3})).contains("`data_source`"));
    }

    #[test]
    fn jsonl_errors_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("p.jsonl");
        std::fs::write(&p, "{\"prompt\": \"a\"}\n\n{\"prompt\": \n").unwrap();
        let err = format!("{:#}", read_prompts(&p).unwrap_err());
        assert!(err.contains("line 3"), "{err}");
        std::fs::write(&p, "\n").unwrap();
        assert!(format!("{:#}", read_prompts(&p).unwrap_err()).contains("no prompts"));
        std::fs::write(&p, "{\"prompt\": \"a\"}\n\n{\"prompt\": \"b\"}\n").unwrap();
        let items = read_prompts(&p).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[1].index, 1);
    }
}
