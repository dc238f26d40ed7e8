"""How far bf16 weights move a model's log-probs: the f32 model's log-probs of random tokens
against the same model with every weight rounded to bf16 (computed in f32), as a sampler that
streamed bf16 weights would see them. Prints the largest and the mean |difference|.

Usage: .venv/torch/bin/python bench/bf16_logprobs.py MODEL_DIR   (for example
models/smollm2-135m-instruct)
"""
import sys

import torch
from transformers import AutoModelForCausalLM


def main():
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
    ids = torch.randint(0, model.config.vocab_size, (4, 160))

    def logprobs():
        with torch.no_grad():
            logits = model(input_ids=ids).logits[:, :-1].float()
            return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]

    f32 = logprobs()
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16).to(torch.float32)
    d = (f32 - logprobs()).abs()
    print(f"bf16-rounded weights, f32 compute: max |dlogp| {d.max().item():.3e}, "
          f"mean {d.mean().item():.3e}, tokens {d.numel()}")


if __name__ == "__main__":
    main()
