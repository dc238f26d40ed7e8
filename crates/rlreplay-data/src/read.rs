//! Reading one Parquet shard into a [`RolloutBatch`], with column aliases and validation.
//!
//! The token and log-prob list columns are decoded page by page straight into the batch's flat
//! vectors (see `lists`), sized once from the footer; the small per-row columns go through Arrow
//! record batches of 256 rows. Prompt ids with the per-row columns, response ids and log-probs are
//! decoded on separate threads.

use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type,
    UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Schema};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;
use parquet::file::metadata::ParquetMetaData;

use crate::batch::RolloutBatch;
use crate::error::{chain, Error, Result};
use crate::lists::{read_float_lists, read_token_lists, ListLeaf, ListSource};
use crate::report::{Issue, IssueKind, ValidationReport};
use crate::stop::StopIds;

/// Accepted names of the prompt-token column, in order of preference.
pub const PROMPT_ALIASES: &[&str] = &["prompt_token_ids", "prompt_ids"];
/// Accepted names of the response-token column.
pub const RESPONSE_ALIASES: &[&str] = &["response_token_ids", "response_ids"];
/// Accepted names of the behaviour log-prob column.
pub const LOGPROB_ALIASES: &[&str] = &[
    "rollout_log_probs",
    "old_log_probs",
    "logprobs",
    "log_probs",
];
/// Accepted names of the score column.
pub const SCORE_ALIASES: &[&str] = &["score", "reward", "acc", "scores"];
/// Mask columns that are checked to be all ones over the stored lengths.
pub const MASK_COLUMNS: &[&str] = &["response_mask", "prompt_mask", "attention_mask"];

const BATCH_ROWS: usize = 256;

/// How to read shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadOptions {
    /// Skip bad rows (and report them) instead of failing on the first problem.
    pub lenient: bool,
    /// The ids that end a response (the model's end-of-sequence and stop tokens, from its
    /// tokenizer or configuration): a response ending with none of them counts as truncated.
    /// Empty: truncation is not counted (the report says unknown).
    pub eos: Vec<u32>,
    /// When set, token ids must be below it.
    pub vocab: Option<u32>,
    /// When set, a row's prompt and response together must not exceed it (the model's
    /// `max_position_embeddings`, as the trainer requires).
    pub max_positions: Option<usize>,
}

impl ReadOptions {
    /// Strict reads without a vocabulary check; `eos` are the ids that end a response.
    pub fn new(eos: impl Into<Vec<u32>>) -> Self {
        Self {
            lenient: false,
            eos: eos.into(),
            vocab: None,
            max_positions: None,
        }
    }
}

/// Reads and validates one shard whose step is `step`.
///
/// Strict reads (the default) fail on the first problem with an error naming file, row and
/// column (an [`Issue`] that callers can downcast to). Lenient reads drop bad rows (and the rows of
/// non-contiguous groups) and return what they dropped in the report; a file that cannot be read
/// at all (corrupted, missing or wrongly typed column) is an error in both modes.
pub fn read_shard(
    path: &Path,
    step: i64,
    opts: &ReadOptions,
) -> Result<(RolloutBatch, ValidationReport)> {
    read_shard_reusing(path, step, opts, None)
}

/// [`read_shard`] that decodes the token and log-prob lists into the buffers of `spare` (a batch
/// the caller is done with), so that streaming many shards reuses one set of large allocations.
pub fn read_shard_reusing(
    path: &Path,
    step: i64,
    opts: &ReadOptions,
    spare: Option<RolloutBatch>,
) -> Result<(RolloutBatch, ValidationReport)> {
    let (batch, report) = load(path, step, opts, spare)?;
    if !opts.lenient && !report.is_clean() {
        let first = report.issues[0].clone();
        let more = report.issue_count() - 1;
        return Err(if more > 0 {
            Error::MoreIssues {
                path: path.to_owned(),
                more,
                first: Box::new(first),
            }
        } else {
            Error::Issue(first)
        });
    }
    Ok((batch, report))
}

/// Checks one shard and returns every problem found (never fails: an unreadable file is an issue
/// in the report). With `opts.lenient`, the batch would drop bad rows; the report counts them.
pub fn validate_shard(path: &Path, step: i64, opts: &ReadOptions) -> ValidationReport {
    match load(path, step, opts, None) {
        Ok((_, report)) => report,
        Err(e) => {
            let mut report = ValidationReport::default();
            report.push(match e {
                Error::Issue(issue) => issue,
                e => Issue::new(path, None, None, IssueKind::Unreadable, chain(&e)),
            });
            report
        }
    }
}

