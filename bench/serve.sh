#!/usr/bin/env bash
# `rlreplay serve` throughput: tokens/s under 1, 8 and 32 concurrent requests against the
# in-process engine decoding the same prompts as one batch (random Qwen3, 4 layers, hidden 256,
# vocab 8192; prompts of 32 tokens, 128 new tokens each, temperature 1, top-p 0.95). The two paths
# alternate, so both see the same machine load; the load average is printed before and after,
# and the ratio serve / engine per concurrency (mean of the rounds).
#
# Usage: bench/serve.sh [prompt_len=32] [new_tokens=128] [per_client=2] [rounds=2] [threads=2]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
prompt_len=${1:-32}; new_tokens=${2:-128}; per_client=${3:-2}; rounds=${4:-2}; threads=${5:-2}
cd "$root"
cargo build --release -q -p rlreplay-serve --example serve_bench
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
out=$(RAYON_NUM_THREADS=$threads "$root/target/release/examples/serve_bench" "$prompt_len" "$new_tokens" "$per_client" "$rounds" 1 8 32)
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
echo "$out"
echo "load average before: $load_before, after: $load_after"
python3 -c "
import json, sys, collections
runs = [json.loads(l) for l in sys.argv[1].splitlines()]
by = collections.defaultdict(list)
for r in runs:
    by[(r['path'], r['concurrency'])].append(r['tokens_per_s'])
for c in sorted({r['concurrency'] for r in runs}):
    e = sum(by[('engine', c)]) / len(by[('engine', c)])
    s = sum(by[('serve', c)]) / len(by[('serve', c)])
    print(f'concurrency {c:>2}: engine {e:8.1f} tok/s, serve {s:8.1f} tok/s, ratio serve/engine {s / e:.2f}x')
" "$out"
