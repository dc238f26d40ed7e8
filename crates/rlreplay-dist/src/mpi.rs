//! The MPI backend (rsmpi over Open MPI or MPICH): CPU ranks started by `mpirun`, `mpiexec` or
//! `srun`.
//!
//! **Sums.** A reduce-scatter is an `MPI_Alltoallv` that sends every rank its shard of every
//! buffer, followed by a local sum in the fixed pairwise rank order of
//! [`sum_in_rank_order`](crate::sum_in_rank_order); an all-reduce is that reduce-scatter
//! followed by an `MPI_Allgatherv` of the summed shards. The result does not depend on MPI's
//! reduction algorithm (which changes with message size and placement), every rank gets the same
//! bits, and each rank moves `2·(N−1)/N` of the buffer, as a ring all-reduce does. Buffers are
//! exchanged in rounds of at most 16 Mi elements, so the extra memory stays bounded and MPI's
//! 32-bit counts never overflow.
//!
//! **Failure.** Every collective is non-blocking and polled against a deadline. A rank that
//! waited longer than the timeout asks every other rank, on a duplicate communicator, where it
//! is: ranks waiting in a collective answer with its sequence number and name, a rank that died
//! or hangs outside a collective does not. The rank then prints which ranks did not answer and
//! which are elsewhere, and calls `MPI_Abort`, which ends every process of the job. A rank killed
//! outright is usually caught earlier by the launcher itself: `mpirun` ends the job as soon as
//! one process exits abnormally and names it ("process rank 1 ... exited on signal 9"), `srun`
//! does the same with `--kill-on-bad-exit=1`.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mpi::datatype::{Partition, PartitionMut};
use mpi::environment::Universe;
use mpi::request::{Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::{Count, Threading};

use crate::collective::{check_root, sum_pieces, Collective, Shards};
use crate::error::{DistError, Result};
use crate::launch::{Launcher, Placement};

/// Default elements one rank exchanges with all the others in one round of a reduce-scatter or
/// all-gather.
pub const DEFAULT_ROUND: usize = 1 << 24;
/// Tag of "where are you?" on the control communicator.
const TAG_QUERY: i32 = 1;
/// Tag of the answer.
const TAG_REPLY: i32 = 2;

/// The collectives, named in failure reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub(crate) enum Op {
    Barrier = 1,
    Broadcast = 2,
    AllGather = 3,
    ReduceScatter = 4,
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    AllReduce = 5,
}

impl Op {
    fn name(self) -> &'static str {
        Self::name_of(self as u64)
    }

    fn name_of(code: u64) -> &'static str {
        match code {
            1 => "barrier",
            2 => "broadcast",
            3 => "all-gather",
            4 => "reduce-scatter",
            5 => "all-reduce",
            _ => "an unknown collective",
        }
    }
}

/// Data-parallel ranks on MPI. Create it once per process with [`MpiCollective::init`];
/// dropping it finalizes MPI.
pub struct MpiCollective {
    world: SimpleCommunicator,
    /// A duplicate of `world` for the failure diagnosis, so its messages never match a
    /// collective's.
    ctrl: SimpleCommunicator,
    placement: Placement,
    timeout: Duration,
    /// Collectives started so far (the same count on every rank of a correct program).
    seq: Cell<u64>,
    /// The collective being waited for, as `[seq, op]`, answered to other ranks' queries.
    current: Cell<[u64; 2]>,
    /// Elements exchanged per round.
    round: Cell<usize>,
    // Last: dropped after the communicators, it calls `MPI_Finalize`.
    _universe: Universe,
}

impl std::fmt::Debug for MpiCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiCollective")
            .field("placement", &self.placement)
            .field("timeout", &self.timeout)
            .field("seq", &self.seq.get())
            .finish()
    }
}

