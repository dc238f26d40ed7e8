//! Prompt-set rows in verl's Parquet layout, and the writer.

use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, ListArray, RecordBatch, StringArray, StructArray};
use arrow_schema::{DataType, Field, Fields};

use crate::records::{Record, LETTERS};
use crate::{Error, RecordKind, Result, Set};

/// The instruction MaxRL appends to every math problem (POLARIS, AIME, MATH-500, Minerva): the
/// preprocessing never formats the string, so it ends in `\boxed{{}}.` with double braces.
pub const MATH_INSTRUCTION: &str =
    "\nPlease reason step by step, and put your final answer within \\boxed{{}}.";

/// SciKnowEval's system prompt in the SDPO code (it starts and ends with a newline); for
/// questions with other than four options, the count and the letters are adapted.
pub const MCQ_SYSTEM_PROMPT: &str = "\nGiven a question and four options, please select the right answer. Respond in the following format:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>\n\nFor the answer, only output the letter corresponding to the correct option (A, B, C, or D), and nothing else. Do not restate the answer text. For example, if the answer is \"A\", just output:\n<answer>\nA\n</answer>\n";

/// One row of a prepared set.
#[derive(Debug, Clone, PartialEq)]
pub struct VerlRow {
    /// `data_source`: the set's name.
    pub data_source: String,
    /// `prompt`: `(role, content)` chat messages.
    pub messages: Vec<(String, String)>,
    /// `ability`: `math` or `mcq`.
    pub ability: String,
    /// `reward_model.style`: `rule` (math) or `mcq`.
    pub style: String,
    /// `reward_model.ground_truth`: the gold answer (a letter for multiple choice).
    pub ground_truth: String,
    /// `extra_info.split`: the evaluation split's name (`test`, SciQ's `validation`), or the
    /// part, `train` or `heldout`.
    pub split: String,
    /// `extra_info.index`: the row's position.
    pub index: i64,
    /// `extra_info.id`: the source's id of the problem.
    pub id: String,
    /// `extra_info.subject` (MATH, MMLU; else empty).
    pub subject: String,
    /// `extra_info.level` (MATH; else empty).
    pub level: String,
}

fn mcq_system_prompt(options: usize) -> String {
    if options == 4 {
        return MCQ_SYSTEM_PROMPT.to_string();
    }
    let letters = &LETTERS[..options];
    let (last, rest) = letters.split_last().expect("options");
    let list = if rest.len() == 1 {
        format!("{} or {last}", rest[0])
    } else {
        format!("{}, or {last}", rest.join(", "))
    };
    let count = match options {
        2 => "two",
        3 => "three",
        5 => "five",
        6 => "six",
        7 => "seven",
        _ => "eight",
    };
    MCQ_SYSTEM_PROMPT
        .replace("four options", &format!("{count} options"))
        .replace("(A, B, C, or D)", &format!("({list})"))
}

/// The prompt-set rows of `records` (of `set`), in order, each with `extra_info.split` = `split`.
pub fn verl_rows(set: Set, split: &str, records: &[Record]) -> Vec<VerlRow> {
    records
        .iter()
        .enumerate()
        .map(|(index, r)| {
            let base = |messages, ground_truth, id: &str, subject: &str, level: &str| VerlRow {
                data_source: set.name().to_string(),
                messages,
                ability: match set.kind() {
                    RecordKind::Math => "math",
                    RecordKind::Mcq => "mcq",
                }
                .to_string(),
                style: match set.kind() {
                    RecordKind::Math => "rule",
                    RecordKind::Mcq => "mcq",
                }
                .to_string(),
                ground_truth,
                split: split.to_string(),
                index: index as i64,
                id: id.to_string(),
                subject: subject.to_string(),
                level: level.to_string(),
            };
            match r {
                Record::Math {
                    id,
                    problem,
                    answer,
                    subject,
                    level,
                } => base(
                    vec![("user".into(), format!("{problem}{MATH_INSTRUCTION}"))],
                    answer.clone(),
                    id,
                    subject,
                    level,
                ),
                Record::Mcq {
                    id,
                    question,
                    choices,
                    answer,
                    subject,
                } => {
                    let options: Vec<String> = choices
                        .iter()
                        .zip(LETTERS)
                        .map(|(t, l)| format!("{l}: {t}"))
                        .collect();
                    let user = format!(
                        "{question}\n\n{}\nPlease reason step by step.",
                        options.join("\n")
                    );
                    base(
                        vec![
                            ("system".into(), mcq_system_prompt(choices.len())),
                            ("user".into(), user),
                        ],
                        LETTERS[*answer].to_string(),
                        id,
                        subject,
                        "",
                    )
                }
            }
        })
        .collect()
}

