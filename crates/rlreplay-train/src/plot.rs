//! Training curves: mean score and loss over trainer steps, as PNG and SVG.

use std::path::Path;

use anyhow::Result;
use rlreplay_plot::{Panel, Series};

/// Draws `training_score.png` and `training_score.svg` in `dir` from `(step, score, loss)` rows.
pub fn training_score(history: &[(u64, f64, f64)], dir: &Path) -> Result<()> {
    let panel = |name: &str, desc: &str, value: fn(&(u64, f64, f64)) -> f64| Panel {
        title: name.into(),
        x_label: "trainer step".into(),
        y_label: desc.into(),
        series: vec![Series {
            label: desc.into(),
            points: history.iter().map(|h| (h.0 as f64, value(h))).collect(),
        }],
    };
    rlreplay_plot::panels(
        dir,
        "training_score",
        &[
            panel("critic/score/mean", "mean score", |h| h.1),
            panel("actor/pg_loss", "loss", |h| h.2),
        ],
    )?;
    Ok(())
}
