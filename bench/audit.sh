#!/usr/bin/env bash
# Audit throughput: `rlreplay audit --json` against the equivalent pyarrow + numpy script
# (bench/audit_pyarrow.py) on synthetic shards of the published run's size (4096 rows, mean
# response ~1400 tokens, ~1.8% truncated at 4096). Prints rows/s of both (best of REPEAT alternating
# runs) and the ratio, then the peak RSS of rlreplay over 10 shards against one shard's decoded
# size.
#
#   bench/audit.sh            (env: SHARDS=3 REPEAT=3 OUT=bench/out/audit)
# Needs .venv/arrow (pyarrow, numpy): scripts/setup-venv.sh arrow pyarrow numpy
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out/audit}
SHARDS=${SHARDS:-3}
REPEAT=${REPEAT:-3}
PY=.venv/arrow/bin/python
cargo build --release --quiet -p rlreplay-cli
BIN=target/release/rlreplay
if [ ! -f "$OUT/data/step-0010.parquet" ]; then
  "$BIN" synth --out "$OUT" --steps 10 --prompts 256 --group 16 --seed 1 --eos 151643
fi
files=$(for s in $(seq 1 "$SHARDS"); do printf '%s/data/step-%04d.parquet ' "$OUT" "$s"; done)
rows=$((SHARDS * 4096))

timed_min() { # PREV CMD...: the smaller of PREV (seconds, may be empty) and one timed run of CMD
  local prev=$1 t0 t1
  shift
  t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N)
  python3 -c "t=$t1-$t0; b='$prev'; print(t if not b else min(t, float(b)))"
}

# Same numbers from both tools (sanity check before timing).
"$BIN" audit "$OUT" --steps "1..$SHARDS" --json --eos 151643 | tail -1 >"$OUT/rust.json"
"$PY" bench/audit_pyarrow.py $files | tail -1 >"$OUT/py.json"
python3 - "$OUT/rust.json" "$OUT/py.json" <<'PY'
import json, sys
r, p = (json.load(open(f)) for f in sys.argv[1:])
assert r["rows"] == p["rows"], (r, p)
assert abs(r["logprob_mean"] - p["logprob_mean"]) < 1e-9, (r, p)
PY

# Runs alternate between the two tools, so that both see the same machine state.
t_rust=; t_py=
for _ in $(seq "$REPEAT"); do
  t_rust=$(timed_min "$t_rust" "$BIN" audit "$OUT" --steps "1..$SHARDS" --json --eos 151643)
  t_py=$(timed_min "$t_py" "$PY" bench/audit_pyarrow.py $files)
done
python3 - "$rows" "$t_rust" "$t_py" <<'PY'
import sys
rows, tr, tp = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
print(f"shards: {rows // 4096}, rows: {rows}")
print(f"rlreplay audit --json : {tr:.3f} s  {rows / tr:,.0f} rows/s")
print(f"pyarrow + numpy       : {tp:.3f} s  {rows / tp:,.0f} rows/s")
print(f"ratio (rlreplay / pyarrow rows/s): {tp / tr:.2f}x")
PY

# Peak memory: 10 shards against 1 shard, and one shard's decoded size.
rss() { /usr/bin/time -v "$@" 2>&1 >/dev/null | awk -F': ' '/Maximum resident/ {print $2}'; }
rss1=$(rss "$BIN" audit "$OUT" --steps 1..1 --json)
rss10=$(rss "$BIN" audit "$OUT" --steps 1..10 --json)
"$PY" - "$OUT/data/step-0001.parquet" "$rss1" "$rss10" <<'PY'
import sys
import pyarrow.parquet as pq
t = pq.read_table(sys.argv[1], columns=["prompt_token_ids", "response_token_ids", "rollout_log_probs"])
decoded = sum(len(t.column(c).combine_chunks().values) * 4 for c in t.column_names) / 2**20
rss1, rss10 = int(sys.argv[2]) / 1024, int(sys.argv[3]) / 1024
print(f"one shard decoded (tokens + log-probs, 4 B each): {decoded:.1f} MiB")
print(f"peak RSS, 1 shard: {rss1:.1f} MiB; 10 shards: {rss10:.1f} MiB ({rss10 / decoded:.2f}x one shard's decoded size)")
PY
