#!/usr/bin/env bash
# LoRA against full fine-tuning: the same replay steps (real-length rows in the real model's
# vocabulary) on the real SmolLM2-135M-Instruct, trained once through every weight and once
# through rank-RANK adapters on every linear layer, at each thread count. Prints the update time
# per step (the median of the steps after the first), tokens/s, the process's peak RSS and the
# ratios.
#
#   bench/lora.sh   (env: MODEL=models/smollm2-135m-instruct THREADS="1 2" STEPS=3 RANK=16
#                    OUT=bench/out/lora BIN=<rlreplay>)
# The model comes from scripts/install-smollm2.sh. BIN defaults to the release build
# (`cargo build --release --bin rlreplay`, made here when BIN is not given).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/smollm2-135m-instruct}
OUT=${OUT:-bench/out/lora}
THREADS=${THREADS:-1 2}
STEPS=${STEPS:-3}
RANK=${RANK:-16}
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
printf '%-5s %-7s %12s %10s %12s\n' mode threads update_s tok_s peak_rss_mb
for t in $THREADS; do
    for mode in full lora; do
        lora=""
        if [ "$mode" = lora ]; then
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
adv_estimator = "grpo"
loss_mode = "ppo"
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
        /usr/bin/time -f '%M' -o "$OUT/rss-$mode-$t" \
            "$BIN" replay --config "$OUT/$mode-$t.toml" --out "$run" --quiet >/dev/null
        python3 - "$run/metrics.jsonl" "$OUT/rss-$mode-$t" "$mode" "$t" <<'PY' | tee -a "$OUT/results.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
later = rows[1:] or rows
upd = statistics.median(r["timing_s/update"] for r in later)
tok = statistics.median(r["perf/total_num_tokens"] / r["timing_s/update"] for r in later)
rss = int(open(sys.argv[2]).read().split()[-1]) / 1024
print(f"{sys.argv[3]:<5} {sys.argv[4]:<7} {upd:12.2f} {tok:10.1f} {rss:12.0f}")
PY
    done
done
python3 - "$OUT/results.txt" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
by = {(r[0], r[1]): (float(r[2]), float(r[4])) for r in rows}
for t in sorted({r[1] for r in rows}):
    (fu, fm), (lu, lm) = by[("full", t)], by[("lora", t)]
    print(f"threads {t}: LoRA update {fu / lu:.2f}x faster, peak RSS {lm / fm:.2f}x of full")
PY
