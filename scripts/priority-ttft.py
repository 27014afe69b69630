"""Time to first token of one high-priority request behind many
low-priority streams, medians.

Usage: priority-ttft.py BASE_URL STREAMS [RUNS]   (a `zinfer serve --http`
on the default model; run it from the openai venv: scripts/test-venv.sh openai)

Each run starts STREAMS streamed completions at priority 0 (200 tokens,
EOS ignored), waits until a full batch of them streams, then sends one at priority 10
(`max_tokens` 1) and times its response; then cancels the rest.
"""

import asyncio
import statistics
import sys
import time

import openai

base_url, streams = sys.argv[1], int(sys.argv[2])
# The worker's default --max-batch: how many of the streams run at once.
RUNNING = 32
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 3


async def one_run(client, model):
    started = asyncio.Event()
    first = [0]

    async def low(i):
        stream = await client.completions.create(
            model=model, prompt=f"Story {i}: once upon a time", max_tokens=200, stream=True,
            temperature=1.0, extra_body={"priority": 0, "ignore_eos": True})
        async for _ in stream:
            first[0] += 1
            if first[0] >= min(streams, RUNNING):
                started.set()
            break
        async for _ in stream:
            pass

    tasks = [asyncio.create_task(low(i)) for i in range(streams)]
    try:
        await asyncio.wait_for(started.wait(), 120)
    except asyncio.TimeoutError:
        pass  # some are queued behind the batch: that is the point
    begin = time.perf_counter()
    await client.completions.create(model=model, prompt="Urgent: reply now.", max_tokens=1,
                                    extra_body={"priority": 10})
    ttft = time.perf_counter() - begin
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(1)
    return ttft


async def main():
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    model = (await client.models.list()).data[0].id
    times = [await one_run(client, model) for _ in range(runs)]
    print(f"{streams} low-priority streams, {runs} runs: high-priority TTFT median "
          f"{statistics.median(times) * 1000:.0f} ms ({', '.join(f'{t * 1000:.0f}' for t in times)})")


asyncio.run(main())
