//! List columns decoded straight from their Parquet pages into flat buffers.
//!
//! The token and log-prob columns hold nearly all of a shard's bytes. Instead of building Arrow
//! arrays and copying them out, their pages are decoded a few rows at a time with parquet's column
//! readers: repetition levels mark where rows start, definition levels tell null lists, empty
//! lists and null elements apart, and the values are checked and appended to the output. Only a
//! small scratch buffer (one chunk of levels and values) exists besides the output.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use parquet::basic::{ConvertedType, LogicalType, Repetition, Type as PhysicalType};
use parquet::column::reader::{get_column_reader, get_typed_column_reader};
use parquet::data_type::{DataType as ParquetType, DoubleType, FloatType, Int32Type, Int64Type};
use parquet::file::metadata::ParquetMetaData;

use crate::report::{Issue, IssueKind};

/// Rows decoded per call into a column reader (bounds the scratch buffers to a few hundred KiB).
const CHUNK_ROWS: usize = 64;

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
            let why = if limit <= u64::from(u32::MAX) {
                format!("not below the vocabulary size {limit}")
            } else {
                "not a valid token id".to_owned()
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
#[derive(Default)]
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

/// Decodes every row group of one list column chunk by chunk into `out` and `offsets`.
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
    T::T: Copy,
    O: Copy + Default,
{
    let leaf = src.leaf;
    let descr = src.meta.file_metadata().schema_descr().column(leaf.index);
    let (mut def, mut rep, mut raw) = (Vec::new(), Vec::new(), Vec::<T::T>::new());
    let mut row = Row::default();
    for rg in src.meta.row_groups() {
        let rg_rows = usize::try_from(rg.num_rows())
            .map_err(|_| "negative row count in a row group".to_owned())?;
        let pages = crate::pages::open(&src.file, rg.column(leaf.index), rg_rows)
            .map_err(|e| format!("cannot read column `{}`: {e}", src.name))?;
        let mut reader = get_typed_column_reader::<T>(get_column_reader(descr.clone(), pages));
        loop {
            def.clear();
            rep.clear();
            raw.clear();
            let (_, _, levels) = reader
                .read_records(CHUNK_ROWS, Some(&mut def), Some(&mut rep), &mut raw)
                .map_err(|e| {
                    format!(
                        "corrupted data in column `{}` near row {}: {e}",
                        src.name,
                        offsets.len() - 1
                    )
                })?;
            if levels == 0 {
                break;
            }
            if def.len() != levels || rep.len() != levels {
                return Err(format!(
                    "corrupted levels in column `{}` near row {}",
                    src.name,
                    offsets.len() - 1
                ));
            }
            let clean = raw.len() == levels
                && def.iter().fold(true, |acc, &d| acc & (d == leaf.max_def))
                && raw.iter().fold(true, |acc, &x| acc & (values.valid)(x));
            if clean {
                // Fast path: one value per level, every value valid; only row ends to find.
                let base = out.len();
                out.extend(raw.iter().map(|&x| (values.convert)(x)));
                // The column's first level starts the first row, whatever its repetition level.
                let first = !std::mem::replace(&mut row.started, true);
                row_starts(&rep, |i| {
                    if i > 0 || !first {
                        row.next(base + i, src, offsets, issues, &describe);
                    }
                });
                continue;
            }
            let mut vals = raw.iter();
            for (&d, &r) in def.iter().zip(&rep) {
                if r == 0 || !row.started {
                    row.next(out.len(), src, offsets, issues, &describe);
                }
                let pos = out.len() - offsets[offsets.len() - 1];
                if d < leaf.list_def {
                    row.null_list = true;
                } else if d == leaf.list_def {
                    // An empty list.
                } else if d < leaf.max_def {
                    row.first_null.get_or_insert(pos);
                    out.push(O::default());
                } else {
                    let &x = vals.next().ok_or_else(|| {
                        format!(
                            "corrupted data in column `{}` near row {}: fewer values than levels",
                            src.name,
                            offsets.len() - 1
                        )
                    })?;
                    if row.first_bad.is_none() && !(values.valid)(x) {
                        row.first_bad = Some((pos, (values.show)(x)));
                    }
                    out.push((values.convert)(x));
                }
            }
        }
    }
    if row.started {
        row.finish(out.len(), src, offsets, issues, &describe);
    }
    Ok(())
}
