//! Named, weighted values (a metric accumulator's state) gathered from every rank, in rank order,
//! on every rank: the caller merges them by its own rules (the trainer by each metric's kind).

use crate::collective::Collective;
use crate::error::Result;
use crate::wire::{Reader, Writer};

/// Every rank's `(name, value, weight)` entries, concatenated in rank order, on every rank.
pub fn all_gather_named(
    comm: &dyn Collective,
    entries: &[(&str, f64, f64)],
) -> Result<Vec<(String, f64, f64)>> {
    let own = || entries.iter().map(|&(n, v, w)| (n.to_owned(), v, w));
    if comm.world() == 1 {
        return Ok(own().collect());
    }
    let mut w = Writer::new();
    w.usize(entries.len());
    for &(name, v, weight) in entries {
        w.str(name).f64(v).f64(weight);
    }
    let mut out = Vec::new();
    for (rank, bytes) in comm.all_gather_bytes(&w.finish())?.iter().enumerate() {
        let mut r = Reader::new(bytes, rank);
        for _ in 0..r.usize()? {
            let name = r.str()?.to_owned();
            out.push((name, r.f64()?, r.f64()?));
        }
        r.end()?;
    }
    Ok(out)
}
