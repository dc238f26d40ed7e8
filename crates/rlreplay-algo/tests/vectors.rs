//! Hand-derived test vectors of every estimator, loss, aggregation, correction and RLSD formula.

use rlreplay_algo::advantage::maxrl_family_weights;
use rlreplay_algo::rlsd::{decayed_lambda, reweight_token};
use rlreplay_algo::*;

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + b.abs())
}

#[track_caller]
fn assert_all_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!(close(*g, *w, tol), "{got:?} vs {want:?}");
    }
}

fn cfg(est: AdvEstimator) -> AlgoConfig {
    AlgoConfig {
        adv_estimator: est,
        singleton_groups: SingletonPolicy::Verl,
        ..AlgoConfig::default()
    }
}

/// Advantages of one group (one token per row).
fn adv(c: &AlgoConfig, scores: &[f64]) -> Vec<f64> {
    let uids = vec!["g"; scores.len()];
    let offsets: Vec<usize> = (0..=scores.len()).collect();
    compute_advantages(c, &uids, scores, &offsets, None)
        .unwrap()
        .rows
}

fn group(g: usize, k: usize) -> Vec<f64> {
    (0..g).map(|i| if i < k { 1.0 } else { 0.0 }).collect()
}

#[test]
fn grpo() {
    let c = cfg(AdvEstimator::Grpo);
    assert_all_close(
        &adv(&c, &[1., 0., 0., 1.]),
        &[0.866024, -0.866024, -0.866024, 0.866024],
        1e-6,
    );
    assert_all_close(
        &adv(&c, &[1., 0., 0., 0.]),
        &[1.499997, -0.499999, -0.499999, -0.499999],
        1e-6,
    );
    assert_eq!(adv(&c, &[0.; 4]), vec![0.; 4]);
    assert_eq!(adv(&c, &[1.; 4]), vec![0.; 4]);
    assert_all_close(&adv(&c, &[1.]), &[0.999999], 1e-6);
    let a = adv(&c, &group(16, 1));
    assert_all_close(&[a[0], a[1]], &[3.749985, -0.249999], 1e-6);
    let a = adv(&c, &group(16, 4));
    assert_all_close(&[a[0], a[4]], &[1.677047, -0.559016], 1e-6);
}

#[test]
fn dr_grpo() {
    let c = AlgoConfig {
        norm_adv_by_std_in_grpo: false,
        ..cfg(AdvEstimator::Grpo)
    };
    assert_all_close(
        &adv(&c, &[1., 0., 0., 0.]),
        &[0.75, -0.25, -0.25, -0.25],
        1e-12,
    );
    assert_eq!(adv(&c, &[1.]), vec![1.]);
    assert_eq!(adv(&c, &[1.; 3]), vec![0.; 3]);
}

#[test]
fn rloo() {
    let c = cfg(AdvEstimator::Rloo);
    let t = 1.0 / 3.0;
    assert_all_close(&adv(&c, &[1., 0., 0., 0.]), &[1., -t, -t, -t], 1e-12);
    let t = 2.0 / 3.0;
    assert_all_close(&adv(&c, &[1., 1., 0., 0.]), &[t, t, -t, -t], 1e-12);
    assert_eq!(adv(&c, &[1.]), vec![1.]);
}

#[test]
fn maxrl() {
    let c = cfg(AdvEstimator::Maxrl);
    assert_all_close(
        &adv(&c, &[1., 0., 0., 0.]),
        &[2.999988, -0.999996, -0.999996, -0.999996],
        1e-6,
    );
    assert_all_close(
        &adv(&c, &[1., 1., 0., 0.]),
        &[0.999998, 0.999998, -0.999998, -0.999998],
        1e-6,
    );
    assert_eq!(adv(&c, &[0.; 4]), vec![0.; 4]);
    assert_eq!(adv(&c, &[1.; 4]), vec![0.; 4]);
    assert_all_close(&adv(&c, &[1.]), &[1e6], 1e-12);
    assert_eq!(adv(&c, &[0.]), vec![0.]);
    let a = adv(&c, &group(16, 1));
    assert_all_close(&[a[0], a[1]], &[14.999760, -0.999984], 1e-6);
    let a = adv(&c, &group(16, 4));
    assert_all_close(&[a[0], a[4]], &[2.999988, -0.999996], 1e-6);
}

