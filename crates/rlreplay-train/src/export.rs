//! A run directory of `rlreplay train` or `rlreplay replay` written out in the layout of the
//! published model card (a Qwen3-4B trained online with RLSD_TR and validated by mean@16):
//!
//! ```text
//! CARD_DIR/README.md                           the model card: YAML front matter with the
//!                                              model-index, recipe, hyperparameter and validation tables
//! CARD_DIR/config.json, model.safetensors ...  the best policy by validation mean@k (HF layout);
//!                                              the last one when the run never validated
//! CARD_DIR/checkpoints/last/                   the last policy (HF layout)
//! CARD_DIR/results/validation_mean{k}.csv      step, val_mean{k}, percent (when the run validated)
//! CARD_DIR/results/training_scores.csv         step, score, loss, grad norm, lr, ...
//! CARD_DIR/results/hyperparameters.csv         Section, Parameter, Value, Source
//! CARD_DIR/results/export_note.csv             field, value: source run, checkpoints, mean@k,
//!                                              rlreplay version, date
//! CARD_DIR/results/training_score.{png,svg}
//! CARD_DIR/artifacts/                          config.toml, run.log, metrics.jsonl,
//!                                              trainer_state.json, best_step.txt,
//!                                              latest_checkpointed_iteration.txt, tensorboard/
//! ```
//!
//! The run directory is only read (a run a trainer is writing is refused). The card is assembled
//! in a temporary directory next to CARD_DIR, synced, and renamed into place; on an error nothing
//! of it is left. The policies' files are hard links to the run's where the file system allows
//! (neither side rewrites them in place), copies otherwise; every other file is a copy.

use rlreplay_data::IoContext;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Serialize;

use crate::config::{Config, SourceKind, Task};
use crate::error::{Error, Result};
use crate::rundir::{
    self, checkpoint_dir, complete_checkpoints, csv_field, csv_records, is_policy_file, link_files,
    newest_checkpoint, read_score_history, replace_dir, sync_tree, LATEST, TRAINER_STATE,
};
use crate::trainer::{base_model, initial_model_dir, TrainerState};
use rlreplay_model::lora::{ADAPTER_CONFIG, ADAPTER_WEIGHTS};

mod readme;

/// Which policy goes at the card's root.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CheckpointChoice {
    /// The best policy by validation mean@k (the last one when the run never validated).
    #[default]
    Best,
    /// The policy of the newest checkpoint.
    Last,
    /// The policy of checkpoint `global_step_N`.
    Step(u64),
}

impl FromStr for CheckpointChoice {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "best" => Ok(Self::Best),
            "last" => Ok(Self::Last),
            _ => s
                .strip_prefix("global_step_")
                .and_then(|n| n.parse().ok())
                .map(Self::Step)
                .ok_or_else(|| Error::CheckpointChoice(s.to_string())),
        }
    }
}

impl fmt::Display for CheckpointChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Best => f.write_str("best"),
            Self::Last => f.write_str("last"),
            Self::Step(n) => write!(f, "global_step_{n}"),
        }
    }
}

/// What [`export`] writes, and where.
#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    /// The run directory of `rlreplay train` or `rlreplay replay`.
    pub run_dir: PathBuf,
    /// The card directory to write.
    pub card_dir: PathBuf,
    /// The policy at the card's root.
    pub checkpoint: CheckpointChoice,
    /// Replace an existing non-empty card directory.
    pub force: bool,
    /// Hub id of the base model for the card's metadata; absent: derived from `[model] path`
    /// when it names one (`hf://OWNER/NAME`, a hub cache directory `models--OWNER--NAME`).
    pub base_model: Option<String>,
    /// License for the card's metadata; absent: the base model directory's README front matter
    /// `license`, when it has one.
    pub license: Option<String>,
    /// For a LoRA run: put the root policy's adapter merged into the base weights at the card's
    /// root (the Hugging Face layout) instead of the adapter alone.
    pub merge: bool,
}

