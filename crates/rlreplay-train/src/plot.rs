//! Training curves over trainer steps, as PNG and SVG: the mean score and the loss, and what the
//! policy learns: its per-token log-prob of successful and of failed responses, and how far it is
//! from the behaviour policy (KL, importance weights, rejection).

use std::path::Path;

use rlreplay_plot::{Panel, Series};

use crate::error::Result;
use crate::rundir::ScoreHistory;

/// `(training_scores.csv column, legend)` of each line of a panel.
type Lines = &'static [(&'static str, &'static str)];

/// The panels of `training_score`: title, y label, and the `(training_scores.csv column, legend)`
/// of each line. The score and the loss are always drawn; a later panel none of whose columns
/// has a value (no correction configured, no successful row) is left out.
const PANELS: &[(&str, &str, Lines)] = &[
    (
        "critic/score/mean",
        "mean score",
        &[("score_mean", "mean score")],
    ),
    ("actor/pg_loss", "loss", &[("loss", "loss")]),
    (
        "replay/logprob_success, replay/logprob_failure",
        "policy log-prob per token",
        &[
            ("logprob_success", "successful responses"),
            ("logprob_failure", "failed responses"),
        ],
    ),
    (
        "rollout_corr/kl, rollout_corr/k3_kl",
        "KL(behaviour || policy)",
        &[("rollout_corr_kl", "k1"), ("rollout_corr_k3_kl", "k3")],
    ),
    (
        "rollout_corr: importance weights",
        "weight / fraction",
        &[
            ("rollout_is_mean", "IS weight mean"),
            ("rollout_is_eff_sample_size", "effective sample size"),
            ("rollout_rs_masked_fraction", "rejected token fraction"),
        ],
    ),
];

/// Draws `training_score.png` and `training_score.svg` in `dir` from the columns of
/// `training_scores.csv`.
pub fn training_score(history: &ScoreHistory, dir: &Path) -> Result<()> {
    let panels: Vec<Panel> = PANELS
        .iter()
        .enumerate()
        .filter_map(|(i, (title, y_label, lines))| {
            let series: Vec<Series> = lines
                .iter()
                .filter_map(|(column, label)| {
                    let points = history.get(*column).filter(|p| !p.is_empty())?;
                    Some(Series {
                        label: (*label).into(),
                        points: points.iter().map(|&(s, v)| (s as f64, v)).collect(),
                    })
                })
                .collect();
            (i < 2 || !series.is_empty()).then(|| Panel {
                title: (*title).into(),
                x_label: "trainer step".into(),
                y_label: (*y_label).into(),
                series,
            })
        })
        .collect();
    rlreplay_plot::panels(dir, "training_score", &panels)?;
    Ok(())
}