impl MpiCollective {
    /// Initializes MPI (collectives called from one thread only) and the world communicator. A
    /// collective that has not completed after `timeout` aborts the job with a report naming the
    /// ranks that did not arrive.
    pub fn init(timeout: Duration) -> Result<Self> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Funneled)
            .ok_or_else(|| backend("MPI is already initialized in this process"))?;
        if threading == Threading::Single {
            return Err(backend(
                "the MPI library offers no thread support; rlreplay needs MPI_THREAD_FUNNELED",
            ));
        }
        let world = universe.world();
        let ctrl = world.duplicate();
        let rank = usize::try_from(world.rank()).map_err(|_| backend("negative rank"))?;
        let size = usize::try_from(world.size()).map_err(|_| backend("negative size"))?;
        // The ranks that share this node's memory, whatever the launcher.
        let node = world.split_shared(world.rank());
        let launcher = match Placement::from_env() {
            Ok(p) if p.launcher.is_mpi() => p.launcher,
            _ => Launcher::OpenMpi,
        };
        let placement = Placement {
            launcher,
            rank,
            world: size,
            local_rank: usize::try_from(node.rank()).unwrap_or(0),
            local_world: usize::try_from(node.size()).ok(),
        };
        Ok(Self {
            world,
            ctrl,
            placement,
            timeout,
            seq: Cell::new(0),
            current: Cell::new([0, 0]),
            round: Cell::new(DEFAULT_ROUND),
            _universe: universe,
        })
    }

    /// The world communicator, for callers that use MPI directly (every rank must still call
    /// the same collectives in the same order).
    pub fn communicator(&self) -> &SimpleCommunicator {
        &self.world
    }

    /// The collective timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets the elements one rank exchanges with the others in one round of a reduce-scatter or
    /// all-gather (default [`DEFAULT_ROUND`]): the extra memory of a collective. Every rank
    /// must use the same value; the results do not depend on it.
    pub fn set_round(&self, elements: usize) {
        self.round.set(elements.max(1));
    }

    /// Number of this rank's collectives so far.
    pub fn collectives(&self) -> u64 {
        self.seq.get()
    }

    /// Counts a new collective and marks it as the one being waited for.
    pub(crate) fn begin(&self, op: Op) -> u64 {
        let seq = self.seq.get() + 1;
        self.seq.set(seq);
        self.current.set([seq, op as u64]);
        seq
    }

    /// Polls `req` until it completes (see [`MpiCollective::watch`]).
    fn wait<'a, D: ?Sized, S: Scope<'a>>(&self, op: Op, req: Request<'a, D, S>) {
        let mut req = Some(req);
        self.watch(op, || match req.take().map(Request::test) {
            Some(Ok(_)) | None => true,
            Some(Err(r)) => {
                req = Some(r);
                false
            }
        });
    }

    /// Polls `done` until it returns true, answering other ranks' queries meanwhile: spinning
    /// at first, then yielding for a millisecond, then sleeping between polls for 1 % of the
    /// time waited so far (50 µs to 1 ms: a rank waiting for a busier one costs next to no CPU,
    /// and the wait ends at most 50 µs or 1 % late). Past the timeout, asks the other ranks
    /// where they are, prints the report and aborts the job (see the module docs).
    pub(crate) fn watch(&self, op: Op, mut done: impl FnMut() -> bool) {
        let seq = self.current.get()[0];
        let start = Instant::now();
        let mut polls: u64 = 0;
        let mut asked: Option<(Instant, BTreeMap<usize, [u64; 2]>)> = None;
        while !done() {
            polls += 1;
            if polls < 2_000 {
                std::hint::spin_loop();
                continue;
            }
            self.serve();
            let waited = start.elapsed();
            if waited < Duration::from_millis(1) {
                std::thread::yield_now();
                continue;
            }
            std::thread::sleep(
                (waited / 100).clamp(Duration::from_micros(50), Duration::from_millis(1)),
            );
            if waited < self.timeout {
                continue;
            }
            match &mut asked {
                None => {
                    eprintln!(
                        "rank {}: {} #{seq} has not completed after {:.0} s; asking the other \
                         ranks where they are",
                        self.placement.rank,
                        op.name(),
                        waited.as_secs_f64()
                    );
                    self.ask(seq);
                    asked = Some((Instant::now(), BTreeMap::new()));
                }
                Some((since, replies)) => {
                    self.collect_replies(seq, replies);
                    let grace = self
                        .timeout
                        .clamp(Duration::from_secs(1), Duration::from_secs(10));
                    // Answers alone do not end the wait: a rank that answers may be about to
                    // complete this collective with us.
                    if since.elapsed() > grace {
                        eprintln!("{}", self.report(op, seq, waited, replies));
                        self.world.abort(crate::ABORT_CODE);
                    }
                }
            }
        }
        if asked.is_some() {
            eprintln!(
                "rank {}: {} #{seq} completed after {:.0} s",
                self.placement.rank,
                op.name(),
                start.elapsed().as_secs_f64()
            );
        }
    }

    /// Answers every pending "where are you?" with the collective being waited for.
    pub(crate) fn serve(&self) {
        while let Some(status) = self.ctrl.any_process().immediate_probe_with_tag(TAG_QUERY) {
            let from = status.source_rank();
            let mut asked = [0u64; 1];
            self.ctrl
                .process_at_rank(from)
                .receive_into_with_tag(&mut asked[..], TAG_QUERY);
            let [seq, op] = self.current.get();
            // Small messages go out eagerly: this returns without the asker's cooperation.
            self.ctrl
                .process_at_rank(from)
                .send_with_tag(&[asked[0], seq, op][..], TAG_REPLY);
        }
    }

    /// Sends "where are you?" about collective `seq` to every other rank.
    fn ask(&self, seq: u64) {
        for r in 0..self.placement.world {
            if r != self.placement.rank {
                self.ctrl
                    .process_at_rank(r as i32)
                    .send_with_tag(&[seq][..], TAG_QUERY);
            }
        }
    }

    /// Reads the answers that arrived, keeping those about collective `seq`.
    fn collect_replies(&self, seq: u64, replies: &mut BTreeMap<usize, [u64; 2]>) {
        self.serve();
        while let Some(status) = self.ctrl.any_process().immediate_probe_with_tag(TAG_REPLY) {
            let from = status.source_rank();
            let mut msg = [0u64; 3];
            self.ctrl
                .process_at_rank(from)
                .receive_into_with_tag(&mut msg[..], TAG_REPLY);
            if msg[0] == seq {
                replies.insert(from as usize, [msg[1], msg[2]]);
            }
        }
    }

    /// The failure report: who did not answer, who waits elsewhere.
    fn report(
        &self,
        op: Op,
        seq: u64,
        waited: Duration,
        replies: &BTreeMap<usize, [u64; 2]>,
    ) -> String {
        let me = self.placement.rank;
        let list = |rs: &[usize]| {
            let names: Vec<String> = rs.iter().map(usize::to_string).collect();
            format!(
                "{} {}",
                if rs.len() == 1 { "rank" } else { "ranks" },
                names.join(", ")
            )
        };
        let silent: Vec<usize> = (0..self.placement.world)
            .filter(|r| *r != me && !replies.contains_key(r))
            .collect();
        let same: Vec<usize> = replies
            .iter()
            .filter(|(_, [s, o])| *s == seq && *o == op as u64)
            .map(|(r, _)| *r)
            .collect();
        let mut parts = vec![format!(
            "rank {me}: {} #{seq} did not complete within {:.0} s (collective timeout {:.0} s)",
            op.name(),
            waited.as_secs_f64(),
            self.timeout.as_secs_f64()
        )];
        if !silent.is_empty() {
            parts.push(format!(
                "{} did not answer (dead, or stuck outside a collective)",
                list(&silent)
            ));
        }
        if !same.is_empty() {
            parts.push(format!("{} wait in the same collective", list(&same)));
        }
        for (r, [s, o]) in replies {
            if !(*s == seq && *o == op as u64) {
                parts.push(format!("rank {r} waits in {} #{s}", Op::name_of(*o)));
            }
        }
        format!("{}; aborting the job", parts.join("; "))
    }

    fn reduce_scatter<T: Element>(
        &self,
        input: &[T],
        shards: &Shards,
        out: &mut [T],
    ) -> Result<()> {
        let (world, me) = (self.placement.world, self.placement.rank);
        shards.check(world, input.len(), "reduce-scatter")?;
        check_out(out.len(), shards.range(me).len())?;
        let per_rank = (self.round.get() / world).max(1);
        let rounds = rounds(shards, per_rank);
        let mut send: Vec<T> = Vec::new();
        let mut recv: Vec<T> = Vec::new();
        for t in 0..rounds {
            let pieces: Vec<std::ops::Range<usize>> = shards
                .ranges()
                .iter()
                .map(|r| piece(r, t, per_rank))
                .collect();
            let counts: Vec<Count> = pieces.iter().map(|p| p.len() as Count).collect();
            let mine = pieces[me].len();
            // One round over contiguous shards sends straight from the input.
            let direct = rounds == 1 && input.len() <= Count::MAX as usize;
            let sdispls: Vec<Count> = if direct {
                pieces.iter().map(|p| p.start as Count).collect()
            } else {
                send.clear();
                for p in &pieces {
                    send.extend_from_slice(&input[p.clone()]);
                }
                displacements(&counts)
            };
            recv.clear();
            recv.resize(mine * world, T::default());
            let rcounts = vec![mine as Count; world];
            let rdispls: Vec<Count> = (0..world).map(|r| (r * mine) as Count).collect();
            let sbuf: &[T] = if direct { input } else { &send };
            self.begin(Op::ReduceScatter);
            let s = Partition::new(sbuf, &counts[..], &sdispls[..]);
            let mut r = PartitionMut::new(&mut recv[..], &rcounts[..], &rdispls[..]);
            mpi::request::scope(|scope| {
                let req = self
                    .world
                    .immediate_all_to_all_varcount_into(scope, &s, &mut r);
                self.wait(Op::ReduceScatter, req);
            });
            let at = (t * per_rank).min(out.len());
            sum_pieces(&mut recv, mine, &mut out[at..at + mine]);
        }
        Ok(())
    }

    fn all_gather<T: Element>(&self, mine: &[T], shards: &Shards, out: &mut [T]) -> Result<()> {
        let (world, me) = (self.placement.world, self.placement.rank);
        shards.check(world, out.len(), "all-gather")?;
        check_out(mine.len(), shards.range(me).len())?;
        let per_rank = (self.round.get() / world).max(1);
        let rounds = rounds(shards, per_rank);
        let mut recv: Vec<T> = Vec::new();
        for t in 0..rounds {
            let pieces: Vec<std::ops::Range<usize>> = shards
                .ranges()
                .iter()
                .map(|r| piece(r, t, per_rank))
                .collect();
            let counts: Vec<Count> = pieces.iter().map(|p| p.len() as Count).collect();
            let at = (t * per_rank).min(mine.len());
            let send = &mine[at..at + pieces[me].len()];
            let direct = rounds == 1 && out.len() <= Count::MAX as usize;
            self.begin(Op::AllGather);
            if direct {
                let displs: Vec<Count> = pieces.iter().map(|p| p.start as Count).collect();
                let mut r = PartitionMut::new(&mut out[..], &counts[..], &displs[..]);
                mpi::request::scope(|scope| {
                    let req = self
                        .world
                        .immediate_all_gather_varcount_into(scope, send, &mut r);
                    self.wait(Op::AllGather, req);
                });
            } else {
                let displs = displacements(&counts);
                recv.clear();
                recv.resize(pieces.iter().map(|p| p.len()).sum(), T::default());
                let mut r = PartitionMut::new(&mut recv[..], &counts[..], &displs[..]);
                mpi::request::scope(|scope| {
                    let req = self
                        .world
                        .immediate_all_gather_varcount_into(scope, send, &mut r);
                    self.wait(Op::AllGather, req);
                });
                for (p, &d) in pieces.iter().zip(&displs) {
                    out[p.clone()].copy_from_slice(&recv[d as usize..d as usize + p.len()]);
                }
            }
        }
        Ok(())
    }
}

