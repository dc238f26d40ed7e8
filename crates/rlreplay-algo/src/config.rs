//! The algorithm configuration (verl key names and defaults) and the name registries.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{AlgoError, Result};

/// Declares an enum registered by name: `NAMES`, `from_name`, `name` and serde by name.
macro_rules! registry {
    ($(#[$doc:meta])* $ty:ident, $kind:literal, { $($(#[$vdoc:meta])* $var:ident => $name:literal $(| $alias:literal)*),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $ty {
            $($(#[$vdoc])* $var),+
        }

        impl $ty {
            /// Every registered name, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$($name),+];

            /// Looks a name up; an unknown name is an error listing the valid ones.
            pub fn from_name(name: &str) -> Result<Self> {
                match name {
                    $($name $(| $alias)* => Ok(Self::$var),)+
                    _ => Err(AlgoError::UnknownName {
                        kind: $kind,
                        name: name.to_string(),
                        valid: Self::NAMES.join(", "),
                    }),
                }
            }

            /// The canonical (verl) name.
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$var => $name),+
                }
            }
        }

        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::from_name(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

registry!(
    /// Advantage estimators (`algorithm.adv_estimator`).
    AdvEstimator, "adv_estimator", {
    /// Group-normalised advantage; Dr.GRPO when `norm_adv_by_std_in_grpo` is false.
    Grpo => "grpo",
    /// Leave-one-out baseline.
    Rloo => "rloo",
    /// MaxRL: `(s − μ)/(μ + ε)` per group.
    Maxrl => "maxrl",
    /// Token-level discounted returns, whitened over the batch.
    ReinforcePlusPlus => "reinforce_plus_plus",
    /// Group-centred score, whitened over the batch.
    ReinforcePlusPlusBaseline => "reinforce_plus_plus_baseline",
    /// Length-weighted group-mean baseline.
    Opo => "opo",
    /// Only the best row of a group gets `r_max − r_second`.
    GrpoPassk => "grpo_passk",
    /// Truncated failure series of order `truncate_order`, no baseline.
    Maclaurin => "maclaurin",
    /// Maclaurin with leave-one-out tuple baselines.
    MaclaurinBaseline => "maclaurin_baseline",
    /// Maclaurin with cross-fitted disjoint-tuple baselines.
    CrossFittedMaclaurin => "cross_fitted_maclaurin",
    /// Order-`truncate_order` estimator through subsets, with a `1/N` baseline.
    OversampleSubsetVr => "oversample_subset_vr",
    /// Conditional estimator with control variate: `1/C − 1/N`, `−1/N`.
    VrCond => "vr_cond",
    /// pass@k policy optimisation (k = `pass_k`) with a leave-one-out baseline.
    Pkpo => "pkpo",
});

registry!(
    /// Policy losses (`actor.policy_loss.loss_mode`).
    LossMode, "loss_mode", {
    /// PPO clip with asymmetric bounds and dual clip.
    Ppo => "ppo" | "vanilla",
    /// `−A·ℓ`, times IS weights when present.
    Reinforce => "reinforce",
    /// PPO on RLSD-reweighted token advantages (teacher-over-student log ratio).
    Rlsd => "rlsd",
    /// RLSD variant: reversed log ratio, only correct rows active.
    Rlrt => "rlrt",
});

registry!(
    /// Loss aggregation modes (`actor.loss_agg_mode`).
    AggMode, "loss_agg_mode", {
    /// Mean over valid tokens.
    TokenMean => "token-mean",
    /// Mean over non-empty sequences of per-sequence token sums.
    SeqMeanTokenSum => "seq-mean-token-sum",
    /// Mean over non-empty sequences of per-sequence token means.
    SeqMeanTokenMean => "seq-mean-token-mean",
    /// Sum over all tokens divided by `loss_scale_factor` (Dr.GRPO).
    SeqMeanTokenSumNorm => "seq-mean-token-sum-norm",
});

registry!(
    /// Where aggregation statistics come from.
    AggNormalizer, "loss_agg_normalizer", {
    /// Statistics of the whole mini-batch: the loss does not depend on micro-batching.
    Global => "global",
    /// verl's legacy actor: statistics per micro-batch, each micro-batch scaled by `1/Gacc`.
    Verl => "verl",
});

registry!(
    /// KL penalty estimators (`actor.kl_loss_type`).
    KlType, "kl_loss_type", {
    /// `ℓ − ℓ_ref`.
    K1 => "kl" | "k1",
    /// `|ℓ − ℓ_ref|`.
    Abs => "abs",
    /// `½(ℓ − ℓ_ref)²`.
    Mse => "mse" | "k2",
    /// `e^{ℓ_ref−ℓ} − (ℓ_ref − ℓ) − 1`, clamped to ±10.
    LowVarKl => "low_var_kl" | "k3",
});

registry!(
    /// Importance-weight level (`rollout_is`).
    IsLevel, "rollout_is", {
    /// One weight per token.
    Token => "token",
    /// Product of the row's token ratios.
    Sequence => "sequence",
    /// Geometric mean of the row's token ratios.
    Geometric => "geometric",
});

registry!(
    /// What happens to weights outside the thresholds (`rollout_is_mode`).
    IsMode, "rollout_is_mode", {
    /// TIS: `min(w, upper)`.
    Truncate => "truncate",
    /// MIS: weights outside `[lower, upper]` become 0.
    Mask => "mask",
});

registry!(
    /// Treatment of a group with a single rollout.
    SingletonPolicy, "singleton_groups", {
    /// Advantage 0 under every estimator (no baseline, no signal), counted in a metric.
    Zero => "zero",
    /// The reference code's values (MaxRL gives `1e6·s`).
    Verl => "verl",
});

/// How the per-token loss of a [`LossMode`] is formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyObjective {
    /// `−Â·ℓ` (times IS weights): the gradient does not depend on ℓ_old.
    Reinforce,
    /// PPO's clipped `−Â·ρ` with `ρ = exp(ℓ − ℓ_old)`, asymmetric bounds and dual clip.
    ClippedRatio,
}

/// Which teacher/student log ratio reweights the token advantages of an RLSD-family loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TeacherRatio {
    /// `ℓ_teacher − ℓ_student` on every row with a teacher context (`rlsd`).
    TeacherOverStudent,
    /// `ℓ_student − ℓ_teacher`, only on correct rows (`rlrt`).
    StudentOverTeacherOnCorrect,
}

