//! AdamW with torch semantics, global grad-norm clipping and verl's learning-rate schedules.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::safetensors::MmapedSafetensors;
use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use crate::{Error, Model, Result};

/// Hyper-parameters of [`AdamW`] (defaults: verl's actor optimizer).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    /// Exponential decay of the first moment.
    pub beta1: f64,
    /// Exponential decay of the second moment.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// Decoupled weight decay, applied to every parameter.
    pub weight_decay: f64,
    /// Global L2 norm the gradients are clipped to before the update; `None` disables clipping.
    pub max_grad_norm: Option<f64>,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            max_grad_norm: Some(1.0),
        }
    }
}

/// What one [`AdamW::step`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// Global L2 norm of the gradients before clipping.
    pub grad_norm: f64,
    /// True when the norm was not finite and the update was skipped.
    pub skipped: bool,
    /// The learning rate used.
    pub lr: f64,
}

/// Moments of one parameter, created at its first update (as torch does).
#[derive(Debug, Clone)]
struct Moments {
    step: u64,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
}

/// AdamW with torch/verl semantics: bias-corrected moments, decoupled weight decay
/// `p ← p·(1 − lr·wd)`, then `p ← p − lr/(1−β₁ᵗ) · m / (√v/√(1−β₂ᵗ) + ε)`. Moments live in the
/// master dtype (f32). Parameters without a gradient are left untouched, as in torch.
#[derive(Debug, Clone)]
pub struct AdamW {
    cfg: AdamWConfig,
    state: Vec<Option<Moments>>,
    names: Vec<String>,
}

/// Optimizer-state metadata stored next to the moments.
#[derive(Serialize, Deserialize)]
struct StateMeta {
    config: AdamWConfig,
    steps: BTreeMap<String, u64>,
}

