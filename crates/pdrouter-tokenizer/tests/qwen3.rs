//! A real model's tokenizer and chat template (Qwen3, see tests/fixtures/qwen3/README.md).

mod support;

use pdrouter_tokenizer::*;
use proptest::prelude::*;

const IM_START: u32 = 151644;
const IM_END: u32 = 151645;
const ENDOFTEXT: u32 = 151643;
const TOOL_CALL: u32 = 151657;
const TOOL_CALL_END: u32 = 151658;
const TOOL_RESPONSE: u32 = 151665;
const THINK: u32 = 151667;

fn rendered(name: &str) -> String {
    let tk = support::qwen3();
    let (_, input) = support::conversations()
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap();
    tk.apply_chat_template(&input).unwrap()
}

#[test]
fn encodes_like_the_full_tokenizer_and_decodes_back() {
    let tk = support::qwen3();
    let expected: Vec<serde_json::Value> =
        serde_json::from_str(include_str!("fixtures/qwen3/expected.json")).unwrap();
    assert!(expected.len() >= 6);
    for entry in expected {
        let text = entry["text"].as_str().unwrap();
        let ids: Vec<u32> = serde_json::from_value(entry["ids"].clone()).unwrap();
        assert_eq!(tk.encode(text).unwrap(), ids, "{text:?}");
        let all = DecodeOptions {
            skip_special_tokens: false,
            ..DecodeOptions::default()
        };
        assert_eq!(tk.decode(&ids, all).unwrap(), text);
    }
    // Ids anyone can check against the published vocabulary.
    assert_eq!(tk.encode("Hello world").unwrap(), [9707, 1879]);
    assert_eq!(tk.token_to_id("<|im_start|>"), Some(IM_START));
}

#[test]
fn eos_ids_come_from_the_configs_and_the_template_wants_strings() {
    let tk = support::qwen3();
    assert_eq!(tk.eos_token_ids(), [IM_END, ENDOFTEXT]);
    assert!(tk.is_special(IM_END) && !tk.is_special(TOOL_CALL));
    assert_eq!(
        tk.chat_template().unwrap().content_format(),
        ContentFormat::String
    );
}

#[test]
fn renders_system_user_assistant_turns_with_a_generation_prompt() {
    let prompt = rendered("chat");
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello! How can I help?<|im_end|>\n\
         <|im_start|>user\nTell me a joke.<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    let ids = support::qwen3().encode(&prompt).unwrap();
    let starts: Vec<usize> = (0..ids.len()).filter(|&i| ids[i] == IM_START).collect();
    assert_eq!(starts.len(), 5);
    assert_eq!(ids.iter().filter(|&&id| id == IM_END).count(), 4);
    assert_eq!(ids[0], IM_START);
    // "<|im_start|>assistant\n" ends the prompt.
    assert_eq!(&ids[ids.len() - 3..], [IM_START, 77091, 198]);
}

