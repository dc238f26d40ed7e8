"""PyTorch eager side of bench/model.sh: forward and forward+backward time of a randomly
initialised transformers Qwen3ForCausalLM (eager attention, float32, CPU) on the same shapes as
the rlreplay bench (`cargo bench -p rlreplay-model --bench model`).

Usage: python bench/model_torch.py {tiny|small|gemm|DIR} [THREADS] [ITERS]
DIR is a Hugging Face model directory (the Rust side's `dir DIR`), loaded with
AutoModelForCausalLM in float32 with eager attention.
The objective is the mean next-token log-prob of every position, as on the Rust side. `gemm`
times torch.mm (f32) on the shapes of the Rust side's `gemm` mode instead.
"""

import os
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

BATCH, SEQ_LEN = 4, 256

CONFIGS = {
    "tiny": dict(vocab_size=512, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    "small": dict(vocab_size=151_936, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=128),
}


GEMM_SHAPES = [  # (name, m, k, n, a transposed, b transposed)
    ("square", 2048, 2048, 2048, False, False),
    ("x·Wt up/gate", 2048, 1024, 3072, False, True),
    ("x·Wt down", 2048, 3072, 1024, False, True),
    ("dy·W (grad x)", 2048, 3072, 1024, False, False),
    ("dyt·x (grad W)", 3072, 2048, 1024, True, False),
]


def gemm(threads, iters):
    for name, m, k, n, at, bt in GEMM_SHAPES:
        a = torch.rand(k, m).t() if at else torch.rand(m, k)
        b = torch.rand(n, k).t() if bt else torch.rand(k, n)
        out = torch.empty(m, n)
        best = float("inf")
        for _ in range(iters):
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            best = min(best, time.perf_counter() - t0)
        print(f"torch gemm f32 threads={threads} shape={name!r} m={m} k={k} n={n} "
              f"ms={best * 1e3:.1f} gflop_s={2 * m * k * n / best / 1e9:.1f}")


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "tiny"
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    if name == "gemm":
        torch.set_num_threads(threads)
        return gemm(threads, int(sys.argv[3]) if len(sys.argv) > 3 else 5)
    iters = int(sys.argv[3]) if len(sys.argv) > 3 else (5 if name == "tiny" else 2)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if name in CONFIGS:
        cfg = Qwen3Config(**CONFIGS[name], rms_norm_eps=1e-6, rope_theta=1_000_000.0,
                          tie_word_embeddings=True, max_position_embeddings=4096,
                          attn_implementation="eager")
        model = Qwen3ForCausalLM(cfg).float().train()
    else:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32,
                                                     attn_implementation="eager").train()
    batch, seq_len = BATCH, SEQ_LEN
    if name not in CONFIGS and os.environ.get("SHAPE"):
        batch, seq_len = (int(v) for v in os.environ["SHAPE"].split("x"))
    ids = torch.randint(0, model.config.vocab_size, (batch, seq_len))

    def objective():
        logits = model(input_ids=ids).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])
        return logp.mean()

    fwd, fwd_bwd = [], []
    for i in range(iters + 1):
        t0 = time.perf_counter()
        with torch.no_grad():
            objective()
        t1 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        objective().backward()
        t2 = time.perf_counter()
        if i > 0:
            fwd.append((t1 - t0) * 1e3)
            fwd_bwd.append((t2 - t1) * 1e3)
    f, fb = statistics.median(fwd), statistics.median(fwd_bwd)
    tokens = batch * seq_len
    print(f"torch config={name} threads={threads} tokens={tokens} fwd_ms={f:.1f} "
          f"fwd_bwd_ms={fb:.1f} fwd_bwd_tok_s={tokens / fb * 1e3:.0f}")


if __name__ == "__main__":
    main()
