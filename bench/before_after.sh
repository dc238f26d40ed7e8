#!/usr/bin/env bash
# Before/after: two builds of rlreplay (A = before, B = after) against the same PyTorch anchors,
# interleaved per round so that all three sides see the same machine load:
#   - model: forward+backward of bench/model.sh's tiny and small configs (`model_bench CFG` against
#     bench/model_torch.py CFG THREADS), per thread count;
#   - generate: bench/generate.sh's workload (`generate_bench DIR 16 32 128` against
#     bench/generate_hf.py on the same saved model), per thread count;
#   - replay: bench/replay.sh's workload (`rlreplay replay` on synthetic rows against
#     bench/replay_torch.py), at the first thread count.
# Each round prints the three figures, both ratios (model: PyTorch ms / rlreplay ms; generate and
# replay: rlreplay tokens/s / PyTorch tokens/s; above 1 means rlreplay is faster) and the CPU time
# (user + system) of each process; the medians of every series come at the end.
#
# Usage:
#   bench/before_after.sh DIR_A DIR_B          directories holding the executables that WHAT
#                                              needs: model_bench (the rlreplay-model `model`
#                                              bench), generate_bench (the sampling example),
#                                              rlreplay
#   bench/before_after.sh --build REV_A REV_B  builds both revisions first (release profile, into
#                                              OUT/bin-A and OUT/bin-B; the target directory is
#                                              $CARGO_TARGET_DIR, else this tree's target/)
# Env: ROUNDS=3 THREADS="2 1" WHAT="model generate replay" CONFIGS="tiny small" STEPS=2
#      OUT=bench/out/before_after
# Needs .venv/torch (torch, transformers) and .venv/arrow (pyarrow): scripts/setup-venv.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2 1}
WHAT=${WHAT:-model generate replay}
CONFIGS=${CONFIGS:-tiny small}
STEPS=${STEPS:-2}
OUT=${OUT:-bench/out/before_after}
PY=$root/.venv/torch/bin/python
ARROW=$root/.venv/arrow/bin/python
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

