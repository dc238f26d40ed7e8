#!/usr/bin/env python3
"""Golden values of `rlreplay audit --policy`, computed independently with NumPy from the
policy's log-probs as `rlreplay logprobs` reports them.

Writes crates/rlreplay-cli/tests/data/audit/:
  data/step-000{1,2,3}.parquet   three steps of 3 groups x 4 rows written by pyarrow; tokens below
                                 the tiny fixture model's vocabulary (96), EOS = 1 (some rows are
                                 cut without it); the behaviour log-probs are the policy's at
                                 temperature 0.7 plus noise (float32), logged temperature 0.7
  expected.json                  per-step and whole-range statistics (audit/* and rollout_corr/*
                                 names) at thresholds 2 and 1.2, token-level IS for the verl set

The policy is crates/rlreplay-model/tests/fixtures/tiny_tied; its log-probs come from
`rlreplay logprobs --dtype f64` (the binary given by RLREPLAY, default target/debug/rlreplay).

    scripts/setup-venv.sh audit numpy pyarrow   # once
    cargo build -p rlreplay-cli && .venv/audit/bin/python scripts/golden_audit.py
"""
import json
import os
import shutil
import subprocess
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
OUT = os.path.join(ROOT, "crates", "rlreplay-cli", "tests", "data", "audit")
MODEL = os.path.join(ROOT, "crates", "rlreplay-model", "tests", "fixtures", "tiny_tied")
BIN = os.environ.get("RLREPLAY", os.path.join(ROOT, "target", "debug", "rlreplay"))
EOS, VOCAB, TEMP = 1, 96, 0.7
THRESHOLDS = [2.0, 1.2]
BOUND = 20.0
QUANTILES = [(0.01, "p01"), (0.05, "p05"), (0.25, "p25"), (0.5, "p50"), (0.75, "p75"),
             (0.95, "p95"), (0.99, "p99")]


def make_rows(rng, step):
    rows = []
    for g in range(3):
        prompt = rng.integers(2, VOCAB, int(rng.integers(3, 7))).tolist()
        for r in range(4):
            n = int(rng.integers(2, 12))
            resp = rng.integers(2, VOCAB, n).tolist()
            if rng.random() < 0.8:
                resp[-1] = EOS
            rows.append({"uid": f"s{step}g{g}", "prompt": prompt, "response": resp,
                         "score": float(rng.integers(0, 2))})
    return rows


def policy_logprobs(rows):
    with tempfile.TemporaryDirectory() as tmp:
        inp = os.path.join(tmp, "in.jsonl")
        with open(inp, "w") as f:
            for r in rows:
                f.write(json.dumps({"prompt_token_ids": r["prompt"],
                                    "response_token_ids": r["response"]}) + "\n")
        out = subprocess.run([BIN, "logprobs", "--model", MODEL, "--input", inp, "--dtype", "f64",
                              "--temperature", str(TEMP)], check=True, capture_output=True, text=True)
    return [np.array(json.loads(l)["logprobs"], dtype=np.float64) for l in out.stdout.splitlines()]


def kish(log_w):
    w = np.exp(log_w - log_w.max())
    return float(w.sum() ** 2 / (len(w) * (w * w).sum()))


def plain_kish(w):
    return float(w.sum() ** 2 / (len(w) * (w * w).sum())) if (w * w).sum() > 0 else 0.0


def pearson(x, y):
    x, y = np.asarray(x), np.asarray(y)
    if len(x) < 2 or np.var(x) <= 1e-12 * np.mean(x * x) or np.var(y) <= 1e-12 * np.mean(y * y):
        return None
    return float(np.corrcoef(x, y)[0, 1])


