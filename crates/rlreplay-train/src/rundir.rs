//! The run directory, the same for every rollout source: resolved config, log, per-step metrics
//! (JSON lines and CSV), plots, atomically written and rotated checkpoints, the last and the best
//! policy, and the published results.
//!
//! ```text
//! RUN_DIR/.rlreplay.lock                      the writer's lock and pid (see [`RunLock`])
//! RUN_DIR/config.toml                         resolved configuration
//! RUN_DIR/run.log                             one line per step, validation and checkpoint
//! RUN_DIR/metrics.jsonl                       one object per trainer step ([trainer] loggers "jsonl")
//! RUN_DIR/tensorboard/events.out.tfevents.*   every metric at its step ([trainer] loggers "tensorboard")
//! RUN_DIR/training_scores.csv                 step, score, loss, grad norm, lr, log-probs, IS diagnostics
//! RUN_DIR/plots/training_score.{png,svg}
//! RUN_DIR/results/training_scores.csv         the published copy, with the plots
//! RUN_DIR/results/hyperparameters.csv         Section, Parameter, Value, Source
//! RUN_DIR/results/validation_mean{k}.csv      step, val_mean{k}, percent (when validating)
//! RUN_DIR/config.json, model.safetensors ...  the best policy by validation mean@k
//! RUN_DIR/best_step.txt                       its step and mean@k
//! RUN_DIR/checkpoints/global_step_N/          HF layout + optimizer + trainer state
//! RUN_DIR/checkpoints/latest_checkpointed_iteration.txt
//! RUN_DIR/checkpoints/last/                   the newest checkpoint's policy (hard links)
//! ```
//! A checkpoint is assembled in a temporary directory and renamed into place, then the
//! `latest_checkpointed_iteration.txt` pointer is replaced atomically; older checkpoints are only
//! removed after that. Killing the process at any moment leaves the last complete checkpoint intact.

use rlreplay_data::{IoContext, IoError};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use rlreplay_tensorboard::EventWriter;

use crate::config::Logger;
use crate::error::{Error, Result};

/// Name of the file inside a checkpoint that records the trainer state; written last.
pub const TRAINER_STATE: &str = "trainer_state.json";
/// Name of the pointer file to the newest complete checkpoint.
pub const LATEST: &str = "latest_checkpointed_iteration.txt";
/// Columns of `training_scores.csv`: `(header, metric key)`.
pub const CSV_COLUMNS: &[(&str, &str)] = &[
    ("score_mean", "critic/score/mean"),
    ("loss", "actor/pg_loss"),
    ("grad_norm", "actor/grad_norm"),
    ("lr", "actor/lr"),
    ("response_length_mean", "response_length/mean"),
    ("rollout_corr_kl", "rollout_corr/kl"),
    ("rollout_corr_k3_kl", "rollout_corr/k3_kl"),
    ("rollout_is_mean", "rollout_corr/rollout_is_mean"),
    (
        "rollout_is_eff_sample_size",
        "rollout_corr/rollout_is_eff_sample_size",
    ),
    (
        "rollout_rs_masked_fraction",
        "rollout_corr/rollout_rs_masked_fraction",
    ),
    ("logprob_success", "replay/logprob_success"),
    ("logprob_failure", "replay/logprob_failure"),
    ("skipped_steps", "train/skipped_steps"),
    ("tokens_per_s", "perf/throughput"),
];

/// One step's metrics: verl-style names to values.
pub type Metrics = BTreeMap<String, f64>;

/// The columns of `training_scores.csv`: per header, the `(step, value)` of each step that has
/// a value.
pub type ScoreHistory = BTreeMap<String, Vec<(u64, f64)>>;

/// Prefixes of the wall-clock metrics, which differ between otherwise identical runs.
pub const TIMING_PREFIXES: [&str; 2] = ["perf/", "timing_s/"];

/// The timed phases of a trainer step in the order they run, as `(label, metric)`: generation,
/// rewards, the old policy's and the teacher's log-probs, the actor update, the weight sync to
/// inference servers, and validation (after the step).
pub const STEP_PHASES: [(&str, &str); 7] = [
    ("gen", "timing_s/gen"),
    ("reward", "timing_s/reward"),
    ("old_log_prob", "timing_s/old_log_prob"),
    ("ref", "timing_s/ref"),
    ("update_actor", "timing_s/update_actor"),
    ("weight_sync", "timing_s/weight_sync"),
    ("testing", "timing_s/testing"),
];