/// One validation of the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Validation {
    /// The trainer step (0: before training).
    pub step: u64,
    /// mean@k.
    pub mean: f64,
}

/// What [`export`] wrote.
#[derive(Debug, Clone, Serialize)]
pub struct ExportReport {
    /// The card directory.
    pub card_dir: PathBuf,
    /// The run directory it was exported from.
    pub run_dir: PathBuf,
    /// The policy asked for at the root (`best`, `last`, `global_step_N`).
    pub requested: String,
    /// The policy at the root (`best`, `last`, `global_step_N`).
    pub root: String,
    /// Its trainer step.
    pub root_step: u64,
    /// Its validation mean@k, when the run validated it.
    pub root_mean: Option<f64>,
    /// Why the root holds another policy than asked for.
    pub note: Option<String>,
    /// k of mean@k.
    pub k: usize,
    /// The best validation.
    pub best: Option<Validation>,
    /// Every validation, by step.
    pub validations: Vec<Validation>,
    /// The step of the last policy (`checkpoints/last/`).
    pub last_step: u64,
    /// Whether an existing card directory was replaced (`force`).
    pub replaced: bool,
    /// The files written, relative to the card directory, sorted.
    pub files: Vec<String>,
}

/// Writes the card of `opts.run_dir` into `opts.card_dir` (see the module documentation).
pub fn export(opts: &ExportOptions) -> Result<ExportReport> {
    let run = Run::read(opts)?;
    let card = card_path(&opts.card_dir, &run.dir, opts.force)?;
    let name = card
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| Error::CardDir {
            dir: card.clone(),
            why: "not a directory name".into(),
        })?;
    let parent = card.parent().unwrap_or(Path::new(".")).to_path_buf();
    fs::create_dir_all(&parent).at("cannot create", &parent)?;
    let pid = std::process::id();
    let staging = Staging(parent.join(format!(".{name}.export-{pid}")));
    if staging.0.exists() {
        fs::remove_dir_all(&staging.0).at("cannot remove", &staging.0)?;
    }
    fs::create_dir(&staging.0).at("cannot create", &staging.0)?;
    run.write(&staging.0, &card, &name, opts)?;
    sync_tree(&staging.0)?;
    let files = list_files(&staging.0)?;
    let replaced = card.exists();
    replace_dir(
        &staging.0,
        &card,
        &parent.join(format!(".{name}.replaced-{pid}")),
    )?;
    let root_mean = run.mean_at(run.root.step);
    Ok(ExportReport {
        card_dir: card,
        run_dir: run.dir.clone(),
        requested: opts.checkpoint.to_string(),
        root: run.root.label.clone(),
        root_step: run.root.step,
        root_mean,
        note: run.root.note.clone(),
        k: run.k,
        best: run.best.as_ref().map(Validation::from),
        validations: run.validations.iter().map(Validation::from).collect(),
        last_step: run.last.0,
        replaced,
        files,
    })
}

/// The card directory, absolute, once it is known to lie apart from the run directory and to be
/// empty or absent (or `force`).
fn card_path(card: &Path, run: &Path, force: bool) -> Result<PathBuf> {
    let refuse = |why: String| Error::CardDir {
        dir: card.to_path_buf(),
        why,
    };
    let resolved = resolve(card)?;
    if resolved.starts_with(run) || run.starts_with(&resolved) {
        return Err(refuse(format!(
            "overlaps the run directory {}: choose another --out",
            run.display()
        )));
    }
    if !resolved.exists() {
        return Ok(resolved);
    }
    if !resolved.is_dir() {
        return Err(refuse("exists and is not a directory".into()));
    }
    let empty = fs::read_dir(&resolved)
        .at("cannot list", &resolved)?
        .next()
        .is_none();
    if !empty && !force {
        return Err(refuse(
            "exists and is not empty: pass --force to replace it".into(),
        ));
    }
    Ok(resolved)
}

