//! The configuration as a TOML document: a file read with its `--set` overrides and moved keys,
//! the keys of the other kinds of source refused, and the resolved form written back.

use std::path::Path;

use serde::Deserialize;

use super::{Config, SourceKind};
use crate::error::{Error, Result};

/// Keys that moved, `(old, new)` as dotted paths: they keep working for one release, with a
/// warning naming the new key. Applied in order (a table moves before keys move into it).
pub const MOVED: &[(&str, &str)] = &[
    ("algorithm.temperature", "rollout.temperature"),
    (
        "self_distillation.success_reward_threshold",
        "algorithm.success_reward_threshold",
    ),
    ("checkpoint.save_freq", "trainer.save_freq"),
    ("checkpoint.keep", "trainer.keep"),
    ("run.dir", "trainer.dir"),
    ("run.seed", "trainer.seed"),
    ("run.threads", "trainer.threads"),
    ("model.toy", "model.random"),
    ("model.init_seed", "model.random.seed"),
    ("model.warmup_steps", "toy.warmup_steps"),
    ("model.warmup_lr", "toy.warmup_lr"),
    (
        "model.warmup_correct_fraction",
        "toy.warmup_correct_fraction",
    ),
];

impl Config {
    /// Reads a configuration file for a `source` front and applies `section.key=value`
    /// overrides; returns it with the deprecation warnings of moved keys.
    ///
    /// Values are parsed as TOML (`1e-6`, `true`, `"text"`, `[0.9, 0.95]`); a value that is not
    /// valid TOML is taken as a string, so `--set model.path=/some/dir` works unquoted.
    pub fn load(
        path: &Path,
        overrides: &[String],
        source: SourceKind,
    ) -> Result<(Self, Vec<String>)> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::ReadConfig {
            path: path.to_owned(),
            source,
        })?;
        Self::parse_reporting(&text, overrides, source).map_err(|e| Error::InConfig {
            path: path.to_owned(),
            source: Box::new(e),
        })
    }

    /// Parses configuration text for a `source` front and applies overrides (see
    /// [`Config::load`]); deprecation warnings are dropped.
    pub fn parse(text: &str, overrides: &[String], source: SourceKind) -> Result<Self> {
        Ok(Self::parse_reporting(text, overrides, source)?.0)
    }

    /// [`Config::parse`], with the deprecation warnings of moved keys ([`MOVED`]).
    pub fn parse_reporting(
        text: &str,
        overrides: &[String],
        source: SourceKind,
    ) -> Result<(Self, Vec<String>)> {
        let (doc, warnings) = edit_document(text, overrides, MOVED)?;
        for other in SourceKind::ALL.into_iter().filter(|&k| k != source) {
            for key in other.keys() {
                if lookup(&doc, key).is_some() {
                    return Err(Error::config(
                        *key,
                        format!(
                            "`{key}` belongs to `{}`: `{}` does not read it",
                            other.command(),
                            source.command()
                        ),
                    ));
                }
            }
        }
        let mut cfg = typed(text, &doc, overrides)?;
        cfg.source = source;
        cfg.resolve();
        cfg.validate()?;
        Ok((cfg, warnings))
    }

    /// Writes out the defaults that depend on the kind of source and the values other sections
    /// copy.
    fn resolve(&mut self) {
        if self.source.draws_prompts() {
            self.data.task = Some(self.data.task());
        }
        if let Some(steps) = self.source.default_steps() {
            self.trainer.total_training_steps.get_or_insert(steps);
        }
        self.self_distillation.context.success_reward_threshold =
            self.algorithm.success_reward_threshold;
    }

    /// The resolved configuration as TOML text: every default written out, without the keys of
    /// the other kind of source.
    pub fn to_toml(&self) -> Result<String> {
        let mut doc = toml::Table::try_from(self)?;
        for other in SourceKind::ALL.into_iter().filter(|&k| k != self.source) {
            for key in other.keys() {
                remove(&mut doc, key);
            }
        }
        Ok(toml::to_string_pretty(&doc)?)
    }
}

/// The configuration of the edited document `doc` (the file `text` with the `overrides` applied).
/// A key or value the schema refuses is reported where it came from: the override that brought
/// it, or the user's own file with its line (line numbers of the edited document would point
/// nowhere in the file).
fn typed(text: &str, doc: &toml::Table, overrides: &[String]) -> Result<Config> {
    let merged = match toml::from_str::<Config>(&toml::to_string(doc)?) {
        Ok(cfg) => return Ok(cfg),
        Err(e) => e,
    };
    // Deserialized from the table rather than from text, an error names its key, not a line.
    let de = |doc: &toml::Table| Config::deserialize(doc.clone());
    let (file, moved) = edit_document(text, &[], MOVED)?;
    if let Err(e) = de(&file) {
        // The file's own text locates the error when no moved key changes it.
        if moved.is_empty() {
            if let Err(own) = toml::from_str::<Config>(text) {
                return Err(own.into());
            }
        }
        return Err(e.into());
    }
    for (i, o) in overrides.iter().enumerate() {
        if let Err(e) = de(&edit_document(text, &overrides[..=i], MOVED)?.0) {
            return Err(Error::Override {
                spec: o.clone(),
                message: e.to_string().trim_end().to_owned(),
            });
        }
    }
    Err(merged.into())
}

