//! Teachers for self-distillation: the trust-region teacher, whose logits mix those of the frozen
//! initial model and the current model, `z_T = (1 − α)·z_ref + α·z_cur`, and the EMA teacher,
//! whose weights follow the student, `θ_T ← (1 − η)·θ_T + η·θ_student`.

use anyhow::{bail, Context, Result};
use candle_core::Tensor;
use rlreplay_model::generate::Decoder;
use rlreplay_model::{ops, Qwen3};
use serde::{Deserialize, Serialize};

use crate::teacher_lp::teacher_logprobs;

/// Directory of the EMA teacher inside a checkpoint.
pub const EMA_TEACHER: &str = "ema_teacher";

/// Teacher regularisation of self-distillation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum TeacherRegularization {
    /// Logits `(1 − α)·z_ref + α·z_cur` of the frozen initial model and the current model.
    #[default]
    #[serde(rename = "trust-region")]
    TrustRegion,
    /// A separate teacher whose weights follow the student by EMA after each update.
    #[serde(rename = "ema")]
    Ema,
}

/// The self-distillation teacher: the frozen initial model (trust region) or the EMA model.
pub struct Teacher {
    model: Qwen3,
    regularization: TeacherRegularization,
    rate: f64,
    /// The frozen model's decoder (trust region: its weights never change).
    frozen: Option<Decoder>,
}

impl Teacher {
    /// A teacher over `model` (the initial weights, or the saved EMA teacher on resume); `rate`
    /// is α of the trust region or η of the EMA.
    pub fn new(model: Qwen3, regularization: TeacherRegularization, rate: f64) -> Result<Self> {
        if !(0.0..=1.0).contains(&rate) {
            bail!("teacher_update_rate = {rate}: must lie in [0, 1]");
        }
        let frozen = match regularization {
            TeacherRegularization::TrustRegion => Some(Decoder::new(&model)?),
            TeacherRegularization::Ema => None,
        };
        Ok(Self {
            model,
            regularization,
            rate,
            frozen,
        })
    }

    /// The teacher's own weights (frozen initial model, or the EMA model).
    pub fn model(&self) -> &Qwen3 {
        &self.model
    }

    /// The regularisation.
    pub fn regularization(&self) -> TeacherRegularization {
        self.regularization
    }

    /// Teacher log-probs of `responses[i]` after the teacher prompts `prompts[i]` at temperature
    /// `temperature`, with `policy` the current student (mixed in by the trust region). Rows with
    /// an empty prompt or response get zeros.
    pub fn logprobs(
        &self,
        policy: &Qwen3,
        prompts: &[&[u32]],
        responses: &[&[u32]],
        temperature: f64,
    ) -> Result<Vec<Vec<f64>>> {
        match &self.frozen {
            Some(frozen) => {
                let current = Decoder::new(policy)?;
                teacher_logprobs(
                    frozen,
                    Some(&current),
                    self.rate,
                    temperature,
                    prompts,
                    responses,
                )
            }
            None => {
                let ema = Decoder::new(&self.model)?;
                teacher_logprobs(&ema, None, self.rate, temperature, prompts, responses)
            }
        }
    }

    /// After an update that applied at least one optimizer step: the EMA teacher moves towards
    /// `policy`; the trust-region teacher stays frozen.
    pub fn follow(&self, policy: &Qwen3) -> Result<()> {
        match self.regularization {
            TeacherRegularization::Ema => ema_update(&self.model, policy, self.rate),
            TeacherRegularization::TrustRegion => Ok(()),
        }
    }
}

/// Per-token log-probs `log softmax(((1 − α)·z_ref + α·z_cur) / τ)[target]` from the final hidden
/// states (after the last norm) and lm-head weights of the two models.
///
/// The mixed logits equal one matrix product of the concatenated, pre-scaled hidden states
/// `[(1 − α)·h_ref, α·h_cur]` (`[N, 2H]`) with the concatenated heads `[W_ref, W_cur]` (`[V, 2H]`),
/// so the teacher reuses the chunked log-prob kernel of the training path and never holds the
/// `[N, V]` logits whole. Returns `[N]`.
pub fn trust_region_token_logprobs(
    ref_hidden: &Tensor,
    ref_lm_head: &Tensor,
    cur_hidden: &Tensor,
    cur_lm_head: &Tensor,
    targets: &[u32],
    alpha: f64,
    temperature: f64,
) -> Result<Tensor> {
    if !(0.0..=1.0).contains(&alpha) {
        bail!("trust-region mix α must lie in [0, 1], got {alpha}");
    }
    if ref_hidden.dims() != cur_hidden.dims() || ref_lm_head.dims() != cur_lm_head.dims() {
        bail!(
            "trust-region teacher: reference hidden {:?} / head {:?} differ from current hidden {:?} \
             / head {:?}",
            ref_hidden.dims(),
            ref_lm_head.dims(),
            cur_hidden.dims(),
            cur_lm_head.dims()
        );
    }
    let dtype = cur_hidden.dtype();
    let hidden = Tensor::cat(
        &[
            (ref_hidden.to_dtype(dtype)? * (1.0 - alpha))?,
            (cur_hidden * alpha)?,
        ],
        1,
    )?;
    let head = Tensor::cat(&[ref_lm_head.to_dtype(dtype)?, cur_lm_head.clone()], 1)?;
    let (lp, _) = ops::token_logprobs(&hidden, &head, targets, temperature, false)
        .context("trust-region teacher log-probs")?;
    Ok(lp)
}

