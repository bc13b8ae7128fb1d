//! Structured output over HTTP: `response_format` (`json_object`,
//! `json_schema`) and `grammar` (llguidance's Lark syntax) in both
//! endpoints, streamed or not, sampled at temperature 1; the output
//! validates against its schema. `max_tokens` before the grammar completes
//! is `finish_reason: "length"`; a bad schema or grammar is a 400.

use crate::http::post;
use crate::{start_with, Server};
use serde_json::{json, Value};

fn addr(s: &Server) -> String {
    s.base
        .trim_start_matches("http://")
        .trim_end_matches("/v1")
        .to_string()
}

fn validate(schema: &Value, text: &str) {
    let value: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"));
    let validator = jsonschema::validator_for(schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{value} fails {schema}: {errors:?}");
}

fn chat(a: &str, question: &str, extra: Value) -> Value {
    let mut req = json!({
        "messages": [{"role": "user", "content": question}],
        "temperature": 1.0,
        "seed": 7,
        "max_tokens": 200,
    });
    for (k, v) in extra.as_object().unwrap() {
        req[k] = v.clone();
    }
    post(a, "/v1/chat/completions", &req.to_string()).json()
}

#[test]
fn response_format_and_grammar_constrain_the_output() {
    let s = start_with(&[], &[]);
    let a = addr(&s);
    let person = json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "city": {"enum": ["Paris", "London", "Rome"]}},
        "required": ["name", "age", "city"], "additionalProperties": false});
    let list = json!({"type": "array", "items": {"type": "string", "maxLength": 12},
                      "minItems": 2, "maxItems": 4});
    for (schema, question) in [
        (&person, "Describe a person."),
        (&list, "Name some fruits."),
    ] {
        let format = json!({"type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": true}});
        let v = chat(&a, question, json!({"response_format": format}));
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "stop", "{v}");
        validate(schema, choice["message"]["content"].as_str().unwrap());
        // Streamed, the same seed gives the same text.
        let mut req = json!({
            "messages": [{"role": "user", "content": question}],
            "temperature": 1.0, "seed": 7, "max_tokens": 200,
            "response_format": format, "stream": true,
        });
        req["stream"] = json!(true);
        let mut r = post(&a, "/v1/chat/completions", &req.to_string());
        assert_eq!(r.status, 200);
        let mut text = String::new();
        while let Some(d) = r.next_data() {
            if d == "[DONE]" {
                break;
            }
            let c: Value = serde_json::from_str(&d).unwrap();
            text.push_str(c["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
        }
        assert_eq!(text, choice["message"]["content"].as_str().unwrap());
    }
    // json_object in /v1/completions.
    let req = json!({"prompt": "A JSON object describing a dog:", "max_tokens": 200,
                     "temperature": 1.0, "seed": 3,
                     "response_format": {"type": "json_object"}});
    let v = post(&a, "/v1/completions", &req.to_string()).json();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let text = v["choices"][0]["text"].as_str().unwrap();
    let obj: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    assert!(obj.is_object(), "{obj}");
    // A Lark grammar.
    let grammar = "start: (\"yes\" | \"no\") \", because \" /[a-z ]{1,30}/ \".\"";
    let v = chat(&a, "Is the sky blue?", json!({"grammar": grammar}));
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    let rest = text
        .strip_prefix("yes, because ")
        .or_else(|| text.strip_prefix("no, because "))
        .unwrap_or_else(|| panic!("{text:?}"));
    let reason = rest.strip_suffix('.').unwrap_or_else(|| panic!("{text:?}"));
    assert!(
        (1..=30).contains(&reason.len())
            && reason.bytes().all(|b| b == b' ' || b.is_ascii_lowercase()),
        "{text:?}"
    );
    // max_tokens first: "length", the JSON left incomplete.
    let format = json!({"type": "json_schema", "json_schema": {"name": "p", "schema": person}});
    let v = chat(
        &a,
        "Describe a person.",
        json!({"response_format": format, "max_tokens": 4}),
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 4, "{v}");
}

#[test]
fn bad_schemas_and_grammars_are_400s() {
    let s = start_with(&[], &[]);
    let a = addr(&s);
    let cases = [
        (
            json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}}),
            "response_format",
            "JSON schema",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format",
            "json_schema.schema",
        ),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format",
            "xml",
        ),
        (
            json!({"response_format": "json"}),
            "response_format",
            "type",
        ),
        (
            json!({"grammar": "start: missing_rule"}),
            "grammar",
            "Lark grammar",
        ),
        (
            json!({"grammar": "start: \"a\"", "response_format": {"type": "json_object"}}),
            "grammar",
            "not both",
        ),
        (
            json!({"grammar": "start: \"a\"", "ignore_eos": true}),
            "ignore_eos",
            "ignore_eos",
        ),
    ];
    for (extra, param, words) in cases {
        let mut req = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8});
        for (k, v) in extra.as_object().unwrap() {
            req[k] = v.clone();
        }
        let r = post(&a, "/v1/chat/completions", &req.to_string());
        assert_eq!(r.status, 400, "{extra}");
        let v = r.json();
        assert_eq!(v["error"]["param"], param, "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(words), "{extra}: {msg}");
    }
    // The server goes on serving, and "text" is no constraint.
    let req = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                     "response_format": {"type": "text"}});
    let r = post(&a, "/v1/chat/completions", &req.to_string());
    assert_eq!(r.status, 200);
}
