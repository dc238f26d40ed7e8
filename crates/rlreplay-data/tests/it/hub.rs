//! Hub resolution against a tiny local server that speaks the hub's API for one fixture repository.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rlreplay_data::error::chain;
use rlreplay_data::synth::write_dataset;
use rlreplay_data::{Dataset, HubConfig, HubPath, ReadOptions, StepRange};

use crate::common::small_config;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// What the fixture hub answers beside its files.
#[derive(Clone)]
struct Listing {
    /// The listing's commit id.
    sha: String,
    /// Names listed in addition to the served files (never served).
    extra: Vec<String>,
    /// The ETag sent for every file (default: one derived from the file).
    etag: Option<String>,
}

impl Default for Listing {
    fn default() -> Self {
        Self {
            sha: COMMIT.into(),
            extra: Vec::new(),
            etag: None,
        }
    }
}

/// A fixture hub: serves `GET /api/datasets/{repo}/revision/{rev}` (the file list) and
/// `GET /datasets/{repo}/resolve/{rev}/{file}` (with Range support), logging every request.
struct FakeHub {
    endpoint: String,
    log: Arc<Mutex<Vec<String>>>,
}

fn respond(
    mut s: TcpStream,
    files: &BTreeMap<String, Vec<u8>>,
    repo: &str,
    listing: &Listing,
    log: &Mutex<Vec<String>>,
) {
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
    let mut range = None;
    let mut auth = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        let lower = h.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("range: bytes=") {
            let (a, b) = v.trim().split_once('-').unwrap();
            range = Some((a.parse::<usize>().unwrap(), b.parse::<usize>().ok()));
        }
        if lower.starts_with("authorization:") {
            auth = Some(h.trim().to_owned());
        }
    }
    let info = format!("/api/datasets/{repo}/revision/");
    let prefix = format!("/datasets/{repo}/resolve/");
    let file = path
        .strip_prefix(&prefix)
        .and_then(|rest| rest.split_once('/'))
        .map(|(_rev, f)| f);
    let (status, headers, body): (&str, String, Vec<u8>) = if path.starts_with(&info) {
        log.lock().unwrap().push(format!("LIST {path}"));
        let siblings: Vec<String> = files
            .keys()
            .chain(&listing.extra)
            .map(|f| serde_json::json!({ "rfilename": f }).to_string())
            .collect();
        let body = format!(
            "{{\"sha\":{},\"siblings\":[{}]}}",
            serde_json::Value::from(listing.sha.as_str()),
            siblings.join(",")
        );
        (
            "200 OK",
            "Content-Type: application/json\r\n".into(),
            body.into_bytes(),
        )
    } else if let Some(data) = file.and_then(|f| files.get(f)) {
        log.lock()
            .unwrap()
            .push(format!("{path} {:?} {}", range, auth.is_some()));
        let (a, b) = range.map_or((0, data.len() - 1), |(a, b)| {
            (a, b.unwrap_or(data.len() - 1).min(data.len() - 1))
        });
        let etag = listing
            .etag
            .clone()
            .unwrap_or_else(|| format!("\"etag-{}\"", path.len() * 7919 % 100_003 + data.len()));
        let headers = format!(
            "X-Repo-Commit: {}\r\nETag: {etag}\r\nContent-Range: bytes {a}-{b}/{}\r\n",
            listing.sha,
            data.len()
        );
        ("206 Partial Content", headers, data[a..=b].to_vec())
    } else {
        log.lock().unwrap().push(format!("404 {path}"));
        ("404 Not Found", String::new(), b"not found".to_vec())
    };
    let _ = write!(
        s,
        "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(&body);
    let _ = s.flush();
    let mut sink = [0u8; 16];
    let _ = s.set_read_timeout(Some(std::time::Duration::from_millis(10)));
    let _ = reader.get_mut().read(&mut sink);
}

impl FakeHub {
    fn start(repo: &str, files: BTreeMap<String, Vec<u8>>) -> FakeHub {
        Self::start_with(repo, files, Listing::default())
    }