fn strings<'a>(v: impl Iterator<Item = &'a str>) -> ArrayRef {
    Arc::new(StringArray::from_iter_values(v))
}

fn utf8(name: &str) -> Arc<Field> {
    Arc::new(Field::new(name, DataType::Utf8, false))
}

/// The Arrow batch of `rows`.
fn batch(rows: &[VerlRow]) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
    let message_fields = Fields::from(vec![utf8("role"), utf8("content")]);
    let all: Vec<&(String, String)> = rows.iter().flat_map(|r| &r.messages).collect();
    let messages = StructArray::try_new(
        message_fields.clone(),
        vec![
            strings(all.iter().map(|m| m.0.as_str())),
            strings(all.iter().map(|m| m.1.as_str())),
        ],
        None,
    )?;
    let item = Arc::new(Field::new("item", DataType::Struct(message_fields), false));
    let prompt = ListArray::try_new(
        item,
        arrow_buffer_offsets(rows.iter().map(|r| r.messages.len())),
        Arc::new(messages),
        None,
    )?;
    let reward_fields = Fields::from(vec![utf8("ground_truth"), utf8("style")]);
    let reward = StructArray::try_new(
        reward_fields,
        vec![
            strings(rows.iter().map(|r| r.ground_truth.as_str())),
            strings(rows.iter().map(|r| r.style.as_str())),
        ],
        None,
    )?;
    let extra_fields = Fields::from(vec![
        utf8("split"),
        Arc::new(Field::new("index", DataType::Int64, false)),
        utf8("id"),
        utf8("subject"),
        utf8("level"),
    ]);
    let extra = StructArray::try_new(
        extra_fields,
        vec![
            strings(rows.iter().map(|r| r.split.as_str())),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.index))),
            strings(rows.iter().map(|r| r.id.as_str())),
            strings(rows.iter().map(|r| r.subject.as_str())),
            strings(rows.iter().map(|r| r.level.as_str())),
        ],
        None,
    )?;
    RecordBatch::try_from_iter(vec![
        (
            "data_source",
            strings(rows.iter().map(|r| r.data_source.as_str())),
        ),
        ("prompt", Arc::new(prompt) as ArrayRef),
        ("ability", strings(rows.iter().map(|r| r.ability.as_str()))),
        ("reward_model", Arc::new(reward) as ArrayRef),
        ("extra_info", Arc::new(extra) as ArrayRef),
    ])
}

fn arrow_buffer_offsets(lens: impl Iterator<Item = usize>) -> arrow_buffer::OffsetBuffer<i32> {
    arrow_buffer::OffsetBuffer::from_lengths(lens)
}

/// Writes `rows` to `path` as one Parquet file (zstd), atomically: a temporary file in the same
/// directory, synced, then renamed, so readers see the old file or the complete new one.
pub fn write_verl_parquet(rows: &[VerlRow], path: &Path) -> Result<()> {
    let name = path.display().to_string();
    let batch = batch(rows).map_err(|e| Error::format(&name, e.to_string()))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or("set");
    let tmp = dir.join(format!(".{file_name}.{}.tmp", std::process::id()));
    let file = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let props = parquet::file::properties::WriterProperties::builder()
        .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
        .build();
    let write = || -> std::result::Result<(), parquet::errors::ParquetError> {
        let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(props))?;
        w.write(&batch)?;
        w.into_inner()?.sync_all()?;
        Ok(())
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::format(&name, e.to_string()));
    }
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, e)
    })
}