/// What a shard's footer tells without reading its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardFooter {
    /// Rows in the file.
    pub rows: usize,
    /// The behaviour log-prob column in use.
    pub log_probs: String,
    /// The largest prompt or response token id with its column, when every row group of both
    /// columns has statistics.
    pub max_token_id: Option<(String, i64)>,
    /// The stop ids the footer names ([`crate::STOP_IDS_KEY`]), when it names them.
    pub stop_ids: Option<StopIds>,
}

/// Reads a shard's footer: the resolved columns (a missing or wrongly typed column is an error
/// naming it, like [`read_shard`]) and the largest token id from the column statistics.
pub fn read_footer(path: &Path) -> Result<ShardFooter> {
    let (meta, cols, rows) = open_footer(path)?;
    let mut max_token_id: Option<(String, i64)> = None;
    for name in [&cols.prompt, &cols.response] {
        match column_max(meta.metadata(), name) {
            Some(Some(m)) => {
                if max_token_id.as_ref().is_none_or(|(_, v)| m > *v) {
                    max_token_id = Some((name.clone(), m));
                }
            }
            Some(None) => {}
            None => {
                max_token_id = None;
                break;
            }
        }
    }
    let stop_ids = StopIds::in_footer(path, meta.metadata().file_metadata())?;
    Ok(ShardFooter {
        rows,
        log_probs: cols.log_probs,
        max_token_id,
        stop_ids,
    })
}

/// A shard's footer metadata, its resolved columns and its row count.
fn open_footer(path: &Path) -> Result<(ArrowReaderMetadata, Columns, usize)> {
    let unreadable =
        |msg: String| Error::Issue(Issue::new(path, None, None, IssueKind::Unreadable, msg));
    let file = File::open(path).map_err(|e| unreadable(format!("cannot open: {e}")))?;
    let meta = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new())
        .map_err(|e| unreadable(format!("not a readable Parquet file: {e}")))?;
    let cols = resolve(path, meta.schema())?;
    let rows = usize::try_from(meta.metadata().file_metadata().num_rows())
        .map_err(|_| unreadable("negative row count in the footer".into()))?;
    Ok((meta, cols, rows))
}

/// The largest value of the integer leaf of column `name` over all row groups: `None` when a row
/// group has no usable statistics, `Some(None)` when the column holds no value.
fn column_max(meta: &ParquetMetaData, name: &str) -> Option<Option<i64>> {
    use parquet::file::statistics::Statistics;
    let schema = meta.file_metadata().schema_descr();
    let leaf = (0..schema.num_columns()).find(|&i| schema.column(i).path().parts()[0] == name)?;
    let mut max = None;
    for rg in meta.row_groups() {
        let m = match rg.column(leaf).statistics()? {
            Statistics::Int32(s) => s.max_opt().map(|&v| i64::from(v)),
            Statistics::Int64(s) => s.max_opt().copied(),
            _ => return None,
        };
        if rg.num_rows() > 0 && m.is_none() && rg.column(leaf).num_values() > 0 {
            // Values without a maximum: statistics were not written for this row group.
            return None;
        }
        max = max.max(m);
    }
    Some(max)
}

/// Reads a shard, collecting every problem in the report; structural problems are errors.
fn load(
    path: &Path,
    step: i64,
    opts: &ReadOptions,
    spare: Option<RolloutBatch>,
) -> Result<(RolloutBatch, ValidationReport)> {
    let unreadable =
        |msg: String| Error::Issue(Issue::new(path, None, None, IssueKind::Unreadable, msg));
    // The decoder must never take the process down on a malformed file: a panic inside it is
    // reported like any other corruption.
    let decoded = std::panic::catch_unwind(|| decode(path, opts, spare)).map_err(|p| {
        let what = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("decoder panic");
        unreadable(format!("corrupted Parquet data ({what})"))
    })??;
    Ok(check(path, step, decoded, opts))
}

/// Emptied list buffers of a batch the caller is done with, to decode the next shard into.
#[derive(Default)]
struct Spare {
    /// Prompt ids and offsets.
    prompt: (Vec<u32>, Vec<usize>),
    /// Response ids and offsets.
    response: (Vec<u32>, Vec<usize>),
    /// Log-probs (their offsets are the response offsets in a batch).
    log_probs: Vec<f32>,
}

