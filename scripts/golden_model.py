#!/usr/bin/env python3
"""Golden fixtures for the model crate (Qwen3, Qwen2 and Llama), computed with Hugging Face transformers.

Setup:  scripts/setup-venv.sh torch torch==2.13.0 transformers==5.24.0 numpy safetensors

  .venv/torch/bin/python scripts/golden_model.py generate [NAME...]
      Builds tiny random checkpoints (all of MODELS, or the ones named): Qwen3, Qwen2 and Llama,
      each with tied embeddings and untied with 4:1 grouped-query attention, the norms of all of
      them random around 1. The untied Qwen2 has random q/k/v biases, the untied Llama random
      q/k/v/o biases (`attention_bias`) and Llama 3.1 rotary scaling (`rope_type` "llama3", its
      parameters chosen so that frequencies fall in each of the three bands: kept, interpolated,
      divided by the factor; the bands are printed). Saves them with `save_pretrained` (float32)
      under crates/rlreplay-model/tests/fixtures/<name>/, and writes for each:
        <name>.golden.json           the (prompt, response) pairs, temperature, the per-token
                                     weights g, golden per-token log-probs and entropies
        <name>.grads.safetensors     float64 gradients of sum(g * logprob) for every parameter
        <name>.adamw.safetensors     float64 weights after two AdamW steps with grad clipping
                                     (hyper-parameters and the second step's weights in the JSON)
      Golden values are computed in float64 on the saved float32 weights. transformers keeps
      RMSNorm, the RoPE angles and the eager softmax in float32 even in a float64 model, so those
      three are patched to run in the model dtype; the rotary inverse frequencies (default and
      llama3) are recomputed in float64 and checked against transformers' float32 ones. The
      unpatched float32 model is checked against the float64 golden values (same semantics up to
      float32 rounding). Generating only some fixtures leaves the others' files untouched.

  .venv/torch/bin/python scripts/golden_model.py check-rust-save
      Runs the Rust test `hf_export` (crates/rlreplay-model/tests/it/golden.rs) with
      RLREPLAY_EXPORT_DIR set: Rust loads each fixture, takes one AdamW step, saves the model with
      `save_hf` and writes its own log-probs of the fixture pairs to rust_logprobs.json. This script
      then loads every exported checkpoint with AutoModelForCausalLM.from_pretrained, unchanged,
      and checks its log-probs against Rust's.
"""

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.models.llama import modeling_llama
from transformers.models.qwen2 import modeling_qwen2
from transformers.models.qwen3 import modeling_qwen3

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "crates/rlreplay-model/tests/fixtures"

# architecture: (config class, model class, modeling module, RMSNorm class, rotary class)
ARCHS = {
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, modeling_qwen3, "Qwen3RMSNorm", "Qwen3RotaryEmbedding"),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, modeling_qwen2, "Qwen2RMSNorm", "Qwen2RotaryEmbedding"),
    "llama": (LlamaConfig, LlamaForCausalLM, modeling_llama, "LlamaRMSNorm", "LlamaRotaryEmbedding"),
}

