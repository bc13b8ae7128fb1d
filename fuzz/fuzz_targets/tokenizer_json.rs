//! A `tokenizer.json` loaded, then a text encoded and decoded with it.
#![no_main]

mod split;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use vkllm::model::tokenizer::Tokenizer;

fuzz_target!(|data: &[u8]| {
    let Some((text, json)) = split::split(data) else {
        return;
    };
    let Ok(tok) = Tokenizer::from_hf_json(json, &Value::Null, &Value::Null, "tokenizer.json")
    else {
        return;
    };
    let Ok(ids) = tok.encode(&text, true) else {
        return;
    };
    let _ = tok.decode(&ids);
    let mut stream = tok.stream_decoder();
    for &id in &ids {
        stream.push(id);
    }
    stream.finish();
});
