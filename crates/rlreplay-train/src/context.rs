//! Teacher contexts for self-distillation (RLSD / SDPO re-prompting).
//!
//! For every rollout row the teacher sees the student's prompt enriched with privileged
//! information, then scores the student's own response tokens in that context:
//!
//! - `sibling` (default): the first successful sibling of the same group in logged row order,
//!   excluding the row itself, with every `<think>…</think>` span removed;
//! - `reference`: the reference answer of the prompt;
//! - `sibling+feedback`: a sibling demonstration, or the environment's feedback on the row's own
//!   attempt when no sibling succeeded.
//!
//! The user message is `reprompt_template` filled with the prompt, the demonstration (through
//! `solution_template`) and the feedback (through `feedback_template`). A teacher prompt longer
//! than `max_reprompt_len` tokens is shortened by dropping the start of the demonstration (its end
//! holds the final answer), never the end of the prompt or the assistant header; `right`
//! truncation (cut the end of the rendered prompt) reproduces the reference code.

use std::collections::HashMap;
use std::sync::LazyLock;

use regex::Regex;
use rlreplay_data::RolloutBatch;
use rlreplay_sampling::chat::{ChatOptions, ChatTokenizer, Message};

use crate::config::{
    format_template, ContextConfig, ContextMode, SelfDistillationSection, Truncation,
};
use crate::error::{Error, Result};
use crate::rundir::Metrics;
use crate::source::StepText;

/// What the context builder needs to know about one rollout row.
#[derive(Debug, Clone, Copy)]
pub struct ContextRow<'a> {
    /// Prompt group id; siblings share it.
    pub uid: &'a str,
    /// The raw prompt messages; the last one is the user turn, earlier ones are kept verbatim.
    pub messages: &'a [Message],
    /// The decoded response (special tokens skipped).
    pub response_text: &'a str,
    /// The row's reward.
    pub score: f64,
    /// Environment feedback on this row's attempt (empty or `None` when there is none).
    pub feedback: Option<&'a str>,
    /// The reference answer, when known.
    pub ground_truth: Option<&'a str>,
}

/// The teacher's conversation for one row, before tokenization.
#[derive(Debug, Clone, PartialEq)]
pub struct TeacherContext {
    /// Prompt group id of the row.
    pub uid: String,
    /// Messages before the user turn (system prompt), verbatim.
    pub system: Vec<Message>,
    /// The raw text of the student's last user message.
    pub prompt: String,
    /// The privileged text filled into the solution slot (demonstration or reference), if any.
    pub demonstration: Option<String>,
    /// The row whose response is the demonstration (sibling modes).
    pub demo_row: Option<usize>,
    /// The feedback used, if any.
    pub feedback: Option<String>,
    /// Whether feedback was available for this row (used or not).
    pub feedback_available: bool,
    /// Whether the row's own score counts as a success.
    pub correct: bool,
}

impl TeacherContext {
    /// Whether the row has a teacher context (the self-distillation mask).
    pub fn active(&self) -> bool {
        self.demonstration.is_some() || self.feedback.is_some()
    }

    /// The teacher's user message, with the demonstration replaced by `demo` when given.
    pub fn user_text(&self, cfg: &ContextConfig, demo: Option<&str>) -> Result<String> {
        if !self.active() {
            return Ok(self.prompt.clone());
        }
        let demonstration = demo.or(self.demonstration.as_deref());
        let solution = match demonstration {
            None => String::new(),
            Some(d) if self.demo_row.is_some() => format_template(
                &cfg.solution_template,
                &[("successful_previous_attempt", d)],
            )?,
            Some(d) => format_template(&cfg.reference_template, &[("reference", d)])?,
        };
        let feedback = match &self.feedback {
            None => String::new(),
            Some(f) => format_template(&cfg.feedback_template, &[("feedback_raw", f)])?,
        };
        format_template(
            &cfg.reprompt_template,
            &[
                ("prompt", &self.prompt),
                ("solution", &solution),
                ("feedback", &feedback),
            ],
        )
    }

