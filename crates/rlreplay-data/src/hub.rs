//! Hub paths: `hf://datasets/OWNER/NAME` (datasets) and `hf://OWNER/NAME` (models), optionally
//! `@REVISION`, resolved into the local Hugging Face cache, downloading only the files asked for.
//! `HF_ENDPOINT`, `HF_HOME` and `HF_TOKEN` are honoured; when the hub cannot be reached, files
//! already in the cache are used.
//!
//! The endpoint is not trusted: the repository id and revision are checked before any request,
//! and every name the endpoint sends that becomes part of a cache path (the listed file names,
//! the commit, each file's ETag) is checked before anything is written, so that every file
//! written stays inside the cache. The cache layout is the Hugging Face one
//! (`REPO/blobs/ETAG`, `REPO/snapshots/COMMIT/NAME` linking to the blob, `REPO/refs/REVISION`),
//! shared with `huggingface_hub` and `hf-hub`. The files are fetched here rather than by `hf-hub`
//! because `hf-hub` 0.4 joins the server's ETag and commit headers and the listed names into
//! cache paths unchecked.

use crate::error::{IoContext, IoError};
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hf_hub::{Cache, Repo, RepoType};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::Deserialize;

use crate::error::{Error, Result};

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
    /// The longest a listing or a file's headers may take, and the fixed part of a download's
    /// deadline (default 120 s).
    pub request_timeout: Duration,
    /// The slowest average rate a download may keep, in bytes per second: a file of `S` bytes
    /// must arrive within `request_timeout + S / min_rate` (default 64 KiB/s).
    pub min_rate: u64,
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
            request_timeout: Duration::from_secs(120),
            min_rate: 64 << 10,
        }
    }

    /// The deadline of a download of `size` bytes (of the fixed part alone when unknown).
    fn download_deadline(&self, size: Option<u64>) -> Duration {
        let rate = self.min_rate.max(1) as f64;
        let body =
            Duration::try_from_secs_f64(size.unwrap_or(0) as f64 / rate).unwrap_or(Duration::MAX);
        self.request_timeout.saturating_add(body)
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

/// Longest accepted owner or repository name (the hub's own limit).
const MAX_NAME: usize = 96;
/// Longest accepted revision.
const MAX_REVISION: usize = 256;
/// Longest accepted file name in a repository.
const MAX_FILE_NAME: usize = 1024;

/// Checks one part (owner or name) of a repository id by the hub's rules: ASCII letters, digits,
/// `-`, `_` and `.`, without `--` or `..`, neither starting nor ending with `-` or `.`, at most 96
/// characters.
fn check_repo_part(part: &str) -> std::result::Result<(), String> {
    if part.is_empty() {
        return Err("an empty owner or name".into());
    }
    if part.len() > MAX_NAME {
        return Err(format!("`{part}` is longer than {MAX_NAME} characters"));
    }
    if let Some(c) = part
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "`{part}` holds {c:?}; only letters, digits, `-`, `_` and `.` are allowed"
        ));
    }
    if part.contains("--") || part.contains("..") {
        return Err(format!("`{part}` holds `--` or `..`"));
    }
    if part.starts_with(['-', '.']) || part.ends_with(['-', '.']) {
        return Err(format!("`{part}` starts or ends with `-` or `.`"));
    }
    Ok(())
}

/// Checks a revision (branch, tag or commit): `/`-separated segments of ASCII letters, digits,
/// `-`, `_` and `.`, none empty, `.` or `..`.
fn check_revision(rev: &str) -> std::result::Result<(), String> {
    if rev.is_empty() || rev.len() > MAX_REVISION {
        return Err(format!(
            "the revision must have 1 to {MAX_REVISION} characters"
        ));
    }
    if let Some(c) = rev
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')))
    {
        return Err(format!(
            "the revision `{rev}` holds {c:?}; only letters, digits, `-`, `_`, `.` and `/` are allowed"
        ));
    }
    if rev
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(format!(
            "the revision `{rev}` has an empty, `.` or `..` segment"
        ));
    }
    Ok(())
}

