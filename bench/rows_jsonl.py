#!/usr/bin/env python3
"""The rows of a rollout dataset as bench/replay_torch.py reads them: one JSON line per step
(shard, in order), a list of {uid, prompt, response, score}. Needs pyarrow.

    rows_jsonl.py DATASET_DIR OUT.jsonl
"""
import glob
import json
import sys

import pyarrow.parquet as pq

dataset, out = sys.argv[1], sys.argv[2]
with open(out, "w") as f:
    for path in sorted(glob.glob(f"{dataset}/data/step-*.parquet")):
        t = pq.read_table(path).to_pydict()
        rows = [{"uid": u, "prompt": p, "response": r, "score": s} for u, p, r, s in
                zip(t["uid"], t["prompt_token_ids"], t["response_token_ids"], t["score"])]
        f.write(json.dumps(rows) + "\n")
