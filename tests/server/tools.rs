//! Tool calls: the parsers of the three call formats (Hermes / Qwen
//! `<tool_call>`, Llama 3 JSON, gpt-oss harmony), malformed output kept as
//! text, streamed replies held back from a call's opener; and a server on
//! a tiny random model carrying Qwen3's template: tools and `role: tool`
//! messages rendered as transformers renders them (`/apply-template`
//! against tests/data/tool_templates.json), a chat request with tools
//! answered in OpenAI's shape, streamed or not, and bad tool requests
//! refused with 400. (A random model does not call tools by itself, so the
//! reply side is tested through the parsers and the response builder, and
//! through `tool_choice` "required" / a named function, which a grammar
//! enforces: Qwen3's and Llama 3.1's templates, streamed or not.)

use crate::{curl, start_model, OpenAiClient, Server};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use vkllm::model::gguf::{GgufFile, GgufValue};
use vkllm::model::gguf_write::GgufWriter;
use vkllm::server::tools::{calls_delta, chat_message, parse, Parsed, ToolFormat, ToolStream};

fn calls(p: &Parsed) -> Vec<(&str, Value)> {
    p.calls
        .iter()
        .map(|c| {
            assert!(c.id.starts_with("call_"), "{}", c.id);
            let args: Value = serde_json::from_str(&c.arguments)
                .unwrap_or_else(|e| panic!("{e}: {}", c.arguments));
            (c.name.as_str(), args)
        })
        .collect()
}

#[test]
fn formats_are_told_from_the_template_text() {
    let data = crate::common::root().join("tests/data");
    let read = |f: &str| std::fs::read_to_string(data.join(f)).unwrap();
    assert_eq!(
        ToolFormat::detect(&read("qwen3_chat_template.jinja")),
        Some(ToolFormat::Hermes)
    );
    assert_eq!(
        ToolFormat::detect(&read("llama31_chat_template.jinja")),
        Some(ToolFormat::Llama3Json)
    );
    assert_eq!(
        ToolFormat::detect(&read("gpt_oss_chat_template.jinja")),
        Some(ToolFormat::Harmony)
    );
    // A template that never reads `tools` would drop them.
    assert_eq!(
        ToolFormat::detect("{% for m in messages %}{{ m.content }}{% endfor %}"),
        None
    );
}

#[test]
fn hermes_calls_are_parsed_and_malformed_ones_stay_text() {
    let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"Europe/Paris\"}}\n</tool_call>";
    let p = parse(ToolFormat::Hermes, text);
    assert_eq!(p.content, "Let me check.");
    assert_eq!(
        calls(&p),
        vec![
            ("get_weather", json!({"city": "Paris"})),
            ("get_time", json!({"zone": "Europe/Paris"}))
        ]
    );
    assert_ne!(p.calls[0].id, p.calls[1].id);
    // Arguments written as JSON text, and an unclosed last call.
    let p = parse(
        ToolFormat::Hermes,
        "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}",
    );
    assert_eq!(calls(&p), vec![("f", json!({"x": 1}))]);
    assert_eq!(p.content, "");
    for bad in [
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \n</tool_call>",
        "<tool_call>not json</tool_call> and after",
        "<tool_call>{\"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": 3}</tool_call>",
        "<tool_call>[1, 2]</tool_call>",
        "<tool_call>",
        "</tool_call><tool_call><tool_call>",
        "plain text, no call",
        "",
    ] {
        let p = parse(ToolFormat::Hermes, bad);
        assert_eq!(p.content, bad, "{bad}");
        assert!(p.calls.is_empty(), "{bad}");
    }
    // A good call beside a bad one: the bad one stays text.
    let p = parse(
        ToolFormat::Hermes,
        "<tool_call>oops</tool_call><tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
    );
    assert_eq!(calls(&p), vec![("f", json!({}))]);
    assert_eq!(p.content, "<tool_call>oops</tool_call>");
}

