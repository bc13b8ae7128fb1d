#!/usr/bin/env python3
"""Write tests/data/gemma3_f64.json: the real Gemma 3 270M Q4_K_M GGUF run by
a plain numpy float64 transcription of Gemma 3 (weights dequantized by the
`gguf` package, which is llama.cpp's own gguf-py), on the inputs of
tests/data/gemma3_llamacpp.json. llama.cpp's CPU backend quantizes
activations to 8 bits and stores the KV cache in f16, so its logits sit up to
a few units from the exact ones; this file is the exact math, so tests can
hold an f32 engine to a tight bound as well as to llama.cpp's agreement.

    /tmp/cy/bin/pip install --no-deps gguf==0.19.0 numpy pyyaml tqdm requests
    /tmp/cy/bin/python scripts/gemma3-f64-reference.py models/gemma-3-270m-q4_k_m.gguf \
        > tests/data/gemma3_f64.json

Gemma 3 as llama.cpp runs it: embeddings × √n_embd; per layer RMSNorm (the
converter already added Gemma's 1 to every norm weight), q/k RMSNorm per
head, NeoX rope (base 10,000 on local layers, 1,000,000 on every 6th, global,
layer; a 512-position window that these short inputs never reach), scores
× 1/√head_dim, post-attention and post-FFN RMSNorms, tanh-GELU gated FFN,
the output head tied to the embeddings.
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

EPS = 1e-6


def main():
    r = GGUFReader(sys.argv[1])
    fx = json.load(open(sys.argv[2] if len(sys.argv) > 2 else "tests/data/gemma3_llamacpp.json"))
    tensors = {t.name: t for t in r.tensors}

    def field(k):
        return r.fields[k].contents()

    E = int(field("gemma3.embedding_length"))
    H = int(field("gemma3.attention.head_count"))
    HKV = int(field("gemma3.attention.head_count_kv"))
    D = int(field("gemma3.attention.key_length"))
    L = int(field("gemma3.block_count"))
    cache = {}

    def w(name):
        if name not in cache:
            t = tensors[name]
            cache[name] = dequantize(t.data, t.tensor_type).astype(np.float64)
        return cache[name]

    emb = w("token_embd.weight")

    def rms(v, g):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + EPS) * g

    def rope(v, base, n):
        half = D // 2
        inv = base ** (-np.arange(half) * 2.0 / D)
        ang = np.arange(n)[:, None] * inv[None, :]
        c, s = np.cos(ang), np.sin(ang)
        a, b = v[..., :half], v[..., half:]
        return np.concatenate([a * c - b * s, a * s + b * c], -1)

    def gelu(v):
        return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3)))

    def forward(ids):
        """Final hidden states (after output_norm) of every position."""
        n = len(ids)
        x = emb[ids] * np.sqrt(E)
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for layer in range(L):
            p = f"blk.{layer}."
            base = 1e6 if (layer + 1) % 6 == 0 else 1e4
            h = rms(x, w(p + "attn_norm.weight"))
            q = rms((h @ w(p + "attn_q.weight").T).reshape(n, H, D), w(p + "attn_q_norm.weight"))
            k = rms((h @ w(p + "attn_k.weight").T).reshape(n, HKV, D), w(p + "attn_k_norm.weight"))
            v = (h @ w(p + "attn_v.weight").T).reshape(n, HKV, D)
            q = np.stack([rope(q[:, i], base, n) for i in range(H)], 1)
            k = np.stack([rope(k[:, i], base, n) for i in range(HKV)], 1)
            o = np.zeros((n, H, D))
            for i in range(H):
                j = i * HKV // H
                s = q[:, i] @ k[:, j].T / np.sqrt(D) + mask
                s = np.exp(s - s.max(-1, keepdims=True))
                s /= s.sum(-1, keepdims=True)
                o[:, i] = s @ v[:, j]
            a = o.reshape(n, H * D) @ w(p + "attn_output.weight").T
            x = x + rms(a, w(p + "post_attention_norm.weight"))
            h = rms(x, w(p + "ffn_norm.weight"))
            f = gelu(h @ w(p + "ffn_gate.weight").T) * (h @ w(p + "ffn_up.weight").T)
            x = x + rms(f @ w(p + "ffn_down.weight").T, w(p + "post_ffw_norm.weight"))
        return rms(x, w("output_norm.weight"))

    def greedy(prompt, count):
        ids = list(prompt)
        for _ in range(count):
            ids.append(int((forward(ids)[-1] @ emb.T).argmax()))
        return ids[len(prompt):]

    t = fx["teacher"]
    hidden = forward(t["ids"])
    argmax, at_top = [], []
    for pos, top in enumerate(t["top_ids"]):
        logits = hidden[pos] @ emb.T
        argmax.append(int(logits.argmax()))
        at_top.append([round(float(logits[i]), 4) for i in top])
    g = fx["greedy"]
    json.dump(
        {
            "source": "numpy float64, weights dequantized by gguf 0.19.0 (scripts/gemma3-f64-reference.py)",
            "teacher": {"argmax": argmax, "logits_at_llamacpp_top": at_top},
            "greedy": {"prompt_ids": g["prompt_ids"], "ids": greedy(g["prompt_ids"], len(g["ids"]))},
            "chat": {"prompt_ids": fx["chat"]["prompt_ids"],
                     "ids": greedy(fx["chat"]["prompt_ids"], len(fx["chat"]["ids"]))},
        },
        sys.stdout,
        separators=(",", ":"),
    )
    print()


if __name__ == "__main__":
    main()
