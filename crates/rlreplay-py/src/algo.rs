//! The algorithm layer over NumPy arrays: advantages, rollout correction and the policy loss with
//! its per-token coefficients, as `rlreplay compute` runs them. Every number comes from
//! rlreplay-algo's functions; this module only converts arguments and results.
//!
//! A batch is flat: per-token arrays hold the tokens of every response one after the other and
//! `lengths` gives each response's token count (rows). Options are the algorithm keys of
//! `rlreplay compute`'s `config` (verl names: `adv_estimator`, `loss_mode`, `clip_ratio_low`, ...)
//! passed as keyword arguments.

use std::panic::{catch_unwind, AssertUnwindSafe};

use numpy::{
    AllowTypeChange, IntoPyArray, PyArrayDescrMethods, PyArrayLikeDyn, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyImportError, PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};
use rlreplay_algo::{AlgoConfig, AlgoError, MicroBatch};

use crate::bad;

/// The error of converting argument `name`, its message prefixed with the name: a `TypeError`
/// stays one, anything else becomes a `ValueError`.
fn named(py: Python<'_>, name: &str, e: PyErr) -> PyErr {
    let msg = e.value(py).to_string();
    if e.is_instance_of::<PyTypeError>(py) {
        PyTypeError::new_err(format!("{name}: {msg}"))
    } else {
        bad(name, msg)
    }
}

/// A `ValueError` unless `shape` is one-dimensional.
fn one_d(name: &str, shape: &[usize]) -> PyResult<()> {
    if shape.len() == 1 {
        Ok(())
    } else {
        Err(bad(name, format!("must be 1-D, got shape {shape:?}")))
    }
}

/// Argument `name` as f64 values: any 1-D array-like NumPy converts (float32 and float64
/// arrays, integer arrays, lists).
fn floats(name: &str, obj: &Bound<'_, PyAny>) -> PyResult<Vec<f64>> {
    let a = obj
        .extract::<PyArrayLikeDyn<'_, f64, AllowTypeChange>>()
        .map_err(|e| named(obj.py(), name, e))?;
    let view = a.as_array();
    one_d(name, view.shape())?;
    Ok(view.iter().copied().collect())
}

/// Argument `name` as booleans: any 1-D array-like NumPy converts to `bool`.
fn bools(name: &str, obj: &Bound<'_, PyAny>) -> PyResult<Vec<bool>> {
    let a = obj
        .extract::<PyArrayLikeDyn<'_, bool, AllowTypeChange>>()
        .map_err(|e| named(obj.py(), name, e))?;
    let view = a.as_array();
    one_d(name, view.shape())?;
    Ok(view.iter().copied().collect())
}

/// Argument `name` as integers: a NumPy integer array, or a sequence of integers (floats refused).
fn integers(name: &str, obj: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        let dtype = a.dtype();
        if !matches!(dtype.kind(), b'i' | b'u') {
            return Err(bad(name, format!("must hold integers, got dtype {dtype}")));
        }
        let a = obj
            .extract::<PyArrayLikeDyn<'_, i64, AllowTypeChange>>()
            .map_err(|e| named(obj.py(), name, e))?;
        let view = a.as_array();
        one_d(name, view.shape())?;
        return Ok(view.iter().copied().collect());
    }
    if obj.is_instance_of::<PyString>() {
        return Err(bad(name, "must be a sequence of integers, got a string"));
    }
    let items = obj.try_iter().map_err(|e| named(obj.py(), name, e))?;
    items
        .enumerate()
        .map(|(i, item)| {
            let item = item?;
            if item.is_instance_of::<PyFloat>() {
                return Err(bad(
                    name,
                    format!("row {i}: must be an integer, got {item}"),
                ));
            }
            item.extract::<i64>()
                .map_err(|_| bad(name, format!("row {i}: must be an integer, got {item}")))
        })
        .collect()
}

