//! Tokenizer parity with Hugging Face on the real SmolLM2 GGUF, round trips,
//! streaming decode, and a SentencePiece vocabulary built in a GGUF here.

mod common;

use std::sync::OnceLock;
use vkllm::model::gguf::{GgufFile, GgufValue};
use vkllm::model::gguf_write::GgufWriter;
use vkllm::model::tokenizer::Tokenizer;

fn smollm2() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let g = GgufFile::open(&common::smollm2()).unwrap();
        Tokenizer::from_gguf(&g).unwrap()
    })
}

struct Ref {
    prompt: String,
    prompt_ids: Vec<u32>,
    greedy: Vec<u32>,
    text: String,
}

fn references() -> Vec<Ref> {
    let path = common::reference_dir().join("smollm2_reference.json");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    json["refs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| Ref {
            prompt: r["prompt"].as_str().unwrap().to_string(),
            prompt_ids: ids(&r["prompt_ids"]),
            greedy: ids(&r["greedy_32"]),
            text: r["text"].as_str().unwrap().to_string(),
        })
        .collect()
}

#[test]
fn smollm2_prompts_encode_like_transformers() {
    let refs = references();
    assert!(refs.len() >= 4);
    for r in &refs {
        assert_eq!(
            smollm2().encode(&r.prompt, false).unwrap(),
            r.prompt_ids,
            "prompt {:?}",
            r.prompt
        );
    }
}

#[test]
fn smollm2_greedy_ids_decode_like_transformers() {
    for r in references() {
        assert_eq!(smollm2().decode(&r.greedy).unwrap(), r.text);
    }
}

#[test]
fn smollm2_metadata() {
    let t = smollm2();
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!(t.bos_id(), Some(1));
    assert_eq!(t.eos_id(), Some(2));
    assert!(!t.add_bos_by_default());
    assert_eq!(t.id_to_piece(2).as_deref(), Some("<|im_end|>"));
    assert_eq!(t.id_to_piece(198).as_deref(), Some("Ċ"));
    assert_eq!(t.token_text(198).as_deref(), Some("\n"));
    assert_eq!(t.token_text(7042).as_deref(), Some(" Paris"));
    assert_eq!(t.piece_to_id("<|im_start|>"), Some(1));
    let stops = t.stop_ids();
    assert!(stops.contains(&2), "<|im_end|> stops: {stops:?}");
    assert!(stops.contains(&0), "<|endoftext|> stops: {stops:?}");
    assert!(!stops.contains(&1));
    let tmpl = t.chat_template().unwrap();
    assert!(tmpl.contains("<|im_start|>"));
    assert_eq!(t.encode("Hi", true).unwrap()[0], 1);
    assert_eq!(t.encode("", false).unwrap(), Vec::<u32>::new());
}

#[test]
fn special_tokens_in_text_are_single_ids() {
    let t = smollm2();
    let ids = t
        .encode("<|im_start|>user\nHello<|im_end|>\n", false)
        .unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 1);
    assert!(ids.contains(&2));
    // No piece of `<|im_start|>` was tokenized as plain text.
    assert!(!ids
        .iter()
        .filter(|&&i| i > 2)
        .any(|&i| t.token_text(i).unwrap().contains('|')));
    assert_eq!(
        t.decode(&ids).unwrap(),
        "<|im_start|>user\nHello<|im_end|>\n"
    );
}

#[test]
fn digits_are_split_individually() {
    // SmolLM2's tokenizer.json pre-tokenizes with Digits(individual_digits)
    // and llama.cpp's smollm pre-type isolates each \p{N}: one token each.
    let t = smollm2();
    let ids = t.encode("12345", false).unwrap();
    assert_eq!(ids, vec![33, 34, 35, 36, 37]);
    assert_eq!(t.encode(" 2024", false).unwrap().len(), 5); // " " + 4 digits
    assert_eq!(t.decode(&ids).unwrap(), "12345");
}