build() { # REV DEST: build the three executables of revision REV into DEST
  local rev=$1 dest=$2 src="$OUT/src" exe crate
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
  rm -rf "$src" "$dest"
  git worktree prune
  git worktree add --detach "$src" "$rev" >/dev/null
  mkdir -p "$dest"
  (
    cd "$src"
    exe=$(cargo bench -p rlreplay-model --bench model --no-run --message-format=json \
      | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
    cp "$exe" "$dest/model_bench"
    cargo build --release -p rlreplay-cli
    cp "$CARGO_TARGET_DIR/release/rlreplay" "$dest/rlreplay"
    # The sampling example lives in rlreplay-sampling (earlier: rlreplay-eval).
    crate=$(basename "$(dirname "$(dirname "$(ls crates/*/examples/generate_bench.rs | head -1)")")")
    cargo build --release -p "$crate" --example generate_bench
    cp "$CARGO_TARGET_DIR/release/examples/generate_bench" "$dest/generate_bench"
  )
  git worktree remove --force "$src"
}

if [ "${1:-}" = "--build" ]; then
  [ $# -eq 3 ] || { echo "usage: $0 --build REV_A REV_B" >&2; exit 2; }
  build "$2" "$OUT/bin-A"
  build "$3" "$OUT/bin-B"
  set -- "$OUT/bin-A" "$OUT/bin-B"
fi
[ $# -eq 2 ] || { sed -n '2,24p' "$0" >&2; exit 2; }
declare -A DIR=([A]=$(cd "$1" && pwd) [B]=$(cd "$2" && pwd))
declare -A NEEDS=([model]=model_bench [generate]=generate_bench [replay]=rlreplay)
for s in A B; do
  for w in $WHAT; do
    exe=${NEEDS[$w]:?"WHAT takes model, generate and replay, got $w"}
    [ -x "${DIR[$s]}/$exe" ] || { echo "missing ${DIR[$s]}/$exe" >&2; exit 1; }
  done
done
for p in "$PY" "$ARROW"; do
  [ -x "$p" ] || { echo "missing $p (scripts/setup-venv.sh)" >&2; exit 1; }
done

RES=$OUT/results.tsv # kind, case, round, side, figure, cpu seconds
: >"$RES"
TIMEF=$OUT/time.txt
timed() { # run a command under GNU time; prints its stdout, leaves "user sys" in $TIMEF
  /usr/bin/time -f '%U %S' -o "$TIMEF" "$@"
}
cpu() { awk '{ printf "%.2f", $1 + $2 }' "$TIMEF"; }
field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p"; }
json() { python3 -c "import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
order() { # the three sides, rotated by round
  case $(($1 % 3)) in 1) echo A B T ;; 2) echo B T A ;; 0) echo T A B ;; esac
}
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$RES"; }
report() { # kind case round: one line from the round's three records
  python3 - "$RES" "$1" "$2" "$3" <<'PY'
import sys
res, kind, case, rnd = sys.argv[1:]
rows = {r[3]: r for r in (l.rstrip("\n").split("\t") for l in open(res))
        if r[:3] == [kind, case, rnd]}
a, b, t = (float(rows[s][4]) for s in "ABT")
cpu = {s: rows[s][5] for s in "ABT"}
if kind == "model":  # times in ms: PyTorch / rlreplay
    ra, rb, unit = t / a, t / b, "ms"
else:  # tokens/s: rlreplay / PyTorch
    ra, rb, unit = a / t, b / t, "tokens/s"
print(f"{kind} {case} round={rnd} A={a:.1f} B={b:.1f} torch={t:.1f} {unit} "
      f"ratio_A={ra:.2f} ratio_B={rb:.2f} cpu_s A={cpu['A']} B={cpu['B']} torch={cpu['T']}")
PY
}

first_threads=${THREADS%% *}
echo "A=${DIR[A]} B=${DIR[B]} rounds=$ROUNDS threads=$THREADS what=$WHAT"
echo "torch $("$PY" -c 'import torch, transformers; print(torch.__version__, "transformers", transformers.__version__)')"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

# Replay inputs: each build synthesises its own copy of the same rows; PyTorch reads B's.
if [[ " $WHAT " == *" replay "* ]]; then
  R=$OUT/replay
  rm -rf "$R"
  mkdir -p "$R"
  for s in A B; do
    "${DIR[$s]}/rlreplay" synth --out "$R/$s-dataset" --steps "$STEPS" --prompts 16 --group 8 \
      --vocab 4096 --mean-len 192 --max-len 512 --prompt-len 64 --eos 1 --pattern-len 4 --seed 0 \
      >/dev/null
  done
  cat >"$R/shape.json" <<'JSON'
{"vocab_size": 4096, "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
 "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32, "tie_word_embeddings": true}
JSON
  for s in A B; do
    cat >"$R/$s.toml" <<TOML
[model.random]
vocab_size = 4096
hidden_size = 256
intermediate_size = 768
num_hidden_layers = 4
num_attention_heads = 8
num_key_value_heads = 4
head_dim = 32
[data]
path = "$R/$s-dataset"
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
threads = $first_threads
TOML
  done
  "$ARROW" bench/rows_jsonl.py "$R/B-dataset" "$R/rows.jsonl"
fi

for round in $(seq "$ROUNDS"); do
  echo "--- round $round (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  if [[ " $WHAT " == *" model "* ]]; then
    for cfg in $CONFIGS; do
      for t in $THREADS; do
        case_="$cfg/threads=$t"
        for s in $(order "$round"); do
          if [ "$s" = T ]; then
            line=$(OMP_NUM_THREADS=$t timed "$PY" bench/model_torch.py "$cfg" "$t")
          else
            line=$(RAYON_NUM_THREADS=$t OMP_NUM_THREADS=$t timed "${DIR[$s]}/model_bench" "$cfg")
          fi
          record model "$case_" "$round" "$s" "$(echo "$line" | field fwd_bwd_ms)" "$(cpu)"
        done
        report model "$case_" "$round"
      done
    done
  fi
  if [[ " $WHAT " == *" generate "* ]]; then
    for t in $THREADS; do
      case_="16x32+128/threads=$t"
      for s in $(order "$round"); do
        if [ "$s" = T ]; then
          # B's saved model (written on B's turn, or on an earlier round).
          [ -d "$OUT/gen-B" ] || RAYON_NUM_THREADS=$t "${DIR[B]}/generate_bench" "$OUT/gen-B" 1 1 1 >/dev/null
          line=$(timed "$PY" bench/generate_hf.py "$OUT/gen-B" 16 32 128 "$t")
        else
          line=$(RAYON_NUM_THREADS=$t timed "${DIR[$s]}/generate_bench" "$OUT/gen-$s" 16 32 128)
        fi
        record generate "$case_" "$round" "$s" "$(json "$line" tokens_per_s)" "$(cpu)"
      done
      report generate "$case_" "$round"
    done
  fi
  if [[ " $WHAT " == *" replay "* ]]; then
    case_="steps=$STEPS/threads=$first_threads"
    for s in $(order "$round"); do
      if [ "$s" = T ]; then
        timed "$PY" bench/replay_torch.py --data "$R/rows.jsonl" --model "$R/shape.json" \
          --threads "$first_threads" --max-tokens 4096 >"$R/torch.json"
        tps=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['tokens_per_s'])" "$R/torch.json")
      else
        rm -rf "$R/$s-run"
        timed "${DIR[$s]}/rlreplay" replay --config "$R/$s.toml" --out "$R/$s-run" --quiet >/dev/null
        # As bench/replay.sh: tokens over the summed step times (not the model set-up or checkpoint).
        tps=$(python3 - "$R/$s-run/metrics.jsonl" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
print(sum(s["perf/total_num_tokens"] for s in steps) / sum(s["perf/time_per_step"] for s in steps))
PY
)
      fi
      record replay "$case_" "$round" "$s" "$tps" "$(cpu)"
    done
    report replay "$case_" "$round"
  fi
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

echo "--- medians over $ROUNDS rounds (ratio: above 1 means rlreplay is faster than PyTorch)"
python3 - "$RES" <<'PY'
import statistics, sys
from collections import defaultdict
series = defaultdict(lambda: defaultdict(list))
for l in open(sys.argv[1]):
    kind, case, rnd, side, fig, cpu = l.rstrip("\n").split("\t")
    series[(kind, case)][rnd].append((side, float(fig), float(cpu)))
for (kind, case), rounds in series.items():
    fig = {s: [] for s in "ABT"}
    cpu = {s: [] for s in "ABT"}
    ratio = {"A": [], "B": []}
    for rows in rounds.values():
        d = {s: (f, c) for s, f, c in rows}
        for s in "ABT":
            fig[s].append(d[s][0])
            cpu[s].append(d[s][1])
        for s in "AB":
            ratio[s].append(d["T"][0] / d[s][0] if kind == "model" else d[s][0] / d["T"][0])
    m = {s: statistics.median(v) for s, v in fig.items()}
    unit = "ms" if kind == "model" else "tokens/s"
    print(f"{kind} {case}: A {m['A']:.1f} B {m['B']:.1f} torch {m['T']:.1f} {unit}; "
          f"ratio A {statistics.median(ratio['A']):.2f}x B {statistics.median(ratio['B']):.2f}x "
          f"(per round A {', '.join(f'{r:.2f}' for r in ratio['A'])}; "
          f"B {', '.join(f'{r:.2f}' for r in ratio['B'])}); "
          f"cpu_s A {statistics.median(cpu['A']):.2f} B {statistics.median(cpu['B']):.2f} "
          f"torch {statistics.median(cpu['T']):.2f}")
PY
