//! Prefill admission end to end with real mock workers: the two tables of docs/admission.md
//! (Try it by hand) reproduced, plus the limit under load, cancellation, strict targets without
//! head-of-line blocking, and accounting. The scenarios run over HTTP, gRPC and vLLM workers
//! alike (`NAME::http`, `NAME::grpc`, `NAME::tokenspeed`, `NAME::vllm`): one admission
//! controller serves them all.
//!
//! Nothing here depends on how fast the machine is. A request is held in place with the
//! mock's hang switch instead of a long Prefill time: the workers are engine-mode mocks, where
//! a hung Prefill keeps its engine slot and the Decode waits for that Prefill's KV (as real
//! engines do), so a held request keeps its admission slot whichever leg the router waits
//! for. Waits are for events, with a generous deadline; elapsed times are only checked from
//! below, where the code guarantees them (a timeout cannot fire early).

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;
use pdrouter::config::WorkerType;
use pdrouter::registry::WorkerStatus;
use tokio::time::Instant;

/// Deadline for an event a test waits for; only a broken router takes this long.
const EVENT: Duration = Duration::from_secs(30);

/// Engine-mode Prefill mocks (KV bootstrap ports registered), one engine-mode Decode mock that
/// waits for each request's Prefill to finish, and a router with admission (`limit`, `queue`,
/// `timeout_secs`) in front.
struct Pd {
    ps: Vec<MockWorker>,
    d: MockWorker,
    r: pdrouter::RouterHandle,
    adm: pdrouter_admission::Admission,
}

async fn engine_pd(
    t: Transport,
    prefills: usize,
    limit: u32,
    queue: usize,
    timeout_secs: u64,
    tune: impl FnOnce(&mut pdrouter::Config),
) -> Pd {
    let mut ps = Vec::new();
    for _ in 0..prefills {
        ps.push(t.engine(Role::Prefill).await);
    }
    let d = t.engine(Role::Decode).await;
    let mut cfg = pd_config(&ps.iter().collect::<Vec<_>>(), &[&d]);
    for (spec, p) in cfg.workers.iter_mut().zip(&ps) {
        spec.bootstrap_port = p.bootstrap_addr().map(|a| a.port());
    }
    cfg.admission = admission(limit, queue, timeout_secs);
    tune(&mut cfg);
    let r = router(cfg).await;
    let adm = r.admission().unwrap().clone();
    Pd { ps, d, r, adm }
}

async fn pd_with_admission(t: Transport, limit: u32, queue: usize, timeout_secs: u64) -> Pd {
    engine_pd(t, 1, limit, queue, timeout_secs, |_| {}).await
}

fn spawn_chat(addr: SocketAddr, body: &'static str) -> tokio::task::JoinHandle<(Reply, Instant)> {
    spawn_chat_owned(addr, body.to_string())
}

fn spawn_chat_owned(addr: SocketAddr, body: String) -> tokio::task::JoinHandle<(Reply, Instant)> {
    tokio::spawn(async move {
        let r = post(addr, "/v1/chat/completions", &body).await;
        (r, Instant::now())
    })
}

/// Sends a chat request and waits until it holds the Prefill slot of `p` (hung in its engine).
async fn hold_slot(
    addr: SocketAddr,
    p: &MockWorker,
    held_before: usize,
) -> tokio::task::JoinHandle<(Reply, Instant)> {
    let t = spawn_chat(addr, CHAT);
    assert!(eventually(EVENT, || p.controls().hung() == held_before + 1).await);
    t
}

every_engine!(
    #[tokio::test]
    readme_table_one_timeout_then_queue_full,
    readme_table_two_all_served_in_arrival_order,
    limit_holds_under_many_concurrent_requests_over_two_workers,
    a_waiting_client_that_disconnects_leaves_no_trace,
    strict_target_waits_without_blocking_others,
    unavailable_is_503_and_never_queued_and_probes_take_no_slot,
    non_streaming_slot_is_released_at_prefill_end_not_after_decode,
    waiters_are_admitted_when_a_breaker_turns_half_open_without_polling,
    streaming_responses_get_the_real_429_not_a_200_stream,
);