impl From<Option<RolloutBatch>> for Spare {
    fn from(batch: Option<RolloutBatch>) -> Self {
        let Some(b) = batch else {
            return Self::default();
        };
        fn empty<T>(mut v: Vec<T>) -> Vec<T> {
            v.clear();
            v
        }
        Self {
            prompt: (empty(b.prompt_tokens), empty(b.prompt_offsets)),
            response: (empty(b.response_tokens), empty(b.response_offsets)),
            log_probs: empty(b.rollout_log_probs),
        }
    }
}

/// The resolved columns of a shard.
#[derive(Default)]
struct Columns {
    uid: String,
    prompt: String,
    response: String,
    log_probs: String,
    score: String,
    data_source: Option<String>,
    ground_truth: Option<String>,
    temperature: Option<String>,
    top_p: Option<String>,
    policy_version: Option<String>,
    masks: Vec<String>,
}

fn is_int(t: &DataType) -> bool {
    t.is_integer()
}

fn list_item(t: &DataType) -> Option<&DataType> {
    match t {
        DataType::List(f) | DataType::LargeList(f) => Some(f.data_type()),
        _ => None,
    }
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float32 | DataType::Float64)
}

fn resolve(path: &Path, schema: &Schema) -> Result<Columns> {
    let found = || {
        schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let lookup = |aliases: &[&str], required: bool, ok: &dyn Fn(&DataType) -> bool, want: &str| {
        let Some(field) = aliases.iter().find_map(|a| schema.field_with_name(a).ok()) else {
            if required {
                return Err(Error::Issue(Issue::new(
                    path,
                    None,
                    Some(aliases[0]),
                    IssueKind::MissingColumn,
                    format!(
                        "missing required column (accepted names: {}); columns found: {}",
                        aliases.join(", "),
                        found()
                    ),
                )));
            }
            return Ok(None);
        };
        if !ok(field.data_type()) {
            return Err(Error::Issue(Issue::new(
                path,
                None,
                Some(field.name()),
                IssueKind::WrongType,
                format!("has type {}, expected {want}", field.data_type()),
            )));
        }
        Ok(Some(field.name().clone()))
    };
    let token_list = |t: &DataType| list_item(t).is_some_and(is_int);
    let req = |aliases: &[&str], ok: &dyn Fn(&DataType) -> bool, want: &str| {
        lookup(aliases, true, ok, want).map(|c| c.expect("required column"))
    };
    let mut masks = Vec::new();
    for m in MASK_COLUMNS {
        let ok = |t: &DataType| list_item(t).is_some_and(|i| is_int(i) || *i == DataType::Boolean);
        if let Some(c) = lookup(&[*m], false, &ok, "a list of integers or booleans")? {
            masks.push(c);
        }
    }
    Ok(Columns {
        uid: req(&["uid"], &|t| is_string(t) || is_int(t), "a string")?,
        prompt: req(PROMPT_ALIASES, &token_list, "a list of integers")?,
        response: req(RESPONSE_ALIASES, &token_list, "a list of integers")?,
        log_probs: req(
            LOGPROB_ALIASES,
            &|t| list_item(t).is_some_and(is_float),
            "a list of float32 or float64",
        )?,
        score: req(
            SCORE_ALIASES,
            &|t| is_float(t) || is_int(t) || *t == DataType::Boolean,
            "a number",
        )?,
        data_source: lookup(&["data_source"], false, &is_string, "a string")?,
        ground_truth: lookup(&["ground_truth"], false, &is_string, "a string")?,
        temperature: lookup(&["temperature"], false, &is_float, "a float")?,
        top_p: lookup(&["top_p"], false, &is_float, "a float")?,
        policy_version: lookup(&["policy_version"], false, &is_int, "an integer")?,
        masks,
    })
}

/// Column values as decoded, before row checks; rows may still be inconsistent.
struct Decoded {
    rows: usize,
    uids: Vec<String>,
    scores: Vec<f32>,
    data_source: Vec<Option<String>>,
    ground_truth: Vec<Option<String>>,
    temperature: Vec<Option<f32>>,
    top_p: Vec<Option<f32>>,
    policy_version: Vec<Option<u64>>,
    prompt: Vec<u32>,
    prompt_offsets: Vec<usize>,
    response: Vec<u32>,
    response_offsets: Vec<usize>,
    log_probs: Vec<f32>,
    log_prob_offsets: Vec<usize>,
    /// Whether every log-prob is valid ([`valid_log_prob`]); checked on the decoding thread.
    log_probs_valid: bool,
    /// Per mask column: its name and each row's (length, all ones).
    masks: Vec<(String, Vec<(usize, bool)>)>,
    /// Row-level problems found while decoding.
    issues: Vec<Issue>,
    /// The columns the values came from.
    names: Columns,
}

/// Decodes the needed columns of a shard.
fn decode(path: &Path, opts: &ReadOptions, spare: Option<RolloutBatch>) -> Result<Decoded> {
    let spare = Spare::from(spare);
    let unreadable =
        |msg: String| Error::Issue(Issue::new(path, None, None, IssueKind::Unreadable, msg));
    let (meta, cols, rows) = open_footer(path)?;

    let meta_cols: Vec<&str> = [&cols.uid, &cols.score]
        .into_iter()
        .chain(&cols.data_source)
        .chain(&cols.ground_truth)
        .chain(&cols.temperature)
        .chain(&cols.top_p)
        .chain(&cols.policy_version)
        .chain(&cols.masks)
        .map(String::as_str)
        .collect();
    let check_rows = |found: usize| {
        if found == rows {
            Ok(())
        } else {
            Err(unreadable(format!(
                "footer promises {rows} rows, the data holds {found}"
            )))
        }
    };
    let reader = |names: &[&str], f: &mut dyn FnMut(usize, &RecordBatch) -> Result<()>| {
        let schema = meta.schema();
        let indices = names.iter().filter_map(|n| schema.index_of(n).ok());
        let mask = ProjectionMask::roots(meta.parquet_schema(), indices);
        // A file of its own: clones of one handle share the read position across threads.
        let file = File::open(path).map_err(|e| unreadable(format!("cannot open: {e}")))?;
        let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta.clone())
            .with_projection(mask)
            .with_batch_size(BATCH_ROWS)
            .build()
            .map_err(|e| unreadable(format!("cannot read: {e}")))?;
        let mut base = 0;
        for batch in reader {
            let batch =
                batch.map_err(|e| unreadable(format!("corrupted data near row {base}: {e}")))?;
            f(base, &batch)?;
            base += batch.num_rows();
        }
        check_rows(base)
    };
    let limit = opts.vocab.map_or(u64::from(u32::MAX) + 1, u64::from);
    // Capacities trust the footer only this far (a corrupted footer must not allocate wildly).
    let cap = rows.min(1 << 20);
    // Token ids of a list column, with their offsets and row issues.
    let read_tokens = |name: &str,
                       (mut toks, mut offs): (Vec<u32>, Vec<usize>)|
     -> Result<(Vec<u32>, Vec<usize>, Vec<Issue>)> {
        let src = list_source(path, meta.metadata(), name)?;
        reserve_values(&mut toks, src.leaf.entries());
        offs.reserve_exact(cap + 1);
        let mut issues = Vec::new();
        offs.push(0);
        read_token_lists(&src, limit, &mut toks, &mut offs, &mut issues).map_err(unreadable)?;
        check_rows(offs.len() - 1)?;
        Ok((toks, offs, issues))
    };

    let read_meta = || -> Result<Decoded> {
        let (prompt, prompt_offsets, prompt_issues) = read_tokens(&cols.prompt, spare.prompt)?;
        let mut d = Decoded {
            rows,
            uids: Vec::with_capacity(cap),
            scores: Vec::with_capacity(cap),
            data_source: Vec::with_capacity(cap),
            ground_truth: Vec::with_capacity(cap),
            temperature: Vec::with_capacity(cap),
            top_p: Vec::with_capacity(cap),
            policy_version: Vec::with_capacity(cap),
            prompt,
            prompt_offsets,
            response: Vec::new(),
            response_offsets: Vec::new(),
            log_probs: Vec::new(),
            log_prob_offsets: Vec::new(),
            log_probs_valid: true,
            masks: cols
                .masks
                .iter()
                .map(|m| (m.clone(), Vec::with_capacity(cap)))
                .collect(),
            issues: Vec::new(),
            names: Columns::default(),
        };
        reader(&meta_cols, &mut |base, b| {
            let col = |n: &str| b.column_by_name(n).expect("projected column");
            strings(
                path,
                base,
                &cols.uid,
                col(&cols.uid),
                &mut d.uids,
                true,
                &mut d.issues,
            );
            numbers(
                path,
                base,
                &cols.score,
                col(&cols.score),
                &mut d.scores,
                &mut d.issues,
            );
            for (name, out) in [
                (&cols.data_source, &mut d.data_source),
                (&cols.ground_truth, &mut d.ground_truth),
            ] {
                match name {
                    Some(n) => opt_strings(col(n), out),
                    None => out.resize(base + b.num_rows(), None),
                }
            }
            for (name, out) in [
                (&cols.temperature, &mut d.temperature),
                (&cols.top_p, &mut d.top_p),
            ] {
                match name {
                    Some(n) => opt_floats(col(n), out),
                    None => out.resize(base + b.num_rows(), None),
                }
            }
            match &cols.policy_version {
                // A null or negative version is unknown, as is a shard without the column.
                Some(n) => {
                    let c = col(n);
                    d.policy_version.extend((0..c.len()).map(|r| {
                        (!c.is_null(r))
                            .then(|| number_at(c, r))
                            .flatten()
                            .filter(|&v| v >= 0.0)
                            .map(|v| v as u64)
                    }))
                }
                None => d.policy_version.resize(base + b.num_rows(), None),
            }
            for (name, out) in &mut d.masks {
                mask_rows(col(name), out);
            }
            Ok(())
        })?;
        d.issues.extend(prompt_issues);
        Ok(d)
    };
    let read_response = || read_tokens(&cols.response, spare.response);
    let read_log_probs = || -> Result<DecodedLogProbs> {
        let src = list_source(path, meta.metadata(), &cols.log_probs)?;
        let mut vals = spare.log_probs;
        reserve_values(&mut vals, src.leaf.entries());
        let (mut offs, mut issues) = (Vec::with_capacity(cap + 1), Vec::new());
        offs.push(0);
        read_float_lists(&src, &mut vals, &mut offs, &mut issues).map_err(unreadable)?;
        check_rows(offs.len() - 1)?;
        let valid = vals.iter().fold(true, |acc, &x| acc & valid_log_prob(x));
        Ok(DecodedLogProbs {
            values: vals,
            offsets: offs,
            issues,
            valid,
        })
    };
    // The two large columns start at once on two threads; the small rest goes to whichever
    // finishes first (a thread steals the oldest pending job).
    let (resp, (lps, meta_part)) =
        rayon::join(read_response, || rayon::join(read_log_probs, read_meta));
    let mut d = meta_part?;
    let (response, response_offsets, mut resp_issues) = resp?;
    let mut lps = lps?;
    d.response = response;
    d.response_offsets = response_offsets;
    d.log_probs = lps.values;
    d.log_prob_offsets = lps.offsets;
    d.log_probs_valid = lps.valid;
    d.issues.append(&mut resp_issues);
    d.issues.append(&mut lps.issues);
    d.names = cols;
    Ok(d)
}