#[test]
fn round_trips() {
    let t = smollm2();
    let texts = [
        "Hello, world!",
        "日本語のテキストと中文文本。",
        "Ça va? Ñandú, naïve café, Größe, ø",
        "مرحبا بالعالم שלום עולם",
        "def f(x):\n\tif x:\n\t\treturn [x, {'a': 1}]\n    else:  # four spaces\n        pass\n",
        "a  b   c    d\n\n\n  \t \n end   ",
        "   leading and trailing   ",
        "\n",
        "0.5 + 3.14159 = 3.64159; 1e-9; 1,000,000",
        "emoji: 😀🎉👨‍👩‍👧‍👦🇫🇷 done",
        "mixed <b>html</b> & \"quotes\" 'single' `tick` \\back\\slash",
        "",
    ];
    for text in texts {
        let ids = t.encode(text, false).unwrap();
        assert_eq!(t.decode(&ids).unwrap(), text, "ids {ids:?}");
    }
}

#[test]
fn stream_decoder_yields_whole_characters() {
    let t = smollm2();
    let text = "emoji 😀🎉👨‍👩‍👧‍👦 and 日本語 and é\n<|im_end|> end";
    let ids = t.encode(text, false).unwrap();
    // The emoji must really span several tokens for the test to mean anything.
    let single = t.encode("😀", false).unwrap();
    assert!(single.len() > 1, "😀 is {single:?}");
    let mut dec = t.stream_decoder();
    let mut chunks = Vec::new();
    for &id in &ids {
        chunks.push(dec.push(id));
    }
    chunks.push(dec.finish());
    for c in &chunks {
        assert!(!c.contains('\u{FFFD}'), "chunk {c:?}");
    }
    assert_eq!(chunks.concat(), t.decode(&ids).unwrap());
    assert_eq!(chunks.concat(), text);
    // A partial character yields nothing until its last byte arrives.
    let mut dec = t.stream_decoder();
    let (last, init) = single.split_last().unwrap();
    for &id in init {
        assert_eq!(dec.push(id), "");
    }
    assert_eq!(dec.push(*last), "😀");
    assert_eq!(dec.finish(), "");
}

#[test]
fn stream_decoder_flushes_incomplete_bytes() {
    let t = smollm2();
    let ids = t.encode("😀", false).unwrap();
    let mut dec = t.stream_decoder();
    assert_eq!(dec.push(ids[0]), "");
    // Left incomplete: the same replacement char a lossy decode shows.
    assert_eq!(dec.finish(), t.decode(&ids[..1]).unwrap());
    assert!(t.decode(&ids[..1]).unwrap().contains('\u{FFFD}'));
}

#[test]
fn out_of_range_ids_are_errors() {
    let t = smollm2();
    assert!(t.decode(&[49152]).is_err());
    assert!(t.id_to_piece(49152).is_none());
    assert!(t.token_text(u32::MAX).is_none());
}