async fn readme_table_one_timeout_then_queue_full(t: Transport) {
    let Pd { ps, d, r, adm } = pd_with_admission(t, 1, 1, 2).await;
    let p = &ps[0];
    // Request 1 is held in Prefill (the 3 s Prefill of docs/admission.md) until request 2 has
    // timed out.
    p.controls().set_hang(true);
    let first = hold_slot(r.addr(), p, 0).await;
    assert_eq!(adm.inflight_total(), 1);
    let second_sent = Instant::now();
    let second = spawn_chat(r.addr(), CHAT);
    assert!(eventually(EVENT, || adm.queued() == 1).await);
    let third = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(third.status, 429);
    assert_eq!(third.error_code(), "pd_prefill_queue_full");
    assert!(third.header("retry-after").is_some());

    let (second, second_done) = second.await.unwrap();
    assert_eq!(second.status, 429, "{}", second.text());
    assert_eq!(second.error_code(), "pd_prefill_queue_timeout");
    assert!(second.header("retry-after").is_some());
    // It waited the whole timeout (which cannot fire early).
    let waited = second_done - second_sent;
    assert!(waited >= Duration::from_secs(2), "{waited:?}");
    assert!(!first.is_finished());

    p.controls().set_hang(false);
    let (first, _) = first.await.unwrap();
    assert_eq!(first.status, 200, "{}", first.text());
    // Neither rejected request reached a worker, nor was it retried.
    assert_eq!(p.stats().requests_total, 1);
    assert_eq!(d.stats().requests_total, 1);
    assert_eq!(
        metric(
            &r,
            "smg_pd_prefill_admission_rejections_total{reason=\"queue_full\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &r,
            "smg_pd_prefill_admission_rejections_total{reason=\"queue_timeout\"}"
        ),
        Some(1.0)
    );
    assert!(eventually(EVENT, || adm.inflight_total() == 0 && total_load(&r) == 0).await);
}

async fn readme_table_two_all_served_in_arrival_order(t: Transport) {
    let Pd { ps, d: _d, r, adm } = pd_with_admission(t, 1, 4, 30).await;
    let p = &ps[0];
    p.controls().set_hang(true);
    let chat = |i: usize| {
        format!(
            r#"{{"model":"mock-model","messages":[{{"role":"user","content":"request {i}"}}]}}"#
        )
    };
    // Request 0 holds the slot; 1 and 2 queue behind it, each in place before the next is sent.
    let mut tasks = vec![spawn_chat_owned(r.addr(), chat(0))];
    assert!(eventually(EVENT, || p.controls().hung() == 1).await);
    let mut queued_seen = vec![Instant::now()];
    for i in 1..3 {
        tasks.push(spawn_chat_owned(r.addr(), chat(i)));
        assert!(eventually(EVENT, || adm.queued() == i).await);
        queued_seen.push(Instant::now());
    }
    // One in flight on the worker, two queued, also in the metrics.
    assert_eq!(adm.inflight_total(), 1);
    let worker = p.url();
    assert_eq!(
        metric(
            &r,
            &format!("smg_pd_prefill_admission_inflight{{worker=\"{worker}\"}}")
        ),
        Some(1.0)
    );
    assert_eq!(metric(&r, "smg_pd_prefill_admission_queued"), Some(2.0));
    // Let one Prefill finish at a time: the next request to reach the worker is always the
    // oldest waiter, and each finishes before the next is let through.
    let mut released = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        let prompt = last_prompt_text(p);
        assert!(prompt.contains(&format!("request {i}")), "{prompt}");
        assert_eq!(adm.queued(), 2 - i);
        released.push(Instant::now());
        assert_eq!(p.controls().release_hung(1), 1);
        let (reply, _) = task.await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
        if i < 2 {
            let want = i as u64 + 2;
            assert!(
                eventually(EVENT, || p.controls().hung() == 1
                    && p.stats().requests_total == want)
                .await
            );
        }
    }
    assert_eq!(p.stats().max_inflight, 1);
    // Request k waited at least from when it was seen queued until request k-1 was let go.
    let lower: f64 = (1..3)
        .map(|k| (released[k - 1] - queued_seen[k]).as_secs_f64())
        .sum();
    let waited = metric(&r, "smg_pd_prefill_admission_wait_seconds_sum").unwrap();
    assert!(waited >= lower - 1e-6, "{waited} < {lower}");
    assert_eq!(
        metric(&r, "smg_pd_prefill_admission_wait_seconds_count"),
        Some(3.0)
    );
    assert!(eventually(EVENT, || adm.inflight_total() == 0 && adm.queued() == 0).await);
    assert_eq!(metric(&r, "smg_pd_prefill_admission_queued"), Some(0.0));
}