#[test]
fn overflowing_scores_are_an_error_never_silent_zeros() {
    // ±1e308: their squares (and some sums) overflow f64, which once turned GRPO's std into
    // infinity and every advantage into 0.
    for scores in [
        vec![1e308, -1e308],
        vec![1e308, 1e308, 0.0],
        vec![-1e308, -1e308, 1.0],
        vec![f64::MAX, 0.0],
    ] {
        for name in AdvEstimator::NAMES {
            let c = cfg(AdvEstimator::from_name(name).unwrap());
            let uids = vec!["g"; scores.len()];
            let offsets: Vec<usize> = (0..=scores.len()).collect();
            match compute_advantages(&c, &uids, &scores, &offsets, None) {
                Ok(a) => {
                    assert!(
                        a.rows.iter().chain(&a.tokens).all(|x| x.is_finite()),
                        "{name} {scores:?}: {:?}",
                        a.rows
                    );
                }
                Err(e) => {
                    let msg = e.to_string();
                    assert!(msg.contains("rescale the rewards"), "{name}: {msg}");
                }
            }
        }
    }
    let err = compute_advantages(
        &cfg(AdvEstimator::Grpo),
        &["u", "u"],
        &[1e308, -1e308],
        &[0, 1, 2],
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("standard deviation of group `u`'s scores is inf"),
        "{err}"
    );
}

#[test]
fn singleton_groups_default_to_zero_and_are_counted() {
    // reinforce_plus_plus has no groups: its baseline is the batch whitening.
    for est in AdvEstimator::NAMES
        .iter()
        .filter(|&&n| n != "reinforce_plus_plus")
    {
        let c = AlgoConfig {
            adv_estimator: AdvEstimator::from_name(est).unwrap(),
            ..AlgoConfig::default()
        };
        let out = compute_advantages(&c, &["a", "b", "b"], &[1.0, 1.0, 0.0], &[0, 1, 2, 3], None)
            .unwrap();
        assert_eq!(out.rows[0], 0.0, "{est}");
        assert_eq!(out.metrics["advantage/singleton_groups"], 1.0);
        assert_eq!(out.metrics["advantage/groups"], 2.0);
    }
}

/// MaxRL population weight `w_T(p) = (1 − (1−p)^T)/p`.
fn w_t(p: f64, t: i32) -> f64 {
    (1.0 - (1.0 - p).powi(t)) / p
}

#[test]
fn maxrl_population_weights() {
    assert!(close(w_t(0.25, 1), 1.0, 1e-12));
    assert!(close(w_t(0.25, 4), 2.734375, 1e-9));
    assert!(close(w_t(0.25, 16), 3.959910, 1e-6));
    assert!(close(1.0 / (0.25f64 * 0.75).sqrt(), 2.309401, 1e-6));
}

#[test]
fn maclaurin_weights() {
    let w = |c, t| maxrl_family_weights(AdvEstimator::Maclaurin, 4, c, t);
    let check = |(a, b): (f64, f64), (x, y): (f64, f64)| {
        assert!(close(a, x, 1e-6) && close(b, y, 1e-6), "{a} {b} vs {x} {y}")
    };
    check(w(1, 4), (0.25, -0.25));
    check(w(0, 4), (0.25, -0.75));
    check(w(2, 4), (0.25, -0.083333));
    check(w(4, 4), (0.25, 0.0));
    check(w(0, 2), (0.25, -0.25));
    // Exact enumeration over Bernoulli outcomes: the expected weight on a success equals w_T(p).
    for (t, want) in [(4, 2.533), (2, 1.7)] {
        let p: f64 = 0.3;
        let mut e = 0.0;
        for mask in 0u32..16 {
            let c = mask.count_ones() as usize;
            let prob = p.powi(c as i32) * (1.0 - p).powi(4 - c as i32);
            let (ws, wf) = maxrl_family_weights(AdvEstimator::Maclaurin, 4, c, t);
            // ∇p weight: Σ_i w_i ∂log π(z_i) ... per-sample score of success is 1/p, failure −1/(1−p).
            e += prob * (c as f64 * ws / p - (4 - c) as f64 * wf / (1.0 - p));
        }
        assert!(close(e, want, 1e-3), "T={t}: {e}");
    }
}

