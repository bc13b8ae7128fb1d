"""llama.cpp's teacher-forced logits through its CPU wheel (cyllama 0.7.0),
shared by the scripts that check our files against it
(llamacpp-tiny.py, llamacpp-quants.py, llamacpp-moe-fixture.py)."""
import numpy as np
from cyllama.llama import llama_cpp as cy

cy.disable_logging()
cy.ggml_backend_load_all()


def llama_cpp_logits(path, ids):
    """Every position's logits of `ids` in the GGUF at `path`, on the CPU
    with an f32 KV cache and no flash attention: llama.cpp's defaults (f16
    cache) would cost ~3e-3 of logit accuracy."""
    mp = cy.LlamaModelParams()
    mp.n_gpu_layers = 0
    model = cy.LlamaModel(path, mp)
    cp = cy.LlamaContextParams()
    cp.n_ctx = 64
    cp.n_batch = 64
    cp.n_ubatch = 64
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
    ctx.close()
    return got