#[test]
fn llama3_json_calls_are_parsed_and_text_stays_text() {
    let p = parse(
        ToolFormat::Llama3Json,
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}",
    );
    assert_eq!(
        calls(&p),
        vec![("get_weather", json!({"city": "Paris", "unit": "celsius"}))]
    );
    assert_eq!(p.content, "");
    let p = parse(
        ToolFormat::Llama3Json,
        " <|python_tag|>{\"name\": \"f\", \"arguments\": {\"a\": [1]}}",
    );
    assert_eq!(calls(&p), vec![("f", json!({"a": [1]}))]);
    // Two calls one after the other (Llama 3.2 separates them by `;`
    // or a space).
    let p = parse(
        ToolFormat::Llama3Json,
        "{\"name\": \"f\", \"parameters\": {}} {\"name\": \"g\", \"parameters\": {\"b\": true}}",
    );
    assert_eq!(calls(&p), vec![("f", json!({})), ("g", json!({"b": true}))]);
    for bad in [
        "The weather is fine.",
        "{\"name\": \"f\", \"parameters\": {\"city\": ",
        "{\"city\": \"Paris\"}",
        "{\"name\": \"f\", \"parameters\": [1]}",
        "{\"name\": \"f\"} and some words",
        "<|python_tag|>",
        "",
    ] {
        let p = parse(ToolFormat::Llama3Json, bad);
        assert_eq!(p.content, bad, "{bad}");
        assert!(p.calls.is_empty(), "{bad}");
    }
}

#[test]
fn harmony_calls_are_parsed_and_other_channels_stay_text() {
    let text = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
    let p = parse(ToolFormat::Harmony, text);
    assert_eq!(calls(&p), vec![("get_weather", json!({"city": "Paris"}))]);
    assert_eq!(
        p.content,
        "<|channel|>analysis<|message|>Need the weather.<|end|>"
    );
    // The recipient before the channel, as the template writes past calls,
    // and a reply cut at the stop token `<|call|>` (not in the text).
    let p = parse(
        ToolFormat::Harmony,
        " to=functions.get_time<|channel|>commentary json<|message|>{\"zone\": \"UTC\"}",
    );
    assert_eq!(calls(&p), vec![("get_time", json!({"zone": "UTC"}))]);
    for bad in [
        "<|channel|>final<|message|>It is sunny.",
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"city\": ",
        "<|channel|>commentary to=functions. json<|message|>{}",
        "to=functions.f",
        "<|start|><|start|><|message|><|call|>",
        "",
    ] {
        let p = parse(ToolFormat::Harmony, bad);
        assert_eq!(p.content, bad, "{bad}");
        assert!(p.calls.is_empty(), "{bad}");
    }
}

/// `pieces` through a [`ToolStream`]: the text sent as it came, the calls
/// released on the way (with the piece after which each came), and at the
/// end the calls and text that were held.
struct Streamed {
    shown: String,
    early: Vec<(usize, usize, String)>,
    end_calls: Vec<(usize, String)>,
    end_text: String,
}

fn streamed(format: ToolFormat, pieces: &[&str]) -> Streamed {
    let mut s = ToolStream::new(format);
    let mut shown = String::new();
    let mut early = Vec::new();
    for (k, p) in pieces.iter().enumerate() {
        shown.push_str(&s.push(p));
        for (i, c) in s.take_calls() {
            early.push((k, i, c.name));
        }
    }
    let (calls, end_text) = s.finish();
    Streamed {
        shown,
        early,
        end_calls: calls.into_iter().map(|(i, c)| (i, c.name)).collect(),
        end_text,
    }
}

