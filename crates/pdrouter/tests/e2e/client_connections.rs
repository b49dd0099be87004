//! Client connection limits, over raw TCP: `--client-header-timeout-secs` closes a connection
//! whose request head stalls (with a 408) but never an idle keep-alive connection, and
//! `--max-connections` leaves connections beyond the cap in the accept backlog until one
//! closes, with `smg_http_connections_active` counting the open ones.
//!
//! Assertions are ordered by events, not timed: an idle connection that has been idle since
//! before a stalled head began must still serve after that head was cut.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long any single step may take before the test gives up (never a pass condition).
const PATIENCE: Duration = Duration::from_secs(30);

const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nhost: router\r\n\r\n";

/// Reads one HTTP/1.1 response with a `content-length` body; returns the status and the
/// head and body as text.
async fn read_response(stream: &mut TcpStream) -> (u16, String) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut chunk).await.expect("read");
        assert!(n > 0, "connection closed before a response head");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().unwrap())
        .expect("content-length");
    while buf.len() < head_end + len {
        let n = stream.read(&mut chunk).await.expect("read");
        assert!(n > 0, "connection closed mid-body");
        buf.extend_from_slice(&chunk[..n]);
    }
    let status = head[9..12].parse().unwrap();
    (status, String::from_utf8_lossy(&buf).into_owned())
}

async fn health_on(stream: &mut TcpStream) -> u16 {
    stream.write_all(HEALTH).await.unwrap();
    tokio::time::timeout(PATIENCE, read_response(stream))
        .await
        .expect("answered")
        .0
}

async fn connect(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_head_gets_408_and_idle_connections_stay_open() {
    let w = mock(Role::Regular, 0).await;
    let mut cfg = regular_config(&[&w]);
    cfg.client_header_timeout = Duration::from_secs(1);
    let r = router(cfg).await;

    // Idle from the start, and idle after a first request (keep-alive).
    let mut fresh = connect(r.addr()).await;
    let mut used = connect(r.addr()).await;
    assert_eq!(health_on(&mut used).await, 200);

    // After a first request on the same connection (so the clock restarts per head): half a
    // head, then silence.
    let mut stalled = connect(r.addr()).await;
    assert_eq!(health_on(&mut stalled).await, 200);
    let began = tokio::time::Instant::now();
    stalled
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: router\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, stalled.read_to_end(&mut answer))
        .await
        .expect("the stalled connection is closed")
        .expect("closed cleanly");
    assert!(
        began.elapsed() >= Duration::from_secs(1),
        "not before the timeout"
    );
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(
        answer.contains("x-smg-error-code: client_header_timeout"),
        "{answer}"
    );
    assert!(answer.contains("--client-header-timeout-secs"), "{answer}");

    // Both idle connections were idle for longer than the timeout and still serve.
    assert_eq!(health_on(&mut fresh).await, 200);
    assert_eq!(health_on(&mut used).await, 200);

    // A head that trickles in and completes within the timeout is served.
    let mut slow = connect(r.addr()).await;
    for part in HEALTH.chunks(8) {
        slow.write_all(part).await.unwrap();
        tokio::task::yield_now().await;
    }
    let (status, _) = tokio::time::timeout(PATIENCE, read_response(&mut slow))
        .await
        .expect("answered");
    assert_eq!(status, 200);
    r.shutdown(Duration::from_secs(1)).await;
}

