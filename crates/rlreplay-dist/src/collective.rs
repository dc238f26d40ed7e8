//! The collective interface every backend implements, the shard layout of reduce-scatter and
//! all-gather, and the single-process backend.

use std::ops::Range;

use candle_core::{DType, Tensor};

use crate::error::{DistError, Result};
use crate::launch::Placement;

/// Contiguous ranges of a flat buffer, one per rank in rank order, covering `0..len`: rank `r`
/// owns `ranges[r]` in [`Collective::reduce_scatter_sum_f32`] and
/// [`Collective::all_gather_f32`] (ZeRO-1 keeps the optimizer state of its range only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shards {
    ranges: Vec<Range<usize>>,
}

impl Shards {
    /// `len` elements over `world` ranks: the first `len % world` ranks get one more.
    pub fn even(len: usize, world: usize) -> Self {
        Self::aligned(len, world, 1)
    }

    /// `len` elements over `world` ranks with every boundary a multiple of `align` (the last
    /// range ends at `len`): whole blocks of `align` elements split as evenly as possible.
    pub fn aligned(len: usize, world: usize, align: usize) -> Self {
        let (world, align) = (world.max(1), align.max(1));
        let blocks = len.div_ceil(align);
        let ranges = (0..world)
            .map(|r| {
                let at =
                    |k: usize| ((blocks / world * k + (blocks % world).min(k)) * align).min(len);
                at(r)..at(r + 1)
            })
            .collect();
        Self { ranges }
    }

    /// Shards from explicit ranges; they must be contiguous, in order and start at 0.
    pub fn from_ranges(ranges: Vec<Range<usize>>) -> Result<Self> {
        contiguous_end(&ranges, "shard")?;
        if ranges.is_empty() {
            return Err(DistError::Shape("no shards".into()));
        }
        Ok(Self { ranges })
    }

    /// The ranges, one per rank.
    pub fn ranges(&self) -> &[Range<usize>] {
        &self.ranges
    }

    /// The range of rank `r`.
    pub fn range(&self, r: usize) -> Range<usize> {
        self.ranges[r].clone()
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.ranges.len()
    }

    /// Length of the whole buffer.
    pub fn len(&self) -> usize {
        self.ranges.last().map_or(0, |r| r.end)
    }

    /// True when the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks that the layout fits a collective over `world` ranks on a buffer of `len`.
    pub(crate) fn check(&self, world: usize, len: usize, what: &str) -> Result<()> {
        if self.world() != world || self.len() != len {
            return Err(DistError::Shape(format!(
                "{what}: shards for {} ranks over {} elements, but the collective has {world} \
                 ranks and the buffer {len} elements",
                self.world(),
                self.len()
            )));
        }
        Ok(())
    }
}

/// Collective operations over the ranks of a data-parallel run. Every rank calls the same
/// operations in the same order.
///
/// Sums are deterministic and the same bits on every rank: each element is summed over the ranks
/// in a fixed pairwise order (`(r0 + r1) + (r2 + r3)`, ...; see [`sum_in_rank_order`]),
/// whatever the message sizes or the engine's own reduction algorithm, except where a backend
/// documents otherwise (NCCL).
pub trait Collective {
    /// The backend's name: `single`, `mpi` or `nccl`.
    fn backend(&self) -> &'static str;

    /// Where the launcher placed this process.
    fn placement(&self) -> &Placement;

    /// This process's rank.
    fn rank(&self) -> usize {
        self.placement().rank
    }

    /// Number of ranks.
    fn world(&self) -> usize {
        self.placement().world
    }

    /// Rank among the processes on this node (it picks the GPU).
    fn local_rank(&self) -> usize {
        self.placement().local_rank
    }

    /// True on rank 0, the rank that writes.
    fn is_root(&self) -> bool {
        self.rank() == 0
    }

    /// Ends every process of the job with exit code `code` (after an error on this rank, so
    /// that the others do not wait for it until the timeout).
    fn abort(&self, code: i32) -> !;

    /// Returns when every rank has called it.
    fn barrier(&self) -> Result<()>;

