#!/usr/bin/env python3
"""Compares zinfer's per-position top-k log-softmax with llama.cpp's, stdlib only.

    compare.py --model FILE.gguf --reference llama.jsonl --zinfer zinfer.jsonl \
        [--tie 0.05] [--tol 0.05] [--no-header]

Both JSONL files hold one line per (prompt, position):
{"prompt":P,"pos":I,"ids":[top-k ids],"logprobs":[their log-softmax]}, as
dump_logits.cpp (llama.cpp) and crates/model/examples/dump_logits.rs (zinfer)
write them for the same token ids. Per prompt, it checks:

  * greedy ids: the top-1 ids are equal at every position before the first
    near-tie, a position where the top-2 probability margin p1 - p2 is below
    --tie on either side;
  * the top-1 logprob (the largest log-softmax value) of every position
    differs by less than --tol nat;
  * past the first near-tie, the top-1 ids still differ only where one side's
    top-2 logprob gap is below 2 * --tol: if both gaps are wider, some
    token's logprob differs by more than --tol, a disagreement the first two
    checks would have missed (random-weight files are all near-ties in
    probability terms, so for them this is the only id check).

Prints a markdown table row per prompt (the header first unless
--no-header); exits 1 when a row fails, 2 on unusable input.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass

from gguf_header import GgufError, summary

HEADER = (
    "| file | arch | weights | window | prompt | ids compared (to first near-tie) "
    "| first near-tie | top-1 equal | max \\|Δ top-1 logprob\\| (pos) | result |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


class InputError(Exception):
    """The dumps cannot be compared."""


@dataclass
class Position:
    ids: list[int]
    logprobs: list[float]

    @property
    def margin(self) -> float:
        """Top-2 probability margin p1 - p2."""
        return math.exp(self.logprobs[0]) - math.exp(self.logprobs[1])

    @property
    def gap(self) -> float:
        """Top-2 logprob gap."""
        return self.logprobs[0] - self.logprobs[1]


@dataclass
class Row:
    prompt: int
    positions: int
    compared: int
    first_tie: int | None
    top1_equal: int
    max_delta: float
    max_delta_pos: int
    failures: list[str]


def load(path: str) -> dict[int, dict[int, Position]]:
    prompts: dict[int, dict[int, Position]] = {}
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    p, i = int(rec["prompt"]), int(rec["pos"])
                    pos = Position([int(x) for x in rec["ids"]], [float(x) for x in rec["logprobs"]])
                except (ValueError, KeyError, TypeError) as e:
                    raise InputError(f"{path}:{n}: not a dump line ({e})") from None
                if len(pos.ids) < 2 or len(pos.ids) != len(pos.logprobs):
                    raise InputError(f"{path}:{n}: needs the top 2 or more ids with their logprobs")
                if not all(math.isfinite(x) for x in pos.logprobs):
                    raise InputError(f"{path}:{n}: non-finite logprob")
                if i in prompts.setdefault(p, {}):
                    raise InputError(f"{path}:{n}: prompt {p} position {i} appears twice")
                prompts[p][i] = pos
    except OSError as e:
        raise InputError(f"cannot read {path}: {e}") from None
    if not prompts:
        raise InputError(f"{path} holds no positions")
    return prompts


def compare_prompt(
    prompt: int, ref: dict[int, Position], zin: dict[int, Position], tie: float, tol: float
) -> Row:
    if set(ref) != set(zin):
        raise InputError(
            f"prompt {prompt}: llama.cpp has {len(ref)} positions, zinfer {len(zin)}: not the same prompt"
        )
    order = sorted(ref)
    if order != list(range(len(order))):
        raise InputError(f"prompt {prompt}: positions are not 0..{len(order) - 1}")
    first_tie = next((i for i in order if min(ref[i].margin, zin[i].margin) < tie), None)
    compared = len(order) if first_tie is None else first_tie
    failures = []
    early = [i for i in order[:compared] if ref[i].ids[0] != zin[i].ids[0]]
    if early:
        failures.append(f"top-1 differs before the first near-tie at {fmt_positions(early)}")
    flips = [
        i
        for i in order[compared:]
        if ref[i].ids[0] != zin[i].ids[0] and min(ref[i].gap, zin[i].gap) >= 2 * tol
    ]
    if flips:
        failures.append(f"top-1 differs with both top-2 gaps >= {2 * tol:g} nat at {fmt_positions(flips)}")
    deltas = [abs(ref[i].logprobs[0] - zin[i].logprobs[0]) for i in order]
    worst = max(order, key=lambda i: deltas[i])
    if deltas[worst] >= tol:
        over = sum(d >= tol for d in deltas)
        failures.append(f"top-1 logprob off by >= {tol:g} nat at {over} position(s)")
    return Row(
        prompt=prompt,
        positions=len(order),
        compared=compared,
        first_tie=first_tie,
        top1_equal=sum(ref[i].ids[0] == zin[i].ids[0] for i in order),
        max_delta=deltas[worst],
        max_delta_pos=worst,
        failures=failures,
    )


def fmt_positions(positions: list[int]) -> str:
    shown = ", ".join(map(str, positions[:5]))
    return shown + (f" (+{len(positions) - 5} more)" if len(positions) > 5 else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the GGUF file both sides ran (for the labels)")
    ap.add_argument("--reference", required=True, help="llama.cpp's dump")
    ap.add_argument("--zinfer", required=True, help="zinfer's dump")
    ap.add_argument("--tie", type=float, default=0.05, help="near-tie: top-2 probability margin below this")
    ap.add_argument("--tol", type=float, default=0.05, help="top-1 logprob tolerance in nat")
    ap.add_argument("--no-header", action="store_true")
    args = ap.parse_args()
    try:
        info = summary(args.model)
        ref, zin = load(args.reference), load(args.zinfer)
        if set(ref) != set(zin):
            raise InputError(f"llama.cpp dumped {len(ref)} prompts, zinfer {len(zin)}")
        rows = [compare_prompt(p, ref[p], zin[p], args.tie, args.tol) for p in sorted(ref)]
    except (GgufError, InputError, OSError) as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2
    window = int(info["sliding_window"] or 0)
    if not args.no_header:
        print(HEADER)
    for r in rows:
        length = f"{r.positions} tokens" + (" (> window)" if window and r.positions > window else "")
        tie = "none" if r.first_tie is None else str(r.first_tie)
        result = "pass" if not r.failures else "FAIL: " + "; ".join(r.failures)
        print(
            f"| {os.path.basename(args.model)} | {info['arch']} | {info['weights']} | {window or '-'} "
            f"| {length} | {r.compared} | {tie} | {r.top1_equal}/{r.positions} "
            f"| {r.max_delta:.2g} ({r.max_delta_pos}) | {result} |"
        )
    return 1 if any(r.failures for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
