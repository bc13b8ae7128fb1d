#!/usr/bin/env python3
"""Writes tests/data/quants/<type>.bin: blocks of random bytes of every
quantized GGUF type vkllm reads, followed by their values as the `gguf`
package (gguf-py 0.19.0, an independent codec) dequantizes them, as
little-endian f32. tests/quant.rs decodes the same blocks and compares bit
for bit.

The bytes are uniform random except the block scales, which are set to
random finite f16 values (random bits could be inf or NaN), and the grid
indices of the 2- and 3-bit i-quants, which are set so that the blocks
together use every entry of the type's grid (a shuffled sweep).

    python3 -m venv .venv && .venv/bin/pip install gguf==0.19.0
    .venv/bin/python scripts/quant-fixtures.py
"""
import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

# Byte offsets of each type's f16 scales within a block.
F16_SCALES = {
    "Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2],
    "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "Q2_K": [80, 82], "Q3_K": [108], "IQ4_NL": [0], "IQ4_XS": [0],
    "TQ1_0": [52], "TQ2_0": [64],
    # The e8m0 scale takes every byte value.
    "MXFP4": [],
    "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0],
}
BLOCKS = 6


def iq2_xxs_index(b, k, v):
    # Index k = 4 * sub-block + group: byte k % 4 of the sub-block's first u32.
    b[2 + 8 * (k // 4) + k % 4] = v


def iq2_xs_index(b, k, v):
    # The low 9 bits of u16 k.
    q = int(b[2 + 2 * k]) | int(b[3 + 2 * k]) << 8
    q = (q & ~511) | v
    b[2 + 2 * k], b[3 + 2 * k] = q & 0xFF, q >> 8


def iq2_s_index(b, k, v):
    # Low 8 bits in qs[k], high 2 in bits 2 (k % 4) of qh[k / 4].
    b[2 + k] = v & 0xFF
    sh = 2 * (k % 4)
    b[66 + k // 4] = (int(b[66 + k // 4]) & ~(3 << sh) & 0xFF) | (v >> 8) << sh


def iq3_xxs_index(b, k, v):
    b[2 + k] = v


def iq3_s_index(b, k, v):
    # Low 8 bits in qs[k], the ninth in bit k % 8 of qh[k / 8].
    b[2 + k] = v & 0xFF
    sh = k % 8
    b[66 + k // 8] = (int(b[66 + k // 8]) & ~(1 << sh) & 0xFF) | (v >> 8) << sh


# (grid entries, indices per block, setter) of the grid types.
GRIDS = {
    "IQ2_XXS": (256, 32, iq2_xxs_index),
    "IQ2_XS": (512, 32, iq2_xs_index),
    "IQ2_S": (1024, 32, iq2_s_index),
    "IQ3_XXS": (256, 64, iq3_xxs_index),
    "IQ3_S": (512, 64, iq3_s_index),
}


def main():
    out = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "quants"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(14)
    for name, offsets in F16_SCALES.items():
        qtype = T[name]
        _, type_size = GGML_QUANT_SIZES[qtype]
        n_blocks = BLOCKS
        if name in GRIDS:
            entries, per_block, set_index = GRIDS[name]
            n_blocks = max(BLOCKS, entries // per_block)
        blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
        if name in GRIDS:
            sweep = rng.permutation(entries)
            extra = rng.integers(0, entries, size=n_blocks * per_block - entries)
            for i, v in enumerate(np.concatenate([sweep, extra])):
                set_index(blocks[i // per_block], i % per_block, int(v))
        for o in offsets:
            scales = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
            blocks[:, o:o + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
        raw = blocks.reshape(-1)
        with np.errstate(over="ignore"):
            values = dequantize(raw, qtype).astype("<f4")
        (out / f"{name.lower()}.bin").write_bytes(raw.tobytes() + values.tobytes())


if __name__ == "__main__":
    main()
