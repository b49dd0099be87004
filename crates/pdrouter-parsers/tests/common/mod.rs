//! Shared checks: a fixture parsed whole, then streamed cut at every char boundary into two
//! pieces and one char at a time, must give the expected result every time.

#![allow(dead_code, unreachable_pub)]

pub mod fixtures;

use pdrouter_parsers::*;
use serde_json::json;

/// The functions the fixtures call, with schemas for the formats that type plain values.
pub fn tools() -> ToolSet {
    ToolSet::from_openai_tools(&json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "unit": {"type": "string"}
            }
        }}},
        {"type": "function", "function": {"name": "search", "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer"},
                "filters": {"type": "object"},
                "exact": {"type": "boolean"}
            }
        }}},
        {"type": "function", "function": {"name": "get_time"}}
    ]))
}

/// A whole model output and what it must parse to.
#[derive(Debug, Clone, Copy)]
pub struct Fixture {
    pub name: &'static str,
    pub text: &'static str,
    pub content: &'static str,
    pub calls: &'static [(&'static str, &'static str)],
}

/// Streams `pieces` through a fresh parser, checking the delta protocol on the way.
pub fn stream<'a>(
    kind: ToolKind,
    tools: &ToolSet,
    pieces: impl IntoIterator<Item = &'a str>,
) -> ToolParse {
    let mut parser = kind.new_parser(tools);
    let mut deltas = Vec::new();
    for p in pieces {
        deltas.extend(parser.push(p));
    }
    deltas.extend(parser.finish());
    check_protocol(&deltas);
    ToolParse::from_deltas(deltas)
}

/// Calls are announced in order, each before its arguments.
fn check_protocol(deltas: &[ToolDelta]) {
    let mut announced = 0;
    for d in deltas {
        match d {
            ToolDelta::Call { index, .. } => {
                assert_eq!(*index, announced, "call indices count up");
                announced += 1;
            }
            ToolDelta::Args { index, .. } => assert!(*index < announced, "args after their call"),
            ToolDelta::Text(t) => assert!(!t.is_empty(), "no empty text deltas"),
        }
    }
}

/// Every char boundary of `s`.
pub fn boundaries(s: &str) -> Vec<usize> {
    (0..=s.len()).filter(|&i| s.is_char_boundary(i)).collect()
}

/// One char at a time.
pub fn chars(s: &str) -> Vec<&str> {
    s.char_indices()
        .map(|(i, c)| &s[i..i + c.len_utf8()])
        .collect()
}

pub fn expected(f: &Fixture) -> ToolParse {
    ToolParse {
        text: f.content.to_string(),
        calls: f
            .calls
            .iter()
            .map(|(name, arguments)| ToolCall {
                name: name.to_string(),
                arguments: arguments.to_string(),
            })
            .collect(),
    }
}

/// The fixture whole, in two pieces at every cut, and char by char.
pub fn check_tool(kind: ToolKind, fixtures: &[Fixture]) {
    let tools = tools();
    for f in fixtures {
        let want = expected(f);
        let whole = parse_all(kind, f.text, &tools);
        assert_eq!(whole, want, "{kind} fixture {:?}: whole output", f.name);
        for cut in boundaries(f.text) {
            let got = stream(kind, &tools, [&f.text[..cut], &f.text[cut..]]);
            assert_eq!(got, want, "{kind} fixture {:?}: cut at byte {cut}", f.name);
        }
        let got = stream(kind, &tools, chars(f.text));
        assert_eq!(got, want, "{kind} fixture {:?}: char by char", f.name);
        for c in &want.calls {
            let v: serde_json::Value = serde_json::from_str(&c.arguments).unwrap();
            assert!(
                v.is_object(),
                "{kind} {:?}: arguments are an object",
                f.name
            );
        }
    }
}

/// Cuts `text` into pieces at the given fractions of its length (rounded to char boundaries).
pub fn cut_at(text: &str, cuts: &[usize]) -> Vec<String> {
    let mut points: Vec<usize> = cuts
        .iter()
        .map(|&c| {
            let mut i = c % (text.len() + 1);
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            i
        })
        .collect();
    points.push(0);
    points.push(text.len());
    points.sort_unstable();
    points.dedup();
    points
        .windows(2)
        .map(|w| text[w[0]..w[1]].to_string())
        .collect()
}
