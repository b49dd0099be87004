//! Tokenizer benchmarks, Qwen3 tokenizer (the committed fixture, or the full 11 MB
//! `tokenizer.json` when `PDROUTER_TOKENIZER_BENCH_DIR` names a directory holding it with
//! `tokenizer_config.json`; see tests/fixtures/qwen3/README.md).
//!
//! 1. `encode/fast/N`: encode an English prompt of N = 16, 1,024 and 32,768 tokens. The per-byte
//!    cost sets `OFFLOAD_THRESHOLD_BYTES`, the size above which the router encodes off the
//!    reactor. `encode/pipeline/N` is the same through the library's pipeline, the route
//!    tokenizers that the fast route does not cover take (and the baseline of that route).
//! 2. `chat_template/4_messages`: render a four-message conversation.
//! 3. `stream/1024_tokens`: detokenize 1,024 output ids one at a time through the stop matcher
//!    (two stop strings that never match, EOS ids), the router's per-token work; divide by
//!    1,024 for the cost per token. `decode_stream_only` is the detokenizer alone.

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use pdrouter_tokenizer::*;

const PROSE: &str = include_str!("../tests/fixtures/qwen3/prose.txt");

fn tokenizer() -> Arc<Tokenizer> {
    let dir = std::env::var_os("PDROUTER_TOKENIZER_BENCH_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3"),
        PathBuf::from,
    );
    Arc::new(Tokenizer::load(&dir, None).expect("load the benchmark tokenizer"))
}

/// A prompt of `n` tokens: the prose repeated, cut to `n` ids, decoded.
fn prompt(tk: &Tokenizer, n: usize) -> (String, Vec<u32>) {
    let ids = tk.encode(&PROSE.repeat(n / 60 + 1)).unwrap();
    let ids = ids[..n].to_vec();
    let text = tk.decode(&ids, DecodeOptions::default()).unwrap();
    (text, ids)
}

fn encode(c: &mut Criterion) {
    let tk = tokenizer();
    let mut group = c.benchmark_group("encode");
    for n in [16, 1024, 32_768] {
        let (text, _) = prompt(&tk, n);
        group.throughput(Throughput::Bytes(text.len() as u64));
        if n > 1024 {
            group.sample_size(20);
        }
        group.bench_with_input(BenchmarkId::new("fast", n), &text, |b, text| {
            b.iter(|| tk.encode(black_box(text)).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("pipeline", n), &text, |b, text| {
            b.iter(|| tk.encode_pipeline(black_box(text)).unwrap())
        });
    }
    group.finish();
}

fn chat_template(c: &mut Criterion) {
    let tk = tokenizer();
    let messages = serde_json::json!([
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": PROSE},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "Summarise it in one line."}
    ]);
    c.bench_function("chat_template/4_messages", |b| {
        b.iter(|| {
            let input = ChatInput {
                messages: TemplateValue::from_serialize(black_box(&messages)),
                add_generation_prompt: true,
                ..ChatInput::default()
            };
            tk.apply_chat_template(&input).unwrap()
        })
    });
}

fn stream(c: &mut Criterion) {
    let tk = tokenizer();
    let (_, ids) = prompt(&tk, 1024);
    let stops = vec!["</answer>".to_owned(), "\n\nUser:".to_owned()];
    let mut group = c.benchmark_group("stream");
    group.throughput(Throughput::Elements(ids.len() as u64));
    group.bench_function("1024_tokens", |b| {
        b.iter(|| {
            let conditions = StopConditions::new(&tk, &stops, &[], false, false).unwrap();
            let mut out = TextStream::new(tk.clone(), DecodeOptions::default(), conditions);
            let mut bytes = 0;
            for &id in &ids {
                bytes += out.push(black_box(id)).unwrap().text.len();
            }
            bytes + out.finish(FinishReason::Length).unwrap().text.len()
        })
    });
    group.bench_function("decode_stream_only", |b| {
        b.iter(|| {
            let mut out = DecodeStream::new(tk.clone(), DecodeOptions::default());
            let mut bytes = 0;
            for &id in &ids {
                bytes += out.step(black_box(id)).unwrap().map_or(0, |d| d.len());
            }
            bytes
        })
    });
    group.finish();
}

criterion_group!(benches, encode, chat_template, stream);
criterion_main!(benches);