/// A decoded log-prob column.
struct DecodedLogProbs {
    values: Vec<f32>,
    offsets: Vec<usize>,
    /// Row-level problems found while decoding.
    issues: Vec<Issue>,
    /// Whether every value is valid ([`valid_log_prob`]).
    valid: bool,
}

/// A log-prob is finite and not positive.
fn valid_log_prob(x: f32) -> bool {
    x <= 0.0 && x.is_finite()
}

/// Makes room for `n` values in a (cleared) token or log-prob buffer; a buffer that must grow
/// gets 1/32 more than asked, so that the next, slightly longer shard still fits.
///
/// On Linux the whole 2 MiB pages that the `n` values will fill are backed by transparent huge
/// pages: these buffers are large and written in full, so this saves nearly all of their page
/// faults, while the rest of the heap keeps small pages and a small resident size.
fn reserve_values<T>(buf: &mut Vec<T>, n: usize) {
    if buf.capacity() - buf.len() < n {
        buf.reserve_exact(n.saturating_add(n / 32));
    }
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = buf.spare_capacity_mut().as_mut_ptr() as usize;
        let end = start + n * std::mem::size_of::<T>();
        let (lo, hi) = (start.next_multiple_of(HUGE), end / HUGE * HUGE);
        if hi > lo {
            // SAFETY: the range lies inside this vector's allocation (`n` values fit in its spare
            // capacity), and the advice changes how its pages are backed, never their contents.
            unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) };
        }
    }
}

