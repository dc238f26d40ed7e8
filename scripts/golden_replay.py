#!/usr/bin/env python3
"""Golden fixture for the replay trainer: two trainer steps of MaxRL + REINFORCE (token-mean) with
AdamW and gradient clipping on a tiny Qwen3, computed in float64 with PyTorch.

Writes crates/rlreplay-train/tests/fixtures/golden/:
  model/config.json, model/model.safetensors   initial weights (float32, Hugging Face layout)
  rollouts.json                                the two steps' rows (prompt, response, log-probs, score, uid)
  expected.json                                per-step pg_loss and grad_norm
  expected.safetensors                         weights after the two steps (float64)

The forward pass is an independent float64 implementation of Qwen3 (transformers keeps RMSNorm,
RoPE and the eager softmax in float32 even after .double()); the script checks it against
transformers' own forward in float32 before using it.

    scripts/setup-venv.sh torch torch transformers safetensors numpy   # once
    .venv/torch/bin/python scripts/golden_replay.py
"""
import json
import math
import os

import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

OUT = os.path.join(os.path.dirname(__file__), "..", "crates", "rlreplay-train", "tests", "fixtures", "golden")
EOS = 1
THETA = 1_000_000.0
LR, BETAS, EPS, WD, CLIP = 1e-3, (0.9, 0.999), 1e-8, 0.01, 0.05


def rows_for(step, gen):
    rows = []
    for g in range(2):
        uid = f"s{step}g{g}"
        plen = int(torch.randint(3, 6, (1,), generator=gen))
        prompt = torch.randint(2, 64, (plen,), generator=gen).tolist()
        scores = [1.0, 0.0, 1.0, 0.0] if g == 0 else [0.0, 0.0, 1.0, 0.0]
        for r in range(4):
            rlen = int(torch.randint(2, 7, (1,), generator=gen))
            resp = torch.randint(2, 64, (rlen,), generator=gen).tolist()
            if r != 3:  # the last row of each group is truncated (no EOS)
                resp[-1] = EOS
            lps = (-torch.rand(rlen, generator=gen, dtype=torch.float64) * 3).tolist()
            rows.append({"uid": uid, "prompt": prompt, "response": resp,
                         "rollout_log_probs": [float(torch.tensor(x, dtype=torch.float32)) for x in lps],
                         "score": scores[r]})
    return rows


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def forward_logprobs(p, cfg, prompt, response):
    """log softmax of each response token given the prompt and the response before it (float64)."""
    ids = torch.tensor(prompt + response[:-1])
    T, H, KV, D = len(ids), cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    x = p["model.embed_tokens.weight"][ids]
    pos = torch.arange(T, dtype=torch.float64)
    inv = 1.0 / (THETA ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.outer(pos, inv)
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    for l in range(cfg.num_hidden_layers):
        pre = f"model.layers.{l}."
        h = rms(x, p[pre + "input_layernorm.weight"], cfg.rms_norm_eps)
        q = (h @ p[pre + "self_attn.q_proj.weight"].T).view(T, H, D)
        k = (h @ p[pre + "self_attn.k_proj.weight"].T).view(T, KV, D)
        v = (h @ p[pre + "self_attn.v_proj.weight"].T).view(T, KV, D)
        q = rms(q, p[pre + "self_attn.q_norm.weight"], cfg.rms_norm_eps)
        k = rms(k, p[pre + "self_attn.k_norm.weight"], cfg.rms_norm_eps)
        q = q * cos[:, None] + rotate_half(q) * sin[:, None]
        k = k * cos[:, None] + rotate_half(k) * sin[:, None]
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        att = torch.einsum("thd,shd->hts", q, k) / math.sqrt(D) + mask
        o = torch.einsum("hts,shd->thd", att.softmax(-1), v).reshape(T, H * D)
        x = x + o @ p[pre + "self_attn.o_proj.weight"].T
        h = rms(x, p[pre + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        gate = h @ p[pre + "mlp.gate_proj.weight"].T
        up = h @ p[pre + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ p[pre + "mlp.down_proj.weight"].T
    x = rms(x, p["model.norm.weight"], cfg.rms_norm_eps)
    head = p["model.embed_tokens.weight"] if cfg.tie_word_embeddings else p["lm_head.weight"]
    logp = (x @ head.T).log_softmax(-1)
    start = len(prompt) - 1
    return logp[start:, :].gather(1, torch.tensor(response)[:, None]).squeeze(1)


def maxrl_advantages(rows):
    groups = {}
    for i, r in enumerate(rows):
        groups.setdefault(r["uid"], []).append(i)
    adv = [0.0] * len(rows)
    for idx in groups.values():
        mu = sum(rows[i]["score"] for i in idx) / len(idx)
        for i in idx:
            adv[i] = 0.0 if mu in (0.0, 1.0) else (rows[i]["score"] - mu) / (mu + 1e-6)
    return adv


def main():
    os.makedirs(os.path.join(OUT, "model"), exist_ok=True)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                      rope_theta=1_000_000.0, tie_word_embeddings=True, max_position_embeddings=128,
                      attn_implementation="eager")
    torch.manual_seed(0)
    hf = Qwen3ForCausalLM(cfg).float().eval()
    with torch.no_grad():  # non-trivial norm weights, so their gradients matter
        for n, t in hf.named_parameters():
            if "norm" in n:
                t.copy_(1.0 + 0.1 * torch.randn_like(t))
    hf.save_pretrained(os.path.join(OUT, "model"), safe_serialization=True)

    gen = torch.Generator().manual_seed(1)
    steps = {1: rows_for(1, gen), 2: rows_for(2, gen)}
    with open(os.path.join(OUT, "rollouts.json"), "w") as f:
        json.dump({"eos": EOS, "steps": {str(k): v for k, v in steps.items()}}, f)

    params = {n: t.detach().to(torch.float64).clone().requires_grad_(True)
              for n, t in hf.state_dict().items() if n != "lm_head.weight"}

    # The float64 reference agrees with transformers' float32 forward.
    r0 = steps[1][0]
    ids = torch.tensor([r0["prompt"] + r0["response"][:-1]])
    with torch.no_grad():
        ref = hf(ids).logits[0].log_softmax(-1)[len(r0["prompt"]) - 1:]
        ref = ref.gather(1, torch.tensor(r0["response"])[:, None]).squeeze(1).double()
    assert torch.allclose(forward_logprobs(params, cfg, r0["prompt"], r0["response"]), ref, atol=1e-5)

    opt = torch.optim.AdamW(list(params.values()), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    expected = []
    for s in (1, 2):
        rows = steps[s]
        adv = maxrl_advantages(rows)
        total = sum(len(r["response"]) for r in rows)
        opt.zero_grad()
        loss = 0.0
        for a, r in zip(adv, rows):
            lp = forward_logprobs(params, cfg, r["prompt"], r["response"])
            loss = loss + (-a * lp).sum() / total
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(list(params.values()), CLIP)
        opt.step()
        expected.append({"step": s, "pg_loss": loss.item(), "grad_norm": gn.item()})
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump({"lr": LR, "betas": BETAS, "eps": EPS, "weight_decay": WD, "grad_clip": CLIP,
                   "steps": expected}, f, indent=1)
    save_file({n: t.detach().contiguous() for n, t in params.items()},
              os.path.join(OUT, "expected.safetensors"))
    print(json.dumps(expected))


if __name__ == "__main__":
    main()
