//! Writes the scalars of a JSON file (`{"wall_time0": T, "steps": [{"step": S, "scalars":
//! {TAG: VALUE, ...}}, ...]}`, step k at `T + k`) as one event file at OUT.
//!
//!     cargo run -p rlreplay-tensorboard --example write_scalars -- SCALARS.json OUT

use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, input, out] = args.as_slice() else {
        return Err("usage: write_scalars SCALARS.json OUT".into());
    };
    let spec: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(input)?)?;
    let t0 = spec["wall_time0"].as_f64().ok_or("wall_time0")?;
    let mut w = rlreplay_tensorboard::EventWriter::create_file(Path::new(out), t0)?;
    for (k, s) in spec["steps"].as_array().ok_or("steps")?.iter().enumerate() {
        let step = s["step"].as_i64().ok_or("step")?;
        let scalars = s["scalars"].as_object().ok_or("scalars")?;
        let values: Vec<(&str, f64)> = scalars
            .iter()
            .map(|(tag, v)| (tag.as_str(), v.as_f64().unwrap_or(f64::NAN)))
            .collect();
        w.add_scalars(step, t0 + 1.0 + k as f64, values)?;
    }
    w.flush()?;
    Ok(())
}
