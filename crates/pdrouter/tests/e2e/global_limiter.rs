//! The global limiter (`--max-concurrent-requests`, `--queue-size`, `--queue-timeout-secs`)
//! end to end: 429 when the queue is full, 408 on timeout, the permit held until a streamed
//! body ends or the client goes away, and composition with Prefill admission. Requests are
//! held with the mock's hang switch; waits are for events with a generous deadline.

use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use http_body_util::Full;
use pdrouter::limiter::LimiterConfig;
use pdrouter_mock::EngineConfig;
use tokio::time::Instant;

const EVENT: Duration = Duration::from_secs(30);

fn limiter(max: usize, queue: usize, timeout_secs: u64) -> Option<LimiterConfig> {
    Some(LimiterConfig {
        max_concurrent: max,
        queue_size: queue,
        queue_timeout: Duration::from_secs(timeout_secs),
        tokens_per_second: None,
        priorities: None,
    })
}

fn spawn_post(
    addr: std::net::SocketAddr,
    body: &'static str,
) -> tokio::task::JoinHandle<(Reply, Instant)> {
    tokio::spawn(async move {
        let r = post(addr, "/v1/chat/completions", body).await;
        (r, Instant::now())
    })
}

#[tokio::test]
async fn full_queue_is_429_and_a_timed_out_wait_is_408() {
    let w = mock(Role::Regular, 0).await;
    let mut cfg = regular_config(&[&w]);
    cfg.limiter = limiter(1, 1, 2);
    let r = router(cfg).await;
    let lim = r.limiter().unwrap().clone();
    w.controls().set_hang(true);
    let first = spawn_post(r.addr(), CHAT);
    assert!(eventually(EVENT, || w.controls().hung() == 1).await);
    assert_eq!(lim.inflight(), 1);
    let second_sent = Instant::now();
    let second = spawn_post(r.addr(), CHAT);
    assert!(eventually(EVENT, || lim.queued() == 1).await);

    let third = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(third.status, 429);
    assert_eq!(third.error_code(), "rate_limit_exceeded");
    assert!(third.header("retry-after").is_some());

    let (second, done) = second.await.unwrap();
    assert_eq!(second.status, 408, "{}", second.text());
    assert_eq!(second.error_code(), "queue_timeout");
    assert!(done - second_sent >= Duration::from_secs(2));

    w.controls().set_hang(false);
    let (first, _) = first.await.unwrap();
    assert_eq!(first.status, 200, "{}", first.text());
    // Refused requests never reached the worker.
    assert_eq!(w.stats().requests_total, 1);
    assert_eq!(
        metric(&r, "smg_http_rate_limit_total{result=\"rejected\"}"),
        Some(2.0)
    );
    assert_eq!(
        metric(&r, "smg_http_rate_limit_total{result=\"allowed\"}"),
        Some(1.0)
    );
    assert!(eventually(EVENT, || lim.inflight() == 0 && lim.queued() == 0).await);
    assert_eq!(metric(&r, "smg_http_rate_limit_inflight"), Some(0.0));
    assert_eq!(metric(&r, "smg_http_rate_limit_queued"), Some(0.0));
}

/// An answer whose body is still coming holds its permit after the head went out, until the
/// client goes away.
#[tokio::test]
async fn an_unfinished_body_holds_the_permit_until_the_client_leaves() {
    let w = mock(Role::Regular, 0).await;
    w.controls().set_hold_body_open(true);
    let mut cfg = regular_config(&[&w]);
    cfg.limiter = limiter(1, 4, 60);
    let r = router(cfg).await;
    let lim = r.limiter().unwrap().clone();
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{}/v1/chat/completions", r.addr()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(CHAT.as_bytes())))
        .unwrap();
    let head = client().request(req).await.unwrap();
    assert_eq!(head.status(), 200);
    assert_eq!(lim.inflight(), 1, "the head is out, the body is not done");
    // A second request waits meanwhile.
    let second = spawn_post(r.addr(), CHAT);
    assert!(eventually(EVENT, || lim.queued() == 1).await);
    drop(head);
    w.controls().set_hold_body_open(false);
    let (second, _) = second.await.unwrap();
    assert_eq!(second.status, 200, "{}", second.text());
    assert!(eventually(EVENT, || lim.inflight() == 0 && lim.queued() == 0).await);
}