/// Where a step's time went, from its `timing_s/*` metrics: `"117.7 s: gen 28.7, update_actor
/// 89.0"` (the step with its validation, in seconds to 0.1, or to 0.01 under ten seconds; phases
/// that round to zero left out; with an overlapped generation, the part the trainer waited for),
/// each phase with its share of the step when `shares`. `None` without `timing_s/step`.
pub fn time_breakdown(m: &Metrics, shares: bool) -> Option<String> {
    let step = m.get("timing_s/step")?;
    let total = step + m.get("timing_s/testing").copied().unwrap_or(0.0);
    let prec = if total < 10.0 { 2 } else { 1 };
    let parts: Vec<String> = STEP_PHASES
        .iter()
        .filter_map(|&(label, key)| {
            let v = *m.get(key)?;
            if v < 0.5 * 0.1f64.powi(prec as i32) {
                return None;
            }
            let mut part = format!("{label} {v:.prec$}");
            if shares && total > 0.0 {
                part += &format!(" ({:.0} %)", 100.0 * v / total);
            }
            if label == "gen" {
                if let Some(w) = m.get("timing_s/gen_wait") {
                    part += &format!(", waited {w:.prec$}");
                }
            }
            Some(part)
        })
        .collect();
    Some(format!("{total:.prec$} s: {}", parts.join(", ")))
}

/// The per-step lines of a run's `metrics.jsonl`, one JSON object each. With `timing = false` the wall-clock metrics
/// ([`TIMING_PREFIXES`]) are left out, so that two runs of the same data, configuration and seed
/// compare equal.
pub fn read_metrics(run_dir: &Path, timing: bool) -> Result<Vec<serde_json::Value>> {
    let path = run_dir.join("metrics.jsonl");
    let text = fs::read_to_string(&path).at("reading", &path)?;
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            let mut m: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line)
                .map_err(|source| Error::JsonLine {
                    path: path.clone(),
                    line: i + 1,
                    source,
                })?;
            if !timing {
                m.retain(|k, _| !TIMING_PREFIXES.iter().any(|p| k.starts_with(p)));
            }
            Ok(serde_json::Value::Object(m))
        })
        .collect()
}

/// The columns of a `training_scores.csv` file (the run's or its published copy).
pub fn read_score_history(path: &Path) -> Result<ScoreHistory> {
    let text = fs::read_to_string(path).at("reading", path)?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let mut out = ScoreHistory::new();
    for line in lines {
        let mut cells = line.split(',');
        let Some(step) = cells.next().and_then(|s| s.parse::<u64>().ok()) else {
            continue;
        };
        for (name, cell) in header.iter().skip(1).zip(cells) {
            if let Ok(v) = cell.parse::<f64>() {
                out.entry((*name).to_string()).or_default().push((step, v));
            }
        }
    }
    Ok(out)
}

/// Writes a file atomically: temporary file in the same directory, fsync, rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| {
        Error::from(IoError::new(
            "writing",
            path,
            std::io::ErrorKind::InvalidInput.into(),
        ))
    })?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    {
        let written = File::create(&tmp)
            .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
            .at("cannot write", &tmp);
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e.into());
        }
    }
    fs::rename(&tmp, path).at("cannot rename into", path)?;
    sync_dir(dir)
}

/// Syncs a directory's entries (after a rename into it).
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    Ok(File::open(dir)
        .and_then(|d| d.sync_all())
        .at("cannot sync directory", dir)?)
}

/// Syncs every file and directory under `dir`, then `dir` itself.
pub(crate) fn sync_tree(dir: &Path) -> Result<()> {
    for entry in fs::read_dir(dir).at("cannot list", dir)? {
        let entry = entry.at("cannot list", dir)?;
        let path = entry.path();
        if entry.file_type().at("cannot list", dir)?.is_dir() {
            sync_tree(&path)?;
        } else {
            File::open(&path)
                .and_then(|f| f.sync_all())
                .at("cannot sync", &path)?;
        }
    }
    sync_dir(dir)
}

/// Refuses a fresh start in `dir` when it already holds a run, with or without a checkpoint (its
/// `metrics.jsonl` would otherwise be truncated): `--resume` continues it, another `--out` starts
/// elsewhere. Both training fronts call it before writing anything. A run holds something once
/// it has logged a step or saved a checkpoint: what a run that failed before its first step left
/// (empty logs, an empty `checkpoints/`) does not block the next attempt.
pub fn refuse_existing_run(dir: &Path) -> Result<()> {
    let logged = |name: &str, header_lines: usize| {
        fs::read(dir.join(name))
            .map(|b| b.split(|&c| c == b'\n').filter(|l| !l.is_empty()).count() > header_lines)
            .unwrap_or(false)
    };
    let checkpointed = fs::read_dir(dir.join("checkpoints"))
        .map(|mut entries| entries.next().is_some())
        .unwrap_or(false);
    if logged("metrics.jsonl", 0) || logged("training_scores.csv", 1) || checkpointed {
        return Err(Error::ExistingRun {
            dir: dir.to_owned(),
        });
    }
    Ok(())
}

/// File of a run directory's lock; it holds the pid of the process holding the lock.
pub const LOCK: &str = ".rlreplay.lock";

/// The exclusive lock of a run directory, held while the value lives: an OS file lock
/// (`flock`, `LockFileEx`) that the OS releases when its holder exits or is killed, so a stale lock
/// never blocks. Every writer of a run directory (fresh start, `--resume`) takes it before
/// anything else is written there.
#[derive(Debug)]
pub struct RunLock {
    _file: File,
}

