//! Teachers for self-distillation: the trust-region teacher, whose logits mix those of the frozen
//! initial model and the current model, `z_T = (1 − α)·z_ref + α·z_cur`, and the EMA teacher,
//! whose weights follow the student, `θ_T ← (1 − η)·θ_T + η·θ_student`.

use crate::config::TeacherRegularization;
use crate::error::{Error, Result};
use rlreplay_dist::DataParallel;
use rlreplay_model::{mixed_logprobs, Model, SeqPair};

/// Directory of the EMA teacher inside a checkpoint.
pub const EMA_TEACHER: &str = "ema_teacher";

/// The self-distillation teacher: the frozen initial model (trust region) or the EMA model.
pub struct Teacher {
    model: Model,
    regularization: TeacherRegularization,
    rate: f64,
}

impl Teacher {
    /// A teacher over `model` (the initial weights, or the saved EMA teacher on resume); `rate`
    /// is α of the trust region or η of the EMA.
    pub fn new(model: Model, regularization: TeacherRegularization, rate: f64) -> Result<Self> {
        if !(0.0..=1.0).contains(&rate) {
            return Err(Error::config(
                "self_distillation.teacher_update_rate",
                format!("teacher_update_rate = {rate}: must lie in [0, 1]"),
            ));
        }
        Ok(Self {
            model,
            regularization,
            rate,
        })
    }

    /// The teacher's own weights (frozen initial model, or the EMA model).
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The regularisation.
    pub fn regularization(&self) -> TeacherRegularization {
        self.regularization
    }

    /// Teacher log-probs `log softmax(z_T / τ)[y_t]` of `responses[i]` after the teacher prompts
    /// `prompts[i]`, with `z_T = (1 − α)·z_ref + α·z_policy` (trust region; `policy` is the current
    /// student) or the EMA model's logits, in packed forward passes of at most `budget` tokens
    /// shared out over `dp`'s ranks as the policy's log-probs are ([`DataParallel::packed`]).
    /// Rows with an empty prompt or response get zeros (no teacher context, or no tokens).
    pub fn logprobs(
        &self,
        dp: &DataParallel<'_>,
        policy: &Model,
        prompts: &[&[u32]],
        responses: &[&[u32]],
        temperature: f64,
        budget: usize,
    ) -> Result<Vec<Vec<f64>>> {
        if prompts.len() != responses.len() {
            return Err(Error::Teacher(format!(
                "{} teacher prompts for {} responses",
                prompts.len(),
                responses.len()
            )));
        }
        let mut out: Vec<Vec<f64>> = responses.iter().map(|r| vec![0.0; r.len()]).collect();
        let rows: Vec<usize> = (0..prompts.len())
            .filter(|&i| !prompts[i].is_empty() && !responses[i].is_empty())
            .collect();
        let pairs: Vec<SeqPair<'_>> = rows
            .iter()
            .map(|&i| SeqPair::new(prompts[i], responses[i]))
            .collect();
        let parts: Vec<(&Model, f64)> = match self.regularization {
            TeacherRegularization::TrustRegion => {
                vec![(&self.model, 1.0 - self.rate), (policy, self.rate)]
            }
            TeacherRegularization::Ema => vec![(&self.model, 1.0)],
        };
        let flat = dp.packed(self.model.config(), &pairs, budget, |c| {
            Ok::<_, Error>(mixed_logprobs(&parts, &pairs[c], temperature)?)
        })?;
        let mut at = 0;
        for &i in &rows {
            let len = out[i].len();
            out[i].copy_from_slice(&flat[at..at + len]);
            at += len;
        }
        Ok(out)
    }

    /// After an update that applied at least one optimizer step: the EMA teacher moves towards
    /// `policy`; the trust-region teacher stays frozen.
    pub fn follow(&self, policy: &Model) -> Result<()> {
        match self.regularization {
            TeacherRegularization::Ema => ema_update(&self.model, policy, self.rate),
            TeacherRegularization::TrustRegion => Ok(()),
        }
    }
}

