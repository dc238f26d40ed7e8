//! List columns decoded straight from their Parquet pages into flat buffers.
//!
//! The token and log-prob columns hold nearly all of a shard's bytes. Instead of building Arrow
//! arrays and copying them out, their pages are decoded a chunk at a time: repetition levels mark
//! where rows start, definition levels tell null lists, empty lists and null elements apart, and
//! the values are checked and appended to the output. Pages with PLAIN values (what rlreplay
//! writes) are decoded here; column chunks with dictionary or other encodings go through parquet's
//! column reader. Only a small scratch buffer (one chunk of levels and values) exists besides the
//! output.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use parquet::basic::{ConvertedType, Encoding, LogicalType, Repetition, Type as PhysicalType};
use parquet::column::page::{Page, PageReader};
use parquet::column::reader::{get_column_reader, get_typed_column_reader};
use parquet::data_type::{DataType as ParquetType, DoubleType, FloatType, Int32Type, Int64Type};
use parquet::file::metadata::ParquetMetaData;

use crate::report::{Issue, IssueKind};

/// Rows decoded per call into a column reader (keeps the scratch buffers within the L2 cache).
const CHUNK_ROWS: usize = 16;

/// A list column's leaf in the Parquet schema and the meaning of its definition levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ListLeaf {
    /// Index of the leaf column.
    index: usize,
    /// Definition level of a present but empty list; lower levels are null lists.
    list_def: i16,
    /// Definition level of a non-null element; levels between `list_def` and it are null elements.
    max_def: i16,
    /// Whether integers are stored unsigned.
    unsigned: bool,
    /// Physical type of the values.
    physical: PhysicalType,
    /// Values plus empty and null lists in all row groups (the footer's count, capped): the
    /// capacity to reserve.
    entries: usize,
}

impl ListLeaf {
    /// The leaf of the top-level list column `name`, which must be a single-level list of
    /// primitive values.
    pub(crate) fn find(meta: &ParquetMetaData, name: &str) -> Result<ListLeaf, String> {
        let schema = meta.file_metadata().schema_descr();
        let mut leaves =
            (0..schema.num_columns()).filter(|&i| schema.column(i).path().parts()[0] == name);
        let (Some(index), None) = (leaves.next(), leaves.next()) else {
            return Err(format!("column `{name}` is not a list of primitive values"));
        };
        let descr = schema.column(index);
        if descr.max_rep_level() != 1 {
            return Err(format!(
                "column `{name}` is not a single-level list (repetition level {})",
                descr.max_rep_level()
            ));
        }
        let parts = descr.path().parts();
        let mut node = schema.get_column_root(index);
        let (mut def, mut list_def) = (0i16, None);
        for (depth, part) in parts.iter().enumerate() {
            if depth > 0 {
                let child = node
                    .is_group()
                    .then(|| node.get_fields().iter().find(|f| f.name() == part))
                    .flatten();
                node = child.ok_or_else(|| format!("column `{name}`: broken schema path"))?;
            }
            let info = node.get_basic_info();
            if info.has_repetition() {
                match info.repetition() {
                    Repetition::REQUIRED => {}
                    Repetition::OPTIONAL => def += 1,
                    Repetition::REPEATED => {
                        def += 1;
                        list_def = Some(def - 1);
                    }
                }
            }
        }
        let list_def = list_def.ok_or_else(|| format!("column `{name}` has no repeated level"))?;
        let unsigned = match descr.logical_type_ref() {
            Some(LogicalType::Integer(int)) => !int.is_signed,
            _ => matches!(
                descr.converted_type(),
                ConvertedType::UINT_8
                    | ConvertedType::UINT_16
                    | ConvertedType::UINT_32
                    | ConvertedType::UINT_64
            ),
        };
        let entries = meta
            .row_groups()
            .iter()
            .map(|rg| usize::try_from(rg.column(index).num_values()).unwrap_or(0))
            .fold(0usize, usize::saturating_add)
            // A corrupted footer must not trigger a huge allocation.
            .min(1 << 28);
        Ok(ListLeaf {
            index,
            list_def,
            max_def: descr.max_def_level(),
            unsigned,
            physical: descr.physical_type(),
            entries,
        })
    }

    /// Values plus empty and null lists over the whole column, per the footer (capped): the
    /// number of values of a clean column.
    pub(crate) fn entries(&self) -> usize {
        self.entries
    }
}