    /// Replaces `bytes` on every rank with `root`'s bytes (of any length).
    fn broadcast_bytes(&self, root: usize, bytes: &mut Vec<u8>) -> Result<()>;

    /// Every rank's bytes (of any length), in rank order.
    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;

    /// Sums `input` (the full buffer, the same length on every rank) over the ranks and writes
    /// this rank's shard of the sum into `out` (`out.len() == shards.range(rank).len()`).
    fn reduce_scatter_sum_f32(&self, input: &[f32], shards: &Shards, out: &mut [f32])
        -> Result<()>;

    /// [`Collective::reduce_scatter_sum_f32`] for f64.
    fn reduce_scatter_sum_f64(&self, input: &[f64], shards: &Shards, out: &mut [f64])
        -> Result<()>;

    /// Concatenates every rank's shard (`mine`, of length `shards.range(rank).len()`) into `out`
    /// (the full buffer) on every rank.
    fn all_gather_f32(&self, mine: &[f32], shards: &Shards, out: &mut [f32]) -> Result<()>;

    /// [`Collective::all_gather_f32`] for f64.
    fn all_gather_f64(&self, mine: &[f64], shards: &Shards, out: &mut [f64]) -> Result<()>;

    /// Replaces `buf` on every rank with its sum over the ranks.
    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()> {
        let shards = Shards::even(buf.len(), self.world());
        let mut mine = vec![0f32; shards.range(self.rank()).len()];
        self.reduce_scatter_sum_f32(buf, &shards, &mut mine)?;
        self.all_gather_f32(&mine, &shards, buf)
    }

    /// [`Collective::all_reduce_sum_f32`] for f64.
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()> {
        let shards = Shards::even(buf.len(), self.world());
        let mut mine = vec![0f64; shards.range(self.rank()).len()];
        self.reduce_scatter_sum_f64(buf, &shards, &mut mine)?;
        self.all_gather_f64(&mine, &shards, buf)
    }

    /// The sum over the ranks of a tensor of the same shape on every rank (f32 or f64), on the
    /// tensor's device. The default goes through host memory; NCCL stays on the device.
    fn all_reduce_sum_tensor(&self, t: &Tensor) -> Result<Tensor> {
        let shape = t.shape().clone();
        let flat = t.flatten_all()?;
        let out = match t.dtype() {
            DType::F32 => {
                let mut v = flat.to_vec1::<f32>()?;
                self.all_reduce_sum_f32(&mut v)?;
                Tensor::from_vec(v, shape, t.device())?
            }
            DType::F64 => {
                let mut v = flat.to_vec1::<f64>()?;
                self.all_reduce_sum_f64(&mut v)?;
                Tensor::from_vec(v, shape, t.device())?
            }
            dt => {
                return Err(DistError::Unsupported(format!(
                    "all-reduce of a {dt:?} tensor; reduce f32 or f64 (the master dtype)"
                )))
            }
        };
        Ok(out)
    }

    /// Sends `root`'s `value` to every rank.
    fn broadcast_u64(&self, root: usize, value: u64) -> Result<u64> {
        let mut bytes = value.to_le_bytes().to_vec();
        self.broadcast_bytes(root, &mut bytes)?;
        let arr: [u8; 8] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| DistError::Message {
                rank: root,
                msg: format!("expected 8 bytes, got {}", bytes.len()),
            })?;
        Ok(u64::from_le_bytes(arr))
    }
}

/// One process: every collective is the identity, exactly the behaviour without data
/// parallelism.
#[derive(Debug, Clone)]
pub struct SingleProcess {
    placement: Placement,
}

impl SingleProcess {
    /// The one process.
    pub fn new() -> Self {
        Self {
            placement: Placement::single(),
        }
    }
}

impl Default for SingleProcess {
    fn default() -> Self {
        Self::new()
    }
}