/// The value at a dotted `path` of a TOML document.
fn lookup<'a>(doc: &'a toml::Table, path: &str) -> Option<&'a toml::Value> {
    let mut parts = path.split('.');
    let mut cur = doc.get(parts.next()?)?;
    for p in parts {
        cur = cur.as_table()?.get(p)?;
    }
    Some(cur)
}

/// Removes the value at a dotted `path` and returns it; a table left empty by the removal goes
/// too.
fn remove(doc: &mut toml::Table, path: &str) -> Option<toml::Value> {
    match path.split_once('.') {
        None => doc.remove(path),
        Some((head, rest)) => {
            let inner = doc.get_mut(head)?.as_table_mut()?;
            let value = remove(inner, rest);
            if inner.is_empty() {
                doc.remove(head);
            }
            value
        }
    }
}

/// Sets the value at a dotted `path`, creating the tables on the way.
fn insert(doc: &mut toml::Table, path: &str, value: toml::Value) -> Result<()> {
    let mut table = doc;
    let parts: Vec<&str> = path.split('.').collect();
    for p in &parts[..parts.len() - 1] {
        table = table
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .ok_or_else(|| Error::config(*p, format!("`{p}` is not a section")))?;
    }
    table.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

/// Configuration text with the deprecated keys of `moved` in their new places and then the
/// `--set` overrides applied (an override of a deprecated key sets its new key), and the
/// deprecation warnings.
pub fn edit_document(
    text: &str,
    overrides: &[String],
    moved: &[(&str, &str)],
) -> Result<(toml::Table, Vec<String>)> {
    let mut doc: toml::Table = toml::from_str(text)?;
    let mut warnings = move_deprecated(&mut doc, moved)?;
    for o in overrides {
        let spec = match o.split_once('=') {
            Some((key, value)) => match renamed(key.trim(), moved) {
                Some(new) => {
                    warnings.push(deprecation(key.trim(), &new));
                    format!("{new}={value}")
                }
                None => o.clone(),
            },
            None => o.clone(),
        };
        apply_override(&mut doc, &spec)?;
    }
    Ok((doc, warnings))
}

/// The new place of `key` when it is, or lies under, a deprecated key of `moved`.
fn renamed(key: &str, moved: &[(&str, &str)]) -> Option<String> {
    moved.iter().find_map(|(old, new)| {
        if key == *old {
            Some(new.to_string())
        } else {
            key.strip_prefix(old)
                .and_then(|rest| rest.strip_prefix('.'))
                .map(|rest| format!("{new}.{rest}"))
        }
    })
}

fn deprecation(old: &str, new: &str) -> String {
    format!("{old} is deprecated and will be removed in the next release: use {new}")
}

/// Moves every deprecated key `old` of `moved` in `doc` to its `new` place and returns one warning
/// for each; both keys set to different values is an error.
pub fn move_deprecated(doc: &mut toml::Table, moved: &[(&str, &str)]) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    for (old, new) in moved {
        let Some(value) = remove(doc, old) else {
            continue;
        };
        match lookup(doc, new) {
            Some(v) if *v != value => {
                return Err(Error::config(
                    *new,
                    format!("{old} = {value} and {new} = {v} are both set: keep only {new}"),
                ))
            }
            _ => insert(doc, new, value)?,
        }
        warnings.push(deprecation(old, new));
    }
    Ok(warnings)
}

/// Applies one `--set section.key=value` override to a TOML document. The value is parsed as TOML;
/// text that is not TOML is taken as a string.
pub fn apply_override(doc: &mut toml::Table, spec: &str) -> Result<()> {
    let (key, raw) = spec.split_once('=').ok_or_else(|| override_syntax(spec))?;
    let key = key.trim();
    if key.split('.').count() < 2 || key.split('.').any(str::is_empty) {
        return Err(override_syntax(spec));
    }
    insert(doc, key, parse_value(raw.trim())).map_err(|e| Error::Override {
        spec: spec.to_owned(),
        message: e.to_string(),
    })
}

/// The error of an override that is not `section.key=value`.
fn override_syntax(spec: &str) -> Error {
    Error::Override {
        spec: spec.to_owned(),
        message: "expected section.key=value".into(),
    }
}

fn parse_value(raw: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()))
}
