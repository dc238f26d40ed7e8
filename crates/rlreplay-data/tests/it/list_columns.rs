//! The token and log-prob columns are decoded page by page: whatever the storage (integer width and
//! signedness, large lists, float64, nullable or required fields, column aliases, dictionary or
//! plain pages, v1 or v2 pages, compression, many row groups and small pages), a read gives the
//! rows that were written, and null lists, null elements and bad ids are issues on the right row
//! and column.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow_array::{
    ArrayRef, Float32Array, Float64Array, GenericListArray, Int16Array, Int32Array, Int64Array,
    OffsetSizeTrait, PrimitiveArray, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use arrow_buffer::{NullBuffer, OffsetBuffer};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{WriterProperties, WriterVersion};
use proptest::prelude::*;
use rlreplay_data::{read_shard, IssueKind, ReadOptions, RolloutBatch};

const VOCAB: u32 = 50;
const EOS: u32 = 49;

/// A problem planted in one row.
#[derive(Debug, Clone, Copy)]
enum Plant {
    /// The row's list in this column (0 prompt, 1 response, 2 log-probs) is null.
    NullList(usize),
    /// The element at this position (modulo the length) of this column is null.
    NullElement(usize, usize),
    /// The token at this position (modulo the length) of this token column is out of range.
    BadId(usize, usize),
}

/// How the shard is stored.
#[derive(Debug, Clone)]
struct Storage {
    /// 0 Int32, 1 Int64, 2 UInt32, 3 UInt64, 4 Int16.
    int_type: usize,
    float64: bool,
    large: bool,
    /// Fields (lists and their elements) nullable even without nulls.
    nullable: bool,
    /// 0: canonical names, 1: first aliases.
    aliases: bool,
    page_rows: usize,
    group_rows: usize,
    batch_levels: usize,
    dictionary: bool,
    v2: bool,
    /// 0 none, 1 zstd, 2 snappy.
    compression: usize,
}

fn storage() -> impl Strategy<Value = Storage> {
    (
        (0usize..5, any::<bool>(), any::<bool>(), any::<bool>()),
        (any::<bool>(), 1usize..6, 1usize..40, 1usize..20),
        (any::<bool>(), any::<bool>(), 0usize..5),
    )
        .prop_map(
            |(
                (int_type, float64, large, nullable),
                (aliases, page_rows, group_rows, batch_levels),
                (dictionary, v2, compression),
            )| Storage {
                int_type,
                float64,
                large,
                nullable,
                aliases,
                page_rows,
                group_rows,
                batch_levels,
                dictionary,
                v2,
                compression,
            },
        )
}

/// One row: prompt ids (possibly none), response ids (at least one) and as many log-probs.
#[derive(Debug, Clone)]
struct Row {
    prompt: Vec<u32>,
    response: Vec<u32>,
    log_probs: Vec<f32>,
}

fn row() -> impl Strategy<Value = Row> {
    (
        prop::collection::vec(0..VOCAB, 0..6),
        prop::collection::vec((0..VOCAB, -8.0f32..=0.0), 1..9),
    )
        .prop_map(|(prompt, resp)| Row {
            prompt,
            response: resp.iter().map(|r| r.0).collect(),
            log_probs: resp.iter().map(|r| r.1).collect(),
        })
}

fn plant() -> impl Strategy<Value = Option<Plant>> {
    prop_oneof![
        6 => Just(None),
        1 => (0usize..3).prop_map(|c| Some(Plant::NullList(c))),
        1 => (0usize..3, 0usize..8).prop_map(|(c, j)| Some(Plant::NullElement(c, j))),
        1 => (0usize..2, 0usize..8).prop_map(|(c, j)| Some(Plant::BadId(c, j))),
    ]
}

/// A list array from per-row optional lists of optional values.
fn list<O: OffsetSizeTrait>(
    item: DataType,
    values: ArrayRef,
    lens: &[Option<usize>],
    nullable: bool,
) -> ArrayRef {
    let offsets = OffsetBuffer::<O>::from_lengths(lens.iter().map(|l| l.unwrap_or(0)));
    let nulls = lens
        .iter()
        .any(Option::is_none)
        .then(|| NullBuffer::from(lens.iter().map(Option::is_some).collect::<Vec<_>>()));
    let field = Arc::new(Field::new(
        "item",
        item,
        nullable || values.null_count() > 0,
    ));
    Arc::new(GenericListArray::<O>::new(field, offsets, values, nulls))
}