impl RunLock {
    /// Creates `dir` when missing and takes its lock. While another process holds it, the error
    /// names that process's pid.
    pub fn acquire(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).at("cannot create run directory", dir)?;
        let path = dir.join(LOCK);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .at("cannot open the run directory's lock", &path)?;
        match fs4::FileExt::try_lock(&file) {
            Ok(()) => {}
            Err(fs4::TryLockError::WouldBlock) => {
                return Err(Error::Locked {
                    dir: dir.to_owned(),
                    holder: lock_holder(&path),
                });
            }
            Err(fs4::TryLockError::Error(e)) => {
                return Err(Error::from(IoError::new("cannot lock", &path, e)))
            }
        }
        file.set_len(0)
            .and_then(|()| writeln!(file, "{}", std::process::id()))
            .and_then(|()| file.sync_all())
            .at("cannot write", &path)?;
        Ok(Self { _file: file })
    }
}

/// `pid N` of the process holding the lock file `path`, or `pid unknown`.
fn lock_holder(path: &Path) -> String {
    // The holder writes its pid right after taking the lock.
    for _ in 0..20 {
        if let Some(pid) = fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        {
            return format!("pid {pid}");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    "pid unknown".to_string()
}

/// Whether a process holds the lock of run directory `dir` (a trainer writing it): its
/// `pid N` (or `pid unknown`) when one does. Reads only: the lock file is neither created nor
/// written, and the lock is released before returning.
pub fn run_in_use(dir: &Path) -> Result<Option<String>> {
    let path = dir.join(LOCK);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Error::from(IoError::new(
                "cannot open the run directory's lock",
                &path,
                e,
            )))
        }
    };
    match fs4::FileExt::try_lock(&file) {
        Ok(()) => Ok(None),
        Err(fs4::TryLockError::WouldBlock) => Ok(Some(lock_holder(&path))),
        Err(fs4::TryLockError::Error(e)) => Err(Error::from(IoError::new("cannot lock", &path, e))),
    }
}

/// On `--resume`: the configuration saved in `dir/config.toml` (read with `parse`) must equal
/// `current` once `comparable` has cleared what may change between sessions (`may_change`
/// names it in the error, with every key that differs and its two values).
pub fn check_resumed_config<T: PartialEq + serde::Serialize>(
    dir: &Path,
    current: &T,
    parse: impl Fn(&str) -> Result<T>,
    comparable: impl Fn(&T) -> T,
    may_change: &str,
) -> Result<()> {
    let path = dir.join("config.toml");
    if !path.exists() && !dir.join("checkpoints").join(LATEST).exists() {
        // Killed before anything was saved: there is nothing to continue or compare with.
        return Ok(());
    }
    let saved = fs::read_to_string(&path).at("--resume: cannot read", &path)?;
    let saved = parse(&saved).map_err(|e| Error::SavedConfig {
        path: path.clone(),
        source: Box::new(e),
    })?;
    let (saved, current) = (comparable(&saved), comparable(current));
    if saved != current {
        let mut changed = Vec::new();
        changed_keys(&to_json(&saved)?, &to_json(&current)?, "", &mut changed);
        if changed.is_empty() {
            changed.push("a value that compares unequal to itself".into());
        }
        return Err(Error::ConfigChanged {
            path,
            changed,
            may_change: may_change.to_string(),
        });
    }
    Ok(())
}

/// Every dotted key whose value differs between `saved` and `now`, as `key = SAVED in the run,
/// NOW now`.
fn changed_keys(
    saved: &serde_json::Value,
    now: &serde_json::Value,
    prefix: &str,
    out: &mut Vec<String>,
) {
    use serde_json::Value;
    match (saved, now) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                let (x, y) = (
                    a.get(k).unwrap_or(&Value::Null),
                    b.get(k).unwrap_or(&Value::Null),
                );
                changed_keys(x, y, &key, out);
            }
        }
        (a, b) if a != b => out.push(format!("{prefix} = {a} in the run, {b} now")),
        _ => {}
    }
}

/// An open run directory.
pub struct RunDir {
    root: PathBuf,
    /// `metrics.jsonl`, with the `jsonl` logger.
    metrics: Option<File>,
    /// The event file of this session, with the `tensorboard` logger.
    events: Option<EventWriter>,
    scores: File,
}

