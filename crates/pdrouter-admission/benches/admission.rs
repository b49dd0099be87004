//! Admission controller benchmarks.
//!
//! 1. `fast_path/acquire_release`: acquire + release with an empty queue, one task (no runtime:
//!    the fast path completes on its first poll). `fast_path/acquire_release_shared`: the same
//!    with the limits a replica sharing them through a store has: the controller built with
//!    limit 0 and every slot's limit set through `Admission::set_limits`, as the sharer does.
//!    The two must cost the same.
//! 2. `contended_64_tasks/*`: 64 tasks doing acquire + release on a multi-thread runtime, with
//!    ample slots (never waits) and with scarce slots (16 slots, permits held across a yield, so
//!    requests queue and releases hand off).
//! 3. `release_handoff/L`: cost of one release that hands the slot to the head of a queue of
//!    `L` waiters (L = 100 vs 10,000): it must not grow with L.
//!    `release_past_strict_waiters/L`: the worst case for the no-head-of-line rule: `L` older
//!    waiters pinned to another full worker sit in front; they form one wait class, which the
//!    release skips with one bit test, without calling their selectors.
//! 4. `notify/L`: one registry notification with `L` waiters (L = 100 vs 10,000; nine in ten
//!    may use any worker, the rest are strict on one of the four), every worker full, so nobody
//!    can be admitted: the cost of re-evaluating the queue. It must not grow with L.

use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use pdrouter_admission::{
    Admission, AdmissionConfig, Admitted, Observer, Permit, Ranking, Rejected, Selector, Slot,
};
use tokio::time::Instant;

struct Noop;
impl Observer for Noop {}

#[derive(Clone)]
struct BenchSel {
    slots: Arc<Vec<Arc<Slot>>>,
    strict: Option<usize>,
}

impl Selector for BenchSel {
    type Choice = usize;
    fn rank(&mut self, has_room: &dyn Fn(&Slot) -> bool) -> Ranking<usize> {
        let pick = |i: usize| {
            let s = &self.slots[i];
            has_room(s).then(|| (Arc::clone(s), i))
        };
        Ranking::Candidates(match self.strict {
            Some(i) => pick(i).into_iter().collect(),
            None => (0..self.slots.len()).filter_map(pick).collect(),
        })
    }
    fn commit(&mut self, choice: &usize) {
        black_box(choice);
    }
    fn wait_class(&self) -> Option<Box<str>> {
        Some(format!("{:?}", self.strict).into())
    }
}

fn setup(n: u32, q: usize, workers: usize) -> (Admission, Arc<Vec<Arc<Slot>>>) {
    let adm = Admission::new(
        AdmissionConfig {
            max_inflight_per_worker: n,
            max_inflight_tokens_per_worker: None,
            queue_size: q,
            queue_timeout: Duration::from_secs(3600),
            priorities: None,
        },
        Arc::new(Noop),
    );
    let slots = Arc::new(
        (0..workers)
            .map(|i| adm.slot(&format!("http://w{i}")))
            .collect(),
    );
    (adm, slots)
}

type Acquire = Pin<Box<dyn Future<Output = Result<Admitted<usize>, Rejected>>>>;

fn acquire(adm: &Admission, sel: BenchSel) -> Acquire {
    let adm = adm.clone();
    Box::pin(async move { adm.acquire(sel).await })
}

fn poll_once(fut: &mut Acquire) -> Option<Result<Admitted<usize>, Rejected>> {
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(r) => Some(r),
        Poll::Pending => None,
    }
}

fn fast_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("fast_path");
    let fixed = setup(64, 100, 4);
    let shared = setup(0, 100, 4);
    for slot in shared.1.iter() {
        shared.0.set_limits(slot, 64, None);
    }
    for (name, (adm, slots)) in [
        ("acquire_release", fixed),
        ("acquire_release_shared", shared),
    ] {
        let sel = BenchSel {
            slots,
            strict: None,
        };
        group.bench_function(name, |b| {
            b.iter(|| {
                let fut = adm.acquire(sel.clone());
                let mut fut = std::pin::pin!(fut);
                let Poll::Ready(Ok(a)) = fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))
                else {
                    panic!("fast path must be ready")
                };
                drop(black_box(a));
            })
        });
    }
    group.finish();
}

