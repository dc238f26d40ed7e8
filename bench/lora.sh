#!/usr/bin/env bash
# LoRA against full fine-tuning: the same replay steps (real-length rows in the real model's
# vocabulary) on the real SmolLM2-135M-Instruct, trained once through every weight and once
# through rank-RANK adapters on every linear layer (lora_alpha 2·RANK), at each thread count, by
# `rlreplay replay` and by the equivalent PyTorch loop (bench/replay_torch.py: transformers, eager,
# float32; PEFT for the adapters). Prints the update time per step (the median of the steps after
# the first), tokens/s and the process's peak RSS of each, then the ratios.
#
#   bench/lora.sh   (env: MODEL=models/smollm2-135m-instruct THREADS="1 2" STEPS=3 RANK=16
#                    OUT=bench/out/lora BIN=<rlreplay>)
# The model comes from scripts/install-smollm2.sh; the PyTorch side needs .venv/torch
# (scripts/setup-venv.sh torch torch transformers peft pyarrow); it pads each micro-batch to its
# longest row and materialises the full-vocabulary logits, so its micro-batches hold at most 2,048
# tokens (with 4,096, as rlreplay's, PEFT's step needs more than 24 GiB). BIN defaults to the release build
# (`cargo build --release --bin rlreplay`, made here when BIN is not given).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/smollm2-135m-instruct}
OUT=${OUT:-bench/out/lora}
THREADS=${THREADS:-1 2}
STEPS=${STEPS:-3}
RANK=${RANK:-16}
PY=.venv/torch/bin/python
if [ -z "${BIN:-}" ]; then
    cargo build --release --quiet --bin rlreplay
    BIN=target/release/rlreplay
fi
rm -rf "$OUT"
mkdir -p "$OUT"
VOCAB=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$MODEL/config.json")
"$BIN" synth --out "$OUT/dataset" --steps "$STEPS" --prompts 4 --group 4 --vocab "$VOCAB" \
  --mean-len 192 --max-len 512 --prompt-len 64 --tokenizer "$MODEL" --pattern-len 4 --seed 0 \
  >/dev/null
"$PY" bench/rows_jsonl.py "$OUT/dataset" "$OUT/rows.jsonl"
row() {  # side mode threads update_s tok_s rss_file
    local rss
    rss=$(tail -n 1 "$6")
    printf '%-8s %-5s %-7s %10.2f %9.1f %11.0f\n' "$1" "$2" "$3" "$4" "$5" "$((rss / 1024))" \
        | tee -a "$OUT/results.txt"
}
printf '%-8s %-5s %-7s %10s %9s %11s\n' side mode threads update_s tok_s peak_rss_mb
for t in $THREADS; do
    for mode in full lora; do
        lora="" rank=0
        if [ "$mode" = lora ]; then
            rank=$RANK
            lora="lora_rank = $RANK
lora_alpha = $((2 * RANK))
target_modules = \"all-linear\""
        fi
        cat >"$OUT/$mode-$t.toml" <<TOML
[model]
path = "$MODEL"
$lora
[data]
path = "$OUT/dataset"
[algorithm]
adv_estimator = "maxrl"
loss_mode = "reinforce"
[optim]
lr = 1e-5
grad_clip = 1.0
[batch]
max_tokens_per_micro_batch = 4096
[trainer]
threads = $t
save_freq = 0
TOML
        run="$OUT/run-$mode-$t"
        /usr/bin/time -f '%M' -o "$OUT/rss-rlreplay-$mode-$t" \
            "$BIN" replay --config "$OUT/$mode-$t.toml" --out "$run" --quiet >/dev/null
        read -r upd tok < <(python3 - "$run/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
later = rows[1:] or rows
print(statistics.median(r["timing_s/update"] for r in later),
      statistics.median(r["perf/total_num_tokens"] / r["timing_s/update"] for r in later))
PY
)
        row rlreplay "$mode" "$t" "$upd" "$tok" "$OUT/rss-rlreplay-$mode-$t"
        /usr/bin/time -f '%M' -o "$OUT/rss-torch-$mode-$t" \
            "$PY" bench/replay_torch.py --data "$OUT/rows.jsonl" --model-dir "$MODEL" \
            --lora-rank "$rank" --threads "$t" --max-tokens 2048 >"$OUT/torch-$mode-$t.json" \
            2>"$OUT/torch-$mode-$t.log"
        read -r upd tok < <(python3 -c "
import json, sys
j = json.load(open(sys.argv[1]))
toks = j['tokens_per_s'] * j['seconds'] / j['steps']
print(j['update_s'], toks / j['update_s'])" "$OUT/torch-$mode-$t.json")
        row pytorch "$mode" "$t" "$upd" "$tok" "$OUT/rss-torch-$mode-$t"
    done
done
python3 - "$OUT/results.txt" <<'PY'
import sys
by = {}
for l in open(sys.argv[1]):
    side, mode, t, upd, tok, rss = l.split()
    by[(side, mode, t)] = (float(upd), float(rss))
for t in sorted({k[2] for k in by}):
    for side in ("rlreplay", "pytorch"):
        (fu, fm), (lu, lm) = by[(side, "full", t)], by[(side, "lora", t)]
        print(f"threads {t} {side}: LoRA update {fu / lu:.2f}x faster than full, peak RSS {lm / fm:.2f}x")
    for mode in ("full", "lora"):
        r, p = by[("rlreplay", mode, t)], by[("pytorch", mode, t)]
        print(f"threads {t} {mode}: rlreplay {p[0] / r[0]:.2f}x the speed of PyTorch, {r[1] / p[1]:.2f}x its memory")
PY