/// Moves every weight of `teacher` towards `student`: `θ_T ← (1 − η)·θ_T + η·θ_student`.
pub fn ema_update(teacher: &Qwen3, student: &Qwen3, rate: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&rate) {
        bail!("EMA teacher update rate must lie in [0, 1], got {rate}");
    }
    let (tp, sp) = (teacher.params(), student.params());
    if tp.len() != sp.len() {
        bail!(
            "EMA teacher has {} parameters, the student {}",
            tp.len(),
            sp.len()
        );
    }
    for (t, s) in tp.iter().zip(sp) {
        if t.name != s.name || t.var.dims() != s.var.dims() {
            bail!(
                "EMA teacher parameter {} {:?} does not match student parameter {} {:?}",
                t.name,
                t.var.dims(),
                s.name,
                s.var.dims()
            );
        }
        let mixed = ((t.var.as_tensor() * (1.0 - rate))?
            + (s.var.as_tensor().to_dtype(t.var.dtype())? * rate)?)?;
        t.var.set(&mixed)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use rlreplay_algo::rlsd::trust_region_logprobs;
    use rlreplay_model::Qwen3Config;

    fn t(v: &[f64], shape: (usize, usize)) -> Tensor {
        Tensor::from_vec(v.to_vec(), shape, &Device::Cpu).unwrap()
    }

    #[test]
    fn matches_the_mixed_logit_formula_tv_l6() {
        // Hidden size 1: logits are the lm-head column, z_ref = [2, 0, 0], z_cur = [0, 2, 0].
        let h = t(&[1.0, 1.0, 1.0], (3, 1));
        let w_ref = t(&[2.0, 0.0, 0.0], (3, 1));
        let w_cur = t(&[0.0, 2.0, 0.0], (3, 1));
        let lp = trust_region_token_logprobs(&h, &w_ref, &h, &w_cur, &[0, 1, 2], 0.1, 1.0)
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let want = [-0.312761, -1.912761, -2.112761];
        for (a, b) in lp.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{lp:?}");
        }
        let pure = trust_region_logprobs(&[2.0, 0.0, 0.0], &[0.0, 2.0, 0.0], 0.1, 1.0).unwrap();
        for (a, b) in lp.iter().zip(&pure) {
            assert!((a - b).abs() < 1e-12);
        }
        // α = 0 is the reference model alone.
        let lp0 = trust_region_token_logprobs(&h, &w_ref, &h, &w_cur, &[0, 1, 2], 0.0, 1.0)
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        assert!((lp0[1] + 2.239545).abs() < 1e-6);
    }

    #[test]
    fn matches_the_pure_formula_on_random_states() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (n, h, v) = (5, 4, 300); // more tokens than one chunk of the vocab? no: rows; V > chunk
        let mut draw = |k: usize| {
            (0..k)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect::<Vec<f64>>()
        };
        let (hr, wr, hc, wc) = (draw(n * h), draw(v * h), draw(n * h), draw(v * h));
        let targets: Vec<u32> = (0..n as u32).map(|i| i * 37 % v as u32).collect();
        let lp = trust_region_token_logprobs(
            &t(&hr, (n, h)),
            &t(&wr, (v, h)),
            &t(&hc, (n, h)),
            &t(&wc, (v, h)),
            &targets,
            0.3,
            0.7,
        )
        .unwrap()
        .to_vec1::<f64>()
        .unwrap();
        let logits = |hs: &[f64], w: &[f64], i: usize| -> Vec<f64> {
            (0..v)
                .map(|j| (0..h).map(|k| hs[i * h + k] * w[j * h + k]).sum())
                .collect()
        };
        for i in 0..n {
            let pure = trust_region_logprobs(&logits(&hr, &wr, i), &logits(&hc, &wc, i), 0.3, 0.7)
                .unwrap();
            assert!((lp[i] - pure[targets[i] as usize]).abs() < 1e-10);
        }
    }

    #[test]
    fn rejects_bad_arguments() {
        let h = t(&[1.0], (1, 1));
        let w = t(&[1.0, 2.0], (2, 1));
        let e = trust_region_token_logprobs(&h, &w, &h, &w, &[0], 1.5, 1.0).unwrap_err();
        assert!(e.to_string().contains("[0, 1]"));
        let w3 = t(&[1.0, 2.0, 3.0], (3, 1));
        assert!(trust_region_token_logprobs(&h, &w, &h, &w3, &[0], 0.1, 1.0).is_err());
        assert!(trust_region_token_logprobs(&h, &w, &h, &w, &[5], 0.1, 1.0).is_err());
    }

    #[test]
    fn ema_moves_teacher_towards_student() {
        let cfg = Qwen3Config::tiny();
        let teacher = Qwen3::new_random(cfg.clone(), 1, DType::F32, &Device::Cpu).unwrap();
        let student = Qwen3::new_random(cfg, 2, DType::F32, &Device::Cpu).unwrap();
        let before = teacher.params()[1].var.as_tensor().flatten_all().unwrap();
        let s = student.params()[1].var.as_tensor().flatten_all().unwrap();
        ema_update(&teacher, &student, 0.25).unwrap();
        let after = teacher.params()[1].var.as_tensor().flatten_all().unwrap();
        let want = ((&before * 0.75).unwrap() + (&s * 0.25).unwrap()).unwrap();
        let diff = (after - want)
            .unwrap()
            .abs()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-7);
        assert!(ema_update(&teacher, &student, 2.0).is_err());
    }
}
