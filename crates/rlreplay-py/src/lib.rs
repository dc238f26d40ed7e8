//! The `rlreplay` Python module (`rlreplay._rlreplay`, re-exported by `python/rlreplay`): the math
//! verifier of `rlreplay verify` and the reward dispatch by data source of the trainer and
//! `rlreplay eval`, for Python trainers (verl's `compute_score`, TRL reward functions), and rollout
//! datasets whose steps are handed to pyarrow through the Arrow C stream interface and audited as
//! `rlreplay audit` does; the algorithm layer of `rlreplay compute` over NumPy arrays
//! (`algo`); with the `cli` feature, the `rlreplay` command itself (`cli`).
//!
//! Bad arguments raise `ValueError` naming the argument; verification itself never panics
//! (rlreplay-reward catches and bounds it), a panic of the algorithm layer is caught, and the GIL
//! is released while answers are graded, steps read and batches computed.

mod algo;
#[cfg(feature = "cli")]
mod cli;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::Duration;

use arrow_array::ffi_stream::FFI_ArrowArrayStream;
use arrow_array::RecordBatchIterator;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyCapsule, PyFloat, PyInt, PyString};
use rlreplay_data::{
    write::to_record_batch, AuditStats, AuditSums, Dataset, ReadOptions, StepRange,
};
use rlreplay_reward::{Limits, MathVerifier, Mode, RewardDispatch};

/// A `ValueError` naming the argument `arg`.
fn bad(arg: &str, msg: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("{arg}: {msg}"))
}

/// The verifier of `mode` with a time limit of `timeout` seconds per answer.
fn verifier(mode: &str, timeout: f64) -> PyResult<MathVerifier> {
    let mode: Mode = mode.parse().map_err(|e| bad("mode", e))?;
    Ok(MathVerifier {
        mode,
        limits: limits(timeout)?,
    })
}

/// Default limits with a time limit of `timeout` seconds.
fn limits(timeout: f64) -> PyResult<Limits> {
    let time = Duration::try_from_secs_f64(timeout)
        .ok()
        .filter(|t| !t.is_zero())
        .ok_or_else(|| {
            bad(
                "timeout",
                format!("must be a positive number of seconds, got {timeout}"),
            )
        })?;
    Ok(Limits {
        time,
        ..Limits::default()
    })
}

/// Grades `answer` against `gold` with the math verifier: 1.0 when equivalent, else 0.0.
///
/// `mode` is the reward configuration of `rlreplay verify --mode`: `maxrl` (the gold answer
/// boxed and read as LaTeX, the answer as an expression then as LaTeX), `default`
/// (math-verify's library defaults) or `intent` (maxrl plus a careful grader's rules).
/// `timeout` is the time limit in seconds; an answer over it is graded 0.0.
#[pyfunction]
#[pyo3(signature = (gold, answer, mode = "maxrl", timeout = 1.0))]
fn verify(py: Python<'_>, gold: &str, answer: &str, mode: &str, timeout: f64) -> PyResult<f64> {
    let v = verifier(mode, timeout)?;
    Ok(py.detach(|| v.verify(gold, answer).reward()))
}

/// Grades `answers[i]` against `golds[i]` for every `i` in parallel, the GIL released; rewards
/// come back in input order. `threads` caps the worker threads (default: one per core).
#[pyfunction]
#[pyo3(signature = (golds, answers, mode = "maxrl", threads = None, timeout = 1.0))]
fn verify_batch(
    py: Python<'_>,
    golds: Vec<String>,
    answers: Vec<String>,
    mode: &str,
    threads: Option<i64>,
    timeout: f64,
) -> PyResult<Vec<f64>> {
    let v = verifier(mode, timeout)?;
    if golds.len() != answers.len() {
        return Err(bad(
            "answers",
            format!("{} answers for {} golds", answers.len(), golds.len()),
        ));
    }
    let pool = match threads {
        Some(n) if n < 1 => return Err(bad("threads", format!("must be at least 1, got {n}"))),
        Some(n) => Some(
            rayon::ThreadPoolBuilder::new()
                .num_threads(usize::try_from(n).map_err(|e| bad("threads", e))?)
                .build()
                .map_err(|e| bad("threads", e))?,
        ),
        None => None,
    };
    let pairs: Vec<(String, String)> = golds.into_iter().zip(answers).collect();
    let grade = || -> Vec<f64> {
        rlreplay_reward::verify_batch(&v, &pairs)
            .iter()
            .map(|v| v.reward())
            .collect()
    };
    Ok(py.detach(|| match &pool {
        Some(pool) => pool.install(grade),
        None => grade(),
    }))
}