#[tokio::test]
async fn without_admission_or_with_a_high_limit_requests_are_served() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let r = router(pd_config(&[&p], &[&d])).await;
    assert!(r.admission().is_none());
    assert_eq!(
        post(r.addr(), "/v1/chat/completions", CHAT).await.status,
        200
    );
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.admission = admission(64, 100, 60);
    let r = router(cfg).await;
    assert_eq!(
        post(r.addr(), "/v1/chat/completions", CHAT).await.status,
        200
    );
    assert_eq!(r.admission().unwrap().inflight_total(), 0);
}

async fn limit_holds_under_many_concurrent_requests_over_two_workers(t: Transport) {
    let p1 = t.start(Role::Prefill, 20).await;
    let p2 = t.start(Role::Prefill, 20).await;
    let d = t.start(Role::Decode, 0).await;
    let mut cfg = pd_config(&[&p1, &p2], &[&d]);
    cfg.admission = admission(2, 200, 60);
    let r = router(cfg).await;
    let tasks: Vec<_> = (0..120)
        .map(|_| {
            let addr = r.addr();
            tokio::spawn(
                async move { post(addr, "/v1/chat/completions", CHAT_STREAM).await.status },
            )
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    assert!(p1.stats().max_inflight <= 2, "{:?}", p1.stats());
    assert!(p2.stats().max_inflight <= 2, "{:?}", p2.stats());
    assert_eq!(p1.stats().requests_total + p2.stats().requests_total, 120);
    let adm = r.admission().unwrap().clone();
    assert!(
        eventually(EVENT, || adm.inflight_total() == 0
            && adm.queued() == 0
            && total_load(&r) == 0)
        .await
    );
}

async fn a_waiting_client_that_disconnects_leaves_no_trace(t: Transport) {
    let Pd { ps, d, r, adm } = pd_with_admission(t, 1, 4, 30).await;
    let p = &ps[0];
    p.controls().set_hang(true);
    let first = hold_slot(r.addr(), p, 0).await;
    // The first request's Decode leg is at the Decode worker, waiting for its Prefill (a
    // vLLM Decode is sent only once the Prefill answered).
    if !t.sequential() {
        assert!(eventually(EVENT, || d.stats().inflight == 1).await);
    }
    let waiter = spawn_chat(r.addr(), CHAT);
    assert!(eventually(EVENT, || adm.queued() == 1).await);
    // Decode load is not taken while waiting: only the first request's Decode leg counts.
    let decode = r.registry().snapshot().of_type(WorkerType::Decode)[0].clone();
    assert_eq!(decode.load(), 1);
    waiter.abort();
    assert!(eventually(EVENT, || adm.queued() == 0).await);
    p.controls().set_hang(false);
    let (reply, _) = first.await.unwrap();
    assert_eq!(reply.status, 200);
    assert!(eventually(EVENT, || adm.inflight_total() == 0 && total_load(&r) == 0).await);
    assert_eq!(
        p.stats().requests_total,
        1,
        "the cancelled waiter never reached a worker"
    );
    assert_eq!(d.stats().requests_total, 1);
}

async fn strict_target_waits_without_blocking_others(t: Transport) {
    let Pd { ps, d: _d, r, adm } = engine_pd(t, 2, 1, 8, 30, |cfg| {
        cfg.policy = pdrouter_policy::PolicyKind::ConsistentHashing;
        cfg.prefill_policy = cfg.policy;
    })
    .await;
    let (p0, p1) = (&ps[0], &ps[1]);
    let addr = r.addr();
    let to = |target: &'static str| {
        tokio::spawn(async move {
            send(
                addr,
                "POST",
                "/v1/chat/completions",
                CHAT,
                &[("x-smg-target-worker", target)],
            )
            .await
        })
    };
    p0.controls().set_hang(true);
    let first = to("0");
    assert!(eventually(EVENT, || p0.controls().hung() == 1).await);
    assert_eq!(adm.inflight_total(), 1);
    let waiting = to("0");
    assert!(eventually(EVENT, || adm.queued() == 1).await);
    // A later request for the free worker is not held back by the waiter ahead of it.
    let free = to("1").await.unwrap();
    assert_eq!(free.status, 200, "{}", free.text());
    assert_eq!(
        adm.queued(),
        1,
        "the strict waiter did not move to worker 1"
    );
    p0.controls().set_hang(false);
    let (a, b) = (first.await.unwrap(), waiting.await.unwrap());
    assert_eq!((a.status, b.status), (200, 200));
    assert_eq!(p0.stats().requests_total, 2);
    assert_eq!(p1.stats().requests_total, 1);
}

async fn unavailable_is_503_and_never_queued_and_probes_take_no_slot(t: Transport) {
    let Pd { ps, d: _d, r, adm } = pd_with_admission(t, 1, 4, 30).await;
    let p = &ps[0];
    p.controls().set_hang(true);
    let first = hold_slot(r.addr(), p, 0).await;
    // /health_generate does not wait for the full worker (vLLM's server has none).
    if !t.sequential() {
        let probe = get(r.addr(), "/health_generate").await;
        assert_eq!(probe.status, 200);
    }
    assert_eq!(adm.queued(), 0);
    let w = r.registry().snapshot().of_type(WorkerType::Prefill)[0].clone();
    r.registry().set_status(&w, WorkerStatus::NotReady);
    let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, 503);
    assert_eq!(adm.queued(), 0);
    assert_eq!(
        metric(
            &r,
            "smg_pd_prefill_admission_rejections_total{reason=\"unavailable\"}"
        ),
        Some(1.0)
    );
    r.registry().set_status(&w, WorkerStatus::Ready);
    p.controls().set_hang(false);
    assert_eq!(first.await.unwrap().0.status, 200);
}

