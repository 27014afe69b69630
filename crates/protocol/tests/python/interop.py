"""zinfer protocol interop check, run by tests/python_interop.rs.

Uses only the stock `msgpack` package, as a third-party client would:
decodes the golden `generate` and `done` frames written by the Rust encoder,
asserts their fields, and prints the hex of a `generate` frame that the Rust
side then decodes. Usage: interop.py GOLDEN_DIR
"""

import sys
from pathlib import Path

try:
    import msgpack
except ImportError:
    print("the Python package msgpack is missing: pip install msgpack", file=sys.stderr)
    sys.exit(3)


def golden(directory, name):
    return bytes.fromhex(Path(directory, name + ".hex").read_text())


def check_generate(frame):
    msg = msgpack.unpackb(frame, raw=False)
    expected = {
        "type": "generate",
        "id": "req-1",
        "prompt": "Once upon a time",
        "model": "smollm2-135m",
        "namespace": "tenant-a",
        "max_tokens": 64,
        "temperature": 0.5,
        "top_p": 0.75,
        "top_k": 40,
        "min_p": 0.125,
        "repetition_penalty": 1.25,
        "seed": 42,
        "stop": ["\n\n", "END"],
        "stop_token_ids": [2, 7],
        "ignore_eos": True,
        "stream": False,
        "priority": -3,
        "deadline_ms": 30000,
    }
    assert msg == expected, f"generate decoded as {msg!r}"


def check_done(frame):
    msg = msgpack.unpackb(frame, raw=False)
    assert msg["type"] == "done", msg
    assert msg["id"] == "req-1", msg
    assert msg["finish_reason"] == "stop", msg
    assert msg["text"] == "The capital of France is Paris.", msg
    assert msg["usage"] == {"prompt_tokens": 12, "cached_tokens": 8, "completion_tokens": 3}, msg
    assert msg["timings"] == {"queue_s": 0.001, "prefill_s": 0.25, "ttft_s": 0.3, "decode_s": 0.0625}, msg
    assert msg["worker"] == "w-cpu-0", msg
    assert set(msg) == {"type", "id", "finish_reason", "text", "usage", "timings", "worker"}, msg


def check_chunk_logprobs(frame):
    msg = msgpack.unpackb(frame, raw=False)
    assert msg["type"] == "chunk" and msg["tokens"] == [7042, 2208], msg
    first, second = msg["logprobs"]
    assert first == {
        "token": 7042,
        "text": " Paris",
        "logprob": -0.125,
        "top_logprobs": [
            {"token": 7042, "text": " Paris", "logprob": -0.125},
            {"token": 4220, "text": " Lyon", "logprob": -2.5},
        ],
    }, first
    assert second["text"] == "\ufffd" and second["logprob"] == -1.5, second


def check_models(frame, with_limits):
    msg = msgpack.unpackb(frame, raw=False)
    model = msg["models"][0]
    assert model["name"] == "smollm2-135m" and model["workers"] == 2, msg
    if with_limits:
        assert model["context_length"] == 8192 and model["vocab_size"] == 49152, msg
    else:
        assert "context_length" not in model and "vocab_size" not in model, msg


def python_generate():
    # What a Python client sends: float64 floats, an int where a float is
    # expected, None for an absent option, the version field.
    return msgpack.packb(
        {
            "v": 1,
            "type": "generate",
            "id": "py-1",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Grüße aus Python"},
            ],
            "max_tokens": 16,
            "temperature": 0,
            "top_p": 0.9,
            "seed": None,
            "stop": ["\n"],
            "stream": True,
        }
    )


def edge_cases():
    """Frames a client written from docs/protocol.md may send, by name; the
    Rust side checks each is accepted or refused as the spec says."""
    base = {"type": "generate", "id": "py-2", "prompt": "Hi"}
    nils = dict(base, **{field: None for field in (
        "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
        "stop", "stop_token_ids", "ignore_eos", "stream", "priority", "seed",
        "deadline_ms", "logprobs", "top_logprobs")})
    return {
        "nil_is_absent": msgpack.packb(nils),
        "integer_key": msgpack.packb({**base, 18: 3}),
        "bin_prompt": msgpack.packb(dict(base, prompt=b"Hi"), use_bin_type=True),
        "wrong_type": msgpack.packb(dict(base, max_tokens="ten")),
    }


def main():
    directory = sys.argv[1]
    check_generate(golden(directory, "client_request.generate"))
    check_done(golden(directory, "client_reply.done"))
    check_chunk_logprobs(golden(directory, "client_reply.chunk_logprobs"))
    check_models(golden(directory, "client_reply.models"), with_limits=False)
    check_models(golden(directory, "client_reply.models_with_limits"), with_limits=True)
    print(python_generate().hex())
    for name, frame in edge_cases().items():
        print(name, frame.hex())


if __name__ == "__main__":
    main()