/// One list column of one shard to decode.
pub(crate) struct ListSource<'a> {
    /// The shard (for issues).
    pub path: &'a Path,
    /// Column name (for issues).
    pub name: &'a str,
    /// The open shard; used by this column alone (handles share their read position).
    pub file: Arc<File>,
    /// The shard's footer.
    pub meta: &'a ParquetMetaData,
    /// Where the column is.
    pub leaf: ListLeaf,
}

/// Appends each row's token ids as u32 to `out` and each row's end to `offsets`.
///
/// Null lists, null ids and ids that are negative, do not fit u32 or are not below `limit` are row
/// issues (the row keeps placeholder ids so that offsets stay aligned). Fails when the column
/// cannot be decoded or does not hold integers.
pub(crate) fn read_token_lists(
    src: &ListSource,
    limit: u64,
    out: &mut Vec<u32>,
    offsets: &mut Vec<usize>,
    issues: &mut Vec<Issue>,
) -> Result<(), String> {
    let describe = |p: Problem| match p {
        Problem::NullList => (IssueKind::NullValue, "null list".to_owned()),
        Problem::NullValue(j) => (IssueKind::NullValue, format!("null token at position {j}")),
        Problem::Bad(j, v) => {
            let why = if v.starts_with('-') {
                "negative".to_owned()
            } else if limit <= u64::from(u32::MAX) {
                format!("not below the vocabulary size {limit}")
            } else {
                "too large for a u32 token id".to_owned()
            };
            (
                IssueKind::BadTokenId,
                format!("token id {v} at position {j} is {why}"),
            )
        }
    };
    // Ids beyond u32 are clamped (they are row issues anyway).
    let clamp = |x: u64| x.min(u64::from(u32::MAX)) as u32;
    match (src.leaf.physical, src.leaf.unsigned) {
        (PhysicalType::INT32, false) => decode::<Int32Type, _>(
            src,
            out,
            offsets,
            issues,
            Values {
                valid: |x: i32| x >= 0 && (x as u64) < limit,
                convert: |x: i32| x.max(0) as u32,
                show: |x: i32| x.to_string(),
            },
            describe,
        ),
        (PhysicalType::INT32, true) => decode::<Int32Type, _>(
            src,
            out,
            offsets,
            issues,
            Values {
                valid: |x: i32| u64::from(x as u32) < limit,
                convert: |x: i32| x as u32,
                show: |x: i32| (x as u32).to_string(),
            },
            describe,
        ),
        (PhysicalType::INT64, false) => decode::<Int64Type, _>(
            src,
            out,
            offsets,
            issues,
            Values {
                valid: |x: i64| x >= 0 && (x as u64) < limit,
                convert: |x: i64| clamp(x.max(0) as u64),
                show: |x: i64| x.to_string(),
            },
            describe,
        ),
        (PhysicalType::INT64, true) => decode::<Int64Type, _>(
            src,
            out,
            offsets,
            issues,
            Values {
                valid: |x: i64| (x as u64) < limit,
                convert: |x: i64| clamp(x as u64),
                show: |x: i64| (x as u64).to_string(),
            },
            describe,
        ),
        (t, _) => Err(format!("column `{}` stores {t}, not integers", src.name)),
    }
}

/// Appends each row's values as f32 to `out` and each row's end to `offsets`; null lists and null
/// values are row issues (placeholder zeros keep offsets aligned). Fails when the column cannot be
/// decoded or does not hold floats.
pub(crate) fn read_float_lists(
    src: &ListSource,
    out: &mut Vec<f32>,
    offsets: &mut Vec<usize>,
    issues: &mut Vec<Issue>,
) -> Result<(), String> {
    let describe = |_: Problem| {
        (
            IssueKind::NullValue,
            "null log-prob list or value".to_owned(),
        )
    };
    match src.leaf.physical {
        PhysicalType::FLOAT => decode::<FloatType, _>(
            src,
            out,
            offsets,
            issues,
            Values {
                valid: |_: f32| true,
                convert: |x: f32| x,
                show: |x: f32| x.to_string(),
            },
            describe,
        ),
        PhysicalType::DOUBLE => decode::<DoubleType, _>(
            src,
            out,
            offsets,
            issues,
            Values {
                valid: |_: f64| true,
                convert: |x: f64| x as f32,
                show: |x: f64| x.to_string(),
            },
            describe,
        ),
        t => Err(format!("column `{}` stores {t}, not floats", src.name)),
    }
}

