#!/usr/bin/env python3
"""Compares reranker scores from dump_embeddings --rank (llama.cpp's rank
pooling) and zinfer's dump_embeddings example --rank (its classifier head).

Prints one markdown row per prompt and exits 1 when an output differs by
1e-3 or more, when ordering the prompts by score (output 0, what
llama-server reports) gives another order, or, for query/document pairs
(--pairs dumps), when the two sides made other tokens of a pair.
"""

import argparse
import json
import sys

TOLERANCE = 1e-3


def read(path):
    rows = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            o = json.loads(line)
            rows[o["prompt"]] = (o["scores"], o.get("tokens"))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reference", required=True)
    ap.add_argument("--zinfer", required=True)
    args = ap.parse_args()
    ref, got = read(args.reference), read(args.zinfer)
    if sorted(ref) != sorted(got) or not ref:
        print(f"prompts differ: {sorted(ref)} vs {sorted(got)}", file=sys.stderr)
        return 2
    ok = True
    print("| prompt | llama.cpp score | zinfer score | max abs diff | pass |")
    print("|---|---|---|---|---|")
    for p in sorted(ref):
        (a, ref_tokens), (b, got_tokens) = ref[p], got[p]
        diff = max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) else float("inf")
        good = diff < TOLERANCE and ref_tokens == got_tokens
        ok &= good
        print(f"| {p} | {a[0]:.6f} | {b[0]:.6f} | {diff:.2e} | {'yes' if good else 'NO'} |")
    order = lambda rows: sorted(rows, key=lambda p: -rows[p][0][0])  # noqa: E731
    same = order(ref) == order(got)
    print(f"\norder by score: llama.cpp {order(ref)}, zinfer {order(got)}: {'same' if same else 'DIFFERENT'}")
    return 0 if ok and same else 1


if __name__ == "__main__":
    sys.exit(main())
