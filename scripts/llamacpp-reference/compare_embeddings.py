#!/usr/bin/env python3
"""Compares zinfer's final hidden states (embeddings) with llama.cpp's, stdlib only.

    compare_embeddings.py --model FILE.gguf --reference llama.jsonl --zinfer zinfer.jsonl \
        [--reference-logits llama.f32 --zinfer-logits zinfer.f32] [--logit-tol 0.05] \
        [--min-cos 0.999] [--no-header]

The dumps are what dump_embeddings.cpp (llama.cpp) and
crates/model/examples/dump_embeddings.rs (zinfer) write for the same token
ids: one line per (prompt, position), {"prompt":P,"pos":I,"hidden":[...]},
the state after the output norm and before the LM head (llama.cpp's
`result_norm` with LLAMA_POOLING_TYPE_NONE, zinfer's ChunkOutput::AllHidden);
llama.cpp's also hold {"prompt":P,"pooling":"mean"|"last","embedding":[...]},
its own MEAN and LAST pooling. Per prompt, it checks:

  * every position's hidden state: cosine similarity with llama.cpp's above
    --min-cos;
  * the embeddings a caller makes from zinfer's rows, the mean of the rows
    and the last row, each L2-normalised, against llama.cpp's MEAN and LAST
    pooled embeddings, L2-normalised: cosine above --min-cos.

With both logits files (raw little-endian f32, every position of every
prompt in order, the vocabulary per position: llama.cpp's logits and
zinfer's ChunkOutput::AllLogits rows) it also checks the largest |logit
difference| of each prompt is below --logit-tol.

The tolerances are meant for F32 files: on quantized ones both engines
round activations to int8 for the matmuls, each its own way, which moves
each engine's hidden states about as far from the F32 copy's as from the
other engine's.

Prints a markdown table row per prompt (the header first unless
--no-header); exits 1 when a row fails, 2 on unusable input.
"""

from __future__ import annotations

import argparse
import json
import math
import operator
import os
import sys
from array import array
from dataclasses import dataclass, field

from gguf_header import GgufError, summary

