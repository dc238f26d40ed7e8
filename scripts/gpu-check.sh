#!/usr/bin/env bash
# The GPU device check. Prints one JSON object on standard output (progress on standard error):
#   golden_logprobs         the golden Qwen3/Qwen2 fixtures' log-probs on CUDA in f32 and bf16
#                           against transformers' float64 values (goal: f32 <= 1e-4, bf16 <= 5e-2)
#   replay_step             one replay step's gradient and AdamW update on CUDA (f32, bf16)
#                           against the same step on the CPU in f32 (relative L2 errors)
#   throughput_qwen3_0_6b   forward+backward tokens/s, peak GPU memory and MFU of a random
#                           Qwen3-0.6B-shaped model on 4 x 4096 packed tokens, with and without
#                           gradient checkpointing
#   replay_step_qwen3_4b    whether a full replay step (AdamW included) of a random
#                           Qwen3-4B-shaped model on 4 x 4096 tokens fits (gradient checkpointing),
#                           its time and peak memory
#   replay_cli              `rlreplay replay` for one step with [model] device on the GPU (bf16)
# Every item runs in its own process under a time limit (about 7 minutes in all); a failed item
# reports its error and the others still run.
#
# It needs no Rust toolchain: only the binary built by scripts/check-cuda-build.sh, this
# repository's fixtures, python3, and the CUDA 13 libraries the binary loads (libcuda from the
# driver; cuBLAS, cuRAND, NVRTC and the runtime from the installed PyTorch's nvidia wheels, from
# torch/lib, or from the system, found at run time).
#
# Usage: scripts/gpu-check.sh
# Environment:
#   RLREPLAY     the binary (default: target/cuda/release/rlreplay, else target/release/rlreplay)
#   DEVICE       cuda (default), cuda:N, or cpu: every item on tiny shapes in seconds (checks the
#                script itself; its figures mean nothing)
#   PEAK_TFLOPS  dense bf16 peak of the GPU for the MFU (default from its name: H100/H200 SXM
#                989.4, H100 NVL 835, H100 PCIe 756)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
device=${DEVICE:-cuda}
bin=${RLREPLAY:-}
if [ -z "$bin" ]; then
    bin=$root/target/cuda/release/rlreplay
    [ -x "$bin" ] || bin=$root/target/release/rlreplay
fi
[ -x "$bin" ] || { echo "gpu-check: no rlreplay binary at $bin (set RLREPLAY)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "gpu-check: python3 is needed" >&2; exit 2; }
fixtures=$root/crates/rlreplay-model/tests/fixtures
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
log() { echo "gpu-check [$(($(date +%s) - start)) s]: $*" >&2; }

gpu_name=
gpu_index=0
case $device in cuda:*) gpu_index=${device#cuda:} ;; esac
if [ "$device" != cpu ]; then
    # The CUDA libraries the binary needs, from wherever this machine keeps them.
    libdirs=$(python3 - <<'EOF'
import glob, os, site, sys
want = ["libcublas.so.13", "libcublasLt.so.13", "libcurand.so.10", "libnvrtc.so.13", "libcudart.so.13"]
roots = []
try:
    import torch
    roots.append(os.path.dirname(torch.__file__))
except Exception:
    pass
try:
    import nvidia
    roots.extend(nvidia.__path__)
except Exception:
    pass
roots.extend(site.getsitepackages() + [site.getusersitepackages()])
roots.extend(["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"])
dirs = []
for lib in want:
    for root in roots:
        hits = glob.glob(os.path.join(root, "**", lib), recursive=True) if os.path.isdir(root) else []
        if hits:
            d = os.path.dirname(hits[0])
            if d not in dirs:
                dirs.append(d)
            break
print(":".join(dirs))
EOF
)
    export LD_LIBRARY_PATH="${libdirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    if command -v nvidia-smi >/dev/null; then
        gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader -i "$gpu_index" 2>/dev/null)
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
            > "$work/gpus.txt" 2>&1
    fi
fi
missing=$(ldd "$bin" 2>/dev/null | awk '/not found/ {print $1}' | tr '\n' ' ')
[ -n "$missing" ] && log "libraries not found: $missing"
peak=${PEAK_TFLOPS:-}
if [ -z "$peak" ]; then
    case "$gpu_name" in
        *PCIe*) peak=756 ;;
        *NVL*) peak=835 ;;
        *) peak=989.4 ;;
    esac
fi

# Samples the GPU's used memory (MiB) every 200 ms into $1 until stopped.
sample_memory() {
    command -v nvidia-smi >/dev/null || return 0
    while :; do
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$gpu_index" \
            2>/dev/null | tr -d ' ' >> "$1"
        sleep 0.2
    done
}

