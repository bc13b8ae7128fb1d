#!/usr/bin/env python3
"""Proof that our GGUF files follow llama.cpp's conventions: llama.cpp (its
CPU wheel cyllama 0.7.0, Python 3.12) loads what `vkllm convert` writes for
the tiny models in tests/data/reference/tiny and its logits at every
prompt position match transformers' there. F32 weights, so llama.cpp's CPU
path quantizes no activations and the bound is tight.

gpt_oss_mxfp4 is left out: against MXFP4 weights llama.cpp's CPU quantizes
the activations to q8_0 (max |dlogit| 7e-2, argmax 22/24); the same file
with its experts dequantized to f32 by gguf-py agrees to 4.4e-6.

    ~/.pyenv/versions/3.12.1/bin/python3 -m venv /tmp/cy
    /tmp/cy/bin/pip install --no-deps cyllama==0.7.0 numpy
    cargo build --release --bin vkllm
    /tmp/cy/bin/python scripts/llamacpp-tiny.py [REFERENCE_DIR]

Prints one line per architecture and exits nonzero if any fails.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from cyllama.llama import llama_cpp as cy

ARCHS = ["llama", "qwen2", "qwen3", "gemma3", "phi3", "gpt2", "qwen3moe", "mixtral", "gpt_oss"]
# ggml's CPU tanh-GELU reads an f16 table (GGML_GELU_FP16), ~1e-3 of the
# logits; the SiLU models agree to float rounding.
TOL = {"gemma3": 2e-3, "gpt2": 2e-3}
TOL_SILU = 1e-5

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ref_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests", "data", "reference", "tiny")
vkllm = os.path.join(root, "target", "release", "vkllm")
cy.disable_logging()
cy.ggml_backend_load_all()
failed = False
with tempfile.TemporaryDirectory() as tmp:
    for arch in ARCHS:
        src = os.path.join(ref_dir, arch)
        out = os.path.join(tmp, arch + ".gguf")
        subprocess.run([vkllm, "convert", src, "-o", out], check=True, capture_output=True)
        ref = json.load(open(os.path.join(src, "reference.json")))
        ids = ref["prompt_ids"]
        want = np.array(ref["logits"], dtype=np.float64)
        try:
            mp = cy.LlamaModelParams()
            mp.n_gpu_layers = 0
            model = cy.LlamaModel(out, mp)
            cp = cy.LlamaContextParams()
            cp.n_ctx = 64
            cp.n_batch = 64
            cp.n_ubatch = 64
            # An f32 KV cache and no flash attention: llama.cpp's defaults
            # (f16 cache) would cost ~3e-3 of logit accuracy.
            cp.type_k = 0  # GGML_TYPE_F32
            cp.type_v = 0
            cp.flash_attn_type = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED
            ctx = cy.LlamaContext(model, cp)
            batch = cy.LlamaBatch(n_tokens=len(ids), embd=0, n_seq_max=1)
            for i, t in enumerate(ids):
                batch.add(t, i, [0], True)
            if ctx.decode(batch) != 0:
                raise RuntimeError("llama_decode failed")
            got = np.array([np.asarray(ctx.get_logits_ith(i)) for i in range(len(ids))], dtype=np.float64)
            err = float(np.abs(got - want).max())
            same = int((got.argmax(-1) == want.argmax(-1)).sum())
            ok = err <= TOL.get(arch, TOL_SILU) and same == len(ids)
            print(f"{arch:7} loaded by llama.cpp: max |dlogit| {err:.2e} over {len(ids)}x{want.shape[1]}, "
                  f"argmax {same}/{len(ids)} {'ok' if ok else 'FAIL'}", flush=True)
            failed |= not ok
            ctx.close()
        except Exception as e:  # one architecture failing must not hide the others
            print(f"{arch:7} FAIL: {e}", flush=True)
            failed = True
sys.exit(1 if failed else 0)