    /// The teacher conversation (system messages, then the teacher's user message).
    pub fn messages(&self, cfg: &ContextConfig, demo: Option<&str>) -> Result<Vec<Message>> {
        let mut m = self.system.clone();
        m.push(Message::user(self.user_text(cfg, demo)?));
        Ok(m)
    }
}

static THINK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?s)<think>.*?</think>\s*").expect("valid regex"));

/// Deletes every `<think>…</think>` span and the whitespace that follows it.
pub fn remove_thinking(text: &str) -> String {
    THINK.replace_all(text, "").into_owned()
}

/// Builds the teacher context of every row (spec order: successes per group in row order; the
/// first candidate other than the row itself is the demonstration).
pub fn build_contexts(rows: &[ContextRow<'_>], cfg: &ContextConfig) -> Result<Vec<TeacherContext>> {
    let mut successes: HashMap<&str, Vec<usize>> = HashMap::new();
    for (j, r) in rows.iter().enumerate() {
        if r.score >= cfg.success_reward_threshold {
            successes.entry(r.uid).or_default().push(j);
        }
    }
    rows.iter()
        .enumerate()
        .map(|(i, r)| {
            let (last, system) = r.messages.split_last().ok_or_else(|| Error::Row {
                row: i,
                why: "the prompt has no messages".into(),
            })?;
            let correct = r.score >= cfg.success_reward_threshold;
            let (demo_row, demonstration) = match cfg.context {
                ContextMode::Reference => (None, r.ground_truth.map(str::to_owned)),
                ContextMode::Sibling | ContextMode::SiblingFeedback => {
                    let demo = successes.get(r.uid).and_then(|c| {
                        c.iter()
                            .copied()
                            .find(|&j| !(cfg.dont_reprompt_on_self_success && j == i))
                    });
                    let text = demo.map(|j| {
                        if cfg.remove_thinking_from_demonstration {
                            remove_thinking(rows[j].response_text)
                        } else {
                            rows[j].response_text.to_owned()
                        }
                    });
                    (demo, text)
                }
            };
            let available = r.feedback.filter(|f| !f.is_empty());
            let feedback = match cfg.context {
                ContextMode::SiblingFeedback
                    if !cfg.environment_feedback_only_without_solution
                        || demonstration.is_none() =>
                {
                    available.map(str::to_owned)
                }
                _ => None,
            };
            Ok(TeacherContext {
                uid: r.uid.to_owned(),
                system: system.to_vec(),
                prompt: last.content.clone(),
                demonstration,
                demo_row,
                feedback,
                feedback_available: available.is_some(),
                correct,
            })
        })
        .collect()
}

/// Turns conversations into prompt token ids (the chat template with the generation prompt).
pub trait PromptEncoder {
    /// Renders `messages` with the generation prompt and tokenizes them.
    fn encode_chat(&self, messages: &[Message], enable_thinking: Option<bool>) -> Result<Vec<u32>>;
    /// Tokenizes plain text (no special tokens added).
    fn encode_text(&self, text: &str) -> Result<Vec<u32>>;
    /// Decodes token ids (special tokens kept).
    fn decode(&self, ids: &[u32]) -> Result<String>;
}

impl PromptEncoder for ChatTokenizer {
    fn encode_chat(&self, messages: &[Message], enable_thinking: Option<bool>) -> Result<Vec<u32>> {
        self.encode(
            messages,
            ChatOptions {
                add_generation_prompt: true,
                enable_thinking,
            },
        )
        .map_err(Into::into)
    }

    fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
        ChatTokenizer::encode_text(self, text).map_err(Into::into)
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        ChatTokenizer::decode(self, ids, false).map_err(Into::into)
    }
}

/// A tokenized teacher prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeacherPrompt {
    /// Token ids of the rendered teacher prompt (ends with the assistant header unless `right`
    /// truncation cut it).
    pub ids: Vec<u32>,
    /// Whether the prompt had to be shortened.
    pub truncated: bool,
}

/// Rounds of re-tokenization when shortening a demonstration (token boundaries can move by a few
/// tokens when a cut text is re-encoded).
const CUT_ROUNDS: usize = 8;

