#!/usr/bin/env python3
"""Golden fixtures for the model crate's LoRA adapters, computed with PEFT and transformers.

Setup:  scripts/setup-venv.sh torch torch==2.13.0 transformers==5.24.0 numpy safetensors peft==0.21.2

  .venv/torch/bin/python scripts/golden_lora.py generate [NAME...]
      For each adapter of ADAPTERS (or the ones named): loads its base checkpoint (a fixture of
      scripts/golden_model.py) in float32, puts a PEFT LoRA adapter on it (get_peft_model with the
      adapter's r, lora_alpha and target_modules, lora_dropout 0; lora_A as PEFT initialises it),
      sets lora_B to random values (PEFT initialises it to zero, which would make the adapter a
      no-op) and saves the adapter with save_pretrained (float32) under
      crates/rlreplay-model/tests/fixtures/lora/<name>/ (adapter_config.json with
      base_model_name_or_path set to the base fixture's directory, relative to the adapter's, and
      adapter_model.safetensors). Then, on the base fixture's pairs, temperature and per-token
      weights g, writes:
        lora/<name>.golden.json        the base's name, pairs, temperature, g, golden per-token
                                       log-probs and entropies with the adapter, and how far the
                                       adapter moves the log-probs from the base's
        lora/<name>.grads.safetensors  float64 gradients of sum(g * logprob) for every lora_A and
                                       lora_B, by PEFT key (the base weights are frozen)
      Golden values are computed in float64 (golden_model.py's float64 patches, the adapter loaded
      with PeftModel.from_pretrained onto the float64 base) on the saved float32 weights; the
      float32 PEFT model is checked against them.

  .venv/torch/bin/python scripts/golden_lora.py check-rust-save
      Runs the Rust test `lora::peft_export` (crates/rlreplay-model/tests/it/lora.rs) with
      RLREPLAY_EXPORT_DIR set: Rust puts seeded adapters on each base fixture, takes one AdamW
      step, saves them with save_adapter and writes its own log-probs of the base's pairs. This
      script loads every exported adapter with PeftModel.from_pretrained onto the base, unchanged,
      and checks its log-probs against Rust's.

  .venv/torch/bin/python scripts/golden_lora.py check-checkpoint BASE ADAPTER [RLREPLAY]
      A LoRA checkpoint of a training run (ADAPTER, e.g. RUN/checkpoints/last) on its base model
      directory BASE: loads the base with transformers (float32, eager attention) and the adapter
      with PeftModel.from_pretrained, unchanged, and checks the log-probs of a few token pairs
      against `RLREPLAY logprobs --model BASE --adapter ADAPTER` (RLREPLAY defaults to
      target/release/rlreplay).
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import peft
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from golden_model import ARCHS, FIXTURES, ROOT, Float64Patches, all_logprobs, load_f64, weighted_backward  # noqa: E402

LORA = FIXTURES / "lora"

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
ADAPTERS = {
    # name: (base fixture, architecture, LoraConfig arguments, seed)
    "qwen3_tied_attn": ("tiny_tied", "qwen3", dict(r=4, lora_alpha=8, target_modules=ATTENTION), 41),
    "qwen3_untied_all": ("tiny_gqa_untied", "qwen3", dict(r=2, lora_alpha=5, target_modules="all-linear"), 42),
    "qwen2_untied_mixed": (
        "qwen2_tiny_gqa_untied",
        "qwen2",
        dict(r=3, lora_alpha=6, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"]),
        43,
    ),
    "llama_untied_all": ("llama_tiny_gqa_untied", "llama", dict(r=4, lora_alpha=16, target_modules="all-linear"), 44),
    "llama_tied_attn": ("llama_tiny_tied", "llama", dict(r=2, lora_alpha=3, target_modules=["q_proj", "o_proj"]), 45),
}


def base_golden(base):
    g = json.loads((FIXTURES / f"{base}.golden.json").read_text())
    return [(p["prompt"], p["response"]) for p in g["pairs"]], g["temperature"], g["weights"]


def peft_key(name):
    """PEFT's file key of a parameter name of the PeftModel (the adapter name dropped)."""
    return name.replace(".default.", ".")


def max_diff(a, b):
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b))