async fn non_streaming_slot_is_released_at_prefill_end_not_after_decode(t: Transport) {
    let p = t.start(Role::Prefill, 50).await;
    let d = t.start(Role::Decode, 0).await;
    // Decode holds every request until released, so "still decoding" does not depend on timing.
    d.controls().set_hang(true);
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.admission = admission(1, 4, 30);
    let r = router(cfg).await;
    let adm = r.admission().unwrap().clone();
    let first = spawn_chat(r.addr(), CHAT);
    assert!(eventually(EVENT, || p.stats().requests_total == 1).await);
    // Prefill done, Decode still running: the slot is already free for the next request.
    assert!(eventually(EVENT, || adm.inflight_total() == 0).await);
    assert!(eventually(EVENT, || d.stats().inflight == 1).await);
    let second = spawn_chat(r.addr(), CHAT);
    assert!(eventually(EVENT, || p.stats().requests_total == 2).await);
    assert!(
        eventually(EVENT, || d.stats().inflight == 2).await,
        "second request admitted while the first decodes"
    );
    assert!(!first.is_finished());
    d.controls().set_hang(false);
    assert_eq!(first.await.unwrap().0.status, 200);
    assert_eq!(second.await.unwrap().0.status, 200);
}

#[tokio::test]
async fn removed_worker_series_are_removed() {
    let p1 = mock(Role::Prefill, 0).await;
    let p2 = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let mut cfg = pd_config(&[&p1, &p2], &[&d]);
    cfg.admission = admission(2, 4, 30);
    let r = router(cfg).await;
    let series = format!(
        "smg_pd_prefill_admission_inflight{{worker=\"{}\"}}",
        p2.url()
    );
    assert_eq!(metric(&r, &series), Some(0.0));
    let w = r.registry().snapshot().of_type(WorkerType::Prefill)[1].clone();
    r.registry().remove(w.id());
    assert!(eventually(EVENT, || metric(&r, &series).is_none()).await);
    assert!(metric(&r, &format!("smg_worker_health{{worker=\"{}\"}}", p2.url())).is_none());
    assert_eq!(
        post(r.addr(), "/v1/chat/completions", CHAT).await.status,
        200
    );
}

