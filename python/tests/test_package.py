"""The vkllm Python package against the `vkllm` binary, SmolLM2 and the tiny
reference models, on the CPU and on Vulkan (lavapipe in CI)."""

import json
import threading
import time

import numpy as np
import pytest

import vkllm
from conftest import SMOLLM2, TINY, open_model, tiny_archs

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
# Tokens per generation: lavapipe decodes a few tokens a second on 2 cores.
N = {"cpu": 24, "vulkan": 6}


def test_load(smollm2, backend):
    assert smollm2.backend.startswith(backend)
    assert smollm2.n_vocab == 49152
    assert smollm2.n_ctx > 0
    assert "<|im_start|>" in smollm2.chat_template


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_cli(smollm2, backend, cli, prompt):
    n = N[backend]
    want = cli("generate", "-m", str(SMOLLM2), "-b", backend, "-p", prompt, "-n", str(n), "--temperature", "0")
    assert smollm2.generate(prompt, max_tokens=n, temperature=0) == want["text"]
    # The same ids, given verbatim.
    assert smollm2.generate(want["prompt_ids"], max_tokens=n, temperature=0) == want["text"]
    assert smollm2.generate_tokens(want["prompt_ids"], max_tokens=n, temperature=0) == want["tokens"]


def test_sampled_equals_cli(smollm2, backend, cli):
    prompt = PROMPTS[0]
    n = N[backend]
    args = ["-n", str(n), "--temperature", "0.7", "--top-p", "0.9", "-s", "42"]
    want = cli("generate", "-m", str(SMOLLM2), "-b", backend, "-p", prompt, *args)
    got = smollm2.generate(prompt, max_tokens=n, temperature=0.7, top_p=0.9, seed=42)
    assert got == want["text"]
    assert smollm2.generate(prompt, max_tokens=n, temperature=0.7, top_p=0.9, seed=42) == got


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_stream_concatenates_to_text(smollm2, backend, temperature):
    kw = dict(max_tokens=N[backend], temperature=temperature, seed=7)
    text = smollm2.generate(PROMPTS[1], **kw)
    stream = smollm2.generate(PROMPTS[1], stream=True, **kw)
    assert isinstance(stream, vkllm.TextStream)
    pieces = list(stream)
    assert len(pieces) > 1
    assert all(pieces)
    assert "".join(pieces) == text


def test_stop_string(smollm2, backend):
    full = smollm2.generate(PROMPTS[0], max_tokens=N[backend], temperature=0)
    assert "." in full
    cut = smollm2.generate(PROMPTS[0], max_tokens=N[backend], temperature=0, stop=["."])
    assert cut == full[: full.index(".")]


def test_closed_stream_frees_the_model(smollm2):
    stream = smollm2.generate(PROMPTS[0], max_tokens=64, temperature=0, stream=True)
    next(stream)
    stream.close()
    assert list(stream) == []
    # The next call gets the model once the abandoned generation has ended.
    assert smollm2.generate(PROMPTS[0], max_tokens=4, temperature=0)


def test_tokenize_round_trip(smollm2, cli):
    text = "Hello world, this is vkllm: ünïcödé and 12345."
    ids = smollm2.tokenize(text)
    assert ids == cli("tokenize", "-m", str(SMOLLM2), "--text", text)["ids"]
    assert smollm2.detokenize(ids) == text
    assert smollm2.tokenize(text, add_bos=False) == ids  # SmolLM2 asks for no BOS


def test_logits_numpy_view(smollm2, backend, cli):
    ids = smollm2.tokenize(PROMPTS[0])
    logits = smollm2.logits(ids)
    assert logits.shape == (len(ids), smollm2.n_vocab)
    assert len(logits) == len(ids)
    a = np.asarray(logits)
    assert a.shape == logits.shape and a.dtype == np.float32
    # A view of the engine's buffer, not a copy: it keeps `logits` alive.
    assert a.base is logits
    assert np.shares_memory(a, np.asarray(logits))
    assert not a.flags.writeable
    assert list(a[-1, :4]) == logits[-1][:4]
    want = cli("logits", "-m", str(SMOLLM2), "-b", backend, "--prompt-ids", ",".join(map(str, ids)))
    np.testing.assert_allclose(a, np.array(want["logits"], dtype=np.float32), rtol=0, atol=1e-5)
    # The last row's argmax is the greedy first token.
    assert int(a[-1].argmax()) == smollm2.generate_tokens(ids, max_tokens=1, temperature=0)[0]


