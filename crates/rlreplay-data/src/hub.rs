//! Hub paths: `hf://datasets/OWNER/NAME` (datasets) and `hf://OWNER/NAME` (models), optionally
//! `@REVISION`, resolved into the local Hugging Face cache through the `hf-hub` crate, downloading
//! only the files asked for. `HF_ENDPOINT`, `HF_HOME` and `HF_TOKEN` are honoured; when the hub
//! cannot be reached, files already in the cache are used.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};

/// Where and how to reach the hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubConfig {
    /// Hub URL (`HF_ENDPOINT`, default `https://huggingface.co`).
    pub endpoint: String,
    /// Cache directory (`$HF_HOME/hub`, default `~/.cache/huggingface/hub`).
    pub cache_dir: PathBuf,
    /// Access token (`HF_TOKEN`, else the token file next to the cache).
    pub token: Option<String>,
    /// Whether to draw download progress bars (on stderr, only when it is a terminal).
    pub progress: bool,
}

impl HubConfig {
    /// The configuration from `HF_ENDPOINT`, `HF_HOME` and `HF_TOKEN`.
    pub fn from_env() -> Self {
        let cache = Cache::from_env();
        let token = std::env::var("HF_TOKEN")
            .ok()
            .filter(|t| !t.trim().is_empty())
            .or_else(|| cache.token());
        Self {
            endpoint: std::env::var("HF_ENDPOINT")
                .ok()
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "https://huggingface.co".into())
                .trim_end_matches('/')
                .to_owned(),
            cache_dir: cache.path().clone(),
            token,
            progress: std::io::stderr().is_terminal(),
        }
    }
}

/// What a hub path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HubKind {
    /// `hf://datasets/OWNER/NAME`.
    Dataset,
    /// `hf://OWNER/NAME`.
    Model,
}

/// A parsed hub path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubPath {
    /// Dataset or model.
    pub kind: HubKind,
    /// `OWNER/NAME`.
    pub repo_id: String,
    /// Branch, tag or commit (default `main`).
    pub revision: String,
}

impl HubPath {
    /// Parses `hf://datasets/OWNER/NAME[@REV]` or `hf://OWNER/NAME[@REV]`; `None` when `spec` is not
    /// a hub path.
    pub fn parse(spec: &str) -> Option<Result<HubPath>> {
        let rest = spec.strip_prefix("hf://")?;
        let (rest, revision) = match rest.split_once('@') {
            Some((r, rev)) => (r, rev.to_owned()),
            None => (rest, "main".to_owned()),
        };
        let (kind, id) = match rest.strip_prefix("datasets/") {
            Some(id) => (HubKind::Dataset, id),
            None => (HubKind::Model, rest),
        };
        let id = id.trim_end_matches('/');
        let parts: Vec<&str> = id.split('/').collect();
        if parts.len() != 2 || parts.iter().any(|p| p.is_empty()) || revision.is_empty() {
            return Some(Err(anyhow::anyhow!(
                "invalid hub path `{spec}`: expected hf://datasets/OWNER/NAME or hf://OWNER/NAME (optionally @REVISION)"
            )));
        }
        Some(Ok(HubPath {
            kind,
            repo_id: id.to_owned(),
            revision,
        }))
    }

    fn repo(&self) -> Repo {
        let t = match self.kind {
            HubKind::Dataset => RepoType::Dataset,
            HubKind::Model => RepoType::Model,
        };
        Repo::with_revision(self.repo_id.clone(), t, self.revision.clone())
    }

    fn display(&self) -> String {
        match self.kind {
            HubKind::Dataset => format!("hf://datasets/{}@{}", self.repo_id, self.revision),
            HubKind::Model => format!("hf://{}@{}", self.repo_id, self.revision),
        }
    }