#[test]
fn streams_hold_back_from_an_opener_and_release_calls() {
    // Text before the call goes out at once; a Hermes call, split
    // anywhere (its opener too), goes out as it closes, the next one too.
    let r = streamed(
        ToolFormat::Hermes,
        &[
            "Sure",
            ". <tool",
            "_call>\n{\"name\": \"f\", ",
            "\"arguments\": {}}\n</tool_call>",
            "\n",
            "<tool_call>{\"name\": \"g\", \"arguments\": {\"a\": 1}}",
            "</tool_call>",
        ],
    );
    assert_eq!(r.shown, "Sure. ");
    assert_eq!(r.early, vec![(3, 0, "f".into()), (6, 1, "g".into())]);
    assert!(r.end_calls.is_empty());
    assert_eq!(r.end_text, "");
    // Text after a call is sent; an unclosed call is parsed at the end.
    let r = streamed(
        ToolFormat::Hermes,
        &[
            "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
            " Done.",
            "<tool_call>{\"name\": \"g\"}",
        ],
    );
    assert_eq!(r.shown, " Done.");
    assert_eq!(r.early, vec![(0, 0, "f".into())]);
    assert_eq!(r.end_calls, vec![(1, "g".into())]);
    // A malformed call is sent as text when it closes.
    let r = streamed(ToolFormat::Hermes, &["<tool_call>oops", "</tool_call> ok"]);
    assert_eq!(r.shown, "<tool_call>oops</tool_call> ok");
    assert!(r.early.is_empty() && r.end_calls.is_empty());
    // A partial opener that turns out to be text is sent after all.
    let r = streamed(ToolFormat::Hermes, &["a <tool", "box> b"]);
    assert_eq!(format!("{}{}", r.shown, r.end_text), "a <toolbox> b");
    assert!(r.end_calls.is_empty());
    // Text that never calls is sent whole.
    let r = streamed(ToolFormat::Hermes, &["Hello", " there"]);
    assert_eq!(r.shown, "Hello there");
    assert_eq!(r.end_text, "");
    // Llama: a reply that opens with `{` is held to the end; one that
    // opens with text is text throughout, braces included.
    let r = streamed(
        ToolFormat::Llama3Json,
        &[" ", "{\"name\"", ": \"f\", \"parameters\": {\"x\": 2}}"],
    );
    assert_eq!(r.shown, "");
    assert_eq!(r.end_calls, vec![(0, "f".into())]);
    let r = streamed(ToolFormat::Llama3Json, &["Use ", "{\"a\": 1}"]);
    assert_eq!(r.shown, "Use {\"a\": 1}");
    assert!(r.end_calls.is_empty());
    // Malformed held text comes back as text at the end.
    let r = streamed(ToolFormat::Llama3Json, &["{\"oops\""]);
    assert_eq!(r.shown, "");
    assert_eq!(r.end_text, "{\"oops\"");
    assert!(r.end_calls.is_empty());
    // Harmony: held from the commentary channel to the end.
    let r = streamed(
        ToolFormat::Harmony,
        &[
            "<|channel|>analysis<|message|>hm<|end|><|start|>assistant",
            "<|channel|>comm",
            "entary to=functions.f json<|message|>{}",
        ],
    );
    assert_eq!(
        r.shown,
        "<|channel|>analysis<|message|>hm<|end|><|start|>assistant"
    );
    assert_eq!(r.end_calls, vec![(0, "f".into())]);
}

#[test]
fn the_response_builder_writes_openai_tool_calls() {
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let (message, finish) = chat_message(Some(ToolFormat::Hermes), text, "stop");
    assert_eq!(finish, "tool_calls");
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["content"], Value::Null);
    let call = &message["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
    // No tools asked, or no call made: the text as it came.
    for format in [None, Some(ToolFormat::Hermes)] {
        let (message, finish) = chat_message(format, "Hi <tool_call>", "length");
        assert_eq!(
            message,
            json!({"role": "assistant", "content": "Hi <tool_call>"})
        );
        assert_eq!(finish, "length");
    }
    let (message, _) = chat_message(None, text, "stop");
    assert_eq!(message["content"], text);
    // Streamed: each call whole, with its index.
    let p = parse(ToolFormat::Hermes, &format!("{text}{text}"));
    let indexed: Vec<_> = p.calls.into_iter().enumerate().collect();
    let d = calls_delta(&indexed);
    assert_eq!(d["tool_calls"][1]["index"], 1);
    assert_eq!(d["tool_calls"][1]["function"]["name"], "get_weather");
}

// ---- A server on a tiny model with Qwen3's template

/// A tiny random Qwen3 with SmolLM2's vocabulary (it has `<|im_start|>`
/// and `<|im_end|>`) and Qwen3's chat template.
fn tiny_qwen3(dir: &Path) -> PathBuf {
    tiny_with_template(dir, "qwen3_chat_template.jinja")
}