#[test]
fn oversample_subset_weights() {
    let w = |c, t| maxrl_family_weights(AdvEstimator::OversampleSubsetVr, 4, c, t);
    let check = |(a, b): (f64, f64), (x, y): (f64, f64)| {
        assert!(close(a, x, 1e-6) && close(b, y, 1e-6), "{a} {b} vs {x} {y}")
    };
    check(w(1, 2), (0.5 - 0.25, -0.25));
    check(w(2, 2), (0.416667 - 0.25, -0.25));
    check(w(2, 4), (0.5 - 0.25, -0.25));
    assert!(close(w(0, 2).1, -0.25, 1e-12));
}

#[test]
fn maclaurin_baseline_weights() {
    let w = |c| maxrl_family_weights(AdvEstimator::MaclaurinBaseline, 4, c, 4);
    let (a, b) = w(1);
    assert!(
        close(a, 0.483333, 1e-6) && close(b, -0.077778, 1e-6),
        "{a} {b}"
    );
    let (a, b) = w(2);
    assert!(close(a, 0.3, 1e-6) && close(b, -0.05, 1e-6), "{a} {b}");
    assert!(close(w(0).1, -0.25, 1e-12));
}

#[test]
fn vr_cond_and_cross_fitted() {
    let (a, b) = maxrl_family_weights(AdvEstimator::VrCond, 4, 1, 16);
    assert!(close(a, 0.75, 1e-12) && close(b, -0.25, 1e-12));
    // With T = N the subset estimator is exactly vr_cond.
    for c in 1..=4 {
        let x = maxrl_family_weights(AdvEstimator::VrCond, 4, c, 4);
        let y = maxrl_family_weights(AdvEstimator::OversampleSubsetVr, 4, c, 4);
        assert!(close(x.0, y.0, 1e-12) && close(x.1, y.1, 1e-12));
    }
    // Cross-fitted maclaurin is unbiased for ∇J^(T): exact enumeration at N = 4.
    for p in [0.1f64, 0.3, 0.7] {
        for t in [2, 4] {
            let mut e = 0.0;
            for mask in 0u32..16 {
                let c = mask.count_ones() as usize;
                let prob = p.powi(c as i32) * (1.0 - p).powi(4 - c as i32);
                let (ws, wf) = maxrl_family_weights(AdvEstimator::CrossFittedMaclaurin, 4, c, t);
                e += prob * (c as f64 * ws / p - (4 - c) as f64 * wf / (1.0 - p));
            }
            assert!(close(e, w_t(p, t as i32), 1e-9), "p={p} T={t}: {e}");
        }
    }
}

#[test]
fn pkpo() {
    let c = AlgoConfig {
        pass_k: 2,
        ..cfg(AdvEstimator::Pkpo)
    };
    let t = 1.0 / 3.0;
    assert_all_close(&adv(&c, &[1., 0., 0., 0.]), &[1., -t, -t, -t], 1e-12);
    let t = 4.0 / 9.0;
    assert_all_close(&adv(&c, &[1., 1., 0., 0.]), &[t, t, -t, -t], 1e-12);
    assert_eq!(adv(&c, &[1.; 4]), vec![0.; 4]);
}

#[test]
fn grpo_passk() {
    let c = cfg(AdvEstimator::GrpoPassk);
    assert_all_close(&adv(&c, &[1., 0., 0., 0.]), &[1.999996, 0., 0., 0.], 1e-6);
    assert_eq!(adv(&c, &[1., 1., 0., 0.]), vec![0.; 4]);
}

#[test]
fn reinforce_plus_plus_whitening() {
    // Two rows of lengths 2 and 1, one group with scores [1, 0].
    let want = [0.577350, 0.577350, -1.154701];
    for est in [
        AdvEstimator::ReinforcePlusPlusBaseline,
        AdvEstimator::ReinforcePlusPlus,
    ] {
        let out =
            compute_advantages(&cfg(est), &["g", "g"], &[1.0, 0.0], &[0, 2, 3], None).unwrap();
        assert_all_close(&out.tokens, &want, 1e-6);
    }
}

