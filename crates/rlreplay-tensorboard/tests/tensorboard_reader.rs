//! The event file this crate writes, as TensorBoard's own reader reads it
//! (scripts/golden_tensorboard.py): byte for byte the committed file, and every scalar read back
//! by TensorBoard equal to the value written (as float32), at its step and wall time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rlreplay_tensorboard::{read_scalars, EventWriter};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn load(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join(name)).unwrap()).unwrap()
}

#[test]
fn tensorboard_reads_back_every_scalar() {
    let spec = load("scalars.json");
    let t0 = spec["wall_time0"].as_f64().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("events.out.tfevents.test");
    let mut w = EventWriter::create_file(&path, t0).unwrap();
    // (tag, step) -> (wall time, value written)
    let mut written: BTreeMap<(String, i64), (f64, f64)> = BTreeMap::new();
    for (k, s) in spec["steps"].as_array().unwrap().iter().enumerate() {
        let step = s["step"].as_i64().unwrap();
        let wall = t0 + 1.0 + k as f64;
        let scalars: Vec<(&str, f64)> = s["scalars"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(t, v)| (t.as_str(), v.as_f64().unwrap()))
            .collect();
        for &(t, v) in &scalars {
            written.insert((t.to_string(), step), (wall, v));
        }
        w.add_scalars(step, wall, scalars).unwrap();
    }
    w.flush().unwrap();
    drop(w);
    let golden = fixtures().join("events.out.tfevents.golden");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        std::fs::read(&golden).unwrap(),
        "the writer's bytes changed: rerun scripts/golden_tensorboard.py"
    );

    let tb = load("tensorboard_read.json");
    let mut seen = 0;
    for (tag, events) in tb.as_object().unwrap() {
        for e in events.as_array().unwrap() {
            let (wall, step, value) = (
                e[0].as_f64().unwrap(),
                e[1].as_i64().unwrap(),
                e[2].as_f64().unwrap(),
            );
            let &(w_wall, w_value) = written
                .get(&(tag.clone(), step))
                .unwrap_or_else(|| panic!("TensorBoard read {tag} at step {step}, never written"));
            assert_eq!(wall, w_wall, "{tag} {step}");
            // Compared as float32: the JSON text of the f64 widening is parsed within an ulp.
            assert_eq!(value as f32, w_value as f32, "{tag} {step}");
            seen += 1;
        }
    }
    assert_eq!(seen, written.len(), "TensorBoard read every scalar");

    // This crate's reader agrees with TensorBoard's.
    let ours = read_scalars(&golden).unwrap();
    assert_eq!(ours.len(), written.len());
    for s in ours {
        let (wall, value) = written[&(s.tag.clone(), s.step)];
        assert_eq!((s.wall_time, s.value), (wall, value as f32));
    }
}
