#!/usr/bin/env bash
# The off-policy study: one run's logged rollouts replayed onto the same initial policy under a
# grid of schedules crossed with importance corrections, each cell scored on held-out prompts
# and audited against the behaviour policy. Writes OUT/results.csv, OUT/results.md and the
# plots OUT/accuracy.png (held-out accuracy per cell) and OUT/staleness.png (accuracy against
# lag).
#
#   bench/study.sh RUN_DIR [OUT]            an online run (`rlreplay train`): its configuration,
#                                           rollouts and initial policy (`replay --from-run`)
#   CONFIG=replay.toml DATA=PATH|hf://datasets/OWNER/NAME POLICY=DIR VAL=val.parquet \
#     bench/study.sh - [OUT]                any dataset in the published layout and a policy
#
# Environment:
#   SCHEDULES    cells' schedules, space-separated names (default: all of
#                exact lag1 lag4 lag16 shuffle sub25 sub50 n50 epochs2 mixed)
#   CORRECTIONS  none token_tis seq_mis (default: all three)
#   CELLS        SCHEDULE/CORRECTION pairs, space-separated, instead of the full
#                SCHEDULES x CORRECTIONS grid (for example "lag4/none lag4/token_tis mixed/none")
#   REFS         other online runs of the same configuration with other seeds
#                ([trainer] seed): their final policies are scored as `online` rows beside the
#                run's own, so the table shows the spread that comes from the seed alone
#   VAL          held-out set for `rlreplay eval` (default: the run's [data] val_files);
#                unset and no val_files: no accuracy columns
#   EVAL_N       samples per held-out prompt for mean@k / pass@k (default: the run's val_n, else 4)
#   EVAL_ARGS    other `rlreplay eval` options (default: the run's validation sampling,
#                `--temperature` val_temperature, `--top-p` val_top_p, `--max-new-tokens`
#                max_response_length)
#   GROUP        rollouts per group in the dataset, for the n50 cell (default: read from the
#                first shard)
#   BIN          the rlreplay binary (default: target/release/rlreplay, built if missing)
#   SET          extra `--set` overrides for every cell, space-separated KEY=VALUE (default:
#                no validation inside the replays, `validation.test_freq=0`: each cell's final
#                policy is scored by `rlreplay eval` instead; one checkpoint, the last)
#   KEEP_OPTIMIZER  1: keep each cell's optimizer state (by default it is removed once the cell
#                is scored: the study needs only the final weights)
#   AUDIT_STEPS  the logged steps `audit --policy` compares the final policy with (default: the
#                last one, the freshest behaviour; `..` for all, at the cost of a forward pass
#                over every logged row per cell)
#   FRESH        1: run every cell again; by default a cell that finished in OUT before (its
#                row.csv is there) is kept, so an interrupted study, or one given more cells or
#                REFS later, runs only what is missing
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:?usage: bench/study.sh RUN_DIR|- [OUT]}
OUT=${2:-bench/out/study}
BIN=${BIN:-target/release/rlreplay}
if [ ! -x "$BIN" ]; then
  cargo build --release --locked -p rlreplay-cli
fi
SCHEDULES=${SCHEDULES:-"exact lag1 lag4 lag16 shuffle sub25 sub50 n50 epochs2 mixed"}
CORRECTIONS=${CORRECTIONS:-"none token_tis seq_mis"}
SET=${SET:-"validation.test_freq=0 validation.val_before_train=false trainer.save_freq=0 trainer.keep=1"}
mkdir -p "$OUT"

# The replay of one cell: the source of the rows and of the configuration.
if [ "$RUN" = "-" ]; then
  : "${CONFIG:?CONFIG=replay.toml is needed without a run directory}"
  : "${DATA:?DATA=dataset is needed without a run directory}"
  : "${POLICY:?POLICY=model directory is needed without a run directory}"
  source_args=(--config "$CONFIG" --set "data.path=\"$DATA\"" --set "model.path=\"$POLICY\"")
  rows="$DATA"
  resolved="$CONFIG"
else
  source_args=(--from-run "$RUN")
  rows="$RUN/rollouts"
  resolved="$RUN/config.toml"
fi
# A key of the run's configuration (`section.key`), empty when absent.
config_value() {
  python3 - "$resolved" "$1" <<'PY'
import sys, tomllib
doc = tomllib.load(open(sys.argv[1], "rb"))
for part in sys.argv[2].split("."):
    doc = doc.get(part, {}) if isinstance(doc, dict) else {}
print("" if doc == {} else doc)
PY
}
VAL=${VAL:-$(config_value data.val_files)}
EVAL_N=${EVAL_N:-$(config_value validation.val_n)}
EVAL_N=${EVAL_N:-4}
# The run's own validation sampling, so that the `online` rows equal its validation metrics.
if [ -z "${EVAL_ARGS+set}" ]; then
  EVAL_ARGS=""
  for kv in temperature=validation.val_temperature top-p=validation.val_top_p \
    max-new-tokens=rollout.max_response_length; do
    v=$(config_value "${kv#*=}")
    [ -n "$v" ] && EVAL_ARGS+=" --${kv%%=*} $v"
  done