/// Values of one column of `rows`, with the planted problems; `get` picks the column's values.
fn column<T: Copy>(
    rows: &[Row],
    plants: &[Option<Plant>],
    col: usize,
    get: impl Fn(&Row) -> Vec<T>,
    bad: T,
) -> (Vec<Option<T>>, Vec<Option<usize>>) {
    let (mut values, mut lens) = (Vec::new(), Vec::new());
    for (r, p) in rows.iter().zip(plants) {
        let mut v: Vec<Option<T>> = get(r).into_iter().map(Some).collect();
        match *p {
            Some(Plant::NullList(c)) if c == col => {
                lens.push(None);
                continue;
            }
            Some(Plant::NullElement(c, j)) if c == col && !v.is_empty() => {
                let n = v.len();
                v[j % n] = None;
            }
            Some(Plant::BadId(c, j)) if c == col && !v.is_empty() => {
                let n = v.len();
                v[j % n] = Some(bad);
            }
            _ => {}
        }
        lens.push(Some(v.len()));
        values.extend(v);
    }
    (values, lens)
}

/// Whether a plant shows in a row (an element plant on an empty prompt does not).
fn shows(p: Plant, r: &Row) -> Option<(usize, IssueKind)> {
    let len = |c: usize| [r.prompt.len(), r.response.len(), r.log_probs.len()][c];
    match p {
        Plant::NullList(c) => Some((c, IssueKind::NullValue)),
        Plant::NullElement(c, _) if len(c) > 0 => Some((c, IssueKind::NullValue)),
        Plant::BadId(c, _) if len(c) > 0 => Some((c, IssueKind::BadTokenId)),
        _ => None,
    }
}

