//! The steps shared by `rlreplay generate` and `rlreplay eval`: load a policy and its chat
//! template, encode a prompt set, sample, decode and score.

use std::path::Path;

use rlreplay_model::{DType, Device, MemoryEstimate, Model, ModelConfig, Workload};

use crate::dataset::PromptItem;
use crate::error::{Error, Result};
use crate::scoring::{Answer, Scorer};
use rlreplay_model::generate::Decoder;
use rlreplay_sampling::chat::{ChatOptions, ChatTokenizer};
use rlreplay_sampling::engine::Generation;

/// A model ready for sampling, with its tokenizer and chat template.
pub struct Policy {
    /// The decoding snapshot of the model's weights.
    pub decoder: Decoder,
    /// The tokenizer and chat template.
    pub chat: ChatTokenizer,
    /// The weights holding NaN or infinite values, with how many each holds (a warning for the
    /// user: what depends on them is NaN).
    pub non_finite_weights: Vec<(String, usize)>,
}

impl Policy {
    /// Loads a Hugging Face model directory onto `device`, with the PEFT adapter of `adapter`
    /// when given (folded into the decoder's weights); the tokenizer files (`tokenizer.json`,
    /// `tokenizer_config.json`) come from `tokenizer_dir`, or from the model directory. Refused
    /// with the estimate, before any weight is read, when the weights and the decoder's copy do
    /// not fit in the device's available memory.
    pub fn load(
        model_dir: &Path,
        adapter: Option<&Path>,
        tokenizer_dir: Option<&Path>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let context = |source| Error::LoadModel {
            dir: model_dir.to_owned(),
            source,
        };
        let cfg = ModelConfig::from_hf_json(model_dir.join("config.json")).map_err(context)?;
        MemoryEstimate::new(&cfg, dtype, Workload::Sampling)
            .check(device)
            .map_err(context)?;
        let mut model = Model::load(model_dir, dtype, device).map_err(context)?;
        if let Some(dir) = adapter {
            model.load_adapter(dir).map_err(|source| Error::LoadModel {
                dir: dir.to_owned(),
                source,
            })?;
        }
        let non_finite_weights = model.non_finite_params()?;
        let decoder = Decoder::new(&model)?;
        let chat = ChatTokenizer::from_dir(tokenizer_dir.unwrap_or(model_dir))?;
        Ok(Self {
            decoder,
            chat,
            non_finite_weights,
        })
    }

    /// Renders and tokenizes every prompt.
    pub fn encode(&self, items: &[PromptItem], options: ChatOptions) -> Result<Vec<Vec<u32>>> {
        items
            .iter()
            .map(|it| {
                self.chat
                    .encode(&it.messages, options)
                    .map_err(|source| Error::Prompt {
                        index: it.index,
                        source,
                    })
            })
            .collect()
    }
}

/// One generated response, decoded and scored.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoredSample {
    /// The generation.
    pub generation: Generation,
    /// The response text, special tokens removed (what the reward sees).
    pub text: String,
    /// The reward, when the prompt has a ground truth and scoring is on.
    pub reward: Option<f64>,
    /// Why the reward is 0 without a verdict (time-out, unparsable gold), if so.
    pub reward_note: Option<String>,
    /// The answer the response votes for in maj@k.
    pub answer: Option<Answer>,
}

/// Decodes `generations` (of prompts `items`) and scores them when `scorer` is given.
pub fn score_generations(
    chat: &ChatTokenizer,
    items: &[PromptItem],
    generations: Vec<Generation>,
    scorer: Option<&Scorer>,
) -> Result<Vec<ScoredSample>> {
    generations
        .into_iter()
        .map(|g| {
            let item = &items[g.prompt];
            let text = chat.decode(&g.tokens, true)?;
            let (mut reward, mut reward_note, mut answer) = (None, None, None);
            if let Some(s) = scorer {
                answer = s.answer(&item.data_source, &text);
                if let Some(gt) = &item.ground_truth {
                    let out = s.score(&item.data_source, gt, &text);
                    reward = Some(out.reward);
                    reward_note = out
                        .error
                        .or_else(|| out.timed_out.then(|| "verifier time-out".to_owned()));
                }
            }
            Ok(ScoredSample {
                generation: g,
                text,
                reward,
                reward_note,
                answer,
            })
        })
        .collect()
}
