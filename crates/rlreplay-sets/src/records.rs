//! Problems and questions as the sets give them, from JSON records of either source.

use std::path::Path;

use serde_json::Value;

use crate::{Error, Result, Set};

/// Math or multiple choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// Graded by the math verifier.
    Math,
    /// Graded by the multiple-choice grader.
    Mcq,
}

/// One problem or question of a set.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// A math problem.
    Math {
        /// The original id (or the row index).
        id: String,
        /// The problem text.
        problem: String,
        /// The gold answer.
        answer: String,
        /// Subject (MATH), empty when the source has none.
        subject: String,
        /// Difficulty (MATH), empty when the source has none.
        level: String,
    },
    /// A multiple-choice question.
    Mcq {
        /// The original id (or the row index).
        id: String,
        /// The question text.
        question: String,
        /// The option texts, labelled A, B, … in this order.
        choices: Vec<String>,
        /// Index of the correct option.
        answer: usize,
        /// Subject (MMLU), empty otherwise.
        subject: String,
    },
}

impl Record {
    /// The source's id of the problem (or its row index).
    pub fn id(&self) -> &str {
        match self {
            Record::Math { id, .. } | Record::Mcq { id, .. } => id,
        }
    }

    pub(crate) fn id_mut(&mut self) -> &mut String {
        match self {
            Record::Math { id, .. } | Record::Mcq { id, .. } => id,
        }
    }
}

/// The content of the last `\boxed{…}` of `text`, braces matched.
pub fn last_boxed(text: &str) -> Option<&str> {
    let start = text.rfind("\\boxed{")? + "\\boxed{".len();
    let mut depth = 1usize;
    for (i, c) in text[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&text[start..start + i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// FNV-1a (64 bits) of `s`: a fixed position for SciQ's correct option among its distractors,
/// and the start of the hash that splits a set into parts.
pub(crate) fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Reads fields of one JSON record, with errors naming the file and the row.
pub(crate) struct Fields<'a> {
    pub(crate) value: &'a Value,
    pub(crate) file: &'a str,
    pub(crate) row: usize,
}

impl Fields<'_> {
    fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::format(self.file, format!("row {}: {msg}", self.row + 1))
    }

    pub(crate) fn str(&self, key: &str) -> Result<String> {
        match &self.value[key] {
            Value::String(s) => Ok(s.clone()),
            Value::Number(n) => Ok(n.to_string()),
            Value::Null => Err(self.err(format!("no `{key}`"))),
            other => Err(self.err(format!("`{key}` is not a string: {other}"))),
        }
    }

    fn opt_str(&self, key: &str) -> String {
        match &self.value[key] {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            _ => String::new(),
        }
    }

    fn index(&self, key: &str) -> Result<usize> {
        self.value[key]
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| self.err(format!("`{key}` is not an index")))
    }

    fn strings(&self, v: &Value, key: &str) -> Result<Vec<String>> {
        v.as_array()
            .ok_or_else(|| self.err(format!("`{key}` is not a list")))?
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| self.err(format!("`{key}` holds a non-string")))
            })
            .collect()
    }
}

/// GSM8K: the gold answer is the number after `####` (thousands separators dropped).
pub(crate) fn gsm8k(f: &Fields, id: String) -> Result<Record> {
    let rationale = f.str("answer")?;
    let answer = rationale
        .rsplit_once("####")
        .map(|(_, a)| a.trim().replace(',', ""))
        .filter(|a| !a.is_empty())
        .ok_or_else(|| f.err("`answer` has no `#### N` line"))?;
    Ok(Record::Math {
        id,
        problem: f.str("question")?,
        answer,
        subject: String::new(),
        level: String::new(),
    })
}

/// MATH and MATH-500: the gold answer is the last `\boxed{}` of the solution.
pub(crate) fn math(f: &Fields, id: String, subject: String) -> Result<Record> {
    let solution = f.str("solution")?;
    let answer = last_boxed(&solution)
        .ok_or_else(|| f.err("the solution has no \\boxed{} answer"))?
        .to_string();
    let subject = if subject.is_empty() {
        f.opt_str("subject")
    } else {
        subject
    };
    Ok(Record::Math {
        id,
        problem: f.str("problem")?,
        answer,
        subject,
        level: f.opt_str("level"),
    })
}

/// AllenAI's basic arithmetic: `Calculate A op B =`, four numeric `choices {text, label}` and
/// `answerKey`; the gold answer is the correct option's text, the subject the operation (the
/// id's last part: `plus`, `minus`, `mult`, `div`), the level the `type_tag` (`easy`: one- and
/// two-digit addition and subtraction; `medium`; `hard`).
pub(crate) fn basic_arithmetic(f: &Fields) -> Result<Record> {
    let (mut texts, answer) = labelled_choices(f)?;
    let id = f.str("id")?;
    Ok(Record::Math {
        subject: id.rsplit('_').next().unwrap_or_default().to_string(),
        id,
        problem: f.str("question")?,
        answer: texts.swap_remove(answer),
        level: f.str("type_tag")?,
    })
}