    fn start_with(repo: &str, files: BTreeMap<String, Vec<u8>>, listing: Listing) -> FakeHub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let (repo, log2) = (repo.to_owned(), log.clone());
        std::thread::spawn(move || {
            for s in listener.incoming().flatten() {
                respond(s, &files, &repo, &listing, &log2);
            }
        });
        FakeHub { endpoint, log }
    }

    /// File downloads (not the one-byte metadata requests, not the listing).
    fn downloads(&self) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| !l.contains("Some((0, Some(0)))") && !l.starts_with("LIST"))
            .cloned()
            .collect()
    }

    /// Every request, in order.
    fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

/// Every path under `dir`, relative, sorted (symbolic links are not followed).
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

fn fixture_files() -> BTreeMap<String, Vec<u8>> {
    let dir = tempfile::tempdir().unwrap();
    let cfg = rlreplay_data::synth::SynthConfig {
        steps: 4,
        ..small_config()
    };
    let mut files = BTreeMap::new();
    for p in write_dataset(dir.path(), &cfg, |_| {}).unwrap() {
        let name = format!("data/{}", p.file_name().unwrap().to_str().unwrap());
        files.insert(name, std::fs::read(&p).unwrap());
    }
    files.insert("README.md".into(), b"# fixture\n".to_vec());
    files
}

fn config(endpoint: &str, cache: PathBuf) -> HubConfig {
    HubConfig {
        endpoint: endpoint.to_owned(),
        cache_dir: cache,
        token: Some("hf_test".into()),
        progress: false,
        request_timeout: std::time::Duration::from_secs(120),
        min_rate: 64 << 10,
    }
}

/// A hub that lists one 4,000-byte file and then sends its body one byte every 20 ms (80 s in
/// all), every read well under any read timeout.
fn trickling_hub() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(s.try_clone().unwrap());
                let mut line = String::new();
                let _ = reader.read_line(&mut line);
                let mut meta = false;
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    meta |= h.to_ascii_lowercase().starts_with("range: bytes=0-0");
                }
                let head = |s: &mut TcpStream, status: &str, extra: &str, len: usize| {
                    let _ = write!(
                        s,
                        "HTTP/1.1 {status}\r\n{extra}Content-Length: {len}\r\nConnection: close\r\n\r\n"
                    );
                };
                if line.contains("/api/") {
                    let body = format!(
                        r#"{{"sha":"{COMMIT}","siblings":[{{"rfilename":"data/step-0001.parquet"}}]}}"#
                    );
                    head(&mut s, "200 OK", "", body.len());
                    let _ = s.write_all(body.as_bytes());
                } else if meta {
                    let extra = format!(
                        "X-Repo-Commit: {COMMIT}\r\nETag: \"etag-slow\"\r\nContent-Range: bytes 0-0/4000\r\n"
                    );
                    head(&mut s, "206 Partial Content", &extra, 1);
                    let _ = s.write_all(b"P");
                } else {
                    head(&mut s, "200 OK", "", 4000);
                    for _ in 0..4000 {
                        if s.write_all(b"P").and_then(|()| s.flush()).is_err() {
                            break;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                }
            });
        }
    });
    endpoint
}