/// Checks a file name listed by a repository before it becomes a path inside the cache: a
/// relative, normalised `/`-separated path (no leading `/`, no empty, `.` or `..` segment, no
/// backslash, no drive prefix, no control character), at most 1024 bytes.
pub fn check_file_name(name: &str) -> std::result::Result<(), String> {
    let why = if name.is_empty() {
        "is empty"
    } else if name.len() > MAX_FILE_NAME {
        "is longer than 1024 bytes"
    } else if name.starts_with('/') {
        "is an absolute path"
    } else if name.contains('\\') {
        "holds a backslash"
    } else if name.chars().any(char::is_control) {
        "holds a control character"
    } else if name.split('/').any(|s| s == "..") {
        "has a `..` segment"
    } else if name.split('/').any(|s| s.is_empty() || s == ".") {
        "is not normalised (an empty or `.` segment)"
    } else if name.as_bytes().get(1) == Some(&b':') && name.as_bytes()[0].is_ascii_alphabetic() {
        "starts with a drive prefix"
    } else {
        return Ok(());
    };
    Err(format!("the file name {name:?} {why}"))
}

/// Checks a commit id sent by the hub: 40 to 64 hexadecimal digits.
fn check_commit(sha: &str) -> std::result::Result<(), String> {
    if (40..=64).contains(&sha.len()) && sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(format!(
            "the commit id {sha:?} is not 40 to 64 hexadecimal digits"
        ))
    }
}

/// The blob name for an ETag sent by the hub (quotes and a weak `W/` prefix removed): ASCII
/// letters, digits, `-` and `_`, at most 128 characters (hub ETags are SHA-1 or SHA-256 digests).
fn blob_name(etag: &str) -> std::result::Result<String, String> {
    let t = etag.trim();
    let t = t.strip_prefix("W/").unwrap_or(t).trim_matches('"');
    if !t.is_empty()
        && t.len() <= 128
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        Ok(t.to_owned())
    } else {
        Err(format!("the ETag {etag:?} is not a plain digest"))
    }
}

/// Characters escaped in a file name inside a URL path (`/` separates its segments).
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b'/');

/// The repository listing (`GET /api/{models,datasets}/OWNER/NAME/revision/REV`).
#[derive(Deserialize)]
struct Listing {
    sha: String,
    siblings: Vec<Sibling>,
}

#[derive(Deserialize)]
struct Sibling {
    rfilename: String,
}

/// An HTTP client for one hub: one agent that follows redirects (keeping the token on the same
/// host only) and one that does not, to read the hub's own headers before a CDN redirect.
struct Client {
    follow: ureq::Agent,
    direct: ureq::Agent,
    auth: Option<String>,
}

impl Client {
    fn new(cfg: &HubConfig) -> Self {
        let builder = || {
            ureq::AgentBuilder::new()
                .try_proxy_from_env(true)
                .timeout_connect(Duration::from_secs(30))
                .timeout_read(Duration::from_secs(120))
                .user_agent(concat!("rlreplay/", env!("CARGO_PKG_VERSION")))
        };
        Self {
            follow: builder()
                .redirect_auth_headers(ureq::RedirectAuthHeaders::SameHost)
                .build(),
            direct: builder().redirects(0).build(),
            auth: cfg.token.as_ref().map(|t| format!("Bearer {t}")),
        }
    }

    fn get(&self, agent: &ureq::Agent, url: &str) -> ureq::Request {
        let req = agent.get(url);
        match &self.auth {
            Some(a) => req.set("Authorization", a),
            None => req,
        }
    }
}

/// What the hub says about one file before it is downloaded.
struct FileMeta {
    /// The blob name (checked ETag).
    blob: String,
    /// The size in bytes, when the hub gives it.
    size: Option<u64>,
}