/// A small Llama-2-style vocabulary: `<unk>`, `<s>`, `</s>`, 256 byte
/// tokens, and scored pieces, as a llama.cpp converter would write it.
fn sentencepiece_gguf(extra: &[(&str, GgufValue)]) -> GgufFile {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types: Vec<i32> = vec![2, 3, 3];
    let mut scores: Vec<f32> = vec![0.0, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    // Higher score merges first.
    let pieces = [
        ("▁", -1.0),
        ("h", -2.0),
        ("e", -2.0),
        ("l", -2.0),
        ("o", -2.0),
        ("w", -2.0),
        ("r", -2.0),
        ("d", -2.0),
        ("ll", -3.0),
        ("he", -4.0),
        ("llo", -5.0),
        ("hello", -6.0),
        ("▁hello", -7.0),
        ("▁w", -8.0),
        ("or", -9.0),
        ("▁wor", -10.0),
        ("ld", -11.0),
        ("▁world", -12.0),
        ("é", -13.0),
    ];
    for (p, s) in pieces {
        tokens.push(p.into());
        types.push(1);
        scores.push(s);
    }
    let strs = |v: &[String]| GgufValue::Array(v.iter().cloned().map(GgufValue::String).collect());
    let mut w = GgufWriter::new();
    w.add("general.architecture", GgufValue::String("llama".into()))
        .add("tokenizer.ggml.model", GgufValue::String("llama".into()))
        .add("tokenizer.ggml.tokens", strs(&tokens))
        .add(
            "tokenizer.ggml.scores",
            GgufValue::Array(scores.into_iter().map(GgufValue::F32).collect()),
        )
        .add(
            "tokenizer.ggml.token_type",
            GgufValue::Array(types.into_iter().map(GgufValue::I32).collect()),
        )
        .add("tokenizer.ggml.bos_token_id", GgufValue::U32(1))
        .add("tokenizer.ggml.eos_token_id", GgufValue::U32(2))
        .add("tokenizer.ggml.unknown_token_id", GgufValue::U32(0));
    for (k, v) in extra {
        w.add(k, v.clone());
    }
    GgufFile::from_bytes(w.to_bytes().unwrap(), "sentencepiece-test.gguf").unwrap()
}

#[test]
fn sentencepiece_vocabulary_from_gguf() {
    let t = Tokenizer::from_gguf(&sentencepiece_gguf(&[])).unwrap();
    let id = |p: &str| t.piece_to_id(p).unwrap();
    // The space prefix is added, spaces become ▁, best-scored pairs merge.
    assert_eq!(
        t.encode("hello world", false).unwrap(),
        vec![id("▁hello"), id("▁world")]
    );
    // Unknown characters fall back to their UTF-8 bytes: '\n' is <0x0A>,
    // 'ß' two byte tokens; 'é' is a piece of its own.
    assert_eq!(
        t.encode("hello\nß é", false).unwrap(),
        vec![
            id("▁hello"),
            id("<0x0A>"),
            id("<0xC3>"),
            id("<0x9F>"),
            id("▁"),
            id("é")
        ]
    );
    // Llama GGUFs add BOS by default; `</s>` in text is one control token.
    assert!(t.add_bos_by_default());
    assert_eq!(
        t.encode("hello</s>", true).unwrap(),
        vec![1, id("▁hello"), 2]
    );
    // Decoding drops the added leading space and joins byte tokens.
    for text in ["hello world", "hello\nß é", "  hello  ", "wörld ☃"] {
        let ids = t.encode(text, false).unwrap();
        assert_eq!(t.decode(&ids).unwrap(), text, "ids {ids:?}");
        let mut dec = t.stream_decoder();
        let mut streamed: String = ids.iter().map(|&i| dec.push(i)).collect();
        streamed.push_str(&dec.finish());
        assert_eq!(streamed, text);
    }
    assert_eq!(t.token_text(id("▁hello")).as_deref(), Some(" hello"));
    assert_eq!(t.token_text(id("<0x0A>")).as_deref(), Some("\n"));
    assert_eq!(t.stop_ids(), &[2]);
}

/// `ids` decoded whole, and streamed one id at a time.
fn whole_and_streamed(t: &Tokenizer, ids: &[u32]) -> (String, String) {
    let mut dec = t.stream_decoder();
    let mut streamed: String = ids.iter().map(|&i| dec.push(i)).collect();
    streamed.push_str(&dec.finish());
    (t.decode(ids).unwrap(), streamed)
}

#[test]
fn sentencepiece_byte_runs_stream_as_they_decode() {
    // Hugging Face's ByteFallback decodes a run of `<0xNN>` tokens as a
    // whole: its text when the run is UTF-8, else one U+FFFD per byte, valid
    // characters in it included (fuzz/gguf_vocab finding 4 streamed those).
    let t = Tokenizer::from_gguf(&sentencepiece_gguf(&[])).unwrap();
    let id = |p: &str| t.piece_to_id(p).unwrap();
    let bytes =
        |bs: &[u8]| -> Vec<u32> { bs.iter().map(|b| id(&format!("<0x{b:02X}>"))).collect() };
    let hello = vec![id("▁hello")];
    let fffd = |n: usize| "\u{FFFD}".repeat(n);
    let cases = [
        // `\ta` then a lone continuation byte: all three replaced.
        (bytes(b"\ta\x81"), fffd(3)),
        (
            [bytes(b"\ta\x81"), hello.clone()].concat(),
            fffd(3) + " hello",
        ),
        // A run cut by another token ends there, incomplete.
        (
            [bytes(b"\xC3"), hello.clone(), bytes(b"\xA9")].concat(),
            fffd(1) + " hello" + &fffd(1),
        ),
        (
            [bytes("é☃".as_bytes()), hello.clone()].concat(),
            "é☃ hello".into(),
        ),
        // The added space prefix is the whole text's first character, also
        // when a byte run comes first.
        ([bytes(b"  "), hello.clone()].concat(), "  hello".into()),
        (bytes(b" "), String::new()),
    ];
    for (ids, text) in cases {
        let (whole, streamed) = whole_and_streamed(&t, &ids);
        assert_eq!(whole, text, "ids {ids:?}");
        assert_eq!(streamed, text, "ids {ids:?}");
    }
    // A run yields nothing until it ends, as a later byte can void it.
    let mut dec = t.stream_decoder();
    assert_eq!(dec.push(id("<0x61>")), "");
    assert_eq!(dec.push(id("▁hello")), "a hello");
    assert_eq!(dec.push(id("<0x62>")), "");
    assert_eq!(dec.finish(), "b");
}

#[test]
fn sentencepiece_without_space_prefix() {
    let g = sentencepiece_gguf(&[
        ("tokenizer.ggml.add_space_prefix", GgufValue::Bool(false)),
        ("tokenizer.ggml.add_bos_token", GgufValue::Bool(false)),
    ]);
    let t = Tokenizer::from_gguf(&g).unwrap();
    let id = |p: &str| t.piece_to_id(p).unwrap();
    assert_eq!(
        t.encode("hello world", false).unwrap(),
        vec![id("hello"), id("▁world")]
    );
    assert!(!t.add_bos_by_default());
    assert_eq!(t.decode(&[id("▁world")]).unwrap(), " world");
}

#[test]
fn bad_tokenizer_metadata_is_an_error() {
    let mut w = GgufWriter::new();
    w.add("tokenizer.ggml.model", GgufValue::String("gpt2".into()))
        .add(
            "tokenizer.ggml.tokens",
            GgufValue::Array(vec![GgufValue::String("a".into())]),
        );
    // gpt2 without merges.
    let g = GgufFile::from_bytes(w.to_bytes().unwrap(), "no-merges.gguf").unwrap();
    assert!(Tokenizer::from_gguf(&g).is_err());
    let mut w = GgufWriter::new();
    w.add("tokenizer.ggml.model", GgufValue::String("bert".into()))
        .add(
            "tokenizer.ggml.tokens",
            GgufValue::Array(vec![GgufValue::String("a".into())]),
        );
    let g = GgufFile::from_bytes(w.to_bytes().unwrap(), "bert.gguf").unwrap();
    assert!(Tokenizer::from_gguf(&g).is_err());
    let g = GgufFile::from_bytes(GgufWriter::new().to_bytes().unwrap(), "empty.gguf").unwrap();
    assert!(Tokenizer::from_gguf(&g).is_err());
}

/// GPT-2's byte → char table, rebuilt here so the test's vocabulary covers
/// every byte.
fn byte_level_chars() -> Vec<char> {
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            if matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF) {
                char::from(b)
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap()
            }
        })
        .collect()
}

