//! Multi-rank tests of the MPI backend. Run directly (by `cargo test --features mpi`), this
//! program starts itself under `mpirun --allow-run-as-root --oversubscribe -np N` once per
//! scenario and checks each job's exit status and output; under `mpirun` it is one rank of a
//! scenario. Without the `mpi` feature it has nothing to run.

#[cfg(not(feature = "mpi"))]
fn main() {
    println!("multi-rank tests need `--features mpi`");
}

#[cfg(feature = "mpi")]
fn main() {
    mpi_ranks::main();
}

#[cfg(feature = "mpi")]
mod mpi_ranks {
    use std::process::Command;
    use std::time::{Duration, Instant};

    use rlreplay_dist::mpi::MpiCollective;
    use rlreplay_dist::{
        all_gather_named, partition_rows, sum_in_rank_order, Collective, Placement, Shards,
    };

    pub fn main() {
        match std::env::args().nth(1) {
            Some(s) if Placement::from_env().is_ok_and(|p| p.world > 1) => rank(&s),
            _ => drive(),
        }
    }

    /// What a scenario's job must do.
    struct Expect {
        ranks: usize,
        success: bool,
        /// Strings the job's output must contain.
        output: &'static [&'static str],
        /// Longest acceptable run time.
        within: Duration,
    }

    fn drive() {
        let scenarios: [(&str, Expect); 5] = [
            (
                "collectives",
                Expect {
                    ranks: 2,
                    success: true,
                    output: &["rank 1 ok"],
                    within: secs(120),
                },
            ),
            (
                "collectives",
                Expect {
                    ranks: 3,
                    success: true,
                    output: &["rank 2 ok"],
                    within: secs(120),
                },
            ),
            (
                // kill -9 of one rank: mpirun ends the job and names the rank.
                "dead",
                Expect {
                    ranks: 2,
                    success: false,
                    output: &["rank 1", "signal 9"],
                    within: secs(60),
                },
            ),
            (
                // A rank stuck outside the collectives: the timeout names it.
                "hang",
                Expect {
                    ranks: 2,
                    success: false,
                    output: &["rank 1 did not answer (dead, or stuck outside a collective)"],
                    within: secs(60),
                },
            ),
            (
                // A rank slower than the timeout that does arrive: no abort.
                "slow",
                Expect {
                    ranks: 2,
                    success: true,
                    output: &["completed after", "rank 1 ok"],
                    within: secs(60),
                },
            ),
        ];
        let exe = std::env::current_exe().expect("the test's own path");
        let (mut passed, mut failed) = (0, 0);
        for (name, want) in &scenarios {
            let start = Instant::now();
            let out = Command::new("mpirun")
                .args(["--allow-run-as-root", "--oversubscribe", "-np"])
                .arg(want.ranks.to_string())
                .arg(&exe)
                .arg(name)
                .output()
                .expect("mpirun (Open MPI) on the PATH");
            let took = start.elapsed();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let mut problems = Vec::new();
            if out.status.success() != want.success {
                problems.push(format!("exit status {}", out.status));
            }
            for s in want.output {
                if !text.contains(s) {
                    problems.push(format!("no `{s}` in the output"));
                }
            }
            if took > want.within {
                problems.push(format!("took {took:?}, more than {:?}", want.within));
            }
            if problems.is_empty() {
                passed += 1;
                println!("test {name} ({} ranks) ... ok ({took:.1?})", want.ranks);
            } else {
                failed += 1;
                println!(
                    "test {name} ({} ranks) ... FAILED: {}\n--- output ---\n{text}",
                    want.ranks,
                    problems.join("; ")
                );
            }
        }
        println!("{passed} passed, {failed} failed");
        if failed > 0 {
            std::process::exit(1);
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn rank(scenario: &str) {
        let timeout = match scenario {
            "hang" => secs(2),
            "slow" => secs(4),
            _ => secs(60),
        };
        let comm = MpiCollective::init(timeout).expect("MPI starts");
        let r = comm.rank();
        match scenario {
            "collectives" => collectives(&comm),
            "dead" => {
                if r == 1 {
                    let pid = std::process::id().to_string();
                    let _ = Command::new("kill").args(["-9", &pid]).status();
                    std::thread::sleep(secs(60));
                }
                comm.barrier().expect("barrier");
            }
            "hang" => {
                if r == 1 {
                    std::thread::sleep(secs(60));
                }
                comm.barrier().expect("barrier");
            }
            "slow" => {
                if r == 1 {
                    std::thread::sleep(secs(6));
                }
                let mut v = vec![r as f64];
                comm.all_reduce_sum_f64(&mut v).expect("all-reduce");
                assert_eq!(v[0], 1.0);
            }
            other => panic!("unknown scenario {other}"),
        }
        println!("rank {r} ok");
    }

    /// A value that every rank can compute for every rank.
    fn value(rank: usize, i: usize) -> f32 {
        let h = (rank as u64 * 1_000_003 + i as u64 * 7919) % 10_007;
        (h as f32 - 5000.0) * 1.37e-3 * if i.is_multiple_of(7) { 1e4 } else { 1.0 }
    }

    fn collectives(comm: &MpiCollective) {
        let (r, n) = (comm.rank(), comm.world());
        assert_eq!(
            comm.placement().local_rank,
            r,
            "one node: local rank is the rank"
        );
        assert_eq!(comm.placement().local_world, Some(n));
        comm.barrier().unwrap();

        // All-reduce: the rank-ordered pairwise sum, the same bits everywhere, twice.
        for len in [0usize, 1, 5, 1000, 100_003] {
            let mut buf: Vec<f32> = (0..len).map(|i| value(r, i)).collect();
            comm.all_reduce_sum_f32(&mut buf).unwrap();
            for (i, &b) in buf.iter().enumerate() {
                let mut col: Vec<f32> = (0..n).map(|q| value(q, i)).collect();
                assert_eq!(
                    b.to_bits(),
                    sum_in_rank_order(&mut col).unwrap().to_bits(),
                    "{i}"
                );
            }
            let mut again: Vec<f32> = (0..len).map(|i| value(r, i)).collect();
            comm.all_reduce_sum_f32(&mut again).unwrap();
            assert_eq!(again, buf);
            let mut d: Vec<f64> = (0..len).map(|i| f64::from(value(r, i))).collect();
            comm.all_reduce_sum_f64(&mut d).unwrap();
            for (i, &x) in d.iter().enumerate() {
                let mut col: Vec<f64> = (0..n).map(|q| f64::from(value(q, i))).collect();
                assert_eq!(x.to_bits(), sum_in_rank_order(&mut col).unwrap().to_bits());
            }
        }

        // Reduce-scatter and all-gather on uneven shards, one of them empty.
        let len = 11;
        let mut ranges = vec![6..6; n];
        ranges[0] = 0..6;
        ranges[n - 1] = 6..len;
        let shards = Shards::from_ranges(ranges).unwrap();
        let input: Vec<f64> = (0..len).map(|i| f64::from(value(r, i))).collect();
        let mine_range = shards.range(r);
        let mut mine = vec![0.0; mine_range.len()];
        comm.reduce_scatter_sum_f64(&input, &shards, &mut mine)
            .unwrap();
        for (k, i) in mine_range.clone().enumerate() {
            let mut col: Vec<f64> = (0..n).map(|q| f64::from(value(q, i))).collect();
            assert_eq!(mine[k], sum_in_rank_order(&mut col).unwrap());
        }
        let mut full = vec![0.0; len];
        comm.all_gather_f64(&mine, &shards, &mut full).unwrap();
        let mut want: Vec<f64> = (0..len).map(|i| f64::from(value(r, i))).collect();
        comm.all_reduce_sum_f64(&mut want).unwrap();
        assert_eq!(full, want);

        // Rounds: a tiny round size forces many exchanges and the packed paths.
        let mut big: Vec<f32> = (0..37).map(|i| value(r, i)).collect();
        comm.all_reduce_sum_f32(&mut big).unwrap();
        comm.set_round(4);
        let mut buf: Vec<f32> = (0..37).map(|i| value(r, i)).collect();
        comm.all_reduce_sum_f32(&mut buf).unwrap();
        assert_eq!(buf, big);
        let mut mine = vec![0.0; mine_range.len()];
        comm.reduce_scatter_sum_f64(&input, &shards, &mut mine)
            .unwrap();
        let mut again = vec![0.0; len];
        comm.all_gather_f64(&mine, &shards, &mut again).unwrap();
        assert_eq!(again, want);
        comm.set_round(rlreplay_dist::mpi::DEFAULT_ROUND);

        // Bytes: broadcast from the last rank, all-gather of different lengths.
        let mut bytes = if r == n - 1 {
            b"from the last rank".to_vec()
        } else {
            vec![9; 3]
        };
        comm.broadcast_bytes(n - 1, &mut bytes).unwrap();
        assert_eq!(bytes, b"from the last rank");
        let mine: Vec<u8> = vec![r as u8; r * 3];
        let all = comm.all_gather_bytes(&mine).unwrap();
        for (q, b) in all.iter().enumerate() {
            assert_eq!(b, &vec![q as u8; q * 3]);
        }
        // Nothing from any rank.
        assert_eq!(
            comm.all_gather_bytes(&[]).unwrap(),
            vec![Vec::<u8>::new(); n]
        );
        assert_eq!(comm.broadcast_u64(0, 42 + r as u64).unwrap(), 42);

        // Named weighted values, in rank order; rank 0 sends one more.
        let name = format!("rank{r}");
        let mut mine = vec![(name.as_str(), r as f64 + 0.5, (r + 1) as f64)];
        if r == 0 {
            mine.push(("only_rank0", 5.0, 1.0));
        }
        let mut want = vec![
            ("rank0".to_string(), 0.5, 1.0),
            ("only_rank0".to_string(), 5.0, 1.0),
        ];
        want.extend((1..n).map(|q| (format!("rank{q}"), q as f64 + 0.5, (q + 1) as f64)));
        assert_eq!(all_gather_named(comm, &mine).unwrap(), want);

        // The partition rule needs no communication: every rank computes the same split.
        let split = partition_rows(&[5, 1, 1, 9, 2], n);
        let enc: Vec<u8> = split
            .iter()
            .flat_map(|p| [p.start as u8, p.end as u8])
            .collect();
        for b in comm.all_gather_bytes(&enc).unwrap() {
            assert_eq!(b, enc);
        }
        comm.barrier().unwrap();
    }
}