fn write(path: &std::path::Path, rows: &[Row], plants: &[Option<Plant>], s: &Storage) {
    let names = if s.aliases {
        ["prompt_ids", "response_ids", "old_log_probs"]
    } else {
        [
            "prompt_token_ids",
            "response_token_ids",
            "rollout_log_probs",
        ]
    };
    let tokens = |col: usize| -> ArrayRef {
        let get = |r: &Row| {
            if col == 0 {
                r.prompt.clone()
            } else {
                r.response.clone()
            }
        };
        // The out-of-range id: negative where the type allows, else at or above the vocabulary.
        let (ids, lens) = column(rows, plants, col, get, u32::MAX);
        let values: ArrayRef = match s.int_type {
            0 => Arc::new(Int32Array::from(map(&ids, |x| {
                if x == u32::MAX {
                    -3
                } else {
                    x as i32
                }
            }))),
            1 => Arc::new(Int64Array::from(map(&ids, |x| {
                if x == u32::MAX {
                    -5_000_000_000
                } else {
                    i64::from(x)
                }
            }))),
            2 => Arc::new(UInt32Array::from(map(&ids, |x| {
                if x == u32::MAX {
                    3_000_000_000
                } else {
                    x
                }
            }))),
            3 => Arc::new(UInt64Array::from(map(&ids, |x| {
                if x == u32::MAX {
                    5_000_000_000
                } else {
                    u64::from(x)
                }
            }))),
            _ => Arc::new(Int16Array::from(map(&ids, |x| {
                if x == u32::MAX {
                    -1
                } else {
                    x as i16
                }
            }))),
        };
        let item = values.data_type().clone();
        if s.large {
            list::<i64>(item, values, &lens, s.nullable)
        } else {
            list::<i32>(item, values, &lens, s.nullable)
        }
    };
    let (lps, lens) = column(rows, plants, 2, |r| r.log_probs.clone(), 0.0);
    let lp_values: ArrayRef = if s.float64 {
        Arc::new(Float64Array::from(map(&lps, f64::from)))
    } else {
        Arc::new(PrimitiveArray::<arrow_array::types::Float32Type>::from(
            lps.clone(),
        ))
    };
    let lp_item = lp_values.data_type().clone();
    let log_probs = if s.large {
        list::<i64>(lp_item, lp_values, &lens, s.nullable)
    } else {
        list::<i32>(lp_item, lp_values, &lens, s.nullable)
    };
    let n = rows.len();
    let uids: Vec<String> = (0..n).map(|i| format!("g{i}")).collect();
    let cols: Vec<(&str, ArrayRef)> = vec![
        ("uid", Arc::new(StringArray::from(uids))),
        (names[0], tokens(0)),
        (names[1], tokens(1)),
        (names[2], log_probs),
        ("score", Arc::new(Float32Array::from(vec![1.0f32; n]))),
    ];
    let fields: Vec<Field> = cols
        .iter()
        .map(|(name, a)| {
            Field::new(
                *name,
                a.data_type().clone(),
                s.nullable || a.null_count() > 0,
            )
        })
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), cols.into_iter().map(|c| c.1).collect())
        .expect("valid batch");
    let props = WriterProperties::builder()
        .set_data_page_row_count_limit(s.page_rows)
        .set_write_batch_size(s.batch_levels)
        .set_max_row_group_row_count(Some(s.group_rows))
        .set_dictionary_enabled(s.dictionary)
        .set_writer_version(if s.v2 {
            WriterVersion::PARQUET_2_0
        } else {
            WriterVersion::PARQUET_1_0
        })
        .set_compression(match s.compression {
            0 => Compression::UNCOMPRESSED,
            1 => Compression::ZSTD(ZstdLevel::default()),
            2 => Compression::SNAPPY,
            3 => Compression::GZIP(Default::default()),
            _ => Compression::LZ4_RAW,
        })
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(file, schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

fn map<T: Copy, U>(v: &[Option<T>], f: impl Fn(T) -> U) -> Vec<Option<U>> {
    v.iter().map(|x| x.map(&f)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn any_storage_reads_back_the_rows(
        rows_plants in prop::collection::vec((row(), plant()), 1..16),
        s in storage(),
        vocab in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("step-0001.parquet");
        let (rows, plants): (Vec<Row>, Vec<Option<Plant>>) = rows_plants.into_iter().unzip();
        write(&path, &rows, &plants, &s);
        let names = if s.aliases {
            ["prompt_ids", "response_ids", "old_log_probs"]
        } else {
            ["prompt_token_ids", "response_token_ids", "rollout_log_probs"]
        };
        // Expected: the rows without a visible planted problem, and one issue per planted row.
        let mut expected = RolloutBatch::empty(1);
        expected.source = path.clone();
        let mut want_issues = BTreeSet::new();
        let mut empty_prompts = 0usize;
        for (i, (r, p)) in rows.iter().zip(&plants).enumerate() {
            let shown = p.and_then(|p| shows(p, r)).filter(|&(_, kind)| {
                // An id below 2^32 is only out of range with a vocabulary, or when negative.
                kind != IssueKind::BadTokenId || vocab || matches!(s.int_type, 0 | 1 | 3 | 4)
            });
            match shown {
                Some((c, kind)) => {
                    want_issues.insert((i, names[c].to_owned(), kind));
                }
                // A row without prompt tokens is refused on its own (nothing to predict its
                // first response token from).
                None if r.prompt.is_empty() => empty_prompts += 1,
                None => {
                    let mut r = r.clone();
                    if let Some(Plant::BadId(c, j)) = *p {
                        // An unsigned 32-bit id of 3e9 is valid without a vocabulary.
                        let ids = if c == 0 { &mut r.prompt } else { &mut r.response };
                        if !ids.is_empty() {
                            let n = ids.len();
                            ids[j % n] = 3_000_000_000;
                        }
                    }
                    expected.push_row(
                        &format!("g{i}"),
                        &r.prompt,
                        &r.response,
                        &r.log_probs,
                        1.0,
                        None,
                        None,
                        None,
                        None,
                    );
                }
            }
        }
        let opts = ReadOptions { lenient: true, eos: vec![EOS], vocab: vocab.then_some(VOCAB), max_positions: None };
        let (batch, report) = read_shard(&path, 1, &opts).unwrap();
        let got: BTreeSet<_> = report
            .issues
            .iter()
            .filter(|i| matches!(i.kind, IssueKind::NullValue | IssueKind::BadTokenId))
            .map(|i| (i.row.unwrap(), i.column.clone().unwrap(), i.kind))
            .collect();
        prop_assert_eq!(&got, &want_issues);
        prop_assert_eq!(&batch, &expected);
        prop_assert_eq!(report.rows_skipped, rows.len() - expected.len());
        let strict = ReadOptions { lenient: false, ..opts };
        prop_assert_eq!(
            read_shard(&path, 1, &strict).is_ok(),
            want_issues.is_empty() && empty_prompts == 0
        );
    }
}