impl RunDir {
    /// Creates (or reopens) the run directory, with the per-step files of `loggers`.
    /// `resume_step` is the step of the checkpoint the run continues from (0 for a fresh run):
    /// metric lines of later steps, left by an interrupted run, are dropped so the files
    /// continue exactly where the checkpoint stands; a new event file starts with a restart
    /// marker at `resume_step + 1`, so TensorBoard drops what earlier files hold from there on.
    pub fn open(root: &Path, resume_step: u64, loggers: &[Logger]) -> Result<Self> {
        fs::create_dir_all(root.join("checkpoints")).at("cannot create run directory", root)?;
        fs::create_dir_all(root.join("plots")).at("cannot create", root.join("plots"))?;
        let metrics_path = root.join("metrics.jsonl");
        let scores_path = root.join("training_scores.csv");
        truncate_lines(&metrics_path, resume_step, |line| {
            serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v.get("step").and_then(|s| s.as_u64()))
        })?;
        truncate_lines(&scores_path, resume_step, |line| {
            line.split(',').next().and_then(|s| s.parse::<u64>().ok())
        })?;
        let mut scores = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&scores_path)
            .at("cannot open", &scores_path)?;
        if scores.metadata().at("cannot read", &scores_path)?.len() == 0 {
            let header: Vec<&str> = std::iter::once("step")
                .chain(CSV_COLUMNS.iter().map(|c| c.0))
                .collect();
            writeln!(scores, "{}", header.join(",")).at("cannot write", &scores_path)?;
        }
        let metrics = if loggers.contains(&Logger::Jsonl) {
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&metrics_path)
                .at("cannot open", &metrics_path)?;
            Some(f)
        } else {
            None
        };
        let events = if loggers.contains(&Logger::Tensorboard) {
            let dir = root.join("tensorboard");
            let earlier = dir.is_dir() && !rlreplay_tensorboard::event_files(&dir)?.is_empty();
            let mut w = EventWriter::create(&dir)?;
            if earlier {
                let step = i64::try_from(resume_step + 1)
                    .map_err(|_| Error::StepRange(resume_step + 1))?;
                w.restart_at(step, rlreplay_tensorboard::now())?;
                w.flush()?;
            }
            Some(w)
        } else {
            None
        };
        Ok(Self {
            root: root.to_path_buf(),
            metrics,
            events,
            scores,
        })
    }

    /// The run directory's path.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The checkpoints directory.
    pub fn checkpoints(&self) -> PathBuf {
        self.root.join("checkpoints")
    }

    /// Appends one step to `training_scores.csv` and to the files of the loggers
    /// (`metrics.jsonl`, the event file).
    pub fn log_step(&mut self, step: u64, metrics: &Metrics) -> Result<()> {
        if let Some(f) = &mut self.metrics {
            let mut obj = serde_json::Map::new();
            obj.insert("step".into(), step.into());
            for (k, v) in metrics {
                let v =
                    serde_json::Number::from_f64(*v).map_or(serde_json::Value::Null, Into::into);
                obj.insert(k.clone(), v);
            }
            writeln!(f, "{}", serde_json::Value::Object(obj))
                .and_then(|()| f.flush())
                .at("cannot write", self.root.join("metrics.jsonl"))?;
        }
        if let Some(w) = &mut self.events {
            let step = i64::try_from(step).map_err(|_| Error::StepRange(step))?;
            let scalars = metrics.iter().map(|(k, v)| (k.as_str(), *v));
            w.add_scalars(step, rlreplay_tensorboard::now(), scalars)?;
            w.flush()?;
        }
        let mut row = vec![step.to_string()];
        row.extend(
            CSV_COLUMNS
                .iter()
                .map(|(_, key)| metrics.get(*key).map_or(String::new(), |v| format!("{v}"))),
        );
        writeln!(self.scores, "{}", row.join(","))
            .and_then(|()| self.scores.flush())
            .at("cannot write", self.root.join("training_scores.csv"))?;
        Ok(())
    }

    /// Reads back the columns of `training_scores.csv`, for the plots.
    pub fn score_history(&self) -> Result<ScoreHistory> {
        read_score_history(&self.root.join("training_scores.csv"))
    }

    /// Redraws `plots/training_score.{png,svg}` from `training_scores.csv`.
    pub fn plot(&self) -> Result<()> {
        let history = self.score_history()?;
        crate::plot::training_score(&history, &self.root.join("plots"))
    }

    /// Writes checkpoint `step`: `fill` populates a fresh temporary directory, which is then
    /// synced and renamed to `global_step_N`, the pointer file is replaced, and all but the newest
    /// `keep` checkpoints (0 = all) are removed.
    pub fn save_checkpoint(
        &self,
        step: u64,
        keep: usize,
        fill: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<PathBuf> {
        let ckpts = self.checkpoints();
        let tmp = ckpts.join(format!(".tmp-global_step_{step}-{}", std::process::id()));
        let dest = ckpts.join(format!("global_step_{step}"));
        let written = (|| {
            if tmp.exists() {
                fs::remove_dir_all(&tmp).at("cannot remove", &tmp)?;
            }
            fs::create_dir_all(&tmp).at("cannot create", &tmp)?;
            fill(&tmp)?;
            if !tmp.join(TRAINER_STATE).is_file() {
                return Err(Error::IncompleteCheckpoint { step });
            }
            sync_tree(&tmp)?;
            if dest.exists() {
                fs::remove_dir_all(&dest).at("cannot remove", &dest)?;
            }
            fs::rename(&tmp, &dest).at("cannot rename into", &dest)?;
            sync_dir(&ckpts)
        })();
        if let Err(e) = written {
            // Nothing of a failed save stays: the previous checkpoint remains the latest.
            let _ = fs::remove_dir_all(&tmp);
            return Err(match e {
                e @ Error::IncompleteCheckpoint { .. } => e,
                e => Error::WriteCheckpoint {
                    step,
                    source: Box::new(e),
                },
            });
        }
        write_atomic(&ckpts.join(LATEST), format!("{step}\n").as_bytes()).map_err(|e| {
            Error::WriteCheckpoint {
                step,
                source: Box::new(e),
            }
        })?;
        if keep > 0 {
            let steps = complete_checkpoints(&ckpts)?;
            for old in steps.iter().rev().skip(keep) {
                let old = ckpts.join(format!("global_step_{old}"));
                fs::remove_dir_all(&old).at("cannot remove", &old)?;
            }
        }
        Ok(dest)
    }
}

