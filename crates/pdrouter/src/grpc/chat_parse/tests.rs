use pdrouter_tokenizer::bytelevel;
use serde_json::json;

use super::*;

fn tokenizer() -> Tokenizer {
    let dir = tempfile::tempdir().unwrap();
    for (name, data) in bytelevel::files() {
        std::fs::write(dir.path().join(name), data).unwrap();
    }
    Tokenizer::load(dir.path(), None).unwrap()
}

fn ask(body: Value) -> ChatAsk {
    let Value::Object(o) = body else { panic!() };
    ChatAsk::of(&o, o.get("tools")).unwrap()
}

const TOOLS: &str =
    r#"[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]"#;

fn qwen() -> ChatParsers {
    ChatParsers {
        tool: Some(ToolKind::Qwen),
        reasoning: Some(ReasoningKind::Qwen3),
    }
}

const OUT: &str = "<think>I should look it up.</think>Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>";

#[test]
fn whole_answers_split_reasoning_and_calls() {
    let t = tokenizer();
    let tools: Value = serde_json::from_str(TOOLS).unwrap();
    let p = ChatParsing::new(ask(json!({"tools": tools})), qwen(), "m", "", &t).unwrap();
    let out = p.parse_whole(OUT);
    assert_eq!(out.reasoning, "I should look it up.");
    assert_eq!(out.content, "Checking.");
    assert_eq!(out.calls.len(), 1);
    let (id, call) = &out.calls[0];
    assert!(id.starts_with("call_") && id.len() == 29, "{id}");
    assert_eq!(call.name, "get_weather");
    assert_eq!(call.arguments, r#"{"city":"Paris","unit":"c"}"#);
}

#[test]
fn streamed_pieces_join_to_the_whole_parse() {
    let t = tokenizer();
    let tools: Value = serde_json::from_str(TOOLS).unwrap();
    let p = ChatParsing::new(ask(json!({"tools": tools})), qwen(), "m", "", &t).unwrap();
    for step in [1, 3, 7, 40] {
        let mut c = p.choice();
        let chars: Vec<char> = OUT.chars().collect();
        let mut deltas = Vec::new();
        let pieces: Vec<String> = chars.chunks(step).map(|c| c.iter().collect()).collect();
        for (i, piece) in pieces.iter().enumerate() {
            deltas.extend(c.push(&p, piece, i + 1 == pieces.len()));
        }
        let (mut reasoning, mut content, mut args, mut names) =
            (String::new(), String::new(), String::new(), Vec::new());
        for d in deltas {
            match d {
                ChatDelta::Reasoning(s) => reasoning.push_str(&s),
                ChatDelta::Content(s) => content.push_str(&s),
                ChatDelta::Call { name, index, .. } => names.push((index, name)),
                ChatDelta::Args { fragment, .. } => args.push_str(&fragment),
            }
        }
        assert_eq!(reasoning, "I should look it up.", "step {step}");
        assert_eq!(content, "Checking.", "step {step}");
        assert_eq!(names, vec![(0, "get_weather".to_owned())]);
        assert_eq!(args, r#"{"city":"Paris","unit":"c"}"#);
        assert!(c.called());
        assert_eq!(c.reasoning(), "I should look it up.");
    }
}

#[test]
fn what_the_request_asks_decides_which_parsers_run() {
    let t = tokenizer();
    let tools: Value = serde_json::from_str(TOOLS).unwrap();
    // No tools: only reasoning; the markup stays text.
    let p = ChatParsing::new(ask(json!({})), qwen(), "m", "", &t).unwrap();
    let out = p.parse_whole(OUT);
    assert!(out.calls.is_empty() && out.content.contains("<tool_call>"));
    // tool_choice none: the same.
    let none = ask(json!({"tools": tools, "tool_choice": "none"}));
    assert!(
        ChatParsing::new(none, qwen(), "m", "", &t)
            .unwrap()
            .parse_whole(OUT)
            .calls
            .is_empty()
    );
    // separate_reasoning false and no tools: nothing to parse.
    let plain = ask(json!({"separate_reasoning": false}));
    assert!(ChatParsing::new(plain, qwen(), "m", "", &t).is_none());
    // A function not offered: text.
    let other = json!([{"type":"function","function":{"name":"other"}}]);
    let p = ChatParsing::new(ask(json!({"tools": other})), qwen(), "m", "", &t).unwrap();
    assert!(p.parse_whole(OUT).calls.is_empty());
    // Nothing configured: the model's name picks.
    let auto = ChatParsing::new(
        ask(json!({"tools": tools})),
        ChatParsers::default(),
        "Qwen3-8B",
        "",
        &t,
    );
    assert_eq!(auto.unwrap().parse_whole(OUT).calls.len(), 1);
    assert!(
        ChatParsing::new(
            ask(json!({"tools": tools})),
            ChatParsers::default(),
            "mock-model",
            "",
            &t
        )
        .is_none()
    );
    // A prompt that opened the reasoning starts inside it.
    let p = ChatParsing::new(
        ask(json!({})),
        qwen(),
        "m",
        "<|im_start|>assistant\n<think>\n",
        &t,
    );
    assert_eq!(
        p.unwrap().parse_whole("thought</think>said").reasoning,
        "thought"
    );
}

#[test]
fn bad_asks_are_refused_naming_the_field() {
    let Value::Object(o) = json!({"separate_reasoning": "yes"}) else {
        panic!()
    };
    assert!(format!("{:?}", ChatAsk::of(&o, None).unwrap_err()).contains("separate_reasoning"));
}
