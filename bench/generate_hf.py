"""transformers' `generate` on the model written by `generate_bench`: the same prompts
(regenerated from the same seed is not possible across languages, so random ids of the same
shape), batch, lengths and sampling settings (temperature 1, top-p 0.95, no stop ids).
Prints one JSON line with tokens/s and the process CPU time (user + system, all threads) of the
timed call."""
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM

model_dir = sys.argv[1]
batch, prompt_len, new_tokens = (int(a) for a in sys.argv[2:5])
threads = int(sys.argv[5]) if len(sys.argv) > 5 else 2
torch.set_num_threads(threads)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
vocab = model.config.vocab_size
ids = torch.randint(0, vocab, (batch, prompt_len))
mask = torch.ones_like(ids)
kwargs = dict(
    do_sample=True,
    temperature=1.0,
    top_p=0.95,
    top_k=0,
    eos_token_id=None,
    pad_token_id=0,
    attention_mask=mask,
)
with torch.inference_mode():
    model.generate(ids[:1], max_new_tokens=4, min_new_tokens=4, **{**kwargs, "attention_mask": mask[:1]})
    start, cpu_start = time.perf_counter(), time.process_time()
    out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)
    secs, cpu = time.perf_counter() - start, time.process_time() - cpu_start
tokens = (out.shape[1] - prompt_len) * batch
print(json.dumps({"impl": "transformers", "batch": batch, "prompt_len": prompt_len,
                  "new_tokens": new_tokens, "tokens": tokens, "seconds": round(secs, 4),
                  "cpu_seconds": round(cpu, 3),
                  "tokens_per_s": round(tokens / secs, 1), "threads": threads}))
