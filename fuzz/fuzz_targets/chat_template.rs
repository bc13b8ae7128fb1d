//! Chat-template rendering: the input is the template; the messages are a
//! fixed conversation with a system turn and an assistant turn.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vkllm::model::chat::{render_chat, ChatMessage};

fuzz_target!(|data: &[u8]| {
    let Ok(template) = std::str::from_utf8(data) else {
        return;
    };
    let messages = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "What is 1+1?"),
        ChatMessage::new("assistant", "2"),
        ChatMessage::new("user", "And {{ 2+2 }}?"),
    ];
    let _ = render_chat(template, &messages, true, "<s>", "</s>");
});