/// The text of a ground truth given as a string or a number.
fn ground_truth_text(value: &Bound<'_, PyAny>) -> PyResult<String> {
    if value.is_instance_of::<PyString>() {
        return value.extract();
    }
    let number = value.is_instance_of::<PyInt>() || value.is_instance_of::<PyFloat>();
    if number && !value.is_instance_of::<PyBool>() {
        return value.str()?.extract();
    }
    Err(bad(
        "ground_truth",
        format!(
            "must be a string or a number, got {}",
            value.get_type().name()?
        ),
    ))
}

/// verl's custom reward function: the reward (0.0 or 1.0) of `solution_str` against
/// `ground_truth` with the reward function of `data_source`, as the trainer and `rlreplay eval`
/// score (multiple-choice sets to the MCQ grader, `basic_arithmetic` to the numeric-answer
/// reward, every other source to the math verifier in `maxrl` mode).
///
/// `rules` overrides the dispatch as `[reward] rules` / `--reward-rules` do
/// (`source=kind,...`, `*=kind` for every other source); `timeout` is the verifier's time limit
/// in seconds. `extra_info` is accepted for verl and unused.
#[pyfunction]
#[pyo3(signature = (data_source, solution_str, ground_truth, extra_info = None, *, rules = None, timeout = 1.0))]
fn compute_score(
    py: Python<'_>,
    data_source: &str,
    solution_str: &str,
    ground_truth: &Bound<'_, PyAny>,
    extra_info: Option<&Bound<'_, PyAny>>,
    rules: Option<&str>,
    timeout: f64,
) -> PyResult<f64> {
    let _ = extra_info;
    let ground_truth = ground_truth_text(ground_truth)?;
    let mut dispatch = RewardDispatch::default();
    if let Some(rules) = rules {
        dispatch = dispatch
            .with_rules_str(rules)
            .map_err(|e| bad("rules", e))?;
    }
    dispatch.limits = limits(timeout)?;
    Ok(py.detach(|| {
        dispatch
            .score(data_source, &ground_truth, solution_str)
            .reward
    }))
}

/// A rollout dataset opened by [`open_dataset`]: its steps, read one at a time.
#[pyclass(name = "Dataset", module = "rlreplay", frozen)]
struct PyDataset {
    inner: Dataset,
}

#[pymethods]
impl PyDataset {
    /// The dataset's steps, increasing.
    #[getter]
    fn steps(&self) -> Vec<i64> {
        self.inner.steps().into_iter().map(|(s, _)| s).collect()
    }

    /// Reads and validates step `step` as a `pyarrow.Table` in the canonical schema (the columns
    /// `rlreplay` writes, whatever the shard's aliases).
    fn read_step<'py>(&self, py: Python<'py>, step: i64) -> PyResult<Bound<'py, PyAny>> {
        let batch = py
            .detach(|| {
                let (batch, _) = self.inner.read_step(step, &ReadOptions::new(Vec::new()))?;
                to_record_batch(&batch)
            })
            .map_err(|e| bad("step", e))?;
        let schema = batch.schema();
        let reader = RecordBatchIterator::new([Ok(batch)], schema);
        let stream = ArrowStream(Mutex::new(Some(FFI_ArrowArrayStream::new(Box::new(
            reader,
        )))));
        py.import("pyarrow")?.call_method1("table", (stream,))
    }

    /// Per-step statistics of the steps in `steps` (None: all; an int; or `"A..B"`, `"A.."`,
    /// `"..B"`), as `rlreplay audit PATH --json` prints them: one dict per step (`step`, `file`,
    /// `rows`, `groups`, `group_size`, `score_mean`, `solve_none`, `solve_all`,
    /// `prompt_len_mean`, `resp_len_mean`, `resp_len_max`, `truncated`, `logprob_mean`,
    /// `rows_skipped`), then the summary (`summary: True`, `steps`, the same statistics over all).
    /// `eos` lists the end-of-sequence ids that tell truncated responses (None or empty: those
    /// the dataset's shards name; `truncated` is None when none is known). `lenient` skips bad
    /// rows instead of raising.
    #[pyo3(signature = (steps = None, eos = None, lenient = false))]
    fn audit<'py>(
        &self,
        py: Python<'py>,
        steps: Option<&Bound<'py, PyAny>>,
        eos: Option<Vec<u32>>,
        lenient: bool,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let range = step_range(steps)?;
        // A panic in the reader is caught: it becomes a `RuntimeError`.
        let lines = py
            .detach(|| {
                catch_unwind(AssertUnwindSafe(|| -> Result<Vec<String>, String> {
                    let eos = match eos.filter(|e| !e.is_empty()) {
                        Some(ids) => Some(ids),
                        None => self
                            .inner
                            .stop_ids()
                            .map_err(|e| e.to_string())?
                            .map(|s| s.ids),
                    };
                    let opts = ReadOptions {
                        lenient,
                        eos: eos.clone().unwrap_or_default(),
                        vocab: None,
                        max_positions: None,
                    };
                    audit_lines(&self.inner, range, opts, eos.as_deref())
                }))
            })
            .map_err(algo::panic_error)?
            .map_err(|e| bad("steps", e))?;
        let loads = py.import("json")?.getattr("loads")?;
        lines.iter().map(|l| loads.call1((l,))).collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "rlreplay.Dataset({:?}, {} steps)",
            self.inner.spec(),
            self.inner.steps().len()
        )
    }
}

