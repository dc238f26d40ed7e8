//! Hub resolution against a tiny local server that speaks the hub's API for one fixture repository.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use common::small_config;
use rlreplay_data::synth::write_dataset;
use rlreplay_data::{Dataset, HubConfig, HubPath, ReadOptions, StepRange};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// A fixture hub: serves `GET /api/datasets/{repo}/revision/main` (the file list) and
/// `GET /datasets/{repo}/resolve/main/{file}` (with Range support), logging every file request.
struct FakeHub {
    endpoint: String,
    log: Arc<Mutex<Vec<String>>>,
}

fn respond(
    mut s: TcpStream,
    files: &BTreeMap<String, Vec<u8>>,
    repo: &str,
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
    let info = format!("/api/datasets/{repo}/revision/main");
    let prefix = format!("/datasets/{repo}/resolve/main/");
    let (status, headers, body): (&str, String, Vec<u8>) = if path == info {
        let siblings: Vec<String> = files
            .keys()
            .map(|f| format!("{{\"rfilename\":\"{f}\"}}"))
            .collect();
        let body = format!(
            "{{\"sha\":\"{COMMIT}\",\"siblings\":[{}]}}",
            siblings.join(",")
        );
        (
            "200 OK",
            "Content-Type: application/json\r\n".into(),
            body.into_bytes(),
        )
    } else if let Some(data) = path.strip_prefix(&prefix).and_then(|f| files.get(f)) {
        log.lock()
            .unwrap()
            .push(format!("{path} {:?} {}", range, auth.is_some()));
        let (a, b) = range.map_or((0, data.len() - 1), |(a, b)| {
            (a, b.unwrap_or(data.len() - 1).min(data.len() - 1))
        });
        let headers = format!(
            "X-Repo-Commit: {COMMIT}\r\nETag: \"etag-{}\"\r\nContent-Range: bytes {a}-{b}/{}\r\n",
            path.len() * 7919 % 100_003 + data.len(),
            data.len()
        );
        ("206 Partial Content", headers, data[a..=b].to_vec())
    } else {
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
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let (repo, log2) = (repo.to_owned(), log.clone());
        std::thread::spawn(move || {
            for s in listener.incoming().flatten() {
                respond(s, &files, &repo, &log2);
            }
        });
        FakeHub { endpoint, log }
    }

    fn downloads(&self) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| !l.contains("Some((0, Some(0)))"))
            .cloned()
            .collect()
    }
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
    }
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
    // The only test in this binary that sets the environment.
    std::env::set_var("HF_ENDPOINT", &hub.endpoint);
    std::env::set_var("HF_HOME", cache.path());
    let ds = Dataset::open_steps("hf://datasets/owner/rollouts", "3..".parse().unwrap()).unwrap();
    assert_eq!(
        ds.steps().iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![3, 4]
    );
    let (b, report) = ds
        .read_step(
            4,
            &ReadOptions {
                eos: 999,
                ..Default::default()
            },
        )
        .unwrap();
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
