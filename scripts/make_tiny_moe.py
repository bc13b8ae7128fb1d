#!/usr/bin/env python3
"""Write the tiny mixture-of-experts reference models in
tests/data/reference/tiny/{qwen3moe,mixtral,gpt_oss,gpt_oss_mxfp4}/: a
Hugging Face directory each (config.json, model.safetensors as transformers'
save_pretrained writes it) and reference.json (prompt_ids, logits at every
position, greedy_16), from transformers in float32 with eager attention.

    /work/pyref/bin/python scripts/make_tiny_moe.py [OUT_DIR]

Every parameter is drawn here from one seeded generator (matrices N(0, 0.1),
norm weights 1 + N(0, 0.1), biases N(0, 0.1), gpt-oss's sinks N(0, 1)), not by
transformers' init, so a rerun writes the same bytes whatever its version's
init does. gpt_oss_mxfp4 holds gpt_oss's weights with the experts in the
MXFP4 `*_blocks`/`*_scales` form of the real checkpoints; its logits come
from the experts as transformers' own MXFP4 loader dequantizes those blocks,
so they prove the files mean what we read them as.
"""
import json
import math
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import (
    GptOssConfig,
    GptOssForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)
import transformers
from transformers.integrations.mxfp4 import dequantize_convertops

SEED = 0
PROMPT_LEN = 24
GREEDY = 16
VOCAB = 512

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    initializer_range=0.1,
    tie_word_embeddings=False,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


def configs():
    return {
        # Qwen3-30B-A3B's shape in small: 8 experts, top 2, renormalized.
        "qwen3moe": (
            Qwen3MoeForCausalLM,
            Qwen3MoeConfig(
                **COMMON,
                head_dim=16,
                intermediate_size=128,
                moe_intermediate_size=32,
                num_experts=8,
                num_experts_per_tok=2,
                norm_topk_prob=True,
                decoder_sparse_step=1,
                mlp_only_layers=[],
                max_position_embeddings=256,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                rms_norm_eps=1e-6,
            ),
        ),
        # Mixtral: a llama with 8 experts, top 2.
        "mixtral": (
            MixtralForCausalLM,
            MixtralConfig(
                **COMMON,
                head_dim=16,
                intermediate_size=32,
                num_local_experts=8,
                num_experts_per_tok=2,
                max_position_embeddings=256,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                rms_norm_eps=1e-5,
                sliding_window=None,
            ),
        ),
        # gpt-oss: 4 experts, top 2, biases everywhere, attention sinks,
        # sliding window 4 on layer 0, YaRN. `truncate: true` rounds the
        # correction range as llama.cpp always does (the real checkpoints say
        # false; transformers' default when the key is absent is true).
        # max_position_embeddings = factor x original, so transformers does not
        # warn about an inconsistent factor.
        "gpt_oss": (
            GptOssForCausalLM,
            GptOssConfig(
                **COMMON,
                head_dim=16,
                intermediate_size=32,
                num_local_experts=4,
                num_experts_per_tok=2,
                sliding_window=4,
                layer_types=["sliding_attention", "full_attention"],
                max_position_embeddings=2048,
                rope_parameters={
                    "rope_type": "yarn",
                    "rope_theta": 150000.0,
                    "factor": 32.0,
                    "original_max_position_embeddings": 64,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "truncate": True,
                },
                rms_norm_eps=1e-5,
                attention_bias=True,
            ),
        ),
    }


