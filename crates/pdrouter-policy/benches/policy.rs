//! rank + commit cost per policy at 8, 64 and 512 workers; cache_aware with 10,000 realistic
//! (~200-char, prefix-sharing) prompts already cached; and cache_aware shared by 1, 2 and 8
//! threads, over a fixed candidate set and over one that changes on every call (one worker
//! filtered out in turn, as admission does with full workers). The threaded figures are wall
//! time divided by the operations of all threads together, so a policy that scales keeps them
//! flat (or lower, up to the number of cores) as threads are added.

use std::hint::black_box;
use std::time::Duration;
/// Prompts of two random numbered words ("w123 w45678"), as `pdrouter-bench` sends.
fn numbered(rng: &mut Lcg, count: usize) -> Vec<String> {
    (0..count)
        .map(|_| format!("w{} w{}", rng.below(100_000), rng.below(100_000)))
        .collect()
}

fn bench_cache_aware_big_trees(c: &mut Criterion) {
    // Two candidates (a PD pair's Prefill workers) whose trees already hold 400,000 short
    // prompts that branch at every digit: far beyond the CPU caches, so a rank's walks are
    // bound by cache misses, as in a router that has served traffic for a while. The benched
    // prompts (100,000, cycled) are new to the trees the first time round.
    let mut rng = Lcg(7);
    let ws = workers(2);
    let policy = Policy::new(PolicyKind::CacheAware, CacheAwareConfig::default());
    let fill = numbered(&mut rng, 400_000);
    let mut warm = rank_commit(&policy, &ws, &fill);
    for _ in 0..fill.len() {
        warm();
    }
    let fresh = numbered(&mut rng, 100_000);
    c.bench_function("cache_aware_big_trees/2", |b| {
        let mut f = rank_commit(&policy, &ws, &fresh);
        b.iter(|| black_box(f()));
    });
}

#[expect(
    clippy::disallowed_types,
    reason = "wall time of real threads; this crate has no runtime clock"
)]
use std::time::Instant;

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
            ..Default::default()
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

#[expect(
    clippy::disallowed_types,
    reason = "wall time of real threads; this crate has no runtime clock"
)]
fn bench_cache_aware_threads(c: &mut Criterion) {
    const WORKERS: usize = 64;
    let prompts = prompts(4_000);
    let all = workers(WORKERS);
    // Candidate sets missing one worker each: a different set on every call.
    let partial: Vec<Vec<Worker>> = (0..WORKERS)
        .map(|skip| {
            all.iter()
                .enumerate()
                .filter(|&(i, _)| i != skip)
                .map(|(_, w)| Worker {
                    url: w.url.clone(),
                    load: w.load,
                })
                .collect()
        })
        .collect();
    let mut group = c.benchmark_group("cache_aware_threads");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for varying in [false, true] {
        for threads in [1usize, 2, 8] {
            let policy = Policy::new(PolicyKind::CacheAware, CacheAwareConfig::default());
            let mut warm = rank_commit(&policy, &all, &prompts[..2_000]);
            for _ in 0..2_000 {
                warm();
            }
            let name = if varying { "varying_set" } else { "fixed_set" };
            group.bench_function(BenchmarkId::new(name, threads), |b| {
                b.iter_custom(|iters| {
                    let per_thread = iters.div_ceil(threads as u64) as usize;
                    let start = Instant::now();
                    std::thread::scope(|s| {
                        for t in 0..threads {
                            let (policy, prompts, all, partial) =
                                (&policy, &prompts, &all, &partial);
                            s.spawn(move || {
                                let mut out = Vec::with_capacity(WORKERS);
                                for i in 0..per_thread {
                                    let n = t * 7919 + i;
                                    let ws = if varying { &partial[n % WORKERS] } else { all };
                                    let req = RequestInfo {
                                        text: Some(&prompts[n % prompts.len()]),
                                        routing_key: None,
                                        ..Default::default()
                                    };
                                    policy.rank(ws, &req, &mut out);
                                    policy.commit(ws, out[0], &req);
                                    black_box(out[0]);
                                }
                            });
                        }
                    });
                    start.elapsed()
                })
            });
        }
    }
    group.finish();
}

criterion_group!(
    benches,
    bench_policies,
    bench_cache_aware_warm,
    bench_cache_aware_big_trees,
    bench_cache_aware_threads
);
criterion_main!(benches);
