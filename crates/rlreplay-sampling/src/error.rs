//! Errors of the sampling crate.

use std::path::PathBuf;

/// Every error the sampling engine and the chat templates report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file cannot be read.
    #[error("reading {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A JSON file does not parse.
    #[error("{} is not valid JSON", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
    /// `tokenizer_config.json` has no `chat_template`.
    #[error("{} has no `chat_template`", path.display())]
    NoChatTemplate {
        /// The tokenizer configuration.
        path: PathBuf,
    },
    /// The `chat_template` list of `tokenizer_config.json` has no template named `default`.
    #[error("{}: `chat_template` is a list without a `default` entry", path.display())]
    NoDefaultTemplate {
        /// The tokenizer configuration.
        path: PathBuf,
    },
    /// The `chat_template` of `tokenizer_config.json` is neither a string nor a list.
    #[error("{}: `chat_template` is neither a string nor a list", path.display())]
    TemplateType {
        /// The tokenizer configuration.
        path: PathBuf,
    },
    /// An error of the template read from a file.
    #[error("in {}", path.display())]
    InFile {
        /// The file holding the template.
        path: PathBuf,
        /// What went wrong with it.
        source: Box<Error>,
    },
    /// The chat template does not compile.
    #[error("chat template does not compile: {0:#}")]
    Compile(minijinja::Error),
    /// Rendering the chat template failed (a `raise_exception` of the template included).
    #[error("rendering the chat template failed: {0:#}")]
    Render(minijinja::Error),
    /// `tokenizer.json` cannot be loaded.
    #[error("loading {}: {error}", path.display())]
    LoadTokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// The tokenizer library's error.
        error: tokenizers::Error,
    },
    /// The tokenizer failed to encode a text.
    #[error("tokenizing failed: {0}")]
    Tokenize(tokenizers::Error),
    /// The tokenizer failed to decode token ids.
    #[error("decoding failed: {0}")]
    Decode(tokenizers::Error),
    /// The temperature is negative or not finite.
    #[error("temperature must be >= 0, got {0}")]
    Temperature(f32),
    /// `top_p` is outside `(0, 1]`.
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
    /// `max_new_tokens` is 0.
    #[error("max_new_tokens must be >= 1")]
    MaxNewTokens,
    /// Zero samples per prompt were asked for.
    #[error("the number of samples per prompt must be >= 1")]
    NoSamples,
    /// A prompt without tokens.
    #[error("prompt {prompt} is empty")]
    EmptyPrompt {
        /// The prompt's index.
        prompt: usize,
    },
    /// A prompt that fills the model's context.
    #[error("prompt {prompt} has {tokens} tokens; the model's context is {context}")]
    PromptTooLong {
        /// The prompt's index.
        prompt: usize,
        /// Its number of tokens.
        tokens: usize,
        /// The model's `max_position_embeddings`.
        context: usize,
    },
    /// The model failed (a decode step, a KV-cache copy).
    #[error(transparent)]
    Model(#[from] rlreplay_model::Error),
}

/// Result type of the sampling crate.
pub type Result<T> = std::result::Result<T, Error>;
