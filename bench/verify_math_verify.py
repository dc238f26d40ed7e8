#!/usr/bin/env python3
"""math-verify 0.9.0 throughput on a JSONL file of {"gold", "pred"} cases (one process, one thread).

Usage: .venv/mathverify/bin/python bench/verify_math_verify.py CASES.jsonl [maxrl|default]
"""

import json
import sys
import time

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify


def main():
    path = sys.argv[1]
    mode = sys.argv[2] if len(sys.argv) > 2 else "maxrl"
    rows = [json.loads(line) for line in open(path)]
    gold_cfg = (LatexExtractionConfig(),)
    pred_cfg = (ExprExtractionConfig(), LatexExtractionConfig())

    def grade(gold, pred):
        try:
            if mode == "maxrl":
                g = parse("\\boxed{" + gold + "}", gold_cfg)
                return bool(g) and bool(verify(g, parse(pred, pred_cfg), 6))
            return bool(verify(parse(gold), parse(pred)))
        except Exception:
            return False

    start = time.perf_counter()
    correct = sum(grade(r["gold"], r["pred"]) for r in rows)
    secs = time.perf_counter() - start
    print(f"math-verify: {len(rows)} answers in {secs:.3f} s = {len(rows) / secs:.1f} answers/s ({correct}/{len(rows)} correct)")


if __name__ == "__main__":
    main()