/// Tokenizes the teacher prompt of `ctx`, shortened to `cfg.max_reprompt_len` tokens. With
/// `demonstration` truncation the start of the demonstration (or of the feedback when there is no
/// demonstration) is dropped; when even an empty one does not fit, the result is an error naming
/// the lengths, and the caller treats the row as having no teacher context.
pub fn encode_teacher_prompt(
    ctx: &TeacherContext,
    cfg: &ContextConfig,
    enc: &dyn PromptEncoder,
) -> Result<TeacherPrompt> {
    let max = cfg.max_reprompt_len;
    let full = enc.encode_chat(&ctx.messages(cfg, None)?, cfg.enable_thinking)?;
    if full.len() <= max {
        return Ok(TeacherPrompt {
            ids: full,
            truncated: false,
        });
    }
    if cfg.reprompt_truncation == Truncation::Right {
        return Ok(TeacherPrompt {
            ids: full[..max].to_vec(),
            truncated: true,
        });
    }
    // The piece that may be cut: the demonstration, else the feedback.
    let (piece, is_demo) = match (&ctx.demonstration, &ctx.feedback) {
        (Some(d), _) => (d.as_str(), true),
        (None, Some(f)) => (f.as_str(), false),
        (None, None) => {
            return Err(Error::TeacherPrompt(format!(
                "the prompt alone is {} tokens, over max_reprompt_len = {max}",
                full.len()
            )))
        }
    };
    let piece_ids = enc.encode_text(piece)?;
    let mut keep = piece_ids.len().saturating_sub(full.len() - max);
    for _ in 0..CUT_ROUNDS {
        let cut = enc.decode(&piece_ids[piece_ids.len() - keep..])?;
        let mut shortened = ctx.clone();
        if is_demo {
            shortened.demonstration = Some(cut);
        } else {
            shortened.feedback = Some(cut);
        }
        let ids = enc.encode_chat(&shortened.messages(cfg, None)?, cfg.enable_thinking)?;
        if ids.len() <= max {
            return Ok(TeacherPrompt {
                ids,
                truncated: true,
            });
        }
        if keep == 0 {
            break;
        }
        keep = keep.saturating_sub(ids.len() - max);
    }
    Err(Error::TeacherPrompt(format!(
        "the teacher prompt does not fit max_reprompt_len = {max} even without its {}",
        if is_demo { "demonstration" } else { "feedback" }
    )))
}

/// The SDPO math feedback on an attempt: empty when correct; otherwise a truncation message, a
/// format message when no `\boxed{}` answer was found, or (with `correctness_feedback`) the correct
/// answer.
pub fn math_feedback(
    correct: bool,
    has_answer: bool,
    truncated: bool,
    ground_truth: &str,
    correctness_feedback: bool,
) -> String {
    if correct {
        String::new()
    } else if truncated {
        "Your response was truncated because it exceeded the maximum length.".into()
    } else if !has_answer {
        "Your answer had the wrong format. The solution must be given in the format: \
         \\boxed{your_answer}."
            .into()
    } else if correctness_feedback {
        format!("Your answer is incorrect. The correct answer is {ground_truth}.")
    } else {
        String::new()
    }
}

/// Per-token self-distillation mask: token `t` of row `i` is active when the row has a teacher
/// context (and, for the `rlrt` variant, is correct). Returns one flat vector over all response
/// tokens given their per-row lengths.
pub fn sd_token_mask(
    contexts: &[TeacherContext],
    response_lens: &[usize],
    rlrt: bool,
) -> Vec<bool> {
    contexts
        .iter()
        .zip(response_lens)
        .flat_map(|(c, &n)| std::iter::repeat_n(c.active() && (!rlrt || c.correct), n))
        .collect()
}

