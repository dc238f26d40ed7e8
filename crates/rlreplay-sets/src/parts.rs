//! A set's train and held-out parts for RL training, disjoint by construction.

use std::collections::HashSet;
use std::path::Path;

use crate::records::fnv1a;
use crate::{
    read_records, read_split, verl_rows, write_verl_parquet, Error, Prepared, Record, Result, Set,
    Source,
};

/// The held-out fraction of a hash split unless another is asked for.
pub const DEFAULT_HELDOUT_FRACTION: f64 = 0.2;

/// One of the two parts a set is divided into for training.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The problems to train on.
    Train,
    /// The problems never trained on, to measure the policy on.
    Heldout,
}

impl Part {
    /// `train` or `heldout`: the part's `extra_info.split` and the suffix of its file name.
    pub fn name(self) -> &'static str {
        match self {
            Part::Train => "train",
            Part::Heldout => "heldout",
        }
    }

    /// The part's file name: `<set>_train.parquet` or `<set>_heldout.parquet`; with levels kept
    /// ([`prepare_parts`]), `<set>_<level>…_train.parquet` (each level lower-cased, every run of
    /// other characters than letters and digits made one `-`).
    pub fn file_name(self, set: Set, levels: &[String]) -> String {
        let mut stem = set.name().to_string();
        for level in levels {
            stem.push('_');
            let mut dash = false;
            for c in level.trim().chars().flat_map(char::to_lowercase) {
                if c.is_alphanumeric() {
                    stem.push(c);
                    dash = false;
                } else if !dash {
                    stem.push('-');
                    dash = true;
                }
            }
        }
        format!("{stem}_{}.parquet", self.name())
    }
}

/// Where a set's train part comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TrainFrom {
    /// The source's own training split(s); the held-out part is the whole evaluation split.
    Splits(&'static [&'static str]),
    /// Both parts are cut from the evaluation split by a hash of each problem ([`in_heldout`]).
    Hash {
        /// The fraction of the problems held out.
        heldout_fraction: f64,
    },
}

impl TrainFrom {
    /// How `set` read from `source` is divided: its [`Set::train_splits`], or a hash split.
    pub fn of(set: Set, source: &Source, heldout_fraction: f64) -> TrainFrom {
        match set.train_splits(source) {
            [] => TrainFrom::Hash { heldout_fraction },
            splits => TrainFrom::Splits(splits),
        }
    }
}

/// A set divided into a train and a held-out part.
#[derive(Debug, Clone, PartialEq)]
pub struct Partition {
    /// The train part, in the source's order.
    pub train: Vec<Record>,
    /// The held-out part, in the source's order.
    pub heldout: Vec<Record>,
    /// Train problems dropped because their [`problem_key`] is held out (or never trained on).
    pub dropped: usize,
    /// Problems the hash put in train that were held out because they must never be trained on
    /// (MATH-500's, in a hash split of MATH).
    pub moved: usize,
}

/// The normalised text that identifies a problem across sources and parts: the problem (math) or
/// the question followed by its options (multiple choice), lower-cased, every run of whitespace
/// made one space.
pub fn problem_key(record: &Record) -> String {
    let mut words: Vec<&str> = Vec::new();
    match record {
        Record::Math { problem, .. } => words.extend(problem.split_whitespace()),
        Record::Mcq {
            question, choices, ..
        } => {
            words.extend(question.split_whitespace());
            for choice in choices {
                words.extend(choice.split_whitespace());
            }
        }
    }
    words.join(" ").to_lowercase()
}

/// Whether the problem with [`problem_key`] `key` of `set` belongs to the held-out part of a hash
/// split: FNV-1a (64 bits) of `<set>:<key>`, mixed by MurmurHash3's 64-bit finaliser, its top 53
/// bits read as a number in [0, 1), is below `heldout_fraction`. It depends on the set and the
/// problem alone, so a problem lands on the same side whatever the file order or the source.
pub fn in_heldout(set: Set, key: &str, heldout_fraction: f64) -> bool {
    let mut h = fnv1a(&format!("{}:{key}", set.name()));
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    ((h >> 11) as f64) / ((1u64 << 53) as f64) < heldout_fraction
}

/// Divides `set` into parts. With `train` (the source's training split) the held-out part is
/// `eval` (the evaluation split) whole; without, `eval` is split by [`in_heldout`], problems whose
/// key is in `never_train` being held out whatever their hash. Then every train problem whose key
/// is held out or in `never_train` is dropped, so no problem text is on both sides.
pub fn divide(
    set: Set,
    eval: Vec<Record>,
    train: Option<Vec<Record>>,
    never_train: &HashSet<String>,
    heldout_fraction: f64,
) -> Partition {
    let mut moved = 0;
    let (train, heldout) = match train {
        Some(train) => (train, eval),
        None => {
            let (mut train, mut heldout) = (Vec::new(), Vec::new());
            for record in eval {
                let key = problem_key(&record);
                let hashed_out = in_heldout(set, &key, heldout_fraction);
                if hashed_out || never_train.contains(&key) {
                    moved += usize::from(!hashed_out);
                    heldout.push(record);
                } else {
                    train.push(record);
                }
            }
            (train, heldout)
        }
    };
    let held: HashSet<String> = heldout.iter().map(problem_key).collect();
    let before = train.len();
    let train: Vec<Record> = train
        .into_iter()
        .filter(|r| {
            let key = problem_key(r);
            !held.contains(&key) && !never_train.contains(&key)
        })
        .collect();
    Partition {
        dropped: before - train.len(),
        train,
        heldout,
        moved,
    }
}

