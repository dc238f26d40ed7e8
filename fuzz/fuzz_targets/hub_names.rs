//! The hub's name checks on arbitrary text: a file name the listing may hold, and a hub path.
//!
//! A file name that `check_file_name` accepts, joined under a cache directory, has only normal
//! components and stays under it (so no listed name can place a file outside the cache); a hub
//! path that parses has an `OWNER/NAME` of the allowed characters and a revision without `.` or
//! `..` segments, query or fragment.
#![no_main]

use std::path::{Component, Path};

use libfuzzer_sys::fuzz_target;
use rlreplay_data::hub::check_file_name;
use rlreplay_data::HubPath;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if check_file_name(&text).is_ok() {
        let base = Path::new("/cache/datasets--o--n/snapshots/0123");
        let joined = base.join(&*text);
        assert!(joined.starts_with(base), "{text:?}");
        assert!(
            Path::new(&*text)
                .components()
                .all(|c| matches!(c, Component::Normal(_))),
            "{text:?}"
        );
        assert!(!text.contains('\\') && !text.split('/').any(|s| s.is_empty() || s == ".."));
    }
    for spec in [format!("hf://{text}"), format!("hf://datasets/{text}")] {
        if let Some(Ok(hub)) = HubPath::parse(&spec) {
            let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
            let parts: Vec<&str> = hub.repo_id.split('/').collect();
            assert_eq!(parts.len(), 2, "{spec}");
            assert!(parts.iter().all(|p| !p.is_empty() && p.chars().all(ok)), "{spec}");
            assert!(hub.revision.chars().all(|c| ok(c) || c == '/'), "{spec}");
            assert!(
                !hub.revision.split('/').any(|s| s.is_empty() || s == "." || s == ".."),
                "{spec}"
            );
        }
    }
});