/// Clients still sending their bodies hold no permit: with one permit and two clients
/// trickling their bodies, a complete request is answered at once.
#[tokio::test]
async fn a_body_still_arriving_holds_no_permit() {
    use tokio::io::AsyncWriteExt;
    let w = mock(Role::Regular, 0).await;
    let mut cfg = regular_config(&[&w]);
    cfg.limiter = limiter(1, 4, 60);
    let r = router(cfg).await;
    let lim = r.limiter().unwrap().clone();
    let mut slow = Vec::new();
    for _ in 0..2 {
        let mut s = tokio::net::TcpStream::connect(r.addr()).await.unwrap();
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            CHAT.len()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        // Half the body: the router now waits for the rest.
        s.write_all(&CHAT.as_bytes()[..CHAT.len() / 2])
            .await
            .unwrap();
        slow.push(s);
    }
    let reply = tokio::time::timeout(EVENT, post(r.addr(), "/v1/chat/completions", CHAT))
        .await
        .expect("answered while the slow bodies are still arriving");
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(lim.queued(), 0);
    assert!(eventually(EVENT, || lim.inflight() == 0).await);
    // A slow body that completes is served too, and takes its permit only then.
    let mut done = slow.pop().unwrap();
    done.write_all(&CHAT.as_bytes()[CHAT.len() / 2..])
        .await
        .unwrap();
    assert!(eventually(EVENT, || w.stats().requests_total == 2).await);
    drop((slow, done));
    assert!(eventually(EVENT, || lim.inflight() == 0 && lim.queued() == 0).await);
}

/// A request takes its global permit first, then waits for a Prefill slot; everything held
/// comes back after success, failure and disconnect.
/// Engine-mode mocks: a hung Prefill keeps its slot and its Decode waits for the KV, so a
/// held request holds everything it took.
async fn engine_mock(role: Role) -> MockWorker {
    let mut cfg = MockConfig::new(role);
    cfg.engine = Some(EngineConfig {
        max_running: 64,
        prefill_tokens_per_sec: 1e9,
        bootstrap_port: 0,
        ..EngineConfig::new()
    });
    MockWorker::start(cfg).await.expect("mock starts")
}

#[tokio::test]
async fn composes_with_prefill_admission_and_leaks_nothing() {
    let p = engine_mock(Role::Prefill).await;
    let d = engine_mock(Role::Decode).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.workers[0].bootstrap_port = p.bootstrap_addr().map(|a| a.port());
    cfg.admission = admission(1, 4, 60);
    cfg.limiter = limiter(2, 4, 60);
    let r = router(cfg).await;
    let lim = r.limiter().unwrap().clone();
    let adm = r.admission().unwrap().clone();
    p.controls().set_hang(true);
    let first = spawn_post(r.addr(), CHAT);
    assert!(eventually(EVENT, || p.controls().hung() == 1).await);
    // The second holds a global permit and waits for the Prefill slot...
    let second = spawn_post(r.addr(), CHAT);
    assert!(eventually(EVENT, || adm.queued() == 1).await);
    assert_eq!(lim.inflight(), 2);
    // ...the third waits for a global permit, never reaching admission.
    let third = spawn_post(r.addr(), CHAT);
    assert!(eventually(EVENT, || lim.queued() == 1).await);
    assert_eq!(adm.queued(), 1);
    // A client that gives up while waiting for the Prefill slot gives both back: its global
    // permit goes to the third, which moves up into the Prefill queue in its place.
    second.abort();
    assert!(
        eventually(EVENT, || lim.queued() == 0
            && lim.inflight() == 2
            && adm.queued() == 1)
        .await
    );
    // The held request finishes; a failing Prefill then fails the third cleanly.
    p.controls().set_fail_rate(1.0);
    p.controls().set_hang(false);
    let (first, _) = first.await.unwrap();
    assert_eq!(first.status, 200, "{}", first.text());
    let (third, _) = third.await.unwrap();
    assert_ne!(third.status, 200);
    p.controls().set_fail_rate(0.0);
    let ok = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert!(
        eventually(EVENT, || lim.inflight() == 0
            && lim.queued() == 0
            && adm.inflight_total() == 0
            && adm.queued() == 0
            && total_load(&r) == 0)
        .await
    );
}

