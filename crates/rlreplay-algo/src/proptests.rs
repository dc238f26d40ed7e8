//! Property tests: gradients against finite differences, micro-batch partition invariance,
//! row permutation equivariance and group independence.

use proptest::prelude::*;

use crate::config::*;
use crate::loss::{evaluate, prepare, MicroBatch, Normalizer};
use crate::{compute_advantages, policy_loss};

/// A random batch: per row (token count, per token (ℓ, ℓ_old − ℓ, A, ℓ_T − ℓ, w_IS, ℓ_ref − ℓ)).
type Tok = (f64, f64, f64, f64, f64, f64);

fn batch() -> impl Strategy<Value = Vec<Vec<Tok>>> {
    let tok = (
        -3.0..-0.05f64,
        -0.6..0.6f64,
        -2.0..2.0f64,
        -1.0..1.0f64,
        0.3..2.0f64,
        -1.0..1.0f64,
    );
    prop::collection::vec(prop::collection::vec(tok, 0..5), 1..6)
}

struct Flat {
    offsets: Vec<usize>,
    lp: Vec<f64>,
    old: Vec<f64>,
    adv: Vec<f64>,
    teacher: Vec<f64>,
    is_w: Vec<f64>,
    reference: Vec<f64>,
    active: Vec<bool>,
}

fn flatten(rows: &[Vec<Tok>]) -> Flat {
    let mut f = Flat {
        offsets: vec![0],
        lp: vec![],
        old: vec![],
        adv: vec![],
        teacher: vec![],
        is_w: vec![],
        reference: vec![],
        active: vec![],
    };
    for r in rows {
        for &(l, d, a, dt, w, dr) in r {
            f.lp.push(l);
            f.old.push(l + d);
            f.adv.push(a);
            f.teacher.push(l + dt);
            f.is_w.push(w);
            f.reference.push(l + dr);
        }
        f.offsets.push(f.lp.len());
        // Row attributes follow the row's content, so permutations carry them along.
        f.active.push(r.first().is_none_or(|t| t.2 > -1.0));
    }
    f
}

fn config(loss: usize, agg: usize, kl: usize) -> AlgoConfig {
    AlgoConfig {
        loss_mode: [
            LossMode::Reinforce,
            LossMode::Ppo,
            LossMode::Rlsd,
            LossMode::Rlrt,
        ][loss],
        loss_agg_mode: [
            AggMode::TokenMean,
            AggMode::SeqMeanTokenSum,
            AggMode::SeqMeanTokenMean,
            AggMode::SeqMeanTokenSumNorm,
        ][agg],
        use_kl_loss: kl < 4,
        kl_loss_type: [
            KlType::K1,
            KlType::Abs,
            KlType::Mse,
            KlType::LowVarKl,
            KlType::K1,
        ][kl],
        kl_loss_coef: 0.3,
        clip_ratio_low: Some(0.2),
        clip_ratio_high: Some(0.28),
        ..AlgoConfig::default()
    }
}