/// REINFORCE losses of two rows (A = [3, −1]; ℓ = [−0.5, −1.0] and [−2.0]) under every
/// aggregation mode, with a scale factor of 4 (the padded width).
#[test]
fn aggregation_modes() {
    let offsets = [0, 2, 3];
    let logprobs = [-0.5, -1.0, -2.0];
    let adv = [3.0, 3.0, -1.0];
    for (mode, want) in [
        (AggMode::TokenMean, 2.5 / 3.0),
        (AggMode::SeqMeanTokenSum, 1.25),
        (AggMode::SeqMeanTokenMean, 0.125),
        (AggMode::SeqMeanTokenSumNorm, 0.625),
    ] {
        let c = AlgoConfig {
            loss_mode: LossMode::Reinforce,
            loss_agg_mode: mode,
            loss_scale_factor: Some(4.0),
            ..AlgoConfig::default()
        };
        let norm = Normalizer::new(&c, &offsets, None).unwrap();
        let mb = MicroBatch {
            offsets: &offsets,
            logprobs: &logprobs,
            token_advantages: &adv,
            ..MicroBatch::default()
        };
        let out = policy_loss(&c, &norm, &mb).unwrap();
        assert!(close(out.loss, want, 1e-12), "{mode:?}: {}", out.loss);
        if mode == AggMode::TokenMean {
            assert_all_close(&out.grad_logprobs, &[-1.0, -1.0, 1.0 / 3.0], 1e-12);
        }
    }
}

#[test]
fn ppo_dual_clip_table() {
    let c = AlgoConfig {
        clip_ratio_low: Some(0.2),
        clip_ratio_high: Some(0.28),
        ..AlgoConfig::default()
    };
    let rows: [(f64, f64, f64, bool, bool); 9] = [
        (1.0, 1.5, -1.28, true, false),
        (1.0, 1.1, -1.1, false, false),
        (1.0, 0.5, -0.5, false, false),
        (1.0, 0.7, -0.7, false, false),
        (-1.0, 0.5, 0.8, true, false),
        (-1.0, 1.1, 1.1, false, false),
        (-1.0, 1.4, 1.4, false, false),
        (-1.0, 4.0, 3.0, false, true),
        (0.0, 2.0, 0.0, false, false),
    ];
    for (a, rho, loss, clip, lower) in rows {
        let offsets = [0, 1];
        let lp = [rho.ln() - 1.0];
        let old = [-1.0];
        let norm = Normalizer::new(&c, &offsets, None).unwrap();
        let mb = MicroBatch {
            offsets: &offsets,
            logprobs: &lp,
            old_logprobs: Some(&old),
            token_advantages: &[a],
            ..MicroBatch::default()
        };
        let out = policy_loss(&c, &norm, &mb).unwrap();
        assert!(close(out.loss, loss, 1e-9), "A={a} ρ={rho}: {}", out.loss);
        assert_eq!(out.metrics["actor/pg_clipfrac"], f64::from(u8::from(clip)));
        assert_eq!(
            out.metrics["actor/pg_clipfrac_lower"],
            f64::from(u8::from(lower))
        );
    }
}

fn is_cfg(level: IsLevel) -> AlgoConfig {
    AlgoConfig {
        rollout_is: Some(level),
        rollout_is_threshold: 2.0,
        ..AlgoConfig::default()
    }
}

#[test]
fn token_tis_weights() {
    let c = is_cfg(IsLevel::Token);
    let offsets = [0, 1, 2, 3];
    let out =
        rollout_correction(&c, &offsets, &[-1.0, -0.2, -2.0], &[-1.5, -1.2, -1.0], None).unwrap();
    assert_all_close(
        out.is_weights.as_deref().unwrap(),
        &[1.648721, 2.0, 0.367879],
        1e-6,
    );
}

#[test]
fn rollout_correction_metrics() {
    let offsets = [0, 3];
    let old = [-1.0, -0.5, -2.0];
    let roll = [-1.5, -1.5, -1.0];
    let out = rollout_correction(&is_cfg(IsLevel::Token), &offsets, &old, &roll, None).unwrap();
    let m = &out.metrics;
    let g = |k: &str| m[&format!("rollout_corr/{k}")];
    for (k, v) in [
        ("rollout_is_mean", 1.578294),
        ("rollout_is_max", std::f64::consts::E),
        ("rollout_is_min", 0.367879),
        ("rollout_is_ratio_fraction_high", 1.0 / 3.0),
        ("rollout_is_ratio_fraction_low", 1.0 / 3.0),
        ("rollout_is_std", 0.640569),
        ("rollout_is_eff_sample_size", 0.823344),
        ("kl", -0.166667),
        ("k3_kl", 0.411628),
        ("chi2_token", 2.414224),
        ("chi2_seq", 1.718282),
        ("training_ppl", 3.211271),
        ("rollout_ppl", 3.793668),
        ("log_ppl_diff", -0.166667),
        ("ppl_ratio", 0.846482),
    ] {
        assert!(close(g(k), v, 2e-6), "{k}: {} vs {v}", g(k));
    }
    assert_all_close(
        out.is_weights.as_deref().unwrap(),
        &[1.648721, 2.0, 0.367879],
        1e-6,
    );
    let seq = rollout_correction(&is_cfg(IsLevel::Sequence), &offsets, &old, &roll, None).unwrap();
    assert_all_close(&seq.is_weights.unwrap(), &[1.648721; 3], 1e-6);
    let geo = rollout_correction(&is_cfg(IsLevel::Geometric), &offsets, &old, &roll, None).unwrap();
    assert_all_close(&geo.is_weights.unwrap(), &[1.181360; 3], 1e-6);
}