/// A list column of a shard, on a file handle of its own.
fn list_source<'a>(
    path: &'a Path,
    meta: &'a ParquetMetaData,
    name: &'a str,
) -> Result<ListSource<'a>> {
    let unreadable =
        |msg: String| Error::Issue(Issue::new(path, None, None, IssueKind::Unreadable, msg));
    let leaf = ListLeaf::find(meta, name).map_err(unreadable)?;
    let file = File::open(path).map_err(|e| unreadable(format!("cannot open: {e}")))?;
    Ok(ListSource {
        path,
        name,
        file: Arc::new(file),
        meta,
        leaf,
    })
}

/// Absolute value offsets (`len + 1`) and the values array of a list column.
fn list_bounds(c: &ArrayRef) -> Option<(Vec<usize>, &ArrayRef)> {
    match c.data_type() {
        DataType::List(_) => {
            let l = c.as_list::<i32>();
            Some((
                l.value_offsets().iter().map(|&o| o as usize).collect(),
                l.values(),
            ))
        }
        DataType::LargeList(_) => {
            let l = c.as_list::<i64>();
            Some((
                l.value_offsets().iter().map(|&o| o as usize).collect(),
                l.values(),
            ))
        }
        _ => None,
    }
}

/// Appends a required string (or integer) column; nulls are row issues.
fn strings(
    path: &Path,
    base: usize,
    name: &str,
    c: &ArrayRef,
    out: &mut Vec<String>,
    required: bool,
    issues: &mut Vec<Issue>,
) {
    for r in 0..c.len() {
        if c.is_null(r) {
            if required {
                issues.push(Issue::new(
                    path,
                    Some(base + r),
                    Some(name),
                    IssueKind::NullValue,
                    "null value",
                ));
            }
            out.push(String::new());
            continue;
        }
        out.push(string_at(c, r));
    }
}