/// The tiny random model with the chat template of tests/data/`file`.
fn tiny_with_template(dir: &Path, file: &str) -> PathBuf {
    let raw = dir.join("raw.gguf");
    let o = Command::new(env!("CARGO_BIN_EXE_vkllm"))
        .args([
            "synth",
            "--shape",
            "tiny-qwen3",
            "--quant",
            "f16",
            "--seed",
            "3",
        ])
        .arg("--donor")
        .arg(crate::common::smollm2())
        .arg("-o")
        .arg(&raw)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let template =
        std::fs::read_to_string(crate::common::root().join("tests/data").join(file)).unwrap();
    let g = GgufFile::open(&raw).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        if k != "tokenizer.chat_template" {
            w.add(k, v.clone());
        }
    }
    w.add("tokenizer.chat_template", GgufValue::String(template));
    for t in g.tensors() {
        w.add_tensor(&t.name, &t.dims, t.dtype, g.tensor_data(t).to_vec())
            .unwrap();
    }
    let path = dir.join("tiny-qwen3-tools.gguf");
    w.write(&path).unwrap();
    path
}

/// The fixture's messages as an OpenAI client sends them: arguments as
/// JSON text.
fn openai_messages(messages: &Value) -> Value {
    let mut m = messages.clone();
    for msg in m.as_array_mut().unwrap() {
        if let Some(calls) = msg.get_mut("tool_calls").and_then(Value::as_array_mut) {
            for c in calls {
                let args = c["function"]["arguments"].to_string();
                c["function"]["arguments"] = json!(args);
            }
        }
    }
    m
}

fn post(s: &Server, path: &str, body: &Value) -> (Value, String) {
    let root = s.base.trim_end_matches("/v1");
    let (text, status) = curl(&["-d", &body.to_string(), &format!("{root}{path}")]);
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {status} {text}"));
    (v, status)
}

#[test]
fn a_tool_round_trip_through_the_server_renders_as_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_qwen3(dir.path());
    let mut s = start_model(&model, &[]);
    let fixtures: Value = serde_json::from_str(
        &std::fs::read_to_string(crate::common::root().join("tests/data/tool_templates.json"))
            .unwrap(),
    )
    .unwrap();
    let qwen: Vec<&Value> = fixtures
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["template"] == "qwen3")
        .collect();
    assert_eq!(qwen.len(), 5);
    for c in &qwen {
        let mut req = json!({"messages": openai_messages(&c["messages"])});
        if !c["tools"].is_null() {
            req["tools"] = c["tools"].clone();
        }
        let (v, status) = post(&s, "/apply-template", &req);
        assert!(status.starts_with("200"), "{status} {v}");
        assert_eq!(v["prompt"], c["rendered"], "{}", c["case"]);
    }
    // tool_choice "none" renders no tools.
    let trip = qwen.iter().find(|c| c["case"] == "round_trip").unwrap();
    let mut req = json!({
        "messages": openai_messages(&trip["messages"]),
        "tools": trip["tools"],
        "tool_choice": "none",
    });
    let (v, _) = post(&s, "/apply-template", &req);
    let prompt = v["prompt"].as_str().unwrap();
    assert!(!prompt.contains("<tools>"), "{prompt}");
    assert!(prompt.contains("<tool_response>"), "{prompt}");

    // The chat request itself: its prompt is the fixture's (counted
    // against the same text sent as a completion), the reply OpenAI's shape.
    req["tool_choice"] = json!("auto");
    req["max_tokens"] = json!(6);
    req["temperature"] = json!(0);
    let (v, status) = post(&s, "/v1/chat/completions", &req);
    assert!(status.starts_with("200"), "{status} {v}");
    let (plain, _) = post(
        &s,
        "/v1/completions",
        &json!({"prompt": trip["rendered"], "max_tokens": 1}),
    );
    assert_eq!(
        v["usage"]["prompt_tokens"], plain["usage"]["prompt_tokens"],
        "{v} {plain}"
    );
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant", "{v}");
    let finish = choice["finish_reason"].as_str().unwrap();
    assert!(["stop", "length", "tool_calls"].contains(&finish), "{v}");
    // Streamed: chunks end with a finish reason, then [DONE].
    req["stream"] = json!(true);
    let root = s.base.trim_end_matches("/v1");
    let (body, status) = curl(&[
        "-N",
        "-d",
        &req.to_string(),
        &format!("{root}/v1/chat/completions"),
    ]);
    assert!(status.contains("text/event-stream"), "{status} {body}");
    let data: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{body}");
    let last: Value = serde_json::from_str(data[data.len() - 2]).unwrap();
    assert!(last["choices"][0]["finish_reason"].is_string(), "{body}");

    // Bad tool requests are 400s naming the field; the server goes on.
    let ask = json!([{"role": "user", "content": "hi"}]);
    let weather = trip["tools"][0].clone();
    for (req, param, needle) in [
        (
            json!({"messages": ask, "tools": [{"type": "retrieval"}]}),
            "tools",
            "type \"function\"",
        ),
        (
            json!({"messages": ask, "tools": [{"type": "function", "function": {}}]}),
            "tools",
            "function.name",
        ),
        (
            json!({"messages": ask, "tools": [weather], "tool_choice": "always"}),
            "tool_choice",
            "always",
        ),
        (
            json!({"messages": ask, "tools": [weather], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
            "nope",
        ),
        (
            json!({"messages": ask, "tool_choice": "required"}),
            "tool_choice",
            "needs tools",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}], "tools": [weather]}),
            "messages",
            "not JSON",
        ),
    ] {
        let (v, status) = post(&s, "/v1/chat/completions", &req);
        assert!(status.starts_with("400"), "{req}: {status} {v}");
        assert_eq!(v["error"]["param"], param, "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(needle),
            "{v}"
        );
    }
    openai_client_round_trip(&s);
    assert!(s.child.try_wait().unwrap().is_none(), "the server died");
}

