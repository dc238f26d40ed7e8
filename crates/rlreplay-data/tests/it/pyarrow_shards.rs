//! Shards written by pyarrow in several layouts (codecs, dictionary or plain pages, data page v1
//! or v2, 32- or 64-bit values, large lists; rows spanning pages and row groups) read back to
//! exactly the rows pyarrow was given. Fixtures: `scripts/golden_pyarrow_shards.py`.

use std::path::PathBuf;

use rlreplay_data::{read_shard, ReadOptions};
use serde_json::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pyarrow")
}

/// A JSON array of numbers as `T`.
fn numbers<T>(v: &Value, f: impl Fn(&Value) -> Option<T>) -> Vec<T> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| f(x).expect("a number"))
        .collect()
}

#[test]
fn pyarrow_layouts_read_back_exactly() {
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected.json")).unwrap())
            .unwrap();
    let rows = expected["rows"].as_array().unwrap();
    let layouts = expected["layouts"].as_array().unwrap();
    assert_eq!(layouts.len(), 6);
    for layout in layouts {
        let layout = layout.as_str().unwrap();
        let path = fixtures().join(layout).join("data/step-0001.parquet");
        let (b, report) = read_shard(&path, 1, &ReadOptions::new([]))
            .unwrap_or_else(|e| panic!("{layout}: {e:#}"));
        assert!(report.is_clean(), "{layout}: {report}");
        assert_eq!(b.len(), rows.len(), "{layout}");
        for (r, want) in rows.iter().enumerate() {
            let ids = |v: &Value| numbers(v, |x| x.as_u64().map(|x| x as u32));
            assert_eq!(b.uids[r], want["uid"].as_str().unwrap(), "{layout} row {r}");
            assert_eq!(b.prompt(r), ids(&want["prompt"]), "{layout} row {r}");
            assert_eq!(b.response(r), ids(&want["response"]), "{layout} row {r}");
            let lps = numbers(&want["log_probs"], |x| x.as_f64().map(|x| x as f32));
            assert_eq!(b.log_probs(r), lps, "{layout} row {r}");
            assert_eq!(
                b.scores[r],
                want["score"].as_f64().unwrap() as f32,
                "{layout} row {r}"
            );
        }
    }
}