#[test]
fn rlsd_reweighting_table() {
    let rows: [(f64, f64, f64, f64, f64, f64); 7] = [
        (0.5, -1.0, -2.0, 0.55, std::f64::consts::E, 1.2),
        (0.5, -2.1, -2.0, 0.476209, 0.904837, 0.904837),
        (-0.5, -1.0, -2.0, -0.45, 0.367879, 0.8),
        (-0.5, -2.1, -2.0, -0.526293, 1.105171, 1.105171),
        (0.0, -1.0, -2.0, 0.0, 1.0, 1.0),
        (2.0, -1.0, -2.0, 2.2, std::f64::consts::E, 1.2),
        (-2.0, -3.0, -2.0, -2.2, std::f64::consts::E, 1.2),
    ];
    for (a, lt, l, ah, wr, wc) in rows {
        let (x, y, z) = reweight_token(a, l, lt, 0.5, 0.2, false, true);
        assert!(close(x, ah, 1e-6) && close(y, wr, 1e-6) && close(z, wc, 1e-6));
    }
    assert_eq!(
        reweight_token(0.5, -1.0, -7.0, 0.5, 0.2, false, false).0,
        0.5
    );
    // λ decay: λ0 = 1, D = 10, step 6 → 0.5.
    let lambda = decayed_lambda(1.0, Some(10), Some(6));
    assert!(close(lambda, 0.5, 1e-12));
    let (x, _, _) = reweight_token(1.0, -1.0, 0.0, lambda, 10.0, false, true);
    assert!(close(x, 1.859141, 1e-6));
}

/// Two rows of two tokens, A = [2, −2], ℓ = −2, ℓ_T = [−1, −3]: Â = 1.1·A, every weight clipped.
#[test]
fn rlsd_loss_metrics() {
    let c = AlgoConfig {
        loss_mode: LossMode::Rlsd,
        ..AlgoConfig::default()
    };
    let offsets = [0, 1, 2];
    let norm = Normalizer::new(&c, &offsets, None).unwrap();
    let mb = MicroBatch {
        offsets: &offsets,
        logprobs: &[-2.0, -2.0],
        token_advantages: &[2.0, -2.0],
        teacher_logprobs: Some(&[-1.0, -3.0]),
        ..MicroBatch::default()
    };
    let out = policy_loss(&c, &norm, &mb).unwrap();
    assert_all_close(&out.token_advantages, &[2.2, -2.2], 1e-12);
    assert_eq!(
        out.metrics["self_distillation/token_reweight_w_clip_frac"],
        1.0
    );
}

#[test]
fn rlrt_variant() {
    let c = AlgoConfig {
        loss_mode: LossMode::Rlrt,
        token_reweight_lambda: 1.0,
        token_reweight_eps_w: 10.0,
        ..AlgoConfig::default()
    };
    let offsets = [0, 2, 4];
    let norm = Normalizer::new(&c, &offsets, None).unwrap();
    let mb = MicroBatch {
        offsets: &offsets,
        logprobs: &[-1.0, -3.0, -1.0, -3.0],
        token_advantages: &[2.0; 4],
        teacher_logprobs: Some(&[-2.0; 4]),
        correct: Some(&[true, false]),
        ..MicroBatch::default()
    };
    let out = policy_loss(&c, &norm, &mb).unwrap();
    assert_all_close(&out.token_advantages, &[5.436564, 0.735759, 2.0, 2.0], 1e-6);
}

