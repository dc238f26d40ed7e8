//! Plots of training and audit runs: panels of line series and histograms, each written as PNG
//! and SVG (plotters, with an embedded font so that no system library is needed). Files are
//! written under a temporary name and renamed into place.
#![warn(missing_docs)]

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

/// An error writing a plot, with the file it concerns.
#[derive(Debug, thiserror::Error)]
#[error("{}: {msg}", path.display())]
pub struct PlotError {
    /// The plot file.
    pub path: PathBuf,
    /// What went wrong.
    pub msg: String,
}

/// Result type of the plot crate.
pub type Result<T> = std::result::Result<T, PlotError>;

/// One named line of a panel.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// `(x, y)` points in x order; non-finite values are left out.
    pub points: Vec<(f64, f64)>,
}

/// One chart of line series sharing axes.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// Caption.
    pub title: String,
    /// Label of the x axis.
    pub x_label: String,
    /// Label of the y axis.
    pub y_label: String,
    /// The lines (a legend is drawn when there are several).
    pub series: Vec<Series>,
}

/// Counts over contiguous bins.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// Caption.
    pub title: String,
    /// Label of the x axis.
    pub x_label: String,
    /// Label of the y axis.
    pub y_label: String,
    /// Bin edges, increasing (`counts.len() + 1` of them).
    pub edges: Vec<f64>,
    /// Count of each bin.
    pub counts: Vec<f64>,
    /// Logarithmic y axis (empty bins are left out).
    pub log_y: bool,
}

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

const WIDTH: u32 = 960;
const PANEL_HEIGHT: u32 = 320;

/// Something drawn on either backend.
trait Figure {
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String>
    where
        DB::ErrorType: 'static;
}

/// Draws `dir/NAME.png` and `dir/NAME.svg`.
fn write_both(dir: &Path, name: &str, size: (u32, u32), fig: &impl Figure) -> Result<()> {
    register_font();
    for ext in ["png", "svg"] {
        let path = dir.join(format!("{name}.{ext}"));
        let fail = |msg: String| PlotError {
            path: path.clone(),
            msg,
        };
        // The backend picks the image format from the extension, so the temporary name keeps it.
        let tmp = dir.join(format!(".{name}.tmp.{ext}"));
        if ext == "png" {
            let root = BitMapBackend::new(&tmp, size).into_drawing_area();
            fig.draw(&root).map_err(fail)?;
            root.present().map_err(|e| fail(e.to_string()))?;
        } else {
            let root = SVGBackend::new(&tmp, size).into_drawing_area();
            fig.draw(&root).map_err(fail)?;
            root.present().map_err(|e| fail(e.to_string()))?;
        }
        std::fs::rename(&tmp, &path).map_err(|e| fail(e.to_string()))?;
    }
    Ok(())
}

/// Writes `dir/NAME.png` and `dir/NAME.svg`: the panels stacked top to bottom.
pub fn panels(dir: &Path, name: &str, panels: &[Panel]) -> Result<()> {
    let size = (WIDTH, PANEL_HEIGHT * panels.len().max(1) as u32);
    write_both(dir, name, size, &Stack(panels))
}

/// Writes `dir/NAME.png` and `dir/NAME.svg`: one histogram.
pub fn histogram(dir: &Path, name: &str, hist: &Histogram) -> Result<()> {
    if hist.edges.len() != hist.counts.len() + 1 || hist.counts.is_empty() {
        return Err(PlotError {
            path: dir.join(format!("{name}.png")),
            msg: format!(
                "{} bin edges for {} counts",
                hist.edges.len(),
                hist.counts.len()
            ),
        });
    }
    write_both(dir, name, (WIDTH, 2 * PANEL_HEIGHT), hist)
}

struct Stack<'a>(&'a [Panel]);

