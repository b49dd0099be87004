//! Loading a tokenizer from files: sources, template choice, EOS ids, and each bad input's error.

mod support;

use std::fs;
use std::path::Path;

use pdrouter_tokenizer::bytelevel::{self, ENDOFTEXT, IM_END};
use pdrouter_tokenizer::*;
use serde_json::json;

fn bytelevel_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    support::write_files(dir.path(), bytelevel::files());
    dir
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut value: serde_json::Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
    edit(&mut value);
    fs::write(path, serde_json::to_vec(&value).unwrap()).unwrap();
}

fn user(text: &str) -> ChatInput {
    ChatInput {
        messages: TemplateValue::from_serialize(&json!([{"role": "user", "content": text}])),
        ..ChatInput::default()
    }
}

#[test]
fn shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Tokenizer>();
    send_sync::<ChatTemplate>();
    send_sync::<TextStream>();
    send_sync::<bundle::Receiver>();
    // Debug output is a summary, fit for a log line, not the vocabulary.
    let debug = format!("{:?}", support::qwen3());
    assert!(
        debug.len() < 500 && debug.contains("eos_token_ids: [151645, 151643]"),
        "{debug}"
    );
}

#[test]
fn a_file_path_reads_the_configs_beside_it() {
    let dir = bytelevel_dir();
    let from_dir = Tokenizer::load(dir.path(), None).unwrap();
    let from_file = Tokenizer::load(&dir.path().join("tokenizer.json"), None).unwrap();
    for tk in [&from_dir, &from_file] {
        assert_eq!(tk.eos_token_ids(), [IM_END, ENDOFTEXT]);
        assert_eq!(tk.encode("hé").unwrap(), [b'h'.into(), 0xC3, 0xA9]);
        assert!(tk.chat_template().is_some());
        assert_eq!(tk.vocab_size(), bytelevel::VOCAB_SIZE);
    }
    // A bare tokenizer.json: no template, no EOS ids; chat requests get a clear error.
    let bare = tempfile::tempdir().unwrap();
    fs::copy(
        dir.path().join("tokenizer.json"),
        bare.path().join("tokenizer.json"),
    )
    .unwrap();
    let tk = Tokenizer::load(bare.path(), None).unwrap();
    assert!(tk.eos_token_ids().is_empty());
    assert!(matches!(
        tk.apply_chat_template(&user("x")),
        Err(TemplateError::NoTemplate)
    ));
}

#[test]
fn eos_ids_accept_an_int_or_a_list_and_are_deduplicated() {
    let dir = bytelevel_dir();
    edit_json(&dir.path().join("generation_config.json"), |v| {
        v["eos_token_id"] = json!(7)
    });
    edit_json(&dir.path().join("config.json"), |v| {
        v["eos_token_id"] = json!([258, 9])
    });
    let tk = Tokenizer::load(dir.path(), None).unwrap();
    assert_eq!(tk.eos_token_ids(), [IM_END, 7, 9]);
}

#[test]
fn special_tokens_map_fills_what_tokenizer_config_lacks() {
    let dir = bytelevel_dir();
    edit_json(&dir.path().join("tokenizer_config.json"), |v| {
        let v = v.as_object_mut().unwrap();
        v.remove("eos_token");
        v["chat_template"] = json!("{{ bos_token }}|{{ eos_token }}");
    });
    fs::write(
        dir.path().join("special_tokens_map.json"),
        r#"{"eos_token": {"content": "<|endoftext|>", "special": true}, "bos_token": "<|im_start|>"}"#,
    )
    .unwrap();
    let tk = Tokenizer::load(dir.path(), None).unwrap();
    assert_eq!(tk.eos_token_ids()[0], ENDOFTEXT);
    assert_eq!(
        tk.apply_chat_template(&user("x")).unwrap(),
        "<|im_start|>|<|endoftext|>"
    );
}

#[test]
fn template_sources_in_order() {
    let dir = bytelevel_dir();
    let config = dir.path().join("tokenizer_config.json");
    // A list of named templates: "default" is used.
    edit_json(&config, |v| {
        v["chat_template"] = json!([
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": "DEFAULT {{ messages[0].content }}"}
        ]);
    });
    let tk = Tokenizer::load(dir.path(), None).unwrap();
    assert_eq!(tk.apply_chat_template(&user("x")).unwrap(), "DEFAULT x");

    // An explicit file wins: raw Jinja, or JSON with a chat_template field.
    let jinja = dir.path().join("mine.jinja");
    fs::write(&jinja, "JINJA {{ messages[0].content }}").unwrap();
    let tk = Tokenizer::load(dir.path(), Some(&jinja)).unwrap();
    assert_eq!(tk.apply_chat_template(&user("x")).unwrap(), "JINJA x");
    let json_file = dir.path().join("mine.json");
    fs::write(
        &json_file,
        r#"{"chat_template": "JSON {{ messages[0].content }}"}"#,
    )
    .unwrap();
    let tk = Tokenizer::load(dir.path(), Some(&json_file)).unwrap();
    assert_eq!(tk.apply_chat_template(&user("x")).unwrap(), "JSON x");

    // Without one in tokenizer_config.json: chat_template.jinja, then chat_template.json.
    edit_json(&config, |v| {
        v.as_object_mut().unwrap().remove("chat_template");
    });
    fs::write(
        dir.path().join("chat_template.json"),
        r#"{"chat_template": "CT-JSON"}"#,
    )
    .unwrap();
    let tk = Tokenizer::load(dir.path(), None).unwrap();
    assert_eq!(tk.apply_chat_template(&user("x")).unwrap(), "CT-JSON");
    fs::write(dir.path().join("chat_template.jinja"), "CT-JINJA").unwrap();
    let tk = Tokenizer::load(dir.path(), None).unwrap();
    assert_eq!(tk.apply_chat_template(&user("x")).unwrap(), "CT-JINJA");
}