/// Moves every weight of `teacher` towards `student`: `θ_T ← (1 − η)·θ_T + η·θ_student`.
pub fn ema_update(teacher: &Model, student: &Model, rate: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&rate) {
        return Err(Error::config(
            "self_distillation.teacher_update_rate",
            format!("EMA teacher update rate must lie in [0, 1], got {rate}"),
        ));
    }
    let (tp, sp) = (teacher.params(), student.params());
    if tp.len() != sp.len() {
        return Err(Error::Teacher(format!(
            "EMA teacher has {} parameters, the student {}",
            tp.len(),
            sp.len()
        )));
    }
    for (t, s) in tp.iter().zip(sp) {
        if t.name != s.name || t.var.dims() != s.var.dims() {
            return Err(Error::Teacher(format!(
                "EMA teacher parameter {} {:?} does not match student parameter {} {:?}",
                t.name,
                t.var.dims(),
                s.name,
                s.var.dims()
            )));
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
    use rlreplay_model::{DType, Device, ModelConfig};

    fn model(seed: u64) -> Model {
        let cfg = ModelConfig {
            vocab_size: 40,
            hidden_size: 32,
            intermediate_size: 64,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 8,
            ..ModelConfig::tiny()
        };
        Model::new_random(cfg, seed, DType::F32, &Device::Cpu).unwrap()
    }

    fn close(a: &[Vec<f64>], b: &[Vec<f64>]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x.len(), y.len());
            for (p, q) in x.iter().zip(y) {
                assert!((p - q).abs() < 1e-4, "{x:?} vs {y:?}");
            }
        }
    }

    /// The values the token-by-token decoder teacher gave: at α = 0 the frozen model's, at α = 1
    /// the current model's, the EMA model's own, and a model mixed with itself unchanged; rows
    /// without a teacher prompt get zeros; any packing budget gives the same values.
    #[test]
    fn teacher_logprobs_match_the_models_log_probs() {
        let (a, b) = (model(1), model(2));
        let dp = DataParallel::default();
        let prompts: [&[u32]; 4] = [&[1, 2, 3], &[4], &[], &[5, 6]];
        let responses: [&[u32]; 4] = [&[7, 8, 9, 10], &[11], &[12], &[]];
        let pairs: Vec<SeqPair<'_>> = [0, 1, 3]
            .iter()
            .map(|&i| SeqPair::new(prompts[i], responses[i]))
            .collect();
        let want_a = a.logprobs(&pairs, 0.7, false).unwrap().logprobs;
        let want_b = b.logprobs(&pairs, 0.7, false).unwrap().logprobs;
        let pick = |v: Vec<Vec<f64>>| vec![v[0].clone(), v[1].clone(), v[3].clone()];
        // The teacher's own model is `a` (same seed).
        let teacher =
            |r: TeacherRegularization, rate: f64| Teacher::new(model(1), r, rate).unwrap();
        let ema = teacher(TeacherRegularization::Ema, 0.1)
            .logprobs(&dp, &b, &prompts, &responses, 0.7, 4)
            .unwrap();
        assert_eq!(ema[2], vec![0.0], "a row without teacher prompt gets zeros");
        close(&pick(ema), &want_a);
        let tr = |rate: f64, policy: &Model, budget: usize| {
            teacher(TeacherRegularization::TrustRegion, rate)
                .logprobs(&dp, policy, &prompts, &responses, 0.7, budget)
                .unwrap()
        };
        close(&pick(tr(1.0, &b, 64)), &want_b);
        close(&pick(tr(0.0, &b, 64)), &want_a);
        close(&pick(tr(0.3, &a, 64)), &want_a);
        close(&tr(0.3, &b, 1), &tr(0.3, &b, 64));
        assert!(teacher(TeacherRegularization::Ema, 0.1)
            .logprobs(&dp, &b, &prompts[..1], &responses, 1.0, 64)
            .is_err());
        assert!(Teacher::new(model(1), TeacherRegularization::Ema, 1.5).is_err());
    }

    #[test]
    fn ema_moves_teacher_towards_student() {
        let cfg = ModelConfig::tiny();
        let teacher = Model::new_random(cfg.clone(), 1, DType::F32, &Device::Cpu).unwrap();
        let student = Model::new_random(cfg, 2, DType::F32, &Device::Cpu).unwrap();
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