/// How stored values become output values.
struct Values<V, C, S> {
    /// Whether a stored value is acceptable.
    valid: V,
    /// The output value (a placeholder for invalid values).
    convert: C,
    /// The stored value as shown in an issue.
    show: S,
}

/// What is wrong with a row (the first problem, by priority).
enum Problem {
    /// The whole list is null.
    NullList,
    /// The element at this position is null.
    NullValue(usize),
    /// The element at this position (shown as the string) is invalid.
    Bad(usize, String),
}

/// Problems seen so far in the row being decoded.
#[derive(Default, Clone)]
struct Row {
    started: bool,
    null_list: bool,
    first_null: Option<usize>,
    first_bad: Option<(usize, String)>,
}

impl Row {
    /// Ends the current row (if any) at `end` and starts the next one.
    fn next(
        &mut self,
        end: usize,
        src: &ListSource,
        offsets: &mut Vec<usize>,
        issues: &mut Vec<Issue>,
        describe: &impl Fn(Problem) -> (IssueKind, String),
    ) {
        if std::mem::replace(&mut self.started, true) {
            self.finish(end, src, offsets, issues, describe);
        }
    }

    /// Ends the current row at `end`: records its offset and its problem.
    fn finish(
        &mut self,
        end: usize,
        src: &ListSource,
        offsets: &mut Vec<usize>,
        issues: &mut Vec<Issue>,
        describe: &impl Fn(Problem) -> (IssueKind, String),
    ) {
        let row = offsets.len() - 1;
        offsets.push(end);
        let problem = if std::mem::take(&mut self.null_list) {
            Some(Problem::NullList)
        } else if let Some(j) = self.first_null.take() {
            Some(Problem::NullValue(j))
        } else {
            self.first_bad.take().map(|(j, v)| Problem::Bad(j, v))
        };
        self.first_null = None;
        self.first_bad = None;
        if let Some(p) = problem {
            let (kind, msg) = describe(p);
            issues.push(Issue::new(src.path, Some(row), Some(src.name), kind, msg));
        }
    }
}

/// Calls `f(i)` for every `i` with `rep[i] == 0` (a row start), skipping row-free blocks fast.
fn row_starts(rep: &[i16], mut f: impl FnMut(usize)) {
    const BLOCK: usize = 64;
    for (b, block) in rep.chunks(BLOCK).enumerate() {
        if block.iter().fold(true, |acc, &r| acc & (r != 0)) {
            continue;
        }
        for (i, &r) in block.iter().enumerate() {
            if r == 0 {
                f(b * BLOCK + i);
            }
        }
    }
}

/// Levels decoded at a time from a plain page (keeps levels and values within the L2 cache).
const CHUNK_LEVELS: usize = 8192;

/// Values stored with the PLAIN encoding: little-endian, fixed width.
trait Plain: Copy {
    /// Bytes per value.
    const SIZE: usize;
    /// The value in `b` (exactly `SIZE` bytes).
    fn read(b: &[u8]) -> Self;
}

macro_rules! plain {
    ($($t:ty),*) => {$(
        impl Plain for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn read(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("chunks of SIZE bytes"))
            }
        }
    )*};
}
plain!(i32, i64, f32, f64);

/// Where decoded levels and values go: the output buffers, the current row and how values are
/// checked and shown.
struct Sink<'a, 's, O, V, C, S, D> {
    src: &'a ListSource<'s>,
    out: &'a mut Vec<O>,
    offsets: &'a mut Vec<usize>,
    issues: &'a mut Vec<Issue>,
    values: Values<V, C, S>,
    describe: D,
    row: Row,
}