/// tests/server_client.py's tool round trip with the official client, when
/// it is installed (CI installs it; elsewhere the test says it skipped).
fn openai_client_round_trip(s: &Server) {
    let Some(client) = OpenAiClient::find("the openai client's tool round trip") else {
        return;
    };
    let v = client.run(&s.base, &["--tools"]);
    assert_eq!(v["tools"]["role"], "assistant", "{v}");
    // The random model's reply is no call, but it is read as one would be.
    let finish = v["tools"]["finish_reason"].as_str().unwrap();
    assert!(["stop", "length", "tool_calls"].contains(&finish), "{v}");
    assert!(v["tools"]["prompt_tokens"].as_u64().unwrap() > 100, "{v}");
    assert!(v["tools_stream"]["finish_reason"].is_string(), "{v}");
    assert_eq!(v["tools_bad_choice"], 400, "{v}");
}

// ---- tool_choice "required" and a named function, enforced

fn tool(name: &str, parameters: Value) -> Value {
    json!({"type": "function", "function": {"name": name, "parameters": parameters}})
}

/// Two tool sets whose arguments a random model finishes quickly (bounded
/// strings and numbers, no free extra properties).
fn enforced_tool_sets() -> Vec<Vec<Value>> {
    vec![
        vec![
            tool(
                "get_weather",
                json!({"type": "object", "properties": {
                    "city": {"type": "string", "maxLength": 10},
                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                  "required": ["city"], "additionalProperties": false}),
            ),
            tool(
                "get_time",
                json!({"type": "object", "properties": {
                    "zone": {"enum": ["UTC", "Europe/Paris", "Asia/Tokyo"]}},
                  "required": ["zone"], "additionalProperties": false}),
            ),
        ],
        vec![
            tool(
                "add",
                json!({"type": "object", "properties": {
                    "a": {"type": "integer", "minimum": 0, "maximum": 99},
                    "b": {"type": "integer", "minimum": -9, "maximum": 9}},
                  "required": ["a", "b"], "additionalProperties": false}),
            ),
            tool(
                "stop_timer",
                json!({"type": "object", "properties": {}, "additionalProperties": false}),
            ),
            tool(
                "flag",
                json!({"type": "object", "properties": {"on": {"type": "boolean"}},
                  "required": ["on"], "additionalProperties": false}),
            ),
        ],
    ]
}

/// Checks `calls` (OpenAI `tool_calls`) name tools of `tools` (only `only`
/// when given) with arguments valid against their parameters.
fn check_enforced_calls(calls: &[Value], tools: &[Value], only: Option<&str>, ctx: &str) {
    assert!(!calls.is_empty(), "{ctx}");
    for c in calls {
        assert_eq!(c["type"], "function", "{ctx}");
        let name = c["function"]["name"].as_str().unwrap();
        if let Some(o) = only {
            assert_eq!(name, o, "{ctx}");
        }
        let t = tools
            .iter()
            .find(|t| t["function"]["name"] == name)
            .unwrap_or_else(|| panic!("{name} is not a tool: {ctx}"));
        let args: Value = serde_json::from_str(c["function"]["arguments"].as_str().unwrap())
            .unwrap_or_else(|e| panic!("{e}: {ctx}"));
        let validator = jsonschema::validator_for(&t["function"]["parameters"]).unwrap();
        assert!(validator.is_valid(&args), "{args} for {name}: {ctx}");
    }
}

#[test]
fn tool_choice_required_and_named_are_enforced_by_a_grammar() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_qwen3(dir.path());
    enforced_calls_on(&model);
}