/// Every property of a loss mode, decided here and nowhere else: a new mode adds its arm to each
/// exhaustive match below and the compiler finds the rest.
impl LossMode {
    /// How the per-token loss is formed.
    pub fn objective(self) -> PolicyObjective {
        match self {
            LossMode::Reinforce => PolicyObjective::Reinforce,
            LossMode::Ppo | LossMode::Rlsd | LossMode::Rlrt => PolicyObjective::ClippedRatio,
        }
    }

    /// The teacher log ratio that reweights the advantages; `None` for a loss without a teacher.
    pub fn teacher_ratio(self) -> Option<TeacherRatio> {
        match self {
            LossMode::Reinforce | LossMode::Ppo => None,
            LossMode::Rlsd => Some(TeacherRatio::TeacherOverStudent),
            LossMode::Rlrt => Some(TeacherRatio::StudentOverTeacherOnCorrect),
        }
    }

    /// Whether the loss needs teacher log-probs (and so a teacher and teacher contexts).
    pub fn needs_teacher(self) -> bool {
        self.teacher_ratio().is_some()
    }

    /// Whether the loss uses the ratio `π/π_old` (and so ℓ_old once the policy has moved).
    pub fn uses_ratio(self) -> bool {
        self.objective() == PolicyObjective::ClippedRatio
    }

    /// Whether the loss needs per-row correctness (`score ≥ success_reward_threshold`).
    pub fn needs_correctness(self) -> bool {
        self.teacher_ratio() == Some(TeacherRatio::StudentOverTeacherOnCorrect)
    }

    /// Whether ℓ_old must be computed before the update: a ratio loss taking more than one
    /// optimizer step on the batch (the first step's ratio is 1 without it).
    pub fn needs_old_logprobs(self, optimizer_steps: usize) -> bool {
        self.uses_ratio() && optimizer_steps > 1
    }
}

