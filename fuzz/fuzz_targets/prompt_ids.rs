//! `--prompt-ids` parsing: whatever parses, printed back as `1,2,3`,
//! parses to the same ids.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vkllm::model::generate::parse_token_ids;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(ids) = parse_token_ids(text) else {
        return;
    };
    let printed: Vec<String> = ids.iter().map(u32::to_string).collect();
    assert_eq!(parse_token_ids(&printed.join(",")).ok(), Some(ids));
});
