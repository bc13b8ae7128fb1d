#!/usr/bin/env python3
"""Write tests/data/gemma3_llamacpp.json: what llama.cpp's CPU backend makes of
the real Gemma 3 270M Q4_K_M GGUF (scripts/fetch-gemma3.sh), for
tests/gemma3.rs to compare against without llama.cpp installed:

- `tokenize`: llama.cpp's ids for varied texts (BOS added, special tokens
  parsed, as llama-cli does for a prompt);
- `teacher`: a long text's ids and, after every position, the top-k ids and
  logits (one batch, every position's logits requested);
- `greedy`: the greedy continuation of a short prompt;
- `chat`: the same for one user turn in Gemma's chat format (the file has no
  chat template; this 270M model is the pretrained one, so it echoes rather
  than answers, which is what llama.cpp's ids show).

llama.cpp comes from its CPU wheel `cyllama` 0.7.0 (Python 3.12):

    ~/.pyenv/versions/3.12.1/bin/python3 -m venv /tmp/cy
    /tmp/cy/bin/pip install --no-deps cyllama==0.7.0 numpy
    /tmp/cy/bin/python scripts/gemma3-llamacpp-fixture.py models/gemma-3-270m-q4_k_m.gguf \
        > tests/data/gemma3_llamacpp.json

Its CPU matmuls quantize activations to 8 bits, so the logits are close to,
not equal to, an f32 engine's; the tests state their tolerance.
"""
import importlib.metadata
import json
import sys

import numpy as np
from cyllama.llama import llama_cpp as cy

TOP_K = 5

TEXTS = [
    "The capital of France is",
    "Hello, world! How are you today?",
    "日本語のテキストも正しく分割されるべきです。東京は日本の首都です。",
    "Emoji: 😀🎉👍🏽 and flags 🇯🇵🇫🇷, a family 👨‍👩‍👧‍👦.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "fn main() { let v: Vec<u32> = (0..10).map(|x| x * x).collect(); println!(\"{v:?}\"); }",
    "   leading spaces,\ttabs\t\tand\n\n\nnewlines   trailing   ",
    "Mixed: café naïve Zürich — «quotes» “curly” 1,234.56 € 3×4=12",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "Ünïcödé ﬁ ligature, Ǆ, Ⅻ, and 한국어 문장, Русский текст, العربية.",
]

LONG_TEXT = """The old lighthouse stood at the end of a narrow spit of rock, and for most of a century its keepers had written the weather into a leather-bound log every four hours. When the light was automated, the logs were carried to the town library, where they sat in a cardboard box until a retired schoolteacher named Margaret began to read them one winter.

She found more than wind speeds. Between the columns of pressure readings, the keepers had noted ships that passed too close, a whale that stranded itself on the northern beach, the night in 1923 when the lamp's clockwork failed and the keeper turned the lens by hand until dawn. One entry, written in a shaky pencil, said only: "Fog. No bell from the harbour. Wife unwell. Kept the light."

Margaret copied the entries into a spreadsheet, one row per observation, and soon had more than ninety thousand rows. With a few lines of Python she plotted the temperature at noon for every day of every year:

    import pandas as pd
    log = pd.read_csv("lighthouse.csv", parse_dates=["time"])
    noon = log[log.time.dt.hour == 12]
    noon.groupby(noon.time.dt.year).temperature.mean().plot()

The curve rose, slowly and unevenly, by almost two degrees. She sent the chart to the university, expecting nothing, and three weeks later a young climatologist knocked on her door with a box of biscuits and a hundred questions. Together they checked the thermometers' calibration records, corrected for the move of the instrument shelter in 1952, and wrote a short paper that was cited, to Margaret's delight, by a report on coastal warming.

The logs are digitized now, and anyone can search them. But Margaret still keeps the originals in her front room, and on stormy nights she reads the pencil entries aloud, as if the keepers might be listening."""

GREEDY_PROMPT = "The capital of France is"
GREEDY_N = 24
CHAT_USER = "What is the capital of France?"
CHAT_PROMPT = f"<start_of_turn>user\n{CHAT_USER}<end_of_turn>\n<start_of_turn>model\n"
CHAT_N = 16


def greedy(model, prompt, count):
    """Prompt in one batch, then one token at a time."""
    cp = cy.LlamaContextParams()
    cp.n_ctx = 128
    cp.n_batch = 64
    cp.n_ubatch = 64
    ctx = cy.LlamaContext(model, cp)
    ctx.set_n_threads(2, 2)
    smp = cy.LlamaSampler(cy.LlamaSamplerChainParams())
    smp.add_greedy()
    ctx.decode(cy.llama_batch_get_one(prompt, 0))
    out = []
    pos = len(prompt)
    for _ in range(count):
        t = smp.sample(ctx, -1)
        out.append(int(t))
        ctx.decode(cy.llama_batch_get_one([t], pos))
        pos += 1
    ctx.close()
    return out


def main():
    path = sys.argv[1]
    cy.disable_logging()
    cy.ggml_backend_load_all()
    mp = cy.LlamaModelParams()
    mp.n_gpu_layers = 0
    model = cy.LlamaModel(path, mp)
    vocab = model.get_vocab()
    tok = lambda text: list(vocab.tokenize(text, True, True))

    ids = tok(LONG_TEXT)
    n = len(ids)
    cp = cy.LlamaContextParams()
    cp.n_ctx = n + 64
    cp.n_batch = n
    cp.n_ubatch = n
    ctx = cy.LlamaContext(model, cp)
    ctx.set_n_threads(2, 2)
    batch = cy.LlamaBatch(n_tokens=n, embd=0, n_seq_max=1)
    for i, t in enumerate(ids):
        batch.add(t, i, [0], True)
    if ctx.decode(batch) != 0:
        sys.exit("llama_decode failed")
    top_ids, top_logits = [], []
    for i in range(n):
        row = np.asarray(ctx.get_logits_ith(i), dtype=np.float32)
        top = np.argsort(-row, kind="stable")[:TOP_K]
        top_ids.append([int(t) for t in top])
        top_logits.append([round(float(row[t]), 4) for t in top])
    ctx.close()

    pids = tok(GREEDY_PROMPT)
    cids = tok(CHAT_PROMPT)
    json.dump(
        {
            "source": "llama.cpp CPU via cyllama " + importlib.metadata.version("cyllama")
            + ", 2 threads, n_gpu_layers 0",
            "model_sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            "tokenize": [{"text": t, "ids": tok(t)} for t in TEXTS],
            "teacher": {
                "text": LONG_TEXT,
                "ids": ids,
                "top_k": TOP_K,
                "top_ids": top_ids,
                "top_logits": top_logits,
            },
            "greedy": {"prompt": GREEDY_PROMPT, "prompt_ids": pids,
                       "ids": greedy(model, pids, GREEDY_N)},
            "chat": {"user": CHAT_USER, "prompt_ids": cids, "ids": greedy(model, cids, CHAT_N)},
        },
        sys.stdout,
        ensure_ascii=False,
        separators=(",", ":"),
    )
    print()


if __name__ == "__main__":
    main()