impl HubPath {
    /// Parses `hf://datasets/OWNER/NAME[@REV]` or `hf://OWNER/NAME[@REV]`; `None` when `spec` is not
    /// a hub path. The owner, name and revision are checked (no query, fragment or path tricks).
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
        let invalid = |why: String| {
            Some(Err(Error::HubPath {
                spec: spec.to_owned(),
                why,
            }))
        };
        if parts.len() != 2 {
            return invalid("the repository id is not OWNER/NAME".into());
        }
        if let Err(why) = parts.iter().try_for_each(|p| check_repo_part(p)) {
            return invalid(why);
        }
        if let Err(why) = check_revision(&revision) {
            return invalid(why);
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

    /// `datasets/OWNER/NAME` or `OWNER/NAME`, as in the hub's URLs.
    fn url_path(&self) -> String {
        match self.kind {
            HubKind::Dataset => format!("datasets/{}", self.repo_id),
            HubKind::Model => self.repo_id.clone(),
        }
    }

    /// Downloads (or finds in the cache) the repository files whose names satisfy `wanted`;
    /// returns `(name in repo, local path)` sorted by name. Fails when none matches, and before
    /// downloading anything when the listing holds a file name or commit id that could not stay
    /// inside the cache.
    pub fn download(
        &self,
        cfg: &HubConfig,
        wanted: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<(String, PathBuf)>> {
        let client = Client::new(cfg);
        let listing = match self.list(&client, cfg) {
            Ok(l) => l,
            Err(ListError::Unreachable(e)) => return self.offline(cfg, wanted, &e),
            Err(ListError::Refused(e)) => return Err(e),
        };
        let mut names: Vec<String> = listing
            .siblings
            .into_iter()
            .map(|s| s.rfilename)
            .filter(|n| wanted(n))
            .collect();
        names.sort();
        if names.is_empty() {
            return Err(Error::HubNoMatch {
                repo: self.display(),
            });
        }
        if cfg.progress && names.len() > 1 {
            eprintln!("{}: {} file(s)", self.display(), names.len());
        }
        let files = names
            .into_iter()
            .map(|n| {
                let p =
                    self.fetch(&client, cfg, &listing.sha, &n)
                        .map_err(|e| Error::HubDownload {
                            repo: self.display(),
                            name: n.clone(),
                            source: Box::new(e),
                        })?;
                Ok((n, p))
            })
            .collect::<Result<Vec<_>>>()?;
        self.write_ref(cfg, &listing.sha)?;
        Ok(files)
    }

    /// Lists the repository at this revision; every listed name and the commit id are checked.
    fn list(&self, client: &Client, cfg: &HubConfig) -> std::result::Result<Listing, ListError> {
        let kind = match self.kind {
            HubKind::Dataset => "datasets",
            HubKind::Model => "models",
        };
        let url = format!(
            "{}/api/{kind}/{}/revision/{}",
            cfg.endpoint,
            self.repo_id,
            self.revision.replace('/', "%2F")
        );
        let refused = |why: String| {
            ListError::Refused(Error::HubRefused {
                repo: self.display(),
                why,
            })
        };
        let resp = match client
            .get(&client.follow, &url)
            .timeout(cfg.request_timeout)
            .call()
        {
            Ok(r) => r,
            Err(ureq::Error::Status(code, r)) => {
                let text = r.into_string().unwrap_or_default();
                let text: String = text.chars().take(200).collect();
                return Err(if code == 404 || code == 401 || code == 403 {
                    refused(format!("{url} answered {code}: {text}"))
                } else {
                    ListError::Unreachable(format!("{url} answered {code}: {text}"))
                });
            }
            Err(e) => return Err(ListError::Unreachable(format!("{e}"))),
        };
        let mut body = String::new();
        resp.into_reader()
            .take(64 << 20)
            .read_to_string(&mut body)
            .map_err(|e| ListError::Unreachable(format!("reading {url}: {e}")))?;
        let listing: Listing = serde_json::from_str(&body)
            .map_err(|e| refused(format!("{url} sent an unreadable listing: {e}")))?;
        check_commit(&listing.sha).map_err(|e| refused(format!("the listing at {url}: {e}")))?;
        for s in &listing.siblings {
            check_file_name(&s.rfilename).map_err(|e| {
                refused(format!(
                    "the listing at {url} names an unsafe file, refusing to download: {e}"
                ))
            })?;
        }
        Ok(listing)
    }

    /// The cached files when the hub cannot be reached.
    fn offline(
        &self,
        cfg: &HubConfig,
        wanted: &dyn Fn(&str) -> bool,
        why: &str,
    ) -> Result<Vec<(String, PathBuf)>> {
        let cached = self.cached_files(&cfg.cache_dir);
        if cached.is_empty() {
            return Err(Error::HubUnreachable {
                repo: self.display(),
                endpoint: cfg.endpoint.clone(),
                why: why.to_owned(),
                cache: cfg.cache_dir.clone(),
            });
        }
        eprintln!(
            "warning: {}: hub unreachable ({why}); using the cached files",
            self.display()
        );
        let mut out: Vec<_> = cached.into_iter().filter(|(n, _)| wanted(n)).collect();
        out.sort();
        if out.is_empty() {
            return Err(Error::HubNoCachedMatch {
                repo: self.display(),
            });
        }
        Ok(out)
    }

    /// The repository's folder in the cache.
    fn cache_root(&self, cfg: &HubConfig) -> PathBuf {
        cfg.cache_dir.join(self.repo().folder_name())
    }

    /// Fetches one checked file name of commit `sha` into the cache: its blob (named by the
    /// checked ETag) and the snapshot link to it; a file already in the snapshot is not fetched.
    fn fetch(&self, client: &Client, cfg: &HubConfig, sha: &str, name: &str) -> Result<PathBuf> {
        let root = self.cache_root(cfg);
        let link = root.join("snapshots").join(sha).join(name);
        if link.is_file() {
            return Ok(link);
        }
        let url = format!(
            "{}/{}/resolve/{sha}/{}",
            cfg.endpoint,
            self.url_path(),
            utf8_percent_encode(name, PATH_SEGMENT)
        );
        let meta = file_meta(client, cfg, &url)?;
        let blobs = root.join("blobs");
        let blob = blobs.join(&meta.blob);
        if !blob.is_file() {
            std::fs::create_dir_all(&blobs).at("creating", &blobs)?;
            download_blob(client, cfg, &url, name, meta.size, &blob)?;
        }
        if let Some(dir) = link.parent() {
            std::fs::create_dir_all(dir).at("creating", dir)?;
        }
        if link.symlink_metadata().is_ok() {
            // A link left dangling by a removed blob.
            std::fs::remove_file(&link).at("removing", &link)?;
        }
        let up = "../".repeat(name.split('/').count() + 1);
        let target = PathBuf::from(format!("{up}blobs/{}", meta.blob));
        if let Err(e) = symlink(&target, &link) {
            if !link.is_file() {
                return Err(Error::from(IoError::new("linking", &link, e)));
            }
        }
        Ok(link)
    }

    /// Records that this revision is commit `sha` (`REPO/refs/REVISION`), for offline use.
    fn write_ref(&self, cfg: &HubConfig, sha: &str) -> Result<()> {
        let path = self.cache_root(cfg).join("refs").join(&self.revision);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).at("creating", dir)?;
        }
        Ok(std::fs::write(&path, sha).at("writing", &path)?)
    }