impl<O, V, C, S, D> Sink<'_, '_, O, V, C, S, D>
where
    O: Copy + Default,
    D: Fn(Problem) -> (IssueKind, String),
{
    /// Appends one run of levels and the values of its non-null elements.
    fn emit<T: Copy>(&mut self, def: &[i16], rep: &[i16], raw: &[T]) -> Result<(), String>
    where
        V: Fn(T) -> bool,
        C: Fn(T) -> O,
        S: Fn(T) -> String,
    {
        let leaf = self.src.leaf;
        let clean = raw.len() == def.len()
            && def.iter().fold(true, |acc, &d| acc & (d == leaf.max_def))
            && raw
                .iter()
                .fold(true, |acc, &x| acc & (self.values.valid)(x));
        if clean {
            // Fast path: one value per level, every value valid; only row ends to find.
            let base = self.out.len();
            self.out
                .extend(raw.iter().map(|&x| (self.values.convert)(x)));
            // The column's first level starts the first row, whatever its repetition level.
            let first = !std::mem::replace(&mut self.row.started, true);
            row_starts(rep, |i| {
                if i > 0 || !first {
                    self.row.next(
                        base + i,
                        self.src,
                        self.offsets,
                        self.issues,
                        &self.describe,
                    );
                }
            });
            return Ok(());
        }
        let mut vals = raw.iter();
        for (&d, &r) in def.iter().zip(rep) {
            if r == 0 || !self.row.started {
                self.row.next(
                    self.out.len(),
                    self.src,
                    self.offsets,
                    self.issues,
                    &self.describe,
                );
            }
            let pos = self.out.len() - self.offsets[self.offsets.len() - 1];
            if d < leaf.list_def {
                self.row.null_list = true;
            } else if d == leaf.list_def {
                // An empty list.
            } else if d < leaf.max_def {
                self.row.first_null.get_or_insert(pos);
                self.out.push(O::default());
            } else {
                let &x = vals.next().ok_or_else(|| {
                    format!(
                        "corrupted data in column `{}` near row {}: fewer values than levels",
                        self.src.name,
                        self.offsets.len() - 1
                    )
                })?;
                if self.row.first_bad.is_none() && !(self.values.valid)(x) {
                    self.row.first_bad = Some((pos, (self.values.show)(x)));
                }
                self.out.push((self.values.convert)(x));
            }
        }
        Ok(())
    }

    /// The error for corrupted data in this column near the current row.
    fn corrupted(&self, what: impl std::fmt::Display) -> String {
        format!(
            "corrupted data in column `{}` near row {}: {what}",
            self.src.name,
            self.offsets.len() - 1
        )
    }
}

/// Scratch buffers for one chunk of levels and values.
struct Scratch<T> {
    def: Vec<i16>,
    rep: Vec<i16>,
    raw: Vec<T>,
}

/// Decodes every row group of one list column chunk by chunk into `out` and `offsets`.
///
/// Pages with PLAIN values are decoded here; a column chunk with other pages (dictionary or
/// other encodings) is decoded again from its start with parquet's column reader.
fn decode<T, O>(
    src: &ListSource,
    out: &mut Vec<O>,
    offsets: &mut Vec<usize>,
    issues: &mut Vec<Issue>,
    values: Values<impl Fn(T::T) -> bool, impl Fn(T::T) -> O, impl Fn(T::T) -> String>,
    describe: impl Fn(Problem) -> (IssueKind, String),
) -> Result<(), String>
where
    T: ParquetType,
    T::T: Plain,
    O: Copy + Default,
{
    let leaf = src.leaf;
    let mut sink = Sink {
        src,
        out,
        offsets,
        issues,
        values,
        describe,
        row: Row::default(),
    };
    let mut s = Scratch {
        def: Vec::new(),
        rep: Vec::new(),
        raw: Vec::<T::T>::new(),
    };
    for rg in src.meta.row_groups() {
        let rg_rows = usize::try_from(rg.num_rows())
            .map_err(|_| "negative row count in a row group".to_owned())?;
        let open = || {
            crate::pages::open(&src.file, rg.column(leaf.index), rg_rows)
                .map_err(|e| format!("cannot read column `{}`: {e}", src.name))
        };
        let mark = (
            sink.out.len(),
            sink.offsets.len(),
            sink.issues.len(),
            sink.row.clone(),
        );
        if !plain_chunk(open()?, &mut sink, &mut s)? {
            sink.out.truncate(mark.0);
            sink.offsets.truncate(mark.1);
            sink.issues.truncate(mark.2);
            sink.row = mark.3;
            reader_chunk::<T, _, _, _, _, _>(open()?, &mut sink, &mut s)?;
        }
    }
    if sink.row.started {
        let end = sink.out.len();
        sink.row
            .finish(end, src, sink.offsets, sink.issues, &sink.describe);
    }
    Ok(())
}