/// MMLU: `question`, `choices`, `answer` (index), `subject`.
pub(crate) fn mmlu(f: &Fields, id: String) -> Result<Record> {
    let choices = f.strings(&f.value["choices"], "choices")?;
    let answer = f.index("answer")?;
    check_answer(f, answer, &choices)?;
    Ok(Record::Mcq {
        id,
        question: f.str("question")?,
        choices,
        answer,
        subject: f.opt_str("subject"),
    })
}

/// SciQ: three distractors and the correct answer, which goes to a fixed position given by a
/// hash of the question (SciQ itself has no option order).
pub(crate) fn sciq(f: &Fields, id: String) -> Result<Record> {
    let question = f.str("question")?;
    let mut choices = vec![
        f.str("distractor1")?,
        f.str("distractor2")?,
        f.str("distractor3")?,
    ];
    let answer = (fnv1a(&question) % 4) as usize;
    choices.insert(answer, f.str("correct_answer")?);
    Ok(Record::Mcq {
        id,
        question,
        choices,
        answer,
        subject: String::new(),
    })
}

/// The option texts of `choices {text, label}` and the index of the one `answerKey` labels.
fn labelled_choices(f: &Fields) -> Result<(Vec<String>, usize)> {
    let choices = &f.value["choices"];
    let texts = f.strings(&choices["text"], "choices.text")?;
    let labels = f.strings(&choices["label"], "choices.label")?;
    let key = f.str("answerKey")?;
    let answer = labels.iter().position(|l| *l == key).ok_or_else(|| {
        f.err(format!(
            "answerKey `{key}` is not among the labels {labels:?}"
        ))
    })?;
    check_answer(f, answer, &texts)?;
    Ok((texts, answer))
}

/// ARC and OpenBookQA from the hub: `choices {text, label}` and `answerKey` (a label, letters or
/// digits).
pub(crate) fn labelled(f: &Fields, question_key: &str) -> Result<Record> {
    let (texts, answer) = labelled_choices(f)?;
    Ok(Record::Mcq {
        id: f.str("id")?,
        question: f.str(question_key)?,
        choices: texts,
        answer,
        subject: String::new(),
    })
}

/// ARC and OpenBookQA from oe-eval's requests: the question and options are only in `query`
/// (`Question: …\n A. …\n B. …\nAnswer:`), the answer is the index `gold`.
pub(crate) fn from_query(f: &Fields) -> Result<Record> {
    let query = f.str("query")?;
    let n = f.value["choices"]
        .as_array()
        .map(Vec::len)
        .ok_or_else(|| f.err("`choices` is not a list"))?;
    let body = query
        .strip_prefix("Question: ")
        .and_then(|q| q.strip_suffix("\nAnswer:"))
        .ok_or_else(|| f.err("`query` is not `Question: …\\nAnswer:`"))?;
    let mut cuts = Vec::with_capacity(n);
    let mut from = 0;
    for letter in LETTERS.iter().take(n) {
        let marker = format!("\n {letter}. ");
        let at = body[from..]
            .find(&marker)
            .map(|i| from + i)
            .ok_or_else(|| f.err(format!("`query` has no option {letter}")))?;
        cuts.push((at, at + marker.len()));
        from = at + marker.len();
    }
    let question = body[..cuts[0].0].to_string();
    let choices = (0..n)
        .map(|i| {
            let end = cuts.get(i + 1).map_or(body.len(), |c| c.0);
            body[cuts[i].1..end].to_string()
        })
        .collect::<Vec<_>>();
    let answer = f.index("gold")?;
    check_answer(f, answer, &choices)?;
    Ok(Record::Mcq {
        id: f.str("id")?,
        question,
        choices,
        answer,
        subject: String::new(),
    })
}

fn check_answer(f: &Fields, answer: usize, choices: &[String]) -> Result<()> {
    if choices.len() < 2 || choices.len() > LETTERS.len() {
        return Err(f.err(format!("{} options", choices.len())));
    }
    if answer >= choices.len() {
        return Err(f.err(format!(
            "answer {answer} is not one of the {} options",
            choices.len()
        )));
    }
    Ok(())
}

/// Option labels.
pub(crate) const LETTERS: [&str; 8] = ["A", "B", "C", "D", "E", "F", "G", "H"];