/// The group id of every row: strings or integers (a NumPy array of either), compared as text.
fn group_ids(name: &str, obj: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        if matches!(a.dtype().kind(), b'i' | b'u') {
            return Ok(integers(name, obj)?
                .into_iter()
                .map(|i| i.to_string())
                .collect());
        }
    }
    if obj.is_instance_of::<PyString>() {
        return Err(bad(name, "must be a sequence of group ids, got a string"));
    }
    let items = obj.try_iter().map_err(|e| named(obj.py(), name, e))?;
    items
        .enumerate()
        .map(|(i, item)| {
            let item = item?;
            if item.is_instance_of::<PyString>() {
                return item.extract::<String>();
            }
            let integer = !item.is_instance_of::<PyFloat>() && !item.is_instance_of::<PyBool>();
            match item.extract::<i64>() {
                Ok(v) if integer => Ok(v.to_string()),
                _ => Err(bad(
                    name,
                    format!(
                        "row {i}: a group id must be a string or an integer, got {}",
                        item.get_type().name()?
                    ),
                )),
            }
        })
        .collect()
}

/// Row offsets over the flat per-token arrays, from the rows' lengths.
struct Layout {
    offsets: Vec<usize>,
}

impl Layout {
    fn new(lengths: &Bound<'_, PyAny>) -> PyResult<Self> {
        let mut offsets = vec![0usize];
        for (i, n) in integers("lengths", lengths)?.into_iter().enumerate() {
            let n = usize::try_from(n)
                .map_err(|_| bad("lengths", format!("row {i}: negative length {n}")))?;
            let end = offsets[i]
                .checked_add(n)
                .ok_or_else(|| bad("lengths", "the lengths' sum overflows"))?;
            offsets.push(end);
        }
        Ok(Self { offsets })
    }

    fn rows(&self) -> usize {
        self.offsets.len() - 1
    }

    fn tokens(&self) -> usize {
        self.offsets[self.rows()]
    }

    /// A per-row array's length check.
    fn rows_of<T>(&self, name: &str, xs: Vec<T>) -> PyResult<Vec<T>> {
        if xs.len() == self.rows() {
            Ok(xs)
        } else {
            Err(bad(
                name,
                format!(
                    "{} values for {} rows (len(lengths))",
                    xs.len(),
                    self.rows()
                ),
            ))
        }
    }

    /// A per-token array's length check.
    fn tokens_of<T>(&self, name: &str, xs: Vec<T>) -> PyResult<Vec<T>> {
        if xs.len() == self.tokens() {
            Ok(xs)
        } else {
            Err(bad(
                name,
                format!(
                    "{} values for {} tokens (sum(lengths))",
                    xs.len(),
                    self.tokens()
                ),
            ))
        }
    }

