#!/usr/bin/env python3
"""The PyTorch side of bench/replay.sh: the same replay recipe as `rlreplay replay` (MaxRL advantages,
REINFORCE with token-mean over the mini-batch, AdamW, grad clip, micro-batches of at most
--max-tokens tokens) on the same rows and the same model shape, with transformers' Qwen3 (eager
PyTorch, float32, CPU). Sequences of a micro-batch are right-padded to its longest one (the usual
PyTorch recipe). Prints steps/s, tokens/s and the median update time of the steps after the first
as JSON. With --model-dir the pretrained model of that directory is trained instead of a random
one of --model's shape; with --lora-rank R, PEFT LoRA adapters of rank R (lora_alpha 2R) on every
linear layer are trained instead of every weight.
"""
import argparse
import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM


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
    ap.add_argument("--model", help="JSON of the Qwen3 shape (a random model)")
    ap.add_argument("--model-dir", help="a Hugging Face model directory to train instead")
    ap.add_argument("--lora-rank", type=int, default=0, help="train PEFT LoRA adapters of this rank")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--mini-batch", type=int, default=0, help="groups per optimizer step (0: all)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.model_dir:
        model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32,
                                                     attn_implementation="eager")
    else:
        shape = json.load(open(args.model))
        cfg = Qwen3Config(**shape, rms_norm_eps=1e-6, max_position_embeddings=4096,
                          attn_implementation="eager")
        model = Qwen3ForCausalLM(cfg).float()
    if args.lora_rank:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank,
                                                 target_modules="all-linear", lora_dropout=0.0))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    steps = [json.loads(l) for l in open(args.data)]
    tokens = 0
    t0 = time.perf_counter()
    step_secs = []
    for rows in steps:
        ts = time.perf_counter()
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
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
        tokens += sum(len(r["prompt"]) + len(r["response"]) for r in rows)
        step_secs.append(time.perf_counter() - ts)
    secs = time.perf_counter() - t0
    later = step_secs[1:] or step_secs
    print(json.dumps({"steps": len(steps), "seconds": secs, "steps_per_s": len(steps) / secs,
                      "tokens_per_s": tokens / secs, "update_s": statistics.median(later)}))


if __name__ == "__main__":
    main()