def randomize(model, gen):
    """Every parameter from `gen`, by its role (see the module docstring)."""
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            shape = tuple(p.shape)
            if name.endswith("norm.weight"):
                v = 1.0 + 0.1 * torch.randn(shape, generator=gen)
            elif name.endswith("sinks"):
                v = torch.randn(shape, generator=gen)
            elif name.endswith(("mlp.gate.weight", "mlp.router.weight")):
                # Routers wider than the rest, so the top-k choices stand
                # clear of float rounding (see MARGIN).
                v = 0.3 * torch.randn(shape, generator=gen)
            else:
                # Matrices, 3-D expert stacks, biases, routers.
                v = 0.1 * torch.randn(shape, generator=gen)
            p.copy_(v)
        # gpt-oss clamps the expert gate at 7 and up at ±7 before its SwiGLU;
        # push a few units well past the limits so an engine that skips the
        # clamp gets other logits. gate_up_proj_bias is interleaved: gate at
        # even columns, up at odd ones.
        for name, p in model.named_parameters():
            if name.endswith("experts.gate_up_proj_bias"):
                experts, width = p.shape
                for e in range(experts):
                    p[e, 0] = 9.0 + e  # gate of unit 0 above 7
                    p[e, 3] = 9.0  # up of unit 1 above 7
                    p[e, 5] = -9.0  # up of unit 2 below -7
                assert width >= 6


def fp4_quantize(w):
    """MXFP4 as the gpt-oss checkpoints store it: `w` is `[..., cols]` with
    cols a multiple of 32; returns (blocks `[..., cols/32, 16]` u8, scales
    `[..., cols/32]` u8). Element 2j of a block is byte j's low nibble, 2j+1
    its high nibble (transformers' convert_moe_packed_tensors); the value is
    FP4 x 2^(scale - 127). Scale as ggml's quantize_row_mxfp4_ref picks it."""
    lut = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    *lead, cols = w.shape
    x = w.reshape(*lead, cols // 32, 32)
    amax = x.abs().amax(-1)
    e = torch.where(amax > 0, torch.floor(torch.log2(amax)) - 2 + 127, torch.zeros_like(amax))
    e = e.clamp(0, 255)
    scaled = x / torch.pow(2.0, e - 127)[..., None]
    # Nearest FP4 value, the first on ties (torch.argmin returns the first).
    idx = (scaled[..., None] - lut).abs().argmin(-1).to(torch.uint8)
    blocks = idx[..., 0::2] | (idx[..., 1::2] << 4)
    return blocks.contiguous(), e.to(torch.uint8).contiguous()


def reference(model, arch, prompt, seed):
    """reference.json's content, and the smallest gap between the largest
    and second largest logit over the prompt's rows and the greedy steps."""
    model.eval()
    with torch.no_grad():
        logits = model(prompt[None]).logits[0]
        ids = prompt.tolist()
        greedy = []
        margin = top_gap(logits)
        # A full pass per token (no cache): the definition, whatever the
        # cache classes do with sliding windows.
        for _ in range(GREEDY):
            last = model(torch.tensor([ids])).logits[0, -1]
            margin = min(margin, top_gap(last[None]))
            nxt = int(last.argmax())
            greedy.append(nxt)
            ids.append(nxt)
    return margin, {
        "architecture": arch,
        "transformers": transformers.__version__,
        "seed": seed,
        "prompt_ids": prompt.tolist(),
        "logits": [[round(float(v), 6) for v in row] for row in logits],
        "greedy_16": greedy,
    }


def routing(model, ids):
    """Per layer: how often the tokens of `ids` pick each expert, and the
    smallest gap between a token's k-th and (k+1)-th router logit."""
    logits = []
    hooks = []
    for layer in model.model.layers:
        router = getattr(layer.mlp, "gate", None) or getattr(layer.mlp, "router", None)
        hooks.append(router.register_forward_hook(lambda _m, _i, out: logits.append(out[0])))
    with torch.no_grad():
        model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    n, k = model.config.num_local_experts, model.config.num_experts_per_tok
    use, gaps = [], []
    for lg in logits:
        top = lg.topk(k + 1, dim=-1)
        picks = top.indices[:, :k].flatten().tolist()
        use.append([picks.count(e) for e in range(n)])
        gaps.append((top.values[:, k - 1] - top.values[:, k]).min().item())
    return use, gaps


def top_gap(logits):
    """The smallest gap between a row's largest and second largest logit."""
    top = logits.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).min().item()


# A seed is kept when every expert serves the prompt and greedy tokens in every layer (a wrong
# expert offset cannot go unseen) and no choice is closer than this, for
# routing over the prompt and the greedy tokens and for each greedy argmax (an
# engine's float rounding, ~1e-5 in f32 and ~1e-3 with f16 products, must not
# flip one).
MARGIN = 5e-3