fn string_at(c: &ArrayRef, r: usize) -> String {
    match c.data_type() {
        DataType::Utf8 => c.as_string::<i32>().value(r).to_owned(),
        DataType::LargeUtf8 => c.as_string::<i64>().value(r).to_owned(),
        DataType::Utf8View => c.as_string_view().value(r).to_owned(),
        _ => number_at(c, r).map_or_else(String::new, |x| format!("{x}")),
    }
}

fn opt_strings(c: &ArrayRef, out: &mut Vec<Option<String>>) {
    out.extend((0..c.len()).map(|r| (!c.is_null(r)).then(|| string_at(c, r))));
}

fn opt_floats(c: &ArrayRef, out: &mut Vec<Option<f32>>) {
    out.extend((0..c.len()).map(|r| {
        if c.is_null(r) {
            None
        } else {
            number_at(c, r).map(|x| x as f32)
        }
    }));
}

/// A numeric (or boolean) value as f64.
fn number_at(c: &ArrayRef, r: usize) -> Option<f64> {
    macro_rules! p {
        ($t:ty) => {
            c.as_primitive::<$t>().value(r) as f64
        };
    }
    Some(match c.data_type() {
        DataType::Float32 => p!(Float32Type),
        DataType::Float64 => p!(Float64Type),
        DataType::Int8 => p!(Int8Type),
        DataType::Int16 => p!(Int16Type),
        DataType::Int32 => p!(Int32Type),
        DataType::Int64 => p!(Int64Type),
        DataType::UInt8 => p!(UInt8Type),
        DataType::UInt16 => p!(UInt16Type),
        DataType::UInt32 => p!(UInt32Type),
        DataType::UInt64 => p!(UInt64Type),
        DataType::Boolean => f64::from(u8::from(c.as_boolean().value(r))),
        _ => return None,
    })
}

fn numbers(
    path: &Path,
    base: usize,
    name: &str,
    c: &ArrayRef,
    out: &mut Vec<f32>,
    issues: &mut Vec<Issue>,
) {
    for r in 0..c.len() {
        if c.is_null(r) {
            issues.push(Issue::new(
                path,
                Some(base + r),
                Some(name),
                IssueKind::NullValue,
                "null score",
            ));
        }
        out.push(number_at(c, r).filter(|_| !c.is_null(r)).unwrap_or(0.0) as f32);
    }
}