def test_chat(smollm2, backend, cli):
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    rendered = smollm2.apply_chat_template(messages)
    assert rendered.endswith("<|im_start|>assistant\n")
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>" in rendered
    n = N[backend]
    reply = smollm2.chat(messages, max_tokens=n, temperature=0)
    want = cli(
        "generate", "-m", str(SMOLLM2), "-b", backend, "--chat", "--system", "Answer briefly.",
        "-p", "What is the capital of France?", "-n", str(n), "--temperature", "0",
    )
    assert reply == want["text"]
    assert reply.strip()
    assert "".join(smollm2.chat(messages, max_tokens=n, temperature=0, stream=True)) == reply


def test_errors(smollm2, tmp_path):
    missing = tmp_path / "no-such-model.gguf"
    with pytest.raises(vkllm.VkllmError, match="cannot read .*no-such-model.gguf"):
        vkllm.Model(missing, backend="cpu")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file")
    with pytest.raises(vkllm.VkllmError) as e:
        vkllm.Model(bad, backend="cpu")
    assert str(e.value) and "\n" not in str(e.value)
    with pytest.raises(vkllm.VkllmError, match="unknown backend 'gpu'"):
        vkllm.Model(SMOLLM2, backend="gpu")
    with pytest.raises(vkllm.VkllmError, match="unknown kv_cache"):
        vkllm.Model(SMOLLM2, backend="cpu", kv_cache="f8")
    with pytest.raises(vkllm.VkllmError, match="outside the model's vocabulary"):
        smollm2.generate([1, 10**6], max_tokens=4)
    with pytest.raises(vkllm.VkllmError, match="prompt is empty"):
        smollm2.logits([])
    with pytest.raises(vkllm.VkllmError, match="not a finite number"):
        smollm2.generate("Hi", temperature=float("nan"))
    with pytest.raises(vkllm.VkllmError, match="message 0 needs a string 'content'"):
        smollm2.chat([{"role": "user"}])
    # The model still works after each failure.
    assert smollm2.generate("Hi", max_tokens=2, temperature=0)


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def check_person(text: str) -> None:
    value = json.loads(text)
    assert set(value) == {"name", "age"}, text
    assert isinstance(value["name"], str) and len(value["name"]) <= 12, text
    assert isinstance(value["age"], int) and 0 <= value["age"] <= 120, text


def test_structured_output(smollm2, backend, cli, tmp_path):
    # The digits a regex allows, on each backend.
    year = smollm2.generate("The year is", max_tokens=8, temperature=0, regex=r" [0-9]{4}")
    assert len(year) == 5 and year[0] == " " and year[1:].isdigit(), year
    if backend != "cpu":
        return  # lavapipe decodes a few tokens a second
    messages = [{"role": "user", "content": "Give a name and an age as JSON."}]
    # Greedy under a schema: the CLI's text, valid against the schema,
    # whether the schema comes as a dict or as JSON text.
    greedy = smollm2.chat(messages, max_tokens=64, temperature=0, json_schema=PERSON)
    check_person(greedy)
    assert smollm2.chat(messages, max_tokens=64, temperature=0, json_schema=json.dumps(PERSON)) == greedy
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    want = cli(
        "generate", "-m", str(SMOLLM2), "-b", backend, "--chat", "-p", messages[0]["content"],
        "-n", "64", "--temperature", "0", "--json-schema", str(schema),
    )
    assert greedy == want["text"]
    # Sampled and streamed, any JSON object, and a Lark grammar.
    for seed in (1, 2, 3):
        pieces = list(smollm2.chat(messages, max_tokens=64, temperature=1.0, seed=seed, json_schema=PERSON, stream=True))
        check_person("".join(pieces))
    obj = smollm2.generate("A JSON object:", max_tokens=48, temperature=0.8, seed=4, json_object=True)
    assert obj.lstrip().startswith("{"), obj
    answer = smollm2.generate("Is water wet?", max_tokens=4, temperature=0.8, seed=5, grammar='start: " yes" | " no"')
    assert answer in (" yes", " no"), answer
    with pytest.raises(vkllm.VkllmError, match="at most one of json_schema"):
        smollm2.generate("x", max_tokens=4, json_object=True, regex="a")
    with pytest.raises(vkllm.VkllmError, match="json_schema is not JSON"):
        smollm2.generate("x", max_tokens=4, json_schema="{not json")
    with pytest.raises(vkllm.VkllmError):
        smollm2.generate("x", max_tokens=4, json_schema={"type": "no-such-type"})
    with pytest.raises(vkllm.VkllmError):
        smollm2.generate("x", max_tokens=4, grammar="start: (")
    assert smollm2.generate("Hi", max_tokens=2, temperature=0)


