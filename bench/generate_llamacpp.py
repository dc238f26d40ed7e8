"""llama.cpp (llama-cpp-python, built from its source distribution) sampling from a GGUF file as
bench/generate.sh samples: BATCH sequences of random prompt ids decoded together (one llama_batch
per step, one sequence id each), then new tokens at temperature 1 and top-p 0.95 with no stop ids,
through llama.cpp's own sampler chain. Prints one JSON line with tokens/s and the process CPU time
of the timed part (prompt and new tokens, as generate_bench and generate_hf.py time theirs).

Usage: .venv/torch/bin/python bench/generate_llamacpp.py MODEL.gguf [batch=1] [prompt_len=32] [new_tokens=128] [threads=2]
"""
import json
import random
import sys
import time

import llama_cpp as L


def main():
    path = sys.argv[1]
    args = [int(a) for a in sys.argv[2:6]]
    batch, prompt_len, new_tokens, threads = args + [1, 32, 128, 2][len(args):]
    L.llama_backend_init()
    model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
    cp = L.llama_context_default_params()
    cp.n_ctx = batch * (prompt_len + new_tokens + 8)
    cp.n_batch = cp.n_ubatch = max(512, batch * prompt_len)
    cp.n_seq_max = batch
    cp.n_threads = cp.n_threads_batch = threads
    ctx = L.llama_init_from_model(model, cp)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    rng = random.Random(0)
    prompts = [[rng.randrange(3, n_vocab) for _ in range(prompt_len)] for _ in range(batch)]
    samplers = []
    for s in range(batch):
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_p(0.95, 1))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(1.0))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(s))
        samplers.append(chain)
    b = L.llama_batch_init(cp.n_batch, 0, 1)

    def fill(entries):
        for i, (tok, pos, seq, logits) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, logits
            b.seq_id[i][0] = seq
        b.n_tokens = len(entries)
        if L.llama_decode(ctx, b) != 0:
            raise SystemExit("llama_decode failed")

    c0, t0 = time.process_time(), time.perf_counter()
    fill([(t, p, s, p == prompt_len - 1) for s, ids in enumerate(prompts) for p, t in enumerate(ids)])
    rows = [s * prompt_len + prompt_len - 1 for s in range(batch)]
    n = 0
    for k in range(new_tokens):
        toks = [L.llama_sampler_sample(samplers[s], ctx, rows[s]) for s in range(batch)]
        n += batch
        if k + 1 == new_tokens:
            break
        fill([(t, prompt_len + k, s, True) for s, t in enumerate(toks)])
        rows = list(range(batch))
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"engine": "llama.cpp", "model": path, "batch": batch, "threads": threads,
                      "tokens": n, "seconds": secs, "tokens_per_s": n / secs, "cpu_seconds": cpu}))


if __name__ == "__main__":
    main()