/// A Hugging Face directory with a small byte-level BPE `tokenizer.json`
/// (Llama 3 style: a post-processor that prepends BOS) and, optionally,
/// `tokenizer_config.json` and `generation_config.json`.
fn hf_dir(
    config: Option<serde_json::Value>,
    generation: Option<serde_json::Value>,
) -> tempfile::TempDir {
    use serde_json::json;
    let mut vocab = serde_json::Map::new();
    for (i, c) in byte_level_chars().into_iter().enumerate() {
        vocab.insert(c.to_string(), json!(i));
    }
    for (i, piece) in [
        "he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "ld", "Ġworld",
    ]
    .iter()
    .enumerate()
    {
        vocab.insert(piece.to_string(), json!(256 + i));
    }
    let specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"];
    for (i, s) in specials.iter().enumerate() {
        vocab.insert(s.to_string(), json!(265 + i));
    }
    let added: Vec<_> = specials
        .iter()
        .enumerate()
        .map(|(i, s)| json!({"id": 265 + i, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
        .collect();
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [265], "tokens": ["<|begin_of_text|>"]}}
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab,
            "merges": ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"]
        }
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    if let Some(c) = config {
        std::fs::write(dir.path().join("tokenizer_config.json"), c.to_string()).unwrap();
    }
    if let Some(g) = generation {
        std::fs::write(dir.path().join("generation_config.json"), g.to_string()).unwrap();
    }
    dir
}

