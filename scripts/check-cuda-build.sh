#!/usr/bin/env bash
# Builds the `rlreplay` binary with the `cuda` and `nccl` features on a machine without a CUDA
# installation: installs nvcc and the CUDA headers from PyPI into .venv/cuda, then runs
# `cargo build --release -p rlreplay-cli --features cuda,nccl` in its own target dir
# (target/cuda), so the normal build stays valid. The binary is target/cuda/release/rlreplay.
#
# candle links the CUDA libraries by name (cudarc's `dynamic-linking`). The runtime (cudart) comes
# with the nvcc wheels; for the driver (libcuda.so.1), cuBLAS/cuBLASLt (.so.13), cuRAND (.so.10)
# NVRTC (.so.13) and NCCL (.so.2, with the nccl feature) the link uses stub libraries made here from the CUDA symbols the compiled
# crates reference (as the CUDA toolkit's own stubs do for libcuda), so the multi-GB library wheels
# are not needed to build. At run time the real libraries are loaded by those names: the driver's,
# and those of a CUDA 13 installation (scripts/gpu-check.sh finds PyTorch's).
#
# The binary is built with `--features cuda,nccl` (and `mpi` where an MPI library is installed):
# data-parallel training with NCCL between the GPUs; libnccl is loaded at run time.
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
start=$(date +%s)
# Every library the binary links, CUDA and NCCL included, for the stubs below.
cargo build --release --lib -p rlreplay-train --features nccl "$@"

# Link stubs: every driver/cuBLAS/cuRAND/NVRTC function the compiled crates reference, by library.
stubs="$CARGO_TARGET_DIR/cuda-stubs"
mkdir -p "$stubs"
{ nm -u --quiet "$CARGO_TARGET_DIR"/release/deps/*.rlib 2>/dev/null || true; } |
    awk '{print $NF}' | sort -u |
    awk -v dir="$stubs" '
        /^cublasLt/ { print "void " $0 "(void) {}" > (dir "/cublasLt.c"); next }
        /^cublas/ { print "void " $0 "(void) {}" > (dir "/cublas.c"); next }
        /^curand/ { print "void " $0 "(void) {}" > (dir "/curand.c"); next }
        /^nvrtc/ { print "void " $0 "(void) {}" > (dir "/nvrtc.c"); next }
        /^nccl/ { print "void " $0 "(void) {}" > (dir "/nccl.c"); next }
        /^cu[A-Z]/ { print "void " $0 "(void) {}" > (dir "/cuda.c"); next }'
for lib in cuda:1 cublas:13 cublasLt:13 curand:10 nvrtc:13 nccl:2; do
    name=${lib%%:*} major=${lib##*:}
    [ -f "$stubs/$name.c" ] || : > "$stubs/$name.c"
    cc -shared -fPIC -o "$stubs/lib$name.so" -Wl,-soname,"lib$name.so.$major" "$stubs/$name.c"
done
export LIBRARY_PATH="$stubs:$LIBRARY_PATH"
features=cuda,nccl
command -v mpicc >/dev/null && features=cuda,nccl,mpi
cargo build --release -p rlreplay-cli --features "$features" "$@"
readelf -d "$CARGO_TARGET_DIR/release/rlreplay" | awk '/NEEDED/ {print "  needs", $NF}'
echo "rlreplay builds with --features $features (CUDA $cuda_version, sm_$CUDA_COMPUTE_CAP) in $(($(date +%s) - start)) s"