def test_gil_released_while_generating(smollm2, backend):
    done = threading.Event()
    ticks = 0

    def work():
        smollm2.generate(PROMPTS[1], max_tokens=2 * N[backend], temperature=0, ignore_eos=True)
        done.set()

    t = threading.Thread(target=work)
    start = time.perf_counter()
    t.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    t.join()
    elapsed = time.perf_counter() - start
    # With the GIL held by the engine this loop could not run at all.
    assert elapsed > 0.05 and ticks > 10, (elapsed, ticks)


@pytest.mark.parametrize("arch", tiny_archs())
def test_tiny_models_match_transformers(arch, backend):
    """Logits and greedy tokens of the tiny random models (driven by ids:
    they carry no tokenizer) against transformers' reference. The CPU is held
    to the Rust suite's 1e-4; Vulkan's tiles may round inputs (tests/tiny.rs
    checks them tightly), so 1e-2 here."""
    ref = json.loads((TINY / arch / "reference.json").read_text())
    model = open_model(TINY / arch, backend, kv_cache="f32")
    prompt = ref["prompt_ids"]
    logits = np.asarray(model.logits(prompt))
    want = np.array(ref["logits"], dtype=np.float32)
    assert logits.shape == want.shape
    tol = 1e-4 if backend == "cpu" else 1e-2
    assert np.abs(logits - want).max() < tol
    assert model.generate_tokens(prompt, max_tokens=16, temperature=0) == ref["greedy_16"]
    with pytest.raises(vkllm.VkllmError, match="no tokenizer"):
        model.generate(prompt)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_batch_equals_alone(arch, backend):
    """Sequences decoded together give each one's tokens alone; three
    prompts on a model of two sequences run as two groups."""
    ref = json.loads((TINY / arch / "reference.json").read_text())
    p = ref["prompt_ids"]
    prompts = [p, p[:9], p[4:]]
    model = open_model(TINY / arch, backend, kv_cache="f32", sequences=2)
    alone = [model.generate_tokens(q, max_tokens=12, temperature=0) for q in prompts]
    assert alone[0] == ref["greedy_16"][:12]
    assert model.generate_batch(prompts, max_tokens=12) == alone
    # Again: the first prompt's cached pages are reused.
    assert model.generate_batch(prompts, max_tokens=12) == alone
    # Sampled: prompt i draws with seed + i, as alone with that seed.
    kw = dict(max_tokens=12, temperature=0.9, top_k=0, top_p=1.0, min_p=0.0)
    sampled = [model.generate_tokens(q, seed=11 + i, **kw) for i, q in enumerate(prompts)]
    assert sampled != alone
    assert model.generate_batch(prompts, seed=11, **kw) == sampled
    with pytest.raises(vkllm.VkllmError, match="outside the model's vocabulary"):
        model.generate_batch([p, [10**6]], max_tokens=2)


def test_batch_smollm2(backend):
    model = open_model(SMOLLM2, backend, sequences=3)
    prompts = [model.tokenize(t) for t in PROMPTS + ["Once upon a time"]]
    n = min(N[backend], 12)
    alone = [model.generate_tokens(q, max_tokens=n, temperature=0) for q in prompts]
    assert model.generate_batch(prompts, max_tokens=n) == alone