    /// Files of this revision's cached snapshot, as `(name in repo, path)`.
    fn cached_files(&self, cache_dir: &Path) -> Vec<(String, PathBuf)> {
        let base = cache_dir.join(self.repo().folder_name());
        let Ok(commit) = std::fs::read_to_string(base.join("refs").join(&self.revision)) else {
            return Vec::new();
        };
        let commit = commit.trim();
        if check_commit(commit).is_err() {
            return Vec::new();
        }
        let snap = base.join("snapshots").join(commit);
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

/// Why a listing failed: the hub could not be reached (the cache may be used) or it answered
/// something that is refused.
enum ListError {
    Unreachable(String),
    Refused(Error),
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(not(unix))]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    let blob = link
        .parent()
        .map_or_else(|| target.to_path_buf(), |d| d.join(target));
    std::fs::copy(blob, link).map(|_| ())
}

/// The hub's headers for one file: its ETag (the blob name) and size, read from the hub's own
/// answer to a one-byte range request (relative redirects are followed, a redirect to another
/// host, such as a CDN, is not: the hub's headers are on its redirect).
fn file_meta(client: &Client, cfg: &HubConfig, url: &str) -> Result<FileMeta> {
    let mut url = url.to_owned();
    let mut redirects = 0;
    let resp = loop {
        let resp = match client
            .get(&client.direct, &url)
            .set("Range", "bytes=0-0")
            .timeout(cfg.request_timeout)
            .call()
        {
            Ok(r) => r,
            Err(ureq::Error::Status(code, _)) => return Err(Error::HubStatus { url, code }),
            Err(e) => {
                return Err(Error::HubRequest {
                    url,
                    source: Box::new(e),
                })
            }
        };
        let relative = resp
            .header("Location")
            .filter(|l| l.starts_with('/') && !l.starts_with("//"))
            .map(str::to_owned);
        match relative {
            Some(loc) if (300..400).contains(&resp.status()) && redirects < 5 => {
                redirects += 1;
                let origin = origin(&url);
                url = format!("{origin}{loc}");
            }
            _ => break resp,
        }
    };
    let etag = resp
        .header("X-Linked-Etag")
        .or_else(|| resp.header("ETag"))
        .ok_or_else(|| Error::HubFile {
            url: url.clone(),
            why: "the answer has no ETag".into(),
        })?;
    let blob = blob_name(etag).map_err(|e| Error::HubFile {
        url: url.clone(),
        why: format!("refusing the file: {e}"),
    })?;
    let size = resp
        .header("X-Linked-Size")
        .and_then(|s| s.trim().parse().ok())
        .or_else(|| {
            resp.header("Content-Range")
                .and_then(|r| r.rsplit('/').next())
                .and_then(|s| s.trim().parse().ok())
        });
    Ok(FileMeta { blob, size })
}

/// `scheme://host[:port]` of a URL.
fn origin(url: &str) -> &str {
    let after = url.find("://").map_or(0, |i| i + 3);
    match url[after..].find('/') {
        Some(i) => &url[..after + i],
        None => url,
    }
}

/// A reader that fails once its deadline has passed: a hub that sends a byte now and then keeps
/// every single read under the read timeout, so the whole download needs a deadline too.
struct Deadline<R> {
    inner: R,
    started: std::time::Instant,
    limit: Duration,
    /// What the deadline is, for the error.
    why: String,
}

impl<R: Read> Read for Deadline<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.started.elapsed() > self.limit {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                self.why.clone(),
            ));
        }
        self.inner.read(buf)
    }
}