fn micro<'a>(f: &'a Flat, a: usize, b: usize) -> MicroBatch<'a> {
    let (s, e) = (f.offsets[a], f.offsets[b]);
    MicroBatch {
        first_row: a,
        offsets: &f.offsets[a..=b],
        logprobs: &f.lp[s..e],
        old_logprobs: Some(&f.old[s..e]),
        token_advantages: &f.adv[s..e],
        is_weights: Some(&f.is_w[s..e]),
        teacher_logprobs: Some(&f.teacher[s..e]),
        sd_active: Some(&f.active[a..b]),
        correct: Some(&f.active[a..b]),
        ref_logprobs: Some(&f.reference[s..e]),
        ..MicroBatch::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn gradient_matches_finite_differences(
        rows in batch(), loss in 0..4usize, agg in 0..4usize, kl in 0..5usize
    ) {
        let c = config(loss, agg, kl);
        let f = flatten(&rows);
        let norm = Normalizer::new(&c, &f.offsets, None).unwrap();
        let mb = micro(&f, 0, rows.len());
        let (frozen, _) = prepare(&c, &norm, &mb).unwrap();
        let base = evaluate(&c, &frozen, &f.lp);
        let h = 1e-6;
        for t in 0..f.lp.len() {
            // Skip points within reach of a clip kink.
            let rho = (f.lp[t] - frozen.old[t]).exp();
            let kinks = [1.0 - 0.2, 1.0 + 0.28, c.clip_ratio_c];
            if kinks.iter().any(|k| (rho - k).abs() < 1e-4) {
                continue;
            }
            let mut plus = f.lp.clone();
            plus[t] += h;
            let mut minus = f.lp.clone();
            minus[t] -= h;
            let fd = (evaluate(&c, &frozen, &plus).loss - evaluate(&c, &frozen, &minus).loss)
                / (2.0 * h);
            prop_assert!(
                (fd - base.grad[t]).abs() <= 1e-6 * (1.0 + fd.abs()),
                "token {t}: fd {fd} vs grad {}", base.grad[t]
            );
        }
    }

    #[test]
    fn global_aggregation_is_partition_invariant(
        rows in batch(), loss in 0..4usize, agg in 0..4usize, kl in 0..5usize,
        cuts in prop::collection::vec(any::<bool>(), 6)
    ) {
        let c = config(loss, agg, kl);
        let f = flatten(&rows);
        let norm = Normalizer::new(&c, &f.offsets, None).unwrap();
        let whole = policy_loss(&c, &norm, &micro(&f, 0, rows.len())).unwrap();
        let mut bounds = vec![0];
        bounds.extend((1..rows.len()).filter(|&i| cuts[i]));
        bounds.push(rows.len());
        let mut loss_sum = 0.0;
        let mut grad = Vec::new();
        for w in bounds.windows(2) {
            let out = policy_loss(&c, &norm, &micro(&f, w[0], w[1])).unwrap();
            loss_sum += out.loss;
            grad.extend(out.grad_logprobs);
        }
        prop_assert!((loss_sum - whole.loss).abs() <= 1e-12 * (1.0 + whole.loss.abs()));
        prop_assert_eq!(grad, whole.grad_logprobs);
    }

    #[test]
    fn row_permutation_permutes_outputs(
        rows in batch(), scores in prop::collection::vec(0..3u8, 6), est in 0..13usize,
        loss in 0..4usize, rot in 0..6usize
    ) {
        let n = rows.len();
        let c = AlgoConfig {
            adv_estimator: AdvEstimator::from_name(AdvEstimator::NAMES[est]).unwrap(),
            pass_k: 2,
            ..config(loss, 0, 4)
        };
        let uids: Vec<String> = (0..n).map(|i| format!("g{}", i % 2)).collect();
        let s: Vec<f64> = (0..n).map(|i| f64::from(scores[i]) / 2.0).collect();
        let perm: Vec<usize> = (0..n).map(|i| (i + rot) % n).collect();
        let prow: Vec<Vec<Tok>> = perm.iter().map(|&i| rows[i].clone()).collect();
        let (f, pf) = (flatten(&rows), flatten(&prow));
        let pu: Vec<String> = perm.iter().map(|&i| uids[i].clone()).collect();
        let ps: Vec<f64> = perm.iter().map(|&i| s[i]).collect();
        let a = compute_advantages(&c, &uids, &s, &f.offsets, None);
        let pa = compute_advantages(&c, &pu, &ps, &pf.offsets, None);
        let (a, pa) = match (a, pa) {
            (Ok(a), Ok(pa)) => (a, pa),
            (Err(_), Err(_)) => return Ok(()),
            _ => return Err(TestCaseError::fail("one order failed")),
        };
        for (j, &i) in perm.iter().enumerate() {
            prop_assert!((pa.rows[j] - a.rows[i]).abs() <= 1e-9 * (1.0 + a.rows[i].abs()));
            let (r, pr) = (f.offsets[i]..f.offsets[i + 1], pf.offsets[j]..pf.offsets[j + 1]);
            for (x, y) in a.tokens[r].iter().zip(&pa.tokens[pr]) {
                prop_assert!((x - y).abs() <= 1e-9 * (1.0 + x.abs()));
            }
        }
        // The loss of the permuted batch is the same and its gradient is permuted.
        let norm = Normalizer::new(&c, &f.offsets, None).unwrap();
        let pnorm = Normalizer::new(&c, &pf.offsets, None).unwrap();
        let out = policy_loss(&c, &norm, &micro(&f, 0, n)).unwrap();
        let pout = policy_loss(&c, &pnorm, &micro(&pf, 0, n)).unwrap();
        prop_assert!((out.loss - pout.loss).abs() <= 1e-9 * (1.0 + out.loss.abs()));
        for (j, &i) in perm.iter().enumerate() {
            let (r, pr) = (f.offsets[i]..f.offsets[i + 1], pf.offsets[j]..pf.offsets[j + 1]);
            prop_assert_eq!(&out.grad_logprobs[r], &pout.grad_logprobs[pr]);
        }
    }

    #[test]
    fn groups_are_independent(
        a in prop::collection::vec(0..3u8, 1..6), b in prop::collection::vec(0..3u8, 1..6),
        est in 0..13usize
    ) {
        let e = AdvEstimator::from_name(AdvEstimator::NAMES[est]).unwrap();
        prop_assume!(!matches!(
            e,
            AdvEstimator::ReinforcePlusPlus | AdvEstimator::ReinforcePlusPlusBaseline
        ));
        let c = AlgoConfig { adv_estimator: e, pass_k: 2, ..AlgoConfig::default() };
        let sa: Vec<f64> = a.iter().map(|&x| f64::from(x) / 2.0).collect();
        let sb: Vec<f64> = b.iter().map(|&x| f64::from(x) / 2.0).collect();
        let alone_off: Vec<usize> = (0..=sa.len()).collect();
        let alone = compute_advantages(&c, &vec!["a"; sa.len()], &sa, &alone_off, None);
        let mut uids = vec!["b"; sb.len()];
        uids.extend(vec!["a"; sa.len()]);
        let mut s = sb.clone();
        s.extend(&sa);
        let off: Vec<usize> = (0..=s.len()).collect();
        let both = compute_advantages(&c, &uids, &s, &off, None);
        match (alone, both) {
            (Ok(x), Ok(y)) => prop_assert_eq!(&x.rows[..], &y.rows[sb.len()..]),
            (Err(_), Err(_)) => {}
            _ => return Err(TestCaseError::fail("the groups fail differently")),
        }
    }
}