/// A hub that keeps every read short but sends a file too slowly for its size fails at the
/// download's deadline instead of running for as long as it likes, and leaves no partial file;
/// the partial files of killed downloads are removed by the next download.
#[test]
fn a_trickling_hub_meets_a_deadline_and_partial_files_do_not_stay() {
    let endpoint = trickling_hub();
    let cache = tempfile::tempdir().unwrap();
    let cfg = HubConfig {
        request_timeout: std::time::Duration::from_secs(1),
        min_rate: 4000,
        ..config(&endpoint, cache.path().to_owned())
    };
    let blobs = cache.path().join("datasets--owner--slow/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    // Left by a killed download (no process has this id), and one of a live process (this one).
    let dead = blobs.join("etag-other.4194305.part");
    let live = blobs.join(format!("etag-other.{}.part", std::process::id()));
    std::fs::write(&dead, b"partial").unwrap();
    std::fs::write(&live, b"partial").unwrap();
    let path = HubPath::parse("hf://datasets/owner/slow").unwrap().unwrap();
    let t0 = std::time::Instant::now();
    let e = path.download(&cfg, &|_| true).unwrap_err();
    let took = t0.elapsed();
    let msg = chain(&e);
    assert!(msg.contains("deadline"), "{msg}");
    assert!(took < std::time::Duration::from_secs(30), "{took:?}: {msg}");
    assert!(!dead.exists(), "a dead download's partial file stays");
    assert!(live.exists(), "a live download's partial file was removed");
    let left: Vec<_> = std::fs::read_dir(&blobs)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
}

#[test]
fn downloads_only_the_selected_steps_into_the_cache() {
    let files = fixture_files();
    let hub = FakeHub::start("owner/rollouts", files.clone());
    let cache = tempfile::tempdir().unwrap();
    let cfg = config(&hub.endpoint, cache.path().to_owned());
    let path = HubPath::parse("hf://datasets/owner/rollouts")
        .unwrap()
        .unwrap();
    let steps = StepRange::new(2, 3);
    let got = path
        .download(&cfg, &|n| {
            n.ends_with(".parquet")
                && rlreplay_data::step_from_name(n).is_some_and(|s| steps.contains(s))
        })
        .unwrap();
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        vec!["data/step-0002.parquet", "data/step-0003.parquet"]
    );
    for (n, p) in &got {
        assert!(p.starts_with(
            cache
                .path()
                .join("datasets--owner--rollouts/snapshots")
                .join(COMMIT)
        ));
        assert_eq!(&std::fs::read(p).unwrap(), &files[n]);
    }
    let downloads = hub.downloads();
    assert_eq!(downloads.len(), 2, "{downloads:?}");
    assert!(
        downloads.iter().all(|d| d.ends_with("true")),
        "token sent: {downloads:?}"
    );

    // Offline afterwards: the cached files are used.
    let offline = config("http://127.0.0.1:9", cache.path().to_owned());
    let again = path
        .download(&offline, &|n| n.ends_with(".parquet"))
        .unwrap();
    assert_eq!(again.len(), 2);
    assert!(HubPath::parse("hf://datasets/owner/other")
        .unwrap()
        .unwrap()
        .download(&offline, &|_| true)
        .is_err());
}

#[test]
fn dataset_open_reads_hub_datasets_through_the_environment() {
    let hub = FakeHub::start("owner/rollouts", fixture_files());
    let cache = tempfile::tempdir().unwrap();
    // The only test in this binary that sets the environment; only hub resolution reads these
    // variables, and no other test resolves a hub path from the environment.
    std::env::set_var("HF_ENDPOINT", &hub.endpoint);
    std::env::set_var("HF_HOME", cache.path());
    let ds = Dataset::open_steps("hf://datasets/owner/rollouts", "3..".parse().unwrap()).unwrap();
    assert_eq!(
        ds.steps().iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![3, 4]
    );
    let (b, report) = ds.read_step(4, &ReadOptions::new([999])).unwrap();
    assert_eq!(b.len(), 16);
    assert!(report.is_clean());
    assert!(ds.steps()[0].1.starts_with(cache.path().join("hub")));
    assert_eq!(hub.downloads().len(), 2);
    let dir =
        rlreplay_data::resolve_hub_path("hf://datasets/owner/rollouts", &|n| n == "README.md")
            .unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.join("README.md")).unwrap(),
        "# fixture\n"
    );
}

/// A cache inside an otherwise empty directory, to see whether anything lands next to it.
fn fenced_cache() -> (tempfile::TempDir, PathBuf) {
    let outer = tempfile::tempdir().unwrap();
    let cache = outer.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    (outer, cache)
}

#[test]
fn unsafe_listed_names_are_refused_before_any_download() {
    let outside = tempfile::tempdir().unwrap();
    let absolute = outside.path().join("some/where/step-0001.parquet");
    let names = [
        absolute.display().to_string(),
        "../../../../escape/step-0001.parquet".to_owned(),
        "../../../../../../../../tmp/escape-step-0001.parquet".to_owned(),
        "data\\step-0009.parquet".to_owned(),
        "data//step-0009.parquet".to_owned(),
        "./data/step-0009.parquet".to_owned(),
    ];
    for bad in names {
        let listing = Listing {
            extra: vec![bad.clone()],
            ..Listing::default()
        };
        let hub = FakeHub::start_with("owner/rollouts", fixture_files(), listing);
        let (outer, cache) = fenced_cache();
        let cfg = config(&hub.endpoint, cache.clone());
        let path = HubPath::parse("hf://datasets/owner/rollouts")
            .unwrap()
            .unwrap();
        // Refused even when the unsafe name is not among the wanted files.
        for wanted in [
            &(|n: &str| n.ends_with(".parquet")) as &dyn Fn(&str) -> bool,
            &|n: &str| n == "README.md",
        ] {
            let err = chain(&path.download(&cfg, wanted).unwrap_err());
            assert!(
                err.contains("unsafe file") && err.contains(&format!("{bad:?}")),
                "{bad}: {err}"
            );
        }
        assert_eq!(hub.downloads(), Vec::<String>::new(), "{bad}");
        assert_eq!(
            hub.requests()
                .iter()
                .filter(|r| !r.starts_with("LIST"))
                .count(),
            0,
            "{bad}: {:?}",
            hub.requests()
        );
        assert_eq!(tree(outer.path()), vec!["cache"], "{bad}");
        assert!(!absolute.exists() && !outside.path().join("some").exists());
        assert!(!Path::new("/tmp/escape-step-0001.parquet").exists());
    }
}