#[test]
fn hf_dir_with_config() {
    use serde_json::json;
    let config = json!({
        "bos_token": "<|begin_of_text|>",
        "eos_token": {"content": "<|end_of_text|>", "special": true},
        "add_bos_token": false,
        "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"
    });
    let generation = json!({"eos_token_id": [266, 267]});
    let dir = hf_dir(Some(config), Some(generation));
    let t = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(t.bos_id(), Some(265));
    assert_eq!(t.eos_id(), Some(266));
    assert!(!t.add_bos_by_default());
    assert_eq!(t.stop_ids(), &[266, 267]);
    assert_eq!(
        t.chat_template(),
        Some("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")
    );
    assert_eq!(t.vocab_size(), 268);
    let text = "<|begin_of_text|>hello world!<|eot_id|>";
    let ids = t.encode(text, false).unwrap();
    assert_eq!(ids, vec![265, 259, 264, 33, 267]);
    assert_eq!(t.decode(&ids).unwrap(), text);
    assert_eq!(t.encode("hello", true).unwrap(), vec![265, 259]);
    // Streaming goes through the byte-level mapping the decoder implies.
    let ids = t.encode("hé ☃", false).unwrap();
    let mut dec = t.stream_decoder();
    let chunks: Vec<String> = ids.iter().map(|&i| dec.push(i)).collect();
    assert_eq!(chunks.concat() + &dec.finish(), "hé ☃");
    assert!(chunks.iter().all(|c| !c.contains('\u{FFFD}')));
}

#[test]
fn hf_dir_without_config_trusts_the_post_processor() {
    let dir = hf_dir(
        None,
        Some(serde_json::json!({"bos_token_id": 265, "eos_token_id": 267})),
    );
    let t = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(t.bos_id(), Some(265));
    assert_eq!(t.eos_id(), Some(267));
    // The post-processor puts BOS first, so the model expects it.
    assert!(t.add_bos_by_default());
    assert_eq!(t.chat_template(), None);
    // <|eot_id|> and <|end_of_text|> end a turn even when no config says so.
    assert_eq!(t.stop_ids(), &[267, 266]);
}

#[test]
fn hf_dir_errors() {
    let empty = tempfile::tempdir().unwrap();
    assert!(Tokenizer::from_hf_dir(empty.path()).is_err());
    std::fs::write(empty.path().join("tokenizer.json"), "{ not json").unwrap();
    assert!(Tokenizer::from_hf_dir(empty.path()).is_err());
    let dir = hf_dir(None, None);
    std::fs::write(dir.path().join("tokenizer_config.json"), "[1, 2").unwrap();
    assert!(Tokenizer::from_hf_dir(dir.path()).is_err());
}