def core(m, prefix, deltas):
    """Counts, log-ratio means/stds, KL and correction fractions of a set of rows."""
    rows = len(deltas)
    tokens = int(sum(len(d) for d in deltas))
    m[prefix + "rows"] = rows
    m[prefix + "tokens"] = tokens
    if rows == 0:
        return
    tok = np.concatenate(deltas)
    seq = np.array([d.sum() for d in deltas])
    geo = np.array([d.mean() for d in deltas])
    for name, xs in [("token", tok), ("seq", seq), ("geo", geo)]:
        m[prefix + f"log_ratio/{name}/mean"] = float(xs.mean())
        m[prefix + f"log_ratio/{name}/std"] = float(xs.std())
    c = np.clip(tok, -BOUND, BOUND)
    cs = np.clip(seq, -BOUND, BOUND)
    m[prefix + "kl/k1"] = float((-c).mean())
    m[prefix + "kl/k2"] = float((0.5 * c * c).mean())
    m[prefix + "kl/k3"] = float((np.exp(c) - 1 - c).mean())
    m[prefix + "kl/seq_k1"] = float((-cs).mean())
    m[prefix + "kl/seq_k2"] = float((0.5 * cs * cs).mean())
    m[prefix + "kl/seq_k3"] = float((np.exp(cs) - 1 - cs).mean())
    lens = np.array([len(d) for d in deltas])
    for C in THRESHOLDS:
        lo, label = 1.0 / C, f"{C:g}"
        w_rows = [np.exp(np.clip(d, -BOUND, BOUND)) for d in deltas]
        above = np.array([(w > C).sum() for w in w_rows])
        below = np.array([(w < lo).sum() for w in w_rows])
        sw = np.exp(cs)
        gw = np.exp(np.clip(geo, -BOUND, BOUND))
        changed = {
            "token_truncate": (above.sum(), (above > 0).sum()),
            "token_mask": ((above + below).sum(), ((above + below) > 0).sum()),
        }
        for name, w in [("seq", sw), ("geo", gw)]:
            hit_t = w > C
            hit_m = (w > C) | (w < lo)
            changed[f"{name}_truncate"] = (lens[hit_t].sum(), hit_t.sum())
            changed[f"{name}_mask"] = (lens[hit_m].sum(), hit_m.sum())
        for name, (t, s) in changed.items():
            m[prefix + f"is_{label}/{name}/tokens"] = float(t) / tokens
            m[prefix + f"is_{label}/{name}/seqs"] = float(s) / rows


def batch(m, deltas, scores, groups):
    tok = np.concatenate(deltas)
    seq = np.array([d.sum() for d in deltas])
    geo = np.array([d.mean() for d in deltas])
    for name, xs in [("token", tok), ("seq", seq), ("geo", geo)]:
        m[f"audit/ess/{name}/batch"] = kish(np.clip(xs, -BOUND, BOUND))
    for name, xs in [("seq", seq), ("geo", geo)]:
        per_group = [kish(np.clip(xs[g], -BOUND, BOUND)) for g in groups]
        m[f"audit/ess/{name}/group_mean"] = float(np.mean(per_group))
        m[f"audit/ess/{name}/group_min"] = float(np.min(per_group))
    for C in THRESHOLDS:
        lo, label = 1.0 / C, f"{C:g}"
        for name, w in [("token", np.exp(np.clip(tok, -BOUND, BOUND))),
                        ("seq", np.exp(np.clip(seq, -BOUND, BOUND))),
                        ("geo", np.exp(np.clip(geo, -BOUND, BOUND)))]:
            m[f"audit/is_{label}/{name}_truncate/ess"] = plain_kish(np.minimum(w, C))
            m[f"audit/is_{label}/{name}_mask/ess"] = plain_kish(np.where((w >= lo) & (w <= C), w, 0.0))
    s = np.array(scores)
    centred = lambda xs: np.concatenate([xs[g] - xs[g].mean() for g in groups])
    for name, xs in [("seq", seq), ("geo", geo)]:
        for key, v in [(f"{name}_log_ratio_score", pearson(xs, s)),
                       (f"{name}_log_ratio_score_in_group", pearson(centred(xs), centred(s)))]:
            if v is not None:
                m[f"audit/corr/{key}"] = v


def quantiles(m, deltas):
    tok = np.concatenate(deltas)
    seq = np.array([d.sum() for d in deltas])
    geo = np.array([d.mean() for d in deltas])
    for name, xs in [("token", tok), ("seq", seq), ("geo", geo)]:
        m[f"audit/log_ratio/{name}/min"] = float(xs.min())
        m[f"audit/log_ratio/{name}/max"] = float(xs.max())
        for q, qn in QUANTILES:
            m[f"audit/log_ratio/{name}/{qn}"] = float(np.quantile(xs, q))


def verl(m, lp, roll):
    """verl's rollout_corr/* metrics at token level, threshold 2 (independent implementation)."""
    C = THRESHOLDS[0]
    d = np.concatenate(lp) - np.concatenate(roll)
    w = np.exp(np.clip(d, -BOUND, BOUND))
    m["rollout_corr/kl"] = float((-d).mean())
    m["rollout_corr/k3_kl"] = float((np.exp(np.clip(d, -BOUND, BOUND)) - np.clip(d, -BOUND, BOUND) - 1).mean())
    m["rollout_corr/chi2_token"] = float(np.exp(2 * np.clip(d, -BOUND, BOUND)).mean() - 1)
    sums = np.array([(a - b).sum() for a, b in zip(lp, roll)])
    m["rollout_corr/chi2_seq"] = float(np.exp(2 * np.clip(sums, -BOUND, BOUND)).mean() - 1)
    tr = np.array([a.mean() for a in lp])
    ro = np.array([b.mean() for b in roll])
    m["rollout_corr/training_ppl"] = float(np.exp(-tr).mean())
    m["rollout_corr/rollout_ppl"] = float(np.exp(-ro).mean())
    m["rollout_corr/log_ppl_diff"] = float((ro - tr).mean())
    m["rollout_corr/ppl_ratio"] = float(np.exp(ro - tr).mean())
    m["rollout_corr/rollout_is_mean"] = float(w.mean())
    m["rollout_corr/rollout_is_max"] = float(w.max())
    m["rollout_corr/rollout_is_min"] = float(w.min())
    m["rollout_corr/rollout_is_ratio_fraction_high"] = float((w > C).mean())
    m["rollout_corr/rollout_is_ratio_fraction_low"] = float((w < 1 / C).mean())
    wc = np.clip(w, 1 / C, C)
    m["rollout_corr/rollout_is_std"] = float(wc.std())
    m["rollout_corr/rollout_is_eff_sample_size"] = float(1 / ((wc / (wc.mean() + 1e-8)) ** 2).mean())
    off = np.cumsum([0] + [len(a) for a in lp])
    seq_means = np.array([w[off[i]:off[i + 1]].mean() for i in range(len(lp))])
    m["rollout_corr/rollout_is_seq_mean"] = float(seq_means.mean())


