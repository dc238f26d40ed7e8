"""Writes the committed seed corpora of the fuzz targets (fuzz/seeds/TARGET/).

verify_latex: short gold/prediction pairs of the verifier's differential-testing fixture
(crates/rlreplay-reward/tests/data/math_verify_cases.jsonl), one file each, `gold NUL pred`; the
pieces of long chains and deep nesting (`chain-*`, which the target also verifies repeated to 4 KiB);
and fuzz/stress/: large pairs in the same format for the time-limit check.
read_shard: small rollout shards in the canonical schema and in the published run's aliased layout,
with several compressions, encodings and page sizes, a shard without rows and one with a negative
token id (needs pyarrow: .venv/arrow/bin/python).

Usage: .venv/arrow/bin/python fuzz/make_seeds.py   (rewrites the generated seeds, keeps others)
"""

import hashlib
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
SEEDS = ROOT / "fuzz" / "seeds"
CASES = ROOT / "crates" / "rlreplay-reward" / "tests" / "data" / "math_verify_cases.jsonl"
# Longest pair taken, and every STRIDE-th case of the fixture is taken.
MAX_PAIR = 240
STRIDE = 5


def write(target, name, data):
    d = SEEDS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def verify_seeds():
    d = SEEDS / "verify_latex"
    for old in d.glob("case-*"):
        old.unlink()
    seen, total = set(), 0
    for line in CASES.read_text().splitlines()[::STRIDE]:
        c = json.loads(line)
        data = (c["gold"] + "\0" + c["pred"]).encode()
        if len(data) > MAX_PAIR or data in seen:
            continue
        seen.add(data)
        total += len(data)
        write("verify_latex", "case-" + hashlib.sha1(data).hexdigest()[:16], data)
    for old in d.glob("chain-*"):
        old.unlink()
    for piece in CHAIN_PIECES:
        data = piece.encode()
        write("verify_latex", "chain-" + hashlib.sha1(data).hexdigest()[:16], data)
    print(f"verify_latex: {len(seen)} seeds, {total} bytes; {len(CHAIN_PIECES)} chain pieces")
    stress = ROOT / "fuzz" / "stress"
    stress.mkdir(exist_ok=True)
    for name, gold, pred in STRESS:
        (stress / name).write_bytes((gold + "\0" + pred).encode())
    print(f"stress: {len(STRESS)} inputs")


# Short inputs that the `verify_latex` target also repeats: postfix and infix chains, nesting.
CHAIN_PIECES = [
    "!", "^2", "^{2}", "\\%", "%", "'", "(", "{", "\\{", "|", "2^{", "-", "\\sqrt", "\\frac{1}",
    "/x", " \\cup A", " \\in x", "=1", "\\left(", "\\begin{pmatrix}1\\end{pmatrix}",
]

# Large inputs that probe the time limit and the size bounds (each well under 64 KiB), for
# `examples/verify_slowest`. Not fuzzing seeds: the instrumented fuzzing build is too slow on them
# for libFuzzer's 2 s limit.
STRESS = [
    ("long-sum", "5", "1 + " * 2000 + "1"),
    ("nested-boxes", "1", "\\boxed{" * 500 + "1" + "}" * 500),
    ("nested-parens", "(" * 2000 + "1" + ")" * 2000, "\\boxed{1}"),
    ("long-number", "9" * 5000, "\\boxed{" + "9" * 5000 + "}"),
    ("nested-fracs", "\\frac{1}{2}", "\\boxed{" + "\\frac{1}{" * 300 + "2" + "}" * 300 + "}"),
    ("power-tower", "1", "\\boxed{" + "2^{" * 200 + "2" + "}" * 200 + "}"),
    ("many-dollars", "3", "$1$ and " * 1500 + "$3$"),
    ("many-boxes", "1,2", "\\boxed{1}" * 1000),
    ("big-matrix", "\\begin{pmatrix}" + "\\\\".join(["&".join(["x"] * 30)] * 30) + "\\end{pmatrix}",
     "\\boxed{\\begin{pmatrix}" + "\\\\".join(["&".join(["1"] * 30)] * 30) + "\\end{pmatrix}}"),
    ("many-symbols", "+".join(f"x_{{{i}}}" for i in range(800)), "\\boxed{" + "+".join(f"x_{{{i}}}" for i in range(799, -1, -1)) + "}"),
    ("factorials", "1", "\\boxed{" + "2000!" * 50 + "}"),
    ("long-set", "\\{" + ",".join(str(i) for i in range(1500)) + "\\}", "\\boxed{\\{" + ",".join(str(i) for i in range(1499, -1, -1)) + "\\}}"),
    ("unclosed", "1", "\\boxed{" + "\\left(" * 1000 + "\\text{" * 1000),
    ("factorial-chain", "6", "\\boxed{3" + "!" * 8000 + "}"),
    ("power-chain", "3" + "^2" * 8000, "\\boxed{3}"),
    ("percent-chain", "3" + "\\%" * 8000, "\\boxed{3" + "\\%" * 8000 + "}"),
    ("division-chain", "1", "\\boxed{x" + "/x" * 8000 + "}"),
]