/// The same with Llama 3.1's template: the reply is one JSON object
/// `{"name": ..., "parameters": {...}}`.
#[test]
fn tool_choice_required_is_enforced_in_llama3_json() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_with_template(dir.path(), "llama31_chat_template.jinja");
    enforced_calls_on(&model);
}

fn enforced_calls_on(model: &Path) {
    let s = start_model(model, &[]);
    let ask = json!([{"role": "user", "content": "Do something useful."}]);
    let root = s.base.trim_end_matches("/v1");
    for (set, tools) in enforced_tool_sets().iter().enumerate() {
        let named = tools[set]["function"]["name"].as_str().unwrap();
        let choices = [
            (json!("required"), None),
            (
                json!({"type": "function", "function": {"name": named}}),
                Some(named),
            ),
        ];
        for (choice, only) in &choices {
            for seed in [1u64, 2, 3] {
                let mut req = json!({
                    "messages": ask, "tools": tools, "tool_choice": choice,
                    "temperature": 1, "seed": seed, "max_tokens": 600,
                });
                let ctx = format!("set {set}, {choice}, seed {seed}");
                let (v, status) = post(&s, "/v1/chat/completions", &req);
                assert!(status.starts_with("200"), "{ctx}: {status} {v}");
                let choice0 = &v["choices"][0];
                assert_eq!(choice0["finish_reason"], "tool_calls", "{ctx}: {v}");
                assert!(choice0["message"]["content"].is_null(), "{ctx}: {v}");
                let calls = choice0["message"]["tool_calls"].as_array().unwrap();
                check_enforced_calls(calls, tools, *only, &format!("{ctx}: {v}"));

                // Streamed: the same calls, each in a tool_calls delta.
                req["stream"] = json!(true);
                let (body, status) = curl(&[
                    "-N",
                    "-d",
                    &req.to_string(),
                    &format!("{root}/v1/chat/completions"),
                ]);
                assert!(status.contains("text/event-stream"), "{status} {body}");
                let chunks: Vec<Value> = body
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .filter(|d| *d != "[DONE]")
                    .map(|d| serde_json::from_str(d).unwrap())
                    .collect();
                let streamed: Vec<Value> = chunks
                    .iter()
                    .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
                    .flatten()
                    .cloned()
                    .collect();
                check_enforced_calls(&streamed, tools, *only, &format!("{ctx}: {body}"));
                let finish = chunks
                    .iter()
                    .find_map(|c| c["choices"][0]["finish_reason"].as_str());
                assert_eq!(finish, Some("tool_calls"), "{ctx}: {body}");
                // Same seed, same calls.
                let names = |cs: &[Value]| -> Vec<(Value, Value)> {
                    cs.iter()
                        .map(|c| {
                            let args: Value =
                                serde_json::from_str(c["function"]["arguments"].as_str().unwrap())
                                    .unwrap();
                            (c["function"]["name"].clone(), args)
                        })
                        .collect()
                };
                assert_eq!(names(calls), names(&streamed), "{ctx}: {body}");
            }
        }
    }
    // "auto" stays unconstrained: the random model answers in text.
    let (v, _) = post(
        &s,
        "/v1/chat/completions",
        &json!({"messages": ask, "tools": enforced_tool_sets()[0], "tool_choice": "auto",
                "temperature": 1, "seed": 1, "max_tokens": 8}),
    );
    assert_ne!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    // Enforced tool_choice with response_format or grammar is a 400.
    for extra in [
        json!({"response_format": {"type": "json_object"}}),
        json!({"grammar": "start: \"x\""}),
    ] {
        let mut req = json!({"messages": ask, "tools": enforced_tool_sets()[0],
                             "tool_choice": "required"});
        for (k, val) in extra.as_object().unwrap() {
            req[k] = val.clone();
        }
        let (v, status) = post(&s, "/v1/chat/completions", &req);
        assert!(status.starts_with("400"), "{req}: {status} {v}");
        assert_eq!(v["error"]["param"], "tool_choice", "{v}");
    }
    // A parameters schema llguidance cannot compile is a 400 on tools.
    let (v, status) = post(
        &s,
        "/v1/chat/completions",
        &json!({"messages": ask, "tool_choice": "required",
                "tools": [tool("f", json!({"type": "object", "properties": {"x": {"type": "nonsense"}}}))]}),
    );
    assert!(status.starts_with("400"), "{status} {v}");
    assert_eq!(v["error"]["param"], "tools", "{v}");
    let mut s = s;
    assert!(s.child.try_wait().unwrap().is_none(), "the server died");
}

