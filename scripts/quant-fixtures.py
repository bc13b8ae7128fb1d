#!/usr/bin/env python3
"""Writes tests/data/quants/<type>.bin: blocks of random bytes of every
quantized GGUF type vkllm reads, followed by their values as the `gguf`
package (gguf-py 0.19.0, an independent codec) dequantizes them, as
little-endian f32. tests/quant.rs decodes the same blocks and compares bit
for bit.

The bytes are uniform random except the block scales, which are set to
random finite f16 values (random bits could be inf or NaN).

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
}
BLOCKS = 6


def main():
    out = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "quants"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(14)
    for name, offsets in F16_SCALES.items():
        qtype = T[name]
        _, type_size = GGML_QUANT_SIZES[qtype]
        blocks = rng.integers(0, 256, size=(BLOCKS, type_size), dtype=np.uint8)
        for o in offsets:
            scales = (rng.standard_normal(BLOCKS) * 0.05).astype(np.float16)
            blocks[:, o:o + 2] = scales.view(np.uint8).reshape(BLOCKS, 2)
        raw = blocks.reshape(-1)
        with np.errstate(over="ignore"):
            values = dequantize(raw, qtype).astype("<f4")
        (out / f"{name.lower()}.bin").write_bytes(raw.tobytes() + values.tobytes())


if __name__ == "__main__":
    main()
