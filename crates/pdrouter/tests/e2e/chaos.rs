//! Chaos: many requests with random client disconnects at random phases (queued, in Prefill,
//! in Decode), a 10% worker failure rate, a Prefill worker killed and restarted, a Decode
//! worker removed and re-added through /workers. Afterwards nothing is left behind: no queued
//! waiter, no admission slot, no worker load, no 500, and the router still serves. Run over
//! HTTP, gRPC (SGLang's and TokenSpeed's) and vLLM workers (`nothing_leaks_under_chaos::vllm`:
//! the sequential handoff, its Prefill answer read before Decode is sent).

use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use rand::{RngExt, SeedableRng};

const REQUESTS: usize = 2000;
const CONCURRENCY: usize = 40;

every_engine!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    nothing_leaks_under_chaos
);

async fn nothing_leaks_under_chaos(t: Transport) {
    // Any panic anywhere in the process (router tasks included) is counted and fails the test.
    static PANICS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        default_hook(info);
    }));
    let mk = |role: Role, delay: u64| {
        let mut c = t.mock(role);
        c.delay = Duration::from_millis(delay);
        c.fail_rate = 0.1;
        c.output_tokens = 4;
        c.token_interval = Duration::from_millis(3);
        c
    };
    // p2's port stays reserved while it is down, so nobody else can take it before the restart.
    let p2_port = PortReservation::new().unwrap();
    let p1 = MockWorker::start(mk(Role::Prefill, 15)).await.unwrap();
    let mut first = mk(Role::Prefill, 15);
    first.port = p2_port.port();
    let p2 = MockWorker::start(first).await.unwrap();
    let d1 = MockWorker::start(mk(Role::Decode, 0)).await.unwrap();
    let d2 = MockWorker::start(mk(Role::Decode, 0)).await.unwrap();
    let d2_url = d2.url();
    let mut cfg = pd_config(&[&p1, &p2], &[&d1, &d2]);
    cfg.admission = admission(2, 64, 3);
    cfg.retry.max_attempts = 2;
    cfg.retry.initial_backoff = Duration::from_millis(1);
    cfg.breaker.failure_threshold = 1000;
    cfg.request_timeout = Duration::from_secs(10);
    let r = router(cfg).await;
    let addr = r.addr();

    let sem = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let statuses = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let finished = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let cancelled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut tasks = Vec::new();
    for i in 0..REQUESTS {
        let permit = sem.clone().acquire_owned().await.unwrap();
        let stream = rng.random_bool(0.5);
        let abort_after = rng
            .random_bool(0.3)
            .then(|| Duration::from_millis(rng.random_range(0..60)));
        let statuses = statuses.clone();
        let (finished, cancelled) = (finished.clone(), cancelled.clone());
        let req = tokio::spawn(async move {
            let body = if stream { CHAT_STREAM } else { CHAT };
            let reply = post(addr, "/v1/chat/completions", body).await;
            statuses.lock().push(reply.status);
        });
        tasks.push(tokio::spawn(async move {
            if let Some(after) = abort_after {
                tokio::time::sleep(after).await;
                req.abort();
                match req.await {
                    Ok(()) => finished.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                    Err(_) => cancelled.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                };
            } else {
                req.await.expect("request task completes");
                finished.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            drop(permit);
        }));
        // Chaos on the worker set while traffic flows.
        if i == 500 {
            p2.controls().set_hang(true);
        }
        if i == 700 {
            let encoded = d2_url.replace(':', "%3A").replace('/', "%2F");
            let del = send(addr, "DELETE", &format!("/workers/{encoded}"), "", &[]).await;
            assert_eq!(del.status, 202);
        }
        if i == 1000 {
            let add = post(
                addr,
                "/workers",
                &format!(r#"{{"url":"{d2_url}","worker_type":"decode"}}"#),
            )
            .await;
            assert_eq!(add.status, 202, "{}", add.text());
        }
    }
    // Kill the hung Prefill worker outright, then bring it back on the same port.
    p2.shutdown().await;
    let mut again = mk(Role::Prefill, 15);
    again.port = p2_port.port();
    let p2 = MockWorker::start(again).await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }

    let adm = r.admission().unwrap().clone();
    assert!(
        eventually(Duration::from_secs(15), || adm.queued() == 0
            && adm.inflight_total() == 0
            && total_load(&r) == 0)
        .await,
        "queued {} inflight {} load {}",
        adm.queued(),
        adm.inflight_total(),
        total_load(&r)
    );
    assert_eq!(metric(&r, "smg_pd_prefill_admission_queued"), Some(0.0));
    // Every per-worker gauge is back to zero too.
    let text = r.metrics_text();
    for line in text.lines().filter(|l| {
        l.starts_with("smg_pd_prefill_admission_inflight{")
            || l.starts_with("smg_worker_requests_active{")
    }) {
        assert!(line.ends_with(" 0"), "{line}");
    }
    let statuses = statuses.lock().clone();
    // Every request ended exactly once: with one final status, or cancelled by its client.
    let done = finished.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(statuses.len(), done);
    assert_eq!(
        done + cancelled.load(std::sync::atomic::Ordering::Relaxed),
        REQUESTS
    );
    assert!(
        statuses.len() >= REQUESTS / 2,
        "most requests finished: {}",
        statuses.len()
    );
    assert!(
        statuses
            .iter()
            .all(|s| [200, 429, 502, 503, 504].contains(s)),
        "{statuses:?}"
    );
    assert!(statuses.iter().filter(|s| **s == 200).count() > REQUESTS / 4);

    // Still serving once the faults stop.
    for w in [&p1, &p2, &d1, &d2] {
        w.controls().set_fail_rate(0.0);
    }
    let mut served = false;
    for _ in 0..20 {
        if post(addr, "/v1/chat/completions", CHAT).await.status == 200 {
            served = true;
            break;
        }
    }
    assert!(served);
    assert_eq!(
        PANICS.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a task panicked"
    );
    // A deadline, not a margin: legs wind down within their own timeouts (the Prefill
    // grace after Decode is 5 s), so allow them that on a loaded machine.
    assert!(
        eventually(Duration::from_secs(15), || total_load(&r) == 0
            && adm.inflight_total() == 0)
        .await,
        "load {} and admission {} left held",
        total_load(&r),
        adm.inflight_total()
    );
    // Nothing is left running on the workers either: abandoned legs were aborted.
    for w in [&p1, &p2, &d1, &d2] {
        assert!(
            eventually(Duration::from_secs(15), || w.stats().inflight == 0).await,
            "{} still has {} in flight",
            w.url(),
            w.stats().inflight
        );
    }
}
