//! A GGUF vocabulary (`tokenizer.ggml.*`) built into a tokenizer, then a
//! text encoded and decoded with it: the ids it gives decode, and streaming
//! them one by one gives the same text as decoding them at once.
#![no_main]

mod split;

use libfuzzer_sys::fuzz_target;
use vkllm::model::gguf::GgufFile;
use vkllm::model::tokenizer::Tokenizer;

fuzz_target!(|data: &[u8]| {
    let Some((text, gguf)) = split::split(data) else {
        return;
    };
    let Ok(g) = GgufFile::from_bytes(gguf.to_vec(), "fuzz.gguf") else {
        return;
    };
    let Ok(tok) = Tokenizer::from_gguf(&g) else {
        return;
    };
    let Ok(ids) = tok.encode(&text, true) else {
        return;
    };
    let decoded = tok.decode(&ids).expect("ids from encode decode");
    let mut stream = tok.stream_decoder();
    let mut streamed: String = ids.iter().map(|&id| stream.push(id)).collect();
    streamed.push_str(&stream.finish());
    assert_eq!(
        streamed, decoded,
        "streamed and whole decodes differ for {ids:?}"
    );
});
