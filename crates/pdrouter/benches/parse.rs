//! Request body parsing, the work `cpu_pool::offload` moves off the async workers above a
//! size: a chat request with one user message of N bytes of English prose (N = 1, 8 and
//! 64 KiB), parsed as for HTTP workers (`parse`) and as for token-id workers, keeping the
//! JSON tree for the translation (`parse_keeping_tree`). The time per byte sets the size up to
//! which a body is parsed where the request runs.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use pdrouter::request::{Endpoint, parse, parse_keeping_tree};

const PROSE: &str = include_str!("../../pdrouter-tokenizer/tests/fixtures/qwen3/prose.txt");

fn body(bytes: usize) -> Bytes {
    let mut text = PROSE.repeat(bytes / PROSE.len() + 1);
    text.truncate(bytes);
    let body = serde_json::json!({
        "model": "mock-model",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 16,
        "stream": false,
    });
    Bytes::from(serde_json::to_vec(&body).unwrap())
}

fn parsing(c: &mut Criterion) {
    let mut group = c.benchmark_group("parse");
    for kib in [1usize, 8, 64] {
        let raw = body(kib << 10);
        group.throughput(Throughput::Bytes(raw.len() as u64));
        group.bench_with_input(BenchmarkId::new("http", kib), &raw, |b, raw| {
            b.iter(|| parse(Endpoint::ChatCompletions, black_box(raw.clone())).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("keeping_tree", kib), &raw, |b, raw| {
            b.iter(|| {
                parse_keeping_tree(Endpoint::ChatCompletions, black_box(raw.clone())).unwrap()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, parsing);
criterion_main!(benches);
