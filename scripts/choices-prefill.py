"""Prefill cost of `n` choices: the time to every choice's first token
for a fresh prompt of about 1,000 tokens, n=1 against n=4, medians.

Usage: choices-prefill.py BASE_URL [RUNS]   (a `zinfer serve --http` on
the default model; run it from the openai venv: scripts/test-venv.sh openai)

Each run uses a prompt no earlier run shares (a fresh first line), asks
for one token per choice, and alternates n=1 and n=4 so drift hits both.
"""

import statistics
import sys
import time
import uuid

import openai

base_url = sys.argv[1]
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 7
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
model = client.models.list().data[0].id
body = " ".join(f"Item {i} is a line of the inventory that the clerk checks." for i in range(80))


def timed(n):
    prompt = f"{uuid.uuid4().hex}\n{body}\nSummary:"
    start = time.perf_counter()
    response = client.completions.create(model=model, prompt=prompt, max_tokens=1, n=n,
                                         temperature=1.0, seed=1)
    elapsed = time.perf_counter() - start
    assert len(response.choices) == n, response
    return elapsed, response.usage.prompt_tokens


timed(1)  # warm
times = {1: [], 4: []}
for _ in range(runs):
    for n in (1, 4):
        elapsed, prompt_tokens = timed(n)
        times[n].append(elapsed)
one, four = statistics.median(times[1]), statistics.median(times[4])
print(f"prompt {prompt_tokens} tokens, {runs} runs each: n=1 {one * 1000:.0f} ms, "
      f"n=4 {four * 1000:.0f} ms, ratio {four / one:.3f}")