    fn token_floats(
        &self,
        name: &str,
        obj: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Vec<f64>>> {
        obj.map(|o| self.tokens_of(name, floats(name, o)?))
            .transpose()
    }

    fn token_bools(
        &self,
        name: &str,
        obj: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Vec<bool>>> {
        obj.map(|o| self.tokens_of(name, bools(name, o)?))
            .transpose()
    }

    fn row_bools(&self, name: &str, obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<bool>>> {
        obj.map(|o| self.rows_of(name, bools(name, o)?)).transpose()
    }
}

/// A configuration value as JSON: None, a bool, an integer, a finite float or a string.
fn json_value(key: &str, v: &Bound<'_, PyAny>) -> PyResult<serde_json::Value> {
    use serde_json::Value;
    let float = |f: f64| {
        serde_json::Number::from_f64(f)
            .map(Value::Number)
            .ok_or_else(|| bad(key, format!("must be finite, got {f}")))
    };
    if v.is_none() {
        Ok(Value::Null)
    } else if v.is_instance_of::<PyBool>() {
        Ok(Value::Bool(v.extract()?))
    } else if v.is_instance_of::<PyString>() {
        Ok(Value::String(v.extract()?))
    } else if v.is_instance_of::<PyInt>() {
        match v.extract::<i64>() {
            Ok(i) => Ok(Value::from(i)),
            Err(_) => Ok(Value::from(v.extract::<u64>().map_err(|e| bad(key, e))?)),
        }
    } else if v.is_instance_of::<PyFloat>() {
        float(v.extract()?)
    } else if let Ok(i) = v.extract::<i64>() {
        // NumPy integer scalars (`__index__`).
        Ok(Value::from(i))
    } else if let Ok(f) = v.extract::<f64>() {
        float(f)
    } else {
        Err(PyTypeError::new_err(format!(
            "{key}: must be None, a bool, a number or a string, got {}",
            v.get_type().name()?
        )))
    }
}

/// The algorithm configuration of keyword arguments named as `rlreplay compute`'s `config` keys;
/// an unknown key or a bad value is a `ValueError` naming the key.
fn algo_config(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<AlgoConfig> {
    let mut map = serde_json::Map::new();
    for (k, v) in kwargs.into_iter().flat_map(|d| d.iter()) {
        let key: String = k.extract()?;
        let value = json_value(&key, &v)?;
        // Each key on its own first, so that an error names the key it is about.
        let one = serde_json::Value::Object([(key.clone(), value.clone())].into_iter().collect());
        if let Err(e) = serde_json::from_value::<AlgoConfig>(one) {
            return Err(bad(&key, e));
        }
        map.insert(key, value);
    }
    let cfg: AlgoConfig =
        serde_json::from_value(serde_json::Value::Object(map)).map_err(|e| bad("config", e))?;
    cfg.validate().map_err(|e| algo_error(e, "config"))?;
    Ok(cfg)
}

/// The arguments an error message of rlreplay-algo may name, the longer names first.
const ARGUMENTS: &[&str] = &[
    "rollout_logprobs",
    "old_logprobs",
    "teacher_logprobs",
    "ref_logprobs",
    "token_advantages",
    "is_weights",
    "sd_active",
    "correct",
    "scores",
    "mask",
    "logprobs",
];

/// An error of rlreplay-algo as a `ValueError` naming the argument or configuration key it is
/// about (`fallback` when it names none).
fn algo_error(e: AlgoError, fallback: &str) -> PyErr {
    let arg = match &e {
        AlgoError::Config { key, msg } => return bad(key, msg),
        AlgoError::UnknownName { kind, .. } => kind,
        AlgoError::NonFinite { at, .. } => at.field,
        AlgoError::Shape(m) | AlgoError::Missing(m) | AlgoError::Invalid(m) => ARGUMENTS
            .iter()
            .find(|a| m.contains(*a))
            .copied()
            .unwrap_or(fallback),
    };
    bad(arg, e)
}

/// The `RuntimeError` of a caught panic.
pub(crate) fn panic_error(panic: Box<dyn std::any::Any + Send>) -> PyErr {
    let msg = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    PyRuntimeError::new_err(format!("rlreplay failed (a bug, please report it): {msg}"))
}

/// Runs a function's body: NumPy imported first (an `ImportError` without it, where the NumPy
/// bindings would panic), a panic caught as a `RuntimeError`.
fn guarded<T>(py: Python<'_>, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    py.import("numpy").map_err(|e| {
        PyImportError::new_err(format!(
            "rlreplay's algorithm functions need NumPy (pip install numpy): {}",
            e.value(py)
        ))
    })?;
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(panic_error(p)))
}

/// Runs `f` with the GIL released; an error of rlreplay-algo becomes a `ValueError` (see
/// [`algo_error`]) and a panic a `RuntimeError`, never a panic crossing into Python.
fn run<T: Send>(
    py: Python<'_>,
    fallback: &str,
    f: impl FnOnce() -> rlreplay_algo::Result<T> + Send,
) -> PyResult<T> {
    match py.detach(|| catch_unwind(AssertUnwindSafe(f))) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(algo_error(e, fallback)),
        Err(panic) => Err(panic_error(panic)),
    }
}