impl AdvEstimator {
    /// Whether the estimator's formula binarises the scores itself (`s > 0.5`, the reference's
    /// rule, algorithms.md §3). This is part of those estimators, not the notion of success, which
    /// is `score ≥ success_reward_threshold` everywhere else.
    pub fn binarizes_scores(self) -> bool {
        match self {
            AdvEstimator::Pkpo
            | AdvEstimator::Maclaurin
            | AdvEstimator::MaclaurinBaseline
            | AdvEstimator::CrossFittedMaclaurin
            | AdvEstimator::OversampleSubsetVr
            | AdvEstimator::VrCond => true,
            AdvEstimator::Grpo
            | AdvEstimator::Rloo
            | AdvEstimator::Maxrl
            | AdvEstimator::ReinforcePlusPlus
            | AdvEstimator::ReinforcePlusPlusBaseline
            | AdvEstimator::Opo
            | AdvEstimator::GrpoPassk => false,
        }
    }

    /// Whether the estimator gives per-token values (discounted returns or batch whitening)
    /// rather than one value per row from its group.
    pub fn token_level(self) -> bool {
        match self {
            AdvEstimator::ReinforcePlusPlus | AdvEstimator::ReinforcePlusPlusBaseline => true,
            AdvEstimator::Grpo
            | AdvEstimator::Rloo
            | AdvEstimator::Maxrl
            | AdvEstimator::Opo
            | AdvEstimator::GrpoPassk
            | AdvEstimator::Pkpo
            | AdvEstimator::Maclaurin
            | AdvEstimator::MaclaurinBaseline
            | AdvEstimator::CrossFittedMaclaurin
            | AdvEstimator::OversampleSubsetVr
            | AdvEstimator::VrCond => false,
        }
    }
}

/// A rejection-sampling threshold: a number, or a string (`"u"`, `"lower_upper"`, or one such
/// entry per option separated by commas).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RsThreshold {
    /// One bound used for every option.
    Number(f64),
    /// The textual form.
    Text(String),
}

/// All algorithm settings, with verl key names and verl defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlgoConfig {
    /// Advantage estimator.
    pub adv_estimator: AdvEstimator,
    /// GRPO divides by the group's (unbiased) std; false gives Dr.GRPO.
    pub norm_adv_by_std_in_grpo: bool,
    /// Discount of `reinforce_plus_plus`.
    pub gamma: f64,
    /// Order T of the MaxRL family (`maclaurin`, ...).
    pub truncate_order: usize,
    /// k of `pkpo`.
    pub pass_k: usize,
    /// Treatment of single-rollout groups.
    pub singleton_groups: SingletonPolicy,
    /// Policy loss.
    pub loss_mode: LossMode,
    /// Symmetric PPO clip range, the fallback of the two asymmetric ones.
    pub clip_ratio: f64,
    /// Lower PPO clip range ε_lo (null: `clip_ratio`).
    pub clip_ratio_low: Option<f64>,
    /// Upper PPO clip range ε_hi (null: `clip_ratio`).
    pub clip_ratio_high: Option<f64>,
    /// Dual-clip constant c (> 1).
    pub clip_ratio_c: f64,
    /// Loss aggregation mode.
    pub loss_agg_mode: AggMode,
    /// Divisor S of `seq-mean-token-sum-norm` (null: the longest response of the mini-batch).
    pub loss_scale_factor: Option<f64>,
    /// Global (default) or verl per-micro-batch statistics.
    pub loss_agg_normalizer: AggNormalizer,
    /// Micro-batch size in sequences (needed by the `verl` normalizer).
    pub ppo_micro_batch_size_per_gpu: Option<usize>,
    /// Add a KL penalty against reference log-probs.
    pub use_kl_loss: bool,
    /// Coefficient of the KL penalty.
    pub kl_loss_coef: f64,
    /// Estimator of the KL penalty.
    pub kl_loss_type: KlType,
    /// Rollout IS level (null: no IS weights).
    pub rollout_is: Option<IsLevel>,
    /// Upper IS threshold C.
    pub rollout_is_threshold: f64,
    /// Lower IS threshold (null: 1/C).
    pub rollout_is_threshold_lower: Option<f64>,
    /// Truncate (TIS) or mask (MIS).
    pub rollout_is_mode: IsMode,
    /// Divide IS weights by their batch mean.
    pub rollout_is_batch_normalize: bool,
    /// Rejection-sampling options, comma separated (`token_k1`, `seq_mean_k3`, ...); null: none.
    pub rollout_rs: Option<String>,
    /// Rejection-sampling thresholds.
    pub rollout_rs_threshold: Option<RsThreshold>,
    /// Use the rollout log-probs as ℓ_old (no recomputation).
    pub bypass_mode: bool,
    /// RLSD reweighting strength λ0.
    pub token_reweight_lambda: f64,
    /// RLSD weight clip ε_w.
    pub token_reweight_eps_w: f64,
    /// Linear decay of λ to 0 over this many steps (null or ≤ 0: none).
    pub token_reweight_decay_steps: Option<i64>,
    /// 1-based training step (for the λ decay).
    pub global_step: Option<u64>,
    /// Score at or above which a rollout counts as a success: `rlrt`'s correct rows, the RLSD
    /// contexts' successful siblings, the `drop_solve_*` filters and every success/failure split
    /// in metrics. (The estimators of [`AdvEstimator::binarizes_scores`] keep their own `s > 0.5`.)
    pub success_reward_threshold: f64,
}