def judge(model, name, prompt, seed):
    """(reference, passes): whether `model` meets the margins above."""
    margin, ref = reference(model, name, prompt, seed)
    use, gaps = routing(model, ref["prompt_ids"] + ref["greedy_16"])
    ok = all(min(u) > 0 for u in use) and min(gaps) >= MARGIN and margin >= MARGIN
    print(f"{name}: weight seed {seed}, expert use per layer {use}, "
          f"router margin {min(gaps):.4f}, logit margin {margin:.4f}"
          + ("" if ok else " (rejected)"))
    return ref, ok


def mxfp4_experts(model):
    """gpt-oss's expert matrices as the real checkpoints store them:
    `{name_blocks, name_scales}` per stacked matrix. Stored `[experts, in,
    out]` (x @ W), the blocks run along `in` for each output row:
    `[experts, out, in/32, 16]`."""
    out = {}
    for name, p in model.named_parameters():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            blocks, scales = fp4_quantize(p.detach().transpose(1, 2).contiguous())
            out[name + "_blocks"] = blocks
            out[name + "_scales"] = scales
    return out


def dequantized_copy(model, cls, cfg, packed):
    """`model` with its experts as transformers' MXFP4 loader reads `packed`.
    from_pretrained runs the same dequantize_convertops on the CPU, but needs
    `accelerate` installed to get there."""
    q = cls(cfg).to(torch.float32)
    q.load_state_dict(model.state_dict())
    q.eval()
    with torch.no_grad():
        for name, p in q.named_parameters():
            if name + "_blocks" in packed:
                deq = dequantize_convertops(packed[name + "_blocks"], packed[name + "_scales"], torch.float32)
                assert deq.shape == p.shape, (name, deq.shape, p.shape)
                # FP4 keeps each value within a quarter of its block's largest.
                assert (deq - p).abs().max() <= 0.25 * p.abs().max(), name
                p.copy_(deq)
    return q


def write(out_dir, name, model, ref):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d)
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f)
    return d


def write_mxfp4(out_dir, float_dir, packed, ref):
    """gpt_oss's directory with the experts in their MXFP4 form."""
    d = os.path.join(out_dir, "gpt_oss_mxfp4")
    os.makedirs(d, exist_ok=True)
    tensors = load_file(os.path.join(float_dir, "model.safetensors"))
    for name in list(tensors):
        if name + "_blocks" in packed:
            del tensors[name]
            tensors[name + "_blocks"] = packed[name + "_blocks"]
            tensors[name + "_scales"] = packed[name + "_scales"]
    save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(float_dir, "config.json")) as f:
        cfg = json.load(f)
    # As openai/gpt-oss-20b's config says it.
    cfg["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"],
    }
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests", "data", "reference", "tiny")
    torch.manual_seed(SEED)
    prompt = torch.randint(0, VOCAB, (PROMPT_LEN,))
    for name, (cls, cfg) in configs().items():
        cfg._attn_implementation = "eager"
        for seed in range(200):
            torch.manual_seed(seed)
            model = cls(cfg).to(torch.float32)
            randomize(model, torch.Generator().manual_seed(seed))
            model.eval()
            ref, ok = judge(model, name, prompt, seed)
            if ok and name == "gpt_oss":
                packed = mxfp4_experts(model)
                q = dequantized_copy(model, cls, cfg, packed)
                q_ref, ok = judge(q, "gpt_oss_mxfp4", prompt, seed)
            if ok:
                break
        else:
            sys.exit(f"{name}: no seed below 200 meets the margins")
        d = write(out_dir, name, model, ref)
        if name == "gpt_oss":
            write_mxfp4(out_dir, d, packed, q_ref)
    for name in ["qwen3moe", "mixtral", "gpt_oss", "gpt_oss_mxfp4"]:
        d = os.path.join(out_dir, name)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print(f"{name}: {size} bytes")
        assert size < 1 << 20, f"{name} is over 1 MiB"


if __name__ == "__main__":
    main()