#[test]
fn unsafe_commit_ids_and_etags_are_refused() {
    let cases = [
        (
            Listing {
                sha: "../../../../escape".into(),
                ..Listing::default()
            },
            "commit id",
        ),
        (
            Listing {
                sha: "/tmp/escape".into(),
                ..Listing::default()
            },
            "commit id",
        ),
        (
            Listing {
                etag: Some("\"../../../../escape\"".into()),
                ..Listing::default()
            },
            "ETag",
        ),
        (
            Listing {
                etag: Some("/tmp/escape-blob".into()),
                ..Listing::default()
            },
            "ETag",
        ),
    ];
    for (listing, needle) in cases {
        let hub = FakeHub::start_with("owner/rollouts", fixture_files(), listing);
        let (outer, cache) = fenced_cache();
        let cfg = config(&hub.endpoint, cache.clone());
        let err = HubPath::parse("hf://datasets/owner/rollouts")
            .unwrap()
            .unwrap()
            .download(&cfg, &|n| n == "README.md")
            .unwrap_err();
        let err = chain(&err);
        assert!(err.contains(needle), "{err}");
        assert_eq!(hub.downloads(), Vec::<String>::new());
        // Nothing outside the cache, and no blob inside it.
        assert_eq!(tree(outer.path()), vec!["cache"], "{err}");
        assert!(!Path::new("/tmp/escape-blob").exists());
    }
}

#[test]
fn a_query_in_the_repository_id_never_reaches_the_endpoint() {
    let hub = FakeHub::start("owner/rollouts", fixture_files());
    for spec in [
        "hf://datasets/owner/rollouts?x=1",
        "hf://datasets/owner/rollouts#x",
        "hf://datasets/owner/rollouts@main?x=1",
        "hf://datasets/owner/../rollouts",
    ] {
        let err = HubPath::parse(spec).unwrap().unwrap_err().to_string();
        assert!(err.contains("invalid hub path"), "{spec}: {err}");
    }
    assert!(hub.requests().is_empty());
}

#[test]
fn files_are_blobs_linked_from_the_snapshot() {
    let files = fixture_files();
    let hub = FakeHub::start("owner/rollouts", files.clone());
    let (outer, cache) = fenced_cache();
    let cfg = config(&hub.endpoint, cache.clone());
    let path = HubPath::parse("hf://datasets/owner/rollouts@v1.0")
        .unwrap()
        .unwrap();
    let got = path.download(&cfg, &|n| n == "README.md").unwrap();
    let repo = cache.join("datasets--owner--rollouts");
    assert_eq!(
        got[0].1,
        repo.join("snapshots").join(COMMIT).join("README.md")
    );
    let link = std::fs::read_link(&got[0].1).unwrap();
    assert!(link.starts_with("../../blobs"), "{}", link.display());
    assert_eq!(std::fs::read(&got[0].1).unwrap(), files["README.md"]);
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/v1.0")).unwrap(),
        COMMIT
    );
    // Fetched at the listed commit; a second call finds the file in the cache.
    assert!(hub.downloads()[0].starts_with(&format!(
        "/datasets/owner/rollouts/resolve/{COMMIT}/README.md"
    )));
    path.download(&cfg, &|n| n == "README.md").unwrap();
    assert_eq!(hub.downloads().len(), 1);
    assert!(tree(outer.path()).iter().all(|p| p.starts_with("cache")));
    assert!(tree(&repo.join("blobs"))
        .iter()
        .all(|p| !p.ends_with(".part")));
}