/// Reads `set` from `source` and divides it ([`divide`]): the train part from the
/// [`Set::train_splits`] (ids prefixed `<split>/` when there are several), else a hash split of
/// the evaluation split with `heldout_fraction` of it held out. In a hash split of MATH, the
/// problems of MATH-500 (a part of MATH's test set, read from the same source) are held out.
pub fn partition(set: Set, source: Source, heldout_fraction: f64) -> Result<Partition> {
    if !(heldout_fraction > 0.0 && heldout_fraction < 1.0) {
        return Err(Error::HeldoutFraction(heldout_fraction));
    }
    let eval = read_records(set, source)?;
    let mut never_train = HashSet::new();
    let train = match TrainFrom::of(set, &source, heldout_fraction) {
        TrainFrom::Splits(splits) => {
            let mut train = Vec::new();
            for split in splits {
                let mut records = read_split(set, source, split)?;
                if splits.len() > 1 {
                    for r in &mut records {
                        let id = format!("{split}/{}", r.id());
                        *r.id_mut() = id;
                    }
                }
                train.append(&mut records);
            }
            Some(train)
        }
        TrainFrom::Hash { .. } => {
            if set == Set::Math {
                never_train.extend(read_records(Set::Math500, source)?.iter().map(problem_key));
            }
            None
        }
    };
    Ok(divide(set, eval, train, &never_train, heldout_fraction))
}

/// What [`prepare_parts`] wrote, and the sizes of both parts.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedParts {
    /// The files written, one per part asked for.
    pub written: Vec<(Part, Prepared)>,
    /// Where the train part came from.
    pub from: TrainFrom,
    /// Rows of the train part.
    pub train_rows: usize,
    /// Rows of the held-out part.
    pub heldout_rows: usize,
    /// Train problems dropped as held out ([`Partition::dropped`]).
    pub dropped: usize,
    /// Problems held out that the hash put in train ([`Partition::moved`]).
    pub moved: usize,
}

/// Keeps the problems of `partition` whose level is one of `levels` (case-insensitive; all when
/// `levels` is empty). The split is made before, so a problem is on the same side with or without
/// the filter. A level no problem has is an error naming the levels the set has.
pub fn keep_levels(set: Set, partition: &mut Partition, levels: &[String]) -> Result<()> {
    if levels.is_empty() {
        return Ok(());
    }
    let level_of = |r: &Record| match r {
        Record::Math { level, .. } => level.trim().to_lowercase(),
        Record::Mcq { .. } => String::new(),
    };
    let mut known: Vec<String> = partition
        .train
        .iter()
        .chain(&partition.heldout)
        .map(level_of)
        .filter(|l| !l.is_empty())
        .collect();
    known.sort();
    known.dedup();
    let wanted: Vec<String> = levels.iter().map(|l| l.trim().to_lowercase()).collect();
    if let Some(missing) = wanted.iter().find(|l| !known.contains(l)) {
        return Err(Error::UnknownLevel {
            set: set.name(),
            level: missing.clone(),
            known,
        });
    }
    partition.train.retain(|r| wanted.contains(&level_of(r)));
    partition.heldout.retain(|r| wanted.contains(&level_of(r)));
    Ok(())
}

/// Reads and divides `set` ([`partition`]), keeps the problems of `levels` ([`keep_levels`]; all
/// when empty) and writes each of `parts` to `out_dir/<set>_train.parquet` or
/// `out_dir/<set>_heldout.parquet` ([`Part::file_name`]) in verl's layout (atomically),
/// `extra_info.split` naming the part and `extra_info.index` the row's position in it. A part
/// asked for that would be empty is an error, and nothing is written then.
pub fn prepare_parts(
    set: Set,
    source: Source,
    out_dir: &Path,
    parts: &[Part],
    heldout_fraction: f64,
    levels: &[String],
) -> Result<PreparedParts> {
    let mut partition = partition(set, source, heldout_fraction)?;
    keep_levels(set, &mut partition, levels)?;
    let records = |part: Part| match part {
        Part::Train => &partition.train,
        Part::Heldout => &partition.heldout,
    };
    if let Some(part) = parts.iter().find(|p| records(**p).is_empty()) {
        return Err(Error::EmptyPart {
            set: set.name(),
            part: part.name(),
            total: partition.train.len() + partition.heldout.len(),
        });
    }
    std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, e))?;
    let mut written = Vec::with_capacity(parts.len());
    for &part in parts {
        let rows = verl_rows(set, part.name(), records(part));
        let path = out_dir.join(part.file_name(set, levels));
        write_verl_parquet(&rows, &path)?;
        written.push((
            part,
            Prepared {
                path,
                rows: rows.len(),
            },
        ));
    }
    Ok(PreparedParts {
        written,
        from: TrainFrom::of(set, &source, heldout_fraction),
        train_rows: partition.train.len(),
        heldout_rows: partition.heldout.len(),
        dropped: partition.dropped,
        moved: partition.moved,
    })
}