impl Default for AlgoConfig {
    fn default() -> Self {
        Self {
            adv_estimator: AdvEstimator::Grpo,
            norm_adv_by_std_in_grpo: true,
            gamma: 1.0,
            truncate_order: 16,
            pass_k: 1,
            singleton_groups: SingletonPolicy::Zero,
            loss_mode: LossMode::Ppo,
            clip_ratio: 0.2,
            clip_ratio_low: None,
            clip_ratio_high: None,
            clip_ratio_c: 3.0,
            loss_agg_mode: AggMode::TokenMean,
            loss_scale_factor: None,
            loss_agg_normalizer: AggNormalizer::Global,
            ppo_micro_batch_size_per_gpu: None,
            use_kl_loss: false,
            kl_loss_coef: 0.001,
            kl_loss_type: KlType::LowVarKl,
            rollout_is: None,
            rollout_is_threshold: 2.0,
            rollout_is_threshold_lower: None,
            rollout_is_mode: IsMode::Truncate,
            rollout_is_batch_normalize: false,
            rollout_rs: None,
            rollout_rs_threshold: None,
            bypass_mode: false,
            token_reweight_lambda: 0.5,
            token_reweight_eps_w: 0.2,
            token_reweight_decay_steps: None,
            global_step: None,
            success_reward_threshold: 0.5,
        }
    }
}

fn bad(key: &'static str, msg: impl Into<String>) -> AlgoError {
    AlgoError::Config {
        key,
        msg: msg.into(),
    }
}

fn finite(key: &'static str, v: f64) -> Result<()> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(bad(key, format!("must be finite, got {v}")))
    }
}

impl AlgoConfig {
    /// ε_lo: `clip_ratio_low`, or `clip_ratio`.
    pub fn clip_low(&self) -> f64 {
        self.clip_ratio_low.unwrap_or(self.clip_ratio)
    }

    /// ε_hi: `clip_ratio_high`, or `clip_ratio`.
    pub fn clip_high(&self) -> f64 {
        self.clip_ratio_high.unwrap_or(self.clip_ratio)
    }

    /// The lower IS threshold: `rollout_is_threshold_lower`, or `1/rollout_is_threshold`.
    pub fn is_threshold_lower(&self) -> f64 {
        self.rollout_is_threshold_lower
            .unwrap_or(1.0 / self.rollout_is_threshold)
    }