/// `path` made absolute with its existing part canonical (symbolic links, `..` resolved).
fn resolve(path: &Path) -> Result<PathBuf> {
    if path.exists() {
        return Ok(path.canonicalize().at("cannot resolve", path)?);
    }
    let abs = std::path::absolute(path).at("cannot resolve", path)?;
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => Ok(resolve(parent)?.join(name)),
        _ => Ok(abs),
    }
}

/// The temporary card directory, removed unless it was renamed into place.
struct Staging(PathBuf);

impl Drop for Staging {
    fn drop(&mut self) {
        if self.0.exists() {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

/// The files under `dir`, relative to it, sorted.
fn list_files(dir: &Path) -> Result<Vec<String>> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) -> Result<()> {
        for entry in fs::read_dir(dir).at("cannot list", dir)? {
            let entry = entry.at("cannot list", dir)?;
            let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
            if entry.file_type().at("cannot list", dir)?.is_dir() {
                walk(&entry.path(), &format!("{name}/"), out)?;
            } else {
                out.push(name);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, "", &mut out)?;
    out.sort();
    Ok(out)
}

/// One row of `validation_mean{k}.csv`, its cells as written.
#[derive(Debug, Clone)]
struct ValRow {
    step: u64,
    value: String,
    percent: String,
    mean: f64,
}

impl From<&ValRow> for Validation {
    fn from(v: &ValRow) -> Self {
        Self {
            step: v.step,
            mean: v.mean,
        }
    }
}

/// The policy at the card's root.
#[derive(Debug, Clone)]
struct Root {
    /// `best`, `last`, `global_step_N`.
    label: String,
    step: u64,
    /// The directory its files come from.
    dir: PathBuf,
    /// Why it is not the policy asked for.
    note: Option<String>,
}

/// Everything of a run directory the card is made of, checked before anything is written.
struct Run {
    dir: PathBuf,
    config: Config,
    k: usize,
    validations: Vec<ValRow>,
    val_csv: Option<PathBuf>,
    best: Option<ValRow>,
    best_file: Option<PathBuf>,
    /// The newest complete checkpoint: its step and directory.
    last: (u64, PathBuf),
    state: TrainerState,
    root: Root,
    scores: PathBuf,
    hyperparameters: PathBuf,
    /// The directory holding `training_score.{png,svg}`, when the run has them.
    plots: Option<PathBuf>,
    run_log: PathBuf,
    /// The validation data sources.
    sources: Vec<String>,
}

/// A required file of the run directory.
fn required(path: PathBuf, why: &str) -> Result<PathBuf> {
    if path.exists() {
        Ok(path)
    } else {
        Err(Error::MissingRunFile {
            path,
            why: why.to_string(),
        })
    }
}

/// A file of the run directory that may be absent.
fn optional(path: PathBuf) -> Option<PathBuf> {
    path.exists().then_some(path)
}

fn bad(path: &Path, why: impl Into<String>) -> Error {
    Error::BadRunFile {
        path: path.to_path_buf(),
        why: why.into(),
    }
}

impl Run {
    fn read(opts: &ExportOptions) -> Result<Self> {
        let dir = required(
            opts.run_dir.clone(),
            "the run directory of rlreplay train or rlreplay replay",
        )?
        .canonicalize()
        .at("cannot resolve", &opts.run_dir)?;
        if let Some(holder) = rundir::run_in_use(&dir)? {
            return Err(Error::RunInUse { dir, holder });
        }
        let config_path = required(
            dir.join("config.toml"),
            "the run's resolved configuration, written when the run starts",
        )?;
        let text = fs::read_to_string(&config_path).at("cannot read", &config_path)?;
        let table: toml::Table = toml::from_str(&text).map_err(|e| Error::InConfig {
            path: config_path.clone(),
            source: Box::new(e.into()),
        })?;
        let kind = match table.get("data").and_then(|d| d.get("path")) {
            Some(_) => SourceKind::Logged,
            None => SourceKind::Online,
        };
        let config = Config::parse(&text, &[], kind).map_err(|e| Error::InConfig {
            path: config_path.clone(),
            source: Box::new(e),
        })?;
        let k = config.validation.val_n;

        let ckpts = dir.join("checkpoints");
        let last =
            newest_checkpoint(&dir)?.ok_or_else(|| Error::NoCheckpoint { dir: ckpts.clone() })?;
        let state_path = last.1.join(TRAINER_STATE);
        let state_text = fs::read_to_string(&state_path).at("cannot read", &state_path)?;
        let state: TrainerState =
            serde_json::from_str(&state_text).map_err(|source| Error::JsonFile {
                path: state_path.clone(),
                source,
            })?;

        let results = dir.join("results");
        let val_csv = optional(results.join(format!("validation_mean{k}.csv")));
        let validations = match &val_csv {
            Some(path) => read_validations(path)?,
            None => Vec::new(),
        };
        let best_file = optional(dir.join("best_step.txt"));
        let best = match &best_file {
            Some(path) => Some(read_best(path, &validations)?),
            None => None,
        };
        let root = Self::root(&dir, opts.checkpoint, best.as_ref(), &last)?;

        let scores = optional(results.join("training_scores.csv"))
            .or_else(|| optional(dir.join("training_scores.csv")))
            .ok_or_else(|| Error::MissingRunFile {
                path: results.join("training_scores.csv"),
                why: "the per-step scores, published at every checkpoint".into(),
            })?;
        let hyperparameters = required(
            results.join("hyperparameters.csv"),
            "the hyperparameter table, written when the run starts",
        )?;
        let has_plots = |d: &Path| {
            d.join("training_score.png").is_file() && d.join("training_score.svg").is_file()
        };
        let plots = [results.clone(), dir.join("plots")]
            .into_iter()
            .find(|d| has_plots(d));
        let run_log = required(
            dir.join("run.log"),
            "the run's log, written from the run's start",
        )?;
        let sources = validation_sources(&dir, &config, k)?;
        Ok(Self {
            dir,
            config,
            k,
            validations,
            val_csv,
            best,
            best_file,
            last,
            state,
            root,
            scores,
            hyperparameters,
            plots,
            run_log,
            sources,
        })
    }

    /// The policy at the root for `choice`.
    fn root(
        dir: &Path,
        choice: CheckpointChoice,
        best: Option<&ValRow>,
        last: &(u64, PathBuf),
    ) -> Result<Root> {
        let last_root = |note: Option<String>| Root {
            label: "last".into(),
            step: last.0,
            dir: last.1.clone(),
            note,
        };
        match (choice, best) {
            (CheckpointChoice::Best, Some(best)) => {
                // The run root holds the best policy; its checkpoint, while the run keeps it,
                // holds the same weights.
                let ckpt = checkpoint_dir(dir, best.step);
                let in_root = missing_policy_file(dir)?.is_none();
                Ok(Root {
                    label: "best".into(),
                    step: best.step,
                    dir: if in_root || !ckpt.join(TRAINER_STATE).is_file() {
                        dir.to_path_buf()
                    } else {
                        ckpt
                    },
                    note: None,
                })
            }
            (CheckpointChoice::Best, None) => Ok(last_root(Some(format!(
                "the run never validated (no {}): the root holds the last policy (step {})",
                dir.join("best_step.txt").display(),
                last.0
            )))),
            (CheckpointChoice::Last, _) => Ok(last_root(None)),
            (CheckpointChoice::Step(step), _) => {
                let ckpt = checkpoint_dir(dir, step);
                if !ckpt.join(TRAINER_STATE).is_file() {
                    let ckpts = dir.join("checkpoints");
                    return Err(Error::CheckpointNotFound {
                        available: complete_checkpoints(&ckpts)?,
                        dir: ckpts,
                        step,
                    });
                }
                Ok(Root {
                    label: format!("global_step_{step}"),
                    step,
                    dir: ckpt,
                    note: None,
                })
            }
        }
        .and_then(|root| match missing_policy_file(&root.dir)? {
            None => Ok(root),
            Some(path) => Err(Error::MissingRunFile {
                path,
                why: format!("the policy of step {} is incomplete", root.step),
            }),
        })
    }

    /// The root policy's adapter merged into the run's initial model, written to `out` in the
    /// Hugging Face layout with the initial model's tokenizer files.
    fn write_merged(&self, out: &Path) -> Result<()> {
        let adapter = &self.root.dir;
        if !adapter.join(ADAPTER_CONFIG).is_file() {
            return Err(bad(
                adapter,
                format!(
                    "--merge: no {ADAPTER_CONFIG}: the run trained every weight, there is no \
                     adapter to merge"
                ),
            ));
        }
        let model_dir = initial_model_dir(&self.config, &self.dir)?;
        let device = rlreplay_model::Device::Cpu;
        let mut model = base_model(&self.config, model_dir.as_deref(), &device)?;
        model
            .load_adapter(adapter)
            .map_err(|source| Error::LoadCheckpoint {
                dir: adapter.clone(),
                source,
            })?;
        model.merge_lora()?;
        model.set_source_dir(model_dir);
        let staged = out.join(".merged");
        model.save_hf(&staged)?;
        for name in rundir::file_names(&staged, |_| true)? {
            fs::rename(staged.join(&name), out.join(&name)).at("cannot move into", out)?;
        }
        fs::remove_dir(&staged).at("cannot remove", &staged)?;
        Ok(())
    }

    /// The validation row of `step`.
    fn row_at(&self, step: u64) -> Option<&ValRow> {
        self.validations.iter().find(|v| v.step == step)
    }

    /// mean@k of the validation at `step`.
    fn mean_at(&self, step: u64) -> Option<f64> {
        self.row_at(step).map(|v| v.mean)
    }

    /// Writes the whole card into `out`, to be renamed to `card` (`name` is its title).
    fn write(&self, out: &Path, card: &Path, name: &str, opts: &ExportOptions) -> Result<()> {
        if opts.merge {
            self.write_merged(out)?;
        } else {
            link_files(&self.root.dir, out, is_policy_file)?;
        }
        link_files(&self.last.1, &out.join("checkpoints/last"), is_policy_file)?;

        let results = out.join("results");
        fs::create_dir_all(&results).at("cannot create", &results)?;
        let k = self.k;
        if let Some(csv) = &self.val_csv {
            copy(csv, &results.join(format!("validation_mean{k}.csv")))?;
        }
        copy(&self.scores, &results.join("training_scores.csv"))?;
        copy(&self.hyperparameters, &results.join("hyperparameters.csv"))?;
        match &self.plots {
            Some(dir) => {
                for ext in ["png", "svg"] {
                    let file = format!("training_score.{ext}");
                    copy(&dir.join(&file), &results.join(&file))?;
                }
            }
            None => crate::plot::training_score(&read_score_history(&self.scores)?, &results)?,
        }
        let exported_at = utc_timestamp(std::time::SystemTime::now());
        rundir::write_atomic(
            &results.join("export_note.csv"),
            self.export_note(&exported_at).as_bytes(),
        )?;

        let artifacts = out.join("artifacts");
        fs::create_dir_all(&artifacts).at("cannot create", &artifacts)?;
        copy(
            &self.dir.join("config.toml"),
            &artifacts.join("config.toml"),
        )?;
        copy(&self.run_log, &artifacts.join("run.log"))?;
        copy(
            &self.last.1.join(TRAINER_STATE),
            &artifacts.join(TRAINER_STATE),
        )?;
        let extras = [
            self.dir.join("metrics.jsonl"),
            self.dir.join("checkpoints").join(LATEST),
        ];
        for from in extras.iter().chain(&self.best_file).filter(|p| p.is_file()) {
            if let Some(file) = from.file_name() {
                copy(from, &artifacts.join(file))?;
            }
        }
        let events = self.dir.join("tensorboard");
        if events.is_dir() {
            let to = artifacts.join("tensorboard");
            fs::create_dir_all(&to).at("cannot create", &to)?;
            for file in rundir::file_names(&events, |_| true)? {
                copy(&events.join(&file), &to.join(&file))?;
            }
        }

        let files = list_files(out)?;
        let readme = self.readme(card, name, opts, &files, &exported_at)?;
        rundir::write_atomic(&out.join("README.md"), readme.as_bytes())
    }

    /// `results/export_note.csv`: `field,value` rows.
    fn export_note(&self, exported_at: &str) -> String {
        let k = self.k;
        let mut rows: Vec<(String, String)> = vec![
            ("source_run".into(), self.dir.display().to_string()),
            ("source_command".into(), self.config.source.command().into()),
            ("exported_checkpoint".into(), self.root.label.clone()),
            ("exported_step".into(), self.root.step.to_string()),
            ("selected_by".into(), self.selected_by()),
        ];
        if let Some(v) = self.row_at(self.root.step) {
            rows.push((format!("exported_val_mean{k}"), v.value.clone()));
        }
        if let Some(b) = &self.best {
            rows.push(("best_step".into(), b.step.to_string()));
            rows.push((format!("best_val_mean{k}"), b.value.clone()));
        }
        rows.push(("final_step".into(), self.last.0.to_string()));
        if let Some(v) = self.row_at(self.last.0) {
            rows.push((format!("final_val_mean{k}"), v.value.clone()));
        }
        rows.push((
            "last_checkpoint".into(),
            format!("checkpoints/global_step_{}", self.last.0),
        ));
        rows.push((
            "rlreplay_version".into(),
            env!("CARGO_PKG_VERSION").to_string(),
        ));
        rows.push(("exported_at".into(), exported_at.to_string()));
        let mut csv = String::from("field,value\n");
        for (f, v) in rows {
            csv.push_str(&format!("{},{}\n", csv_field(&f), csv_field(&v)));
        }
        csv
    }

    /// How the root policy was chosen.
    fn selected_by(&self) -> String {
        match (self.root.label.as_str(), &self.root.note) {
            ("best", _) => format!("validation mean@{}", self.k),
            (_, Some(_)) => "last checkpoint (the run never validated)".into(),
            (label, None) => format!("--checkpoint {label}"),
        }
    }
}

/// Copies one file (the run's logs are appended in place, so they are never linked).
fn copy(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to).at("cannot copy into", to)?;
    Ok(())
}

/// The rows of `validation_mean{k}.csv`.
fn read_validations(path: &Path) -> Result<Vec<ValRow>> {
    let text = fs::read_to_string(path).at("cannot read", path)?;
    csv_records(&text)
        .into_iter()
        .skip(1)
        .map(|cells| {
            let parsed = match cells.as_slice() {
                [step, value, percent, ..] => step
                    .parse::<u64>()
                    .ok()
                    .zip(value.parse::<f64>().ok())
                    .map(|(step, mean)| ValRow {
                        step,
                        value: value.clone(),
                        percent: percent.clone(),
                        mean,
                    }),
                _ => None,
            };
            parsed.ok_or_else(|| bad(path, format!("not a step,value,percent row: {cells:?}")))
        })
        .collect()
}

/// `best_step.txt` (`STEP MEAN`), with the validation row of its step when there is one.
fn read_best(path: &Path, validations: &[ValRow]) -> Result<ValRow> {
    let text = fs::read_to_string(path).at("cannot read", path)?;
    let mut parts = text.split_whitespace();
    let step = parts.next().and_then(|s| s.parse::<u64>().ok());
    let value = parts
        .next()
        .and_then(|v| v.parse::<f64>().ok().map(|mean| (v, mean)));
    let (Some(step), Some((value, mean))) = (step, value) else {
        return Err(bad(path, format!("expected `STEP MEAN`, found {text:?}")));
    };
    Ok(validations
        .iter()
        .find(|v| v.step == step)
        .cloned()
        .unwrap_or_else(|| ValRow {
            step,
            value: value.to_string(),
            percent: format!("{:.2}%", mean * 100.0),
            mean,
        }))
}

/// The first file a loadable Hugging Face policy in `dir` lacks: `config.json`, or the weights
/// (`model.safetensors`, or the index and every shard it names).
fn missing_policy_file(dir: &Path) -> Result<Option<PathBuf>> {
    if dir.join(ADAPTER_CONFIG).is_file() {
        let weights = dir.join(ADAPTER_WEIGHTS);
        return Ok((!weights.is_file()).then_some(weights));
    }
    let config = dir.join("config.json");
    if !config.is_file() {
        return Ok(Some(config));
    }
    let index = dir.join("model.safetensors.index.json");
    if !index.is_file() {
        let single = dir.join("model.safetensors");
        return Ok((!single.is_file()).then_some(single));
    }
    let text = fs::read_to_string(&index).at("cannot read", &index)?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|source| Error::JsonFile {
            path: index.clone(),
            source,
        })?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad(&index, "no weight_map"))?;
    Ok(map
        .values()
        .filter_map(|f| f.as_str())
        .map(|f| dir.join(f))
        .find(|p| !p.is_file()))
}