/// Whether a file of a checkpoint or of the run root belongs to the policy's Hugging Face
/// directory: `config.json`, the weights (`model.safetensors`, or shards and their index) and the
/// tokenizer and generation files; not the optimizer state nor the trainer state.
pub fn is_policy_file(name: &str) -> bool {
    !name.starts_with("optimizer")
        && (name == "config.json"
            || name.ends_with(".safetensors")
            || name == "model.safetensors.index.json"
            || name == rlreplay_model::lora::ADAPTER_CONFIG
            || rlreplay_model::TOKENIZER_FILES.contains(&name))
}

/// The names of the regular files of `dir` that `keep` accepts, sorted.
pub(crate) fn file_names(dir: &Path, keep: impl Fn(&str) -> bool) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).at("cannot list", dir)? {
        let entry = entry.at("cannot list", dir)?;
        if entry.file_type().at("cannot list", dir)?.is_file() {
            if let Some(name) = entry.file_name().to_str().filter(|n| keep(n)) {
                names.push(name.to_string());
            }
        }
    }
    names.sort();
    Ok(names)
}

/// Renames directory `new` onto `dest` and syncs their parent: a directory already at `dest`
/// is first renamed to `aside` (in the same parent), then removed once `new` has taken its
/// place (and put back when `new` cannot).
pub(crate) fn replace_dir(new: &Path, dest: &Path, aside: &Path) -> Result<()> {
    if dest.exists() {
        fs::rename(dest, aside).at("cannot rename into", aside)?;
        if let Err(e) = fs::rename(new, dest) {
            // Put the previous directory back.
            let _ = fs::rename(aside, dest);
            return Err(Error::from(IoError::new("cannot rename into", dest, e)));
        }
        fs::remove_dir_all(aside).at("cannot remove", aside)?;
    } else {
        fs::rename(new, dest).at("cannot rename into", dest)?;
    }
    sync_dir(dest.parent().unwrap_or(Path::new(".")))
}

/// Hard-links the regular files of `from` that `keep` accepts into `to` (created when missing),
/// copying those that cannot be linked (another file system); returns their names. For files
/// that are replaced by a rename, never rewritten in place, as checkpoints and policies are.
pub(crate) fn link_files(
    from: &Path,
    to: &Path,
    keep: impl Fn(&str) -> bool,
) -> Result<Vec<String>> {
    fs::create_dir_all(to).at("cannot create", to)?;
    let names = file_names(from, keep)?;
    for name in &names {
        let (src, dst) = (from.join(name), to.join(name));
        if fs::hard_link(&src, &dst).is_err() {
            fs::copy(&src, &dst).at("cannot copy into", &dst)?;
        }
    }
    Ok(names)
}

/// The best policy saved at a validation, promoted to the run root once a checkpoint at or after
/// its step exists.
const BEST_CANDIDATE: &str = ".best-candidate";

/// Where configuration values came from.
#[derive(Debug, Clone, Default)]
pub struct Provenance {
    /// The configuration file's path and text.
    pub file: Option<(PathBuf, String)>,
    /// `section.key=value` overrides.
    pub overrides: Vec<String>,
}

