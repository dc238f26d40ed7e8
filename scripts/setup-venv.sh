#!/usr/bin/env bash
# Creates a Python virtual environment .venv/NAME with the packages one of the reference scripts
# needs (golden fixtures, differential tests, benchmarks). Usage: scripts/setup-venv.sh NAME PKG...
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
name=$1; shift
venv="$root/.venv/$name"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
echo "$venv"
