#!/usr/bin/env bash
# Generation on inference servers.
#
# 1. `rlreplay serve` tokens/s under 1, 8 and 32 concurrent requests against the in-process
#    engine decoding the same prompts as one batch (serve_bench: random Qwen3, 4 layers, hidden
#    256, vocab 8192; 32-token prompts, 128 new tokens each, temperature 1, top-p 0.95), the two
#    paths alternating ROUNDS times per concurrency; medians and the ratio serve / engine.
#    With MODEL=DIR in the environment, on that model directory instead (for example
#    models/smollm2-135m-instruct).
# 2. Wall time per RL step of the toy preset (configs/toy-arith.toml) with generation local, on
#    SERVERS `rlreplay serve` processes synchronously, and on them with
#    `rollout.max_off_policy_steps = 1`; the three runs alternate ROUNDS times. A step's time is
#    its `perf/time_per_step` (rollouts, rewards, update) plus the weight sync to the servers done
#    after it (`timing_s/weight_sync`); median over steps 2..STEPS (step 1 includes the first
#    sync), then median over rounds.
#
#   bench/serve.sh     (env: THREADS=2 ROUNDS=3 STEPS=10 SERVERS=1 OUT=bench/out/serve)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out/serve}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-10}
SERVERS=${SERVERS:-1}
export RAYON_NUM_THREADS=$THREADS
cargo build --release --quiet -p rlreplay-cli
cargo build --release --quiet -p rlreplay-serve --example serve_bench
BIN=target/release/rlreplay
rm -rf "$OUT"
mkdir -p "$OUT"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

# 1. serve against the engine.
target/release/examples/serve_bench 32 128 2 "$ROUNDS" 1 8 32 | tee "$OUT/serve_bench.jsonl"
python3 - "$OUT/serve_bench.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
for c in sorted({r["concurrency"] for r in runs}):
    med = {p: statistics.median(r["tokens_per_s"] for r in runs
                                if r["concurrency"] == c and r["path"] == p)
           for p in ("engine", "serve")}
    print(f"concurrency={c:<3} engine {med['engine']:8.1f} tok/s  serve {med['serve']:8.1f} tok/s"
          f"  serve/engine {med['serve'] / med['engine']:.2f}")
PY
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"

# 2. RL steps of the toy preset.
COMMON=(--config configs/toy-arith.toml
  --set "trainer.total_training_steps=$STEPS" --set trainer.save_freq=0
  --set validation.test_freq=0 --set validation.val_before_train=false
  --set "trainer.threads=$THREADS")
# The servers start from any model of the toy architecture (the trainer sends its weights first).
"$BIN" train "${COMMON[@]}" --set trainer.total_training_steps=1 --set trainer.save_freq=1 \
  --set toy.warmup_steps=1 --out "$OUT/seed" >/dev/null 2>"$OUT/seed.log"
pids=()
urls=()
for i in $(seq "$SERVERS"); do
  "$BIN" serve --model "$OUT/seed/checkpoints/global_step_1" --port 0 2>"$OUT/serve-$i.log" &
  pids+=($!)
  for _ in $(seq 600); do
    url=$(grep -o 'http://[0-9.:]*' "$OUT/serve-$i.log" | head -1 || true)
    [ -n "$url" ] && break
    sleep 0.1
  done
  [ -n "$url" ] || { echo "serve $i did not start" >&2; exit 1; }
  urls+=("\"$url\"")
done
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
endpoints=$(IFS=,; echo "[${urls[*]}]")
REMOTE=(--set 'rollout.backend="remote"' --set "rollout.endpoints=$endpoints")
for round in $(seq "$ROUNDS"); do
  for mode in local remote_sync remote_k1; do
    case $mode in
      local) extra=() ;;
      remote_sync) extra=("${REMOTE[@]}") ;;
      remote_k1) extra=("${REMOTE[@]}" --set rollout.max_off_policy_steps=1) ;;
    esac
    run="$OUT/$mode-$round"
    t0=$(date +%s.%N)
    "$BIN" train "${COMMON[@]}" "${extra[@]}" --out "$run" >/dev/null 2>"$run.log" ||
      { cat "$run.log" >&2; exit 1; }
    t1=$(date +%s.%N)
    python3 - "$run/metrics.jsonl" "$mode" "$round" "$t0" "$t1" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, statistics, sys
path, mode, rnd, t0, t1, load = sys.argv[1:]
steps = [json.loads(l) for l in open(path)]
per = [s["perf/time_per_step"] + s.get("timing_s/weight_sync", 0.0) for s in steps[1:]]
gen = [s.get("timing_s/gen", 0.0) for s in steps[1:]]
upd = [s.get("timing_s/update", 0.0) for s in steps[1:]]
ov = [s["timing_s/gen_overlap"] for s in steps[1:] if "timing_s/gen_overlap" in s]
print(json.dumps({"mode": mode, "round": int(rnd), "steps": len(steps),
                  "step_s_median": statistics.median(per), "gen_s_median": statistics.median(gen),
                  "update_s_median": statistics.median(upd),
                  "overlap_median": statistics.median(ov) if ov else None,
                  "process_wall_s": float(t1) - float(t0), "load1": float(load)}))
PY
  done
done | tee "$OUT/steps.jsonl"
python3 - "$OUT/steps.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
local = None
for mode in ("local", "remote_sync", "remote_k1"):
    m = statistics.median(r["step_s_median"] for r in runs if r["mode"] == mode)
    local = local or m
    print(f"{mode:<12} {m * 1000:8.1f} ms/step  ({m / local:.2f}x local)")
PY
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