#[test]
fn bad_model_files_each_give_a_clear_error() {
    let empty = tempfile::tempdir().unwrap();
    let err = Tokenizer::load(empty.path(), None).unwrap_err();
    assert!(matches!(err, LoadError::NoTokenizerJson { .. }), "{err}");

    let dir = bytelevel_dir();
    let config = dir.path().join("tokenizer_config.json");
    edit_json(&config, |v| v["eos_token"] = json!({"content": "<|nope|>"}));
    let err = Tokenizer::load(dir.path(), None).unwrap_err();
    assert!(matches!(err, LoadError::UnknownSpecialToken { ref token, .. } if token == "<|nope|>"));
    assert!(err.to_string().contains("not in the vocabulary"), "{err}");

    let dir = bytelevel_dir();
    let config = dir.path().join("tokenizer_config.json");
    edit_json(&config, |v| {
        v["chat_template"] =
            json!([{"name": "a", "template": "A"}, {"name": "b", "template": "B"}]);
    });
    let err = Tokenizer::load(dir.path(), None).unwrap_err();
    assert!(matches!(err, LoadError::NoDefaultTemplate { ref names, .. } if names == &["a", "b"]));

    edit_json(&config, |v| {
        v["chat_template"] = json!("{% for m in messages %}{{ m.content }")
    });
    let err = Tokenizer::load(dir.path(), None).unwrap_err();
    assert!(matches!(err, LoadError::Template { .. }), "{err}");

    edit_json(&config, |v| v["chat_template"] = json!(42));
    let err = Tokenizer::load(dir.path(), None).unwrap_err();
    assert!(matches!(err, LoadError::Config { .. }), "{err}");

    edit_json(&config, |v| v["chat_template"] = json!("fine"));
    let err = Tokenizer::load(dir.path(), Some(&dir.path().join("missing.jinja"))).unwrap_err();
    assert!(matches!(err, LoadError::Io { .. }), "{err}");

    fs::write(dir.path().join("tokenizer.json"), b"{\"model\": 1}").unwrap();
    let err = Tokenizer::load(dir.path(), None).unwrap_err();
    assert!(matches!(err, LoadError::Tokenizer { .. }), "{err}");
}

#[test]
fn a_bundle_from_a_worker_loads_after_extraction() {
    let (zip, sha) = bundle::pack(bytelevel::files()).unwrap();
    let mut rx = bundle::Receiver::new(bundle::Limits::default());
    for (data, sum) in bundle::chunks(&zip, &sha, bundle::CHUNK_SIZE) {
        rx.push(data, sum).unwrap();
    }
    let parent = tempfile::tempdir().unwrap();
    let unpacked = rx.finish(parent.path()).unwrap();
    let tk = Tokenizer::load(unpacked.path(), None).unwrap();
    // Loaded in memory: the files may go.
    drop(unpacked);
    assert_eq!(tk.eos_token_ids(), [IM_END, ENDOFTEXT]);
    let prompt = tk.apply_chat_template(&user("héllo 世界")).unwrap();
    assert_eq!(prompt, "<|im_start|>user\nhéllo 世界<|im_end|>\n");
}

#[test]
fn ids_and_stop_conditions_are_checked_against_the_vocabulary() {
    let tk = support::bytelevel();
    assert!(tk.check_ids(&[0, 255, IM_END]).is_ok());
    let err = tk.check_ids(&[1, bytelevel::VOCAB_SIZE]).unwrap_err();
    assert!(matches!(err, EncodeError::UnknownTokenId { id, .. } if id == bytelevel::VOCAB_SIZE));

    let err = StopConditions::new(&tk, &[], &[99_999], false, false).unwrap_err();
    assert!(matches!(err, StopError::UnknownTokenId { id: 99_999, .. }));
    let many: Vec<String> = (0..=stop::MAX_STOP_STRINGS)
        .map(|i| i.to_string())
        .collect();
    assert!(matches!(
        StopConditions::new(&tk, &many, &[], false, false),
        Err(StopError::TooManyStrings { .. })
    ));
    let long = vec!["x".repeat(stop::MAX_STOP_STRING_BYTES + 1)];
    assert!(matches!(
        StopConditions::new(&tk, &long, &[], false, false),
        Err(StopError::StringTooLong { .. })
    ));
    // ignore_eos: EOS is text like any token (skipped as special), not a stop.
    let keep_going = StopConditions::new(&tk, &[], &[], true, false).unwrap();
    assert!(!keep_going.is_stop_token(IM_END));
    let mut stream = TextStream::new(tk.clone(), DecodeOptions::default(), keep_going);
    let step = stream
        .push_all(&[b'a'.into(), IM_END, b'b'.into()])
        .unwrap();
    assert_eq!((step.text.as_str(), step.finish), ("ab", None));
}
