//! Chat prompts rendered with a model's own Jinja chat template (the `chat_template` of its
//! `tokenizer_config.json`), as Hugging Face `apply_chat_template` renders them.

use std::path::Path;

use minijinja::{context, Environment, ErrorKind, Value};
use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;

use crate::error::{Error, Result};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl Message {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A `user` message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// A `system` message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
}

/// Options of one rendering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatOptions {
    /// Append the assistant header that starts the model's turn.
    pub add_generation_prompt: bool,
    /// Qwen3's thinking switch; `None` leaves the variable undefined (the template's default).
    pub enable_thinking: Option<bool>,
}

impl Default for ChatOptions {
    fn default() -> Self {
        Self {
            add_generation_prompt: true,
            enable_thinking: None,
        }
    }
}

/// A compiled chat template with the special-token strings it may reference.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

const TEMPLATE_NAME: &str = "chat";

fn raise_exception(msg: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
}

/// A special token of `tokenizer_config.json`: a plain string or an `AddedToken` object.
fn token_string(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

impl ChatTemplate {
    /// Compiles a template source. Whitespace control is Hugging Face's (`trim_blocks`,
    /// `lstrip_blocks`); Python string methods (`startswith`, `split`, `strip`, …) are available.
    pub fn from_source(
        source: &str,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(TEMPLATE_NAME.to_owned(), source.to_owned())
            .map_err(Error::Compile)?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// Reads the `chat_template` of a `tokenizer_config.json` (a string, or a list of named
    /// templates of which `default` is taken), with its `bos_token` and `eos_token`.
    pub fn from_tokenizer_config(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        let config: serde_json::Value =
            serde_json::from_str(&text).map_err(|source| Error::Json {
                path: path.to_owned(),
                source,
            })?;
        let source = match config.get("chat_template") {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str())
                .map(str::to_owned)
                .ok_or_else(|| Error::NoDefaultTemplate {
                    path: path.to_owned(),
                })?,
            Some(_) => {
                return Err(Error::TemplateType {
                    path: path.to_owned(),
                })
            }
            None => {
                return Err(Error::NoChatTemplate {
                    path: path.to_owned(),
                })
            }
        };
        Self::from_source(
            &source,
            token_string(config.get("bos_token")),
            token_string(config.get("eos_token")),
        )
        .map_err(|e| Error::InFile {
            path: path.to_owned(),
            source: Box::new(e),
        })
    }

    /// Renders a conversation to the prompt text.
    pub fn render(&self, messages: &[Message], options: ChatOptions) -> Result<String> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(Error::Render)?;
        let thinking = options
            .enable_thinking
            .map(Value::from)
            .unwrap_or(Value::UNDEFINED);
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => options.add_generation_prompt,
                enable_thinking => thinking,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            })
            .map_err(Error::Render)
    }
}

/// A chat template with the tokenizer that turns its renderings into token ids.
pub struct ChatTokenizer {
    /// The template.
    pub template: ChatTemplate,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
}

impl ChatTokenizer {
    /// Loads `tokenizer.json` and `tokenizer_config.json` from a model or tokenizer directory.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let tok_path = dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&tok_path).map_err(|error| Error::LoadTokenizer {
            path: tok_path.clone(),
            error,
        })?;
        let template = ChatTemplate::from_tokenizer_config(&dir.join("tokenizer_config.json"))?;
        Ok(Self {
            template,
            tokenizer,
        })
    }

    /// Renders a conversation and tokenizes it without adding special tokens (as verl does).
    pub fn encode(&self, messages: &[Message], options: ChatOptions) -> Result<Vec<u32>> {
        let text = self.template.render(messages, options)?;
        self.encode_text(&text)
    }

    /// Tokenizes text without adding special tokens.
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(Error::Tokenize)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes token ids to text; special tokens are dropped when `skip_special` is set.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.tokenizer
            .decode(ids, skip_special)
            .map_err(Error::Decode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_python_string_methods_and_options() {
        let t = ChatTemplate::from_source(
            "{% for m in messages %}{{ m.content.strip().split(',')[-1] }}|{% endfor %}\
             {% if add_generation_prompt %}G{% endif %}\
             {% if enable_thinking is defined and enable_thinking is false %}N{% endif %}",
            None,
            None,
        )
        .unwrap();
        let msgs = [Message::user("  a,b  ")];
        let out = t
            .render(
                &msgs,
                ChatOptions {
                    add_generation_prompt: true,
                    enable_thinking: Some(false),
                },
            )
            .unwrap();
        assert_eq!(out, "b|GN");
        let out = t
            .render(
                &msgs,
                ChatOptions {
                    add_generation_prompt: false,
                    enable_thinking: None,
                },
            )
            .unwrap();
        assert_eq!(out, "b|");
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::from_source("{{ raise_exception('bad role') }}", None, None).unwrap();
        let err = t.render(&[], ChatOptions::default()).unwrap_err();
        assert!(format!("{err:#}").contains("bad role"));
    }

    #[test]
    fn bad_template_is_an_error() {
        assert!(ChatTemplate::from_source("{% if %}", None, None).is_err());
    }
}