impl RunDir {
    /// Appends a line to `run.log`.
    pub fn log(&self, line: &str) -> Result<()> {
        let path = self.root.join("run.log");
        Ok(OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| writeln!(f, "{line}"))
            .at("cannot write", &path)?)
    }

    /// The directory the best policy of a validation is saved into before its promotion.
    pub fn best_candidate(&self) -> PathBuf {
        self.root.join(BEST_CANDIDATE)
    }

    /// Removes a best-policy candidate left by an interrupted run (it is newer than the
    /// checkpoint the run continues from).
    pub fn drop_stale_candidate(&self) -> Result<()> {
        let cand = self.best_candidate();
        if cand.exists() {
            fs::remove_dir_all(&cand).at("cannot remove", &cand)?;
        }
        Ok(())
    }

    /// After checkpoint `ckpt`: `checkpoints/last` becomes hard links to its policy files, and a
    /// best-policy candidate (validated at or before this step) moves to the run root with
    /// `best_step.txt` (`best` = its step and mean@k).
    pub fn publish_policy(&self, ckpt: &Path, best: Option<(u64, f64)>) -> Result<()> {
        let ckpts = self.checkpoints();
        let tmp = ckpts.join(format!(".last-{}", std::process::id()));
        if tmp.exists() {
            fs::remove_dir_all(&tmp).at("cannot remove", &tmp)?;
        }
        link_files(ckpt, &tmp, is_policy_file)?;
        sync_dir(&tmp)?;
        let old = ckpts.join(format!(".last-old-{}", std::process::id()));
        replace_dir(&tmp, &ckpts.join("last"), &old)?;
        let cand = self.best_candidate();
        if cand.join("step.txt").is_file() {
            for name in file_names(&cand, is_policy_file)? {
                let (src, dst) = (cand.join(&name), self.root.join(&name));
                let tmp = self.root.join(format!(".{name}.tmp-best"));
                fs::copy(&src, &tmp).at("cannot copy into", &tmp)?;
                fs::rename(&tmp, &dst).at("cannot rename into", &dst)?;
            }
            if let Some((s, m)) = best {
                write_atomic(
                    &self.root.join("best_step.txt"),
                    format!("{s} {m:.12}\n").as_bytes(),
                )?;
            }
            fs::remove_dir_all(&cand).at("cannot remove", &cand)?;
        }
        Ok(())
    }

    /// Redraws the plots and writes `results/`: `training_scores.csv` and the plots, and, when
    /// the run validates (`validations` with `k` samples per prompt), `validation_mean{k}.csv`.
    pub fn publish_results(&self, validations: Option<(usize, &[(u64, f64)])>) -> Result<()> {
        self.plot()?;
        let results = self.root.join("results");
        fs::create_dir_all(&results).at("cannot create", &results)?;
        if let Some((k, vals)) = validations {
            let mut csv = format!("step,val_mean{k},percent\n");
            for (s, m) in vals {
                csv.push_str(&format!("{s},{m:.12},{:.2}%\n", m * 100.0));
            }
            write_atomic(
                &results.join(format!("validation_mean{k}.csv")),
                csv.as_bytes(),
            )?;
        }
        for (from, to) in [
            ("training_scores.csv", "training_scores.csv"),
            ("plots/training_score.png", "training_score.png"),
            ("plots/training_score.svg", "training_score.svg"),
        ] {
            let from = self.root.join(from);
            write_atomic(
                &results.join(to),
                &fs::read(&from).at("cannot read", &from)?,
            )?;
        }
        Ok(())
    }

    /// Writes `results/hyperparameters.csv` (`Section,Parameter,Value,Source`) from the resolved
    /// configuration `resolved` (TOML text); `Source` is `override`, `config` (set in the file)
    /// or `default`.
    pub fn write_hyperparameters(&self, resolved: &str, prov: &Provenance) -> Result<()> {
        let resolved: toml::Table = toml::from_str(resolved)?;
        let file: toml::Table = match &prov.file {
            Some((_, text)) => toml::from_str(text).unwrap_or_default(),
            None => toml::Table::new(),
        };
        let overridden: Vec<&str> = prov
            .overrides
            .iter()
            .filter_map(|o| o.split_once('=').map(|(k, _)| k.trim()))
            .collect();
        let mut rows = vec!["Section,Parameter,Value,Source".to_string()];
        fn flatten(prefix: &str, t: &toml::Table, out: &mut Vec<(String, String)>) {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match v {
                    toml::Value::Table(inner) => flatten(&key, inner, out),
                    toml::Value::String(s) => out.push((key, s.clone())),
                    other => out.push((key, other.to_string())),
                }
            }
        }
        for (section, v) in &resolved {
            let mut kv = Vec::new();
            match v {
                toml::Value::Table(t) => flatten("", t, &mut kv),
                other => kv.push((String::new(), other.to_string())),
            }
            for (key, value) in kv {
                let full = format!("{section}.{key}");
                let in_file = {
                    let mut cur = file.get(section.as_str());
                    for part in key.split('.') {
                        cur = cur.and_then(|c| c.as_table()).and_then(|t| t.get(part));
                    }
                    cur.is_some()
                };
                let source = if overridden.contains(&full.as_str()) {
                    "override"
                } else if in_file {
                    "config"
                } else {
                    "default"
                };
                rows.push(format!(
                    "{},{},{},{source}",
                    csv_field(section),
                    csv_field(&key),
                    csv_field(&value)
                ));
            }
        }
        rows.push(String::new());
        let results = self.root.join("results");
        fs::create_dir_all(&results).at("cannot create", &results)?;
        write_atomic(
            &results.join("hyperparameters.csv"),
            rows.join("\n").as_bytes(),
        )
    }
}

/// One CSV field: quoted (quotes doubled) when it holds a comma, a quote or a line break.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The records of CSV text written with [`csv_field`] (quoted fields may hold commas, quotes and
/// line breaks); blank lines are skipped.
pub fn csv_records(text: &str) -> Vec<Vec<String>> {
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    let mut end_record = |record: &mut Vec<String>, field: &mut String| {
        record.push(std::mem::take(field));
        let done = std::mem::take(record);
        if done.len() > 1 || !done[0].is_empty() {
            records.push(done);
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => record.push(std::mem::take(&mut field)),
            '\r' if !quoted && chars.peek() == Some(&'\n') => {}
            '\n' if !quoted => end_record(&mut record, &mut field),
            c => field.push(c),
        }
    }
    end_record(&mut record, &mut field);
    records
}

/// A configuration as JSON, for the comparison of a resumed run's.
fn to_json<T: serde::Serialize>(v: &T) -> Result<serde_json::Value> {
    serde_json::to_value(v).map_err(|source| Error::Json {
        what: "the configuration",
        source,
    })
}

