//! A byte-level tokenizer built in code, so the whole stack runs with no downloaded model.
//!
//! Token id = byte value for ids `0..=255`; the special and added tokens below sit above 255.
//! [`files`] returns the files of a tokenizer directory (`tokenizer.json`,
//! `tokenizer_config.json` with a ChatML-style chat template, `generation_config.json`,
//! `config.json`) that HF `tokenizers` and this crate's loader read like any model's.
//!
//! Invariants:
//! - Any UTF-8 text that contains no added token's content encodes to exactly its bytes, one
//!   token per byte, and decodes back to the same text ([`encode_plain`] is the same mapping
//!   without the tokenizers library).
//! - The model is a byte-level BPE with no merges: the pre-tokenizer maps each byte to one
//!   printable character (the GPT-2 byte alphabet), and the vocabulary maps that character to
//!   the byte's value; the byte-level decoder maps it back.
//! - This module depends on `serde_json` only, so a mock engine can serve it without loading it.

use serde_json::{Map, Value, json};

/// `<|endoftext|>`: end of a document, also a stop token.
pub const ENDOFTEXT: u32 = 256;
/// `<|im_start|>`: opens a chat turn.
pub const IM_START: u32 = 257;
/// `<|im_end|>`: closes a chat turn; the chat EOS.
pub const IM_END: u32 = 258;
/// `<image>`: placeholder for an image in a prompt.
pub const IMAGE: u32 = 259;
/// `<tool_call>` (not special: a tool-call parser needs it in the text).
pub const TOOL_CALL_START: u32 = 260;
/// `</tool_call>` (not special).
pub const TOOL_CALL_END: u32 = 261;
/// `<think>` (not special).
pub const THINK_START: u32 = 262;
/// `</think>` (not special).
pub const THINK_END: u32 = 263;
/// Number of token ids: 256 bytes and the added tokens.
pub const VOCAB_SIZE: u32 = 264;
/// The ids generation stops at (`generation_config.json`'s `eos_token_id`), chat EOS first.
pub const EOS_TOKEN_IDS: [u32; 2] = [IM_END, ENDOFTEXT];
/// Context length written to the config files.
pub const MAX_POSITION_EMBEDDINGS: u32 = 32_768;

/// Tokens above the bytes: `(id, content, special)`. Special tokens are skipped when decoding
/// with `skip_special_tokens`; the others stay in the text.
pub const ADDED_TOKENS: [(u32, &str, bool); 8] = [
    (ENDOFTEXT, "<|endoftext|>", true),
    (IM_START, "<|im_start|>", true),
    (IM_END, "<|im_end|>", true),
    (IMAGE, "<image>", true),
    (TOOL_CALL_START, "<tool_call>", false),
    (TOOL_CALL_END, "</tool_call>", false),
    (THINK_START, "<think>", false),
    (THINK_END, "</think>", false),
];

/// ChatML-style template: system/user/assistant/tool turns, string or content-part content
/// (text parts, image parts as `<image>`), assistant `tool_calls`, an optional tool list in the
/// system turn, and `raise_exception` for an unknown role or a misplaced system message.
pub const CHAT_TEMPLATE: &str = r#"
{%- set known_roles = ['system', 'user', 'assistant', 'tool'] -%}
{%- macro text_of(content) -%}
  {%- if content is none -%}
  {%- elif content is string -%}{{ content }}
  {%- else -%}
    {%- for part in content -%}
      {%- if part.type == 'text' -%}{{ part.text }}
      {%- elif part.type in ['image', 'image_url'] -%}{{ '<image>' }}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- set first_is_system = messages and messages[0].role == 'system' -%}
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if first_is_system -%}{{ text_of(messages[0].content) ~ '\n\n' }}{%- endif -%}
  {{- 'Tools you may call, one JSON object per line:\n<tools>\n' -}}
  {%- for tool in tools -%}{{ tool | tojson ~ '\n' }}{%- endfor -%}
  {{- '</tools>\nTo call one, answer <tool_call>{"name": ..., "arguments": {...}}</tool_call>.<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if message.role not in known_roles -%}
    {{- raise_exception('unknown message role: ' ~ message.role) -}}
  {%- endif -%}
  {%- if message.role == 'system' and not loop.first -%}
    {{- raise_exception('a system message must come first') -}}
  {%- endif -%}
  {%- if not (tools and message.role == 'system') -%}
    {{- '<|im_start|>' ~ message.role ~ '\n' ~ text_of(message.content) -}}
    {%- if message.role == 'assistant' and message.tool_calls -%}
      {%- for call in message.tool_calls -%}
        {%- set f = call.function if call.function is defined else call -%}
        {%- if loop.first and message.content -%}{{ '\n' }}{%- endif -%}
        {{- '<tool_call>\n{"name": ' ~ (f.name | tojson) ~ ', "arguments": ' -}}
        {%- if f.arguments is string -%}{{ f.arguments }}{%- else -%}{{ f.arguments | tojson }}{%- endif -%}
        {{- '}\n</tool_call>' -}}
      {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}
"#;

/// The tokenizer directory: `(file name, contents)`, in a fixed order.
pub fn files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("tokenizer.json", to_json(&tokenizer_json())),
        ("tokenizer_config.json", to_json(&tokenizer_config_json())),
        ("generation_config.json", to_json(&generation_config_json())),
        ("config.json", to_json(&config_json())),
    ]
}