impl Collective for SingleProcess {
    fn backend(&self) -> &'static str {
        "single"
    }
    fn placement(&self) -> &Placement {
        &self.placement
    }
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
    fn broadcast_bytes(&self, root: usize, _bytes: &mut Vec<u8>) -> Result<()> {
        check_root(root, 1)
    }
    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(vec![mine.to_vec()])
    }
    fn reduce_scatter_sum_f32(&self, input: &[f32], s: &Shards, out: &mut [f32]) -> Result<()> {
        local_shard(input, s, out)
    }
    fn reduce_scatter_sum_f64(&self, input: &[f64], s: &Shards, out: &mut [f64]) -> Result<()> {
        local_shard(input, s, out)
    }
    fn all_gather_f32(&self, mine: &[f32], s: &Shards, out: &mut [f32]) -> Result<()> {
        local_shard(mine, s, out)
    }
    fn all_gather_f64(&self, mine: &[f64], s: &Shards, out: &mut [f64]) -> Result<()> {
        local_shard(mine, s, out)
    }
    fn all_reduce_sum_f32(&self, _buf: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn all_reduce_sum_f64(&self, _buf: &mut [f64]) -> Result<()> {
        Ok(())
    }
    fn all_reduce_sum_tensor(&self, t: &Tensor) -> Result<Tensor> {
        Ok(t.clone())
    }
}

/// One rank's shard and the whole buffer are the same thing.
fn local_shard<T: Copy>(input: &[T], shards: &Shards, out: &mut [T]) -> Result<()> {
    shards.check(1, input.len(), "single process")?;
    if out.len() != input.len() {
        return Err(DistError::Shape(format!(
            "output of {} elements for a shard of {}",
            out.len(),
            input.len()
        )));
    }
    out.copy_from_slice(input);
    Ok(())
}

/// The end of `ranges` when they are contiguous, in order and start at 0; else an error naming
/// the first one that is not (`what`: what a range is).
pub(crate) fn contiguous_end(ranges: &[Range<usize>], what: &str) -> Result<usize> {
    let mut at = 0;
    for (i, range) in ranges.iter().enumerate() {
        if range.start != at || range.end < range.start {
            return Err(DistError::Shape(format!(
                "{what} {i} is {range:?}; {what}s must be contiguous from 0 (expected start {at})"
            )));
        }
        at = range.end;
    }
    Ok(at)
}

/// Checks a broadcast root.
pub(crate) fn check_root(root: usize, world: usize) -> Result<()> {
    if root >= world {
        return Err(DistError::Shape(format!(
            "broadcast from rank {root} in a world of {world}"
        )));
    }
    Ok(())
}

/// Sums `pieces` (the same element of every rank, in rank order) in the fixed pairwise order
/// every backend uses: `((r0 + r1) + (r2 + r3)) + ...`, strides doubling. For a power-of-two
/// world the tree is balanced, so a sum over ranks that each hold the sum of an aligned block of
/// a larger power-of-two set of contributions equals the sum over that set.
pub fn sum_in_rank_order<T: Copy + std::ops::Add<Output = T>>(pieces: &mut [T]) -> Option<T> {
    let n = pieces.len();
    let mut stride = 1;
    while stride < n {
        let mut r = 0;
        while r + stride < n {
            pieces[r] = pieces[r] + pieces[r + stride];
            r += 2 * stride;
        }
        stride *= 2;
    }
    pieces.first().copied()
}