/// The element types the MPI backend sums.
trait Element: Equivalence + Copy + Default + std::ops::Add<Output = Self> {}
impl Element for f32 {}
impl Element for f64 {}

/// Rounds needed for the longest shard.
fn rounds(shards: &Shards, per_rank: usize) -> usize {
    shards
        .ranges()
        .iter()
        .map(|r| r.len().div_ceil(per_rank))
        .max()
        .unwrap_or(0)
}

/// The part of `range` exchanged in round `t`.
fn piece(range: &std::ops::Range<usize>, t: usize, per_rank: usize) -> std::ops::Range<usize> {
    let a = (range.start + t * per_rank).min(range.end);
    a..(a + per_rank).min(range.end)
}

/// Prefix sums of `counts`.
fn displacements(counts: &[Count]) -> Vec<Count> {
    counts
        .iter()
        .scan(0, |at, &c| {
            let d = *at;
            *at += c;
            Some(d)
        })
        .collect()
}

fn check_out(got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(DistError::Shape(format!(
            "this rank's shard has {want} elements, the buffer {got}"
        )));
    }
    Ok(())
}

fn backend(msg: &str) -> DistError {
    DistError::Backend {
        backend: "mpi",
        msg: msg.to_string(),
    }
}

impl Collective for MpiCollective {
    fn backend(&self) -> &'static str {
        "mpi"
    }

    fn placement(&self) -> &Placement {
        &self.placement
    }

    fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }

    fn barrier(&self) -> Result<()> {
        self.begin(Op::Barrier);
        let req = self.world.immediate_barrier();
        self.wait(Op::Barrier, req);
        Ok(())
    }

    fn broadcast_bytes(&self, root: usize, bytes: &mut Vec<u8>) -> Result<()> {
        check_root(root, self.placement.world)?;
        let mut len = [bytes.len() as u64];
        let root_process = self.world.process_at_rank(root as i32);
        self.begin(Op::Broadcast);
        mpi::request::scope(|scope| {
            let req = root_process.immediate_broadcast_into(scope, &mut len[..]);
            self.wait(Op::Broadcast, req);
        });
        let len = usize::try_from(len[0]).map_err(|_| DistError::Message {
            rank: root,
            msg: "broadcast longer than this machine's address space".into(),
        })?;
        bytes.resize(len, 0);
        for chunk in bytes.chunks_mut(Count::MAX as usize) {
            self.begin(Op::Broadcast);
            mpi::request::scope(|scope| {
                let req = root_process.immediate_broadcast_into(scope, chunk);
                self.wait(Op::Broadcast, req);
            });
        }
        Ok(())
    }

    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let world = self.placement.world;
        let mut lens = vec![0u64; world];
        let len = [mine.len() as u64];
        self.begin(Op::AllGather);
        mpi::request::scope(|scope| {
            let req = self
                .world
                .immediate_all_gather_into(scope, &len[..], &mut lens[..]);
            self.wait(Op::AllGather, req);
        });
        let total: u64 = lens.iter().sum();
        if total == 0 {
            // Every rank knows it: nothing to exchange (Open MPI refuses an empty all-gather).
            return Ok(vec![Vec::new(); world]);
        }
        if total > Count::MAX as u64 {
            return Err(DistError::Shape(format!(
                "all-gather of {total} bytes; at most {} at once",
                Count::MAX
            )));
        }
        let counts: Vec<Count> = lens.iter().map(|&l| l as Count).collect();
        let displs = displacements(&counts);
        let mut recv = vec![0u8; total as usize];
        self.begin(Op::AllGather);
        let mut r = PartitionMut::new(&mut recv[..], &counts[..], &displs[..]);
        mpi::request::scope(|scope| {
            let req = self
                .world
                .immediate_all_gather_varcount_into(scope, mine, &mut r);
            self.wait(Op::AllGather, req);
        });
        Ok(counts
            .iter()
            .zip(&displs)
            .map(|(&c, &d)| recv[d as usize..(d + c) as usize].to_vec())
            .collect())
    }

    fn reduce_scatter_sum_f32(&self, input: &[f32], s: &Shards, out: &mut [f32]) -> Result<()> {
        self.reduce_scatter(input, s, out)
    }

    fn reduce_scatter_sum_f64(&self, input: &[f64], s: &Shards, out: &mut [f64]) -> Result<()> {
        self.reduce_scatter(input, s, out)
    }

    fn all_gather_f32(&self, mine: &[f32], s: &Shards, out: &mut [f32]) -> Result<()> {
        self.all_gather(mine, s, out)
    }

    fn all_gather_f64(&self, mine: &[f64], s: &Shards, out: &mut [f64]) -> Result<()> {
        self.all_gather(mine, s, out)
    }
}