/// Reads JSON records from Parquet files (every row, in file order).
pub(crate) fn parquet_records(path: &Path) -> Result<Vec<Value>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|b| b.build())
        .map_err(|e| Error::format(path.display(), e.to_string()))?;
    let mut batches = Vec::new();
    for b in reader {
        batches.push(b.map_err(|e| Error::format(path.display(), e.to_string()))?);
    }
    batches_to_json(&batches, &path.display().to_string())
}

/// Arrow record batches as one JSON object per row.
pub(crate) fn batches_to_json(
    batches: &[arrow_array::RecordBatch],
    name: &str,
) -> Result<Vec<Value>> {
    let mut buf = Vec::new();
    {
        let mut w = arrow_json::LineDelimitedWriter::new(&mut buf);
        for b in batches {
            w.write(b).map_err(|e| Error::format(name, e.to_string()))?;
        }
        w.finish().map_err(|e| Error::format(name, e.to_string()))?;
    }
    let text = String::from_utf8(buf).map_err(|e| Error::format(name, e.to_string()))?;
    text.lines()
        .map(|l| serde_json::from_str(l).map_err(|e| Error::format(name, e.to_string())))
        .collect()
}

/// Reads one split of the set's records from a local snapshot of its hub repository.
pub(crate) fn read_hub_snapshot(set: Set, split: &str, dir: &Path) -> Result<Vec<Record>> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(|e| Error::io(&d, e))?;
        for entry in entries {
            let p = entry.map_err(|e| Error::io(&d, e))?.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(rel) = p.strip_prefix(dir) {
                let rel = rel.to_string_lossy().replace('\\', "/");
                if set.hub_file_in(split, &rel) {
                    files.push((rel, p));
                }
            }
        }
    }
    // MATH's subjects in their usual order, shards in name order.
    files.sort_by_key(|(rel, _)| {
        let subject = math_subject_order(rel);
        (subject, rel.clone())
    });
    if files.is_empty() {
        return Err(Error::format(
            dir.display(),
            format!(
                "no file of {} {} (a snapshot of hf://datasets/{})",
                set.name(),
                split,
                set.hub_repo()
            ),
        ));
    }
    let mut out = Vec::new();
    for (rel, path) in files {
        let name = path.display().to_string();
        let rows = if rel.ends_with(".jsonl") {
            let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
            text.lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
                .map(|(i, l)| {
                    serde_json::from_str(l)
                        .map_err(|e| Error::format(&name, format!("line {}: {e}", i + 1)))
                })
                .collect::<Result<Vec<Value>>>()?
        } else {
            parquet_records(&path)?
        };
        let subject = rel.split('/').next().unwrap_or("").to_string();
        for (row, value) in rows.iter().enumerate() {
            let f = Fields {
                value,
                file: &name,
                row,
            };
            let id = (out.len()).to_string();
            out.push(match set {
                Set::Gsm8k => gsm8k(&f, id)?,
                Set::Math500 => {
                    let id = f.opt_str("unique_id");
                    math(&f, id, String::new())?
                }
                Set::Math => math(&f, id, subject.clone())?,
                Set::Mmlu => mmlu(&f, id)?,
                Set::Sciq => sciq(&f, id)?,
                Set::ArcChallenge | Set::ArcEasy => labelled(&f, "question")?,
                Set::Openbookqa => labelled(&f, "question_stem")?,
                Set::BasicArithmetic => basic_arithmetic(&f)?,
            });
        }
    }
    Ok(out)
}

fn math_subject_order(rel: &str) -> usize {
    let first = rel.split('/').next().unwrap_or("");
    crate::MATH_SUBJECTS
        .iter()
        .position(|s| *s == first)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxes_and_queries() {
        assert_eq!(
            last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}}."),
            Some("\\frac{1}{2}")
        );
        assert_eq!(last_boxed("\\boxed{x"), None);
        assert_eq!(last_boxed("none"), None);
        let v = serde_json::json!({
            "id": "q1",
            "query": "Question: Which is a gas?\n A. ice\n B. steam\n C. rock\nAnswer:",
            "choices": ["A", "B", "C"],
            "gold": 1,
        });
        let f = Fields {
            value: &v,
            file: "x",
            row: 0,
        };
        let Record::Mcq {
            question,
            choices,
            answer,
            ..
        } = from_query(&f).unwrap()
        else {
            panic!()
        };
        assert_eq!(question, "Which is a gas?");
        assert_eq!(choices, ["ice", "steam", "rock"]);
        assert_eq!(answer, 1);
        let bad = serde_json::json!({"id": "q", "query": "Question: x\nAnswer:", "choices": ["A"], "gold": 0});
        let f = Fields {
            value: &bad,
            file: "f.jsonl.gz",
            row: 6,
        };
        let e = from_query(&f).unwrap_err().to_string();
        assert!(e.contains("f.jsonl.gz") && e.contains("row 7"), "{e}");
    }
}