async fn waiters_are_admitted_when_a_breaker_turns_half_open_without_polling(t: Transport) {
    let breaker_timeout = Duration::from_secs(2);
    let Pd { ps, d: _d, r, adm } = engine_pd(t, 1, 1, 4, 30, |cfg| {
        cfg.breaker.failure_threshold = 1;
        cfg.breaker.timeout = breaker_timeout;
    })
    .await;
    let p = &ps[0];
    p.controls().set_hang(true);
    let first = hold_slot(r.addr(), p, 0).await;
    let waiter = spawn_chat(r.addr(), CHAT);
    assert!(eventually(EVENT, || adm.queued() == 1).await);
    // The worker's breaker opens while both requests are in the router.
    let w = r.registry().snapshot().of_type(WorkerType::Prefill)[0].clone();
    let opened = Instant::now();
    r.registry().record_outcome(&w, false);
    assert!(!w.is_routable());
    p.controls().set_hang(false);
    assert_eq!(first.await.unwrap().0.status, 200);
    // The slot is free but the breaker is open: the waiter keeps waiting (not a 503) and is
    // admitted when the breaker turns half-open, with nothing polling in between; it cannot be
    // admitted earlier.
    let (reply, done) = waiter.await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(done - opened >= breaker_timeout, "{:?}", done - opened);
    assert_eq!(
        metric(
            &r,
            "smg_pd_prefill_admission_rejections_total{reason=\"unavailable\"}"
        )
        .unwrap_or(0.0),
        0.0
    );
    assert_eq!(p.stats().requests_total, 2);
}

