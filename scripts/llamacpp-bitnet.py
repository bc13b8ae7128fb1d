#!/usr/bin/env python3
"""A llama.cpp second opinion on the BitNet GGUF `vkllm convert` writes for
tests/data/reference/tiny/bitnet. llama.cpp's `bitnet` graph differs from
the model as trained (README, BitNet): it runs SiLU whatever
`bitnet.hidden_activation` says (it knows no relu2) and does not round
activations per token. So its logits are compared with transformers'
BitNetForCausalLM computing what llama.cpp's graph means: the same ternary
weights times their absmean scales as float linears, SiLU, no rounding.
Agreement says llama.cpp reads our file (names, sub-norms, `.scale`
tensors, tied head) as we write it.

    cargo build --release --bin vkllm
    /tmp/cy/bin/python scripts/llamacpp-bitnet.py   # runs /work/pyref/bin/python for transformers

Prints the largest logit difference and exits nonzero above 1e-4.
"""
import json
import os
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
tiny = os.path.join(root, "tests", "data", "reference", "tiny", "bitnet")
TOL = 1e-4


def transformers_side(out):
    """llama.cpp's semantics in transformers, logits to `out` (.npy)."""
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    import numpy as np
    import torch
    from safetensors.torch import load_file
    from transformers import BitNetConfig, BitNetForCausalLM

    with open(os.path.join(tiny, "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config")
    cfg["hidden_act"] = "silu"
    config = BitNetConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version", "torch_dtype")})
    config._attn_implementation = "eager"
    model = BitNetForCausalLM(config).to(torch.float32)
    state = load_file(os.path.join(tiny, "model.safetensors"))
    proj = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for name, w in state.items():
        if name.endswith(tuple(p + ".weight" for p in proj)):
            s = 1.0 / w.abs().mean().clamp(min=1e-5)
            state[name] = (w * s).round().clamp(-1, 1) / s
    model.load_state_dict(state, strict=False)
    model.lm_head.weight = model.model.embed_tokens.weight
    model.eval()
    with open(os.path.join(tiny, "reference.json")) as f:
        ids = json.load(f)["prompt_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double().numpy()
    np.save(out, logits)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--transformers":
        return transformers_side(sys.argv[2])
    import numpy as np
    from llamacpp_logits import llama_cpp_logits

    with tempfile.TemporaryDirectory() as tmp:
        want = os.path.join(tmp, "want.npy")
        subprocess.run(["/work/pyref/bin/python", os.path.abspath(__file__), "--transformers", want], check=True)
        gguf = os.path.join(tmp, "bitnet.gguf")
        vkllm = os.path.join(root, "target", "release", "vkllm")
        subprocess.run([vkllm, "convert", tiny, "-o", gguf], check=True, capture_output=True)
        with open(os.path.join(tiny, "reference.json")) as f:
            ids = json.load(f)["prompt_ids"]
        got = llama_cpp_logits(gguf, ids)
        ref = np.load(want)
        err = np.abs(got - ref).max()
        same = int((got.argmax(1) == ref.argmax(1)).sum())
        print(f"bitnet: llama.cpp on vkllm convert's GGUF vs transformers (SiLU, no rounding): "
              f"max |dlogit| {err:.2e}, argmax {same}/{len(ids)}")
        sys.exit(0 if err < TOL else 1)


if __name__ == "__main__":
    main()
