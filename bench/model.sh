#!/usr/bin/env bash
# Forward+backward tokens/s of rlreplay's Qwen3 against PyTorch eager (transformers
# Qwen3ForCausalLM) at the same thread count, on a tiny config and on a small config with Qwen3
# proportions and the full 151,936-token vocabulary; then the peak RSS of log-probs of one
# 4096-token response through a 151,936 x 2560 lm_head; then the time and peak RSS of one
# forward+backward of 4096 tokens through 8 layers without and with per-layer activation recompute
# (each in its own process).
#
# Usage: bench/model.sh [THREADS] [ROUNDS]   (defaults 2 and 3; rounds are interleaved)
#        MODEL=DIR bench/model.sh [THREADS] [ROUNDS]   only the Hugging Face model in DIR (for
#        example models/smollm2-135m-instruct) against AutoModelForCausalLM, 4 x 256 tokens
#        (SHAPE=1x1024: one sequence of 1,024 tokens, on both sides)
# Needs .venv/torch (scripts/setup-venv.sh torch torch transformers).
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-2}
ROUNDS=${2:-3}
PY=.venv/torch/bin/python
export RAYON_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS
BIN=$(cargo bench -p rlreplay-model --bench model --no-run --message-format=json 2>/dev/null \
  | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
ratio() { # rlreplay-ms torch-ms
  awk -v r="$1" -v t="$2" 'BEGIN { printf "%.2f", t / r }'
}
ms() { sed -n 's/.*fwd_bwd_ms=\([0-9.]*\).*/\1/p'; }
fms() { sed -n 's/.* fwd_ms=\([0-9.]*\).*/\1/p'; }
if [ -n "${MODEL:-}" ]; then
  configs=(dir)
else
  configs=(tiny small)
fi
for cfg in "${configs[@]}"; do
  for round in $(seq "$ROUNDS"); do
    if [ "$cfg" = dir ]; then
      r=$("$BIN" dir "$MODEL"); echo "$r"
      t=$("$PY" bench/model_torch.py "$MODEL" "$THREADS"); echo "$t"
    else
      r=$("$BIN" "$cfg"); echo "$r"
      t=$("$PY" bench/model_torch.py "$cfg" "$THREADS"); echo "$t"
    fi
    echo "ratio config=${MODEL:-$cfg} round=$round threads=$THREADS" \
      "fwd_bwd_speedup_vs_torch=$(ratio "$(echo "$r" | ms)" "$(echo "$t" | ms)")" \
      "fwd_speedup_vs_torch=$(ratio "$(echo "$r" | fms)" "$(echo "$t" | fms)")"
  done
done
[ -n "${MODEL:-}" ] && exit 0
"$BIN" logprobs-rss
"$BIN" recompute-rss off
"$BIN" recompute-rss on
