#!/usr/bin/env python3
"""`rlreplay.open_dataset(DIR).read_step(step)` against `pyarrow.parquet.read_table` of the same
shard with the same columns.

read_step reads, validates (lengths, finite log-probs, groups) and returns the step in the
canonical schema as a pyarrow.Table; pyarrow reads the columns read_step returns, without checks.
Each round reads every step once with each reader, alternating; reports the median per step,
rows/s and decoded MB/s (the tables' `nbytes`), and checks that both give the same rows.

Usage: python bench/read_step.py DIR [--steps N] [--rounds R]
DIR: shards of the published size, e.g. `rlreplay synth --out DIR --steps 3 --prompts 256
--group 16 --seed 1` (4096 rows per shard). Needs rlreplay (`pip install '.[arrow]'`, release
profile) and pyarrow in the same environment.
"""

import argparse
import os
import statistics
import time

import pyarrow as pa
import pyarrow.parquet as pq

import rlreplay


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    ds = rlreplay.open_dataset(args.dir)
    steps = ds.steps[: args.steps]
    shard = {s: os.path.join(args.dir, "data", f"step-{s:04d}.parquet") for s in steps}
    # Warm the page cache and check that both readers see the same rows.
    columns = {}
    for s in steps:
        ours = ds.read_step(s)
        names = set(pq.read_schema(shard[s]).names)
        columns[s] = [c for c in ours.schema.names if c in names]
        theirs = pq.read_table(shard[s], columns=columns[s])
        assert ours.num_rows == theirs.num_rows, (s, ours.num_rows, theirs.num_rows)
        for c in ["uid", "score", "response_token_ids"]:
            assert ours.column(c).to_pylist() == theirs.column(c).to_pylist(), c

    readers = {
        "rlreplay read_step": lambda s: ds.read_step(s),
        "pyarrow read_table": lambda s: pq.read_table(shard[s], columns=columns[s]),
        "pyarrow read_table, 1 thread": lambda s: pq.read_table(
            shard[s], columns=columns[s], use_threads=False
        ),
    }
    times = {name: [] for name in readers}
    rows = nbytes = 0
    for _ in range(args.rounds):
        for name, read in readers.items():
            for s in steps:
                secs, table = timed(lambda: read(s))
                times[name].append(secs)
                if name == "rlreplay read_step":
                    rows += table.num_rows
                    nbytes += table.nbytes
    rows /= args.rounds * len(steps)
    nbytes /= args.rounds * len(steps)
    print(
        f"{len(steps)} steps of {rows:.0f} rows, {nbytes / 2**20:.1f} MiB decoded per step; "
        f"rlreplay {rlreplay.__version__}, pyarrow {pa.__version__} ({pa.cpu_count()} threads), "
        f"{args.rounds} rounds, median per step:"
    )
    base = statistics.median(times["rlreplay read_step"])
    for name, ts in times.items():
        m = statistics.median(ts)
        print(
            f"  {name:<30} {m * 1e3:8.1f} ms  {rows / m:12,.0f} rows/s  "
            f"{nbytes / 2**20 / m:8.1f} MiB/s  ({m / base:.2f}x read_step's time)"
        )


if __name__ == "__main__":
    main()