/// Fractions logged under `self_distillation/*` for one step's contexts.
pub fn context_metrics(contexts: &[TeacherContext]) -> Vec<(String, f64)> {
    let n = contexts.len().max(1) as f64;
    let frac =
        |f: &dyn Fn(&TeacherContext) -> bool| contexts.iter().filter(|c| f(c)).count() as f64 / n;
    let mut groups: HashMap<&str, bool> = HashMap::new();
    for c in contexts {
        *groups.entry(&c.uid).or_default() |= c.correct;
    }
    let success_groups =
        groups.values().filter(|&&s| s).count() as f64 / groups.len().max(1) as f64;
    [
        ("success_group_fraction", success_groups),
        ("success_sample_fraction", frac(&|c| c.correct)),
        ("correct_sample_fraction", frac(&|c| c.correct)),
        (
            "feedback_available_fraction",
            frac(&|c| c.feedback_available),
        ),
        ("feedback_used_fraction", frac(&|c| c.feedback.is_some())),
        ("reprompt_sample_fraction", frac(&|c| c.active())),
    ]
    .into_iter()
    .map(|(k, v)| (format!("self_distillation/{k}"), v))
    .collect()
}

/// Teacher prompt ids of every row (empty for a row without context, or whose prompt does not
/// fit `max_reprompt_len` even without its demonstration) and the step's `self_distillation/*`
/// context metrics (fractions, truncated and dropped prompts).
fn teacher_prompts(
    contexts: &[TeacherContext],
    cfg: &ContextConfig,
    enc: &dyn PromptEncoder,
) -> Result<(Vec<Vec<u32>>, Metrics)> {
    let mut metrics: Metrics = context_metrics(contexts).into_iter().collect();
    let (mut cut, mut dropped) = (0usize, 0usize);
    let mut prompts = Vec::with_capacity(contexts.len());
    for c in contexts {
        if !c.active() {
            prompts.push(Vec::new());
            continue;
        }
        match encode_teacher_prompt(c, cfg, enc) {
            Ok(p) => {
                cut += usize::from(p.truncated);
                prompts.push(p.ids);
            }
            Err(_) => {
                dropped += 1;
                prompts.push(Vec::new());
            }
        }
    }
    metrics.insert(
        "self_distillation/teacher_prompt_truncated".into(),
        cut as f64,
    );
    metrics.insert(
        "self_distillation/teacher_prompt_dropped".into(),
        dropped as f64,
    );
    Ok((prompts, metrics))
}

const IM_START: &str = "<|im_start|>";
const IM_END: &str = "<|im_end|>";

/// The messages of a prompt rendered with a ChatML template (Qwen3's layout:
/// `<|im_start|>role\ncontent<|im_end|>\n` per message, then the `<|im_start|>assistant\n`
/// generation header, possibly with an empty thinking block); `None` when `text` is not in that
/// layout.
pub fn parse_chat_prompt(text: &str) -> Option<Vec<Message>> {
    let mut parts = text.split(IM_START);
    if !parts.next()?.trim().is_empty() {
        return None;
    }
    let mut messages = Vec::new();
    let mut header = false;
    for part in parts {
        if header {
            return None;
        }
        let (role, rest) = part.split_once('\n')?;
        match rest.split_once(IM_END) {
            Some((content, tail)) if tail.trim().is_empty() => {
                messages.push(Message::new(role, content));
            }
            Some(_) => return None,
            None if role == "assistant" => header = true,
            None => return None,
        }
    }
    (header && !messages.is_empty()).then_some(messages)
}

/// Teacher prompts of a batch of rollouts (and the step's context metrics): `text` holds each
/// row's prompt conversation and decoded response, `truncated[i]` whether row `i` hit the length
/// limit. The feedback on each row's own attempt is the math feedback.
pub fn rollout_teacher_prompts(
    batch: &RolloutBatch,
    text: &StepText,
    truncated: &[bool],
    correctness_feedback: bool,
    cfg: &ContextConfig,
    enc: &dyn PromptEncoder,
) -> Result<(Vec<Vec<u32>>, Metrics)> {
    let feedback: Vec<String> = (0..batch.len())
        .map(|i| {
            math_feedback(
                f64::from(batch.scores[i]) >= cfg.success_reward_threshold,
                text.responses[i].contains("\\boxed{"),
                truncated[i],
                batch.ground_truth[i].as_deref().unwrap_or(""),
                correctness_feedback,
            )
        })
        .collect();
    let rows: Vec<ContextRow<'_>> = (0..batch.len())
        .map(|i| ContextRow {
            uid: &batch.uids[i],
            messages: &text.messages[i],
            response_text: &text.responses[i],
            score: f64::from(batch.scores[i]),
            feedback: Some(feedback[i].as_str()),
            ground_truth: batch.ground_truth[i].as_deref(),
        })
        .collect();
    let contexts = build_contexts(&rows, cfg)?;
    teacher_prompts(&contexts, cfg, enc)
}

