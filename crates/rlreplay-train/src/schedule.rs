//! Schedules: which dataset step each trainer step reads, and which of its rows it keeps.
//!
//! The plan is a pure function of the configuration and the dataset's step list, and every random
//! choice inside a step is drawn from a generator seeded by `(schedule.seed, global step)`, so a
//! resumed run only needs its position in the plan to continue exactly.

use std::collections::BTreeSet;
use std::ops::Range;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use rlreplay_data::StepRange;

use crate::error::{Error, Result};

use crate::config::{ScheduleMode, ScheduleSection};

/// One trainer step of the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedStep {
    /// 1-based trainer step (the `global_step` of the metrics and checkpoints).
    pub global_step: u64,
    /// The dataset step whose rollouts this trainer step trains on.
    pub source_step: i64,
    /// 0-based schedule epoch.
    pub epoch: u32,
}

/// A generator for the random choices of one purpose at one trainer step.
pub fn step_rng(seed: u64, global_step: u64, purpose: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(global_step.wrapping_mul(16).wrapping_add(purpose));
    rng
}

/// Builds the plan. `selected` are the dataset steps chosen by `[data] steps` (ascending),
/// `available` every step the dataset holds (lag mode may read steps before the selection).
pub fn plan(
    cfg: &ScheduleSection,
    selected: &[i64],
    available: &[i64],
) -> Result<Vec<PlannedStep>> {
    if selected.is_empty() {
        return Err(Error::config("data.steps", "no dataset step selected"));
    }
    let have: BTreeSet<i64> = available.iter().copied().collect();
    let mut sources: Vec<(i64, u32)> = Vec::new();
    for epoch in 0..cfg.epochs {
        match cfg.mode {
            ScheduleMode::Exact => sources.extend(selected.iter().map(|&s| (s, epoch))),
            ScheduleMode::Shuffle => {
                let mut order = selected.to_vec();
                order.shuffle(&mut step_rng(cfg.seed, u64::from(epoch), 1));
                sources.extend(order.into_iter().map(|s| (s, epoch)));
            }
            ScheduleMode::Lag => {
                // Until a shard `lag` steps older exists, a step trains on its own rollouts
                // (the run's own updates): from then on the policy is `lag` updates ahead of
                // the policy that sampled the rows it trains on.
                let lagged = |s: i64| Some(s - cfg.lag as i64).filter(|s| have.contains(s));
                if epoch == 0 && selected.iter().all(|&s| lagged(s).is_none()) {
                    return Err(Error::config(
                        "schedule.lag",
                        format!(
                            "the schedule has no stale step: lag {} leaves no selected step \
                             with an earlier shard",
                            cfg.lag
                        ),
                    ));
                }
                sources.extend(selected.iter().map(|&s| (lagged(s).unwrap_or(s), epoch)));
            }
            ScheduleMode::Mix => {
                let ranges: Vec<(Vec<i64>, f64)> = cfg
                    .mix
                    .iter()
                    .map(|m| {
                        let range: StepRange = m.steps.parse().map_err(|e| {
                            Error::config("schedule.mix", format!("[schedule] mix: {e}"))
                        })?;
                        let steps: Vec<i64> = have
                            .iter()
                            .copied()
                            .filter(|&s| range.contains(s))
                            .collect();
                        if steps.is_empty() {
                            return Err(Error::config(
                                "schedule.mix",
                                format!("[schedule] mix range {:?} holds no dataset step", m.steps),
                            ));
                        }
                        Ok((steps, m.weight))
                    })
                    .collect::<Result<_>>()?;
                let covered: BTreeSet<i64> = ranges.iter().flat_map(|r| r.0.clone()).collect();
                let total: f64 = ranges.iter().map(|r| r.1).sum();
                for _ in 0..covered.len() {
                    let mut rng = step_rng(cfg.seed, sources.len() as u64 + 1, 2);
                    let mut u = rng.random::<f64>() * total;
                    let mut pick = ranges.len() - 1;
                    for (j, r) in ranges.iter().enumerate() {
                        if u < r.1 {
                            pick = j;
                            break;
                        }
                        u -= r.1;
                    }
                    let steps = &ranges[pick].0;
                    sources.push((steps[rng.random_range(0..steps.len())], epoch));
                }
            }
        }
    }
    Ok(sources
        .into_iter()
        .enumerate()
        .map(|(i, (source_step, epoch))| PlannedStep {
            global_step: i as u64 + 1,
            source_step,
            epoch,
        })
        .collect())
}

