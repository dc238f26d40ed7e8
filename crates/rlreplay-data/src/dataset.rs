//! Rollout datasets on disk or on the hub: finding the shards, their steps, and reading them one
//! step at a time.

use crate::error::IoContext;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::file::statistics::Statistics;

use crate::batch::RolloutBatch;
use crate::error::{Error, Result};
use crate::hub::HubPath;
use crate::read::{read_shard, read_shard_reusing, ReadOptions};
use crate::report::ValidationReport;
use crate::steps::StepRange;
use crate::stop::StopIds;

/// A rollout dataset: one Parquet shard per trainer step, ordered by step.
///
/// Shards are found from a directory in the published layout (`DIR/data/step-NNNN.parquet`), a
/// directory of `.parquet` files, one file, a glob (`'runs/*/step-00[0-4]?.parquet'`) or a hub id
/// (`hf://datasets/OWNER/NAME`, downloading only the selected steps). Nothing is read until a step
/// is asked for.
#[derive(Debug, Clone)]
pub struct Dataset {
    spec: String,
    shards: Vec<(i64, PathBuf)>,
}

impl Dataset {
    /// Opens every step of a dataset.
    pub fn open(spec: &str) -> Result<Dataset> {
        Self::open_steps(spec, StepRange::ALL)
    }

    /// Opens the steps of a dataset that `steps` selects (for a hub dataset, only those shards are
    /// downloaded). Fails when no shard is selected.
    pub fn open_steps(spec: &str, steps: StepRange) -> Result<Dataset> {
        let files = match HubPath::parse(spec) {
            Some(hub) => {
                let hub = hub?;
                let wanted = |name: &str| {
                    name.ends_with(".parquet")
                        && step_from_name(name).is_none_or(|s| steps.contains(s))
                };
                hub.download(&crate::hub::HubConfig::from_env(), &wanted)?
                    .into_iter()
                    .map(|(_, p)| p)
                    .collect()
            }
            None => local_files(spec)?,
        };
        let mut by_step: BTreeMap<i64, PathBuf> = BTreeMap::new();
        for f in files {
            let step = shard_step(&f)?;
            if !steps.contains(step) {
                continue;
            }
            if let Some(prev) = by_step.insert(step, f.clone()) {
                return Err(Error::DuplicateStep {
                    step,
                    first: prev,
                    second: f,
                });
            }
        }
        if by_step.is_empty() {
            return Err(Error::NoShardInRange {
                spec: spec.to_owned(),
                steps,
            });
        }
        Ok(Dataset {
            spec: spec.to_owned(),
            shards: by_step.into_iter().collect(),
        })
    }

    /// The spec the dataset was opened from.
    pub fn spec(&self) -> &str {
        &self.spec
    }

    /// `(step, file)` of every shard, by increasing step.
    pub fn steps(&self) -> Vec<(i64, PathBuf)> {
        self.shards.clone()
    }

    /// The stop ids the dataset names: those in the footer of its first shard that opens as
    /// Parquet ([`crate::STOP_IDS_KEY`]); `None` when that footer names none (datasets written by other
    /// tools). Only footers are read. A value that does not parse is an error naming the file.
    pub fn stop_ids(&self) -> Result<Option<StopIds>> {
        for (_, path) in &self.shards {
            let Ok(Ok(reader)) = File::open(path).map(SerializedFileReader::new) else {
                continue;
            };
            return StopIds::in_footer(path, reader.metadata().file_metadata());
        }
        Ok(None)
    }

    /// The file of `step`, if the dataset has it.
    pub fn shard(&self, step: i64) -> Option<&Path> {
        self.shards
            .binary_search_by_key(&step, |(s, _)| *s)
            .ok()
            .map(|i| self.shards[i].1.as_path())
    }

    /// Reads and validates one step.
    pub fn read_step(
        &self,
        step: i64,
        opts: &ReadOptions,
    ) -> Result<(RolloutBatch, ValidationReport)> {
        let Some(path) = self.shard(step) else {
            return Err(Error::NoShard {
                spec: self.spec.clone(),
                step,
            });
        };
        read_shard(path, step, opts)
    }

    /// Streams the selected steps in order, one shard in memory at a time.
    pub fn iter(&self, range: StepRange, opts: ReadOptions) -> StepIter<'_> {
        StepIter {
            shards: self.shards.iter(),
            range,
            opts,
            spare: None,
        }
    }
}

/// Iterator over a dataset's steps, reading one shard per item (see [`Dataset::iter`]).
pub struct StepIter<'a> {
    shards: std::slice::Iter<'a, (i64, PathBuf)>,
    range: StepRange,
    opts: ReadOptions,
    spare: Option<RolloutBatch>,
}