/// The conversation and response text of every row of a logged batch: the prompt decoded with
/// special tokens and parsed back into messages when it is in the ChatML layout (one user
/// message of the text without special tokens otherwise), the response without special tokens.
pub fn decode_rows(batch: &RolloutBatch, chat: &ChatTokenizer, origin: &str) -> Result<StepText> {
    let n = batch.len();
    let mut text = StepText {
        messages: Vec::with_capacity(n),
        responses: Vec::with_capacity(n),
    };
    for i in 0..n {
        let at = |what: &'static str| {
            move |source| Error::Decode {
                origin: origin.to_owned(),
                row: i,
                what,
                source: Box::new(source),
            }
        };
        let prompt = chat.decode(batch.prompt(i), false).map_err(at("prompt"))?;
        text.messages.push(match parse_chat_prompt(&prompt) {
            Some(m) => m,
            None => vec![Message::user(
                chat.decode(batch.prompt(i), true).map_err(at("prompt"))?,
            )],
        });
        text.responses.push(
            chat.decode(batch.response(i), true)
                .map_err(at("response"))?,
        );
    }
    Ok(text)
}

/// Refuses a batch that lacks what the context mode needs: the `ground_truth` column in
/// `reference` mode and for `correctness_feedback` in `sibling+feedback` mode.
pub fn check_columns(
    batch: &RolloutBatch,
    sd: &SelfDistillationSection,
    source: &str,
) -> Result<()> {
    let needs_truth = match sd.context.context {
        ContextMode::Reference => Some("context = \"reference\""),
        ContextMode::SiblingFeedback if sd.correctness_feedback => {
            Some("context = \"sibling+feedback\" with correctness_feedback")
        }
        _ => None,
    };
    if let Some(why) = needs_truth {
        if batch.ground_truth.iter().all(Option::is_none) {
            return Err(Error::Rollouts {
                origin: source.to_owned(),
                why: format!(
                    "[self_distillation] {why} needs the `ground_truth` column, which the data lacks"
                ),
            });
        }
        if let Some(i) = batch.ground_truth.iter().position(Option::is_none) {
            return Err(Error::Rollouts {
                origin: source.to_owned(),
                why: format!(
                    "row {i}: [self_distillation] {why} needs `ground_truth`, which is null"
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(text: &str) -> Vec<Message> {
        vec![Message::system("sys"), Message::user(text)]
    }

    fn row<'a>(uid: &'a str, m: &'a [Message], resp: &'a str, score: f64) -> ContextRow<'a> {
        ContextRow {
            uid,
            messages: m,
            response_text: resp,
            score,
            feedback: None,
            ground_truth: Some("42"),
        }
    }

    #[test]
    fn removes_thinking_spans() {
        assert_eq!(remove_thinking("<think>a\nb</think>\n\n x"), "x");
        assert_eq!(
            remove_thinking("p <think>1</think> q <think>2</think>r"),
            "p q r"
        );
        assert_eq!(remove_thinking("no think"), "no think");
        assert_eq!(remove_thinking("<think>open"), "<think>open");
    }

    #[test]
    fn formats_templates_in_one_pass() {
        let s = format_template("{a}-{b}{{x}}", &[("a", "{b}"), ("b", "2")]).unwrap();
        assert_eq!(s, "{b}-2{x}");
        assert!(format_template("{zz}", &[])
            .unwrap_err()
            .to_string()
            .contains("{zz}"));
        assert!(format_template("{a", &[("a", "")]).is_err());
        assert!(format_template("a}", &[]).is_err());
    }

    #[test]
    fn sibling_mode_picks_first_other_success() {
        let m = msgs("Q?");
        let rows = [
            row("g", &m, "wrong", 0.0),
            row("g", &m, "<think>hmm</think>\nright A", 1.0),
            row("g", &m, "right B", 1.0),
            row("h", &m, "alone", 1.0),
            row("h", &m, "bad", 0.0),
            row("k", &m, "none", 0.0),
        ];
        let cfg = ContextConfig::default();
        let c = build_contexts(&rows, &cfg).unwrap();
        assert_eq!(c[0].demo_row, Some(1));
        assert_eq!(c[0].demonstration.as_deref(), Some("right A"));
        assert_eq!(
            c[1].demo_row,
            Some(2),
            "a success never demonstrates itself"
        );
        assert_eq!(c[2].demo_row, Some(1));
        assert!(
            !c[3].active(),
            "the only success of its group has no demonstration"
        );
        assert_eq!(c[4].demo_row, Some(3));
        assert!(!c[5].active());
        assert_eq!(
            c[0].user_text(&cfg, None).unwrap(),
            "Q?\nCorrect solution:\n\nright A\n\nCorrectly solve the original question."
        );
        assert_eq!(c[5].user_text(&cfg, None).unwrap(), "Q?");
        let msgs = c[0].messages(&cfg, None).unwrap();
        assert_eq!(msgs[0], Message::system("sys"));
        assert_eq!(msgs.len(), 2);
        let mask = sd_token_mask(&c, &[1, 2, 0, 1, 1, 1], false);
        assert_eq!(mask, [true, true, true, false, true, false]);
        let mask = sd_token_mask(&c, &[1, 2, 0, 1, 1, 1], true);
        assert_eq!(mask, [false, true, true, false, false, false]);
        let m: HashMap<_, _> = context_metrics(&c).into_iter().collect();
        assert!((m["self_distillation/reprompt_sample_fraction"] - 4.0 / 6.0).abs() < 1e-12);
        assert!((m["self_distillation/success_sample_fraction"] - 0.5).abs() < 1e-12);
    }

    #[test]
    fn self_success_allowed_when_configured() {
        let m = msgs("Q");
        let rows = [row("g", &m, "a", 1.0), row("g", &m, "b", 0.0)];
        let cfg = ContextConfig {
            dont_reprompt_on_self_success: false,
            remove_thinking_from_demonstration: false,
            ..Default::default()
        };
        let c = build_contexts(&rows, &cfg).unwrap();
        assert_eq!(c[0].demo_row, Some(0));
    }

    #[test]
    fn reference_and_feedback_modes() {
        let m = msgs("Q");
        let mut rows = [
            row("g", &m, "x", 0.0),
            row("g", &m, "y", 1.0),
            row("h", &m, "z", 0.0),
        ];
        rows[0].feedback = Some("fb0");
        rows[2].feedback = Some("fb2");
        let cfg = ContextConfig {
            context: ContextMode::Reference,
            ..Default::default()
        };
        let c = build_contexts(&rows, &cfg).unwrap();
        assert!(c.iter().all(TeacherContext::active));
        assert_eq!(
            c[1].user_text(&cfg, None).unwrap(),
            "Q\nReference answer:\n\n42\n\nCorrectly solve the original question."
        );
        let cfg = ContextConfig {
            context: ContextMode::SiblingFeedback,
            ..Default::default()
        };
        let c = build_contexts(&rows, &cfg).unwrap();
        assert_eq!(c[0].demo_row, Some(1));
        assert_eq!(c[0].feedback, None, "feedback only without a solution");
        assert!(c[0].feedback_available);
        assert_eq!(c[2].feedback.as_deref(), Some("fb2"));
        assert_eq!(
            c[2].user_text(&cfg, None).unwrap(),
            "Q\nThe following is feedback from your unsuccessful earlier attempt:\n\nfb2\n\n\
             Correctly solve the original question."
        );
        let both = ContextConfig {
            environment_feedback_only_without_solution: false,
            ..cfg.clone()
        };
        let c = build_contexts(&rows, &both).unwrap();
        assert_eq!(c[0].feedback.as_deref(), Some("fb0"));
        let empty: [ContextRow<'_>; 1] = [ContextRow {
            messages: &[],
            ..rows[0]
        }];
        assert!(build_contexts(&empty, &cfg)
            .unwrap_err()
            .to_string()
            .contains("row 0"));
    }

    #[test]
    fn chatml_prompts_give_back_their_messages() {
        let qwen =
            "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nWhat is 1+1?\nThink.<|im_end|>\n\
                    <|im_start|>assistant\n<think>\n\n</think>\n\n";
        assert_eq!(
            parse_chat_prompt(qwen).unwrap(),
            [
                Message::system("sys"),
                Message::user("What is 1+1?\nThink.")
            ]
        );
        let plain = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(parse_chat_prompt(plain).unwrap(), [Message::user("Q")]);
        for bad in [
            "just text",
            "x<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n",
            "<|im_start|>user\nQ<|im_end|>\n",
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<|im_start|>user\nR",
            "<|im_start|>user\nQ<|im_end|>tail<|im_start|>assistant\n",
            "<|im_start|>assistant\n",
        ] {
            assert_eq!(parse_chat_prompt(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn math_feedback_messages() {
        assert_eq!(math_feedback(true, true, true, "1", true), "");
        assert!(math_feedback(false, false, true, "1", false).contains("truncated"));
        assert!(math_feedback(false, false, false, "1", false).contains("wrong format"));
        assert_eq!(
            math_feedback(false, true, false, "7", true),
            "Your answer is incorrect. The correct answer is 7."
        );
        assert_eq!(math_feedback(false, true, false, "7", false), "");
    }

    /// One token per character; the chat rendering is `<u>` + text + `<a>` (a stand-in template).
    struct CharEncoder;

    impl PromptEncoder for CharEncoder {
        fn encode_chat(&self, messages: &[Message], _: Option<bool>) -> Result<Vec<u32>> {
            let text: String = messages.iter().map(|m| m.content.as_str()).collect();
            let mut ids = vec![1];
            ids.extend(self.encode_text(&text)?);
            ids.push(2);
            Ok(ids)
        }
        fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
            Ok(text.chars().map(|c| c as u32).collect())
        }
        fn decode(&self, ids: &[u32]) -> Result<String> {
            Ok(ids.iter().map(|&i| char::from_u32(i).unwrap()).collect())
        }
    }

    #[test]
    fn over_long_prompts_lose_the_start_of_the_demonstration() {
        let m = [Message::user("Q")];
        let rows = [row("g", &m, "0123456789", 1.0), row("g", &m, "bad", 0.0)];
        let cfg = ContextConfig {
            reprompt_template: "{prompt}|{solution}|".into(),
            solution_template: "{successful_previous_attempt}".into(),
            max_reprompt_len: 10,
            ..Default::default()
        };
        let c = build_contexts(&rows, &cfg).unwrap();
        // Full: <u> Q | 0123456789 | <a> = 15 tokens.
        let p = encode_teacher_prompt(&c[1], &cfg, &CharEncoder).unwrap();
        assert!(p.truncated);
        assert_eq!(
            CharEncoder.decode(&p.ids[1..p.ids.len() - 1]).unwrap(),
            "Q|56789|"
        );
        assert_eq!(
            (p.ids[0], *p.ids.last().unwrap()),
            (1, 2),
            "header and end kept"
        );
        let right = ContextConfig {
            reprompt_truncation: Truncation::Right,
            ..cfg.clone()
        };
        let p = encode_teacher_prompt(&c[1], &right, &CharEncoder).unwrap();
        assert_eq!(p.ids.len(), 10);
        assert_ne!(
            *p.ids.last().unwrap(),
            2,
            "right truncation cuts the header"
        );
        // Fits: untouched.
        let p = encode_teacher_prompt(&c[0], &cfg, &CharEncoder).unwrap();
        assert!(!p.truncated);
        // Even an empty demonstration does not fit.
        let tight = ContextConfig {
            max_reprompt_len: 3,
            ..cfg
        };
        let e = encode_teacher_prompt(&c[1], &tight, &CharEncoder).unwrap_err();
        assert!(
            e.to_string().contains("even without its demonstration"),
            "{e}"
        );
    }
}