/// What the row selection of one step removed, for the step's metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SelectionStats {
    /// Groups in the shard.
    pub groups_in: usize,
    /// Groups dropped because no rollout succeeded.
    pub dropped_solve_none: usize,
    /// Groups dropped because every rollout succeeded.
    pub dropped_solve_all: usize,
    /// Rows dropped because their response was truncated.
    pub dropped_truncated: usize,
    /// Rows removed by subsampling.
    pub dropped_subsample: usize,
    /// Groups removed by the group subsample (`group_fraction`).
    pub dropped_group_fraction: usize,
    /// Rows kept.
    pub rows_out: usize,
    /// Groups kept.
    pub groups_out: usize,
}

/// Chooses the rows of one step: group filters (on the logged groups), truncation filter,
/// subsampling of rollouts, subsampling of groups, then (shuffle mode) a seeded permutation of
/// the groups. Returns the kept row
/// indices, each group's rows contiguous and in logged order.
pub fn select_rows(
    cfg: &ScheduleSection,
    step: &PlannedStep,
    groups: &[Range<usize>],
    scores: &[f32],
    truncated: &[bool],
    success_threshold: f64,
) -> (Vec<usize>, SelectionStats) {
    let mut st = SelectionStats {
        groups_in: groups.len(),
        ..Default::default()
    };
    let mut rng = step_rng(cfg.seed, step.global_step, 3);
    let mut kept: Vec<Vec<usize>> = Vec::with_capacity(groups.len());
    for g in groups {
        let wins = scores[g.clone()]
            .iter()
            .filter(|&&s| f64::from(s) >= success_threshold)
            .count();
        if cfg.drop_solve_none && wins == 0 {
            st.dropped_solve_none += 1;
            continue;
        }
        if cfg.drop_solve_all && wins == g.len() {
            st.dropped_solve_all += 1;
            continue;
        }
        let mut rows: Vec<usize> = g.clone().collect();
        if cfg.drop_truncated {
            rows.retain(|&r| !truncated[r]);
            st.dropped_truncated += g.len() - rows.len();
        }
        if cfg.subsample > 0 && rows.len() > cfg.subsample {
            let mut pick = rand::seq::index::sample(&mut rng, rows.len(), cfg.subsample).into_vec();
            pick.sort_unstable();
            st.dropped_subsample += rows.len() - pick.len();
            rows = pick.into_iter().map(|i| rows[i]).collect();
        }
        if !rows.is_empty() {
            kept.push(rows);
        }
    }
    if cfg.group_fraction < 1.0 && !kept.is_empty() {
        let n = ((kept.len() as f64 * cfg.group_fraction).round() as usize).clamp(1, kept.len());
        let mut pick = rand::seq::index::sample(&mut rng, kept.len(), n).into_vec();
        pick.sort_unstable();
        st.dropped_group_fraction = kept.len() - n;
        kept = pick
            .into_iter()
            .map(|i| std::mem::take(&mut kept[i]))
            .collect();
    }
    if cfg.mode == ScheduleMode::Shuffle {
        kept.shuffle(&mut rng);
    }
    st.groups_out = kept.len();
    let rows: Vec<usize> = kept.into_iter().flatten().collect();
    st.rows_out = rows.len();
    (rows, st)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MixRange;

    fn cfg(mode: ScheduleMode) -> ScheduleSection {
        ScheduleSection {
            mode,
            ..Default::default()
        }
    }

    #[test]
    fn exact_and_epochs() {
        let mut c = cfg(ScheduleMode::Exact);
        c.epochs = 2;
        let p = plan(&c, &[3, 4, 5], &[1, 2, 3, 4, 5]).unwrap();
        let src: Vec<i64> = p.iter().map(|s| s.source_step).collect();
        assert_eq!(src, [3, 4, 5, 3, 4, 5]);
        assert_eq!(p[5].global_step, 6);
        assert_eq!(p[5].epoch, 1);
    }

    #[test]
    fn shuffle_is_a_seeded_permutation_per_epoch() {
        let mut c = cfg(ScheduleMode::Shuffle);
        c.epochs = 2;
        let steps: Vec<i64> = (1..=20).collect();
        let p = plan(&c, &steps, &steps).unwrap();
        assert_eq!(p, plan(&c, &steps, &steps).unwrap());
        let e0: Vec<i64> = p[..20].iter().map(|s| s.source_step).collect();
        let e1: Vec<i64> = p[20..].iter().map(|s| s.source_step).collect();
        assert_ne!(e0, steps);
        assert_ne!(e0, e1);
        let mut sorted = e0.clone();
        sorted.sort();
        assert_eq!(sorted, steps);
    }

    #[test]
    fn lag_reads_older_shards() {
        let mut c = cfg(ScheduleMode::Lag);
        c.lag = 2;
        let p = plan(&c, &[1, 2, 3, 4], &[1, 2, 3, 4]).unwrap();
        let src: Vec<i64> = p.iter().map(|s| s.source_step).collect();
        assert_eq!(
            src,
            [1, 2, 1, 2],
            "two updates of the run's own, then 2 steps stale"
        );
        let p = plan(&c, &[3, 4], &[1, 2, 3, 4]).unwrap();
        let src: Vec<i64> = p.iter().map(|s| s.source_step).collect();
        assert_eq!(src, [1, 2]);
        c.epochs = 2;
        let p = plan(&c, &[1, 2, 3], &[1, 2, 3]).unwrap();
        let src: Vec<i64> = p.iter().map(|s| s.source_step).collect();
        assert_eq!(src, [1, 2, 1, 1, 2, 1]);
        c.epochs = 1;
        c.lag = 9;
        assert!(plan(&c, &[3, 4], &[1, 2, 3, 4]).is_err());
    }

    #[test]
    fn mix_draws_from_weighted_ranges() {
        let mut c = cfg(ScheduleMode::Mix);
        c.mix = vec![
            MixRange {
                steps: "1..10".into(),
                weight: 9.0,
            },
            MixRange {
                steps: "91..100".into(),
                weight: 1.0,
            },
        ];
        let all: Vec<i64> = (1..=100).collect();
        let p = plan(&c, &all, &all).unwrap();
        assert_eq!(p.len(), 20);
        let early = p.iter().filter(|s| s.source_step <= 10).count();
        assert!(early >= 13, "{early}");
        assert!(p.iter().all(|s| s.source_step <= 10 || s.source_step >= 91));
        c.mix[1].steps = "200..300".into();
        assert!(plan(&c, &all, &all).is_err());
    }

    #[test]
    fn filters_and_subsample() {
        let groups = vec![0..4, 4..8, 8..12];
        let scores = [0., 0., 0., 0., 1., 0., 1., 0., 1., 1., 1., 1.];
        let mut trunc = [false; 12];
        trunc[5] = true;
        let step = PlannedStep {
            global_step: 1,
            source_step: 1,
            epoch: 0,
        };
        let mut c = cfg(ScheduleMode::Exact);
        let (rows, st) = select_rows(&c, &step, &groups, &scores, &trunc, 0.5);
        assert_eq!(rows, (0..12).collect::<Vec<_>>());
        assert_eq!(st.groups_out, 3);
        c.drop_solve_none = true;
        c.drop_solve_all = true;
        c.drop_truncated = true;
        let (rows, st) = select_rows(&c, &step, &groups, &scores, &trunc, 0.5);
        assert_eq!(rows, [4, 6, 7]);
        assert_eq!(
            (
                st.dropped_solve_none,
                st.dropped_solve_all,
                st.dropped_truncated
            ),
            (1, 1, 1)
        );
        c.drop_truncated = false;
        c.subsample = 2;
        let (rows, st) = select_rows(&c, &step, &groups, &scores, &trunc, 0.5);
        assert_eq!(rows.len(), 2);
        assert!(rows.windows(2).all(|w| w[0] < w[1]) && rows.iter().all(|r| (4..8).contains(r)));
        assert_eq!(st.dropped_subsample, 2);
    }

    #[test]
    fn group_fraction_keeps_whole_groups_in_order() {
        let groups: Vec<Range<usize>> = (0..8).map(|g| g * 2..g * 2 + 2).collect();
        let scores = [0.0f32; 16];
        let trunc = [false; 16];
        let mut c = cfg(ScheduleMode::Exact);
        c.group_fraction = 0.25;
        let step = PlannedStep {
            global_step: 2,
            source_step: 2,
            epoch: 0,
        };
        let (rows, st) = select_rows(&c, &step, &groups, &scores, &trunc, 0.5);
        assert_eq!(
            (st.groups_out, st.dropped_group_fraction, rows.len()),
            (2, 6, 4)
        );
        assert!(rows.windows(2).all(|w| w[0] < w[1]));
        assert!(rows.chunks(2).all(|p| p[0] % 2 == 0 && p[1] == p[0] + 1));
        assert_eq!(
            rows,
            select_rows(&c, &step, &groups, &scores, &trunc, 0.5).0
        );
        c.group_fraction = 0.01;
        assert_eq!(
            select_rows(&c, &step, &groups, &scores, &trunc, 0.5)
                .1
                .groups_out,
            1
        );
    }

    #[test]
    fn shuffle_mode_permutes_whole_groups() {
        let groups: Vec<Range<usize>> = (0..8).map(|g| g * 2..g * 2 + 2).collect();
        let scores = [0.0f32; 16];
        let trunc = [false; 16];
        let c = cfg(ScheduleMode::Shuffle);
        let step = PlannedStep {
            global_step: 3,
            source_step: 1,
            epoch: 0,
        };
        let (rows, _) = select_rows(&c, &step, &groups, &scores, &trunc, 0.5);
        assert_ne!(rows, (0..16).collect::<Vec<_>>());
        for pair in rows.chunks(2) {
            assert_eq!(pair[0] % 2, 0);
            assert_eq!(pair[1], pair[0] + 1);
        }
    }

    /// Guards that the one success threshold (`[algorithm] success_reward_threshold`, at least
    /// the threshold) is the one the `drop_solve_*` filters use: a score of exactly 0.5 is a
    /// success at the default, and a raised threshold turns 0.6 into a failure.
    #[test]
    fn filters_use_the_configured_success_threshold() {
        let groups = [0..2, 2..4];
        let scores = [0.5, 0.5, 0.6, 0.6];
        let step = PlannedStep {
            global_step: 1,
            source_step: 1,
            epoch: 0,
        };
        let mut c = cfg(ScheduleMode::Exact);
        c.drop_solve_none = true;
        let (rows, _) = select_rows(&c, &step, &groups, &scores, &[false; 4], 0.5);
        assert_eq!(rows, [0, 1, 2, 3]);
        let (rows, st) = select_rows(&c, &step, &groups, &scores, &[false; 4], 0.8);
        assert!(rows.is_empty());
        assert_eq!(st.dropped_solve_none, 2);
    }
}