/// The Hermes grammar accepts the call exactly as Qwen3's template writes
/// an assistant's call (tests/data/tool_templates.json), and not the same
/// call with other spacing or an unknown name.
#[test]
fn the_hermes_call_grammar_matches_qwen3s_rendered_call() {
    use vkllm::model::grammar::Constraint;
    use vkllm::server::tools::{call_grammar, ToolChoice};
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_qwen3(dir.path());
    let be = Box::new(vkllm::cpu::CpuBackend::new(None));
    let loaded = vkllm::open::load(
        vec![be],
        &model,
        &vkllm::model::LoadOptions::default(),
        &mut |_, _| {},
    )
    .unwrap();
    let tok = loaded.tokenizer.unwrap();
    let tools = vec![tool(
        "get_weather",
        json!({"type": "object", "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
          "required": ["city"]}),
    )];
    // Whether the forced call's grammar over `tools` takes `text` whole.
    let accepts_with = |tools: &[Value], choice: &ToolChoice, text: &str| {
        let spec = call_grammar(&tok, ToolFormat::Hermes, choice, tools)
            .unwrap()
            .unwrap();
        let mut m = Constraint::new(&tok, spec).unwrap().matcher().unwrap();
        let ok = tok
            .encode(text, false)
            .unwrap()
            .into_iter()
            .all(|id| m.accept(id).is_ok());
        ok && m.is_accepting()
    };
    let accepts = |choice: &ToolChoice, text: &str| accepts_with(&tools, choice, text);
    let rendered = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>";
    let required = ToolChoice::Required;
    let named = ToolChoice::Named("get_weather".into());
    assert!(accepts(&required, rendered));
    assert!(accepts(&named, rendered));
    assert!(accepts(&required, &format!("{rendered}\n{rendered}")));
    assert!(!accepts(&required, &rendered.replace(", \"", ",\"")));
    assert!(!accepts(
        &required,
        &rendered.replace("get_weather", "get_time")
    ));
    assert!(!accepts(&required, &rendered.replace("celsius", "kelvin")));
    assert!(!accepts(&required, &format!("Sure. {rendered}")));
    // Parameters with local references, as pydantic writes them: they
    // still resolve inside the call's schema.
    let with_refs = vec![
        tools[0].clone(),
        tool(
            "book",
            json!({"type": "object", "$defs": {"Seat": {"type": "string", "enum": ["aisle", "window"]}},
                   "properties": {"seat": {"$ref": "#/$defs/Seat"}}, "required": ["seat"]}),
        ),
    ];
    let accepts_refs = |text: &str| accepts_with(&with_refs, &required, text);
    let booked =
        "<tool_call>\n{\"name\": \"book\", \"arguments\": {\"seat\": \"aisle\"}}\n</tool_call>";
    assert!(accepts_refs(booked));
    assert!(accepts_refs(rendered));
    assert!(!accepts_refs(&booked.replace("aisle", "middle")));
    // "auto" and harmony are not enforced.
    assert!(
        call_grammar(&tok, ToolFormat::Hermes, &ToolChoice::Auto, &tools)
            .unwrap()
            .is_none()
    );
    assert!(call_grammar(&tok, ToolFormat::Harmony, &required, &tools)
        .unwrap()
        .is_none());
}