#[test]
fn trust_region_teacher() {
    let lp = trust_region_logprobs(&[2.0, 0.0, 0.0], &[0.0, 2.0, 0.0], 0.1, 1.0).unwrap();
    assert_all_close(&lp, &[-0.312761, -1.912761, -2.112761], 1e-6);
    let lp = trust_region_logprobs(&[2.0, 0.0, 0.0], &[0.0, 2.0, 0.0], 0.0, 1.0).unwrap();
    assert_all_close(&lp, &[-0.239545, -2.239545, -2.239545], 1e-6);
    assert!(trust_region_logprobs(&[1.0], &[1.0, 2.0], 0.1, 1.0).is_none());
}

/// Four rows with constant per-token loss (1, 1, 2, 2) and lengths (1, 1, 4, 4), micro-batches of
/// two rows: global token-mean 1.8, verl's mean of micro-batch means 1.5.
#[test]
fn micro_batch_vs_global_token_mean() {
    let offsets = [0, 1, 2, 6, 10];
    let logprobs = [-1.0; 10];
    let adv = [1., 1., 2., 2., 2., 2., 2., 2., 2., 2.];
    for (normalizer, want) in [(AggNormalizer::Global, 1.8), (AggNormalizer::Verl, 1.5)] {
        let c = AlgoConfig {
            loss_mode: LossMode::Reinforce,
            loss_agg_normalizer: normalizer,
            ppo_micro_batch_size_per_gpu: Some(2),
            ..AlgoConfig::default()
        };
        let norm = Normalizer::new(&c, &offsets, None).unwrap();
        let mut total = 0.0;
        for (a, b) in [(0usize, 2usize), (2, 4)] {
            let (s, e) = (offsets[a], offsets[b]);
            let mb = MicroBatch {
                first_row: a,
                offsets: &offsets[a..=b],
                logprobs: &logprobs[s..e],
                token_advantages: &adv[s..e],
                ..MicroBatch::default()
            };
            total += policy_loss(&c, &norm, &mb).unwrap().loss;
        }
        assert!(close(total, want, 1e-12), "{normalizer:?}: {total}");
        // The same split and sum in one call.
        let whole = MicroBatch {
            offsets: &offsets,
            logprobs: &logprobs,
            token_advantages: &adv,
            ..MicroBatch::default()
        };
        let out = mini_batch_loss(&c, &whole).unwrap();
        assert_eq!(out.loss, total, "{normalizer:?}");
        assert_eq!(out.valid_tokens, 10);
        assert_eq!(out.grad_logprobs.len(), 10);
    }
}

/// RLSD_TR on-policy: Dr.GRPO group [1, 0, 0, 0], row 0 inactive (only success), rows 1 and 2
/// active, one token each; IS weights 1, 2, 0.5.
#[test]
fn rlsd_tr_end_to_end() {
    let c = AlgoConfig {
        adv_estimator: AdvEstimator::Grpo,
        norm_adv_by_std_in_grpo: false,
        loss_mode: LossMode::Rlsd,
        clip_ratio_low: Some(0.2),
        clip_ratio_high: Some(0.28),
        ..AlgoConfig::default()
    };
    let a = compute_advantages(&c, &["g"; 4], &[1., 0., 0., 0.], &[0, 1, 2, 3, 4], None).unwrap();
    assert_all_close(&a.rows, &[0.75, -0.25, -0.25, -0.25], 1e-12);
    let offsets = [0, 1, 2, 3];
    let norm = Normalizer::new(&c, &offsets, None).unwrap();
    let mb = MicroBatch {
        offsets: &offsets,
        logprobs: &[-1.5, -2.0, -1.0],
        token_advantages: &a.tokens[..3],
        is_weights: Some(&[1.0, 2.0, 0.5]),
        teacher_logprobs: Some(&[-9.0, -1.0, -2.0]),
        sd_active: Some(&[false, true, true]),
        ..MicroBatch::default()
    };
    let out = policy_loss(&c, &norm, &mb).unwrap();
    assert_all_close(&out.token_advantages, &[0.75, -0.225, -0.275], 1e-12);
    assert!(close(out.loss, -0.054167, 1e-5), "{}", out.loss);
    assert_all_close(&out.grad_logprobs, &[-0.25, 0.15, 0.045833], 1e-5);
}

