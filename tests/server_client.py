"""Drives a running `vkllm serve` with the official openai client; prints one
JSON object of observations for tests/server/ to check.

usage: server_client.py BASE_URL
       server_client.py BASE_URL --tools   (a server whose template takes tools)
"""

import json
import sys
import threading
import time

import openai

base = sys.argv[1]
client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
out = {}


def tools_round_trip():
    """A tool-call round trip as an agent runs it: tools offered, the
    assistant's call and the tool's answer fed back, streamed and not."""
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
    ]
    r = client.chat.completions.create(
        model="any", messages=messages, tools=[weather], tool_choice="auto", temperature=0, max_tokens=8
    )
    m = r.choices[0].message
    out["tools"] = {
        "role": m.role,
        "finish_reason": r.choices[0].finish_reason,
        "tool_calls": [[c.function.name, json.loads(c.function.arguments)] for c in (m.tool_calls or [])],
        "prompt_tokens": r.usage.prompt_tokens,
    }
    stream = client.chat.completions.create(
        model="any", messages=messages, tools=[weather], temperature=0, max_tokens=8, stream=True
    )
    finish = None
    for c in stream:
        if c.choices and c.choices[0].finish_reason:
            finish = c.choices[0].finish_reason
    out["tools_stream"] = {"finish_reason": finish}
    try:
        client.chat.completions.create(
            model="any",
            messages=messages[:1],
            tools=[weather],
            tool_choice={"type": "function", "function": {"name": "nope"}},
            max_tokens=2,
        )
        out["tools_bad_choice"] = "accepted"
    except openai.BadRequestError as e:
        out["tools_bad_choice"] = e.status_code


if sys.argv[2:] == ["--tools"]:
    tools_round_trip()
    print(json.dumps(out))
    sys.exit(0)
ask = [{"role": "user", "content": "What is the capital of France?"}]

# Chat, not streamed: greedy, so the answer is fixed.
r = client.chat.completions.create(model="any", messages=ask, temperature=0, max_tokens=24)
out["chat"] = {
    "content": r.choices[0].message.content,
    "role": r.choices[0].message.role,
    "finish_reason": r.choices[0].finish_reason,
    "usage": [r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens],
    "object": r.object,
}

# The same, streamed: the chunks add up to the same text.
chunks = client.chat.completions.create(
    model="any", messages=ask, temperature=0, max_tokens=24, stream=True
)
pieces, finish = [], None
for c in chunks:
    if c.choices and c.choices[0].delta.content:
        pieces.append(c.choices[0].delta.content)
    if c.choices and c.choices[0].finish_reason:
        finish = c.choices[0].finish_reason
out["chat_stream"] = {"content": "".join(pieces), "chunks": len(pieces), "finish_reason": finish}

# Text completions: max_tokens ends with "length", a stop string with "stop".
r = client.completions.create(model="any", prompt="The capital of France is", max_tokens=5, temperature=0)
out["completion"] = {"text": r.choices[0].text, "finish_reason": r.choices[0].finish_reason}
r = client.completions.create(
    model="any", prompt="The capital of France is", max_tokens=20, temperature=0, stop=["\n"]
)
out["completion_stop"] = {"text": r.choices[0].text, "finish_reason": r.choices[0].finish_reason}
stream = client.completions.create(
    model="any", prompt="The capital of France is", max_tokens=5, temperature=0, stream=True
)
out["completion_stream"] = "".join(c.choices[0].text for c in stream)

# A seed makes sampling repeatable.
def sampled(seed):
    r = client.chat.completions.create(
        model="any", messages=ask, temperature=1.0, seed=seed, max_tokens=12
    )
    return r.choices[0].message.content

out["seeded_equal"] = sampled(7) == sampled(7)

# Bad requests are OpenAI-style errors the client raises as such.
errors = {}
for name, kwargs in {
    "empty_messages": dict(messages=[]),
    "bad_temperature": dict(messages=ask, temperature=-1),
    "n2": dict(messages=ask, n=2),
}.items():
    try:
        client.chat.completions.create(model="any", max_tokens=4, **kwargs)
        errors[name] = "accepted"
    except openai.BadRequestError as e:
        errors[name] = [e.status_code, e.body.get("message") if isinstance(e.body, dict) else str(e.body)]
out["errors"] = errors

out["models"] = [m.id for m in client.models.list().data]

# A client that leaves mid-stream: the server cancels the job and stays up.
stream = client.chat.completions.create(
    model="any", messages=ask, temperature=0, max_tokens=2000, stream=True,
    extra_body={"ignore_eos": True},
)
for i, _ in enumerate(stream):
    if i == 3:
        break
stream.close()
t = time.time()
r = client.chat.completions.create(model="any", messages=ask, temperature=0, max_tokens=24)
out["after_disconnect"] = {"content": r.choices[0].message.content, "seconds": time.time() - t}

# Four clients at once: every one is answered (queued in FIFO order).
N, TOKENS = 4, 32
results = [None] * N

def one(i):
    r = client.completions.create(
        model="any", prompt=f"Story {i}: Once upon a time", max_tokens=TOKENS,
        temperature=0, extra_body={"ignore_eos": True},
    )
    results[i] = r.usage.completion_tokens

t = time.time()
threads = [threading.Thread(target=one, args=(i,)) for i in range(N)]
for th in threads:
    th.start()
for th in threads:
    th.join()
elapsed = time.time() - t
out["concurrent"] = {"completion_tokens": results, "seconds": elapsed,
                     "tok_s": sum(x or 0 for x in results) / elapsed}
print(json.dumps(out))
