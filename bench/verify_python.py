#!/usr/bin/env python3
"""The Python module's verifier against math-verify 0.9.0's `math_metric`, maxrl configuration.

Times, on a JSONL file of {"gold", "pred"} cases (default: bench/out/verify_reference.jsonl,
the real reference-answer set bench/verify_real.sh writes), in one process:
`rlreplay.verify` in a Python loop, `rlreplay.verify_batch` (one thread, then every core), and
math-verify's `math_metric` (gold boxed and read as LaTeX, prediction as expression then LaTeX,
as verl's MaxRL reward). Reports answers/s and the verdicts' agreement.

Usage: python bench/verify_python.py [CASES.jsonl] [--threads N]
Needs rlreplay (`pip install .`, release profile) and math-verify==0.9.0 in the same environment.
"""

import argparse
import json
import os
import time

import rlreplay
from math_verify.metric import math_metric
from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig


def timed(name, n, fn):
    start = time.perf_counter()
    out = fn()
    secs = time.perf_counter() - start
    print(f"{name:<28} {n} answers in {secs:8.3f} s = {n / secs:10.1f} answers/s")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="?", default="bench/out/verify_reference.jsonl")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    with open(args.cases, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    golds = [r["gold"] for r in rows]
    preds = [r["pred"] for r in rows]
    n = len(rows)

    # The first call builds the verifier's regexes; not charged to any timing.
    rlreplay.verify("1", "1")
    loop = timed(
        "rlreplay.verify (loop)", n, lambda: [rlreplay.verify(g, p) for g, p in zip(golds, preds)]
    )
    one = timed("rlreplay.verify_batch (1)", n, lambda: rlreplay.verify_batch(golds, preds, threads=1))
    many = timed(
        f"rlreplay.verify_batch ({args.threads})",
        n,
        lambda: rlreplay.verify_batch(golds, preds, threads=args.threads),
    )
    assert loop == one == many

    metric = math_metric(
        gold_extraction_target=(LatexExtractionConfig(),),
        pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()),
    )

    def math_verify():
        scores = []
        for g, p in zip(golds, preds):
            try:
                score, _ = metric(["\\boxed{" + g + "}"], [p])
            except Exception:
                score = 0.0
            scores.append(float(score))
        return scores

    mv = timed("math-verify math_metric", n, math_verify)
    agree = sum(a == b for a, b in zip(loop, mv))
    print(f"agreement with math_metric: {agree}/{n}")


if __name__ == "__main__":
    main()