fi
if [ -z "${GROUP:-}" ]; then
  first=$(ls "$rows"/data/*.parquet 2>/dev/null | head -1 || true)
  GROUP=$("$BIN" audit "${first:-$rows}" --json --eos 0 2>/dev/null | tail -1 |
    python3 -c 'import json,sys; print(round(json.load(sys.stdin)["group_size"]))' || echo 0)
fi

if [ -z "${AUDIT_STEPS:-}" ]; then
  AUDIT_STEPS=$("$BIN" audit "$rows" --json --eos 0 2>/dev/null | grep -v summary | tail -1 |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])')
fi

schedule_sets() { # NAME: the --set overrides of a schedule
  case $1 in
    exact) ;;
    lag*) echo "schedule.mode=\"lag\" schedule.lag=${1#lag}" ;;
    shuffle) echo "schedule.mode=\"shuffle\"" ;;
    sub25) echo "schedule.group_fraction=0.25" ;;
    sub50) echo "schedule.group_fraction=0.5" ;;
    n50) echo "schedule.subsample=$((GROUP / 2 > 1 ? GROUP / 2 : 2))" ;;
    epochs2) echo "schedule.epochs=2 trainer.total_training_steps=1000000" ;;
    mixed) echo "schedule.drop_solve_none=true schedule.drop_solve_all=true" ;;
    *) echo "unknown schedule $1" >&2; exit 2 ;;
  esac
}
correction_sets() { # NAME: the --set overrides of a correction
  case $1 in
    none) ;;
    token_tis) echo "algorithm.rollout_is=\"token\" algorithm.rollout_is_threshold=2.0 algorithm.rollout_is_mode=\"truncate\"" ;;
    seq_mis) echo "algorithm.rollout_is=\"sequence\" algorithm.rollout_is_threshold=2.0 algorithm.rollout_is_mode=\"mask\"" ;;
    *) echo "unknown correction $1" >&2; exit 2 ;;
  esac
}

header="schedule,correction,seed,steps,mean_at_k,pass_at_k,kl_k3,ess_seq,clipfrac,wall_s"
cells=()
cell() { # SCHEDULE CORRECTION SEED [ONLINE_RUN]: a replay cell, or an online run's own policy
  local name="$1-$2-s$3" dir="$OUT/$1-$2-s$3" sets=() t0 t1
  cells+=("$dir")
  if [ "${FRESH:-0}" != 1 ] && [ -s "$dir/row.csv" ]; then
    echo "$name: kept from an earlier study" >&2
    return
  fi
  t0=$(date +%s.%N)
  if [ "${FRESH:-0}" != 1 ] && [ -s "$dir/replay.s" ]; then
    # The replay finished before: only its scoring is missing.
    t0=$(echo "$t0 - $(cat "$dir/replay.s")" | bc)
    rm -rf "$dir/eval" "$dir/audit.json"
  elif [ -n "${4:-}" ]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    ln -s "$(realpath "$4")" "$dir/run"
  else
    rm -rf "$dir"
    mkdir -p "$dir"
    for kv in $(schedule_sets "$1") $(correction_sets "$2") "schedule.seed=$3" ${SET:-}; do
      sets+=(--set "$kv")
    done
    if ! "$BIN" replay "${source_args[@]}" --out "$dir/run" "${sets[@]}" --quiet >"$dir.log" 2>&1; then
      echo "$name: replay failed (see $dir.log)" >&2
      echo "$1,$2,$3,0,,,,,," >"$dir/failed.csv"
      return
    fi
    echo "$(date +%s.%N) - $t0" | bc >"$dir/replay.s"
  fi
  local policy="$dir/run/checkpoints/last"
  if [ -n "$VAL" ]; then
    # shellcheck disable=SC2086
    "$BIN" eval --model "$policy" --data "$VAL" --n "$EVAL_N" $EVAL_ARGS --out "$dir/eval" \
      >>"$dir.log" 2>&1
  fi
  "$BIN" audit "$rows" --steps "$AUDIT_STEPS" --policy "$policy" --json 2>>"$dir.log" |
    tail -1 >"$dir/audit.json"
  t1=$(date +%s.%N)
  python3 - "$dir" "$1" "$2" "$3" "$t0" "$t1" "$EVAL_N" >"$dir/row.csv.part" <<'PY'
import json, os, sys
d, sched, corr, seed, t0, t1, k = sys.argv[1:]
metrics = [json.loads(l) for l in open(os.path.join(d, "run", "metrics.jsonl"))]
audit = json.load(open(os.path.join(d, "audit.json")))
ev = {}
p = os.path.join(d, "eval", "metrics.json")
if os.path.exists(p):
    # The metrics of all prompts together.
    ev = next(g for g in json.load(open(p))["groups"] if g["data_source"] == "all")
def find(m, *names):
    for n in names:
        for key, v in m.items():
            if key.endswith(n):
                return v
    return ""
clip = [m["actor/pg_clipfrac"] for m in metrics if "actor/pg_clipfrac" in m]
row = [sched, corr, seed, len(metrics),
       find(ev, f"mean@{k}"), find(ev, f"pass@{k}"),
       audit.get("audit/kl/k3", ""), audit.get("audit/ess/seq/batch", ""),
       sum(clip) / len(clip) if clip else "", round(float(t1) - float(t0), 1)]
print(",".join(str(x) for x in row))
PY
  mv "$dir/row.csv.part" "$dir/row.csv"
  if [ -z "${4:-}" ] && [ "${KEEP_OPTIMIZER:-0}" != 1 ]; then
    rm -f "$dir"/run/checkpoints/*/optimizer.safetensors
  fi
  echo "$name: done" >&2
}

