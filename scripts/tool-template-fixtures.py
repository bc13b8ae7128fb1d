#!/usr/bin/env python3
"""Writes tests/data/tool_templates.json: chat templates with tools rendered by
transformers (render_jinja_template, what apply_chat_template(tools=...) calls),
for tests/chat.rs to compare vkllm's render with byte for byte.

usage: /work/pyref/bin/python scripts/tool-template-fixtures.py
(any Python with transformers >= 4.45; written with 5.24)
"""

import json
import pathlib

from transformers.utils.chat_template_utils import render_jinja_template

root = pathlib.Path(__file__).resolve().parent.parent
data = root / "tests" / "data"

weather = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city's name."},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
clock = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time now in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string"}},
            "required": ["zone"],
        },
    },
}


def call(id_, name, args):
    # transformers takes arguments as a dict (OpenAI sends a JSON string;
    # vkllm's server parses it before rendering).
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


ask = {"role": "user", "content": "What is the weather in Paris, in °C?"}
called = {
    "role": "assistant",
    "content": "",
    "tool_calls": [call("call_1", "get_weather", {"city": "Paris", "unit": "celsius"})],
}
answered = {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "clear"}'}
two_calls = {
    "role": "assistant",
    "content": "Let me look.",
    "tool_calls": [
        call("call_1", "get_weather", {"city": "Paris"}),
        call("call_2", "get_time", {"zone": "Europe/Paris"}),
    ],
}
system = {"role": "system", "content": "You are terse."}

cases = {
    "qwen3": [
        ("tools", [ask], [weather, clock], True),
        ("tools_system", [system, ask], [weather], True),
        ("no_tools", [system, ask], None, True),
        ("round_trip", [ask, called, answered], [weather], True),
        (
            "two_calls",
            [ask, two_calls, dict(answered, tool_call_id="call_1"), dict(answered, tool_call_id="call_2", content="14:05")],
            [weather, clock],
            True,
        ),
    ],
    "llama31": [
        ("tools", [ask], [weather, clock], True),
        ("tools_system", [system, ask], [weather], True),
        ("no_tools", [system, ask], None, True),
        ("round_trip", [system, ask, called, answered], [weather], True),
    ],
    "gpt_oss": [
        ("tools", [ask], [weather, clock], True),
        ("tools_system", [system, ask], [weather], True),
        ("no_tools", [system, ask], None, True),
        ("round_trip", [ask, called, answered], [weather], True),
    ],
}
specials = {
    "qwen3": ("", "<|im_end|>"),
    "llama31": ("<|begin_of_text|>", "<|eot_id|>"),
    "gpt_oss": ("<|startoftext|>", "<|return|>"),
}

out = []
for name, rows in cases.items():
    template = (data / f"{name}_chat_template.jinja").read_text()
    bos, eos = specials[name]
    for case, messages, tools, gen in rows:
        text = render_jinja_template(
            conversations=[messages],
            tools=tools,
            chat_template=template,
            add_generation_prompt=gen,
            bos_token=bos,
            eos_token=eos,
        )[0][0]
        out.append(
            {
                "template": name,
                "case": case,
                "messages": messages,
                "tools": tools,
                "add_generation_prompt": gen,
                "bos_token": bos,
                "eos_token": eos,
                "rendered": text,
            }
        )
(data / "tool_templates.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
print(f"wrote {len(out)} renders to tests/data/tool_templates.json")
