"""Writes small valid GGUF files into the directory given: the fuzzer's seeds."""
import os
import struct
import sys


def string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, kind, value):
    return string(key) + struct.pack("<I", kind) + value


def gguf(kvs, tensors, data_len, alignment=32):
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for k in kvs:
        out += k
    for name, dims, ggml_type, offset in tensors:
        out += string(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ggml_type, offset)
    out += b"\0" * (-len(out) % alignment)
    return out + b"\x01" * data_len


tokens = struct.pack("<IQ", 8, 3) + string("a") + string("b") + string("<s>")
llama = [
    kv("general.architecture", 8, string("llama")),
    kv("general.alignment", 4, struct.pack("<I", 32)),
    kv("llama.block_count", 4, struct.pack("<I", 1)),
    kv("llama.embedding_length", 4, struct.pack("<I", 8)),
    kv("llama.attention.head_count", 4, struct.pack("<I", 2)),
    kv("llama.rope.freq_base", 6, struct.pack("<f", 10000.0)),
    kv("tokenizer.ggml.tokens", 9, tokens),
]
seeds = {
    "llama": gguf(llama, [("token_embd.weight", [8, 3], 0, 0), ("output.weight", [32, 3], 8, 96)], 96 + 3 * 34),
    "empty": gguf([], [], 0),
    "q4_1": gguf(llama[:1], [("w", [32, 2], 3, 0)], 40),
}
os.makedirs(sys.argv[1], exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(sys.argv[1], name), "wb") as f:
        f.write(data)