# run_item NAME SECONDS COMMAND...: the command's JSON goes to $work/NAME.json, or an error.
run_item() {
    local name=$1 limit=$2
    shift 2
    log "$name (at most $limit s)"
    local sampler=
    if [ "$device" != cpu ]; then
        sample_memory "$work/$name.mem" &
        sampler=$!
    fi
    local t0=$SECONDS rc=0
    timeout --kill-after=10 "$limit" "$@" > "$work/$name.out" 2> "$work/$name.err" || rc=$?
    [ -n "$sampler" ] && kill "$sampler" 2>/dev/null
    python3 - "$work" "$name" "$rc" "$((SECONDS - t0))" "$limit" <<'EOF'
import json, sys
work, name, rc, secs, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
try:
    out = json.loads(open(f"{work}/{name}.out").read().strip().splitlines()[-1])
except Exception:
    out = {}
if rc != 0 or not out:
    err = open(f"{work}/{name}.err", errors="replace").read().strip().splitlines()
    why = f"timed out after {limit} s" if rc in (124, 137) else f"exit status {rc}"
    out = {"error": why, "stderr_tail": err[-8:]}
out["wall_s"] = secs
try:
    mem = [int(x) for x in open(f"{work}/{name}.mem").read().split() if x.isdigit()]
    if mem:
        out["nvidia_smi_peak_memory_gib"] = max(mem) / 1024
except FileNotFoundError:
    pass
json.dump(out, open(f"{work}/{name}.json", "w"))
EOF
}

dc=("$bin" device-check)
if [ "$device" = cpu ]; then
    small=(--shape tiny --seqs 2 --seq-len 64 --prompt-len 16)
    big=(--shape tiny --seqs 2 --seq-len 64 --prompt-len 16)
    demo_dtype=f32
else
    small=(--shape qwen3-0.6b --seqs 4 --seq-len 4096 --prompt-len 512)
    big=(--shape qwen3-4b --seqs 4 --seq-len 4096 --prompt-len 512)
    demo_dtype=bf16
fi
run_item golden_logprobs 60 "${dc[@]}" golden --fixtures "$fixtures" --device "$device"
run_item replay_step 60 "${dc[@]}" step --fixtures "$fixtures" --device "$device"
run_item throughput_qwen3_0_6b 150 "${dc[@]}" throughput "${small[@]}" --device "$device" \
    --modes full,recompute --warmup 1 --steps 3 --peak-tflops "$peak"
run_item replay_step_qwen3_4b 150 "${dc[@]}" throughput "${big[@]}" --device "$device" \
    --modes recompute --optimizer --warmup 0 --steps 2 --peak-tflops "$peak"

# The replay command itself on the device: one step of the demo configuration.
replay_cli() {
    "$bin" synth --out "$work/dataset" --steps 2 --prompts 8 --group 4 --vocab 512 \
        --mean-len 40 --max-len 96 --prompt-len 16 --eos 1 --pattern-len 4 --seed 0 >/dev/null &&
    "$bin" replay --config "$root/configs/demo.toml" --set data.path="\"$work/dataset\"" \
        --set model.device="\"$device\"" --set model.dtype="\"$demo_dtype\"" \
        --out "$work/run" --stop-after 1 >&2 &&
    python3 -c 'import json, sys; rows = [json.loads(l) for l in open(sys.argv[1])]; print(json.dumps({"ok": True, "steps": len(rows), "last": rows[-1]}))' \
        "$work/run/metrics.jsonl"
}
export -f replay_cli
export bin work root device demo_dtype
run_item replay_cli 40 bash -c replay_cli

python3 - "$work" "$device" "$bin" "$peak" "$((SECONDS))" "$missing" <<'EOF'
import json, os, sys
work, device, binary, peak, secs, missing = sys.argv[1:7]
items = ["golden_logprobs", "replay_step", "throughput_qwen3_0_6b", "replay_step_qwen3_4b", "replay_cli"]
out = {"device": device, "binary": binary, "peak_tflops_for_mfu": float(peak),
       "ld_library_path": os.environ.get("LD_LIBRARY_PATH", ""),
       "missing_libraries": missing.split()}
try:
    out["gpus"] = open(f"{work}/gpus.txt").read().strip().splitlines()
except FileNotFoundError:
    out["gpus"] = []
for name in items:
    try:
        out[name] = json.load(open(f"{work}/{name}.json"))
    except Exception as e:
        out[name] = {"error": f"no result: {e}"}
out["elapsed_s"] = int(secs)
print(json.dumps(out, indent=1))
EOF
