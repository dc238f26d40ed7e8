"""The pyarrow + numpy equivalent of `rlreplay audit --json`: per-step statistics of rollout shards.

Reads the same columns, checks the same invariants rlreplay checks on every read (one log-prob per
response token, log-probs finite and <= 0, finite scores, contiguous equal-size uid groups), and
prints one JSON object per step and a summary. Usage: audit_pyarrow.py SHARD... [--eos ID]
"""

import json
import sys

import numpy as np
import pyarrow.parquet as pq

COLUMNS = ["uid", "prompt_token_ids", "response_token_ids", "rollout_log_probs", "score"]


def audit(path, eos):
    t = pq.read_table(path, columns=COLUMNS)
    resp = t.column("response_token_ids").combine_chunks()
    r_off = resp.offsets.to_numpy()
    r_len = np.diff(r_off)
    tokens = resp.values.to_numpy()
    lp = t.column("rollout_log_probs").combine_chunks()
    lps = lp.values.to_numpy()
    if not np.array_equal(np.diff(lp.offsets.to_numpy()), r_len):
        raise ValueError(f"{path}: log-probs and response ids differ in length")
    if (r_len == 0).any():
        raise ValueError(f"{path}: empty response")
    if not (np.isfinite(lps).all() and (lps <= 0).all()):
        raise ValueError(f"{path}: bad log-prob")
    score = t.column("score").to_numpy().astype(np.float64)
    if not np.isfinite(score).all():
        raise ValueError(f"{path}: bad score")
    uids = t.column("uid").to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(np.r_[True, uids[1:] != uids[:-1]])
    if len(set(uids[starts])) != len(starts):
        raise ValueError(f"{path}: non-contiguous uid groups")
    sizes = np.diff(np.r_[starts, len(uids)])
    if (sizes != sizes[0]).any():
        raise ValueError(f"{path}: unequal group sizes")
    means = np.add.reduceat(score, starts) / sizes
    p_len = np.diff(t.column("prompt_token_ids").combine_chunks().offsets.to_numpy())
    truncated = tokens[r_off[1:] - 1] != eos
    n = len(score)
    return {
        "file": path,
        "rows": n,
        "groups": len(starts),
        "group_size": n / len(starts),
        "score_mean": float(score.mean()),
        "solve_none": float((means == 0).mean()),
        "solve_all": float((means == 1).mean()),
        "prompt_len_mean": float(p_len.mean()),
        "resp_len_mean": float(r_len.mean()),
        "resp_len_max": int(r_len.max()),
        "truncated": float(truncated.mean()),
        "logprob_mean": float(lps.astype(np.float64).mean()),
        "_tokens": int(r_len.sum()),
        "_lp_sum": float(lps.astype(np.float64).sum()),
    }


def main():
    args = sys.argv[1:]
    eos = 151643
    if "--eos" in args:
        i = args.index("--eos")
        eos = int(args[i + 1])
        del args[i : i + 2]
    rows = tokens = 0
    lp_sum = 0.0
    for path in args:
        s = audit(path, eos)
        rows += s["rows"]
        tokens += s.pop("_tokens")
        lp_sum += s.pop("_lp_sum")
        print(json.dumps(s))
    print(json.dumps({"summary": True, "rows": rows, "logprob_mean": lp_sum / max(tokens, 1)}))


if __name__ == "__main__":
    main()
