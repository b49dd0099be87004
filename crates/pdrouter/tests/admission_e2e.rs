//! Prefill admission end to end with real mock workers: SPEC §5 reproduced, plus the limit
//! under load, cancellation, strict targets without head-of-line blocking, and accounting.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use pdrouter::config::WorkerType;
use pdrouter::registry::WorkerStatus;
use support::*;
use tokio::time::Instant;

/// One Prefill mock taking `prefill_ms` per request, one immediate Decode mock, and a router
/// with admission (`limit`, `queue`, `timeout_secs`) in front.
struct Pd {
    p: MockWorker,
    d: MockWorker,
    r: pdrouter::RouterHandle,
    adm: pdrouter_admission::Admission,
}

async fn pd_with_admission(prefill_ms: u64, limit: u32, queue: usize, timeout_secs: u64) -> Pd {
    let p = mock(Role::Prefill, prefill_ms).await;
    let d = mock(Role::Decode, 0).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.admission = admission(limit, queue, timeout_secs);
    let r = router(cfg).await;
    let adm = r.admission().unwrap().clone();
    Pd { p, d, r, adm }
}

fn spawn_chat(addr: SocketAddr, body: &'static str) -> tokio::task::JoinHandle<(Reply, Instant)> {
    tokio::spawn(async move {
        let r = post(addr, "/v1/chat/completions", body).await;
        (r, Instant::now())
    })
}

#[tokio::test]
async fn spec_table_one_timeout_then_queue_full() {
    let Pd { p, d, r, adm } = pd_with_admission(3000, 1, 1, 2).await;
    let t0 = Instant::now();
    let first = spawn_chat(r.addr(), CHAT);
    assert!(eventually(Duration::from_secs(5), || adm.inflight_total() == 1).await);
    let second_sent = Instant::now();
    let second = spawn_chat(r.addr(), CHAT);
    assert!(eventually(Duration::from_secs(5), || adm.queued() == 1).await);
    let third = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(third.status, 429);
    assert_eq!(third.error_code(), "pd_prefill_queue_full");
    assert!(third.header("retry-after").is_some());

    let (second, second_done) = second.await.unwrap();
    assert_eq!(second.status, 429, "{}", second.text());
    assert_eq!(second.error_code(), "pd_prefill_queue_timeout");
    assert!(second.header("retry-after").is_some());
    let waited = second_done - second_sent;
    assert!(
        waited >= Duration::from_millis(1900) && waited < Duration::from_millis(4000),
        "{waited:?}"
    );

    let (first, first_done) = first.await.unwrap();
    assert_eq!(first.status, 200, "{}", first.text());
    assert!(first_done - t0 >= Duration::from_millis(2900));
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
    assert!(
        eventually(Duration::from_secs(5), || adm.inflight_total() == 0
            && total_load(&r) == 0)
        .await
    );
}

#[tokio::test]
async fn spec_table_two_all_served_in_arrival_order() {
    let Pd { p, d: _d, r, adm } = pd_with_admission(3000, 1, 4, 30).await;
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..3 {
        tasks.push(spawn_chat(r.addr(), CHAT));
        // Each request is in place (admitted or queued) before the next one arrives.
        let want = i;
        assert!(eventually(Duration::from_secs(5), || adm.queued() == want).await);
    }
    // Sampled mid-run: one in flight on the worker, two queued, also in the metrics.
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
    let mut done = Vec::new();
    for t in tasks {
        let (reply, at) = t.await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
        done.push(at);
    }
    assert!(
        done.windows(2).all(|w| w[0] <= w[1]),
        "finished in arrival order"
    );
    let total = t0.elapsed();
    assert!(
        total >= Duration::from_millis(8800) && total < Duration::from_secs(20),
        "{total:?}"
    );
    // The two queued requests waited about 3 s + 6 s.
    let waited = metric(&r, "smg_pd_prefill_admission_wait_seconds_sum").unwrap();
    assert!((8.0..14.0).contains(&waited), "{waited}");
    assert_eq!(p.stats().max_inflight, 1);
    assert!(
        eventually(Duration::from_secs(5), || adm.inflight_total() == 0
            && adm.queued() == 0)
        .await
    );
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

#[tokio::test]
async fn limit_holds_under_many_concurrent_requests_over_two_workers() {
    let p1 = mock(Role::Prefill, 20).await;
    let p2 = mock(Role::Prefill, 20).await;
    let d = mock(Role::Decode, 0).await;
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
        eventually(Duration::from_secs(5), || adm.inflight_total() == 0
            && adm.queued() == 0
            && total_load(&r) == 0)
        .await
    );
}