/// Token ids of `text` taken as plain bytes (added tokens' contents are not recognised).
pub fn encode_plain(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

/// The bytes a token id stands for: its byte, or an added token's content. `None` past the
/// vocabulary.
pub fn token_bytes(id: u32) -> Option<Vec<u8>> {
    match u8::try_from(id) {
        Ok(byte) => Some(vec![byte]),
        Err(_) => added_token(id).map(|(content, _)| content.as_bytes().to_vec()),
    }
}

/// An added token's content and whether it is special.
pub fn added_token(id: u32) -> Option<(&'static str, bool)> {
    ADDED_TOKENS
        .iter()
        .find(|(tid, _, _)| *tid == id)
        .map(|(_, content, special)| (*content, *special))
}

fn to_json(value: &Value) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(value).expect("a JSON value always serialises");
    bytes.push(b'\n');
    bytes
}

/// The GPT-2 byte alphabet: printable Latin-1 bytes stand for themselves, the others (controls,
/// space, a few Latin-1 marks) take the code points from U+0100 upwards, in byte order, so every
/// byte has one visible, distinct character.
fn byte_char(byte: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(byte) {
        return char::from(byte);
    }
    let rank = (0..byte).filter(|b| !printable(*b)).count() as u32;
    char::from_u32(0x100 + rank).expect("U+0100..U+0143 are valid scalar values")
}

fn byte_level(kind: &str) -> Value {
    json!({ "type": kind, "add_prefix_space": false, "trim_offsets": false, "use_regex": false })
}

fn tokenizer_json() -> Value {
    let vocab: Map<String, Value> = (0..=255u8)
        .map(|b| (byte_char(b).to_string(), json!(b)))
        .collect();
    let added: Vec<Value> = ADDED_TOKENS
        .iter()
        .map(|(id, content, special)| {
            json!({
                "id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special,
            })
        })
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": byte_level("ByteLevel"),
        "post_processor": null,
        "decoder": byte_level("ByteLevel"),
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": [],
        },
    })
}

fn tokenizer_config_json() -> Value {
    let decoder: Map<String, Value> = ADDED_TOKENS
        .iter()
        .map(|(id, content, special)| {
            let entry = json!({
                "content": content, "lstrip": false, "normalized": false, "rstrip": false,
                "single_word": false, "special": special,
            });
            (id.to_string(), entry)
        })
        .collect();
    json!({
        "add_bos_token": false,
        "add_eos_token": false,
        "added_tokens_decoder": decoder,
        "bos_token": null,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": null,
        "chat_template": CHAT_TEMPLATE.trim(),
        "clean_up_tokenization_spaces": false,
        "model_max_length": MAX_POSITION_EMBEDDINGS,
        "tokenizer_class": "PreTrainedTokenizerFast",
    })
}

fn generation_config_json() -> Value {
    json!({ "eos_token_id": EOS_TOKEN_IDS, "pad_token_id": ENDOFTEXT })
}

fn config_json() -> Value {
    json!({
        "model_type": "bytelevel",
        "vocab_size": VOCAB_SIZE,
        "eos_token_id": IM_END,
        "bos_token_id": null,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load() -> tokenizers::Tokenizer {
        let files = files();
        let (_, json) = files.iter().find(|(n, _)| *n == "tokenizer.json").unwrap();
        tokenizers::Tokenizer::from_bytes(json).unwrap()
    }

    #[test]
    fn byte_alphabet_is_a_bijection_onto_visible_chars() {
        let chars: std::collections::HashSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(chars.len(), 256);
        assert!(chars.iter().all(|c| !c.is_whitespace() && !c.is_control()));
        assert_eq!(byte_char(b' '), '\u{120}');
        assert_eq!(byte_char(b'a'), 'a');
    }

    #[test]
    fn hf_tokenizers_round_trips_multibyte_text_as_bytes() {
        let tk = load();
        let text = "héllo 世界\n\t\u{0}\u{7f}🦀";
        let enc = tk.encode(text, false).unwrap();
        assert_eq!(enc.get_ids(), encode_plain(text).as_slice());
        assert_eq!(tk.decode(enc.get_ids(), false).unwrap(), text);
        assert_eq!(tk.get_vocab_size(true), VOCAB_SIZE as usize);
    }

    #[test]
    fn added_tokens_encode_to_their_ids_and_special_ones_can_be_skipped() {
        let tk = load();
        let text = "<|im_start|>user\nhi<|im_end|><tool_call><image>";
        let ids = tk.encode(text, false).unwrap().get_ids().to_vec();
        let mut want = vec![IM_START];
        want.extend(encode_plain("user\nhi"));
        want.extend([IM_END, TOOL_CALL_START, IMAGE]);
        assert_eq!(ids, want);
        assert_eq!(tk.decode(&ids, false).unwrap(), text);
        assert_eq!(tk.decode(&ids, true).unwrap(), "user\nhi<tool_call>");
        for (id, content, _) in ADDED_TOKENS {
            assert_eq!(token_bytes(id).unwrap(), content.as_bytes());
            assert_eq!(tk.token_to_id(content), Some(id));
        }
        assert_eq!(token_bytes(VOCAB_SIZE), None);
    }

    #[test]
    fn config_files_name_the_eos_ids() {
        let files = files();
        let get = |name: &str| -> Value {
            let (_, bytes) = files.iter().find(|(n, _)| *n == name).unwrap();
            serde_json::from_slice(bytes).unwrap()
        };
        assert_eq!(
            get("generation_config.json")["eos_token_id"],
            json!([258, 256])
        );
        assert_eq!(get("config.json")["eos_token_id"], json!(258));
        let cfg = get("tokenizer_config.json");
        assert_eq!(cfg["eos_token"], "<|im_end|>");
        assert!(
            cfg["chat_template"]
                .as_str()
                .unwrap()
                .contains("<|im_start|>")
        );
    }
}
