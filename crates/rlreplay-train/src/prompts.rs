//! Prompt sets and their rewards: the training and validation prompts (files, or the toy task)
//! rendered with the chat template, and the reward that enters training.

use rlreplay_eval::dataset::{read_prompts, PromptItem};
use rlreplay_reward::RewardOutcome;
use rlreplay_sampling::chat::{ChatOptions, ChatTokenizer, Message};

use crate::config::{Config, Task};
use crate::error::{Error, Result};
use crate::toy;

/// One prompt ready for generation.
#[derive(Debug, Clone)]
pub struct Prompt {
    /// The prompt as read.
    pub item: PromptItem,
    /// Its chat-templated token ids.
    pub ids: Vec<u32>,
}

/// Why a reward could not be computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RewardFailure {
    /// The reward function failed (unparsable reference, non-finite value).
    Error,
    /// The reward function ran out of time.
    Timeout,
}

/// The reward that enters training: the outcome's reward, or 0 with the reason when it errored,
/// timed out or is not finite.
pub fn reward_of(outcome: &RewardOutcome) -> (f64, Option<RewardFailure>) {
    if outcome.timed_out {
        (0.0, Some(RewardFailure::Timeout))
    } else if outcome.error.is_some() || !outcome.reward.is_finite() {
        (0.0, Some(RewardFailure::Error))
    } else {
        (outcome.reward, None)
    }
}

/// The toy task's prompts as prompt items.
fn toy_items(problems: &[toy::Problem]) -> Vec<PromptItem> {
    problems
        .iter()
        .enumerate()
        .map(|(i, p)| PromptItem {
            index: i,
            data_source: "toy".into(),
            messages: vec![Message::user(p.prompt.clone())],
            ground_truth: Some(p.answer.clone()),
        })
        .collect()
}

/// The training prompts of an online run (`[data] train_files` or the toy task), at most
/// `train_max_samples`, encoded; over-long prompts are dropped (or an error naming the prompt
/// when `filter_overlong_prompts` is off).
pub fn training_prompts(cfg: &Config, chat: &ChatTokenizer) -> Result<Vec<Prompt>> {
    let mut items = match (cfg.data.task(), &cfg.data.train_files) {
        (Task::Files, Some(path)) => read_prompts(path)?,
        (Task::Files, None) => {
            return Err(Error::config(
                "data.train_files",
                "[data] task = \"files\" needs data.train_files",
            ))
        }
        (Task::Toy, _) => toy_items(&cfg.toy.split()?.0),
    };
    if cfg.data.train_max_samples > 0 {
        items.truncate(cfg.data.train_max_samples);
    }
    encode(cfg, chat, items, "training")
}

/// The validation prompts: `[data] val_files`, else (online toy task) the toy task's; encoded as
/// [`training_prompts`] are.
pub fn validation_prompts(cfg: &Config, chat: &ChatTokenizer) -> Result<Vec<Prompt>> {
    let items = match &cfg.data.val_files {
        Some(path) => read_prompts(path)?,
        None if cfg.prompt_task() == Some(Task::Toy) => toy_items(&cfg.toy.split()?.1),
        None => Vec::new(),
    };
    encode(cfg, chat, items, "validation")
}

/// Whether the configuration has validation prompts.
pub fn has_validation_prompts(cfg: &Config) -> bool {
    cfg.data.val_files.is_some() || cfg.prompt_task() == Some(Task::Toy)
}

fn encode(
    cfg: &Config,
    chat: &ChatTokenizer,
    items: Vec<PromptItem>,
    what: &'static str,
) -> Result<Vec<Prompt>> {
    let options = ChatOptions {
        add_generation_prompt: true,
        enable_thinking: cfg.data.enable_thinking,
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let ids = chat.encode(&item.messages, options)?;
        if ids.len() > cfg.data.max_prompt_length {
            if cfg.data.filter_overlong_prompts {
                continue;
            }
            return Err(Error::PromptTooLong {
                set: what,
                index: item.index,
                tokens: ids.len(),
                max: cfg.data.max_prompt_length,
            });
        }
        out.push(Prompt { item, ids });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlreplay_reward::RewardDispatch;

    #[test]
    fn failed_rewards_score_zero_and_are_classified() {
        let ok = RewardOutcome {
            reward: 1.0,
            timed_out: false,
            error: None,
        };
        assert_eq!(reward_of(&ok), (1.0, None));
        let slow = RewardOutcome {
            timed_out: true,
            ..ok.clone()
        };
        assert_eq!(reward_of(&slow), (0.0, Some(RewardFailure::Timeout)));
        let bad = RewardOutcome {
            error: Some("no answer in the reference".into()),
            ..ok.clone()
        };
        assert_eq!(reward_of(&bad), (0.0, Some(RewardFailure::Error)));
        let nan = RewardOutcome {
            reward: f64::NAN,
            ..ok
        };
        assert_eq!(reward_of(&nan).1, Some(RewardFailure::Error));
        // A reference the verifier cannot parse is an error, not a crash.
        let d = RewardDispatch::default();
        assert_eq!(reward_of(&d.score("toy", "", "\\boxed{3}")).0, 0.0);
    }
}
