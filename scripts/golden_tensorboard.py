#!/usr/bin/env python3
"""TensorBoard's own reader on an event file written by rlreplay-tensorboard.

Writes crates/rlreplay-tensorboard/tests/fixtures/:
  scalars.json            the scalars written: 40 steps of 25 tags (verl-style names), values
                          spanning signs and magnitudes, wall time of step k = wall_time0 + 1 + k
  events.out.tfevents.golden
                          the event file the crate's example writes from scalars.json
  tensorboard_read.json   what TensorBoard's EventAccumulator reads back from it: per tag, the
                          (wall_time, step, value) of every scalar event

    scripts/setup-venv.sh audit numpy pyarrow tensorboard   # once
    .venv/audit/bin/python scripts/golden_tensorboard.py
"""
import json
import os
import subprocess

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "crates", "rlreplay-tensorboard", "tests", "fixtures")


def main():
    rng = np.random.default_rng(5)
    tags = [f"actor/{n}" for n in ("pg_loss", "grad_norm", "entropy", "pg_clipfrac", "ppo_kl")]
    tags += [f"rollout_corr/{n}" for n in ("kl", "k3_kl", "rollout_is_mean", "rollout_is_max",
                                          "rollout_is_eff_sample_size", "chi2_seq")]
    tags += ["critic/score/mean", "response_length/mean", "perf/throughput", "train/epoch",
             "replay/logprob_success", "replay/logprob_failure", "audit/ess/seq/batch",
             "a", "deep/nested/tag/name", "zero", "tiny", "huge", "negative", "integer"]
    steps = []
    for k in range(40):
        scalars = {t: float(rng.normal() * 10.0 ** int(rng.integers(-4, 5))) for t in tags}
        scalars.update({"zero": 0.0, "tiny": 1e-30 * (k + 1), "huge": -3.5e30 * (k + 1),
                        "negative": -float(k) - 0.125, "integer": float(1000 * k)})
        steps.append({"step": k + 1, "scalars": scalars})
    spec = {"wall_time0": 1_750_000_000.25, "steps": steps}
    os.makedirs(OUT, exist_ok=True)
    scalars_path = os.path.join(OUT, "scalars.json")
    with open(scalars_path, "w") as f:
        json.dump(spec, f, indent=1)
        f.write("\n")
    events = os.path.join(OUT, "events.out.tfevents.golden")
    subprocess.run(["cargo", "run", "--quiet", "-p", "rlreplay-tensorboard", "--example",
                    "write_scalars", "--", scalars_path, events], check=True, cwd=ROOT)
    acc = EventAccumulator(events, size_guidance={"scalars": 0})
    acc.Reload()
    read = {tag: [[e.wall_time, e.step, e.value] for e in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}
    assert sorted(read) == sorted(tags), sorted(read)
    with open(os.path.join(OUT, "tensorboard_read.json"), "w") as f:
        json.dump(read, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