/// Decodes a column chunk whose data pages all hold PLAIN values; `false` (with partial output
/// the caller discards) at the first page of another kind.
fn plain_chunk<T, O, V, C, S, D>(
    mut pages: Box<dyn PageReader>,
    sink: &mut Sink<'_, '_, O, V, C, S, D>,
    s: &mut Scratch<T>,
) -> Result<bool, String>
where
    T: Plain,
    O: Copy + Default,
    V: Fn(T) -> bool,
    C: Fn(T) -> O,
    S: Fn(T) -> String,
    D: Fn(Problem) -> (IssueKind, String),
{
    let leaf = sink.src.leaf;
    let (rep_width, def_width) = (bit_width(1), bit_width(leaf.max_def));
    loop {
        let page = pages.get_next_page().map_err(|e| sink.corrupted(e))?;
        let (levels, rep, def, vals): (usize, &[u8], &[u8], &[u8]);
        let buf;
        match page {
            None => return Ok(true),
            Some(Page::DataPage {
                buf: b,
                num_values,
                encoding: Encoding::PLAIN,
                def_level_encoding: Encoding::RLE,
                rep_level_encoding: Encoding::RLE,
                ..
            }) => {
                buf = b;
                let (r, rest) = prefixed(&buf).ok_or_else(|| sink.corrupted("bad levels"))?;
                let (d, v) = prefixed(rest).ok_or_else(|| sink.corrupted("bad levels"))?;
                (levels, rep, def, vals) = (num_values as usize, r, d, v);
            }
            Some(Page::DataPageV2 {
                buf: b,
                num_values,
                encoding: Encoding::PLAIN,
                def_levels_byte_len,
                rep_levels_byte_len,
                ..
            }) => {
                buf = b;
                let (r, d) = (rep_levels_byte_len as usize, def_levels_byte_len as usize);
                if r.saturating_add(d) > buf.len() {
                    return Err(sink.corrupted("bad levels"));
                }
                let (r, rest) = buf.split_at(r);
                let (d, v) = rest.split_at(d);
                (levels, rep, def, vals) = (num_values as usize, r, d, v);
            }
            Some(_) => return Ok(false),
        }
        let (mut reps, mut defs) = (Hybrid::new(rep, rep_width), Hybrid::new(def, def_width));
        let mut vals = vals.chunks_exact(T::SIZE);
        let mut left = levels;
        while left > 0 {
            let n = left.min(CHUNK_LEVELS);
            left -= n;
            s.rep.clear();
            s.def.clear();
            s.raw.clear();
            reps.read(&mut s.rep, n).map_err(|e| sink.corrupted(e))?;
            defs.read(&mut s.def, n).map_err(|e| sink.corrupted(e))?;
            let present = s.def.iter().filter(|&&d| d >= leaf.max_def).count();
            s.raw.extend(vals.by_ref().take(present).map(T::read));
            if s.raw.len() < present {
                return Err(sink.corrupted("fewer values than levels"));
            }
            sink.emit(&s.def, &s.rep, &s.raw)?;
        }
    }
}

/// Decodes a column chunk with parquet's column reader, a few rows at a time.
fn reader_chunk<T, O, V, C, S, D>(
    pages: Box<dyn PageReader>,
    sink: &mut Sink<'_, '_, O, V, C, S, D>,
    s: &mut Scratch<T::T>,
) -> Result<(), String>
where
    T: ParquetType,
    T::T: Copy,
    O: Copy + Default,
    V: Fn(T::T) -> bool,
    C: Fn(T::T) -> O,
    S: Fn(T::T) -> String,
    D: Fn(Problem) -> (IssueKind, String),
{
    let descr = sink
        .src
        .meta
        .file_metadata()
        .schema_descr()
        .column(sink.src.leaf.index);
    let mut reader = get_typed_column_reader::<T>(get_column_reader(descr, pages));
    loop {
        s.def.clear();
        s.rep.clear();
        s.raw.clear();
        let (_, _, levels) = reader
            .read_records(CHUNK_ROWS, Some(&mut s.def), Some(&mut s.rep), &mut s.raw)
            .map_err(|e| sink.corrupted(e))?;
        if levels == 0 {
            return Ok(());
        }
        if s.def.len() != levels || s.rep.len() != levels {
            return Err(sink.corrupted("levels and values disagree"));
        }
        sink.emit(&s.def, &s.rep, &s.raw)?;
    }
}

/// Bits needed for levels up to `max`.
fn bit_width(max: i16) -> u32 {
    16 - (max.max(0) as u16).leading_zeros()
}

/// Splits off a v1 page's level section: a 4-byte little-endian length, then that many bytes.
fn prefixed(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u32::from_le_bytes(b.get(..4)?.try_into().ok()?) as usize;
    let rest = &b[4..];
    (len <= rest.len()).then(|| rest.split_at(len))
}

/// A reader of levels in Parquet's RLE / bit-packing hybrid encoding.
struct Hybrid<'a> {
    data: &'a [u8],
    width: u32,
    /// Levels left in the current run.
    left: usize,
    /// The value of the current RLE run; `None` in a bit-packed run.
    value: Option<i16>,
    /// The bit-packed run's bytes and the next level's bit offset in them.
    packed: &'a [u8],
    bit: usize,
}

