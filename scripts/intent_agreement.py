#!/usr/bin/env python3
"""Agreement of math-verify 0.9.0 and of each `rlreplay verify` mode with careful human grading.

The labelled set (crates/rlreplay-reward/tests/data/intent_labels.jsonl) holds realistic model
endings written by hand, one JSON object a line: {"id", "category", "gold", "pred", "label",
"reason"} where `label` is the human verdict (is `pred` a correct, complete final answer for the
gold answer `gold`?) and `reason` says why. Judging rules: the final stated answer counts (a
later correction overrides an earlier box, hedging between values is wrong, an intermediate value
or a truncated response is wrong); equal values in another form are right (order of terms,
unreduced fractions, exact decimals, units and degree marks, number words, `x=` prefixes, Unicode
minus signs, spaced digit groups, expanded or factored polynomials, since the problem text is not
at hand, inequalities joined by "or" for a union of intervals), except where the gold's form is the
point (a numeral with a base subscript asks for that base); an option letter answers a gold option
letter whatever value follows it; rounded or truncated decimals of exact answers are wrong.

Sub-commands:

  grade   Grade every labelled case with math-verify 0.9.0 in both reward modes (as
          scripts/diff_math_verify.py does) and store the verdicts in the file ("maxrl",
          "default"), so the Rust tests can check the modes against math-verify without Python.
  report  Print the agreement with the human labels of math-verify (stored verdicts) and of
          `rlreplay verify` in each mode, overall and by category.

Usage:
  .venv/mathverify/bin/python scripts/intent_agreement.py grade [--labels FILE]
  python3 scripts/intent_agreement.py report [--labels FILE] [--bin target/release/rlreplay] [--modes maxrl,default]
"""

import argparse
import collections
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from diff_math_verify import grade_all, run_rlreplay  # noqa: E402

LABELS = "crates/rlreplay-reward/tests/data/intent_labels.jsonl"
KEYS = ("id", "category", "gold", "pred", "label", "reason", "maxrl", "default")


def load(path):
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise SystemExit(f"{path}: duplicate ids")
    return rows


def cmd_grade(args):
    rows = load(args.labels)
    graded, secs = grade_all([(r["category"], r["gold"], r["pred"]) for r in rows])
    with open(args.labels, "w", encoding="utf-8") as f:
        for r, g in zip(rows, graded):
            r = {**r, "maxrl": g["maxrl"], "default": g["default"]}
            f.write(json.dumps({k: r[k] for k in KEYS}, ensure_ascii=False) + "\n")
    print(f"{len(rows)} labelled cases graded by math-verify in {secs:.1f} s", file=sys.stderr)


def agreement(rows, verdicts):
    ok = sum(r["label"] == v for r, v in zip(rows, verdicts))
    return ok, 100.0 * ok / len(rows)


def cmd_report(args):
    rows = load(args.labels)
    columns = {f"math-verify {m}": [r[m] for r in rows] for m in ("maxrl", "default")}
    for mode in args.modes.split(","):
        columns[f"rlreplay {mode}"] = run_rlreplay(args.bin, rows, mode)
    n_true = sum(r["label"] for r in rows)
    print(f"{len(rows)} labelled cases ({n_true} correct, {len(rows) - n_true} incorrect by the labels)")
    print(f"{'grader':<22} {'agree':>9} {'%':>7} {'false neg':>9} {'false pos':>9}")
    for name, v in columns.items():
        ok, pct = agreement(rows, v)
        fn = sum(r["label"] and not x for r, x in zip(rows, v))
        fp = sum(x and not r["label"] for r, x in zip(rows, v))
        print(f"{name:<22} {ok:>5}/{len(rows)} {pct:>6.1f}% {fn:>9} {fp:>9}")
    cats = collections.OrderedDict()
    for i, r in enumerate(rows):
        cats.setdefault(r["category"], []).append(i)
    print()
    print(f"{'category':<16} {'n':>3} " + " ".join(f"{c:>20}" for c in columns))
    for cat, idx in cats.items():
        sub = [rows[i] for i in idx]
        cells = []
        for v in columns.values():
            ok, _ = agreement(sub, [v[i] for i in idx])
            cells.append(f"{ok:>17}/{len(idx):<2}")
        print(f"{cat:<16} {len(idx):>3} " + " ".join(cells))
    if args.show:
        print()
        for name, v in columns.items():
            bad = [(r, x) for r, x in zip(rows, v) if r["label"] != x]
            for r, x in bad[: args.show]:
                print(f"[{name}] {r['id']}: gold={r['gold']!r} pred={r['pred'][:100]!r} label={r['label']} got={x}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("grade")
    g.add_argument("--labels", default=LABELS)
    r = sub.add_parser("report")
    r.add_argument("--labels", default=LABELS)
    r.add_argument("--bin", default="target/release/rlreplay")
    r.add_argument("--modes", default="maxrl,default,intent")
    r.add_argument("--show", type=int, default=0)
    args = ap.parse_args()
    {"grade": cmd_grade, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    main()
