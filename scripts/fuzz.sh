#!/usr/bin/env bash
# Fuzzes one cargo-fuzz target of fuzz/ for SECONDS on the stable toolchain (see docs/FUZZING.md).
#
#   scripts/fuzz.sh verify_latex|read_shard|hub_names SECONDS [libFuzzer flags...]
#
# Needs `cargo install cargo-fuzz`. cargo-fuzz passes nightly-only flags to rustc (-Zsanitizer,
# sanitizer-coverage passes); RUSTC_BOOTSTRAP=1 lets the stable compiler accept them. One libFuzzer
# process runs at nice 10 with a 2 s limit per input. New corpus entries go to fuzz/corpus/TARGET,
# crash and timeout inputs to fuzz/artifacts/TARGET (neither is committed); the committed seeds
# fuzz/seeds/TARGET and the target's dictionary are always used. The build has debug assertions and
# overflow checks; FUZZ_SANITIZER=address adds AddressSanitizer (default none: faster, and only the
# Parquet and Arrow crates' unsafe code would need it).
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: scripts/fuzz.sh verify_latex|read_shard|hub_names SECONDS [libFuzzer flags...]"
target=${1:?$usage}
seconds=${2:?$usage}
shift 2
case $target in
  verify_latex) dict=fuzz/latex.dict features=() ;;
  read_shard) dict=fuzz/parquet.dict features=(--features shard) ;;
  hub_names) dict=fuzz/hub.dict features=(--features shard) ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "cargo-fuzz is missing: cargo install cargo-fuzz" >&2
  exit 2
fi
export RUSTC_BOOTSTRAP=1
mkdir -p "fuzz/corpus/$target" "fuzz/artifacts/$target"
exec nice -n 10 cargo fuzz run --fuzz-dir fuzz -a -s "${FUZZ_SANITIZER:-none}" --codegen-units 16 \
  "${features[@]}" "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
  -max_total_time="$seconds" -timeout=2 -dict="$dict" -print_final_stats=1 "$@"