/// Removes the partial downloads in `blobs` that no running process is writing: those whose
/// process id (in `NAME.PID.part`) is not alive, or, where that cannot be told, older than a day.
fn remove_stale_parts(blobs: &Path) {
    let Ok(entries) = std::fs::read_dir(blobs) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".part") else {
            continue;
        };
        let pid = stem.rsplit('.').next().and_then(|p| p.parse::<u32>().ok());
        let proc_dir = Path::new("/proc");
        let stale = match pid {
            Some(pid) if proc_dir.is_dir() => {
                pid != std::process::id() && !proc_dir.join(pid.to_string()).exists()
            }
            _ => e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > Duration::from_secs(24 * 3600)),
        };
        if stale {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Downloads `url` into `blob` through a temporary file next to it (renamed when complete, so
/// that an interrupted download never leaves a partial blob, and the partial files of killed
/// downloads are removed); checks the size when it is known, and fails past a deadline scaled to
/// the size ([`HubConfig::min_rate`]).
fn download_blob(
    client: &Client,
    cfg: &HubConfig,
    url: &str,
    name: &str,
    size: Option<u64>,
    blob: &Path,
) -> Result<()> {
    let started = std::time::Instant::now();
    // The bytes as stored (the announced size and the blob's digest are of those).
    let resp = match client
        .get(&client.follow, url)
        .set("Accept-Encoding", "identity")
        .call()
    {
        Ok(r) => r,
        Err(ureq::Error::Status(code, _)) => {
            return Err(Error::HubStatus {
                url: url.to_owned(),
                code,
            })
        }
        Err(e) => {
            return Err(Error::HubRequest {
                url: url.to_owned(),
                source: Box::new(e),
            })
        }
    };
    let size = size.or_else(|| {
        resp.header("Content-Length")
            .and_then(|s| s.trim().parse().ok())
    });
    if let Some(dir) = blob.parent() {
        remove_stale_parts(dir);
    }
    let deadline = cfg.download_deadline(size);
    let why = format!(
        "past the download's deadline of {:.0} s ({:.0} s plus one second per {} bytes of its \
         size)",
        deadline.as_secs_f64(),
        cfg.request_timeout.as_secs_f64(),
        cfg.min_rate
    );
    let tmp = blob.with_extension(format!("{}.part", std::process::id()));
    let result = (|| -> Result<u64> {
        let mut file = std::fs::File::create(&tmp).at("creating", &tmp)?;
        let bar = if cfg.progress {
            indicatif::ProgressBar::new(size.unwrap_or(0))
        } else {
            indicatif::ProgressBar::hidden()
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(name.to_owned());
        // One byte past the announced size is enough to tell that the body is too long.
        let limit = size.map_or(u64::MAX, |s| s.saturating_add(1));
        let body = Deadline {
            inner: resp.into_reader().take(limit),
            started,
            limit: deadline,
            why,
        };
        let mut reader = bar.wrap_read(body);
        let n = std::io::copy(&mut reader, &mut file).at("downloading into", &tmp)?;
        bar.finish_and_clear();
        file.flush()
            .and_then(|()| file.sync_all())
            .at("writing", &tmp)?;
        Ok(n)
    })();
    let written = match result {
        Ok(n) => n,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    if let Some(s) = size {
        if written != s {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::HubSize {
                url: url.to_owned(),
                received: written,
                announced: s,
            });
        }
    }
    Ok(std::fs::rename(&tmp, blob).at("writing", blob)?)
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
        let pr = HubPath::parse("hf://a/b@refs/pr/1").unwrap().unwrap();
        assert_eq!(pr.revision, "refs/pr/1");
        assert!(HubPath::parse("data/run").is_none());
        assert!(HubPath::parse("hf://datasets/onlyowner").unwrap().is_err());
        assert!(HubPath::parse("hf://a/b/c").unwrap().is_err());
    }

    #[test]
    fn refuses_unsafe_repo_ids_and_revisions() {
        for spec in [
            "hf://datasets/a/b?x=1",
            "hf://datasets/a/b#frag",
            "hf://datasets/a/b%2F..",
            "hf://datasets/../b",
            "hf://datasets/a/..",
            "hf://a/b c",
            "hf://a/-b",
            "hf://a/b.",
            "hf://a/b--c",
            "hf://a/b@",
            "hf://a/b@../../x",
            "hf://a/b@/abs",
            "hf://a/b@main?x=1",
            "hf://a/b@a//b",
            "hf://a\\b/c",
        ] {
            let err = HubPath::parse(spec).unwrap().unwrap_err().to_string();
            assert!(err.contains("invalid hub path"), "{spec}: {err}");
        }
        let long = format!("hf://a/{}", "x".repeat(97));
        assert!(HubPath::parse(&long).unwrap().is_err());
    }

    #[test]
    fn file_names_stay_relative_and_normalised() {
        for ok in [
            "data/step-0001.parquet",
            "README.md",
            ".gitattributes",
            "a b/c d.json",
            "ünïcode/x..y",
        ] {
            assert_eq!(check_file_name(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("/some/where/step-0001.parquet", "absolute"),
            ("../../../x/step-0001.parquet", "`..`"),
            ("data/../../x", "`..`"),
            ("..", "`..`"),
            ("data\\x.parquet", "backslash"),
            ("data//x.parquet", "normalised"),
            ("./x.parquet", "normalised"),
            ("data/", "normalised"),
            ("C:/x.parquet", "drive"),
            ("a\0b", "control"),
            ("a\nb", "control"),
        ] {
            let err = check_file_name(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
        assert!(check_file_name(&"x".repeat(1025)).is_err());
    }

    #[test]
    fn commits_and_etags_are_plain_digests() {
        assert!(check_commit(&"a".repeat(40)).is_ok());
        assert!(check_commit(&"0".repeat(64)).is_ok());
        for bad in ["", "main", "../../../x", &"g".repeat(40), &"a".repeat(65)] {
            assert!(check_commit(bad).is_err(), "{bad}");
        }
        assert_eq!(blob_name("\"abc123\"").unwrap(), "abc123");
        assert_eq!(blob_name("W/\"abc-1_2\"").unwrap(), "abc-1_2");
        for bad in [
            "",
            "\"\"",
            "../x",
            "/tmp/evil",
            "a.b",
            "a/b",
            &"a".repeat(129),
        ] {
            assert!(blob_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn origin_of_urls() {
        assert_eq!(origin("http://127.0.0.1:5/a/b"), "http://127.0.0.1:5");
        assert_eq!(origin("https://huggingface.co"), "https://huggingface.co");
    }
}