fn contended(c: &mut Criterion) {
    const TASKS: u64 = 64;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("contended_64_tasks");
    for (name, n, hold_across_yield) in [
        ("ample_slots", 1024, false),
        ("scarce_slots_queueing", 4, true),
    ] {
        let (adm, slots) = setup(n, 10_000, 4);
        let sel = BenchSel {
            slots,
            strict: None,
        };
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let per_task = iters.div_ceil(TASKS);
                rt.block_on(async {
                    let start = Instant::now();
                    let tasks: Vec<_> = (0..TASKS)
                        .map(|_| {
                            let adm = adm.clone();
                            let sel = sel.clone();
                            tokio::spawn(async move {
                                for _ in 0..per_task {
                                    let a = adm.acquire(sel.clone()).await.unwrap();
                                    if hold_across_yield {
                                        tokio::task::yield_now().await;
                                    }
                                    drop(black_box(a));
                                }
                            })
                        })
                        .collect();
                    for t in tasks {
                        t.await.unwrap();
                    }
                    // Wall time for all `per_task * TASKS` (about `iters`) operations, so the
                    // reported figure is the throughput cost of one acquire+release.
                    start.elapsed()
                })
            })
        });
    }
    group.finish();
}

/// Builds a queue: `pinned` waiters strict on worker 0 (held forever), then `queue_len` waiters
/// for worker 1, whose single slot is held by the returned permit.
fn queued(
    adm: &Admission,
    slots: &Arc<Vec<Arc<Slot>>>,
    pinned: usize,
    queue_len: usize,
) -> (
    Permit,
    Permit,
    std::collections::VecDeque<Acquire>,
    Vec<Acquire>,
) {
    let strict = |i| BenchSel {
        slots: Arc::clone(slots),
        strict: Some(i),
    };
    let x = poll_once(&mut acquire(adm, strict(0)))
        .unwrap()
        .unwrap()
        .permit;
    let y = poll_once(&mut acquire(adm, strict(1)))
        .unwrap()
        .unwrap()
        .permit;
    let mut pinned_futs = Vec::new();
    for _ in 0..pinned {
        let mut f = acquire(adm, strict(0));
        assert!(poll_once(&mut f).is_none());
        pinned_futs.push(f);
    }
    let mut waiters = std::collections::VecDeque::new();
    for _ in 0..queue_len {
        let mut f = acquire(adm, strict(1));
        assert!(poll_once(&mut f).is_none());
        waiters.push_back(f);
    }
    (x, y, waiters, pinned_futs)
}

fn release_handoff(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _enter = rt.enter();
    for (group, pinned_per_len) in [
        ("release_handoff", false),
        ("release_past_strict_waiters", true),
    ] {
        let mut g = c.benchmark_group(group);
        for len in [100usize, 10_000] {
            g.bench_function(len.to_string(), |b| {
                b.iter_custom(|iters| {
                    let (adm, slots) = setup(1, 2 * len + 2, 2);
                    let (pinned, queue_len) = if pinned_per_len { (len, 1) } else { (0, len) };
                    let (x, mut permit, mut waiters, pinned_futs) =
                        queued(&adm, &slots, pinned, queue_len);
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let start = Instant::now();
                        drop(permit);
                        total += start.elapsed();
                        let mut head = waiters.pop_front().unwrap();
                        permit = poll_once(&mut head).unwrap().unwrap().permit;
                        let mut f = acquire(
                            &adm,
                            BenchSel {
                                slots: Arc::clone(&slots),
                                strict: Some(1),
                            },
                        );
                        assert!(poll_once(&mut f).is_none());
                        waiters.push_back(f);
                    }
                    drop((pinned_futs, waiters, permit, x));
                    total
                })
            });
        }
        g.finish();
    }
}

fn notify(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _enter = rt.enter();
    let mut g = c.benchmark_group("notify");
    for len in [100usize, 10_000] {
        let (adm, slots) = setup(1, len, 4);
        let sel = |strict| BenchSel {
            slots: Arc::clone(&slots),
            strict,
        };
        let held: Vec<Permit> = (0..4)
            .map(|i| {
                poll_once(&mut acquire(&adm, sel(Some(i))))
                    .unwrap()
                    .unwrap()
                    .permit
            })
            .collect();
        let waiters: Vec<Acquire> = (0..len)
            .map(|i| {
                let strict = (i % 10 == 9).then_some(i / 10 % 4);
                let mut f = acquire(&adm, sel(strict));
                assert!(poll_once(&mut f).is_none());
                f
            })
            .collect();
        assert_eq!(adm.queued(), len);
        g.bench_function(len.to_string(), |b| b.iter(|| adm.notify()));
        assert_eq!(adm.queued(), len);
        drop((waiters, held));
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = fast_path, contended, release_handoff, notify
}
criterion_main!(benches);