def audit(steps):
    """Per-step metrics and the metrics of the whole range."""
    per_step = {}
    all_d, all_s, all_groups, all_t = [], [], [], []
    verl_acc, tokens_total = {}, 0
    for step, (rows, lp, roll) in steps.items():
        deltas = [a - b for a, b in zip(lp, roll)]
        scores = [r["score"] for r in rows]
        trunc = [r["response"][-1] != EOS for r in rows]
        succ = [s >= 0.5 for s in scores]
        groups = [np.arange(4 * g, 4 * g + 4) for g in range(len(rows) // 4)]
        m = {}
        for prefix, sel in [("audit/", [True] * len(rows)), ("audit/success/", succ),
                            ("audit/failure/", [not s for s in succ]), ("audit/truncated/", trunc),
                            ("audit/complete/", [not t for t in trunc])]:
            core(m, prefix, [d for d, k in zip(deltas, sel) if k])
        batch(m, deltas, scores, groups)
        quantiles(m, deltas)
        verl(m, lp, roll)
        per_step[str(step)] = m
        n = sum(len(d) for d in deltas)
        for k, v in m.items():
            if k.startswith("rollout_corr/"):
                if k.endswith("_max"):
                    verl_acc[k] = max(verl_acc.get(k, -np.inf), v)
                elif k.endswith("_min"):
                    verl_acc[k] = min(verl_acc.get(k, np.inf), v)
                else:
                    verl_acc[k] = verl_acc.get(k, 0.0) + v * n
        tokens_total += n
        base = len(all_d)
        all_d += deltas
        all_s += scores
        all_t += list(zip(succ, trunc))
        all_groups += [g + base for g in groups]
    summary = {k: (v if k.endswith(("_max", "_min")) else v / tokens_total) for k, v in verl_acc.items()}
    summary["audit/steps"] = len(steps)
    for prefix, sel in [("audit/", [True] * len(all_d)), ("audit/success/", [s for s, _ in all_t]),
                        ("audit/failure/", [not s for s, _ in all_t]),
                        ("audit/truncated/", [t for _, t in all_t]),
                        ("audit/complete/", [not t for _, t in all_t])]:
        core(summary, prefix, [d for d, k in zip(all_d, sel) if k])
    batch(summary, all_d, all_s, all_groups)
    quantiles(summary, all_d)
    return per_step, summary


def main():
    rng = np.random.default_rng(17)
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(os.path.join(OUT, "data"))
    steps = {}
    for step in (1, 2, 3):
        rows = make_rows(rng, step)
        lp = policy_logprobs(rows)
        # The behaviour: the policy plus noise, as the float32 a rollout engine logs.
        roll = [np.minimum(a + rng.normal(0.0, 0.35, len(a)), -1e-4).astype(np.float32) for a in lp]
        table = pa.table({
            "uid": [r["uid"] for r in rows],
            "prompt_token_ids": pa.array([r["prompt"] for r in rows], pa.list_(pa.int32())),
            "response_token_ids": pa.array([r["response"] for r in rows], pa.list_(pa.int32())),
            "rollout_log_probs": pa.array([x.tolist() for x in roll], pa.list_(pa.float32())),
            "score": pa.array([r["score"] for r in rows], pa.float32()),
            "temperature": pa.array([TEMP] * len(rows), pa.float32()),
        })
        pq.write_table(table, os.path.join(OUT, "data", f"step-{step:04d}.parquet"))
        steps[step] = (rows, lp, [x.astype(np.float64) for x in roll])
    per_step, summary = audit(steps)
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump({"temperature": TEMP, "thresholds": THRESHOLDS, "eos": EOS,
                   "steps": per_step, "summary": summary}, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
