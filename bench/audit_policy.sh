#!/usr/bin/env bash
# `rlreplay audit --policy` against `rlreplay logprobs` on the same rows: response tokens/s of both
# (each run end to end: model load, reading, forward passes, statistics or JSON output) and their
# CPU seconds (user + system), on the tiny and the small model configs, interleaved, with the
# load average; then the peak RSS of `audit --policy` over 1, 5 and 10 steps (flat in the number
# of steps when memory holds one step at a time).
#
#   bench/audit_policy.sh   (env: THREADS=2 ROUNDS=3 CONFIGS="tiny small" OUT=bench/out/audit_policy)
# Needs .venv/audit (pyarrow) to write the logprobs input: scripts/setup-venv.sh audit pyarrow.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out/audit_policy}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
CONFIGS=${CONFIGS:-tiny small}
export RAYON_NUM_THREADS=$THREADS
cargo build --release --quiet -p rlreplay-cli
BIN=target/release/rlreplay
rm -rf "$OUT"
mkdir -p "$OUT"

# A policy of each config: a replay of one step at learning rate 0 saves the random initial weights
# in the Hugging Face layout. Shapes as in bench/model.sh.
policy() { # NAME VOCAB HIDDEN INTERMEDIATE HEADS KV HEAD_DIM
  local dir="$OUT/$1"
  cat >"$dir.toml" <<TOML
[model.random]
vocab_size = $2
hidden_size = $3
intermediate_size = $4
num_hidden_layers = 2
num_attention_heads = $5
num_key_value_heads = $6
head_dim = $7
max_position_embeddings = 4096
[data]
path = "$OUT/data-$1"
eos_token_id = 1
steps = "1..1"
[algorithm]
adv_estimator = "grpo"
loss_mode = "reinforce"
[optim]
lr = 0.0
[trainer]
save_freq = 1
threads = $THREADS
TOML
  "$BIN" replay --config "$dir.toml" --out "$dir-run" --quiet >/dev/null
  echo "$dir-run/checkpoints/global_step_1"
}

# Rows of every step as `rlreplay logprobs` input; prints the number of response tokens.
jsonl() { # DATASET OUT
  .venv/audit/bin/python - "$1" "$2" <<'PY'
import glob, json, sys
import pyarrow.parquet as pq
n = 0
with open(sys.argv[2], "w") as f:
    for path in sorted(glob.glob(f"{sys.argv[1]}/data/step-*.parquet")):
        t = pq.read_table(path, columns=["prompt_token_ids", "response_token_ids"]).to_pydict()
        for p, r in zip(t["prompt_token_ids"], t["response_token_ids"]):
            f.write(json.dumps({"prompt_token_ids": p, "response_token_ids": r}) + "\n")
            n += len(r)
print(n)
PY
}

times() { # COMMAND... : "wall cpu" seconds (cpu = user + system, all threads)
  /usr/bin/time -o "$OUT/time.txt" -f '%e %U %S' "$@" >/dev/null 2>&1
  awk '{ printf "%.3f %.3f\n", $1, $2 + $3 }' "$OUT/time.txt"
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for spec in "tiny 10 16 8 192" "small 3 8 4 128"; do
  read -r cfg steps prompts group len <<<"$spec"
  [[ " $CONFIGS " == *" $cfg "* ]] || continue
  "$BIN" synth --out "$OUT/data-$cfg" --steps "$steps" --prompts "$prompts" --group "$group" \
    --vocab 512 --mean-len "$len" --max-len 512 --prompt-len 64 --eos 1 --seed 0 >/dev/null
  if [ "$cfg" = tiny ]; then
    model=$(policy tiny 512 128 384 4 2 32)
  else
    model=$(policy small 151936 256 768 4 2 64)
  fi
  tokens=$(jsonl "$OUT/data-$cfg" "$OUT/rows-$cfg.jsonl")
  for round in $(seq "$ROUNDS"); do
    read -r lw lc < <(times "$BIN" logprobs --model "$model" --input "$OUT/rows-$cfg.jsonl" \
      --output "$OUT/lp.jsonl")
    read -r aw ac < <(times "$BIN" audit "$OUT/data-$cfg" --policy "$model" --eos 1 \
      --threads "$THREADS" --json)
    awk -v c="$cfg" -v r="$round" -v n="$tokens" -v lw="$lw" -v lc="$lc" -v aw="$aw" -v ac="$ac" \
      -v load="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN {
      printf "config=%s round=%d response_tokens=%d logprobs=%.3fs (%.0f tok/s, cpu %.2fs) audit_policy=%.3fs (%.0f tok/s, cpu %.2fs) audit/logprobs time=%.3f cpu=%.3f load1=%s\n",
        c, r, n, lw, n / lw, lc, aw, n / aw, ac, aw / lw, ac / lc, load }' | tee -a "$OUT/rounds.txt"
  done
done
awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^(config|time|cpu)=/) { split($i, kv, "="); v[kv[1]] = kv[2] }
       t[v["config"]] = t[v["config"]] " " v["time"]; u[v["config"]] = u[v["config"]] " " v["cpu"] }
     END { for (c in t) print "config=" c " audit/logprobs time ratios:" t[c] "; cpu ratios:" u[c] }' \
  "$OUT/rounds.txt"

# Peak memory of audit --policy over 1, 5 and 10 steps of the tiny config.
[[ " $CONFIGS " == *" tiny "* ]] || exit 0
for range in 1..1 1..5 1..10; do
  rss=$( { /usr/bin/time -v "$BIN" audit "$OUT/data-tiny" --policy "$OUT/tiny-run/checkpoints/global_step_1" \
    --eos 1 --threads "$THREADS" --steps "$range" --json >/dev/null; } 2>&1 | sed -n 's/.*Maximum resident set size (kbytes): //p')
  echo "peak_rss steps=$range kib=$rss"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
