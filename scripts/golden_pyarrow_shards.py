#!/usr/bin/env python3
"""Rollout shards written by pyarrow in several layouts, with their contents, for the reader's
tests (crates/rlreplay-data/tests/it/pyarrow_shards.rs).

Writes crates/rlreplay-data/tests/fixtures/pyarrow/:
  LAYOUT/data/step-0001.parquet   one 32-row shard per layout (codec, dictionary, data page
                                  version, id and log-prob widths); small pages and row groups,
                                  so rows span pages and row groups
  expected.json                   the rows every shard holds (uid, prompt and response ids,
                                  log-probs as float32 values, score)

    scripts/setup-venv.sh arrow pyarrow numpy   # once
    .venv/arrow/bin/python scripts/golden_pyarrow_shards.py
"""
import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = os.path.join(os.path.dirname(__file__), "..", "crates", "rlreplay-data", "tests", "fixtures", "pyarrow")
ROWS, GROUP = 32, 8

LAYOUTS = {
    # pyarrow's defaults: Snappy, dictionary pages, data page v1.
    "default": dict(ids=pa.int32(), lps=pa.float32(), large=False, write={}),
    "plain-v2-zstd": dict(ids=pa.int32(), lps=pa.float32(), large=False,
                          write=dict(use_dictionary=False, data_page_version="2.0", compression="zstd")),
    "plain-v1-uncompressed": dict(ids=pa.int32(), lps=pa.float32(), large=False,
                                  write=dict(use_dictionary=False, compression="none")),
    "dictionary-v2-snappy": dict(ids=pa.int32(), lps=pa.float32(), large=False,
                                 write=dict(data_page_version="2.0", compression="snappy")),
    "plain-gzip": dict(ids=pa.int32(), lps=pa.float32(), large=False,
                       write=dict(use_dictionary=False, compression="gzip")),
    "int64-float64-large-list-v2-zstd": dict(ids=pa.int64(), lps=pa.float64(), large=True,
                                             write=dict(use_dictionary=False, data_page_version="2.0",
                                                        compression="zstd")),
}


def main():
    rng = np.random.default_rng(7)
    rows = []
    for r in range(ROWS):
        n_prompt = int(rng.integers(3, 24))
        n_resp = int(rng.integers(1, 80))
        rows.append({
            "uid": f"group-{r // GROUP}",
            "prompt": rng.integers(0, 151_000, n_prompt).tolist(),
            "response": rng.integers(0, 151_000, n_resp).tolist(),
            # float32 values, written to JSON exactly (as the float64 of the float32).
            "log_probs": [float(x) for x in (-rng.exponential(1.0, n_resp)).astype(np.float32)],
            "score": float(np.float32(rng.integers(0, 2))),
        })
    if os.path.isdir(ROOT):
        shutil.rmtree(ROOT)
    for name, layout in LAYOUTS.items():
        lst = pa.large_list if layout["large"] else pa.list_
        table = pa.table({
            "step": pa.array([1] * ROWS, pa.int64()),
            "uid": pa.array([r["uid"] for r in rows]),
            "prompt_token_ids": pa.array([r["prompt"] for r in rows], lst(layout["ids"])),
            "response_token_ids": pa.array([r["response"] for r in rows], lst(layout["ids"])),
            "rollout_log_probs": pa.array([r["log_probs"] for r in rows], lst(layout["lps"])),
            "score": pa.array([r["score"] for r in rows], pa.float32()),
        })
        out = os.path.join(ROOT, name, "data")
        os.makedirs(out)
        pq.write_table(table, os.path.join(out, "step-0001.parquet"), row_group_size=12,
                       data_page_size=512, **layout["write"])
    with open(os.path.join(ROOT, "expected.json"), "w") as f:
        json.dump({"pyarrow": pa.__version__, "layouts": sorted(LAYOUTS), "rows": rows}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