if [ "$RUN" != "-" ]; then
  i=0
  for r in "$RUN" ${REFS:-}; do
    cell online none "$i" "$r"
    i=$((i + 1))
  done
fi
if [ -z "${CELLS:-}" ]; then
  for s in $SCHEDULES; do
    for c in $CORRECTIONS; do
      CELLS+=" $s/$c"
    done
  done
fi
for sc in $CELLS; do
  cell "${sc%%/*}" "${sc#*/}" 0
done
{
  echo "$header"
  for d in "${cells[@]}"; do
    cat "$d/row.csv" 2>/dev/null || cat "$d/failed.csv"
  done
} >"$OUT/results.csv"

PY=python3
if ! "$PY" -c 'import matplotlib' 2>/dev/null; then
  PY=$(scripts/setup-venv.sh plot matplotlib)/bin/python
fi
"$PY" - "$OUT" <<'PY'
import csv, os, statistics, sys
out = sys.argv[1]
rows = list(csv.DictReader(open(os.path.join(out, "results.csv"))))
num = lambda x: float(x) if x not in ("", None) else None
ref = [num(r["mean_at_k"]) for r in rows if r["schedule"] == "online"]
ref = [x for x in ref if x is not None]
with open(os.path.join(out, "results.md"), "w") as f:
    if ref:
        spread = f"{min(ref):.4f}–{max(ref):.4f}" if len(ref) > 1 else f"{ref[0]:.4f}"
        f.write(f"Online reference ({len(ref)} seed(s)): mean@k {spread}; differences within "
                "that spread are noise\n\n")
    f.write("| schedule | correction | seed | steps | mean@k | pass@k | KL (k3) | ESS (seq) | clip frac | wall (s) |\n")
    f.write("|---|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        cells = [r["schedule"], r["correction"], r["seed"], r["steps"]]
        for key in ("mean_at_k", "pass_at_k", "kl_k3", "ess_seq", "clipfrac"):
            v = num(r[key])
            cells.append("" if v is None else f"{v:.4g}")
        cells.append(r["wall_s"])
        f.write("| " + " | ".join(cells) + " |\n")
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
scored = [r for r in rows if num(r["mean_at_k"]) is not None]
if scored:
    fig, ax = plt.subplots(figsize=(max(6, len(scored) * 0.35), 4))
    ax.bar(range(len(scored)), [num(r["mean_at_k"]) for r in scored])
    labels = [f'online/seed {r["seed"]}' if r["schedule"] == "online"
              else f'{r["schedule"]}/{r["correction"]}' for r in scored]
    ax.set_xticks(range(len(scored)), labels, rotation=70, fontsize=7)
    if ref:
        ax.axhspan(min(ref), max(ref), color="grey", alpha=0.3, label="online runs")
        ax.legend()
    ax.set_ylabel("held-out mean@k")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "accuracy.png"), dpi=120)
    fig, ax = plt.subplots(figsize=(5, 4))
    for corr in sorted({r["correction"] for r in scored if r["schedule"] != "online"}):
        by_k = {}
        for r in scored:
            if r["correction"] == corr and (r["schedule"] == "exact" or r["schedule"].startswith("lag")):
                k = 0 if r["schedule"] == "exact" else int(r["schedule"][3:])
                by_k.setdefault(k, []).append(num(r["mean_at_k"]))
        if 0 not in by_k and corr == "none" and ref:
            # The exact replay without correction is the online run bit for bit.
            by_k[0] = [num(rows[0]["mean_at_k"])] if rows[0]["schedule"] == "online" else []
            by_k = {k: v for k, v in by_k.items() if v}
        pts = sorted((k, statistics.mean(v)) for k, v in by_k.items())
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=corr)
    if ref:
        ax.axhspan(min(ref), max(ref), color="grey", alpha=0.3, label="online runs")
    ax.set_xlabel("staleness k (trainer steps)")
    ax.set_ylabel("held-out mean@k")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "staleness.png"), dpi=120)
print(open(os.path.join(out, "results.md")).read())
PY
