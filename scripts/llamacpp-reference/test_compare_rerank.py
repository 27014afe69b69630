#!/usr/bin/env python3
"""Tests of compare_rerank.py on made-up dumps (stdlib only):

    python3 -m unittest discover -s scripts/llamacpp-reference -p 'test_*.py'

They show the comparison can fail: a score 1e-3 off, two prompts' order
swapped, other tokens for a pair, or a dump of other prompts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = [0.9, 0.5, 0.1]


def dump(scores: list[float], tokens: list[int] | None = None) -> str:
    extra = {} if tokens is None else {"tokens": tokens}
    return "".join(
        json.dumps({"prompt": i, "scores": [s, 1.0 - s], **extra}) + "\n" for i, s in enumerate(scores)
    )


class CompareRerank(unittest.TestCase):
    def run_compare(self, zinfer: list[float], tokens=(None, None)) -> int:
        with tempfile.TemporaryDirectory() as d:
            ref, got = os.path.join(d, "ref.jsonl"), os.path.join(d, "z.jsonl")
            with open(ref, "w", encoding="utf-8") as f:
                f.write(dump(REFERENCE, tokens[0]))
            with open(got, "w", encoding="utf-8") as f:
                f.write(dump(zinfer, tokens[1]))
            return subprocess.run(
                [sys.executable, os.path.join(HERE, "compare_rerank.py"), "--reference", ref, "--zinfer", got],
                capture_output=True,
                check=False,
            ).returncode

    def test_equal_scores_pass(self):
        self.assertEqual(self.run_compare([0.9 + 1e-5, 0.5, 0.1 - 1e-5]), 0)

    def test_a_score_off_by_the_tolerance_fails(self):
        self.assertEqual(self.run_compare([0.9, 0.5 + 1.5e-3, 0.1]), 1)

    def test_another_order_fails(self):
        self.assertEqual(self.run_compare([0.9, 0.1, 0.5]), 1)

    def test_other_tokens_for_a_pair_fail(self):
        self.assertEqual(self.run_compare(REFERENCE, ([1, 2, 3], [1, 2, 3])), 0)
        self.assertEqual(self.run_compare(REFERENCE, ([1, 2, 3], [1, 2, 4])), 1)

    def test_other_prompts_fail(self):
        self.assertEqual(self.run_compare([0.9, 0.5]), 2)


if __name__ == "__main__":
    unittest.main()