impl AdamW {
    /// An optimizer for the parameters of `model`.
    pub fn new(model: &Model, cfg: AdamWConfig) -> Self {
        Self {
            cfg,
            state: vec![None; model.params().len()],
            names: model.params().iter().map(|p| p.name.clone()).collect(),
        }
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdamWConfig {
        &self.cfg
    }

    /// Number of updates applied so far (to the parameter updated most often).
    pub fn steps(&self) -> u64 {
        self.state
            .iter()
            .flatten()
            .map(|m| m.step)
            .max()
            .unwrap_or(0)
    }

    /// One optimizer step with learning rate `lr` on the gradients accumulated in `model`:
    /// computes the global gradient norm, skips the update when it is not finite, clips to
    /// `max_grad_norm` (torch's `clip_grad_norm_`: scale by `max/(norm + 1e-6)` when below 1),
    /// applies AdamW, and clears the gradients in every case.
    pub fn step(&mut self, model: &mut Model, lr: f64) -> Result<StepReport> {
        self.check(model)?;
        let grad_norm = model.grad_norm()?;
        self.step_with_norm(model, lr, grad_norm)
    }

    /// [`AdamW::step`] with the global gradient norm given (ZeRO-1: each rank holds the
    /// gradients, and updates the parameters, of its own shard only; the norm covers every
    /// shard). Parameters without a gradient are left untouched.
    pub fn step_with_norm(
        &mut self,
        model: &mut Model,
        lr: f64,
        grad_norm: f64,
    ) -> Result<StepReport> {
        self.check(model)?;
        if !grad_norm.is_finite() {
            model.zero_grad();
            return Ok(StepReport {
                grad_norm,
                skipped: true,
                lr,
            });
        }
        let clip = match self.cfg.max_grad_norm {
            Some(max) => (max / (grad_norm + 1e-6)).min(1.0),
            None => 1.0,
        };
        let (b1, b2) = (self.cfg.beta1, self.cfg.beta2);
        for ((p, g), state) in model
            .params()
            .iter()
            .zip(model.grads())
            .zip(self.state.iter_mut())
        {
            let Some(g) = g else { continue };
            let g = if clip < 1.0 {
                g.affine(clip, 0.0)?
            } else {
                g.clone()
            };
            let st = state.get_or_insert_with(|| Moments {
                step: 0,
                exp_avg: g.zeros_like().expect("zeros of an existing shape"),
                exp_avg_sq: g.zeros_like().expect("zeros of an existing shape"),
            });
            st.step += 1;
            st.exp_avg = (st.exp_avg.affine(b1, 0.0)? + g.affine(1.0 - b1, 0.0)?)?;
            st.exp_avg_sq = (st.exp_avg_sq.affine(b2, 0.0)? + g.sqr()?.affine(1.0 - b2, 0.0)?)?;
            let bc1 = 1.0 - b1.powi(st.step as i32);
            let bc2 = 1.0 - b2.powi(st.step as i32);
            let denom = st
                .exp_avg_sq
                .sqrt()?
                .affine(1.0 / bc2.sqrt(), self.cfg.eps)?;
            let update = (&st.exp_avg / denom)?.affine(lr / bc1, 0.0)?;
            let w = p.var.as_detached_tensor();
            let decayed = w.affine(1.0 - lr * self.cfg.weight_decay, 0.0)?;
            p.var.set(&(decayed - update)?)?;
        }
        model.zero_grad();
        Ok(StepReport {
            grad_norm,
            skipped: false,
            lr,
        })
    }

    fn check(&self, model: &Model) -> Result<()> {
        if model.params().len() != self.state.len() {
            return Err(Error::Input(format!(
                "optimizer built for {} parameters, model has {}",
                self.state.len(),
                model.params().len()
            )));
        }
        Ok(())
    }

    /// The moments of parameter `i` (its update count, first and second moment); `None` before
    /// its first update.
    pub fn moments(&self, i: usize) -> Option<(u64, &Tensor, &Tensor)> {
        self.state
            .get(i)?
            .as_ref()
            .map(|m| (m.step, &m.exp_avg, &m.exp_avg_sq))
    }

    /// Replaces the moments of parameter `i` (`None` drops them: ZeRO-1 keeps only its shard's).
    pub fn set_moments(&mut self, i: usize, moments: Option<(u64, Tensor, Tensor)>) {
        if let Some(slot) = self.state.get_mut(i) {
            *slot = moments.map(|(step, exp_avg, exp_avg_sq)| Moments {
                step,
                exp_avg,
                exp_avg_sq,
            });
        }
    }

    /// Writes the optimizer state (moments bit-exact, step counts, hyper-parameters) to a
    /// safetensors file.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let mut tensors: Vec<(String, Tensor)> = Vec::new();
        let mut steps = BTreeMap::new();
        for (name, st) in self.names.iter().zip(&self.state) {
            if let Some(st) = st {
                tensors.push((format!("exp_avg.{name}"), st.exp_avg.clone()));
                tensors.push((format!("exp_avg_sq.{name}"), st.exp_avg_sq.clone()));
                steps.insert(name.clone(), st.step);
            }
        }
        let meta = StateMeta {
            config: self.cfg,
            steps,
        };
        let metadata: HashMap<String, String> = [(
            "adamw".to_string(),
            serde_json::to_string(&meta).expect("state metadata serialises"),
        )]
        .into();
        let data = tensors.iter().map(|(n, t)| (n.as_str(), t));
        safetensors::serialize_to_file(data, Some(metadata), path)
            .map_err(|e| Error::Io(format!("writing {}: {e}", path.display())))
    }

    /// Reads optimizer state written by [`AdamW::save`] for the parameters of `model`; a moment
    /// whose name or shape does not match the model is an error naming it.
    pub fn load(path: impl AsRef<Path>, model: &Model) -> Result<Self> {
        let path = path.as_ref();
        let bad = |msg: String| Error::Checkpoint(format!("{}: {msg}", path.display()));
        let bytes = std::fs::read(path)
            .map_err(|e| Error::Io(format!("reading {}: {e}", path.display())))?;
        let (_, header) = safetensors::SafeTensors::read_metadata(&bytes)
            .map_err(|e| bad(format!("not a safetensors file: {e}")))?;
        let meta_text = header
            .metadata()
            .as_ref()
            .and_then(|m| m.get("adamw"))
            .ok_or_else(|| bad("no AdamW metadata".into()))?;
        let meta: StateMeta = serde_json::from_str(meta_text)
            .map_err(|e| bad(format!("invalid AdamW metadata: {e}")))?;
        drop(bytes);
        // SAFETY: read-only mapping of a file we do not modify while loading.
        let st = unsafe { MmapedSafetensors::new(path) }
            .map_err(|e| bad(format!("cannot read: {e}")))?;
        let mut opt = Self::new(model, meta.config);
        let mut used = 0;
        for ((p, state), name) in model
            .params()
            .iter()
            .zip(opt.state.iter_mut())
            .zip(&opt.names)
        {
            let Some(&step) = meta.steps.get(name) else {
                continue;
            };
            let mut load = |kind: &str| -> Result<Tensor> {
                let key = format!("{kind}.{name}");
                let t = st
                    .load(&key, model.device())
                    .map_err(|_| bad(format!("tensor {key} is missing")))?;
                if t.dims() != p.var.dims() || t.dtype() != p.var.dtype() {
                    return Err(bad(format!(
                        "tensor {key} is {:?} {:?}, expected {:?} {:?}",
                        t.dtype(),
                        t.dims(),
                        p.var.dtype(),
                        p.var.dims()
                    )));
                }
                used += 1;
                Ok(t)
            };
            *state = Some(Moments {
                step,
                exp_avg: load("exp_avg")?,
                exp_avg_sq: load("exp_avg_sq")?,
            });
        }
        if used != meta.steps.len() * 2 || st.tensors().len() != used {
            return Err(bad(format!(
                "holds state of {} parameters that the model does not have",
                meta.steps.len().saturating_sub(used / 2).max(1)
            )));
        }
        Ok(opt)
    }
}

