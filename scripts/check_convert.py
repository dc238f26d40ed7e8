#!/usr/bin/env python3
"""Checks a directory written by `rlreplay convert` against transformers' own GGUF loader.

Loads the converted directory with `AutoTokenizer` / `AutoModelForCausalLM.from_pretrained(DIR)`
and the GGUF file with `from_pretrained(GGUF_DIR, gguf_file=NAME)`, then compares:

  1. token ids of varied text (digits, unicode, whitespace runs, special tokens, LaTeX, code),
     and the chat template's rendering;
  2. every weight (transformers' dequantization against the converter's);
  3. the logits of a chat prompt, in float32: they must agree to float rounding.

Exits 1 when anything differs.

Setup: a Python with torch, transformers, gguf and accelerate (transformers' GGUF loader needs
accelerate), e.g.

    python3 -m venv .venv/check && .venv/check/bin/pip install torch transformers gguf accelerate

Usage:

    scripts/install-smollm2.sh                      # or: rlreplay convert FILE.gguf --out DIR
    .venv/check/bin/python scripts/check_convert.py \\
        .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2-135m-instruct
"""

import argparse
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

TEXTS = [
    "What is 7 + 5? Put the final answer in \\boxed{}.",
    "12345 + 67890 = 80235; 3.14159, 1e-10, 2^{64}",
    "naïve café — Ελληνικά, русский, 日本語, 한국어, emoji 🤖🎉",
    "  leading spaces, two  spaces,   three,\ttab\t\tand\n\nnew lines\r\n  \n",
    "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><repo_name>x<file_sep>y<jupyter_code>",
    "\\frac{a}{b} + \\sqrt{x^2 + y^2} = \\int_0^\\infty e^{-t}\\,dt",
    "def f(x):\n    return x ** 2  # it's, we'll, I'm, they've, you'd",
    "",
    " ",
]


def load(converted, gguf):
    gguf_dir, gguf_name = os.path.split(os.path.abspath(gguf))
    tok = AutoTokenizer.from_pretrained(converted)
    ref_tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    model = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32)
    return tok, ref_tok, model.eval(), ref.eval()


def check_tokenizers(tok, ref_tok):
    ok = True
    print(f"converted pre-tokenizer: {tok.backend_tokenizer.pre_tokenizer}")
    print(f"reference pre-tokenizer: {ref_tok.backend_tokenizer.pre_tokenizer}")
    for text in TEXTS:
        ids = tok(text, add_special_tokens=True)["input_ids"]
        ref_ids = ref_tok(text, add_special_tokens=True)["input_ids"]
        same = ids == ref_ids
        back = tok.decode(ids) == text
        ok &= same and back
        print(f"  {'ok ' if same and back else 'BAD'} {len(ids):3d} ids  {text[:50]!r}")
        if not same:
            print(f"      converted {ids}\n      reference {ref_ids}")
        if not back:
            print(f"      decodes to {tok.decode(ids)!r}")
    for name in ["bos_token", "eos_token", "pad_token", "unk_token"]:
        mine, theirs = getattr(tok, name), getattr(ref_tok, name)
        ok &= mine == theirs
        print(f"  {'ok ' if mine == theirs else 'BAD'} {name}: {mine!r} (reference {theirs!r})")
    messages = [{"role": "user", "content": "What is 7 + 5?"}]
    chat = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ref_chat = ref_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ok &= chat == ref_chat
    print(f"  {'ok ' if chat == ref_chat else 'BAD'} chat template renders {chat!r}")
    return ok


def check_weights(model, ref):
    ok = True
    mine = model.state_dict()
    theirs = ref.state_dict()
    if sorted(mine) != sorted(theirs):
        print(f"  BAD weight names differ: {sorted(set(mine) ^ set(theirs))[:10]}")
        return False
    worst = max(((mine[k] - theirs[k]).abs().max().item(), k) for k in mine)
    ok = worst[0] <= 1e-6
    print(f"  {'ok ' if ok else 'BAD'} {len(mine)} weights, largest difference {worst[0]:.3g} ({worst[1]})")
    return ok


def check_logits(tok, model, ref):
    messages = [{"role": "user", "content": "What is 7 + 5? Put the final answer in \\boxed{}."}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    if not torch.is_tensor(ids):
        ids = ids["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits[0]
        ref_logits = ref(ids).logits[0]
    diff = (logits - ref_logits).abs().max().item()
    scale = ref_logits.abs().max().item()
    same_argmax = bool((logits.argmax(-1) == ref_logits.argmax(-1)).all())
    ok = diff <= 1e-4 * max(scale, 1.0) and same_argmax
    top = tok.convert_ids_to_tokens(logits[-1].topk(5).indices.tolist())
    print(f"  {'ok ' if ok else 'BAD'} logits of {ids.shape[1]} positions: largest difference {diff:.3g} "
          f"(largest logit {scale:.3g}), argmax equal: {same_argmax}; next token top 5: {top}")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf", help="the GGUF file")
    parser.add_argument("converted", help="the directory rlreplay convert wrote")
    args = parser.parse_args()
    tok, ref_tok, model, ref = load(args.converted, args.gguf)
    print("tokenizer:")
    ok = check_tokenizers(tok, ref_tok)
    print("weights:")
    ok &= check_weights(model, ref)
    print("logits:")
    ok &= check_logits(tok, model, ref)
    print("all agree" if ok else "DIFFERENCES FOUND")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
