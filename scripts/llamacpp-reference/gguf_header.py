#!/usr/bin/env python3
"""What scripts/llamacpp-reference.sh needs from a GGUF header, stdlib only.

    gguf_header.py FILE.gguf          # prints one JSON object
    gguf_header.py FILE.gguf FIELD    # prints one of its fields

{"arch", "vocab", "layers", "sliding_window", "weights", "tensor_types"}:
vocab is the tokenizer's token count (the logits per position), sliding_window
`{arch}.attention.sliding_window` (0 when absent), weights the type holding
most of the parameters (F32 for the synthetic reference files). Only the
header is read: key/values and tensor infos, no tensor data.
"""

from __future__ import annotations

import json
import struct
import sys
from collections import Counter
from typing import BinaryIO

# GGUF value types: struct format for the fixed-size ones.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9

# ggml tensor types, as ggml.h numbers them (the ones GGUF files carry).
GGML_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K",
    16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S",
    22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
    29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}


class GgufError(Exception):
    """The file is not a GGUF file this reader understands."""


def _read(f: BinaryIO, fmt: str):
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise GgufError("file ends inside the header")
    return struct.unpack(fmt, data)[0]


def _string(f: BinaryIO) -> str:
    n = _read(f, "<Q")
    data = f.read(n)
    if len(data) != n:
        raise GgufError("file ends inside a string")
    return data.decode("utf-8", errors="replace")


def _value(f: BinaryIO, vtype: int, keep: bool):
    """One value; arrays are returned as their length unless `keep`."""
    if vtype in _SCALARS:
        return _read(f, _SCALARS[vtype])
    if vtype == _STRING:
        return _string(f)
    if vtype == _ARRAY:
        etype, n = _read(f, "<I"), _read(f, "<Q")
        if etype in _SCALARS and not keep:
            f.seek(n * struct.calcsize(_SCALARS[etype]), 1)
            return n
        items = [_value(f, etype, keep) for _ in range(n)]
        return items if keep else n
    raise GgufError(f"unknown GGUF value type {vtype}")


def read_header(path: str) -> tuple[dict, list[tuple[str, list[int], int]]]:
    """Key/values (arrays as their lengths) and (name, dims, ggml type) per tensor."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise GgufError(f"{path} is not a GGUF file (no GGUF magic)")
        version = _read(f, "<I")
        if version < 2:
            raise GgufError(f"{path}: GGUF version {version} is too old (2 or later)")
        n_tensors, n_kv = _read(f, "<Q"), _read(f, "<Q")
        kv = {}
        for _ in range(n_kv):
            key = _string(f)
            kv[key] = _value(f, _read(f, "<I"), keep=False)
        tensors = []
        for _ in range(n_tensors):
            name = _string(f)
            dims = [_read(f, "<Q") for _ in range(_read(f, "<I"))]
            ttype = _read(f, "<I")
            _read(f, "<Q")  # data offset
            tensors.append((name, dims, ttype))
    return kv, tensors


def summary(path: str) -> dict:
    kv, tensors = read_header(path)
    arch = kv.get("general.architecture")
    if not isinstance(arch, str):
        raise GgufError(f"{path} has no general.architecture")
    vocab = kv.get("tokenizer.ggml.tokens")
    if not isinstance(vocab, int) or vocab <= 0:
        raise GgufError(f"{path} has no tokenizer.ggml.tokens: llama.cpp needs a vocabulary")
    params: Counter[str] = Counter()
    for _, dims, ttype in tensors:
        n = 1
        for d in dims:
            n *= d
        params[GGML_TYPES.get(ttype, f"type{ttype}")] += n
    return {
        "arch": arch,
        "vocab": vocab,
        "layers": kv.get(f"{arch}.block_count", 0),
        "sliding_window": kv.get(f"{arch}.attention.sliding_window", 0),
        "weights": params.most_common(1)[0][0] if params else "none",
        "tensor_types": dict(params.most_common()),
    }


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print("usage: gguf_header.py FILE.gguf [FIELD]", file=sys.stderr)
        return 2
    try:
        info = summary(sys.argv[1])
    except (OSError, GgufError) as e:
        print(f"gguf_header: {e}", file=sys.stderr)
        return 1
    if len(sys.argv) == 2:
        print(json.dumps(info))
    elif sys.argv[2] in info:
        print(info[sys.argv[2]])
    else:
        print(f"gguf_header: no field {sys.argv[2]!r}; fields: {', '.join(info)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