/// A head that keeps trickling in (a header line now and then) but never completes is cut
/// too: the deadline runs from its first byte, not from the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_that_keeps_trickling_is_cut_at_its_deadline() {
    let w = mock(Role::Regular, 0).await;
    let mut cfg = regular_config(&[&w]);
    cfg.client_header_timeout = Duration::from_secs(1);
    let r = router(cfg).await;
    let mut slowloris = connect(r.addr()).await;
    slowloris
        .write_all(b"GET /health HTTP/1.1\r\nhost: router\r\n")
        .await
        .unwrap();
    let (mut rd, mut wr) = slowloris.split();
    let trickle = async {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        for i in 0u64.. {
            tick.tick().await;
            let line = format!("x-pad-{i}: {i}\r\n");
            if wr.write_all(line.as_bytes()).await.is_err() {
                break;
            }
        }
        // Closed under our feet: let the reader see how.
        std::future::pending::<()>().await;
    };
    let closed = async {
        let mut answer = Vec::new();
        let _ = rd.read_to_end(&mut answer).await;
        answer
    };
    let answer = tokio::time::timeout(PATIENCE, async {
        tokio::select! {
            answer = closed => answer,
            () = trickle => unreachable!(),
        }
    })
    .await
    .expect("the trickling connection is closed");
    // The 408 can be lost to a reset when the router closes with trickled bytes unread; what
    // counts is that the connection was closed, and that anything it sent was the 408.
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408 "),
        "{answer}"
    );
    r.shutdown(Duration::from_secs(1)).await;
}

fn connections(r: &pdrouter::RouterHandle) -> Option<f64> {
    metric(r, "smg_http_connections_active ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_max_connections_a_connection_waits_until_one_closes() {
    let w = mock(Role::Regular, 0).await;
    let mut cfg = regular_config(&[&w]);
    cfg.max_connections = 2;
    let r = router(cfg).await;
    assert_eq!(connections(&r), Some(0.0));

    let mut a = connect(r.addr()).await;
    let mut b = connect(r.addr()).await;
    assert_eq!(health_on(&mut a).await, 200);
    assert_eq!(health_on(&mut b).await, 200);
    assert_eq!(connections(&r), Some(2.0));

    // The third connects (the kernel's backlog takes it) but is not served while two are open.
    let mut c = connect(r.addr()).await;
    c.write_all(HEALTH).await.unwrap();
    let waited = tokio::time::timeout(Duration::from_millis(300), read_response(&mut c)).await;
    assert!(waited.is_err(), "served beyond --max-connections");
    assert_eq!(connections(&r), Some(2.0));
    // The open ones keep being served.
    assert_eq!(health_on(&mut b).await, 200);

    // One closes: the waiting connection is accepted and answered.
    drop(a);
    let (status, _) = tokio::time::timeout(PATIENCE, read_response(&mut c))
        .await
        .expect("served once a connection closed");
    assert_eq!(status, 200);
    assert_eq!(connections(&r), Some(2.0));

    drop(b);
    drop(c);
    assert!(
        eventually(PATIENCE, || connections(&r) == Some(0.0)).await,
        "gauge back to 0: {:?}",
        connections(&r)
    );
    r.shutdown(Duration::from_secs(1)).await;
}

/// A body that stops arriving is cut at the request timeout with a 408, and the global
/// limiter's permit its request took is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_gets_408_and_frees_its_permit() {
    let w = mock(Role::Regular, 0).await;
    let mut cfg = regular_config(&[&w]);
    cfg.request_timeout = Duration::from_secs(1);
    cfg.limiter = Some(pdrouter::limiter::LimiterConfig {
        max_concurrent: 1,
        queue_size: 0,
        queue_timeout: Duration::from_secs(1),
        tokens_per_second: None,
        priorities: None,
    });
    let r = router(cfg).await;

    let mut stalled = connect(r.addr()).await;
    stalled
        .write_all(
            b"POST /generate HTTP/1.1\r\nhost: router\r\ncontent-type: application/json\r\n\
              content-length: 100\r\n\r\n{\"text\":",
        )
        .await
        .unwrap();
    let (status, answer) = tokio::time::timeout(PATIENCE, read_response(&mut stalled))
        .await
        .expect("answered");
    assert_eq!(status, 408, "{answer}");
    assert!(
        answer.contains("x-smg-error-code: client_body_timeout"),
        "{answer}"
    );
    assert!(answer.contains("--request-timeout-secs"), "{answer}");
    // The only permit is free again: the next request is served, not refused.
    let reply = post(r.addr(), "/generate", r#"{"text":"hi"}"#).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    r.shutdown(Duration::from_secs(1)).await;
}
