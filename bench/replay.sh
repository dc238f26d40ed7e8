#!/usr/bin/env bash
# Replay throughput: `rlreplay replay` against the equivalent PyTorch training loop
# (bench/replay_torch.py: transformers' Qwen3, eager, float32) on the same synthetic rows and the
# same model shape, same thread count. Prints steps/s and tokens/s of both and their ratio.
#
#   bench/replay.sh            (env: THREADS=2 STEPS=4 OUT=bench/out/replay BIN=<rlreplay>)
# Needs .venv/torch (torch, transformers) and .venv/arrow (pyarrow): scripts/setup-venv.sh.
# BIN defaults to the release build `cargo build --release --bin rlreplay` (made here when BIN is
# not given; build it first and pass BIN when timing in a quiet window).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out/replay}
THREADS=${THREADS:-2}
STEPS=${STEPS:-4}
if [ -z "${BIN:-}" ]; then
    cargo build --release --quiet --bin rlreplay
    BIN=target/release/rlreplay
fi
rm -rf "$OUT"
mkdir -p "$OUT"
"$BIN" synth --out "$OUT/dataset" --steps "$STEPS" --prompts 16 --group 8 --vocab 4096 \
  --mean-len 192 --max-len 512 --prompt-len 64 --eos 1 --pattern-len 4 --seed 0 >/dev/null
cat >"$OUT/shape.json" <<'JSON'
{"vocab_size": 4096, "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
 "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32, "tie_word_embeddings": true}
JSON
cat >"$OUT/replay.toml" <<TOML
[model.random]
vocab_size = 4096
hidden_size = 256
intermediate_size = 768
num_hidden_layers = 4
num_attention_heads = 8
num_key_value_heads = 4
head_dim = 32
[data]
path = "$OUT/dataset"
eos_token_id = 1
[algorithm]
adv_estimator = "maxrl"
loss_mode = "reinforce"
[optim]
lr = 1e-5
grad_clip = 1.0
[batch]
max_tokens_per_micro_batch = 4096
[run]
threads = $THREADS
TOML
"$BIN" replay --config "$OUT/replay.toml" --out "$OUT/run" --quiet >/dev/null
.venv/arrow/bin/python bench/rows_jsonl.py "$OUT/dataset" "$OUT/rows.jsonl"
.venv/torch/bin/python bench/replay_torch.py --data "$OUT/rows.jsonl" --model "$OUT/shape.json" \
  --threads "$THREADS" --max-tokens 4096 >"$OUT/torch.json"
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
steps = [json.loads(l) for l in open(f"{out}/run/metrics.jsonl")]
secs = sum(s["perf/time_per_step"] for s in steps)
toks = sum(s["perf/total_num_tokens"] for s in steps)
rust = {"steps_per_s": len(steps) / secs, "tokens_per_s": toks / secs}
torch = json.load(open(f"{out}/torch.json"))
print(f"rlreplay replay: {rust['steps_per_s']:.3f} steps/s, {rust['tokens_per_s']:.0f} tokens/s")
print(f"PyTorch loop:    {torch['steps_per_s']:.3f} steps/s, {torch['tokens_per_s']:.0f} tokens/s")
print(f"ratio (rlreplay / PyTorch): {rust['tokens_per_s'] / torch['tokens_per_s']:.2f}x")
PY