/// A byte-level GGUF vocabulary whose merges would build "12345" whole, with
/// `tokenizer.ggml.pre` set to `pre` (absent when `None`).
fn digits_gguf(pre: Option<&str>) -> Tokenizer {
    let mut tokens: Vec<String> = byte_level_chars().iter().map(|c| c.to_string()).collect();
    tokens.extend(["12", "123", "1234", "12345", "45"].map(String::from));
    let merges = ["1 2", "12 3", "123 4", "1234 5", "4 5"];
    let strs = |v: Vec<String>| GgufValue::Array(v.into_iter().map(GgufValue::String).collect());
    let mut w = GgufWriter::new();
    w.add("tokenizer.ggml.model", GgufValue::String("gpt2".into()))
        .add("tokenizer.ggml.tokens", strs(tokens))
        .add(
            "tokenizer.ggml.merges",
            strs(merges.iter().map(|m| m.to_string()).collect()),
        );
    // Any id will do for BOS; only whether it is added by default matters.
    w.add("tokenizer.ggml.bos_token_id", GgufValue::U32(0));
    if let Some(pre) = pre {
        w.add("tokenizer.ggml.pre", GgufValue::String(pre.into()));
    }
    let g = GgufFile::from_bytes(w.to_bytes().unwrap(), "digits.gguf").unwrap();
    Tokenizer::from_gguf(&g).unwrap()
}

#[test]
fn pre_tokenizer_types_split_digits_like_llama_cpp() {
    let pieces = |t: &Tokenizer, text: &str| -> Vec<String> {
        let ids = t.encode(text, false).unwrap();
        assert_eq!(t.decode(&ids).unwrap(), text);
        ids.iter().map(|&i| t.id_to_piece(i).unwrap()).collect()
    };
    // GPT-2: digits stay one word, so the merges build the whole number.
    for pre in [None, Some("gpt-2"), Some("default")] {
        let t = digits_gguf(pre);
        assert_eq!(pieces(&t, "12345"), ["12345"], "pre {pre:?}");
        assert!(!t.add_bos_by_default());
    }
    // Llama 3: numbers are cut into groups of up to three digits.
    let t = digits_gguf(Some("llama-bpe"));
    assert_eq!(pieces(&t, "12345"), ["123", "45"]);
    assert!(
        t.add_bos_by_default(),
        "llama-bpe adds BOS when the key is absent"
    );
    // Qwen2 and SmolLM: every digit alone.
    for pre in ["qwen2", "smollm"] {
        let t = digits_gguf(Some(pre));
        assert_eq!(pieces(&t, "12345"), ["1", "2", "3", "4", "5"], "pre {pre}");
    }
    // An unknown pre-tokenizer is refused rather than guessed.
    let mut w = GgufWriter::new();
    w.add("tokenizer.ggml.model", GgufValue::String("gpt2".into()))
        .add(
            "tokenizer.ggml.tokens",
            GgufValue::Array(vec![GgufValue::String("a".into())]),
        )
        .add("tokenizer.ggml.merges", GgufValue::Array(vec![]))
        .add(
            "tokenizer.ggml.pre",
            GgufValue::String("no-such-pre".into()),
        );
    let g = GgufFile::from_bytes(w.to_bytes().unwrap(), "pre.gguf").unwrap();
    let err = Tokenizer::from_gguf(&g).err().unwrap();
    assert!(err.to_string().contains("no-such-pre"), "{err}");
}

