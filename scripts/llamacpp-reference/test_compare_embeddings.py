#!/usr/bin/env python3
"""Tests of compare_embeddings.py on made-up dumps (stdlib only):

    python3 -m unittest discover -s scripts/llamacpp-reference -p 'test_*.py'

They show the comparison can fail: one position's hidden state turned away
from llama.cpp's, pooling that does not match llama.cpp's (the mean of
other rows, or another last row), a logit moved by more than the tolerance,
or a dump of another prompt.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from test_compare import write_gguf  # noqa: E402

VOCAB = 6


def rows(n: int) -> list[list[float]]:
    """n hidden states of 4 values, far from parallel to one another."""
    return [[1.0 + i, -2.0 + 0.5 * i, 0.25 * i * i, 3.0 - i] for i in range(n)]


def mean(vs: list[list[float]]) -> list[float]:
    return [sum(c) / len(vs) for c in zip(*vs)]


def dump(hidden: list[list[float]], pooled: dict[str, list[float]] | None = None) -> str:
    lines = [json.dumps({"prompt": 0, "pos": i, "hidden": h}) for i, h in enumerate(hidden)]
    for name, v in (pooled or {}).items():
        lines.append(json.dumps({"prompt": 0, "pooling": name, "embedding": v}))
    return "".join(line + "\n" for line in lines)


def logits(n: int, shift: dict[tuple[int, int], float] | None = None) -> bytes:
    values = [0.1 * (r * VOCAB + t) for r in range(n) for t in range(VOCAB)]
    for (r, t), d in (shift or {}).items():
        values[r * VOCAB + t] += d
    return struct.pack(f"<{len(values)}f", *values)


class CompareEmbeddingsTest(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.model = os.path.join(self.dir.name, "m.gguf")
        write_gguf(self.model, vocab=VOCAB, window=0)
        self.rows = rows(5)
        # llama.cpp pools unnormalised: scale them to show the script normalises.
        self.pooled = {"mean": [3 * x for x in mean(self.rows)], "last": [0.5 * x for x in self.rows[-1]]}

    def tearDown(self) -> None:
        self.dir.cleanup()

    def run_compare(self, zin: str, ref: str | None = None, zin_logits: bytes | None = None):
        files = {
            "ref.jsonl": ref if ref is not None else dump(self.rows, self.pooled),
            "zin.jsonl": zin,
        }
        for name, text in files.items():
            with open(os.path.join(self.dir.name, name), "w") as f:
                f.write(text)
        cmd = [sys.executable, os.path.join(HERE, "compare_embeddings.py"), "--model", self.model]
        cmd += ["--reference", os.path.join(self.dir.name, "ref.jsonl")]
        cmd += ["--zinfer", os.path.join(self.dir.name, "zin.jsonl")]
        if zin_logits is not None:
            for name, data in (("ref.f32", logits(len(self.rows))), ("zin.f32", zin_logits)):
                with open(os.path.join(self.dir.name, name), "wb") as f:
                    f.write(data)
            cmd += ["--reference-logits", os.path.join(self.dir.name, "ref.f32")]
            cmd += ["--zinfer-logits", os.path.join(self.dir.name, "zin.f32")]
        return subprocess.run(cmd, capture_output=True, text=True)

    def test_identical_rows_pass(self) -> None:
        r = self.run_compare(dump(self.rows), zin_logits=logits(5))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        cells = [c.strip() for c in r.stdout.strip().splitlines()[-1].strip("|").split(" | ")]
        self.assertEqual(cells[4:7], ["1.00000000 (0)", "1.00000000", "1.00000000"])
        self.assertEqual(cells[-1], "pass")

    def test_small_differences_pass(self) -> None:
        zin = [[x * 1.001 + 1e-4 for x in h] for h in self.rows]
        r = self.run_compare(dump(zin), zin_logits=logits(5, {(2, 3): 0.04}))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("0.04 (2)", r.stdout)

    def test_one_turned_row_fails(self) -> None:
        zin = [list(h) for h in self.rows]
        zin[3][0] += 1.0
        r = self.run_compare(dump(zin))
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("hidden-state cosine <= 0.999 at 3", r.stdout)

    def test_pooling_of_other_rows_fails(self) -> None:
        pooled = {"mean": mean(self.rows[:-1]), "last": self.rows[-2]}
        r = self.run_compare(dump(self.rows), ref=dump(self.rows, pooled))
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("mean-pooled cosine", r.stdout)
        self.assertIn("last-pooled cosine", r.stdout)

    def test_a_logit_off_by_the_tolerance_fails(self) -> None:
        r = self.run_compare(dump(self.rows), zin_logits=logits(5, {(4, 1): -0.06}))
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("a logit off by 0.06 >= 0.05", r.stdout)

    def test_another_prompt_is_an_input_error(self) -> None:
        r = self.run_compare(dump(self.rows[:4]))
        self.assertEqual(r.returncode, 2)
        self.assertIn("not the same prompt", r.stderr)

    def test_reference_without_pooling_is_an_input_error(self) -> None:
        r = self.run_compare(dump(self.rows), ref=dump(self.rows))
        self.assertEqual(r.returncode, 2)
        self.assertIn("needs its mean and last pooling", r.stderr)

    def test_logits_of_another_length_are_an_input_error(self) -> None:
        r = self.run_compare(dump(self.rows), zin_logits=logits(4))
        self.assertEqual(r.returncode, 2)
        self.assertIn("not the same dump", r.stderr)


if __name__ == "__main__":
    unittest.main()