#[tokio::test]
async fn a_waiting_client_that_disconnects_leaves_no_trace() {
    let Pd { p, d, r, adm } = pd_with_admission(1500, 1, 4, 30).await;
    let first = spawn_chat(r.addr(), CHAT);
    assert!(eventually(Duration::from_secs(5), || adm.inflight_total() == 1).await);
    let waiter = spawn_chat(r.addr(), CHAT);
    assert!(eventually(Duration::from_secs(5), || adm.queued() == 1).await);
    // Decode load is not taken while waiting: only the first request's Decode leg counts.
    let decode = r.registry().snapshot().of_type(WorkerType::Decode)[0].clone();
    assert_eq!(decode.load(), 1);
    waiter.abort();
    assert!(eventually(Duration::from_secs(5), || adm.queued() == 0).await);
    let (reply, _) = first.await.unwrap();
    assert_eq!(reply.status, 200);
    assert!(
        eventually(Duration::from_secs(5), || adm.inflight_total() == 0
            && total_load(&r) == 0)
        .await
    );
    assert_eq!(
        p.stats().requests_total,
        1,
        "the cancelled waiter never reached a worker"
    );
    assert_eq!(d.stats().requests_total, 1);
}

#[tokio::test]
async fn strict_target_waits_without_blocking_others() {
    let p0 = mock(Role::Prefill, 1500).await;
    let p1 = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let mut cfg = pd_config(&[&p0, &p1], &[&d]);
    cfg.policy = pdrouter_policy::PolicyKind::ConsistentHashing;
    cfg.prefill_policy = cfg.policy;
    cfg.admission = admission(1, 8, 30);
    let r = router(cfg).await;
    let adm = r.admission().unwrap().clone();
    let addr = r.addr();
    let to = |target: &'static str| {
        tokio::spawn(async move {
            let reply = send(
                addr,
                "POST",
                "/v1/chat/completions",
                CHAT,
                &[("x-smg-target-worker", target)],
            )
            .await;
            (reply, Instant::now())
        })
    };
    let first = to("0");
    assert!(eventually(Duration::from_secs(5), || adm.inflight_total() == 1).await);
    let waiting = to("0");
    assert!(eventually(Duration::from_secs(5), || adm.queued() == 1).await);
    // A later request for the free worker is not held back by the waiter ahead of it.
    let free = send(
        addr,
        "POST",
        "/v1/chat/completions",
        CHAT,
        &[("x-smg-target-worker", "1")],
    )
    .await;
    assert_eq!(free.status, 200);
    assert_eq!(
        adm.queued(),
        1,
        "the strict waiter did not move to worker 1"
    );
    let (a, _) = first.await.unwrap();
    let (b, _) = waiting.await.unwrap();
    assert_eq!((a.status, b.status), (200, 200));
    assert_eq!(p0.stats().requests_total, 2);
    assert_eq!(p1.stats().requests_total, 1);
}

#[tokio::test]
async fn unavailable_is_503_and_never_queued_and_probes_take_no_slot() {
    let Pd {
        p: _p,
        d: _d,
        r,
        adm,
    } = pd_with_admission(1500, 1, 4, 30).await;
    let first = spawn_chat(r.addr(), CHAT);
    assert!(eventually(Duration::from_secs(5), || adm.inflight_total() == 1).await);
    // /health_generate does not wait for the full worker.
    let probe = get(r.addr(), "/health_generate").await;
    assert_eq!(probe.status, 200);
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
    assert_eq!(first.await.unwrap().0.status, 200);
}

