//! How a mini-batch's rows split across ranks: contiguous, token-balanced, never cutting a unit
//! (a group, when the estimator needs group statistics; a row otherwise).
//!
//! The rule is a pure function of the rows' costs, the units and the number of parts, so every
//! rank computes the same split without talking to the others. Parts are contiguous and in row
//! order, so rank order is row order. The boundary between parts `j−1` and `j` is the unit
//! boundary whose cumulative cost is nearest to `j/N` of the total (the later boundary on a
//! tie), which keeps every part within one unit's cost of the ideal `total/N`. With fewer units
//! than parts, some parts are empty; a rank with an empty part still takes part in every
//! collective (with zero gradients).

use std::ops::Range;

use crate::collective::contiguous_end;
use crate::error::{DistError, Result};

/// Splits rows with costs `costs` into `parts` contiguous row ranges balanced by cost, cutting
/// only at the starts of `units` (contiguous row ranges covering `0..costs.len()` in order).
/// Rows of zero total cost split by unit count instead.
pub fn partition(costs: &[u64], units: &[Range<usize>], parts: usize) -> Result<Vec<Range<usize>>> {
    let parts = parts.max(1);
    let at = contiguous_end(units, "unit")?;
    if at != costs.len() {
        return Err(DistError::Shape(format!(
            "units cover {at} rows, the costs {}",
            costs.len()
        )));
    }
    // Cumulative cost at each unit boundary (prefix[k] = cost of units 0..k).
    let mut prefix: Vec<u128> = Vec::with_capacity(units.len() + 1);
    prefix.push(0);
    for u in units {
        let c: u128 = costs[u.clone()].iter().map(|&c| u128::from(c)).sum();
        prefix.push(prefix[prefix.len() - 1] + c);
    }
    let mut total = prefix[units.len()];
    if total == 0 {
        prefix = (0..=units.len() as u128).collect();
        total = units.len() as u128;
    }
    let n = parts as u128;
    let mut cuts = Vec::with_capacity(parts + 1);
    cuts.push(0usize);
    let mut k = 0usize;
    for j in 1..parts as u128 {
        // Nearest boundary to total·j/parts, compared as prefix·parts against total·j.
        let target = total * j;
        while k < units.len() && prefix[k + 1] * n <= target {
            k += 1;
        }
        if k < units.len() && prefix[k] * n < target {
            let below = target - prefix[k] * n;
            let above = prefix[k + 1] * n - target;
            if above <= below {
                k += 1;
            }
        }
        cuts.push(k);
    }
    cuts.push(units.len());
    let row_at = |k: usize| if k == 0 { 0 } else { units[k - 1].end };
    Ok(cuts
        .windows(2)
        .map(|w| row_at(w[0])..row_at(w[1]))
        .collect())
}

/// [`partition`] with every row its own unit.
pub fn partition_rows(costs: &[u64], parts: usize) -> Vec<Range<usize>> {
    let units: Vec<Range<usize>> = (0..costs.len()).map(|i| i..i + 1).collect();
    partition(costs, &units, parts).expect("single-row units cover the rows")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn splits_balance_tokens() {
        assert_eq!(partition_rows(&[1, 1, 1, 1], 2), [0..2, 2..4]);
        assert_eq!(partition_rows(&[1, 1, 1, 1], 3), [0..1, 1..3, 3..4]);
        // A long row goes alone.
        assert_eq!(partition_rows(&[10, 1, 1, 1, 1], 2), [0..1, 1..5]);
        assert_eq!(partition_rows(&[1, 1, 1, 1, 10], 2), [0..4, 4..5]);
    }

    #[test]
    fn groups_stay_whole() {
        let costs = [3, 3, 3, 3, 1, 1, 1, 1];
        let groups = [0..4, 4..8];
        assert_eq!(partition(&costs, &groups, 2).unwrap(), [0..4, 4..8]);
        // Three groups over two ranks: the middle one goes where the balance is better.
        let costs = [1, 1, 5, 5, 1, 1];
        let groups = [0..2, 2..4, 4..6];
        assert_eq!(partition(&costs, &groups, 2).unwrap(), [0..4, 4..6]);
    }

    #[test]
    fn fewer_rows_than_ranks() {
        assert_eq!(partition_rows(&[5], 2), [0..1, 1..1]);
        assert_eq!(partition_rows(&[5, 5], 4), [0..1, 1..1, 1..2, 2..2]);
        assert_eq!(partition_rows(&[], 3), [0..0, 0..0, 0..0]);
        // Zero costs split by count.
        assert_eq!(partition_rows(&[0, 0, 0, 0], 2), [0..2, 2..4]);
    }

    #[test]
    fn bad_units_are_errors() {
        assert!(partition(&[1, 1], &[0..1, 1..1], 2).is_err());
        assert!(partition(&[1, 1], &[0..1, 0..2], 2).is_err());
    }

    proptest! {
        #[test]
        fn parts_are_contiguous_whole_and_balanced(
            sizes in proptest::collection::vec(1usize..5, 0..20),
            seed in 0u64..1000,
            parts in 1usize..9,
        ) {
            let mut units = Vec::new();
            let mut at = 0;
            for s in &sizes {
                units.push(at..at + s);
                at += s;
            }
            let costs: Vec<u64> = (0..at as u64).map(|i| 1 + (i * 7919 + seed) % 300).collect();
            let split = partition(&costs, &units, parts).unwrap();
            prop_assert_eq!(split.len(), parts);
            prop_assert_eq!(split[0].start, 0);
            prop_assert_eq!(split[parts - 1].end, at);
            let starts: Vec<usize> = units.iter().map(|u| u.start).chain([at]).collect();
            for w in split.windows(2) {
                prop_assert_eq!(w[0].end, w[1].start);
            }
            for p in &split {
                prop_assert!(starts.contains(&p.start) && starts.contains(&p.end));
            }
            // Each part is within one unit of the ideal share.
            let unit_cost = |u: &Range<usize>| costs[u.clone()].iter().sum::<u64>() as f64;
            let max_unit = units.iter().map(unit_cost).fold(0.0, f64::max);
            let total: f64 = costs.iter().sum::<u64>() as f64;
            for p in &split {
                let c: f64 = costs[p.clone()].iter().sum::<u64>() as f64;
                prop_assert!((c - total / parts as f64).abs() <= max_unit + 1e-9);
            }
            // The same inputs give the same split.
            prop_assert_eq!(partition(&costs, &units, parts).unwrap(), split);
        }
    }
}