impl<'a> Hybrid<'a> {
    fn new(data: &'a [u8], width: u32) -> Self {
        Hybrid {
            data,
            width,
            left: 0,
            value: None,
            packed: &[],
            bit: 0,
        }
    }

    /// Appends the next `n` levels to `out`.
    fn read(&mut self, out: &mut Vec<i16>, mut n: usize) -> Result<(), &'static str> {
        while n > 0 {
            if self.left == 0 {
                self.next_run()?;
            }
            let k = n.min(self.left);
            match self.value {
                Some(v) => out.extend(std::iter::repeat_n(v, k)),
                None => {
                    let w = self.width as usize;
                    let mask = (1u32 << w) - 1;
                    for _ in 0..k {
                        let (byte, shift) = (self.bit / 8, self.bit % 8);
                        let mut word = 0u32;
                        for (j, &b) in self.packed.iter().skip(byte).take(3).enumerate() {
                            word |= u32::from(b) << (8 * j);
                        }
                        out.push(((word >> shift) & mask) as i16);
                        self.bit += w;
                    }
                }
            }
            self.left -= k;
            n -= k;
        }
        Ok(())
    }

    /// Reads the next non-empty run's header (and an RLE run's value).
    fn next_run(&mut self) -> Result<(), &'static str> {
        while self.left == 0 {
            let mut header = 0u64;
            for shift in (0..35).step_by(7) {
                let (&b, rest) = self.data.split_first().ok_or("levels end early")?;
                self.data = rest;
                header |= u64::from(b & 0x7f) << shift;
                if b & 0x80 == 0 {
                    break;
                }
                if shift == 28 {
                    return Err("bad level run header");
                }
            }
            let count = usize::try_from(header >> 1).map_err(|_| "bad level run header")?;
            if header & 1 == 1 {
                // Bit-packed: `count` groups of 8 levels, `width` bytes per group.
                let bytes = count
                    .checked_mul(self.width as usize)
                    .filter(|&b| b <= self.data.len())
                    .ok_or("levels end early")?;
                (self.packed, self.data) = self.data.split_at(bytes);
                (self.left, self.value, self.bit) = (count * 8, None, 0);
            } else {
                let bytes = (self.width as usize).div_ceil(8);
                if bytes > self.data.len() {
                    return Err("levels end early");
                }
                let (v, rest) = self.data.split_at(bytes);
                self.data = rest;
                let v = v
                    .iter()
                    .rev()
                    .fold(0u32, |acc, &b| (acc << 8) | u32::from(b));
                if v >> self.width != 0 {
                    return Err("bad level value");
                }
                (self.left, self.value) = (count, Some(v as i16));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn hybrid_reads_bit_packed_and_rle_runs_in_any_chunks() {
        // One bit-packed group of eight 2-bit levels, then an RLE run of five 2s.
        let data = [0b11, 0xE4, 0x1B, 5 << 1, 2];
        let want = [0, 1, 2, 3, 3, 2, 1, 0, 2, 2, 2, 2, 2];
        for chunk in 1..=want.len() {
            let (mut h, mut got) = (Hybrid::new(&data, 2), Vec::new());
            for start in (0..want.len()).step_by(chunk) {
                h.read(&mut got, chunk.min(want.len() - start)).unwrap();
            }
            assert_eq!(got, want, "chunks of {chunk}");
        }
        let mut h = Hybrid::new(&data, 2);
        assert!(
            h.read(&mut Vec::new(), want.len() + 1).is_err(),
            "levels end early"
        );
    }

    #[test]
    fn level_bit_widths() {
        let widths: Vec<u32> = [0, 1, 2, 3, 4, 7, 8].into_iter().map(bit_width).collect();
        assert_eq!(widths, [0, 1, 2, 2, 3, 3, 4]);
    }

    proptest! {
        #[test]
        fn hybrid_never_panics_on_arbitrary_bytes(
            data in proptest::collection::vec(any::<u8>(), 0..48),
            width in 1u32..=4,
            n in 0usize..200,
        ) {
            let mut out = Vec::new();
            if Hybrid::new(&data, width).read(&mut out, n).is_ok() {
                prop_assert_eq!(out.len(), n);
                prop_assert!(out.iter().all(|&v| (v as u32) < (1 << width)));
            }
        }
    }
}
