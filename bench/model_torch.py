"""PyTorch eager side of bench/model.sh: forward and forward+backward time of a randomly
initialised transformers Qwen3ForCausalLM (eager attention, float32, CPU) on the same shapes as
the rlreplay bench (`cargo bench -p rlreplay-model --bench model`).

Usage: python bench/model_torch.py {tiny|small} [THREADS] [ITERS]
The objective is the mean next-token log-prob of every position, as on the Rust side.
"""

import statistics
import sys
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

BATCH, SEQ_LEN = 4, 256

CONFIGS = {
    "tiny": dict(vocab_size=512, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    "small": dict(vocab_size=151_936, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=128),
}


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "tiny"
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    iters = int(sys.argv[3]) if len(sys.argv) > 3 else (5 if name == "tiny" else 2)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = Qwen3Config(**CONFIGS[name], rms_norm_eps=1e-6, rope_theta=1_000_000.0,
                      tie_word_embeddings=True, max_position_embeddings=4096,
                      attn_implementation="eager")
    model = Qwen3ForCausalLM(cfg).float().train()
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ_LEN))

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
    tokens = BATCH * SEQ_LEN
    print(f"torch config={name} threads={threads} tokens={tokens} fwd_ms={f:.1f} "
          f"fwd_bwd_ms={fb:.1f} fwd_bwd_tok_s={tokens / fb * 1e3:.0f}")


if __name__ == "__main__":
    main()