/// [`sum_in_rank_order`] for every element at once: `recv` holds `world` pieces of `len`
/// elements each, in rank order; the sums end in the first piece, written to `out`.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn sum_pieces<T: Copy + std::ops::Add<Output = T>>(
    recv: &mut [T],
    len: usize,
    out: &mut [T],
) {
    let n = recv.len().checked_div(len).unwrap_or(0);
    let mut stride = 1;
    while stride < n {
        let mut r = 0;
        while r + stride < n {
            let (lo, hi) = recv.split_at_mut((r + stride) * len);
            for (a, &b) in lo[r * len..(r + 1) * len].iter_mut().zip(&hi[..len]) {
                *a = *a + b;
            }
            r += 2 * stride;
        }
        stride *= 2;
    }
    if n > 0 {
        out.copy_from_slice(&recv[..len]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn shards_cover_the_buffer() {
        let s = Shards::even(10, 3);
        assert_eq!(s.ranges(), &[0..4, 4..7, 7..10]);
        let s = Shards::aligned(10, 3, 4);
        assert_eq!(s.ranges(), &[0..4, 4..8, 8..10]);
        let s = Shards::even(1, 3);
        assert_eq!(s.ranges(), &[0..1, 1..1, 1..1]);
        assert!(Shards::from_ranges(vec![0..2, 3..4]).is_err());
        assert_eq!(Shards::from_ranges(vec![0..2, 2..2]).unwrap().len(), 2);
    }

    #[test]
    fn rank_order_is_pairwise() {
        assert_eq!(sum_in_rank_order::<f64>(&mut []), None);
        assert_eq!(sum_in_rank_order(&mut [1.0]), Some(1.0));
        // (1e16 + 1) + (-1e16 + 1) = 2 in exact arithmetic; f64 gives 1e16 + (-1e16 + 1) = 0
        // in this grouping, so the grouping is visible.
        let mut v = [1e16, 1.0, -1e16, 1.0];
        assert_eq!(
            sum_in_rank_order(&mut v),
            Some((1e16 + 1.0) + (-1e16 + 1.0))
        );
        let mut v = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(
            sum_in_rank_order(&mut v),
            Some(((1.0 + 2.0) + (3.0 + 4.0)) + 5.0)
        );
    }

    proptest! {
        #[test]
        fn pieces_sum_like_scalars(world in 1usize..7, len in 0usize..5, seed in 0u64..1000) {
            let vals: Vec<f32> = (0..world * len)
                .map(|i| ((i as u64 * 2654435761 + seed) % 1000) as f32 * 0.37 - 150.0)
                .collect();
            let mut recv = vals.clone();
            let mut out = vec![0f32; len];
            sum_pieces(&mut recv, len, &mut out);
            for (i, &o) in out.iter().enumerate() {
                let mut col: Vec<f32> = (0..world).map(|r| vals[r * len + i]).collect();
                prop_assert_eq!(o.to_bits(), sum_in_rank_order(&mut col).unwrap().to_bits());
            }
        }

        #[test]
        fn power_of_two_trees_nest(k in 0u32..4, j in 0u32..3, seed in 0u64..1000) {
            // 2^(k+j) contributions summed by 2^k ranks holding aligned blocks of 2^j each
            // equal the sum of all contributions on one rank.
            let total = 1usize << (k + j);
            let xs: Vec<f32> = (0..total)
                .map(|i| ((i as u64 * 40503 + seed * 7919) % 977) as f32 * 1.3e-3 - 0.6)
                .collect();
            let mut all = xs.clone();
            let one = sum_in_rank_order(&mut all).unwrap();
            let mut per_rank: Vec<f32> = xs
                .chunks(1 << j)
                .map(|c| sum_in_rank_order(&mut c.to_vec()).unwrap())
                .collect();
            prop_assert_eq!(sum_in_rank_order(&mut per_rank).unwrap().to_bits(), one.to_bits());
        }
    }

    #[test]
    fn single_process_is_the_identity() {
        let c = SingleProcess::new();
        assert_eq!(
            (c.rank(), c.world(), c.local_rank(), c.is_root()),
            (0, 1, 0, true)
        );
        let mut v = vec![1.5f32, -2.0];
        c.all_reduce_sum_f32(&mut v).unwrap();
        assert_eq!(v, [1.5, -2.0]);
        let s = Shards::even(2, 1);
        let mut out = vec![0f64; 2];
        c.reduce_scatter_sum_f64(&[3.0, 4.0], &s, &mut out).unwrap();
        assert_eq!(out, [3.0, 4.0]);
        assert_eq!(c.all_gather_bytes(b"ab").unwrap(), vec![b"ab".to_vec()]);
        assert_eq!(c.broadcast_u64(0, 7).unwrap(), 7);
        assert!(c.broadcast_u64(1, 7).is_err());
        let t = Tensor::new(&[1f32, 2.0], &candle_core::Device::Cpu).unwrap();
        let r = c.all_reduce_sum_tensor(&t).unwrap();
        assert_eq!(r.to_vec1::<f32>().unwrap(), [1.0, 2.0]);
    }
}
