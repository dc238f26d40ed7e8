//! Metrics reduced across ranks by their kind: sums add up, `max`/`min` metrics take the
//! extreme, everything else is a mean weighted by each rank's valid tokens (the rules of
//! [`rlreplay_algo::metrics::merge_rule`]). Every rank gets the same result, merged in rank
//! order; a metric that only some ranks report is merged over those.

use rlreplay_algo::{MetricAccumulator, Metrics};

use crate::collective::Collective;
use crate::error::Result;
use crate::wire::{Reader, Writer};

/// The merge of every rank's accumulator, in rank order, on every rank.
pub fn all_reduce_accumulator(
    comm: &dyn Collective,
    acc: &MetricAccumulator,
) -> Result<MetricAccumulator> {
    if comm.world() == 1 {
        return Ok(acc.clone());
    }
    let gathered = comm.all_gather_bytes(&encode(acc))?;
    let mut out = MetricAccumulator::new();
    for (rank, bytes) in gathered.iter().enumerate() {
        decode(bytes, rank, &mut out)?;
    }
    Ok(out)
}

/// Every rank's `metrics`, each weighted by that rank's `weight` (its valid tokens) for the
/// weighted means, reduced by kind.
pub fn all_reduce_metrics(
    comm: &dyn Collective,
    metrics: &Metrics,
    weight: f64,
) -> Result<Metrics> {
    let mut acc = MetricAccumulator::new();
    acc.add(metrics, weight);
    Ok(all_reduce_accumulator(comm, &acc)?.finish())
}

/// The entry count, then per entry its name, value and weight ([`crate::wire`]).
fn encode(acc: &MetricAccumulator) -> Vec<u8> {
    let entries: Vec<(&str, f64, f64)> = acc.state().collect();
    let mut w = Writer::new();
    w.usize(entries.len());
    for (name, v, weight) in entries {
        w.str(name).f64(v).f64(weight);
    }
    w.finish()
}

fn decode(bytes: &[u8], rank: usize, into: &mut MetricAccumulator) -> Result<()> {
    let mut r = Reader::new(bytes, rank);
    for _ in 0..r.usize()? {
        let name = r.str()?;
        let (v, w) = (r.f64()?, r.f64()?);
        into.merge_state(name, v, w);
    }
    r.end()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SingleProcess;

    #[test]
    fn encoding_round_trips() {
        let mut acc = MetricAccumulator::new();
        let m: Metrics = [
            ("actor/pg_loss".to_string(), 0.25),
            ("actor/ppo_kl".to_string(), -1e-3),
            ("rollout_corr/rollout_is_max".to_string(), f64::INFINITY),
        ]
        .into();
        acc.add(&m, 7.0);
        let mut back = MetricAccumulator::new();
        decode(&encode(&acc), 0, &mut back).unwrap();
        assert_eq!(back.finish(), acc.finish());
        let bytes = encode(&acc);
        assert!(decode(&bytes[..bytes.len() - 1], 1, &mut MetricAccumulator::new()).is_err());
    }

    #[test]
    fn single_process_keeps_the_metrics() {
        let m: Metrics = [("actor/pg_clipfrac".to_string(), 0.5)].into();
        assert_eq!(
            all_reduce_metrics(&SingleProcess::new(), &m, 3.0).unwrap(),
            m
        );
    }
}