impl StepIter<'_> {
    /// Gives back a batch this iterator returned once the caller is done with it: the next step
    /// is decoded into its buffers instead of fresh allocations, which keeps peak memory near one
    /// shard's size when streaming many shards.
    pub fn recycle(&mut self, batch: RolloutBatch) {
        self.spare = Some(batch);
    }
}

impl Iterator for StepIter<'_> {
    type Item = Result<(RolloutBatch, ValidationReport)>;

    fn next(&mut self) -> Option<Self::Item> {
        let (step, path) = self
            .shards
            .by_ref()
            .find(|(s, _)| self.range.contains(*s))?;
        Some(read_shard_reusing(
            path,
            *step,
            &self.opts,
            self.spare.take(),
        ))
    }
}

/// The Parquet files a local spec names (directory, `data/` layout, file or glob), unordered.
fn local_files(spec: &str) -> Result<Vec<PathBuf>> {
    let is_parquet = |p: &Path| p.extension().is_some_and(|e| e == "parquet");
    if spec.contains(['*', '?', '[']) {
        let mut out = Vec::new();
        let entries = glob::glob(spec).map_err(|source| Error::Glob {
            spec: spec.to_owned(),
            source,
        })?;
        for entry in entries {
            let p = entry.map_err(|source| Error::GlobEntry {
                spec: spec.to_owned(),
                source,
            })?;
            if p.is_file() && is_parquet(&p) {
                out.push(p);
            }
        }
        if out.is_empty() {
            return Err(Error::GlobEmpty {
                spec: spec.to_owned(),
            });
        }
        return Ok(out);
    }
    let path = Path::new(spec);
    if path.is_file() {
        return Ok(vec![path.to_owned()]);
    }
    if !path.is_dir() {
        return Err(Error::NotFound {
            spec: spec.to_owned(),
        });
    }
    let data = path.join("data");
    let dir = if data.is_dir() { data } else { path.to_owned() };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).at("listing", &dir)? {
        let p = entry.at("listing", &dir)?.path();
        if p.is_file() && is_parquet(&p) {
            out.push(p);
        }
    }
    if out.is_empty() {
        return Err(Error::NoParquetFiles { dir });
    }
    Ok(out)
}

/// The step in a shard's file name: `step-0042.parquet`, `step_42…`, `global_step42…` or `42.parquet`.
pub fn step_from_name(name: &str) -> Option<i64> {
    let stem = Path::new(name).file_stem()?.to_str()?;
    if !stem.is_empty() && stem.bytes().all(|b| b.is_ascii_digit()) {
        return stem.parse().ok();
    }
    let lower = stem.to_ascii_lowercase();
    let at = lower.rfind("step")?;
    let rest = lower[at + 4..].trim_start_matches(['-', '_', '=']);
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The step of a shard: from its file name, else from its `step` column's statistics (which must
/// name a single step).
pub fn shard_step(path: &Path) -> Result<i64> {
    if let Some(s) = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(step_from_name)
    {
        return Ok(s);
    }
    let fail = || {
        Err(Error::UnknownStep {
            path: path.to_owned(),
        })
    };
    let file = File::open(path).at("opening", path)?;
    let reader = SerializedFileReader::new(file).map_err(|source| Error::NotParquet {
        path: path.to_owned(),
        source,
    })?;
    let meta = reader.metadata();
    let Some(col) = meta
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .position(|c| c.path().string() == "step")
    else {
        return fail();
    };
    let (mut lo, mut hi) = (i64::MAX, i64::MIN);
    for rg in meta.row_groups() {
        match rg.column(col).statistics() {
            Some(Statistics::Int64(s)) => {
                let (Some(&a), Some(&b)) = (s.min_opt(), s.max_opt()) else {
                    return fail();
                };
                lo = lo.min(a);
                hi = hi.max(b);
            }
            Some(Statistics::Int32(s)) => {
                let (Some(&a), Some(&b)) = (s.min_opt(), s.max_opt()) else {
                    return fail();
                };
                lo = lo.min(i64::from(a));
                hi = hi.max(i64::from(b));
            }
            _ => return fail(),
        }
    }
    if lo != hi {
        return fail();
    }
    Ok(lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_from_names() {
        assert_eq!(step_from_name("step-0001.parquet"), Some(1));
        assert_eq!(step_from_name("data/step-1000.parquet"), Some(1000));
        assert_eq!(step_from_name("global_step_12.parquet"), Some(12));
        assert_eq!(step_from_name("42.parquet"), Some(42));
        assert_eq!(step_from_name("train-00000-of-00001.parquet"), None);
        assert_eq!(step_from_name("steps.parquet"), None);
    }
}