#[test]
fn non_finite_inputs_name_row_and_token() {
    let c = AlgoConfig::default();
    let offsets = [0, 2, 4];
    let norm = Normalizer::new(&c, &offsets, None).unwrap();
    let lp = [-1.0, -1.0, -1.0, -1.0];
    let bad = [-1.0, -1.0, -1.0, f64::NAN];
    let mb = MicroBatch {
        offsets: &offsets,
        logprobs: &lp,
        old_logprobs: Some(&bad),
        token_advantages: &[0.0; 4],
        ..MicroBatch::default()
    };
    let err = policy_loss(&c, &norm, &mb).unwrap_err().to_string();
    assert!(
        err.contains("old_logprobs") && err.contains("row 1, token 1"),
        "{err}"
    );
    let err = compute_advantages(&c, &["a", "a"], &[1.0, f64::INFINITY], &[0, 1, 2], None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("scores") && err.contains("row 1"), "{err}");
    let err = rollout_correction(&is_cfg(IsLevel::Token), &[0, 1], &[f64::NAN], &[-1.0], None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("row 0, token 0"), "{err}");
}

#[test]
fn zero_valid_tokens_give_zero_loss_and_a_count() {
    for mode in AggMode::NAMES {
        let c = AlgoConfig {
            loss_agg_mode: AggMode::from_name(mode).unwrap(),
            ..AlgoConfig::default()
        };
        let offsets = [0, 2, 2];
        let mask = [false, false];
        let norm = Normalizer::new(&c, &offsets, Some(&mask)).unwrap();
        let mb = MicroBatch {
            offsets: &offsets,
            logprobs: &[-1.0, -2.0],
            token_advantages: &[1.0, 1.0],
            mask: Some(&mask),
            ..MicroBatch::default()
        };
        let out = policy_loss(&c, &norm, &mb).unwrap();
        assert_eq!(out.loss, 0.0);
        assert_eq!(out.grad_logprobs, vec![0.0, 0.0]);
        assert_eq!(out.metrics["actor/empty_micro_batches"], 1.0);
        assert!(out.metrics.values().all(|v| v.is_finite()));
    }
}

#[test]
fn config_errors_name_the_key() {
    let err = AlgoConfig {
        clip_ratio_c: 1.0,
        ..AlgoConfig::default()
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(err.contains("clip_ratio_c"), "{err}");
    let err = serde_json::from_str::<AlgoConfig>(r#"{"loss_mode": "dpo"}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("dpo") && err.contains("reinforce"), "{err}");
    let err = serde_json::from_str::<AlgoConfig>(r#"{"clip_ratio_lo": 0.1}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("clip_ratio_lo"), "{err}");
    let c: AlgoConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(c, AlgoConfig::default());
}

/// Rejection sampling: `token_k1` with ratio bounds [0.5, 2] rejects tokens whose
/// `π_rollout/π_train` leaves the band; rejected tokens leave the advantage statistics.
#[test]
fn rejection_sampling_masks_tokens() {
    let c = AlgoConfig {
        rollout_rs: Some("token_k1".into()),
        rollout_rs_threshold: Some(RsThreshold::Number(2.0)),
        ..AlgoConfig::default()
    };
    let offsets = [0, 3];
    let out =
        rollout_correction(&c, &offsets, &[-1.0, -1.0, -1.0], &[-1.0, -0.1, -2.0], None).unwrap();
    assert_eq!(out.mask, vec![true, false, false]);
    assert!(close(
        out.metrics["rollout_corr/rollout_rs_masked_fraction"],
        2.0 / 3.0,
        1e-12
    ));
    assert_eq!(
        out.metrics["rollout_corr/rollout_rs_seq_masked_fraction"],
        1.0
    );
    let seq = AlgoConfig {
        rollout_rs: Some("seq_max_k2,token_k3".into()),
        rollout_rs_threshold: Some(RsThreshold::Text("0.5,10".into())),
        ..AlgoConfig::default()
    };
    let out = rollout_correction(
        &seq,
        &offsets,
        &[-1.0, -1.0, -1.0],
        &[-1.0, -0.1, -2.0],
        None,
    )
    .unwrap();
    assert_eq!(out.mask, vec![true, true, true]);
    let bad = AlgoConfig {
        rollout_rs: Some("token_k9".into()),
        rollout_rs_threshold: Some(RsThreshold::Number(2.0)),
        ..AlgoConfig::default()
    };
    assert!(bad.validate().unwrap_err().to_string().contains("token_k1"));
}
