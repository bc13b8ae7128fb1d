//! Chat template rendering with Hugging Face semantics. Expected strings were
//! worked out by hand from each template and checked against Python Jinja2
//! configured as transformers configures it.

mod common;

use vkllm::model::chat::{render_chat, ChatMessage};
use vkllm::model::gguf::GgufFile;
use vkllm::Error;

fn smollm2_template() -> String {
    let g = GgufFile::open(&common::smollm2()).unwrap();
    g.get_str("tokenizer.chat_template")
        .unwrap()
        .unwrap()
        .to_string()
}

fn msg(role: &str, content: &str) -> ChatMessage {
    ChatMessage::new(role, content)
}

#[test]
fn smollm2_template_adds_default_system_prompt() {
    let out = render_chat(
        &smollm2_template(),
        &[msg("user", "Hello")],
        true,
        "<|im_start|>",
        "<|im_end|>",
    )
    .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHello<|im_end|>\n\
         <|im_start|>assistant\n"
    );
}

#[test]
fn smollm2_template_with_system_message() {
    let messages = [
        msg("system", "You are a pirate."),
        msg("user", "Hello"),
        msg("assistant", "Arr!"),
        msg("user", "Where is the gold?"),
    ];
    let out = render_chat(&smollm2_template(), &messages, false, "", "").unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a pirate.<|im_end|>\n\
         <|im_start|>user\nHello<|im_end|>\n\
         <|im_start|>assistant\nArr!<|im_end|>\n\
         <|im_start|>user\nWhere is the gold?<|im_end|>\n"
    );
}

const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

#[test]
fn chatml_template() {
    let messages = [msg("system", "Be brief."), msg("user", "2+2?")];
    assert_eq!(
        render_chat(CHATML, &messages, true, "", "").unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        render_chat(CHATML, &messages, false, "", "").unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
    );
}

/// Meta-Llama-3-8B-Instruct's template.
const LLAMA3: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

