#!/usr/bin/env bash
# Checks that the GPU code compiles on a machine without a CUDA installation: installs nvcc and
# the CUDA headers from PyPI into .venv/cuda, then builds rlreplay-model with `--features cuda`
# and rlreplay-dist with `--features nccl` (and `mpi` where an MPI library is installed) in their
# own target dir (target/cuda), so the normal build stays valid. It only compiles (candle's PTX
# kernels included; libnccl is loaded at run time); running needs a GPU and driver.
#
# Usage: scripts/check-cuda-build.sh [extra cargo args]
# Environment: CUDA_COMPUTE_CAP (default 90, H100/H200), CARGO_TARGET_DIR (default target/cuda).
#
# PyPI only ships a complete nvcc for CUDA 13 (the `-cu12` nvcc wheels hold ptxas alone); the
# CUDA 13 wheels install into one tree, site-packages/nvidia/cu13, used as the CUDA root.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cuda_version=13.0
venv=$("$root/scripts/setup-venv.sh" cuda \
    "nvidia-cuda-nvcc==$cuda_version.*" "nvidia-cuda-crt==$cuda_version.*" \
    "nvidia-nvvm==$cuda_version.*" "nvidia-cuda-runtime==$cuda_version.*" \
    "nvidia-cuda-cccl==$cuda_version.*")
cuda_root=$("$venv/bin/python" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')
[ -x "$cuda_root/bin/nvcc" ] || { echo "no nvcc in $cuda_root/bin" >&2; exit 1; }
# candle-kernels links `cudart` by its unversioned name; the wheel has only libcudart.so.13.
[ -e "$cuda_root/lib/libcudart.so" ] || ln -s libcudart.so.13 "$cuda_root/lib/libcudart.so"

export PATH="$cuda_root/bin:$PATH"
export CUDA_ROOT="$cuda_root" CUDA_HOME="$cuda_root" CUDA_PATH="$cuda_root"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
export LIBRARY_PATH="$cuda_root/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target/cuda}"
nvcc --version | tail -2
cd "$root"
cargo build -p rlreplay-model --features cuda --release "$@"
echo "rlreplay-model builds with --features cuda (CUDA $cuda_version, sm_$CUDA_COMPUTE_CAP)"
dist_features=nccl
command -v mpicc >/dev/null && dist_features=nccl,mpi
cargo build -p rlreplay-dist --features "$dist_features" --release "$@"
echo "rlreplay-dist builds with --features $dist_features"