/// Steps of the complete checkpoints under `ckpts`, ascending.
pub fn complete_checkpoints(ckpts: &Path) -> Result<Vec<u64>> {
    let mut steps = Vec::new();
    if !ckpts.is_dir() {
        return Ok(steps);
    }
    for entry in fs::read_dir(ckpts).at("cannot list", ckpts)? {
        let entry = entry.at("cannot list", ckpts)?;
        let name = entry.file_name();
        let Some(n) = name
            .to_str()
            .and_then(|n| n.strip_prefix("global_step_"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        if entry.path().join(TRAINER_STATE).is_file() {
            steps.push(n);
        }
    }
    steps.sort_unstable();
    Ok(steps)
}

/// The newest complete checkpoint of a run: the pointer file's step when that checkpoint is
/// complete, otherwise the highest complete `global_step_N`. Leftover temporary directories of
/// an interrupted save are removed.
pub fn latest_checkpoint(run_dir: &Path) -> Result<Option<(u64, PathBuf)>> {
    let ckpts = run_dir.join("checkpoints");
    if !ckpts.is_dir() {
        return Ok(None);
    }
    // Everything whose name starts with a dot is a leftover of an interrupted save.
    for entry in fs::read_dir(&ckpts).at("cannot list", &ckpts)? {
        let entry = entry.at("cannot list", &ckpts)?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            let path = entry.path();
            if entry.file_type().at("cannot list", &ckpts)?.is_dir() {
                fs::remove_dir_all(&path).at("cannot remove", &path)?;
            } else {
                fs::remove_file(&path).at("cannot remove", &path)?;
            }
        }
    }
    newest_checkpoint(run_dir)
}

/// The newest complete checkpoint of a run, as [`latest_checkpoint`] finds it, without
/// touching the run directory (leftovers of an interrupted save stay).
pub fn newest_checkpoint(run_dir: &Path) -> Result<Option<(u64, PathBuf)>> {
    let ckpts = run_dir.join("checkpoints");
    let complete = complete_checkpoints(&ckpts)?;
    let pointed = fs::read_to_string(ckpts.join(LATEST))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|s| complete.contains(s));
    Ok(pointed
        .or_else(|| complete.last().copied())
        .map(|s| (s, checkpoint_dir(run_dir, s))))
}

/// The directory of checkpoint `step` of a run.
pub fn checkpoint_dir(run_dir: &Path, step: u64) -> PathBuf {
    run_dir
        .join("checkpoints")
        .join(format!("global_step_{step}"))
}

