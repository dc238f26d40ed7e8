#!/usr/bin/env bash
# Sampling throughput: rlreplay's batched KV-cache sampler against transformers' `generate` on the
# same random Qwen3 model (4 layers, hidden 256, vocab 8192), same batch, prompt length, number of
# new tokens, sampling settings (temperature 1, top-p 0.95, no stop ids) and thread count.
# MODEL=DIR runs both on that model directory instead (for example models/smollm2-135m-instruct).
# Prints both results (tokens/s and CPU seconds of the timed call), the load average before and
# after, and the ratios rlreplay / transformers of tokens/s and of tokens per CPU second.
#
# Usage: bench/generate.sh [batch=16] [prompt_len=32] [new_tokens=128] [threads=2]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
batch=${1:-16}; prompt_len=${2:-32}; new_tokens=${3:-128}; threads=${4:-2}
py="$root/.venv/torch/bin/python"
[ -x "$py" ] || { echo "missing $py (scripts/setup-venv.sh torch torch transformers safetensors)" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$root"
cargo build --release -q -p rlreplay-sampling --example generate_bench
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
model=${MODEL:-$dir/model}
ours=$(RAYON_NUM_THREADS=$threads "$root/target/release/examples/generate_bench" "$model" "$batch" "$prompt_len" "$new_tokens")
theirs=$("$py" "$root/bench/generate_hf.py" "$model" "$batch" "$prompt_len" "$new_tokens" "$threads")
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
echo "$ours"
echo "$theirs"
echo "load average before: $load_before, after: $load_after"
python3 -c "
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f\"ratio rlreplay/transformers tokens/s: {a['tokens_per_s'] / b['tokens_per_s']:.2f}x\")
if a.get('cpu_seconds') and b.get('cpu_seconds'):
    ca, cb = a['tokens'] / a['cpu_seconds'], b['tokens'] / b['cpu_seconds']
    print(f\"tokens per CPU second: {ca:.1f} vs {cb:.1f}, ratio {ca / cb:.2f}x\")
" "$ours" "$theirs"
