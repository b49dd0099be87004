//! Shared helpers: tokenizers loaded from files on disk, as the router loads them.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use pdrouter_tokenizer::{Tokenizer, bytelevel};

/// The byte-level tokenizer written to a fresh directory, loaded back (once per test binary).
pub fn bytelevel() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    let load = || {
        let dir = tempfile::tempdir().unwrap();
        write_files(dir.path(), bytelevel::files());
        Arc::new(Tokenizer::load(dir.path(), None).unwrap())
    };
    TOKENIZER.get_or_init(load).clone()
}

pub fn write_files(dir: &Path, files: Vec<(&'static str, Vec<u8>)>) {
    for (name, data) in files {
        std::fs::write(dir.join(name), data).unwrap();
    }
}

/// The committed Qwen3 fixture directory.
pub fn qwen3_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3")
}

/// The Qwen3 fixture, loaded once per test binary.
pub fn qwen3() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| Arc::new(Tokenizer::load(&qwen3_dir(), None).unwrap()))
        .clone()
}

/// Chat requests the Qwen3 tests render: `(name, input)`.
pub fn conversations() -> Vec<(&'static str, pdrouter_tokenizer::ChatInput)> {
    use pdrouter_tokenizer::{ChatInput, TemplateValue};
    use serde_json::json;

    // Typed, so that keys keep the order a client sends them in.
    #[derive(serde::Serialize)]
    struct Tool {
        r#type: &'static str,
        function: Function,
    }
    #[derive(serde::Serialize)]
    struct Function {
        name: &'static str,
        description: &'static str,
        parameters: Parameters,
    }
    #[derive(serde::Serialize)]
    struct Parameters {
        r#type: &'static str,
        properties: serde_json::Value,
        required: [&'static str; 1],
    }
    let tools = [Tool {
        r#type: "function",
        function: Function {
            name: "get_weather",
            description: "Current weather in a city",
            parameters: Parameters {
                r#type: "object",
                properties: json!({"city": {"type": "string"}}),
                required: ["city"],
            },
        },
    }];

    let chat = json!([
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."}
    ]);
    let tool_turns = json!([
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}
        }]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21}"}
    ]);
    vec![
        (
            "chat",
            ChatInput {
                messages: TemplateValue::from_serialize(&chat),
                add_generation_prompt: true,
                ..ChatInput::default()
            },
        ),
        (
            "tools",
            ChatInput {
                messages: TemplateValue::from_serialize(&tool_turns),
                tools: Some(TemplateValue::from_serialize(&tools)),
                add_generation_prompt: true,
                ..ChatInput::default()
            },
        ),
        (
            "no_thinking",
            ChatInput {
                messages: TemplateValue::from_serialize(
                    &json!([{"role": "user", "content": "2+2?"}]),
                ),
                add_generation_prompt: true,
                kwargs: vec![(
                    "enable_thinking".into(),
                    TemplateValue::from_serialize(&false),
                )],
                ..ChatInput::default()
            },
        ),
    ]
}

/// English prose the fixture encodes exactly (see the fixture's README); benches use it too.
pub const PROSE: &str = include_str!("../fixtures/qwen3/prose.txt");

pub const CODE: &str = "fn main() {\n    let total: u64 = (1..=10).map(|x| x * x).sum();\n    println!(\"sum of squares = {total}\");\n}\n";
