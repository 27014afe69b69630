#!/usr/bin/env python3
"""Tests of compare.py, gguf_header.py and prompts.py on made-up dumps and a
header-only GGUF file (stdlib only):

    python3 -m unittest discover -s scripts/llamacpp-reference -p 'test_*.py'

They show the comparison can fail: a top-1 logprob moved by more than the
tolerance, or a greedy id changed where the model is not near a tie, or a
dump of another prompt.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from gguf_header import summary  # noqa: E402


def gguf_string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write_gguf(path: str, vocab: int, window: int) -> None:
    """A header-only GGUF: architecture, tokens and (optionally) a window."""
    kv = [gguf_string("general.architecture") + struct.pack("<I", 8) + gguf_string("testarch")]
    tokens = b"".join(gguf_string(f"t{i}") for i in range(vocab))
    kv.append(gguf_string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, vocab) + tokens)
    if window:
        kv.append(gguf_string("testarch.attention.sliding_window") + struct.pack("<II", 4, window))
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv)) + b"".join(kv))


def dump(positions: list[list[tuple[int, float]]]) -> str:
    """JSONL of one prompt: per position, (id, logprob) pairs best first."""
    return "".join(
        json.dumps({"prompt": 0, "pos": i, "ids": [t for t, _ in top], "logprobs": [lp for _, lp in top]})
        + "\n"
        for i, top in enumerate(positions)
    )


def confident(i: int) -> list[tuple[int, float]]:
    """A clear winner: p1 = 0.8, p2 = 0.1."""
    return [(i, math.log(0.8)), (i + 1, math.log(0.1)), (i + 2, math.log(0.05))]


def tied(i: int) -> list[tuple[int, float]]:
    """A near-tie: p1 = 0.30, p2 = 0.29 (top-2 gap 0.034 nat)."""
    return [(i, math.log(0.30)), (i + 1, math.log(0.29)), (i + 2, math.log(0.2))]


class CompareTest(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.model = os.path.join(self.dir.name, "m.gguf")
        write_gguf(self.model, vocab=16, window=0)
        # Positions 0-2 confident, 3 a near-tie, 4-5 confident.
        self.base = [confident(1), confident(2), confident(3), tied(4), confident(5), confident(6)]

    def tearDown(self) -> None:
        self.dir.cleanup()

    def run_compare(self, ref: list, zin: list) -> subprocess.CompletedProcess:
        paths = []
        for name, positions in (("ref", ref), ("zin", zin)):
            path = os.path.join(self.dir.name, f"{name}.jsonl")
            with open(path, "w") as f:
                f.write(positions if isinstance(positions, str) else dump(positions))
            paths.append(path)
        cmd = [sys.executable, os.path.join(HERE, "compare.py"), "--model", self.model]
        cmd += ["--reference", paths[0], "--zinfer", paths[1]]
        return subprocess.run(cmd, capture_output=True, text=True)

    def row(self, result: subprocess.CompletedProcess) -> list[str]:
        last = result.stdout.strip().splitlines()[-1]
        return [c.strip() for c in last.strip("|").split(" | ")]

    def test_identical_dumps_pass(self) -> None:
        r = self.run_compare(self.base, self.base)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        cells = self.row(r)
        self.assertEqual(cells[5:8], ["3", "3", "6/6"])  # compared, first near-tie, top-1 equal
        self.assertEqual(cells[-1], "pass")

    def test_logprob_within_tolerance_passes(self) -> None:
        zin = [list(p) for p in self.base]
        zin[4][0] = (zin[4][0][0], zin[4][0][1] + 0.04)
        self.assertEqual(self.run_compare(self.base, zin).returncode, 0)

    def test_one_perturbed_logprob_fails(self) -> None:
        zin = [list(p) for p in self.base]
        zin[4][0] = (zin[4][0][0], zin[4][0][1] - 0.06)
        r = self.run_compare(self.base, zin)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("top-1 logprob off by >= 0.05 nat at 1 position(s)", r.stdout)
        self.assertIn("0.06 (4)", r.stdout)

    def test_greedy_id_before_the_first_tie_fails(self) -> None:
        zin = list(self.base)
        zin[1] = [(9, lp) for _, lp in confident(2)[:1]] + confident(2)[1:]
        r = self.run_compare(self.base, zin)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("top-1 differs before the first near-tie at 1", r.stdout)

    def test_swapped_ids_at_the_tie_pass(self) -> None:
        zin = list(self.base)
        (a, pa), (b, pb), rest = tied(4)[0], tied(4)[1], tied(4)[2:]
        zin[3] = [(b, pa), (a, pb)] + rest
        r = self.run_compare(self.base, zin)
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertEqual(self.row(r)[7], "5/6")

    def test_clear_flip_after_the_tie_fails(self) -> None:
        zin = list(self.base)
        zin[5] = [(9, lp) for _, lp in confident(6)[:1]] + confident(6)[1:]
        r = self.run_compare(self.base, zin)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("both top-2 gaps >= 0.1 nat at 5", r.stdout)

    def test_another_prompt_is_an_input_error(self) -> None:
        r = self.run_compare(self.base, self.base[:5])
        self.assertEqual(r.returncode, 2)
        self.assertIn("not the same prompt", r.stderr)

    def test_unparsable_dump_is_an_input_error(self) -> None:
        r = self.run_compare(self.base, '{"prompt":0,"pos":0,"ids":[1,2],"logprobs":[nan,-1]}\n')
        self.assertEqual(r.returncode, 2)
        self.assertIn("zin.jsonl:1", r.stderr)


class HeaderAndPromptsTest(unittest.TestCase):
    def test_window_adds_a_longer_prompt(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            model, out = os.path.join(d, "m.gguf"), os.path.join(d, "p.txt")
            write_gguf(model, vocab=50, window=32)
            info = summary(model)
            self.assertEqual((info["arch"], info["vocab"], info["sliding_window"]), ("testarch", 50, 32))
            cmd = [sys.executable, os.path.join(HERE, "prompts.py"), model, out, "--lengths", "8,16"]
            r = subprocess.run(cmd, capture_output=True, text=True, check=True)
            self.assertEqual(r.stdout.split(), ["8", "16", "96"])
            with open(out) as f:
                prompts = [[int(t) for t in line.split()] for line in f]
            self.assertEqual([len(p) for p in prompts], [8, 16, 96])
            self.assertTrue(all(0 <= t < 50 for p in prompts for t in p))


if __name__ == "__main__":
    unittest.main()