#[test]
fn renders_tools_tool_calls_and_tool_messages() {
    let prompt = rendered("tools");
    let tools_block = "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \
        \"description\": \"Current weather in a city\", \"parameters\": {\"type\": \"object\", \
        \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools>";
    assert!(prompt.starts_with("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n"));
    assert!(prompt.contains(tools_block), "{prompt}");
    assert!(prompt.contains(
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \
         {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
    ));
    assert!(prompt.ends_with(
        "<|im_start|>user\n<tool_response>\n{\"temperature\": 21}\n</tool_response><|im_end|>\n\
         <|im_start|>assistant\n"
    ));
    let ids = support::qwen3().encode(&prompt).unwrap();
    // Twice in the template's instructions ("<tool_call></tool_call> XML tags", the example),
    // once in the assistant's call.
    assert_eq!(ids.iter().filter(|&&id| id == TOOL_CALL).count(), 3);
    assert_eq!(ids.iter().filter(|&&id| id == TOOL_CALL_END).count(), 3);
    assert_eq!(ids.iter().filter(|&&id| id == TOOL_RESPONSE).count(), 1);
}

#[test]
fn template_arguments_reach_the_template() {
    let prompt = rendered("no_thinking");
    assert_eq!(
        prompt,
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    let ids = support::qwen3().encode(&prompt).unwrap();
    assert!(ids.contains(&THINK));
}

#[test]
fn streaming_qwen3_output_hides_the_stop_token_and_cuts_stop_strings() {
    let tk = support::qwen3();
    let answer = "Hello world! The router sits in front of the engines.";
    let mut ids = tk.encode(answer).unwrap();
    ids.push(IM_END);
    ids.extend(tk.encode(" never shown").unwrap());
    for skip_special_tokens in [true, false] {
        let options = DecodeOptions {
            skip_special_tokens,
            ..DecodeOptions::default()
        };
        let stop = StopConditions::new(&tk, &[], &[], false, false).unwrap();
        let mut stream = TextStream::new(tk.clone(), options, stop);
        let step = stream.push_all(&ids).unwrap();
        assert_eq!(step.text, answer);
        assert_eq!(step.finish, Some(FinishReason::StopToken(IM_END)));
    }
    let stop = StopConditions::new(&tk, &["front of".into()], &[], false, true).unwrap();
    let mut stream = TextStream::new(tk.clone(), DecodeOptions::default(), stop);
    let step = stream.push_all(&ids).unwrap();
    assert_eq!(step.text, "Hello world! The router sits in front of");
    assert_eq!(
        step.finish.as_ref().and_then(FinishReason::matched_text),
        Some("front of")
    );
}

/// The library's own tokenizers over the same files (Qwen3, byte-level), and ours.
fn library_and_ours() -> &'static [(tokenizers::Tokenizer, Tokenizer); 2] {
    static BOTH: std::sync::OnceLock<[(tokenizers::Tokenizer, Tokenizer); 2]> =
        std::sync::OnceLock::new();
    BOTH.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        support::write_files(dir.path(), bytelevel::files());
        [support::qwen3_dir(), dir.path().to_owned()].map(|d| {
            let library = tokenizers::Tokenizer::from_file(d.join("tokenizer.json")).unwrap();
            (library, Tokenizer::load(&d, None).unwrap())
        })
    })
}

/// Text pieces: prose, code-like runs, contractions, digits, every kind of whitespace,
/// added tokens whole and cut short, and any characters at all.
fn pieces() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            "[a-zA-Z0-9 .,!?'\n\t]{0,12}",
            "[ -~]{0,16}",
            "('s|'T|'re|'VE|'m|'ll|'d|n't)",
            "[0-9]{1,7}",
            "[ \t\r\n\u{a0}\u{3000}]{1,5}",
            "\\PC{0,8}",
            "(<\\|im_start\\|>|<\\|im_end\\|>|<think>|</tool_call>|<\\|endoftext\\|>|<\\|im_sta|<think|\\|>)",
        ],
        0..8,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// `encode` takes the fast route for both tokenizers (Qwen3's for ASCII text) and gives
    /// the library's ids, added tokens (special or not) included; so does the pipeline route.
    #[test]
    fn encode_gives_the_librarys_ids(text in pieces()) {
        for (library, ours) in library_and_ours() {
            prop_assert!(ours.has_fast_route());
            let expected = library.encode_fast(text.as_str(), false).unwrap();
            prop_assert_eq!(ours.encode(&text).unwrap(), expected.get_ids());
            prop_assert_eq!(ours.encode_pipeline(&text).unwrap(), expected.get_ids());
        }
    }

    #[test]
    fn qwen3_streams_any_text_like_a_full_decode(text in "[a-zA-Z0-9 .,!?'\n\t]{0,30}|\\PC{0,20}") {
        let tk = support::qwen3();
        let ids = tk.encode(&text).unwrap();
        let mut stream = DecodeStream::new(tk.clone(), DecodeOptions::default());
        let mut out = String::new();
        for id in &ids {
            let delta = stream.step(*id).unwrap().unwrap_or_default();
            let broken = delta.contains('\u{FFFD}') && !text.contains('\u{FFFD}');
            prop_assert!(!broken, "broken sequence in {:?}", delta);
            out.push_str(&delta);
        }
        out.push_str(&stream.flush().unwrap().unwrap_or_default());
        prop_assert_eq!(&out, &tk.decode(&ids, DecodeOptions::default()).unwrap());
    }
}
