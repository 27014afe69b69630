#!/usr/bin/env python3
"""YaRN RoPE values as llama.cpp computes them, for zinfer's unit test.

Re-derives, in plain float64 Python, llama.cpp's YaRN (llama-cpp-python
0.3.36's vendor/llama.cpp): the correction dims of ggml.c's
ggml_rope_yarn_corr_dims (beta_fast 32, beta_slow 1: llama-hparams.h), the
per-pair ramp and angle mix of ggml-cpu/ops.cpp's rope_yarn (ext_factor 1
for `rope.scaling.type = yarn`), and the cos/sin magnitude: llama-context.cpp
sets yarn_attn_factor to get_mscale(factor) / (1 + 0.1 ln factor) times
`rope.scaling.attn_factor`, and rope_yarn multiplies it by 1 + 0.1 ln factor.

    python3 scripts/llamacpp-reference/yarn_rope.py

prints the dims and cos/sin at a few (position, pair) points for a
Qwen3-like head (128 wide, base 1e6, factor 4 over 32,768 tokens, attention
factor 1.25 to check it multiplies); crates/model/src/spec.rs's
`yarn_matches_llama_cpps_formula` holds these numbers.
"""

import math

HEAD_DIM = 128
BASE = 1e6
FACTOR = 4.0
ORIGINAL_CONTEXT = 32768
ATTN_FACTOR = 1.25
BETA_FAST, BETA_SLOW = 32.0, 1.0
EXT_FACTOR = 1.0


def corr_dim(n_dims, n_ctx_orig, n_rot, base):
    return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))


def corr_dims(n_dims, n_ctx_orig, base, beta_fast, beta_slow):
    start = math.floor(corr_dim(n_dims, n_ctx_orig, beta_fast, base))
    end = math.ceil(corr_dim(n_dims, n_ctx_orig, beta_slow, base))
    return max(0, start), min(n_dims - 1, end)


def ramp(low, high, pair):
    y = (pair - low) / max(0.001, high - low)
    return 1 - min(1, max(0, y))


def mscale():
    get_mscale = 1.0 if FACTOR <= 1 else 0.1 * math.log(FACTOR) + 1.0
    yarn_attn_factor = get_mscale / (1.0 + 0.1 * math.log(FACTOR)) * ATTN_FACTOR
    return yarn_attn_factor * (1.0 + 0.1 * math.log(FACTOR))


def cos_sin(pos, pair, dims):
    theta_extrap = pos * BASE ** (-2.0 * pair / HEAD_DIM)
    theta_interp = theta_extrap / FACTOR
    mix = ramp(dims[0], dims[1], pair) * EXT_FACTOR
    theta = theta_interp * (1 - mix) + theta_extrap * mix
    return math.cos(theta) * mscale(), math.sin(theta) * mscale()


def main():
    dims = corr_dims(HEAD_DIM, ORIGINAL_CONTEXT, BASE, BETA_FAST, BETA_SLOW)
    print(f"corr dims {dims[0]} {dims[1]}, mscale {mscale():.9f}")
    for pos in (1, 1000, 30000):
        for pair in (0, 10, 23, 30, 40, 63):
            c, s = cos_sin(pos, pair, dims)
            print(f"({pos}, {pair}, {c:.7f}, {s:.7f}),")


if __name__ == "__main__":
    main()
