"""llama.cpp (llama-cpp-python, built from its source distribution) sampling one sequence from a
GGUF file as bench/generate.sh samples: random prompt ids, then new tokens at temperature 1 and
top-p 0.95 with no stop ids. Prints one JSON line with tokens/s and the process CPU time of the
timed call (prompt and new tokens, as generate_bench and generate_hf.py time theirs).

Usage: .venv/torch/bin/python bench/generate_llamacpp.py MODEL.gguf [prompt_len=32] [new_tokens=128] [threads=2]
"""
import json
import random
import sys
import time

from llama_cpp import Llama


def main():
    path = sys.argv[1]
    prompt_len, new_tokens, threads = (int(a) for a in (sys.argv[2:5] + ["32", "128", "2"][len(sys.argv) - 2:]))
    llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=512, n_batch=512,
                seed=0, verbose=False)
    rng = random.Random(0)
    ids = [rng.randrange(3, llm.n_vocab()) for _ in range(prompt_len)]
    c0, t0 = time.process_time(), time.perf_counter()
    n = 0
    for _ in llm.generate(ids, temp=1.0, top_p=0.95, top_k=0, reset=True):
        n += 1
        if n == new_tokens:
            break
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"engine": "llama.cpp", "model": path, "batch": 1, "threads": threads,
                      "tokens": n, "seconds": secs, "tokens_per_s": n / secs, "cpu_seconds": cpu}))


if __name__ == "__main__":
    main()