/// Keeps the lines of `path` whose step (as extracted by `step_of`) is at most `max_step`, plus
/// lines without a step (headers); drops the rest, including a torn last line.
fn truncate_lines(path: &Path, max_step: u64, step_of: impl Fn(&str) -> Option<u64>) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let file = File::open(path).at("cannot read", path)?;
    let mut kept = String::new();
    let mut changed = false;
    for (i, line) in BufReader::new(file).split(b'\n').enumerate() {
        let line = line.at("cannot read", path)?;
        let Ok(line) = String::from_utf8(line) else {
            changed = true;
            continue;
        };
        match step_of(&line) {
            Some(s) if s <= max_step => kept.push_str(&line),
            None if i == 0 && !line.is_empty() && !line.starts_with('{') => kept.push_str(&line),
            _ => {
                changed = true;
                continue;
            }
        }
        kept.push('\n');
    }
    if changed {
        write_atomic(path, kept.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(v: f64) -> Metrics {
        [
            ("critic/score/mean".to_string(), v),
            ("actor/pg_loss".to_string(), -v),
        ]
        .into_iter()
        .collect()
    }

    #[test]
    fn a_steps_time_is_broken_down_by_phase() {
        let m: Metrics = [
            ("timing_s/step", 117.71),
            ("timing_s/gen", 28.71),
            ("timing_s/gen_wait", 3.04),
            ("timing_s/reward", 0.0008),
            ("timing_s/update", 88.99),
            ("timing_s/update_actor", 80.0),
            ("timing_s/ref", 8.99),
            ("timing_s/testing", 12.29),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(
            time_breakdown(&m, false).unwrap(),
            "130.0 s: gen 28.7, waited 3.0, ref 9.0, update_actor 80.0, testing 12.3"
        );
        assert_eq!(
            time_breakdown(&m, true).unwrap(),
            "130.0 s: gen 28.7 (22 %), waited 3.0, ref 9.0 (7 %), update_actor 80.0 (62 %), \
             testing 12.3 (9 %)"
        );
        let small: Metrics = [("timing_s/step", 0.34), ("timing_s/update_actor", 0.23)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(
            time_breakdown(&small, false).unwrap(),
            "0.34 s: update_actor 0.23"
        );
        assert_eq!(time_breakdown(&metrics(1.0), false), None);
    }

    fn state(dir: &Path) -> Result<()> {
        Ok(fs::write(dir.join(TRAINER_STATE), "{}").at("writing", dir.join(TRAINER_STATE))?)
    }

    #[test]
    fn logs_and_truncates_on_resume() {
        let tmp = tempfile::tempdir().unwrap();
        let mut rd = RunDir::open(tmp.path(), 0, &[Logger::Jsonl]).unwrap();
        for s in 1..=4 {
            rd.log_step(s, &metrics(s as f64 / 10.0)).unwrap();
        }
        drop(rd);
        // A torn final line, as a kill in the middle of a write leaves it.
        let mut f = OpenOptions::new()
            .append(true)
            .open(tmp.path().join("metrics.jsonl"))
            .unwrap();
        write!(f, "{{\"step\": 5, \"critic").unwrap();
        drop(f);
        let rd = RunDir::open(tmp.path(), 2, &[Logger::Jsonl]).unwrap();
        let h = rd.score_history().unwrap();
        assert_eq!(h["score_mean"], vec![(1, 0.1), (2, 0.2)]);
        assert_eq!(h["loss"], vec![(1, -0.1), (2, -0.2)]);
        let m = fs::read_to_string(tmp.path().join("metrics.jsonl")).unwrap();
        assert_eq!(m.lines().count(), 2);
        let csv = fs::read_to_string(tmp.path().join("training_scores.csv")).unwrap();
        assert!(csv.starts_with("step,score_mean,loss,grad_norm"));
        rd.plot().unwrap();
        assert!(tmp.path().join("plots/training_score.png").is_file());
        assert!(tmp.path().join("plots/training_score.svg").is_file());
    }

    /// Every file of a policy reaches `checkpoints/last` and, for the best policy, the run root:
    /// shards and their index, chat template; neither the optimizer nor the trainer state.
    #[test]
    fn published_policies_keep_every_policy_file() {
        let tmp = tempfile::tempdir().unwrap();
        let rd = RunDir::open(tmp.path(), 0, &[Logger::Jsonl]).unwrap();
        let policy = [
            "config.json",
            "generation_config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "tokenizer.json",
            "chat_template.jinja",
        ];
        let fill = |d: &Path| {
            for f in policy {
                fs::write(d.join(f), f).unwrap();
            }
        };
        let ckpt = rd
            .save_checkpoint(2, 1, |d| {
                fill(d);
                fs::write(d.join("optimizer.safetensors"), "adam").unwrap();
                state(d)
            })
            .unwrap();
        let cand = rd.best_candidate();
        fs::create_dir_all(&cand).unwrap();
        fill(&cand);
        fs::write(cand.join("step.txt"), "2\n").unwrap();
        rd.publish_policy(&ckpt, Some((2, 0.5))).unwrap();
        let last = rd.checkpoints().join("last");
        for f in policy {
            assert_eq!(fs::read_to_string(last.join(f)).unwrap(), f);
            assert_eq!(fs::read_to_string(tmp.path().join(f)).unwrap(), f);
        }
        for f in ["optimizer.safetensors", TRAINER_STATE] {
            assert!(
                !last.join(f).exists() && !tmp.path().join(f).exists(),
                "{f}"
            );
        }
        assert!(!cand.exists() && !tmp.path().join("step.txt").exists());
        assert_eq!(
            fs::read_to_string(tmp.path().join("best_step.txt")).unwrap(),
            "2 0.500000000000\n"
        );
    }

    #[test]
    fn checkpoints_rotate_and_survive_interrupted_saves() {
        let tmp = tempfile::tempdir().unwrap();
        let rd = RunDir::open(tmp.path(), 0, &[Logger::Jsonl]).unwrap();
        for s in [2, 4, 6] {
            rd.save_checkpoint(s, 2, state).unwrap();
        }
        assert_eq!(complete_checkpoints(&rd.checkpoints()).unwrap(), vec![4, 6]);
        assert_eq!(latest_checkpoint(tmp.path()).unwrap().unwrap().0, 6);
        // A save that fails half-way leaves the previous checkpoint the latest.
        let e = rd.save_checkpoint(8, 2, |d| {
            fs::write(d.join("model.safetensors"), b"partial").unwrap();
            Err(Error::from(IoError::new(
                "writing",
                d.join("model.safetensors"),
                std::io::Error::from_raw_os_error(28),
            )))
        });
        // The error says which checkpoint and which file, and nothing of it is left.
        let Err(Error::WriteCheckpoint { step: 8, source }) = &e else {
            panic!("{e:?}")
        };
        let Error::Io(IoError { path, .. }) = &**source else {
            panic!("{source:?}")
        };
        assert!(path.ends_with("model.safetensors"), "{path:?}");
        assert_eq!(
            fs::read_dir(rd.checkpoints())
                .unwrap()
                .filter(|e| e
                    .as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('.'))
                .count(),
            0
        );
        assert_eq!(latest_checkpoint(tmp.path()).unwrap().unwrap().0, 6);
        // A pointer to a removed checkpoint falls back to the newest complete one.
        fs::write(rd.checkpoints().join(LATEST), "99\n").unwrap();
        assert_eq!(latest_checkpoint(tmp.path()).unwrap().unwrap().0, 6);
        assert!(!fs::read_dir(rd.checkpoints()).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with('.')));
    }
}
