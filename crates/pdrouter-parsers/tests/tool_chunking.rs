//! Chunking invariance under random cuts: each fixture gives its expected result, fixtures
//! run together and cut off anywhere give the whole-output parse, and so does any soup of
//! markup pieces.

mod common;

use common::fixtures::ALL;
use common::{Fixture, cut_at, expected, stream, tools};
use pdrouter_parsers::*;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any chunking of any fixture gives the fixture's result.
    #[test]
    fn random_chunking(which in 0usize..1000, cuts in proptest::collection::vec(0usize..4096, 0..12)) {
        let all: Vec<(ToolKind, Fixture)> = ALL
            .iter()
            .flat_map(|(k, fs)| fs.iter().map(move |f| (*k, *f)))
            .collect();
        let (kind, f) = all[which % all.len()];
        let pieces = cut_at(f.text, &cuts);
        let got = stream(kind, &tools(), pieces.iter().map(String::as_str));
        prop_assert_eq!(got, expected(&f), "{} {:?} {:?}", kind, f.name, pieces);
    }
}

/// Pieces of every format's markup, and of what goes inside it, to build arbitrary outputs.
const ALPHABET: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "<function=",
    "<parameter=",
    "</parameter>",
    "</function>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<minimax:tool_call>",
    "</minimax:tool_call>",
    "<invoke name=\"",
    "</invoke>",
    "<parameter name=\"",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool_calls_begin｜>",
    "<｜tool_call_begin｜>",
    "<｜tool_sep｜>",
    "<｜tool_call_end｜>",
    "<｜tool_calls_end｜>",
    "<steptml:invoke name=\"",
    "</steptml:invoke>",
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|tool_calls_section_end|>",
    "functions.",
    ":0",
    "<|python_tag|>",
    "<|python_start|>",
    "<|python_end|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
    "<|constrain|>",
    "assistant",
    "analysis",
    "commentary",
    "final",
    " to=functions.get_time",
    "json",
    "function",
    "get_time",
    "get_weather",
    "city",
    "\"name\"",
    "\"arguments\"",
    "\"get_time\"",
    "\"get_weather\"",
    "\"city\"",
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    ":",
    ",",
    ";",
    "=",
    "\"",
    "'",
    "\\",
    ">",
    "<",
    "|",
    "```json",
    "```",
    "\n",
    " ",
    "x",
    "é",
    "1",
    "true",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Whatever the output, any chunking gives the whole-output parse: the invariant does not
    /// depend on the output being well formed.
    #[test]
    fn any_output_any_chunking(
        kind in 0usize..ToolKind::ALL.len(),
        tokens in proptest::collection::vec(0usize..ALPHABET.len(), 0..48),
        cuts in proptest::collection::vec(0usize..4096, 0..16),
    ) {
        let kind = ToolKind::ALL[kind];
        let text: String = tokens.iter().map(|&t| ALPHABET[t]).collect();
        let tools = tools();
        let whole = parse_all(kind, &text, &tools);
        let pieces = cut_at(&text, &cuts);
        let streamed = stream(kind, &tools, pieces.iter().map(String::as_str));
        prop_assert_eq!(&streamed, &whole, "{} {:?}", kind, pieces);
        let by_char = stream(kind, &tools, common::chars(&text));
        prop_assert_eq!(&by_char, &whole, "{} char by char {:?}", kind, text);
        for c in &whole.calls {
            prop_assert!(serde_json::from_str::<serde_json::Value>(&c.arguments).unwrap().is_object());
            prop_assert!(tools.contains(&c.name));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Fixtures of one format run together, then cut off anywhere: any chunking still gives
    /// the whole-output parse, and every call is to a known function.
    #[test]
    fn fixtures_joined_and_truncated(
        kind in 0usize..ALL.len(),
        picks in proptest::collection::vec(0usize..64, 1..5),
        keep in 0usize..4096,
        cuts in proptest::collection::vec(0usize..4096, 0..16),
    ) {
        let (kind, fixtures) = ALL[kind];
        let mut text: String = picks.iter().map(|&p| fixtures[p % fixtures.len()].text).collect();
        let mut end = keep % (text.len() + 1);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        let tools = tools();
        let whole = parse_all(kind, &text, &tools);
        let pieces = cut_at(&text, &cuts);
        let streamed = stream(kind, &tools, pieces.iter().map(String::as_str));
        prop_assert_eq!(&streamed, &whole, "{} {:?}", kind, pieces);
        prop_assert!(whole.calls.iter().all(|c| tools.contains(&c.name)));
    }
}

/// A call with a very long argument, streamed a few chars at a time, costs linear time: the
/// held-back block is searched incrementally (a rescan per piece takes seconds to minutes
/// here; the linear parsers take well under a second even unoptimized).
#[test]
fn long_calls_stream_in_linear_time() {
    let long = "x".repeat(200_000);
    let args = format!("{{\"query\": \"{long}\"}}");
    let outputs = [
        (
            ToolKind::Qwen,
            format!("<tool_call>{{\"name\": \"search\", \"arguments\": {args}}}</tool_call>"),
        ),
        (
            ToolKind::DeepSeek31,
            format!(
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{args}<｜tool▁call▁end｜>"
            ),
        ),
        (ToolKind::Mistral, format!("[TOOL_CALLS]search[ARGS]{args}")),
        (
            ToolKind::Json,
            format!("{{\"name\": \"search\", \"arguments\": {args}}}"),
        ),
        (
            ToolKind::Llama,
            format!("<|python_tag|>{{\"name\": \"search\", \"parameters\": {args}}}"),
        ),
        (ToolKind::Pythonic, format!("[search(query=\"{long}\")]")),
        (
            ToolKind::QwenXml,
            format!(
                "<tool_call>\n<function=search>\n<parameter=query>\n{long}\n</parameter>\n</function>\n</tool_call>"
            ),
        ),
        (
            ToolKind::Harmony,
            format!(
                "<|channel|>commentary to=functions.search <|constrain|>json<|message|>{args}<|call|>"
            ),
        ),
    ];
    let tools = tools();
    for (kind, text) in outputs {
        let start = std::time::Instant::now();
        let pieces: Vec<&str> = text
            .as_bytes()
            .chunks(4)
            .map(|c| std::str::from_utf8(c).unwrap_or(""))
            .collect();
        let joined: String = pieces.concat();
        let got = if joined == text {
            stream(kind, &tools, pieces)
        } else {
            stream(kind, &tools, common::chars(&text))
        };
        assert_eq!(got.calls.len(), 1, "{kind}");
        assert!(got.calls[0].arguments.len() > 200_000, "{kind}");
        assert!(
            start.elapsed().as_secs() < 5,
            "{kind}: {:?}",
            start.elapsed()
        );
    }
    let start = std::time::Instant::now();
    let mut p = ReasoningKind::Harmony.new_parser(false);
    let header = format!("<|channel|>{long}");
    for piece in header.as_bytes().chunks(4) {
        p.push(std::str::from_utf8(piece).unwrap());
    }
    assert_eq!(p.finish().content.len(), header.len());
    assert!(
        start.elapsed().as_secs() < 5,
        "harmony header: {:?}",
        start.elapsed()
    );
}
