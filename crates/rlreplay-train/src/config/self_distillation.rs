//! `[self_distillation]`: the teacher, the construction of its contexts, and the placeholder
//! syntax of their templates (checked here at load, filled by [`crate::context`]).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// `[self_distillation]`: teacher contexts and the teacher (used by `rlsd` / `rlrt`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelfDistillationSection {
    /// Trust-region or EMA teacher.
    #[serde(default)]
    pub teacher_regularization: TeacherRegularization,
    /// α of the trust region, or η of the EMA.
    #[serde(default = "default_teacher_rate")]
    pub teacher_update_rate: f64,
    /// Give the teacher the reference answer in the math feedback (`sibling+feedback` mode).
    #[serde(default)]
    pub correctness_feedback: bool,
    /// Teacher-context construction.
    #[serde(flatten)]
    pub context: ContextConfig,
}

fn default_teacher_rate() -> f64 {
    0.1
}

impl Default for SelfDistillationSection {
    fn default() -> Self {
        Self {
            teacher_regularization: TeacherRegularization::TrustRegion,
            teacher_update_rate: default_teacher_rate(),
            correctness_feedback: false,
            context: ContextConfig::default(),
        }
    }
}

impl SelfDistillationSection {
    /// Checks value ranges and the templates (an unknown placeholder is an error here, at load,
    /// instead of a teacher context dropped on every row).
    pub fn validate(&self) -> Result<()> {
        self.context.validate()?;
        if !(0.0..=1.0).contains(&self.teacher_update_rate) {
            return Err(Error::config(
                "self_distillation.teacher_update_rate",
                format!(
                    "[self_distillation] teacher_update_rate = {}: must lie in [0, 1]",
                    self.teacher_update_rate
                ),
            ));
        }
        if self.context.max_reprompt_len == 0 {
            return Err(Error::config(
                "self_distillation.max_reprompt_len",
                "[self_distillation] max_reprompt_len must be positive",
            ));
        }
        Ok(())
    }
}

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

/// Where the teacher's privileged information comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum ContextMode {
    /// The first successful sibling rollout (reference code behaviour).
    #[default]
    #[serde(rename = "sibling")]
    Sibling,
    /// The reference answer (the RLSD paper's privileged information).
    #[serde(rename = "reference")]
    Reference,
    /// A successful sibling, or the environment feedback when there is none.
    #[serde(rename = "sibling+feedback")]
    SiblingFeedback,
}

/// How an over-long teacher prompt is shortened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Truncation {
    /// Drop the start of the demonstration (or feedback) until the prompt fits.
    #[default]
    Demonstration,
    /// Cut the end of the rendered prompt (reference code; loses the assistant header).
    Right,
}

/// Default `reprompt_template` (the reference configuration's value).
pub const REPROMPT_TEMPLATE: &str =
    "{prompt}{solution}{feedback}\n\nCorrectly solve the original question.";
/// Default `solution_template`.
pub const SOLUTION_TEMPLATE: &str = "\nCorrect solution:\n\n{successful_previous_attempt}";
/// Default `feedback_template`.
pub const FEEDBACK_TEMPLATE: &str =
    "\nThe following is feedback from your unsuccessful earlier attempt:\n\n{feedback_raw}";
/// Default `reference_template`, used in `reference` mode in the solution slot.
pub const REFERENCE_TEMPLATE: &str = "\nReference answer:\n\n{reference}";

/// Configuration of teacher-context construction (`[self_distillation]` keys).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ContextConfig {
    /// Source of the privileged information.
    pub context: ContextMode,
    /// A row is successful when its score is at least this: `[algorithm]
    /// success_reward_threshold`, copied here when the configuration is read.
    #[serde(skip)]
    pub success_reward_threshold: f64,
    /// Never use a row's own response as its demonstration.
    pub dont_reprompt_on_self_success: bool,
    /// Delete `<think>…</think>` spans (and the whitespace after them) from demonstrations.
    pub remove_thinking_from_demonstration: bool,
    /// In `sibling+feedback` mode, use feedback only for rows without a demonstration.
    pub environment_feedback_only_without_solution: bool,
    /// Maximum teacher prompt length in tokens.
    pub max_reprompt_len: usize,
    /// How over-long teacher prompts are shortened.
    pub reprompt_truncation: Truncation,
    /// Template of the teacher's user message (`{prompt}`, `{solution}`, `{feedback}`).
    pub reprompt_template: String,
    /// Template of the demonstration (`{successful_previous_attempt}`).
    pub solution_template: String,
    /// Template of the feedback (`{feedback_raw}`).
    pub feedback_template: String,
    /// Template of the reference answer in `reference` mode (`{reference}`).
    pub reference_template: String,
    /// Qwen3 thinking switch used when rendering teacher prompts.
    pub enable_thinking: Option<bool>,
}

impl Default for ContextConfig {
    fn default() -> Self {
        Self {
            context: ContextMode::Sibling,
            success_reward_threshold: 0.5,
            dont_reprompt_on_self_success: true,
            remove_thinking_from_demonstration: true,
            environment_feedback_only_without_solution: true,
            max_reprompt_len: 10240,
            reprompt_truncation: Truncation::Demonstration,
            reprompt_template: REPROMPT_TEMPLATE.into(),
            solution_template: SOLUTION_TEMPLATE.into(),
            feedback_template: FEEDBACK_TEMPLATE.into(),
            reference_template: REFERENCE_TEMPLATE.into(),
            enable_thinking: None,
        }
    }
}

impl ContextConfig {
    /// Checks that every template only uses its own placeholders.
    pub fn validate(&self) -> Result<()> {
        for (key, template, names) in [
            (
                "reprompt_template",
                &self.reprompt_template,
                &["prompt", "solution", "feedback"][..],
            ),
            (
                "solution_template",
                &self.solution_template,
                &["successful_previous_attempt"][..],
            ),
            (
                "feedback_template",
                &self.feedback_template,
                &["feedback_raw"][..],
            ),
            (
                "reference_template",
                &self.reference_template,
                &["reference"][..],
            ),
        ] {
            let values: Vec<(&str, &str)> = names.iter().map(|n| (*n, "")).collect();
            format_template(template, &values).map_err(|e| Error::TemplatePlaceholders {
                key,
                placeholders: names
                    .iter()
                    .map(|n| format!("{{{n}}}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                source: Box::new(e),
            })?;
        }
        Ok(())
    }
}

/// Fills `{name}` placeholders in one pass (values are never re-scanned); `{{` and `}}` are
/// literal braces, as in Python's `str.format`. An unknown or unclosed placeholder is an error.
pub fn format_template(template: &str, values: &[(&str, &str)]) -> Result<String> {
    let bad = |why: String| Error::Template {
        template: template.to_owned(),
        why,
    };
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if tail.starts_with("{{") || tail.starts_with("}}") {
            out.push(tail.as_bytes()[0] as char);
            rest = &tail[2..];
        } else if tail.starts_with('}') {
            return Err(bad("single '}' outside a placeholder".into()));
        } else {
            let end = tail.find('}').ok_or_else(|| bad("unclosed '{'".into()))?;
            let name = &tail[1..end];
            let value = values
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| *v)
                .ok_or_else(|| bad(format!("unknown placeholder {{{name}}}")))?;
            out.push_str(value);
            rest = &tail[end + 1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}