MODELS = {
    # name: (architecture, config overrides, temperature, seed)
    "tiny_tied": (
        "qwen3",
        dict(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=10000.0),
        1.0,
        11,
    ),
    "tiny_gqa_untied": (
        "qwen3",
        dict(num_key_value_heads=1, tie_word_embeddings=False, rope_theta=1000000.0),
        0.7,
        12,
    ),
    "qwen2_tiny_tied": (
        "qwen2",
        dict(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=10000.0),
        1.0,
        21,
    ),
    "qwen2_tiny_gqa_untied": (
        "qwen2",
        dict(num_key_value_heads=1, tie_word_embeddings=False, rope_theta=1000000.0),
        0.7,
        22,
    ),
    "llama_tiny_tied": (
        "llama",
        dict(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=10000.0, attention_bias=False),
        1.0,
        31,
    ),
    "llama_tiny_gqa_untied": (
        "llama",
        dict(
            num_key_value_heads=1,
            tie_word_embeddings=False,
            attention_bias=True,
            rope_theta=1000000.0,
            # Llama 3.1 rotary scaling shrunk to the tiny model: with head_dim 16 and theta 1e6 the
            # wavelengths 2*pi*theta^(2i/16) are 6.3, 35, 199 (kept, below 2048/4), 1117
            # (interpolated, between 2048/4 and 2048) and 6283 and up (divided by the factor); see
            # `llama3_bands`. Adjacent wavelengths are 1e6^(1/8) = 5.6x apart, more than the 4x
            # width of the interpolated band, so that band holds at most one frequency.
            rope=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=2048,
            ),
            max_position_embeddings=16384,
        ),
        0.7,
        32,
    ),
}
# (prompt length, response length) of the golden pairs.
PAIRS = [(5, 7), (3, 1), (9, 4), (1, 6)]
ADAMW = dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def config(arch, overrides):
    base = dict(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        head_dim=16,
        rms_norm_eps=1e-6,
        max_position_embeddings=128,
        initializer_range=0.1,
        attn_implementation="eager",
    )
    if arch == "qwen2":
        # Qwen2 derives the head width from hidden_size / num_attention_heads (here 8).
        del base["head_dim"]
    base.update(overrides)
    theta = base.pop("rope_theta")
    rope = dict(base.pop("rope", {"rope_type": "default"}))
    rope_type = rope.pop("rope_type")
    cfg = ARCHS[arch][0](**base, rope_parameters={"rope_type": rope_type, "rope_theta": theta, **rope})
    cfg._attn_implementation = "eager"
    return cfg


# --- float64 patches of the three places transformers forces float32 ---------------------------

def rms_norm_forward(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def rotary_forward(self, x, position_ids):
    inv_freq = self.inv_freq_f64.to(x.device)
    freqs = position_ids[..., None].to(torch.float64) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def repeat_kv(x, n_rep):
    b, h, t, d = x.shape
    return x if n_rep == 1 else x[:, :, None].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1)
    attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()
    return attn_output, attn_weights


class Float64Patches:
    """Context manager running transformers' model of `arch` fully in the model dtype."""

    def __init__(self, arch):
        _, _, self.module, norm, rotary = ARCHS[arch]
        self.norm, self.rotary = getattr(self.module, norm), getattr(self.module, rotary)

    def __enter__(self):
        self.saved = (self.norm.forward, self.rotary.forward, self.module.eager_attention_forward)
        self.norm.forward = rms_norm_forward
        self.rotary.forward = rotary_forward
        self.module.eager_attention_forward = eager_attention_forward

    def __exit__(self, *exc):
        self.norm.forward, self.rotary.forward, self.module.eager_attention_forward = self.saved


