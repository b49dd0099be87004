//! The fast encoding route against the library on tokenizer shapes beyond the two real
//! configurations (`qwen3.rs` covers those): GPT-2's own split inside `ByteLevel`, and
//! configurations the route must leave to the library.

mod support;

use pdrouter_tokenizer::{Tokenizer, bytelevel};
use proptest::prelude::*;

/// The byte-level test tokenizer with its `tokenizer.json` changed by `edit`: the library's
/// tokenizer and ours over the same files.
fn variant(edit: impl Fn(&mut serde_json::Value)) -> (tokenizers::Tokenizer, Tokenizer) {
    let dir = tempfile::tempdir().unwrap();
    let mut files = bytelevel::files();
    for (name, data) in &mut files {
        if *name == "tokenizer.json" {
            let mut json: serde_json::Value = serde_json::from_slice(data).unwrap();
            edit(&mut json);
            *data = serde_json::to_vec(&json).unwrap();
        }
    }
    support::write_files(dir.path(), files);
    let library = tokenizers::Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
    (library, Tokenizer::load(dir.path(), None).unwrap())
}

fn gpt2_split() -> &'static (tokenizers::Tokenizer, Tokenizer) {
    static T: std::sync::OnceLock<(tokenizers::Tokenizer, Tokenizer)> = std::sync::OnceLock::new();
    T.get_or_init(|| variant(|j| j["pre_tokenizer"]["use_regex"] = true.into()))
}

type Edit = fn(&mut serde_json::Value);

#[test]
fn configurations_the_route_does_not_reproduce_are_left_to_the_library() {
    let text = "Hello  world <|im_start|>user\n 12345 can't";
    let edits: [(&str, Edit); 4] = [
        ("a prefix space", |j| {
            j["pre_tokenizer"]["add_prefix_space"] = true.into()
        }),
        ("a lowercasing normalizer", |j| {
            j["normalizer"] = serde_json::json!({"type": "Lowercase"})
        }),
        ("a stripped added token", |j| {
            j["added_tokens"][0]["lstrip"] = true.into()
        }),
        ("a normalized added token", |j| {
            j["added_tokens"][0]["normalized"] = true.into()
        }),
    ];
    for (what, edit) in edits {
        let (library, ours) = variant(edit);
        assert!(!ours.has_fast_route(), "{what}");
        let expected = library.encode_fast(text, false).unwrap();
        assert_eq!(ours.encode(text).unwrap(), expected.get_ids(), "{what}");
    }
    let (_, nfc) = variant(|j| j["normalizer"] = serde_json::json!({"type": "NFC"}));
    assert!(nfc.has_fast_route(), "NFC: the route takes ASCII text");
    // The inline bound follows the route.
    assert_eq!(
        nfc.offload_threshold(),
        pdrouter_tokenizer::FAST_OFFLOAD_THRESHOLD_BYTES
    );
    let (_, slow) = variant(|j| j["pre_tokenizer"]["add_prefix_space"] = true.into());
    assert_eq!(
        slow.offload_threshold(),
        pdrouter_tokenizer::OFFLOAD_THRESHOLD_BYTES
    );
}

#[test]
fn gpt2_splitting_matches_the_library_on_known_cases() {
    let (library, ours) = gpt2_split();
    assert!(ours.has_fast_route());
    for text in [
        "",
        " ",
        "Hello world",
        "  leading and trailing  ",
        "it's they'RE we'll I'd",
        "x = 123456 + 7.5;\n\n\tdone\r\n",
        "<|im_start|>user\nhi<|im_end|>",
        "café naïve 日本語 🎉",
    ] {
        let expected = library.encode_fast(text, false).unwrap();
        assert_eq!(ours.encode(text).unwrap(), expected.get_ids(), "{text:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn gpt2_splitting_gives_the_librarys_ids(
        parts in proptest::collection::vec(
            prop_oneof![
                "[ -~]{0,16}",
                "('s|'t|'re|'ve|'m|'ll|'d)",
                "[ \\t\\r\\n]{1,4}",
                "\\PC{0,8}",
                "(<\\|im_start\\|>|<\\|im_end\\|>|<\\|im_sta)",
            ],
            0..8,
        )
    ) {
        let text = parts.concat();
        let (library, ours) = gpt2_split();
        let expected = library.encode_fast(text.as_str(), false).unwrap();
        prop_assert_eq!(ours.encode(&text).unwrap(), expected.get_ids());
    }
}
