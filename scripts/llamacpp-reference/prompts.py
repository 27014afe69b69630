#!/usr/bin/env python3
"""Token-id prompts for scripts/llamacpp-reference.sh, stdlib only.

    prompts.py FILE.gguf OUT.txt [--lengths 8,64,300] [--seed 0]

Writes one prompt per line: uniformly random ids below the file's vocabulary
(no tokenizer involved), from a fixed seed. When the model has a sliding
window and no prompt is longer than it, one more prompt of window + 64
tokens is added, so some positions attend past the window. Prints the
lengths written.
"""

from __future__ import annotations

import argparse
import random
import sys

from gguf_header import GgufError, summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--lengths", default="8,64,300", help="comma-separated prompt lengths")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        lengths = [int(n) for n in args.lengths.split(",") if n.strip()]
    except ValueError:
        ap.error(f"--lengths must be comma-separated integers, not {args.lengths!r}")
    if not lengths or min(lengths) < 1:
        ap.error("--lengths needs at least one positive length")
    try:
        info = summary(args.gguf)
    except (OSError, GgufError) as e:
        print(f"prompts: {e}", file=sys.stderr)
        return 1
    window = int(info["sliding_window"] or 0)
    if window > 0 and max(lengths) <= window:
        lengths.append(window + 64)
    rng = random.Random(args.seed)
    with open(args.out, "w") as f:
        for n in lengths:
            f.write(" ".join(str(rng.randrange(info["vocab"])) for _ in range(n)) + "\n")
    print(" ".join(map(str, lengths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