def generate(names):
    LORA.mkdir(parents=True, exist_ok=True)
    for name in names or ADAPTERS:
        base, arch, lora_args, seed = ADAPTERS[name]
        base_dir = FIXTURES / base
        pairs, temperature, weights = base_golden(base)
        torch.manual_seed(seed)
        model32 = ARCHS[arch][1].from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
        peft32 = get_peft_model(model32, LoraConfig(task_type="CAUSAL_LM", lora_dropout=0.0, **lora_args))
        with torch.no_grad():
            for n, p in peft32.named_parameters():
                if "lora_B" in n:
                    p.copy_(0.1 * torch.randn_like(p))
        out = LORA / name
        peft32.save_pretrained(out)
        (out / "README.md").unlink(missing_ok=True)  # PEFT's model card template
        config_path = out / "adapter_config.json"
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = f"../../{base}"
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        with torch.no_grad():
            lp32, _ = all_logprobs(peft32, pairs, temperature)

        with Float64Patches(arch):
            model64 = load_f64(arch, base_dir)
            with torch.no_grad():
                base_lps, _ = all_logprobs(model64, pairs, temperature)
            peft64 = PeftModel.from_pretrained(model64, out, is_trainable=True)
            lora_params = {n: p for n, p in peft64.named_parameters() if p.requires_grad}
            assert lora_params and all("lora_" in n for n in lora_params), sorted(lora_params)
            assert all(p.dtype == torch.float64 for p in lora_params.values())
            with torch.no_grad():
                lps, ents = all_logprobs(peft64, pairs, temperature)
            moved = max_diff(lps, base_lps)
            assert moved > 1e-3, f"{name}: the adapter moves the log-probs by only {moved}"
            diff = max_diff(lp32, lps)
            assert diff < 1e-5, f"{name}: float32 PEFT differs from the float64 golden by {diff}"
            peft64.zero_grad()
            weighted_backward(peft64, pairs, weights, temperature)
            grads = {peft_key(n): p.grad.detach().clone() for n, p in lora_params.items()}
            assert all(p.grad is None for p in peft64.parameters() if not p.requires_grad)
            save_file(grads, str(LORA / f"{name}.grads.safetensors"), metadata={"format": "pt"})

        golden = {
            "generator": f"scripts/golden_lora.py (torch {torch.__version__}, transformers "
            f"{transformers.__version__}, peft {peft.__version__})",
            "base": base,
            "temperature": temperature,
            "pairs": [{"prompt": p, "response": r} for p, r in pairs],
            "weights": weights,
            "logprobs": [lp.tolist() for lp in lps],
            "entropy": [e.tolist() for e in ents],
            "moved": moved,
        }
        (LORA / f"{name}.golden.json").write_text(json.dumps(golden, indent=1) + "\n")
        print(f"{name}: {sum(p.numel() for p in lora_params.values())} adapter parameters, the adapter "
              f"moves log-probs by {moved:.2e}, float32 PEFT vs float64 golden {diff:.2e}")


def check_rust_save():
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, RLREPLAY_EXPORT_DIR=tmp)
        subprocess.run(
            ["cargo", "test", "-p", "rlreplay-model", "--test", "it", "--", "lora::peft_export", "--exact"],
            cwd=ROOT, env=env, check=True,
        )
        worst = 0.0
        for name, (base, arch, _, _) in ADAPTERS.items():
            exported = Path(tmp) / name
            rust = json.loads((exported / "rust_logprobs.json").read_text())
            pairs, temperature, _ = base_golden(base)
            model = ARCHS[arch][1].from_pretrained(FIXTURES / base, dtype=torch.float32, attn_implementation="eager")
            model = PeftModel.from_pretrained(model, exported)
            with torch.no_grad():
                lps, _ = all_logprobs(model, pairs, temperature)
            diff = max(
                (lp.double() - torch.tensor(r, dtype=torch.float64)).abs().max().item()
                for lp, r in zip(lps, rust["logprobs"])
            )
            print(f"{name}: PEFT on the Rust-saved adapter vs Rust: max |dlogp| = {diff:.2e}")
            worst = max(worst, diff)
        if worst > 1e-4:
            sys.exit(f"FAILED: PEFT and Rust disagree by {worst}")
        print("OK")


def check_checkpoint(base, adapter, binary):
    cfg = json.loads((Path(base) / "config.json").read_text())
    arch = cfg["model_type"]
    vocab = cfg["vocab_size"]
    gen = torch.Generator().manual_seed(0)
    pairs = [
        (torch.randint(0, vocab, (n,), generator=gen).tolist(), torch.randint(0, vocab, (m,), generator=gen).tolist())
        for n, m in [(12, 20), (30, 7), (5, 40), (64, 64)]
    ]
    model = ARCHS[arch][1].from_pretrained(base, dtype=torch.float32, attn_implementation="eager")
    model = PeftModel.from_pretrained(model, adapter)
    with torch.no_grad():
        lps, _ = all_logprobs(model, pairs, 1.0)
    with tempfile.TemporaryDirectory() as tmp:
        inp = Path(tmp) / "pairs.jsonl"
        inp.write_text("".join(json.dumps({"prompt_token_ids": p, "response_token_ids": r}) + "\n" for p, r in pairs))
        out = subprocess.run(
            [binary, "logprobs", "--model", base, "--adapter", adapter, "--input", str(inp)],
            check=True, capture_output=True, text=True,
        ).stdout
    rust = [json.loads(line)["logprobs"] for line in out.splitlines()]
    diff = max((lp.double() - torch.tensor(r, dtype=torch.float64)).abs().max().item() for lp, r in zip(lps, rust))
    print(f"PEFT on {adapter} over {base} vs rlreplay --adapter: max |dlogp| = {diff:.2e} ({len(pairs)} pairs)")
    if diff > 1e-4:
        sys.exit(f"FAILED: PEFT and rlreplay disagree by {diff}")
    print("OK")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "generate":
        generate(sys.argv[2:])
    elif cmd == "check-rust-save":
        check_rust_save()
    elif cmd == "check-checkpoint" and len(sys.argv) in (4, 5):
        binary = sys.argv[4] if len(sys.argv) == 5 else str(ROOT / "target/release/rlreplay")
        check_checkpoint(sys.argv[2], sys.argv[3], binary)
    else:
        sys.exit(__doc__)