/// A byte-level GGUF vocabulary whose merges build each of `words` whole
/// (left to right, longer words' merges ranked first), with
/// `tokenizer.ggml.pre` = `pre`.
fn words_gguf(pre: &str, words: &[&str]) -> Tokenizer {
    let table = byte_level_chars();
    let mut tokens: Vec<String> = table.iter().map(|c| c.to_string()).collect();
    let mut merges: Vec<String> = Vec::new();
    for w in words {
        let chars: Vec<char> = w.bytes().map(|b| table[b as usize]).collect();
        for i in 1..chars.len() {
            let left: String = chars[..i].iter().collect();
            let merge = format!("{left} {}", chars[i]);
            if !merges.contains(&merge) {
                merges.push(merge);
                tokens.push(chars[..=i].iter().collect());
            }
        }
    }
    let strs = |v: Vec<String>| GgufValue::Array(v.into_iter().map(GgufValue::String).collect());
    let mut w = GgufWriter::new();
    w.add("tokenizer.ggml.model", GgufValue::String("gpt2".into()))
        .add("tokenizer.ggml.tokens", strs(tokens))
        .add("tokenizer.ggml.merges", strs(merges))
        .add("tokenizer.ggml.pre", GgufValue::String(pre.into()));
    let g = GgufFile::from_bytes(w.to_bytes().unwrap(), "words.gguf").unwrap();
    Tokenizer::from_gguf(&g).unwrap()
}

#[test]
fn gpt4o_pre_tokenizer_splits_like_llama_cpp() {
    // The merges could build each text whole; only the pre-tokenizer's
    // words stop them. Expected words: llama.cpp's GPT4O regex (the same as
    // tokenizer.json's o200k regex on these texts).
    let words = [
        "HelloWorld",
        "Hello",
        "World",
        "don't",
        "don",
        "'t",
        "abcDEF",
        "abc",
        "DEF",
        "DON'T",
        " stop",
        "12345",
        "123",
        "45",
        "://",
        " x",
        "y",
    ];
    let pieces = |t: &Tokenizer, text: &str| -> Vec<String> {
        let ids = t.encode(text, false).unwrap();
        assert_eq!(t.decode(&ids).unwrap(), text);
        ids.iter()
            .map(|&i| t.id_to_piece(i).unwrap().replace('\u{120}', " "))
            .collect()
    };
    let o200k = words_gguf("gpt-4o", &words);
    assert!(!o200k.add_bos_by_default());
    for (text, want) in [
        // Case changes start a word; a contraction stays on its word.
        ("HelloWorld", &["Hello", "World"][..]),
        ("abcDEF", &["abc", "DEF"]),
        ("don't", &["don't"]),
        ("DON'T stop", &["DON'T", " stop"]),
        // Numbers in threes; punctuation takes trailing slashes.
        ("12345", &["123", "45"]),
        (" x://y", &[" x", "://", "y"]),
    ] {
        assert_eq!(pieces(&o200k, text), want, "gpt-4o: {text:?}");
    }
    // Llama 3's regex on the same vocabulary cuts otherwise.
    let llama3 = words_gguf("llama-bpe", &words);
    assert_eq!(pieces(&llama3, "HelloWorld"), ["HelloWorld"]);
    assert_eq!(pieces(&llama3, "don't"), ["don", "'t"]);
}

#[test]
fn hf_dir_metaspace_tokenizer_streams_like_it_decodes() {
    use serde_json::json;
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
        "post_processor": null,
        "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
        "model": {"type": "WordLevel", "vocab": {"▁hello": 0, "▁world": 1, "<unk>": 2}, "unk_token": "<unk>"}
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let t = Tokenizer::from_hf_dir(dir.path()).unwrap();
    let ids = t.encode("hello world hello", false).unwrap();
    assert_eq!(ids, vec![0, 1, 0]);
    assert_eq!(t.decode(&ids).unwrap(), "hello world hello");
    let mut dec = t.stream_decoder();
    let chunks: Vec<String> = ids.iter().map(|&i| dec.push(i)).collect();
    assert_eq!(chunks, ["hello", " world", " hello"]);
    assert_eq!(dec.finish(), "");
    assert_eq!(t.bos_id(), None);
    assert!(!t.add_bos_by_default());
}