/// Advantages of a batch grouped by `uids`, as `rlreplay compute` computes them.
///
/// `scores` holds one score per row, `uids` one group id per row (strings or integers),
/// `lengths` each row's token count; `mask` (per token) marks valid tokens (all when None).
/// Keyword options are the algorithm keys (`adv_estimator`, `norm_adv_by_std_in_grpo`, `gamma`,
/// `truncate_order`, `pass_k`, `singleton_groups`, ...). Returns `{"advantages": per row,
/// "token_advantages": per token, "metrics": dict}` (float64 arrays).
#[pyfunction]
#[pyo3(signature = (scores, uids, lengths, *, mask = None, **config))]
pub fn compute_advantages<'py>(
    py: Python<'py>,
    scores: &Bound<'py, PyAny>,
    uids: &Bound<'py, PyAny>,
    lengths: &Bound<'py, PyAny>,
    mask: Option<&Bound<'py, PyAny>>,
    config: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyDict>> {
    guarded(py, || {
        let cfg = algo_config(config)?;
        let layout = Layout::new(lengths)?;
        let scores = layout.rows_of("scores", floats("scores", scores)?)?;
        let uids = layout.rows_of("uids", group_ids("uids", uids)?)?;
        let mask = layout.token_bools("mask", mask)?;
        let offsets = layout.offsets;
        let adv = run(py, "adv_estimator", move || {
            rlreplay_algo::compute_advantages(&cfg, &uids, &scores, &offsets, mask.as_deref())
        })?;
        let out = PyDict::new(py);
        out.set_item("advantages", adv.rows.into_pyarray(py))?;
        out.set_item("token_advantages", adv.tokens.into_pyarray(py))?;
        out.set_item("metrics", adv.metrics)?;
        Ok(out)
    })
}

/// Rollout correction between the trainer's `old_logprobs` and the rollout engine's
/// `rollout_logprobs` (per token), as `rlreplay compute` runs it: importance weights
/// (`rollout_is`, `rollout_is_threshold`, `rollout_is_mode`, ...), rejection sampling
/// (`rollout_rs`, `rollout_rs_threshold`) and the `rollout_corr/*` metrics. In bypass mode pass
/// the rollout log-probs as both. Returns `{"is_weights": per token or None (no `rollout_is`),
/// "mask": valid tokens after rejection (bool), "metrics": dict}`.
#[pyfunction]
#[pyo3(signature = (old_logprobs, rollout_logprobs, lengths, *, mask = None, **config))]
pub fn rollout_correction<'py>(
    py: Python<'py>,
    old_logprobs: &Bound<'py, PyAny>,
    rollout_logprobs: &Bound<'py, PyAny>,
    lengths: &Bound<'py, PyAny>,
    mask: Option<&Bound<'py, PyAny>>,
    config: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyDict>> {
    guarded(py, || {
        let cfg = algo_config(config)?;
        let layout = Layout::new(lengths)?;
        let old = layout.tokens_of("old_logprobs", floats("old_logprobs", old_logprobs)?)?;
        let rollout = layout.tokens_of(
            "rollout_logprobs",
            floats("rollout_logprobs", rollout_logprobs)?,
        )?;
        let mask = layout.token_bools("mask", mask)?;
        let offsets = layout.offsets;
        let c = run(py, "old_logprobs", move || {
            rlreplay_algo::rollout_correction(&cfg, &offsets, &old, &rollout, mask.as_deref())
        })?;
        let out = PyDict::new(py);
        out.set_item("is_weights", c.is_weights.map(|w| w.into_pyarray(py)))?;
        out.set_item("mask", c.mask.into_pyarray(py))?;
        out.set_item("metrics", c.metrics)?;
        Ok(out)
    })
}

