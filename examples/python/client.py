#!/usr/bin/env python3
"""Stream a generation from a zinfer router using only pyzmq and msgpack.

    pip install pyzmq msgpack
    python3 examples/python/client.py --router tcp://127.0.0.1:5555 "Tell me a joke"

The text streams to stdout; a one-line summary (finish reason, token counts,
time to first token) goes to stderr. The wire protocol is in docs/protocol.md.
"""

import argparse
import sys
import time
import uuid

import msgpack
import zmq


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt")
    parser.add_argument("--router", default="tcp://127.0.0.1:5555")
    parser.add_argument("--chat", action="store_true", help="send the prompt as a chat message")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each reply")
    args = parser.parse_args()

    request = {
        "type": "generate",
        "id": uuid.uuid4().hex,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "stream": True,
    }
    if args.chat:
        request["messages"] = [{"role": "user", "content": args.prompt}]
    else:
        request["prompt"] = args.prompt

    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(args.router)
    started = time.monotonic()
    first_token = None
    socket.send(msgpack.packb(request))

    while True:
        if not socket.poll(int(args.timeout * 1000)):
            print(f"no reply from {args.router} in {args.timeout} s", file=sys.stderr)
            return 1
        reply = msgpack.unpackb(socket.recv())
        kind = reply["type"]
        if kind == "chunk":
            if first_token is None:
                first_token = time.monotonic() - started
            sys.stdout.write(reply["text"])
            sys.stdout.flush()
        elif kind == "done":
            usage = reply["usage"]
            print()
            print(
                f"finish_reason={reply['finish_reason']} "
                f"prompt_tokens={usage['prompt_tokens']} "
                f"cached_tokens={usage['cached_tokens']} "
                f"completion_tokens={usage['completion_tokens']} "
                f"ttft_s={first_token or 0:.3f} worker={reply['worker']}",
                file=sys.stderr,
            )
            return 0
        elif kind == "error":
            print(f"error {reply['code']}: {reply['message']}", file=sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main())
