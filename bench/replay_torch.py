#!/usr/bin/env python3
"""The PyTorch side of bench/replay.sh: the same replay recipe as `rlreplay replay` (MaxRL advantages,
REINFORCE with token-mean over the mini-batch, AdamW, grad clip, micro-batches of at most
--max-tokens tokens) on the same rows and the same model shape, with transformers' Qwen3 (eager
PyTorch, float32, CPU). Sequences of a micro-batch are right-padded to its longest one (the usual
PyTorch recipe). Prints steps/s and tokens/s as JSON.
"""
import argparse
import json
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def maxrl(rows):
    groups = {}
    for i, r in enumerate(rows):
        groups.setdefault(r["uid"], []).append(i)
    adv = [0.0] * len(rows)
    for idx in groups.values():
        mu = sum(rows[i]["score"] for i in idx) / len(idx)
        for i in idx:
            adv[i] = 0.0 if mu in (0.0, 1.0) else (rows[i]["score"] - mu) / (mu + 1e-6)
    return adv


def micro_batches(rows, max_tokens):
    out, cur, tok = [], [], 0
    for r in rows:
        n = len(r["prompt"]) + len(r["response"]) - 1
        if cur and tok + n > max_tokens:
            out.append(cur)
            cur, tok = [], 0
        cur.append(r)
        tok += n
    if cur:
        out.append(cur)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="JSON lines, one step per line: list of rows")
    ap.add_argument("--model", required=True, help="JSON of the Qwen3 shape")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--mini-batch", type=int, default=0, help="groups per optimizer step (0: all)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shape = json.load(open(args.model))
    cfg = Qwen3Config(**shape, rms_norm_eps=1e-6, max_position_embeddings=4096,
                      attn_implementation="eager")
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).float()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    steps = [json.loads(l) for l in open(args.data)]
    tokens = 0
    t0 = time.perf_counter()
    for rows in steps:
        adv = maxrl(rows)
        for r, a in zip(rows, adv):
            r["adv"] = a
        uids = list(dict.fromkeys(r["uid"] for r in rows))
        per = args.mini_batch or len(uids)
        for g in range(0, len(uids), per):
            keep = set(uids[g:g + per])
            mb = [r for r in rows if r["uid"] in keep]
            total = sum(len(r["response"]) for r in mb)
            opt.zero_grad()
            for micro in micro_batches(mb, args.max_tokens):
                width = max(len(r["prompt"]) + len(r["response"]) - 1 for r in micro)
                ids = torch.zeros((len(micro), width), dtype=torch.long)
                att = torch.zeros((len(micro), width), dtype=torch.long)
                for i, r in enumerate(micro):
                    seq = r["prompt"] + r["response"][:-1]
                    ids[i, :len(seq)] = torch.tensor(seq)
                    att[i, :len(seq)] = 1
                logp = model(input_ids=ids, attention_mask=att).logits.float().log_softmax(-1)
                loss = 0.0
                for i, r in enumerate(micro):
                    p = len(r["prompt"]) - 1
                    lp = logp[i, p:p + len(r["response"])].gather(1, torch.tensor(r["response"])[:, None])
                    loss = loss + (-r["adv"] * lp).sum() / total
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        tokens += sum(len(r["prompt"]) + len(r["response"]) for r in rows)
    secs = time.perf_counter() - t0
    print(json.dumps({"steps": len(steps), "seconds": secs, "steps_per_s": len(steps) / secs,
                      "tokens_per_s": tokens / secs}))


if __name__ == "__main__":
    main()
