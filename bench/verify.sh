#!/usr/bin/env bash
# Verifier throughput: rlreplay's math verifier against math-verify 0.9.0 on the same cases, both
# single-threaded. Prints both rates and the ratio.
#   bench/verify.sh [CASES.jsonl] [maxrl|default]
# Needs .venv/mathverify (scripts/setup-venv.sh mathverify math-verify==0.9.0).
set -euo pipefail
cd "$(dirname "$0")/.."
cases="${1:-crates/rlreplay-reward/tests/data/math_verify_cases.jsonl}"
mode="${2:-maxrl}"
cargo build --release -q -p rlreplay-reward --example verify_throughput
rust_line=$(target/release/examples/verify_throughput "$cases" "$mode" 20)
py_line=$(.venv/mathverify/bin/python bench/verify_math_verify.py "$cases" "$mode")
echo "$rust_line"
echo "$py_line"
rust_rate=$(sed -E 's/.*= ([0-9.]+) answers\/s.*/\1/' <<<"$rust_line")
py_rate=$(sed -E 's/.*= ([0-9.]+) answers\/s.*/\1/' <<<"$py_line")
python3 -c "print(f'ratio (rlreplay / math-verify): {float(\"$rust_rate\") / float(\"$py_rate\"):.1f}x')"
