//! Parser benchmarks: the router's per-token cost of reading model markup.
//!
//! Each output is about 1,000 tokens of prose followed by two tool calls (or, for reasoning,
//! a 500-token reasoning block then a 500-token answer), fed as 4-char pieces, about one
//! token each.
//!
//! 1. `stream/<format>`: a fresh parser, every piece pushed, then `finish`; throughput is in
//!    pieces, so the time per element is the cost per token. Tool formats `qwen`, `deepseek`
//!    and `harmony`, and the `qwen3` reasoning parser.
//! 2. `parse_all/<format>`: the same outputs parsed whole.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use pdrouter_parsers::*;

const SENTENCE: &str =
    "The quick brown fox jumps over the lazy dog while the router streams text. ";

/// About `tokens` tokens of prose (four chars a token).
fn prose(tokens: usize) -> String {
    SENTENCE.repeat(tokens * 4 / SENTENCE.len() + 1)[..tokens * 4].to_string()
}

fn pieces(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let mut end = (start + 4).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        out.push(&text[start..end]);
        start = end;
    }
    out
}

fn tool_outputs() -> Vec<(ToolKind, String)> {
    let text = prose(1000);
    let args = r#"{"city": "San Francisco", "days": 3, "unit": "celsius"}"#;
    let qwen = format!(
        "{text}\n<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {args}}}\n</tool_call>\n\
         <tool_call>\n{{\"name\": \"get_time\", \"arguments\": {{}}}}\n</tool_call>"
    );
    let deepseek = format!(
        "{text}<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n\
         ```json\n{args}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n\
         ```json\n{{}}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    );
    let harmony = format!(
        "<|channel|>final<|message|>{text}<|end|><|start|>assistant<|channel|>commentary \
         to=functions.get_weather <|constrain|>json<|message|>{args}<|call|><|start|>assistant\
         <|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{{}}<|call|>"
    );
    vec![
        (ToolKind::Qwen, qwen),
        (ToolKind::DeepSeek, deepseek),
        (ToolKind::Harmony, harmony),
    ]
}

fn tools(c: &mut Criterion) {
    let tools = ToolSet::new(["get_weather", "get_time"]);
    let outputs = tool_outputs();
    let mut group = c.benchmark_group("stream");
    for (kind, text) in &outputs {
        let pieces = pieces(text);
        assert_eq!(parse_all(*kind, text, &tools).calls.len(), 2);
        group.throughput(Throughput::Elements(pieces.len() as u64));
        group.bench_function(kind.name(), |b| {
            b.iter(|| {
                let mut p = kind.new_parser(&tools);
                for piece in &pieces {
                    black_box(p.push(piece));
                }
                black_box(p.finish())
            })
        });
    }
    let text = format!("<think>{}</think>{}", prose(500), prose(500));
    let pieces = pieces(&text);
    group.throughput(Throughput::Elements(pieces.len() as u64));
    group.bench_function("qwen3_reasoning", |b| {
        b.iter(|| {
            let mut p = ReasoningKind::Qwen3.new_parser(false);
            for piece in &pieces {
                black_box(p.push(piece));
            }
            black_box(p.finish())
        })
    });
    group.finish();

    let mut group = c.benchmark_group("parse_all");
    for (kind, text) in &outputs {
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_function(kind.name(), |b| {
            b.iter(|| black_box(parse_all(*kind, black_box(text), &tools)))
        });
    }
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.bench_function("qwen3_reasoning", |b| {
        b.iter(|| black_box(split_all(ReasoningKind::Qwen3, false, black_box(&text))))
    });
    group.finish();
}

criterion_group!(benches, tools);
criterion_main!(benches);
