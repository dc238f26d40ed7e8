//! Metrics reduced across ranks by their kind: sums add up, `max`/`min` metrics take the
//! extreme, everything else is a mean weighted by each rank's valid tokens (the rules of
//! [`rlreplay_algo::metrics::merge_rule`]). Every rank gets the same result, merged in rank
//! order; a metric that only some ranks report is merged over those.

use rlreplay_algo::{MetricAccumulator, Metrics};

use crate::collective::Collective;
use crate::error::{DistError, Result};

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
        decode(bytes, &mut out).map_err(|msg| DistError::Message { rank, msg })?;
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

/// `u32` entry count, then per entry: `u32` name length, the name, value and weight as `f64`
/// bits (little-endian).
fn encode(acc: &MetricAccumulator) -> Vec<u8> {
    let entries: Vec<(&str, f64, f64)> = acc.state().collect();
    let mut out = Vec::with_capacity(4 + entries.len() * 40);
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for (name, v, w) in entries {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&v.to_le_bytes());
        out.extend_from_slice(&w.to_le_bytes());
    }
    out
}

fn decode(mut bytes: &[u8], into: &mut MetricAccumulator) -> std::result::Result<(), String> {
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> std::result::Result<&'a [u8], String> {
        if bytes.len() < n {
            return Err(format!(
                "metrics message cut short ({} bytes missing)",
                n - bytes.len()
            ));
        }
        let (head, tail) = bytes.split_at(n);
        *bytes = tail;
        Ok(head)
    }
    let u32_at = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize;
    let f64_at = |b: &[u8]| f64::from_le_bytes(b.try_into().expect("8 bytes"));
    let n = u32_at(take(&mut bytes, 4)?);
    for _ in 0..n {
        let len = u32_at(take(&mut bytes, 4)?);
        let name = std::str::from_utf8(take(&mut bytes, len)?)
            .map_err(|_| "metric name is not UTF-8".to_string())?;
        let v = f64_at(take(&mut bytes, 8)?);
        let w = f64_at(take(&mut bytes, 8)?);
        into.merge_state(name, v, w);
    }
    if !bytes.is_empty() {
        return Err(format!("{} bytes after the metrics", bytes.len()));
    }
    Ok(())
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
        decode(&encode(&acc), &mut back).unwrap();
        assert_eq!(back.finish(), acc.finish());
        let bytes = encode(&acc);
        assert!(decode(&bytes[..bytes.len() - 1], &mut MetricAccumulator::new()).is_err());
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