async fn streaming_responses_get_the_real_429_not_a_200_stream(t: Transport) {
    let Pd { ps, d: _d, r, adm } = pd_with_admission(t, 1, 0, 1).await;
    let p = &ps[0];
    p.controls().set_hang(true);
    let first = hold_slot(r.addr(), p, 0).await;
    assert_eq!(adm.inflight_total(), 1);
    let reply = post(r.addr(), "/v1/responses", r#"{"input":"hi","stream":true}"#).await;
    assert_eq!(reply.status, 429, "{}", reply.text());
    assert_eq!(reply.error_code(), "pd_prefill_queue_full");
    p.controls().set_hang(false);
    assert_eq!(first.await.unwrap().0.status, 200);
}

/// `Retry-After` follows the measured drain rate and the observed Prefill durations: one
/// admission in the window and no Prefill ended yet suggests the cap, many quick Prefills suggest
/// one second. Neither is the queue timeout.
#[tokio::test]
async fn retry_after_follows_the_drain_rate() {
    let Pd { ps, d: _d, r, adm } = pd_with_admission(Transport::Http, 1, 0, 60).await;
    let p = &ps[0];
    p.controls().set_hang(true);
    let held = hold_slot(r.addr(), p, 0).await;
    let slow = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(slow.error_code(), "pd_prefill_queue_full");
    let cap = pdrouter_admission::RETRY_AFTER_CAP.as_secs().to_string();
    assert_eq!(slow.header("retry-after"), Some(cap.as_str()));
    p.controls().set_hang(false);
    assert_eq!(held.await.unwrap().0.status, 200);

    // 40 more admissions: at least 10 of them within the last 10 s on any machine, so one
    // request at a time drains in at most a second.
    for _ in 0..39 {
        // The slot is released when the Prefill ends, which may be just after the reply.
        assert!(eventually(EVENT, || adm.inflight_total() == 0).await);
        let ok = post(r.addr(), "/v1/chat/completions", CHAT).await;
        assert_eq!(ok.status, 200, "{}", ok.text());
    }
    assert!(eventually(EVENT, || adm.inflight_total() == 0).await);
    p.controls().set_hang(true);
    let held = hold_slot(r.addr(), p, 0).await;
    let fast = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(fast.error_code(), "pd_prefill_queue_full");
    assert_eq!(fast.header("retry-after"), Some("1"));
    p.controls().set_hang(false);
    assert_eq!(held.await.unwrap().0.status, 200);
    assert!(eventually(EVENT, || adm.inflight_total() == 0 && total_load(&r) == 0).await);
}

fn chat_with(content: &str) -> String {
    serde_json::json!({"model": "mock-model", "messages": [{"role": "user", "content": content}]})
        .to_string()
}

/// A token budget alone: two small prompts share a worker; a prompt larger than the whole
/// budget waits, runs alone once the worker is empty, and a small one that arrived after it
/// waits behind it (FIFO) although it would fit next to the first two.
#[tokio::test]
async fn token_budget_admits_by_prompt_size_and_a_large_prompt_runs_alone() {
    let Pd { ps, d: _d, r, adm } = engine_pd(Transport::Http, 1, 1, 8, 60, |cfg| {
        cfg.admission = Some(pdrouter::config::AdmissionSettings {
            max_inflight_per_worker: pdrouter::config::NO_COUNT_LIMIT,
            max_inflight_tokens_per_worker: Some(10),
            queue_size: 8,
            queue_timeout: Duration::from_secs(60),
            auto: None,
            priorities: None,
        });
    })
    .await;
    let p = &ps[0];
    let tokens = "smg_pd_prefill_admission_inflight_tokens{";
    // "user" + "hello there": 15 bytes, 4 tokens each; "user" + 100 bytes: 26 tokens.
    p.controls().set_hang(true);
    let a = hold_slot(r.addr(), p, 0).await;
    let b = hold_slot(r.addr(), p, 1).await;
    assert_eq!(adm.inflight_total(), 2, "no count limit");
    assert_eq!(metric(&r, tokens), Some(8.0));
    let big = spawn_chat_owned(r.addr(), chat_with(&"a".repeat(100)));
    assert!(eventually(EVENT, || adm.queued() == 1).await);
    // One token: it would fit (8 + 1 <= 10), but it is behind the large prompt.
    let small = spawn_chat_owned(r.addr(), chat_with(""));
    assert!(eventually(EVENT, || adm.queued() == 2).await);
    assert_eq!(adm.inflight_total(), 2);

    // The first two go away: the worker is empty, so the large prompt runs, alone.
    a.abort();
    b.abort();
    assert!(eventually(EVENT, || adm.queued() == 1 && p.controls().hung() == 1).await);
    assert_eq!(adm.inflight_total(), 1);
    assert_eq!(metric(&r, tokens), Some(26.0));

    p.controls().set_hang(false);
    assert_eq!(big.await.unwrap().0.status, 200);
    assert_eq!(small.await.unwrap().0.status, 200);
    assert!(eventually(EVENT, || adm.inflight_total() == 0 && total_load(&r) == 0).await);
    assert_eq!(metric(&r, tokens), Some(0.0));
}

/// Sends `n` chats of `content` through `r` with Prefills held by the hang switch, and lets
/// them through one at a time: before each release every admitted request is held in the
/// engine and the rest wait in the router, so each completion sees its worker's limit full.
/// Returns the limit gauge `gauge` after each completion.
async fn release_one_at_a_time(pd: &Pd, n: usize, content: &str, gauge: &str) -> Vec<f64> {
    let (p, adm) = (&pd.ps[0], &pd.adm);
    p.controls().set_hang(true);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..n {
        let (addr, body, done) = (pd.r.addr(), chat_with(content), done.clone());
        tasks.push(tokio::spawn(async move {
            let reply = post(addr, "/v1/chat/completions", &body).await;
            done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            reply.status
        }));
    }
    let mut limits = Vec::new();
    for i in 0..n {
        let settled = eventually(EVENT, || {
            let held = p.controls().hung();
            held >= 1 && held == adm.inflight_total() as usize && adm.queued() + held + i == n
        })
        .await;
        assert!(settled, "completion {i}: not settled");
        assert_eq!(p.controls().release_hung(1), 1);
        let ended = eventually(EVENT, || {
            done.load(std::sync::atomic::Ordering::SeqCst) == i + 1
        })
        .await;
        assert!(ended, "completion {i}: no answer");
        // The released Prefill's slot goes (and its limit is stepped) with its body's end.
        assert!(
            eventually(EVENT, || adm.inflight_total() as usize
                == p.controls().hung())
            .await
        );
        limits.push(metric(&pd.r, gauge).expect("limit gauge"));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    assert!(
        eventually(EVENT, || adm.inflight_total() == 0
            && total_load(&pd.r) == 0)
        .await
    );
    limits
}

/// `--prefill-max-inflight-requests-per-worker auto`: each worker starts at the bound min and,
/// while its limit binds and its Prefills keep their speed, the limit grows up to the bound
/// max (exported per worker); nothing leaks.
#[tokio::test]
async fn an_auto_request_limit_grows_while_it_binds_up_to_its_max() {
    let pd = engine_pd(Transport::Http, 1, 1, 64, 60, |cfg| {
        cfg.admission = Some(pdrouter::config::AdmissionSettings {
            max_inflight_per_worker: 1,
            max_inflight_tokens_per_worker: None,
            queue_size: 64,
            queue_timeout: Duration::from_secs(60),
            priorities: None,
            auto: Some(pdrouter::config::AutoConfig {
                unit: pdrouter::config::Unit::Requests,
                min: 1,
                max: 3,
            }),
        });
    })
    .await;
    let gauge = "smg_pd_prefill_admission_limit{";
    assert_eq!(metric(&pd.r, gauge), Some(1.0), "starts at the bound min");
    let limits = release_one_at_a_time(&pd, 8, "hello there", gauge).await;
    // Up by 1/L per completion that found the limit full (1, 2, 2.5, 2.9, 3.24): whatever the
    // latencies, as fewer than 2 can be waiting with 2 in flight.
    assert_eq!(limits, vec![2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 3.0, 3.0]);
}

/// `--prefill-max-inflight-tokens-per-worker auto`: the budget grows by about one mean prompt
/// per round while it binds, up to the bound max; the count is not limited.
#[tokio::test]
async fn an_auto_token_budget_grows_by_mean_prompts_up_to_its_max() {
    let pd = engine_pd(Transport::Http, 1, 1, 64, 60, |cfg| {
        cfg.admission = Some(pdrouter::config::AdmissionSettings {
            max_inflight_per_worker: pdrouter::config::NO_COUNT_LIMIT,
            max_inflight_tokens_per_worker: Some(8),
            queue_size: 64,
            queue_timeout: Duration::from_secs(60),
            priorities: None,
            auto: Some(pdrouter::config::AutoConfig {
                unit: pdrouter::config::Unit::Tokens,
                min: 8,
                max: 12,
            }),
        });
    })
    .await;
    let gauge = "smg_pd_prefill_admission_limit_tokens{";
    assert_eq!(metric(&pd.r, gauge), Some(8.0));
    // "user" + "hello there": 4 tokens each, so two fit the starting budget. Up by u*u/L per
    // completion that found the budget full, u the mean prompt (4): 10, 11.6, 12.98 (the max
    // is 12). Whatever the latencies, as fewer than two prompts can be waiting with two in
    // flight.
    let limits = release_one_at_a_time(&pd, 8, "hello there", gauge).await;
    assert_eq!(limits, vec![10.0, 11.0, 12.0, 12.0, 12.0, 12.0, 12.0, 12.0]);
    assert_eq!(metric(&pd.r, "smg_pd_prefill_admission_limit{"), None);
}
