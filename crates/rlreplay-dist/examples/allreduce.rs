//! All-reduce throughput of the MPI backend: the deterministic rank-ordered sum
//! (`all_reduce_sum_f32`: all-to-all of shards, pairwise sum in rank order, all-gather) against
//! MPI's own `MPI_Allreduce` (whose grouping depends on the algorithm MPI picks), on f32 buffers
//! of gradient size. Run under `mpirun -np N`; rank 0 prints one line per size.
//!
//!   mpirun -np 2 target/release/examples/allreduce [REPS]

use std::time::Instant;

use mpi::collective::SystemOperation;
use mpi::traits::*;
use rlreplay_dist::mpi::MpiCollective;
use rlreplay_dist::{Collective, DEFAULT_TIMEOUT};

fn main() {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let comm = MpiCollective::init(DEFAULT_TIMEOUT).expect("MPI starts");
    let world = comm.communicator();
    let (r, n) = (comm.rank(), comm.world());
    if r == 0 {
        println!(
            "ranks={n} reps={reps} (median per call; bus bandwidth = 2(N-1)/N * bytes / time)"
        );
        println!(
            "{:>10} {:>12} {:>12} {:>8} {:>10}",
            "elements", "ordered ms", "MPI ms", "ratio", "ord GB/s"
        );
    }
    // 4.2 M elements: the gradient of the tiny benchmark Qwen3 (bench/replay.sh).
    for len in [4_096usize, 262_144, 4_194_304, 16_777_216] {
        let base: Vec<f32> = (0..len)
            .map(|i| ((i * 31 + r * 7) % 1000) as f32 * 1e-3)
            .collect();
        let mut ordered = Vec::with_capacity(reps);
        let mut native = Vec::with_capacity(reps);
        let mut out = vec![0f32; len];
        for _ in 0..reps {
            // Interleaved so both see the same load.
            let mut buf = base.clone();
            comm.barrier().unwrap();
            let t = Instant::now();
            comm.all_reduce_sum_f32(&mut buf).unwrap();
            ordered.push(t.elapsed().as_secs_f64());
            comm.barrier().unwrap();
            let t = Instant::now();
            world.all_reduce_into(&base[..], &mut out[..], SystemOperation::sum());
            native.push(t.elapsed().as_secs_f64());
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (o, m) = (median(&mut ordered), median(&mut native));
        if r == 0 {
            let bus = 2.0 * (n - 1) as f64 / n as f64 * (len * 4) as f64 / o / 1e9;
            println!(
                "{len:>10} {:>12.3} {:>12.3} {:>8.2} {bus:>10.2}",
                o * 1e3,
                m * 1e3,
                o / m
            );
        }
    }
}
