//! rank + commit cost per policy at 8, 64 and 512 workers, and cache_aware with 10,000
//! realistic (~200-char, prefix-sharing) prompts already cached.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use pdrouter_policy::{CacheAwareConfig, Policy, PolicyKind, RequestInfo, WorkerRef};

struct Worker {
    url: String,
    load: u64,
}

impl WorkerRef for Worker {
    fn url(&self) -> &str {
        &self.url
    }
    fn load(&self) -> u64 {
        self.load
    }
}

/// Deterministic xorshift so every run benches the same data.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const WORDS: [&str; 24] = [
    "the",
    "model",
    "answer",
    "question",
    "context",
    "please",
    "summarize",
    "following",
    "document",
    "assistant",
    "user",
    "system",
    "carefully",
    "explain",
    "code",
    "function",
    "error",
    "request",
    "router",
    "cache",
    "prefix",
    "token",
    "value",
    "result",
];

fn sentence(rng: &mut Lcg, chars: usize) -> String {
    let mut s = String::new();
    while s.len() < chars {
        s.push_str(WORDS[rng.below(WORDS.len())]);
        s.push(' ');
    }
    s
}

/// ~200-char prompts: one of 40 shared ~120-char system prompts + a ~80-char user turn.
fn prompts(count: usize) -> Vec<String> {
    let mut rng = Lcg(0x9e37_79b9_7f4a_7c15);
    let systems: Vec<String> = (0..40).map(|_| sentence(&mut rng, 120)).collect();
    (0..count)
        .map(|_| {
            let sys = &systems[rng.below(systems.len())];
            format!("{sys}\nUser: {}", sentence(&mut rng, 80))
        })
        .collect()
}

fn workers(n: usize) -> Vec<Worker> {
    let mut rng = Lcg(42);
    (0..n)
        .map(|i| Worker {
            url: format!("http://10.0.{}.{}:8000", i / 256, i % 256),
            // Balanced loads: cache_aware stays on its cache path.
            load: rng.below(8) as u64,
        })
        .collect()
}

fn rank_commit(policy: &Policy, workers: &[Worker], prompts: &[String]) -> impl FnMut() -> usize {
    let mut out = Vec::with_capacity(workers.len());
    let mut i = 0;
    move || {
        let req = RequestInfo {
            text: Some(&prompts[i % prompts.len()]),
            routing_key: None,
        };
        i += 1;
        policy.rank(workers, &req, &mut out);
        policy.commit(workers, out[0], &req);
        out[0]
    }
}

fn bench_policies(c: &mut Criterion) {
    let prompts = prompts(2_000);
    let mut group = c.benchmark_group("rank_commit");
    for n in [8, 64, 512] {
        let ws = workers(n);
        for kind in PolicyKind::ALL {
            let policy = Policy::new(kind, CacheAwareConfig::default());
            group.bench_function(BenchmarkId::new(kind.name(), n), |b| {
                let mut f = rank_commit(&policy, &ws, &prompts);
                b.iter(|| black_box(f()));
            });
        }
    }
    group.finish();
}

fn bench_cache_aware_warm(c: &mut Criterion) {
    // 10,000 prompts cached up front; the bench then cycles over 20,000 (half new, half cached).
    let prompts = prompts(20_000);
    let mut group = c.benchmark_group("cache_aware_10k_cached");
    for n in [8, 64, 512] {
        let ws = workers(n);
        let policy = Policy::new(PolicyKind::CacheAware, CacheAwareConfig::default());
        let mut warm = rank_commit(&policy, &ws, &prompts[..10_000]);
        for _ in 0..10_000 {
            warm();
        }
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            let mut f = rank_commit(&policy, &ws, &prompts);
            b.iter(|| black_box(f()));
        });
    }
    group.finish();
}

criterion_group!(benches, bench_policies, bench_cache_aware_warm);
criterion_main!(benches);