    /// Downloads (or finds in the cache) the repository files whose names satisfy `wanted`;
    /// returns `(name in repo, local path)` sorted by name. Fails when none matches.
    pub fn download(
        &self,
        cfg: &HubConfig,
        wanted: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<(String, PathBuf)>> {
        let api = ApiBuilder::from_cache(Cache::new(cfg.cache_dir.clone()))
            .with_endpoint(cfg.endpoint.clone())
            .with_token(cfg.token.clone())
            .with_progress(cfg.progress)
            .build()
            .context("starting the hub client")?;
        let repo = api.repo(self.repo());
        let names = match repo.info() {
            Ok(info) => info
                .siblings
                .into_iter()
                .map(|s| s.rfilename)
                .collect::<Vec<_>>(),
            Err(e) => {
                // Offline: use the cached snapshot of this revision, if any.
                let cached = self.cached_files(&cfg.cache_dir);
                if cached.is_empty() {
                    return Err(anyhow::Error::new(e).context(format!(
                        "{}: cannot list the repository at {} (and nothing is cached in {})",
                        self.display(),
                        cfg.endpoint,
                        cfg.cache_dir.display()
                    )));
                }
                eprintln!(
                    "warning: {}: hub unreachable ({e}); using the cached files",
                    self.display()
                );
                let mut out: Vec<_> = cached.into_iter().filter(|(n, _)| wanted(n)).collect();
                out.sort();
                if out.is_empty() {
                    bail!("{}: no cached file matches", self.display());
                }
                return Ok(out);
            }
        };
        let mut names: Vec<String> = names.into_iter().filter(|n| wanted(n)).collect();
        names.sort();
        if names.is_empty() {
            bail!("{}: no file in the repository matches", self.display());
        }
        if cfg.progress && names.len() > 1 {
            eprintln!("{}: {} file(s)", self.display(), names.len());
        }
        names
            .into_iter()
            .map(|n| {
                let p = repo
                    .get(&n)
                    .with_context(|| format!("{}: downloading {n}", self.display()))?;
                Ok((n, p))
            })
            .collect()
    }

    /// Files of this revision's cached snapshot, as `(name in repo, path)`.
    fn cached_files(&self, cache_dir: &Path) -> Vec<(String, PathBuf)> {
        let base = cache_dir.join(self.repo().folder_name());
        let Ok(commit) = std::fs::read_to_string(base.join("refs").join(&self.revision)) else {
            return Vec::new();
        };
        let snap = base.join("snapshots").join(commit.trim());
        let mut out = Vec::new();
        let mut stack = vec![snap.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if let Ok(rel) = p.strip_prefix(&snap) {
                    out.push((rel.to_string_lossy().replace('\\', "/"), p));
                }
            }
        }
        out
    }
}

/// Resolves a hub path to the local snapshot directory holding the files that satisfy `wanted`
/// (for example a model's `config.json`, `*.safetensors` and `tokenizer.json`), using the
/// environment's hub settings. A local path is returned unchanged.
pub fn resolve_hub_path(spec: &str, wanted: &dyn Fn(&str) -> bool) -> Result<PathBuf> {
    let Some(hub) = HubPath::parse(spec) else {
        return Ok(PathBuf::from(spec));
    };
    let hub = hub?;
    let files = hub.download(&HubConfig::from_env(), wanted)?;
    let (name, path) = &files[0];
    let mut dir = path.clone();
    for _ in Path::new(name).components() {
        dir.pop();
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hub_paths() {
        let d = HubPath::parse("hf://datasets/ftajwar/rollouts")
            .unwrap()
            .unwrap();
        assert_eq!(d.kind, HubKind::Dataset);
        assert_eq!(d.repo_id, "ftajwar/rollouts");
        assert_eq!(d.revision, "main");
        let m = HubPath::parse("hf://Qwen/Qwen3-0.6B@v1").unwrap().unwrap();
        assert_eq!(
            (m.kind, m.repo_id.as_str(), m.revision.as_str()),
            (HubKind::Model, "Qwen/Qwen3-0.6B", "v1")
        );
        assert!(HubPath::parse("data/run").is_none());
        assert!(HubPath::parse("hf://datasets/onlyowner").unwrap().is_err());
        assert!(HubPath::parse("hf://a/b/c").unwrap().is_err());
    }
}