/// A learning-rate schedule as a function of the number of scheduler steps taken so far, with
/// verl's formulas (`get_constant_schedule_with_warmup`, `get_cosine_schedule_with_warmup`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LrSchedule {
    /// `lr` at every step.
    Constant {
        /// Peak learning rate.
        lr: f64,
    },
    /// `lr · min(1, step / max(1, warmup_steps))`.
    Warmup {
        /// Peak learning rate.
        lr: f64,
        /// Steps of linear warmup from 0.
        warmup_steps: u64,
    },
    /// Linear warmup from `min_lr_ratio·lr` to `lr`, then a half cosine down to `min_lr_ratio·lr`
    /// at `total_steps`.
    Cosine {
        /// Peak learning rate.
        lr: f64,
        /// Steps of linear warmup.
        warmup_steps: u64,
        /// Total number of steps (end of the cosine).
        total_steps: u64,
        /// Floor of the schedule as a fraction of `lr`.
        min_lr_ratio: f64,
    },
}

impl LrSchedule {
    /// The learning rate after `step` scheduler steps (0 for the first update).
    pub fn lr_at(&self, step: u64) -> f64 {
        match *self {
            LrSchedule::Constant { lr } => lr,
            LrSchedule::Warmup { lr, warmup_steps } => {
                lr * (step as f64 / warmup_steps.max(1) as f64).min(1.0)
            }
            LrSchedule::Cosine {
                lr,
                warmup_steps,
                total_steps,
                min_lr_ratio,
            } => {
                if step < warmup_steps {
                    let frac = step as f64 / warmup_steps.max(1) as f64;
                    return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * frac);
                }
                let progress = (step - warmup_steps) as f64
                    / total_steps.saturating_sub(warmup_steps).max(1) as f64;
                let x = (std::f64::consts::PI * 0.5 * 2.0 * progress).cos();
                let coef = (1.0 - min_lr_ratio) * 0.5;
                let intercept = (1.0 + min_lr_ratio) * 0.5;
                lr * (x * coef + intercept).max(min_lr_ratio)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_follow_verl() {
        let c = LrSchedule::Constant { lr: 1e-6 };
        assert_eq!(c.lr_at(0), 1e-6);
        let w = LrSchedule::Warmup {
            lr: 1e-6,
            warmup_steps: 4,
        };
        let lrs: Vec<f64> = (0..6).map(|s| w.lr_at(s) / 1e-6).collect();
        assert_eq!(lrs, [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]);
        let cos = LrSchedule::Cosine {
            lr: 1.0,
            warmup_steps: 2,
            total_steps: 10,
            min_lr_ratio: 0.1,
        };
        assert!((cos.lr_at(0) - 0.1).abs() < 1e-15);
        assert!((cos.lr_at(1) - 0.55).abs() < 1e-15);
        assert!((cos.lr_at(2) - 1.0).abs() < 1e-15);
        // Halfway through the cosine: the mean of peak and floor.
        assert!((cos.lr_at(6) - 0.55).abs() < 1e-12);
        assert!((cos.lr_at(10) - 0.1).abs() < 1e-12);
    }
}