/// Each row's mask length and whether it is all ones (a null mask counts as not all ones).
fn mask_rows(c: &ArrayRef, out: &mut Vec<(usize, bool)>) {
    let (bounds, values) = list_bounds(c).expect("type checked");
    for r in 0..c.len() {
        let range = bounds[r]..bounds[r + 1];
        let ones = !c.is_null(r)
            && range
                .clone()
                .all(|j| !values.is_null(j) && number_at(values, j) == Some(1.0));
        out.push((range.len(), ones));
    }
}

/// Row and group checks on decoded columns; returns the batch (bad rows dropped when lenient).
fn check(
    path: &Path,
    step: i64,
    mut d: Decoded,
    opts: &ReadOptions,
) -> (RolloutBatch, ValidationReport) {
    let mut report = ValidationReport {
        rows_read: d.rows,
        ..ValidationReport::default()
    };
    if d.rows == 0 {
        report.push(Issue::new(
            path,
            None,
            None,
            IssueKind::EmptyShard,
            "the shard holds no rows",
        ));
    }
    let mut bad = vec![false; d.rows];
    for issue in std::mem::take(&mut d.issues) {
        if let Some(r) = issue.row.filter(|&r| r < d.rows) {
            bad[r] = true;
        }
        report.push(issue);
    }
    let mut flag = |report: &mut ValidationReport, row: usize, col: &str, kind, msg: String| {
        bad[row] = true;
        report.push(Issue::new(path, Some(row), Some(col), kind, msg));
    };
    let resp_col = d.names.response.as_str();
    let prompt_col = d.names.prompt.as_str();
    let lp_col = d.names.log_probs.as_str();
    let score_col = d.names.score.as_str();
    let span = |o: &[usize], r: usize| -> Range<usize> { o[r]..o[r + 1] };
    // Per-row log-prob scans only when the whole-shard test failed.
    let all_lp_ok = d.log_probs_valid;
    for r in 0..d.rows {
        let resp = span(&d.response_offsets, r);
        let lps = span(&d.log_prob_offsets, r);
        if resp.is_empty() {
            flag(
                &mut report,
                r,
                resp_col,
                IssueKind::EmptyResponse,
                "empty response".into(),
            );
        }
        let prompt_len = span(&d.prompt_offsets, r).len();
        if let Some(max) = opts.max_positions.filter(|&m| prompt_len + resp.len() > m) {
            flag(
                &mut report,
                r,
                resp_col,
                IssueKind::TooLong,
                format!(
                    "{} tokens (prompt {prompt_len} + response {}) exceed \
                     max_position_embeddings = {max}",
                    prompt_len + resp.len(),
                    resp.len()
                ),
            );
        }
        if prompt_len == 0 {
            flag(
                &mut report,
                r,
                prompt_col,
                IssueKind::EmptyPrompt,
                "the prompt is empty, so the first response token has no context".into(),
            );
        }
        if resp.len() != lps.len() {
            flag(
                &mut report,
                r,
                lp_col,
                IssueKind::LengthMismatch,
                format!("{} log-probs for {} response tokens", lps.len(), resp.len()),
            );
        }
        if !all_lp_ok {
            if let Some(j) = lps.clone().find(|&j| !valid_log_prob(d.log_probs[j])) {
                let x = d.log_probs[j];
                let what = if x.is_nan() {
                    "NaN"
                } else if x.is_infinite() {
                    "infinite"
                } else {
                    "positive"
                };
                flag(
                    &mut report,
                    r,
                    lp_col,
                    IssueKind::BadLogProb,
                    format!("{what} log-prob {x} at token {}", j - lps.start),
                );
            }
        }
        let s = d.scores[r];
        if !s.is_finite() {
            flag(
                &mut report,
                r,
                score_col,
                IssueKind::BadScore,
                format!("score is {s}"),
            );
        }
        for (name, rows) in &d.masks {
            let (len, ones) = rows[r];
            let prompt = d.prompt_offsets[r + 1] - d.prompt_offsets[r];
            let ok_len = match name.as_str() {
                "response_mask" => len == resp.len(),
                "prompt_mask" => len == prompt,
                _ => len == prompt + resp.len() || len == prompt,
            };
            if !ok_len || !ones {
                let msg = if ok_len {
                    "mask is not all ones".to_owned()
                } else {
                    format!("mask has {len} entries, the stored lengths do not match (prompt {prompt}, response {})", resp.len())
                };
                flag(&mut report, r, name, IssueKind::BadMask, msg);
            }
        }
    }
    // Group checks on the rows that are kept.
    let kept: Vec<usize> = (0..d.rows).filter(|&r| !opts.lenient || !bad[r]).collect();
    let mut runs: Vec<Range<usize>> = Vec::new(); // ranges into `kept`
    for (k, &r) in kept.iter().enumerate() {
        match runs.last_mut() {
            Some(run) if d.uids[kept[run.start]] == d.uids[r] => run.end = k + 1,
            _ => runs.push(k..k + 1),
        }
    }
    let mut first_run: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut split_uids = std::collections::HashSet::new();
    for run in &runs {
        let row = kept[run.start];
        let uid = d.uids[row].as_str();
        if let Some(&prev) = first_run.get(uid) {
            split_uids.insert(uid);
            report.push(Issue::new(
                path,
                Some(row),
                Some("uid"),
                IssueKind::NonContiguousGroup,
                format!("uid `{uid}` starts again here; its group began at row {prev}"),
            ));
        } else {
            first_run.insert(uid, row);
        }
    }
    let mut keep: Vec<usize> = if opts.lenient {
        kept.into_iter()
            .filter(|&r| !split_uids.contains(d.uids[r].as_str()))
            .collect()
    } else {
        kept
    };
    if split_uids.is_empty() {
        if let Some(first) = runs.first() {
            let size = first.len();
            if let Some(run) = runs.iter().find(|run| run.len() != size) {
                let row = if opts.lenient {
                    keep[run.start]
                } else {
                    run.start
                };
                report.push(Issue::new(
                    path,
                    Some(row),
                    Some("uid"),
                    IssueKind::UnequalGroupSize,
                    format!(
                        "group `{}` has {} rows, the first group has {size}",
                        d.uids[row],
                        run.len()
                    ),
                ));
            }
        }
    }
    let dropped = d.rows - keep.len();
    report.rows_skipped = if opts.lenient { dropped } else { 0 };
    let batch = if dropped == 0 && !bad.contains(&true) {
        into_batch(path, step, d)
    } else if opts.lenient {
        keep.retain(|&r| r < d.rows);
        gather(path, step, &d, &keep)
    } else {
        // A strict read with problems becomes an error in the caller; its rows are inconsistent.
        RolloutBatch::empty(step)
    };
    report.truncated = (!opts.eos.is_empty()).then(|| {
        (0..batch.len())
            .filter(|&i| batch.truncated(i, &opts.eos))
            .count()
    });
    (batch, report)
}