/// The policy loss of a batch and its per-token coefficients dL/dℓ, as `rlreplay compute`
/// evaluates it (the batch is one mini-batch; `loss_agg_normalizer = "verl"` splits it into
/// micro-batches of `ppo_micro_batch_size_per_gpu` rows).
///
/// `logprobs` are the current policy's per-token log-probs ℓ, `token_advantages` those of
/// [`compute_advantages`]; `old_logprobs` (ℓ_old; None: on-policy), `rollout_logprobs`,
/// `is_weights` (of [`rollout_correction`]), `mask`, `teacher_logprobs` (`rlsd`, `rlrt`) and
/// `ref_logprobs` (`use_kl_loss`) are per token, `sd_active` and `correct` per row. Keyword
/// options: `loss_mode`, `clip_ratio`, `clip_ratio_low`, `clip_ratio_high`, `clip_ratio_c`,
/// `loss_agg_mode`, `use_kl_loss`, ... Returns `{"loss": float, "grad_logprobs": dL/dℓ per token,
/// "token_advantages": the advantages that entered the loss, "valid_tokens": int,
/// "metrics": dict}`.
#[pyfunction]
#[pyo3(signature = (
    logprobs, token_advantages, lengths, *, old_logprobs = None, rollout_logprobs = None,
    is_weights = None, mask = None, teacher_logprobs = None, ref_logprobs = None,
    sd_active = None, correct = None, **config
))]
#[allow(clippy::too_many_arguments)]
pub fn policy_loss<'py>(
    py: Python<'py>,
    logprobs: &Bound<'py, PyAny>,
    token_advantages: &Bound<'py, PyAny>,
    lengths: &Bound<'py, PyAny>,
    old_logprobs: Option<&Bound<'py, PyAny>>,
    rollout_logprobs: Option<&Bound<'py, PyAny>>,
    is_weights: Option<&Bound<'py, PyAny>>,
    mask: Option<&Bound<'py, PyAny>>,
    teacher_logprobs: Option<&Bound<'py, PyAny>>,
    ref_logprobs: Option<&Bound<'py, PyAny>>,
    sd_active: Option<&Bound<'py, PyAny>>,
    correct: Option<&Bound<'py, PyAny>>,
    config: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyDict>> {
    guarded(py, || {
        let cfg = algo_config(config)?;
        let layout = Layout::new(lengths)?;
        let logprobs = layout.tokens_of("logprobs", floats("logprobs", logprobs)?)?;
        let adv = layout.tokens_of(
            "token_advantages",
            floats("token_advantages", token_advantages)?,
        )?;
        let old = layout.token_floats("old_logprobs", old_logprobs)?;
        let rollout = layout.token_floats("rollout_logprobs", rollout_logprobs)?;
        let is_w = layout.token_floats("is_weights", is_weights)?;
        let mask = layout.token_bools("mask", mask)?;
        let teacher = layout.token_floats("teacher_logprobs", teacher_logprobs)?;
        let reference = layout.token_floats("ref_logprobs", ref_logprobs)?;
        let sd_active = layout.row_bools("sd_active", sd_active)?;
        let correct = layout.row_bools("correct", correct)?;
        let offsets = layout.offsets;
        let out = run(py, "logprobs", move || {
            rlreplay_algo::mini_batch_loss(
                &cfg,
                &MicroBatch {
                    first_row: 0,
                    offsets: &offsets,
                    logprobs: &logprobs,
                    old_logprobs: old.as_deref(),
                    rollout_logprobs: rollout.as_deref(),
                    token_advantages: &adv,
                    is_weights: is_w.as_deref(),
                    mask: mask.as_deref(),
                    teacher_logprobs: teacher.as_deref(),
                    sd_active: sd_active.as_deref(),
                    correct: correct.as_deref(),
                    ref_logprobs: reference.as_deref(),
                },
            )
        })?;
        let d = PyDict::new(py);
        d.set_item("loss", out.loss)?;
        d.set_item("grad_logprobs", out.grad_logprobs.into_pyarray(py))?;
        d.set_item("token_advantages", out.token_advantages.into_pyarray(py))?;
        d.set_item("valid_tokens", out.valid_tokens)?;
        d.set_item("metrics", out.metrics)?;
        Ok(d)
    })
}