#[tokio::test]
async fn non_streaming_slot_is_released_at_prefill_end_not_after_decode() {
    let p = mock(Role::Prefill, 50).await;
    let d = mock(Role::Decode, 0).await;
    // Decode holds every request until released, so "still decoding" does not depend on timing.
    d.controls().set_hang(true);
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.admission = admission(1, 4, 30);
    let r = router(cfg).await;
    let adm = r.admission().unwrap().clone();
    let first = spawn_chat(r.addr(), CHAT);
    assert!(eventually(Duration::from_secs(5), || p.stats().requests_total == 1).await);
    // Prefill done, Decode still running: the slot is already free for the next request.
    assert!(eventually(Duration::from_secs(5), || adm.inflight_total() == 0).await);
    assert!(eventually(Duration::from_secs(5), || d.stats().inflight == 1).await);
    let second = spawn_chat(r.addr(), CHAT);
    assert!(eventually(Duration::from_secs(5), || p.stats().requests_total == 2).await);
    assert!(
        eventually(Duration::from_secs(5), || d.stats().inflight == 2).await,
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
    assert!(eventually(Duration::from_secs(5), || metric(&r, &series).is_none()).await);
    assert!(metric(&r, &format!("smg_worker_health{{worker=\"{}\"}}", p2.url())).is_none());
    assert_eq!(
        post(r.addr(), "/v1/chat/completions", CHAT).await.status,
        200
    );
}

#[tokio::test]
async fn waiters_are_admitted_when_a_breaker_turns_half_open_without_polling() {
    let p = mock(Role::Prefill, 800).await;
    let d = mock(Role::Decode, 0).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.admission = admission(1, 4, 30);
    cfg.breaker.failure_threshold = 1;
    cfg.breaker.timeout = Duration::from_secs(2);
    let r = router(cfg).await;
    let adm = r.admission().unwrap().clone();
    let first = spawn_chat(r.addr(), CHAT);
    assert!(eventually(Duration::from_secs(5), || adm.inflight_total() == 1).await);
    let waiter = spawn_chat(r.addr(), CHAT);
    assert!(eventually(Duration::from_secs(5), || adm.queued() == 1).await);
    // The worker's breaker opens while both requests are in the router.
    let w = r.registry().snapshot().of_type(WorkerType::Prefill)[0].clone();
    let opened = Instant::now();
    r.registry().record_outcome(&w, false);
    assert!(!w.is_routable());
    assert_eq!(first.await.unwrap().0.status, 200);
    // The slot is free but the breaker is open: the waiter keeps waiting (not a 503).
    assert_eq!(adm.inflight_total(), 0);
    assert_eq!(adm.queued(), 1);
    let (reply, done) = waiter.await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    let after = done - opened;
    assert!(
        after >= Duration::from_millis(2500) && after < Duration::from_secs(6),
        "{after:?}"
    );
    assert_eq!(p.stats().requests_total, 2);
}

#[tokio::test]
async fn streaming_responses_get_the_real_429_not_a_200_stream() {
    let Pd {
        p: _p,
        d: _d,
        r,
        adm,
    } = pd_with_admission(1500, 1, 0, 1).await;
    let first = spawn_chat(r.addr(), CHAT);
    assert!(eventually(Duration::from_secs(5), || adm.inflight_total() == 1).await);
    let reply = post(r.addr(), "/v1/responses", r#"{"input":"hi","stream":true}"#).await;
    assert_eq!(reply.status, 429, "{}", reply.text());
    assert_eq!(reply.error_code(), "pd_prefill_queue_full");
    assert_eq!(first.await.unwrap().0.status, 200);
}
