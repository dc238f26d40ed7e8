#!/usr/bin/env bash
# The main demo: a short replay on embedded default data. It generates a small synthetic rollout
# dataset in the published run's layout (successful responses share a token pattern), builds a tiny
# random Qwen3 on the fly, replays the dataset with MaxRL advantages, REINFORCE and AdamW, and
# prints where the artifacts are (metrics, training curve, checkpoints in the Hugging Face layout).
#
#   scripts/demo.sh [DEMO_DIR]          (default /tmp/rlreplay-demo)
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO=${1:-/tmp/rlreplay-demo}
cargo build --release --quiet -p rlreplay-cli
BIN=target/release/rlreplay
rm -rf "$DEMO"
"$BIN" synth --out "$DEMO/dataset" --steps 40 --prompts 16 --group 8 --vocab 512 \
  --mean-len 40 --max-len 96 --prompt-len 16 --eos 1 --pattern-len 4 --seed 0 >/dev/null
"$BIN" replay --config configs/demo.toml --set data.path="$DEMO/dataset" --out "$DEMO/run"
echo
echo "training curve: $DEMO/run/plots/training_score.png (and .svg)"
echo "learning signal: replay/logprob_success vs replay/logprob_failure in $DEMO/run/metrics.jsonl"