impl Figure for Stack<'_> {
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String>
    where
        DB::ErrorType: 'static,
    {
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let areas = root.split_evenly((self.0.len().max(1), 1));
        for (area, p) in areas.iter().zip(self.0) {
            draw_panel(area, p).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// `lo..hi` padded by 5% (at least `1e-6`), or `0..1` when there is no finite value.
fn padded(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.05).max(1e-6);
    (lo - pad, hi + pad)
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &Panel,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    DB::ErrorType: 'static,
{
    let points = || p.series.iter().flat_map(|s| s.points.iter());
    let (x0, x1) = padded(points().map(|q| q.0));
    let (y0, y1) = padded(points().map(|q| q.1));
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(80)
        .build_cartesian_2d(x0..x1, y0..y1)?;
    chart
        .configure_mesh()
        .x_desc(p.x_label.as_str())
        .y_desc(p.y_label.as_str())
        .draw()?;
    for (i, s) in p.series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let finite: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|q| q.0.is_finite() && q.1.is_finite())
            .collect();
        let drawn = chart.draw_series(LineSeries::new(finite.clone(), color.stroke_width(2)))?;
        drawn.label(s.label.as_str()).legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
        });
        if finite.len() <= 60 {
            chart.draw_series(
                finite
                    .into_iter()
                    .map(|q| Circle::new(q, 3, color.filled())),
            )?;
        }
    }
    if p.series.len() > 1 {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
    }
    Ok(())
}

impl Figure for Histogram {
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String>
    where
        DB::ErrorType: 'static,
    {
        draw_histogram(root, self).map_err(|e| e.to_string())
    }
}

fn draw_histogram<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    h: &Histogram,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let x0 = h.edges[0];
    let x1 = h.edges[h.edges.len() - 1].max(x0 + 1e-12);
    let bars: Vec<(f64, f64, f64)> = h
        .edges
        .windows(2)
        .zip(&h.counts)
        .filter(|(_, &c)| c.is_finite() && (c > 0.0 || !h.log_y))
        .map(|(e, &c)| (e[0], e[1], c))
        .collect();
    let top = bars.iter().map(|b| b.2).fold(0.0, f64::max).max(1.0);
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(&h.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(80);
    let style = BLUE.mix(0.6).filled();
    // A logarithmic axis is drawn as log10 of the counts on a linear one, labelled 10^y.
    let y = |c: f64| if h.log_y { c.log10() } else { c };
    let (bottom, top) = if h.log_y {
        let low = bars.iter().map(|b| b.2).fold(top, f64::min);
        (low.log10().floor() - 0.3, top.log10() + 0.3)
    } else {
        (0.0, top * 1.05)
    };
    let mut chart = builder.build_cartesian_2d(x0..x1, bottom..top)?;
    let label = |v: &f64| {
        if h.log_y {
            format!("{:.3}", 10f64.powf(*v))
        } else {
            format!("{v}")
        }
    };
    chart
        .configure_mesh()
        .x_desc(h.x_label.as_str())
        .y_desc(h.y_label.as_str())
        .y_label_formatter(&label)
        .draw()?;
    chart.draw_series(
        bars.iter()
            .map(|&(a, b, c)| Rectangle::new([(a, bottom), (b, y(c))], style)),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panels_and_histograms_are_written_as_png_and_svg() {
        let dir = tempfile::tempdir().unwrap();
        let p = Panel {
            title: "kl".into(),
            x_label: "step".into(),
            y_label: "value".into(),
            series: vec![
                Series {
                    label: "k1".into(),
                    points: vec![(1.0, 0.5), (2.0, f64::NAN), (3.0, 0.25)],
                },
                Series {
                    label: "k3".into(),
                    points: vec![(1.0, 0.1)],
                },
            ],
        };
        panels(dir.path(), "lines", &[p.clone(), p]).unwrap();
        let h = Histogram {
            title: "log-ratio".into(),
            x_label: "δ".into(),
            y_label: "tokens".into(),
            edges: vec![-1.0, 0.0, 1.0, 2.0],
            counts: vec![3.0, 0.0, 10.0],
            log_y: true,
        };
        histogram(dir.path(), "hist", &h).unwrap();
        for f in ["lines.png", "lines.svg", "hist.png", "hist.svg"] {
            let bytes = std::fs::read(dir.path().join(f)).unwrap();
            assert!(bytes.len() > 1000, "{f}");
        }
        let png = std::fs::read(dir.path().join("hist.png")).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        let svg = std::fs::read_to_string(dir.path().join("lines.svg")).unwrap();
        assert!(svg.contains("k3"));
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 4);
        let bad = Histogram {
            counts: vec![1.0],
            ..h
        };
        assert!(histogram(dir.path(), "bad", &bad).is_err());
    }
}
