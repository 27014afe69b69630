#!/usr/bin/env python3
"""Ask a zinfer router a question with the zinfer_client module.

    pip install pyzmq msgpack
    python3 clients/python/example.py --router tcp://127.0.0.1:5555 "Give me three tips for staying healthy."

Prints the models, streams the answer to stdout, then a summary line
(finish reason, token counts, time to first token) to stderr.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zinfer_client import Client, ZinferError  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt")
    parser.add_argument("--router", default=os.environ.get("ZINFER_ROUTER", "tcp://127.0.0.1:5555"))
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--raw", action="store_true", help="complete the prompt as is, no chat template")
    args = parser.parse_args()

    try:
        with Client(args.router, timeout=120) as client:
            for model in client.models():
                print(f"model: {model['name']} ({model['workers']} worker(s))", file=sys.stderr)
            if args.raw:
                stream = client.stream(args.prompt, max_tokens=args.max_tokens, temperature=args.temperature)
            else:
                messages = [{"role": "user", "content": args.prompt}]
                stream = client.stream(messages=messages, max_tokens=args.max_tokens, temperature=args.temperature)
            started = time.monotonic()
            first = None
            for chunk in stream:
                if first is None:
                    first = time.monotonic() - started
                print(chunk.text, end="", flush=True)
            print()
            done = stream.result
            print(
                f"finish_reason={done.finish_reason} prompt_tokens={done.usage['prompt_tokens']} "
                f"cached_tokens={done.usage['cached_tokens']} completion_tokens={done.usage['completion_tokens']} "
                f"ttft_s={first or 0:.3f} worker={done.worker}",
                file=sys.stderr,
            )
    except ZinferError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
