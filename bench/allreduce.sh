#!/usr/bin/env bash
# All-reduce throughput of the MPI backend: rlreplay's deterministic rank-ordered sum against
# Open MPI's own MPI_Allreduce on the same f32 buffers (median of REPS interleaved calls).
#
#   bench/allreduce.sh            (env: RANKS=2 REPS=20)
# Needs Open MPI (openmpi-bin libopenmpi-dev) and libclang-dev.
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${RANKS:-2}
REPS=${REPS:-20}
cargo build --release --quiet -p rlreplay-dist --features mpi --example allreduce
mpirun --allow-run-as-root --oversubscribe -np "$RANKS" --bind-to none \
    target/release/examples/allreduce "$REPS"