HEADER = (
    "| file | arch | weights | prompt | min cos, rows (pos) | cos, mean pooled | cos, last pooled "
    "| max \\|Δ hidden\\| | max \\|Δ logit\\| (pos) | result |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


class InputError(Exception):
    """The dumps cannot be compared."""


@dataclass
class Dump:
    """One side's dump: per prompt, its rows by position and pooled embeddings."""

    rows: dict[int, dict[int, list[float]]] = field(default_factory=dict)
    pooled: dict[int, dict[str, list[float]]] = field(default_factory=dict)


@dataclass
class Row:
    prompt: int
    positions: int
    min_cos: float
    min_cos_pos: int
    cos_mean: float
    cos_last: float
    max_hidden: float
    max_logit: float | None
    max_logit_pos: int | None
    failures: list[str]


def load(path: str) -> Dump:
    dump = Dump()
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    p = int(rec["prompt"])
                    if "pooling" in rec:
                        key, values, into = str(rec["pooling"]), rec["embedding"], dump.pooled
                    else:
                        key, values, into = int(rec["pos"]), rec["hidden"], dump.rows
                    values = [float(x) for x in values]
                except (ValueError, KeyError, TypeError) as e:
                    raise InputError(f"{path}:{n}: not a dump line ({e})") from None
                if not values or not all(math.isfinite(x) for x in values):
                    raise InputError(f"{path}:{n}: empty or non-finite vector")
                if key in into.setdefault(p, {}):
                    raise InputError(f"{path}:{n}: prompt {p} has {key} twice")
                into[p][key] = values
    except OSError as e:
        raise InputError(f"cannot read {path}: {e}") from None
    if not dump.rows:
        raise InputError(f"{path} holds no hidden states")
    return dump


def norm(v: list[float]) -> float:
    return math.sqrt(math.fsum(x * x for x in v))


def cosine(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):
        raise InputError(f"vectors of {len(a)} and {len(b)} values: not the same model")
    na, nb = norm(a), norm(b)
    if na == 0.0 or nb == 0.0:
        return 0.0
    return math.fsum(x * y for x, y in zip(a, b)) / (na * nb)


def normalised(v: list[float]) -> list[float]:
    n = norm(v)
    return [x / n for x in v] if n > 0.0 else v


def mean(rows: list[list[float]]) -> list[float]:
    return [math.fsum(col) / len(rows) for col in zip(*rows)]


def read_logits(path: str) -> array:
    values = array("f")
    try:
        with open(path, "rb") as f:
            values.frombytes(f.read())
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read {path} as f32: {e}") from None
    if sys.byteorder != "little":
        values.byteswap()
    return values


def logit_diffs(
    ref_path: str, zin_path: str, lengths: list[int]
) -> list[tuple[float, int]]:
    """Per prompt, the largest |logit difference| and its position."""
    ref, zin = read_logits(ref_path), read_logits(zin_path)
    rows = sum(lengths)
    if len(ref) != len(zin) or rows == 0 or len(ref) % rows:
        raise InputError(
            f"logits files of {len(ref)} and {len(zin)} values for {rows} positions: not the same dump"
        )
    vocab = len(ref) // rows
    out = []
    at = 0
    for n in lengths:
        worst, worst_pos = 0.0, 0
        for pos in range(n):
            a = ref[at * vocab : (at + 1) * vocab]
            b = zin[at * vocab : (at + 1) * vocab]
            d = max(map(abs, map(operator.sub, a, b)))
            if not math.isfinite(d):
                raise InputError(f"non-finite logits at row {at}")
            if d > worst:
                worst, worst_pos = d, pos
            at += 1
        out.append((worst, worst_pos))
    return out


def compare_prompt(
    prompt: int,
    ref: Dump,
    zin: Dump,
    min_cos: float,
    logits: tuple[float, int] | None,
    logit_tol: float,
) -> Row:
    ref_rows, zin_rows = ref.rows[prompt], zin.rows.get(prompt, {})
    if set(ref_rows) != set(zin_rows):
        raise InputError(
            f"prompt {prompt}: llama.cpp has {len(ref_rows)} positions, zinfer {len(zin_rows)}: not the same prompt"
        )
    order = sorted(ref_rows)
    if order != list(range(len(order))):
        raise InputError(f"prompt {prompt}: positions are not 0..{len(order) - 1}")
    pooled = ref.pooled.get(prompt, {})
    if set(pooled) != {"mean", "last"}:
        raise InputError(f"prompt {prompt}: llama.cpp's dump needs its mean and last pooling, has {sorted(pooled)}")

    cos = [cosine(ref_rows[i], zin_rows[i]) for i in order]
    worst = min(order, key=lambda i: cos[i])
    max_hidden = max(max(abs(a - b) for a, b in zip(ref_rows[i], zin_rows[i])) for i in order)
    ours = [zin_rows[i] for i in order]
    cos_mean = cosine(normalised(pooled["mean"]), normalised(mean(ours)))
    cos_last = cosine(normalised(pooled["last"]), normalised(ours[-1]))

    failures = []
    low = [i for i in order if cos[i] <= min_cos]
    if low:
        shown = ", ".join(map(str, low[:5])) + (f" (+{len(low) - 5} more)" if len(low) > 5 else "")
        failures.append(f"hidden-state cosine <= {min_cos:g} at {shown}")
    for name, c in (("mean", cos_mean), ("last", cos_last)):
        if c <= min_cos:
            failures.append(f"{name}-pooled cosine {c:.6f} <= {min_cos:g}")
    max_logit, max_logit_pos = logits if logits is not None else (None, None)
    if max_logit is not None and max_logit >= logit_tol:
        failures.append(f"a logit off by {max_logit:.3g} >= {logit_tol:g}")
    return Row(
        prompt=prompt,
        positions=len(order),
        min_cos=cos[worst],
        min_cos_pos=worst,
        cos_mean=cos_mean,
        cos_last=cos_last,
        max_hidden=max_hidden,
        max_logit=max_logit,
        max_logit_pos=max_logit_pos,
        failures=failures,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the GGUF file both sides ran (for the labels)")
    ap.add_argument("--reference", required=True, help="llama.cpp's dump")
    ap.add_argument("--zinfer", required=True, help="zinfer's dump")
    ap.add_argument("--reference-logits", help="llama.cpp's logits (raw f32)")
    ap.add_argument("--zinfer-logits", help="zinfer's logits (raw f32)")
    ap.add_argument("--logit-tol", type=float, default=0.05, help="fail a prompt with a logit this far off")
    ap.add_argument("--min-cos", type=float, default=0.999, help="least cosine similarity accepted")
    ap.add_argument("--no-header", action="store_true")
    args = ap.parse_args()
    if (args.reference_logits is None) != (args.zinfer_logits is None):
        ap.error("give both logits files or neither")
    try:
        info = summary(args.model)
        ref, zin = load(args.reference), load(args.zinfer)
        if set(ref.rows) != set(zin.rows):
            raise InputError(f"llama.cpp dumped {len(ref.rows)} prompts, zinfer {len(zin.rows)}")
        prompts = sorted(ref.rows)
        logits: list[tuple[float, int] | None] = [None] * len(prompts)
        if args.reference_logits is not None:
            lengths = [len(ref.rows[p]) for p in prompts]
            logits = list(logit_diffs(args.reference_logits, args.zinfer_logits, lengths))
        rows = [
            compare_prompt(p, ref, zin, args.min_cos, logits[k], args.logit_tol)
            for k, p in enumerate(prompts)
        ]
    except (GgufError, InputError, OSError) as e:
        print(f"compare_embeddings: {e}", file=sys.stderr)
        return 2
    if not args.no_header:
        print(HEADER)
    for r in rows:
        logit = "-" if r.max_logit is None else f"{r.max_logit:.2g} ({r.max_logit_pos})"
        result = "pass" if not r.failures else "FAIL: " + "; ".join(r.failures)
        print(
            f"| {os.path.basename(args.model)} | {info['arch']} | {info['weights']} | {r.positions} tokens "
            f"| {r.min_cos:.8f} ({r.min_cos_pos}) | {r.cos_mean:.8f} | {r.cos_last:.8f} "
            f"| {r.max_hidden:.2g} | {logit} | {result} |"
        )
    return 1 if any(r.failures for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