def default_inv_freq_f64(cfg):
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    theta = cfg.rope_parameters["rope_theta"]
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def llama3_bands(cfg):
    """(wavelength before scaling, band) of each rotary frequency of a `llama3` config, the band
    being "kept", "interpolated" or "divided" (by the factor)."""
    rope = cfg.rope_parameters
    old_context_len = rope["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / rope["low_freq_factor"]
    high_freq_wavelen = old_context_len / rope["high_freq_factor"]
    wavelen = (2 * math.pi / default_inv_freq_f64(cfg)).tolist()
    return [
        (w, "kept" if w < high_freq_wavelen else "divided" if w > low_freq_wavelen else "interpolated")
        for w in wavelen
    ]


def inv_freq_f64(cfg):
    """The rotary inverse frequencies in float64: transformers' default and `llama3` (Llama 3.1)
    computations (`modeling_rope_utils`), which it runs in float32."""
    rope = cfg.rope_parameters
    inv_freq = default_inv_freq_f64(cfg)
    if rope["rope_type"] == "default":
        return inv_freq
    assert rope["rope_type"] == "llama3", rope
    factor = rope["factor"]
    low_freq_factor = rope["low_freq_factor"]
    high_freq_factor = rope["high_freq_factor"]
    old_context_len = rope["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def load_f64(arch, path):
    model = ARCHS[arch][1].from_pretrained(path, dtype=torch.float64, attn_implementation="eager")
    return set_inv_freq_f64(model)


def set_inv_freq_f64(model):
    """Gives the model's rotary embedding the float64 inverse frequencies `rotary_forward` uses."""
    rotary = model.model.rotary_emb
    assert rotary.attention_scaling == 1.0, rotary.attention_scaling
    inv64 = inv_freq_f64(model.config)
    # transformers' own inverse frequencies, computed in float32: equal up to float32 rounding
    # (within two units in the last place; in practice within one).
    inv32 = rotary.original_inv_freq.to(torch.float64)
    rel = ((inv64 - inv32).abs() / inv64).max().item()
    assert rel < 2.0**-22, f"float64 inverse frequencies differ from transformers' by {rel:.2e} (relative)"
    rotary.inv_freq_f64 = inv64
    return model


def sequence_logprobs(model, prompt, response, temperature):
    """Log-probs and entropies of the response tokens of one unpacked sequence."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0]
    p = len(prompt)
    z = logits[p - 1 : p - 1 + len(response)] / temperature
    logp = torch.log_softmax(z, dim=-1)
    lp = logp.gather(1, torch.tensor(response)[:, None])[:, 0]
    ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


def all_logprobs(model, pairs, temperature):
    lps, ents = [], []
    for prompt, response in pairs:
        lp, ent = sequence_logprobs(model, prompt, response, temperature)
        lps.append(lp)
        ents.append(ent)
    return lps, ents


def weighted_backward(model, pairs, weights, temperature):
    lps, _ = all_logprobs(model, pairs, temperature)
    flat = torch.cat(lps)
    (flat * torch.tensor(weights, dtype=flat.dtype)).sum().backward()


def generate(names):
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name in names or MODELS:
        arch, overrides, temperature, seed = MODELS[name]
        model_class = ARCHS[arch][1]
        torch.manual_seed(seed)
        cfg = config(arch, overrides)
        model = model_class(cfg).to(torch.float32)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "norm" in pname:
                    p.copy_(1.0 + 0.2 * torch.randn_like(p))
                elif pname.endswith(".bias"):
                    p.copy_(0.1 * torch.randn_like(p))
        out = FIXTURES / name
        model.save_pretrained(out, safe_serialization=True)
        gen = torch.Generator().manual_seed(seed + 100)
        pairs = [
            (
                torch.randint(0, cfg.vocab_size, (p,), generator=gen).tolist(),
                torch.randint(0, cfg.vocab_size, (r,), generator=gen).tolist(),
            )
            for p, r in PAIRS
        ]
        n_tokens = sum(r for _, r in PAIRS)
        weights = torch.randn(n_tokens, generator=gen, dtype=torch.float64).tolist()
        weights2 = torch.randn(n_tokens, generator=gen, dtype=torch.float64).tolist()

        # Semantics check: unpatched float32 transformers against the float64 golden values.
        model32 = model_class.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
        with torch.no_grad():
            lp32, _ = all_logprobs(model32, pairs, temperature)

        with Float64Patches(arch):
            model64 = load_f64(arch, out)
            rope = model64.config.rope_parameters
            if rope["rope_type"] == "llama3":
                bands = llama3_bands(model64.config)
                ratio = (inv_freq_f64(model64.config) / default_inv_freq_f64(model64.config)).tolist()
                print(f"{name}: llama3 bands (wavelength before scaling, band, scaled / unscaled frequency)")
                for (w, b), r in zip(bands, ratio):
                    print(f"    {w:12.1f}  {b:12s}  {r:.6f}")
                assert {b for _, b in bands} == {"kept", "interpolated", "divided"}, bands
            with torch.no_grad():
                lps, ents = all_logprobs(model64, pairs, temperature)
            if rope["rope_type"] == "llama3":
                # The pairs must tell the scaled rotary embedding from the unscaled one.
                rotary = model64.model.rotary_emb
                rotary.inv_freq_f64 = default_inv_freq_f64(model64.config)
                with torch.no_grad():
                    unscaled, _ = all_logprobs(model64, pairs, temperature)
                rotary.inv_freq_f64 = inv_freq_f64(model64.config)
                moved = max((a - b).abs().max().item() for a, b in zip(unscaled, lps))
                print(f"{name}: without the llama3 scaling the log-probs move by up to {moved:.2e}")
                assert moved > 1e-4, moved
            diff = max((a.double() - b).abs().max().item() for a, b in zip(lp32, lps))
            assert diff < 1e-5, f"float32 transformers differs from the float64 golden by {diff}"
            model64.zero_grad()
            weighted_backward(model64, pairs, weights, temperature)
            grads = {n: p.grad.detach().clone() for n, p in model64.named_parameters()}
            grad_norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
            save_file(grads, str(FIXTURES / f"{name}.grads.safetensors"), metadata={"format": "pt"})

            # Two AdamW steps with clipping: the first step's norm is above the threshold.
            max_norm = 0.5 * grad_norm
            opt = torch.optim.AdamW(model64.parameters(), **ADAMW)
            norms = []
            for w in (weights, weights2):
                opt.zero_grad()
                weighted_backward(model64, pairs, w, temperature)
                norms.append(float(torch.nn.utils.clip_grad_norm_(model64.parameters(), max_norm)))
                opt.step()
            final = {n: p.detach().clone() for n, p in model64.named_parameters()}
            save_file(final, str(FIXTURES / f"{name}.adamw.safetensors"), metadata={"format": "pt"})

        golden = {
            "generator": f"scripts/golden_model.py (torch {torch.__version__}, transformers {transformers.__version__})",
            "temperature": temperature,
            "pairs": [{"prompt": p, "response": r} for p, r in pairs],
            "weights": weights,
            "logprobs": [lp.tolist() for lp in lps],
            "entropy": [e.tolist() for e in ents],
            "grad_norm": grad_norm,
            "adamw": {
                "lr": ADAMW["lr"],
                "beta1": ADAMW["betas"][0],
                "beta2": ADAMW["betas"][1],
                "eps": ADAMW["eps"],
                "weight_decay": ADAMW["weight_decay"],
                "max_grad_norm": max_norm,
                "weights_step2": weights2,
                "grad_norms": norms,
            },
        }
        (FIXTURES / f"{name}.golden.json").write_text(json.dumps(golden, indent=1) + "\n")
        print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters, grad norm {grad_norm:.6g}, "
              f"float32 transformers vs float64 golden {diff:.2e}")


def check_rust_save():
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, RLREPLAY_EXPORT_DIR=tmp)
        subprocess.run(
            ["cargo", "test", "-p", "rlreplay-model", "--test", "it", "--", "golden::hf_export", "--exact"],
            cwd=ROOT, env=env, check=True,
        )
        worst = 0.0
        for name in MODELS:
            exported = Path(tmp) / name
            rust = json.loads((exported / "rust_logprobs.json").read_text())
            golden = json.loads((FIXTURES / f"{name}.golden.json").read_text())
            pairs = [(p["prompt"], p["response"]) for p in golden["pairs"]]
            model = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32, attn_implementation="eager")
            with torch.no_grad():
                lps, _ = all_logprobs(model, pairs, golden["temperature"])
            diff = max(
                (lp.double() - torch.tensor(r, dtype=torch.float64)).abs().max().item()
                for lp, r in zip(lps, rust["logprobs"])
            )
            moved = max(
                abs(a - b) for lp, g in zip(rust["logprobs"], golden["logprobs"]) for a, b in zip(lp, g)
            )
            print(f"{name}: transformers on the Rust-saved checkpoint vs Rust: max |dlogp| = {diff:.2e} "
                  f"(the AdamW step moved log-probs by up to {moved:.2e})")
            worst = max(worst, diff)
        if worst > 1e-4:
            sys.exit(f"FAILED: transformers and Rust disagree by {worst}")
        print("OK")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "generate":
        generate(sys.argv[2:])
    elif cmd == "check-rust-save":
        check_rust_save()
    else:
        sys.exit(__doc__)