    /// Checks every value; the error names the offending key.
    pub fn validate(&self) -> Result<()> {
        finite("gamma", self.gamma)?;
        if !(0.0..=1.0).contains(&self.gamma) {
            return Err(bad(
                "gamma",
                format!("must be in [0, 1], got {}", self.gamma),
            ));
        }
        if self.truncate_order == 0 {
            return Err(bad("truncate_order", "must be at least 1"));
        }
        if self.pass_k == 0 {
            return Err(bad("pass_k", "must be at least 1"));
        }
        for (key, v) in [
            ("clip_ratio", Some(self.clip_ratio)),
            ("clip_ratio_low", self.clip_ratio_low),
            ("clip_ratio_high", self.clip_ratio_high),
        ] {
            if let Some(v) = v {
                finite(key, v)?;
                if v < 0.0 {
                    return Err(bad(key, format!("must be ≥ 0, got {v}")));
                }
            }
        }
        if self.clip_low() >= 1.0 {
            return Err(bad(
                "clip_ratio_low",
                format!("must be < 1, got {}", self.clip_low()),
            ));
        }
        finite("clip_ratio_c", self.clip_ratio_c)?;
        if self.clip_ratio_c <= 1.0 {
            return Err(bad(
                "clip_ratio_c",
                format!("must be > 1, got {}", self.clip_ratio_c),
            ));
        }
        if let Some(s) = self.loss_scale_factor {
            finite("loss_scale_factor", s)?;
            if s <= 0.0 {
                return Err(bad("loss_scale_factor", format!("must be > 0, got {s}")));
            }
        }
        if self.loss_agg_normalizer == AggNormalizer::Verl {
            match self.ppo_micro_batch_size_per_gpu {
                None | Some(0) => {
                    return Err(bad(
                        "ppo_micro_batch_size_per_gpu",
                        "must be ≥ 1 when loss_agg_normalizer is `verl`",
                    ))
                }
                Some(_) => {}
            }
        }
        finite("kl_loss_coef", self.kl_loss_coef)?;
        if self.kl_loss_coef < 0.0 {
            return Err(bad("kl_loss_coef", "must be ≥ 0"));
        }
        finite("rollout_is_threshold", self.rollout_is_threshold)?;
        if self.rollout_is_threshold <= 0.0 {
            return Err(bad("rollout_is_threshold", "must be > 0"));
        }
        if let Some(lo) = self.rollout_is_threshold_lower {
            finite("rollout_is_threshold_lower", lo)?;
            if lo < 0.0 || lo > self.rollout_is_threshold {
                return Err(bad(
                    "rollout_is_threshold_lower",
                    format!("must be in [0, rollout_is_threshold], got {lo}"),
                ));
            }
        }
        self.rejection_options()?;
        if self.bypass_mode && self.rollout_rs.is_some() {
            return Err(bad(
                "rollout_rs",
                "rejection sampling is not supported together with bypass_mode",
            ));
        }
        finite("token_reweight_lambda", self.token_reweight_lambda)?;
        if !(0.0..=1.0).contains(&self.token_reweight_lambda) {
            return Err(bad("token_reweight_lambda", "must be in [0, 1]"));
        }
        finite("token_reweight_eps_w", self.token_reweight_eps_w)?;
        if self.token_reweight_eps_w < 0.0 {
            return Err(bad("token_reweight_eps_w", "must be ≥ 0"));
        }
        finite("success_reward_threshold", self.success_reward_threshold)?;
        Ok(())
    }

    /// Parses `rollout_rs` with `rollout_rs_threshold` into rejection options.
    pub fn rejection_options(&self) -> Result<Vec<crate::correction::RsOption>> {
        crate::correction::parse_rejection(
            self.rollout_rs.as_deref(),
            self.rollout_rs_threshold.as_ref(),
        )
    }

    /// λ of the RLSD reweighting at `global_step`: linear decay over `token_reweight_decay_steps`.
    pub fn token_reweight_lambda_now(&self) -> f64 {
        crate::rlsd::decayed_lambda(
            self.token_reweight_lambda,
            self.token_reweight_decay_steps,
            self.global_step,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards that every loss mode's properties are decided in one place (the drift that sent
    /// every mode but REINFORCE down the PPO branch through a catch-all arm): each registered
    /// mode has the properties of the table.
    #[test]
    fn every_loss_mode_declares_its_properties() {
        // (name, uses the ratio, needs a teacher, needs correctness)
        let table = [
            ("ppo", true, false, false),
            ("reinforce", false, false, false),
            ("rlsd", true, true, false),
            ("rlrt", true, true, true),
        ];
        assert_eq!(LossMode::NAMES.len(), table.len());
        for (name, ratio, teacher, correct) in table {
            let m = LossMode::from_name(name).unwrap();
            assert_eq!(m.uses_ratio(), ratio, "{name}");
            assert_eq!(m.needs_teacher(), teacher, "{name}");
            assert_eq!(m.needs_correctness(), correct, "{name}");
            assert!(!m.needs_old_logprobs(1), "{name}");
            assert_eq!(m.needs_old_logprobs(2), ratio, "{name}");
        }
    }

    #[test]
    fn estimator_properties() {
        let binarizing: Vec<&str> = AdvEstimator::NAMES
            .iter()
            .copied()
            .filter(|n| AdvEstimator::from_name(n).unwrap().binarizes_scores())
            .collect();
        assert_eq!(
            binarizing,
            [
                "maclaurin",
                "maclaurin_baseline",
                "cross_fitted_maclaurin",
                "oversample_subset_vr",
                "vr_cond",
                "pkpo"
            ]
        );
        assert!(AdvEstimator::ReinforcePlusPlus.token_level());
        assert!(!AdvEstimator::Maxrl.token_level());
    }
}