/// The validation data sources: the `val-core/SOURCE/reward/mean@k` metrics of
/// `metrics.jsonl`, else what the configuration names (`toy`, the validation file).
fn validation_sources(dir: &Path, cfg: &Config, k: usize) -> Result<Vec<String>> {
    let mut sources = std::collections::BTreeSet::new();
    if dir.join("metrics.jsonl").is_file() {
        let suffix = format!("/reward/mean@{k}");
        for line in rundir::read_metrics(dir, false)? {
            let Some(obj) = line.as_object() else {
                continue;
            };
            for key in obj.keys() {
                if let Some(src) = key
                    .strip_prefix("val-core/")
                    .and_then(|r| r.strip_suffix(&suffix))
                {
                    sources.insert(src.to_string());
                }
            }
        }
    }
    if sources.is_empty() {
        if let Some(f) = &cfg.data.val_files {
            sources.insert(f.display().to_string());
        } else if cfg.prompt_task() == Some(Task::Toy) {
            sources.insert("toy".to_string());
        }
    }
    Ok(sources.into_iter().collect())
}

/// `YYYY-MM-DDTHH:MM:SSZ` of a time (UTC).
fn utc_timestamp(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Days since 1970-01-01 to the civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn timestamps_are_civil_utc() {
        let at = |s: u64| utc_timestamp(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(at(4_107_542_399), "2100-02-28T23:59:59Z");
    }

    #[test]
    fn checkpoint_choices_parse_and_print() {
        for s in ["best", "last", "global_step_40"] {
            assert_eq!(s.parse::<CheckpointChoice>().unwrap().to_string(), s);
        }
        for s in ["", "global_step_", "step_4", "40", "Best"] {
            assert!(s.parse::<CheckpointChoice>().is_err(), "{s}");
        }
    }

    #[test]
    fn csv_records_round_trip() {
        let rows = [
            vec!["Section", "Parameter", "Value", "Source"],
            vec!["a", "b,c", "say \"hi\"", ""],
            vec!["t", "template", "line one\nline two\n", "default"],
        ];
        let text: String = rows
            .iter()
            .map(|r| {
                let fields: Vec<String> = r.iter().map(|f| csv_field(f)).collect();
                format!("{}\n", fields.join(","))
            })
            .collect();
        assert_eq!(csv_records(&format!("{text}\n")), rows);
    }
}
