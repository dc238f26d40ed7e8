#!/usr/bin/env bash
# Data-parallel replay throughput: `mpirun -np 2 rlreplay replay` with 1 thread per rank against
# one process with 1 thread, on the tiny Qwen3 shape (vocab 512, hidden 128, 2 layers), the same
# rows and configuration, interleaved ROUNDS times. Prints each run's tokens/s (mean of
# perf/throughput over the steps after the first), the ratio, and the share of a 2-rank step spent
# in the gradient all-reduce and in the log-prob gathers (timing_s/grad_all_reduce,
# timing_s/logprob_gather over perf/time_per_step).
#
# Also prints each run's CPU seconds (user + system, all processes of the job): what two ranks
# spend beyond one process, a figure that other load on the machine disturbs little.
#
# Micro-batches of at most BUDGET tokens (default 1024): a mini-batch of 8 groups (about 16,400
# tokens) then makes 18-23 micro-batches, about 10 per rank. They go out whole, so the cut between
# the ranks falls within half a micro-batch of the even split; docs/SCALING.md explains the choice
# (at 2048 tokens, 8-10 per mini-batch, the busier rank holds 53.6 % of the work, 51.5 % at 1024).
#
#   bench/ranks.sh            (env: ROUNDS=3 STEPS=4 BUDGET=1024 OUT=bench/out/ranks BIN=<rlreplay>)
# Needs Open MPI (openmpi-bin libopenmpi-dev) and libclang-dev; BIN defaults to the release build
# `cargo build --release --features rlreplay-cli/mpi --bin rlreplay` (made here when BIN is not
# given; build it first and pass BIN when timing in a quiet window).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out/ranks}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-4}
BUDGET=${BUDGET:-1024}
if [ -z "${BIN:-}" ]; then
    cargo build --release --quiet --features rlreplay-cli/mpi --bin rlreplay
    BIN=target/release/rlreplay
fi
rm -rf "$OUT"
mkdir -p "$OUT"
"$BIN" synth --out "$OUT/dataset" --steps "$STEPS" --prompts 16 --group 8 --vocab 512 \
  --mean-len 192 --max-len 512 --prompt-len 64 --eos 1 --pattern-len 4 --seed 0 >/dev/null 2>&1
cat >"$OUT/replay.toml" <<TOML
[model.random]
vocab_size = 512
hidden_size = 128
intermediate_size = 384
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
head_dim = 32
tie_word_embeddings = true
[data]
path = "$OUT/dataset"
eos_token_id = 1
[algorithm]
adv_estimator = "maxrl"
loss_mode = "reinforce"
[optim]
lr = 1e-5
[batch]
ppo_mini_batch_size = 8
max_tokens_per_micro_batch = $BUDGET
[trainer]
threads = 1
save_freq = 0
loggers = ["jsonl"]
TOML
export CANDLE_NUM_THREADS=1
cpu() { /usr/bin/time -f "%U %S" -o "$1" "${@:2}"; }
for r in $(seq "$ROUNDS"); do
    cpu "$OUT/one-$r.cpu" "$BIN" replay --config "$OUT/replay.toml" --out "$OUT/one-$r" \
        --quiet >/dev/null
    cpu "$OUT/two-$r.cpu" mpirun --allow-run-as-root --oversubscribe -np 2 --bind-to none \
        -x CANDLE_NUM_THREADS "$BIN" replay --config "$OUT/replay.toml" --out "$OUT/two-$r" \
        --quiet >/dev/null
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def steps(run):
    rows = [json.loads(l) for l in open(f"{out}/{run}/metrics.jsonl")]
    return rows[1:] if len(rows) > 1 else rows
def mean(rows, key):
    return statistics.mean(r.get(key) or 0.0 for r in rows)
ratios = []
for r in range(1, rounds + 1):
    one, two = steps(f"one-{r}"), steps(f"two-{r}")
    a, b = mean(one, "perf/throughput"), mean(two, "perf/throughput")
    t1, t = mean(one, "perf/time_per_step"), mean(two, "perf/time_per_step")
    u1, u = mean(one, "timing_s/update"), mean(two, "timing_s/update")
    ar, ga = mean(two, "timing_s/grad_all_reduce"), mean(two, "timing_s/logprob_gather")
    c1, c2 = (sum(map(float, open(f"{out}/{run}-{r}.cpu").read().split()[-2:]))
              for run in ("one", "two"))
    ratios.append(b / a)
    print(f"round {r}: 1 rank {a:,.0f} tokens/s, 2 ranks {b:,.0f} tokens/s, {b / a:.2f}x; "
          f"step {t1:.3f} s / {t:.3f} s (update {u1:.3f} s / {u:.3f} s); 2 ranks: all-reduce "
          f"{100 * ar / t:.1f} %, log-prob gathers {100 * ga / t:.1f} %; CPU {c1:.1f} s / "
          f"{c2:.1f} s ({100 * (c2 / c1 - 1):+.1f} %)")
print(f"median ratio {statistics.median(ratios):.2f}x")
PY