/// A step range of `audit`: None (all), one step, or the CLI's `--steps` text.
fn step_range(steps: Option<&Bound<'_, PyAny>>) -> PyResult<StepRange> {
    match steps {
        None => Ok(StepRange::ALL),
        Some(s) if s.is_instance_of::<PyString>() => {
            s.extract::<String>()?.parse().map_err(|e| bad("steps", e))
        }
        Some(s) if !s.is_instance_of::<PyBool>() => match s.extract::<i64>() {
            Ok(n) => Ok(StepRange::new(n, n)),
            Err(_) => Err(bad(
                "steps",
                "must be None, an int or a range like \"1..10\"",
            )),
        },
        Some(_) => Err(bad(
            "steps",
            "must be None, an int or a range like \"1..10\"",
        )),
    }
}

/// One step's line of `rlreplay audit --json`.
#[derive(serde::Serialize)]
struct StepLine<'a> {
    step: i64,
    file: &'a str,
    #[serde(flatten)]
    stats: AuditStats,
    rows_skipped: usize,
}

/// The summary line of `rlreplay audit --json`.
#[derive(serde::Serialize)]
struct SummaryLine {
    summary: bool,
    steps: usize,
    #[serde(flatten)]
    stats: AuditStats,
    rows_skipped: usize,
}

/// The JSON lines `rlreplay audit --json` prints for the steps of `range`.
fn audit_lines(
    ds: &Dataset,
    range: StepRange,
    opts: ReadOptions,
    eos: Option<&[u32]>,
) -> Result<Vec<String>, String> {
    let json = |e: serde_json::Error| e.to_string();
    let mut lines = Vec::new();
    let mut total = AuditSums::default();
    let mut skipped = 0;
    let mut steps = ds.iter(range, opts);
    while let Some(item) = steps.next() {
        let (batch, report) = item.map_err(|e| e.to_string())?;
        let sums = AuditSums::of_batch(&batch, eos);
        total.merge(&sums);
        skipped += report.rows_skipped;
        let file = batch.source.to_string_lossy();
        lines.push(
            serde_json::to_string(&StepLine {
                step: batch.step,
                file: &file,
                stats: sums.stats(),
                rows_skipped: report.rows_skipped,
            })
            .map_err(json)?,
        );
        steps.recycle(batch);
    }
    lines.push(
        serde_json::to_string(&SummaryLine {
            summary: true,
            steps: total.steps,
            stats: total.stats(),
            rows_skipped: skipped,
        })
        .map_err(json)?,
    );
    Ok(lines)
}

/// An Arrow C stream handed to pyarrow once through the Arrow PyCapsule interface.
#[pyclass(module = "rlreplay", frozen)]
struct ArrowStream(Mutex<Option<FFI_ArrowArrayStream>>);

#[pymethods]
impl ArrowStream {
    /// The stream as an `arrow_array_stream` capsule (its destructor releases an unconsumed
    /// stream); a second call raises `ValueError`.
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema;
        let stream = self
            .0
            .lock()
            .ok()
            .and_then(|mut s| s.take())
            .ok_or_else(|| bad("stream", "already consumed"))?;
        PyCapsule::new_with_value(py, stream, c"arrow_array_stream")
    }
}

/// Opens a rollout dataset: a directory in the published layout (`DIR/data/step-NNNN.parquet`),
/// a directory of shards, one file, a glob or a hub id (`hf://datasets/OWNER/NAME`), as the
/// CLI's `audit` and `replay` do. Nothing is read until a step is asked for.
#[pyfunction]
fn open_dataset(py: Python<'_>, path: &str) -> PyResult<PyDataset> {
    let inner = py
        .detach(|| Dataset::open(path))
        .map_err(|e| bad("path", e))?;
    Ok(PyDataset { inner })
}

/// The native part of the `rlreplay` package.
#[pymodule(name = "_rlreplay")]
fn rlreplay_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(verify, m)?)?;
    m.add_function(wrap_pyfunction!(verify_batch, m)?)?;
    m.add_function(wrap_pyfunction!(compute_score, m)?)?;
    m.add_function(wrap_pyfunction!(open_dataset, m)?)?;
    m.add_function(wrap_pyfunction!(algo::compute_advantages, m)?)?;
    m.add_function(wrap_pyfunction!(algo::rollout_correction, m)?)?;
    m.add_function(wrap_pyfunction!(algo::policy_loss, m)?)?;
    #[cfg(feature = "cli")]
    m.add_function(wrap_pyfunction!(cli::cli_main, m)?)?;
    m.add_class::<PyDataset>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
