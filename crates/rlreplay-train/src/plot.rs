//! Training curves: mean score and loss over trainer steps, as PNG and SVG (plotters, with an
//! embedded font so no system library is needed).

use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

static FONT: Once = Once::new();

fn register_font() {
    FONT.call_once(|| {
        // The embedded font is a valid TrueType file; registration cannot fail on it.
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            include_bytes!("../assets/DejaVuSansMono.ttf"),
        );
    });
}

/// Draws `training_score.png` and `training_score.svg` in `dir` from `(step, score, loss)` rows.
pub fn training_score(history: &[(u64, f64, f64)], dir: &Path) -> Result<()> {
    register_font();
    let png = dir.join("training_score.png");
    let svg = dir.join("training_score.svg");
    {
        let root = BitMapBackend::new(&png, (960, 640)).into_drawing_area();
        draw(&root, history)?;
        root.present()
            .map_err(|e| anyhow!("{}: {e}", png.display()))?;
    }
    let root = SVGBackend::new(&svg, (960, 640)).into_drawing_area();
    draw(&root, history)?;
    root.present()
        .map_err(|e| anyhow!("{}: {e}", svg.display()))?;
    Ok(())
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    history: &[(u64, f64, f64)],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("plot: {e}");
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((2, 1));
    let steps = history.iter().map(|h| h.0);
    let x0 = steps.clone().min().unwrap_or(0) as f64;
    let x1 = (steps.max().unwrap_or(1) as f64).max(x0 + 1.0);
    // (metric, axis label, points, colour) of each panel.
    type Panel<'a> = (&'a str, &'a str, Vec<(f64, f64)>, RGBColor);
    let series: [Panel; 2] = [
        (
            "critic/score/mean",
            "mean score",
            history.iter().map(|h| (h.0 as f64, h.1)).collect(),
            BLUE,
        ),
        (
            "actor/pg_loss",
            "loss",
            history.iter().map(|h| (h.0 as f64, h.2)).collect(),
            RED,
        ),
    ];
    for (area, (name, desc, pts, color)) in panels.iter().zip(series) {
        let finite = pts.iter().map(|p| p.1).filter(|v| v.is_finite());
        let lo = finite.clone().fold(f64::INFINITY, f64::min);
        let hi = finite.fold(f64::NEG_INFINITY, f64::max);
        let (lo, hi) = if lo.is_finite() { (lo, hi) } else { (0.0, 1.0) };
        let pad = ((hi - lo) * 0.05).max(1e-6);
        let mut chart = ChartBuilder::on(area)
            .caption(name, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(72)
            .build_cartesian_2d(x0..x1, (lo - pad)..(hi + pad))
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("trainer step")
            .y_desc(desc)
            .draw()
            .map_err(err)?;
        let finite_pts = pts.into_iter().filter(|p| p.1.is_finite());
        chart
            .draw_series(LineSeries::new(finite_pts, color.stroke_width(2)))
            .map_err(err)?;
    }
    Ok(())
}