/// Starts the binary in front of `w` with `limiter_flags`; returns the child, its address and
/// an instant taken before it started (so before its token bucket was filled).
async fn launch_limited(
    w: &MockWorker,
    limiter_flags: &[&str],
) -> (std::process::Child, std::net::SocketAddr, Instant) {
    let mut args = vec![
        "--worker-urls".to_string(),
        w.url(),
        "--disable-health-check".to_string(),
    ];
    args.extend(limiter_flags.iter().map(|s| s.to_string()));
    let before = Instant::now();
    let (child, addr) = tokio::task::spawn_blocking(move || launch_binary(&args, &[]))
        .await
        .unwrap();
    (child, addr.parse().unwrap(), before)
}

/// `--rate-limit-tokens-per-second` through the binary, without a queue: after the burst
/// (`--max-concurrent-requests` tokens) a request finding no token is refused with 429 and
/// never reaches the worker. Requests go one at a time, so concurrency never refuses any.
/// The bound is exact, with no timing margin: since the bucket was filled, at most
/// burst + rate × elapsed requests can have been admitted, and elapsed is over-estimated by
/// starting the clock before the router starts; on any machine fast enough to send the
/// requests in under (N − burst) seconds, that forces refusals.
#[tokio::test]
async fn a_rate_without_a_queue_refuses_requests_beyond_the_tokens() {
    const BURST: usize = 2;
    const N: usize = 12;
    let w = mock(Role::Regular, 0).await;
    let (child, addr, started) = launch_limited(
        &w,
        &[
            "--max-concurrent-requests",
            "2",
            "--queue-size",
            "0",
            "--rate-limit-tokens-per-second",
            "1",
        ],
    )
    .await;
    let mut admitted = 0;
    for i in 0..N {
        let r = post(addr, "/v1/chat/completions", CHAT).await;
        match r.status {
            200 => admitted += 1,
            429 => {
                assert!(i >= BURST, "request {i} of the burst was refused");
                assert_eq!(r.error_code(), "rate_limit_exceeded");
                assert!(r.header("retry-after").is_some());
            }
            s => panic!("request {i}: status {s}: {}", r.text()),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let bound = BURST + elapsed.floor() as usize;
    assert!(
        admitted <= bound,
        "{admitted} admitted in {elapsed:.2}s at 1 token/s after a burst of {BURST}"
    );
    assert_eq!(w.stats().requests_total, admitted as u64);
    let (status, _) = stop_binary(child).await;
    assert!(status.success(), "{status:?}");
}

/// With a queue, a request finding no token waits for the next one instead: every request
/// succeeds, and the last cannot have been admitted before the bucket refilled the tokens it
/// needed (a lower bound on elapsed time, which load can only lengthen).
#[tokio::test]
async fn a_rate_with_a_queue_makes_requests_wait_for_tokens() {
    let w = mock(Role::Regular, 0).await;
    let (child, addr, started) = launch_limited(
        &w,
        &[
            "--max-concurrent-requests",
            "1",
            "--queue-size",
            "4",
            "--queue-timeout-secs",
            "60",
            "--rate-limit-tokens-per-second",
            "1",
        ],
    )
    .await;
    for i in 0..3 {
        let r = post(addr, "/v1/chat/completions", CHAT).await;
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
    }
    // One token at start, then one per second: the third needed two refills.
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(w.stats().requests_total, 3);
    let (status, _) = stop_binary(child).await;
    assert!(status.success(), "{status:?}");
}