def shard_seeds():
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = SEEDS / "read_shard"
    for old in d.glob("shard-*"):
        old.unlink()
    rows = 8
    prompt = [[151644, 872, 198, 17 + i] for i in range(rows)]
    response = [[100 + i, 200 + i, 151645] if i % 3 else [5, 6] for i in range(rows)]
    logp = [[-0.25 * (j + 1) for j in range(len(r))] for r in response]
    uid = [f"g{i // 4}" for i in range(rows)]
    score = [float(i % 2) for i in range(rows)]

    def ints(v, t):
        return pa.array(v, type=pa.list_(t))

    canonical = pa.table(
        {
            "step": pa.array([1] * rows, type=pa.int64()),
            "uid": uid,
            "prompt_token_ids": ints(prompt, pa.int32()),
            "response_token_ids": ints(response, pa.int32()),
            "rollout_log_probs": pa.array(logp, type=pa.list_(pa.float32())),
            "score": pa.array(score, type=pa.float32()),
            "data_source": ["math", None] * (rows // 2),
            "ground_truth": ["\\frac{1}{2}", None] * (rows // 2),
            "temperature": pa.array([1.0] * rows, type=pa.float32()),
            "top_p": pa.array([None] * rows, type=pa.float32()),
        }
    )
    published = pa.table(
        {
            "uid": pa.array(list(range(rows)), type=pa.int64()),
            "prompt_ids": pa.array(prompt, type=pa.large_list(pa.int64())),
            "response_ids": pa.array(response, type=pa.large_list(pa.int64())),
            "old_log_probs": pa.array(logp, type=pa.large_list(pa.float64())),
            "acc": [bool(i % 2) for i in range(rows)],
            "response_mask": pa.array([[1] * len(r) for r in response], type=pa.list_(pa.int8())),
            "data_source": ["math"] * rows,
        }
    )
    # A step without rows, and a negative response token id (row 2): both must be reported.
    negative = canonical.set_column(
        canonical.schema.get_field_index("response_token_ids"),
        "response_token_ids",
        ints([[-7, 200, 151645] if i == 2 else r for i, r in enumerate(response)], pa.int32()),
    )
    variants = [
        ("canonical-zero-rows", canonical.slice(0, 0), dict(compression="zstd")),
        ("canonical-negative-id", negative, dict(compression="none")),
        ("canonical-zstd", canonical, dict(compression="zstd")),
        ("canonical-plain", canonical, dict(compression="none", use_dictionary=False)),
        ("canonical-snappy-v1", canonical, dict(compression="snappy", data_page_version="1.0")),
        ("canonical-smallpages", canonical, dict(compression="none", data_page_size=64, row_group_size=3)),
        ("published-gzip", published, dict(compression="gzip")),
        ("published-lz4-stats", published, dict(compression="lz4", write_statistics=True)),
        ("published-brotli-dict", published, dict(compression="brotli", use_dictionary=True)),
        ("published-bss", published, dict(compression="none", use_dictionary=False,
                                           column_encoding={"old_log_probs": "BYTE_STREAM_SPLIT"})),
    ]
    tmp = d / "tmp.parquet"
    total = 0
    for name, table, kw in variants:
        pq.write_table(table, tmp, **kw)
        data = tmp.read_bytes()
        total += len(data)
        write("read_shard", f"shard-{name}.parquet", data)
    tmp.unlink()
    print(f"read_shard: {len(variants)} seeds, {total} bytes")


if __name__ == "__main__":
    verify_seeds()
    shard_seeds()