#[test]
fn llama3_template() {
    let messages = [msg("system", "  Be nice. "), msg("user", "Hi!\n")];
    let out = render_chat(
        LLAMA3,
        &messages,
        true,
        "<|begin_of_text|>",
        "<|end_of_text|>",
    )
    .unwrap();
    assert_eq!(
        out,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe nice.<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
}

/// Block tags on their own lines: `trim_blocks` eats the newline after a
/// tag and `lstrip_blocks` the indentation before it, as in transformers.
/// Also Python's `str.strip()`, `raise_exception`, `bos_token`/`eos_token`.
const MULTILINE: &str = "{{ bos_token }}
{% for message in messages %}
    {% if message.role == 'user' %}
[INST] {{ message.content.strip() }} [/INST]
    {% elif message.role == 'assistant' %}
{{ message['content'] }}{{ eos_token }}
    {% else %}
{{ raise_exception('unknown role ' + message.role) }}
    {% endif %}
{% endfor %}
";

#[test]
fn trim_and_lstrip_blocks_like_transformers() {
    let messages = [
        msg("user", "  Hi there \n"),
        msg("assistant", "Hello!"),
        msg("user", "Bye"),
    ];
    let out = render_chat(MULTILINE, &messages, false, "<s>", "</s>").unwrap();
    assert_eq!(
        out,
        "<s>\n[INST] Hi there [/INST]\nHello!</s>\n[INST] Bye [/INST]\n"
    );
}

#[test]
fn raise_exception_is_a_template_error() {
    let err = render_chat(MULTILINE, &[msg("tool", "x")], false, "<s>", "</s>").unwrap_err();
    match err {
        Error::Template(text) => assert!(text.contains("unknown role tool"), "{text}"),
        other => panic!("expected a template error, got {other:?}"),
    }
}

#[test]
fn tojson_and_python_methods() {
    // Python json.dumps: ", " and ": " separators, non-ASCII and '<' kept.
    let tmpl = "{% for m in messages %}{{ m | tojson }}\n{% if m.content.startswith('{') %}{{ m.content | length }}{% endif %}\n{% endfor %}{{ {'k': [1, 'é<b>'], 'z': none} | tojson(indent=2) }}";
    let out = render_chat(tmpl, &[msg("user", "{\"a\": \"<ü>\"}")], false, "", "").unwrap();
    assert_eq!(
        out,
        "{\"role\": \"user\", \"content\": \"{\\\"a\\\": \\\"<ü>\\\"}\"}\n12{\n  \"k\": [\n    1,\n    \"é<b>\"\n  ],\n  \"z\": null\n}"
    );
}

#[test]
fn syntax_errors_are_template_errors() {
    let err = render_chat("{% for m in messages %}", &[], false, "", "").unwrap_err();
    assert!(matches!(err, Error::Template(_)), "{err:?}");
}

#[test]
fn loop_controls_and_dict_items() {
    // transformers enables jinja2.ext.loopcontrols; `.items()` is Python's.
    let tmpl = "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{% for k, v in m.items() %}{% if k == 'role' %}{% continue %}{% endif %}[{{ k }}={{ v }}]{% endfor %}{% endfor %}";
    let messages = [msg("user", "a"), msg("assistant", "b"), msg("user", "c")];
    assert_eq!(
        render_chat(tmpl, &messages, false, "", "").unwrap(),
        "[content=a][content=b]"
    );
}

#[test]
fn raise_exception_message_reaches_the_error_text() {
    let err = render_chat(
        "{{ raise_exception('Conversation roles must alternate') }}",
        &[],
        false,
        "",
        "",
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("chat template: "), "{text}");
    assert!(text.contains("Conversation roles must alternate"), "{text}");
}

/// gpt-oss's harmony template, verbatim: openai/gpt-oss-120b's chat template
/// (the 20b's is the same) as llama.cpp keeps it in
/// `models/templates/openai-gpt-oss-120b.jinja`.
fn gpt_oss_template() -> String {
    std::fs::read_to_string(common::root().join("tests/data/gpt_oss_chat_template.jinja")).unwrap()
}

/// The render with its "Current date: YYYY-MM-DD" replaced by `{DATE}`.
fn undated(out: &str) -> String {
    let at = out.find("Current date: ").expect("a date line") + "Current date: ".len();
    let date = &out[at..at + 10];
    let digits = |r: std::ops::Range<usize>| date[r].bytes().all(|b| b.is_ascii_digit());
    assert!(
        digits(0..4) && &date[4..5] == "-" && digits(5..7) && &date[7..8] == "-" && digits(8..10),
        "{date}"
    );
    out.replacen(date, "{DATE}", 1)
}

/// Expected strings: transformers 5.24's `render_jinja_template` (what
/// `apply_chat_template` runs) over the same messages, its date replaced.
const HARMONY_HEAD: &str = "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: {DATE}\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>";

#[test]
fn gpt_oss_harmony_template_renders_like_transformers() {
    let t = gpt_oss_template();
    let conversation = [
        msg("system", "Answer briefly."),
        msg("user", "What is 2+2?"),
        msg("assistant", "4."),
    ];
    let out = render_chat(&t, &conversation, true, "", "").unwrap();
    assert_eq!(
        undated(&out),
        format!(
            "{HARMONY_HEAD}<|start|>developer<|message|># Instructions\n\nAnswer briefly.\n\n<|end|>\
             <|start|>user<|message|>What is 2+2?<|end|>\
             <|start|>assistant<|channel|>final<|message|>4.<|end|><|start|>assistant"
        )
    );
    let mut longer = conversation.to_vec();
    longer.push(msg("user", "And 3+3?"));
    let out = render_chat(&t, &longer, true, "", "").unwrap();
    assert_eq!(
        undated(&out),
        format!(
            "{HARMONY_HEAD}<|start|>developer<|message|># Instructions\n\nAnswer briefly.\n\n<|end|>\
             <|start|>user<|message|>What is 2+2?<|end|>\
             <|start|>assistant<|channel|>final<|message|>4.<|end|>\
             <|start|>user<|message|>And 3+3?<|end|><|start|>assistant"
        )
    );
    // Without a generation prompt a closing assistant turn ends in <|return|>.
    let out = render_chat(
        &t,
        &[msg("user", "Hi"), msg("assistant", "Hello!")],
        false,
        "",
        "",
    )
    .unwrap();
    assert_eq!(
        undated(&out),
        format!(
            "{HARMONY_HEAD}<|start|>user<|message|>Hi<|end|>\
             <|start|>assistant<|channel|>final<|message|>Hello!<|return|>"
        )
    );
    // The template's own checks still fire.
    let err = render_chat(
        &t,
        &[
            msg("user", "Hi"),
            msg("assistant", "<|channel|>final<|message|>x"),
        ],
        true,
        "",
        "",
    )
    .unwrap_err();
    assert!(err.to_string().contains("<|channel|> tags"), "{err}");
}

/// Tools and tool calls rendered through Qwen3's, Llama 3.1's and gpt-oss's
/// templates equal transformers' renders (tests/data/tool_templates.json,
/// written by scripts/tool-template-fixtures.py) byte for byte; gpt-oss's
/// date line aside (transformers takes the local date).
#[test]
fn tool_templates_render_as_transformers_does() {
    use vkllm::model::chat::{render_chat_with, RenderOptions};
    let data = common::root().join("tests/data");
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("tool_templates.json")).unwrap())
            .unwrap();
    let cases = cases.as_array().unwrap();
    assert_eq!(cases.len(), 13);
    for c in cases {
        let name = c["template"].as_str().unwrap();
        let template =
            std::fs::read_to_string(data.join(format!("{name}_chat_template.jinja"))).unwrap();
        let tools = c["tools"].as_array().map(|t| t.as_slice());
        let opts = RenderOptions {
            add_generation_prompt: c["add_generation_prompt"].as_bool().unwrap(),
            bos_token: c["bos_token"].as_str().unwrap(),
            eos_token: c["eos_token"].as_str().unwrap(),
            tools,
        };
        let messages = c["messages"].as_array().unwrap();
        let got = render_chat_with(&template, messages, &opts).unwrap();
        let want = c["rendered"].as_str().unwrap();
        let (got, want) = match name {
            "gpt_oss" => (undated(&got), undated(want)),
            _ => (got, want.to_string()),
        };
        assert_eq!(got, want, "{name} {}", c["case"]);
    }
}