/// The decoded columns as a batch, moved without copying.
fn into_batch(path: &Path, step: i64, d: Decoded) -> RolloutBatch {
    RolloutBatch {
        step,
        source: path.to_owned(),
        uids: d.uids,
        prompt_tokens: d.prompt,
        prompt_offsets: d.prompt_offsets,
        response_tokens: d.response,
        response_offsets: d.response_offsets,
        rollout_log_probs: d.log_probs,
        scores: d.scores,
        data_source: d.data_source,
        ground_truth: d.ground_truth,
        temperature: d.temperature,
        top_p: d.top_p,
        policy_version: d.policy_version,
    }
}

/// A batch of the given rows of the decoded columns (whose log-prob offsets may differ from the
/// response offsets on dropped rows).
fn gather(path: &Path, step: i64, d: &Decoded, rows: &[usize]) -> RolloutBatch {
    let mut b = RolloutBatch::empty(step);
    b.source = path.to_owned();
    for &r in rows {
        b.push_row(
            &d.uids[r],
            &d.prompt[d.prompt_offsets[r]..d.prompt_offsets[r + 1]],
            &d.response[d.response_offsets[r]..d.response_offsets[r + 1]],
            &d.log_probs[d.log_prob_offsets[r]..d.log_prob_offsets[r + 1]],
            d.scores[r],
            d.data_source[r].as_deref(),
            d.ground_truth[r].as_deref(),
            d.temperature[r],
            d.top_p[r],
        );
        if let Some(v) = b.policy_version.last_mut() {
            *v = d.policy_version[r];
        }
    }
    b
}
