//! Bodies the router reads whole from a worker (model and server info, `/v1/models`,
//! `/health_generate`, health probes) are size-limited: a worker that answers 200 and then
//! streams without end gets a 502 naming the limit, not a router that buffers until the timeout.

use std::time::Duration;

use crate::support::*;
use pdrouter::config::{Config, Mode, WorkerType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A worker that answers every request with 200 and a chunked body that never ends. Returns
/// its base URL; the listener task lives until the test's runtime stops.
async fn endless_worker() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(answer_endlessly(stream));
        }
    });
    format!("http://{addr}")
}

async fn answer_endlessly(mut stream: TcpStream) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let start = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                 transfer-encoding: chunked\r\n\r\n";
    if stream.write_all(start.as_bytes()).await.is_err() {
        return;
    }
    let chunk = format!("10000\r\n{}\r\n", "x".repeat(0x10000));
    // Ends only when the router hangs up.
    while stream.write_all(chunk.as_bytes()).await.is_ok() {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_worker_body_is_cut_at_the_limit_with_a_502() {
    let url = endless_worker().await;
    let mut cfg = Config::with_workers(Mode::Regular, vec![spec(&url, WorkerType::Regular)]);
    cfg.health.enabled = false;
    cfg.retry.max_attempts = 1;
    // Long enough that a router reading to the end would answer 504, not 502.
    cfg.health.timeout = Duration::from_secs(60);
    let r = router(cfg).await;
    for path in [
        "/get_model_info",
        "/get_server_info",
        "/v1/models",
        "/health_generate",
    ] {
        let reply = tokio::time::timeout(Duration::from_secs(30), get(r.addr(), path))
            .await
            .unwrap_or_else(|_| panic!("{path} answered in time"));
        assert_eq!(reply.status, 502, "{path}: {}", reply.text());
        assert_eq!(reply.error_code(), "worker_bad_response", "{path}");
        let message = reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            message.contains("1048576-byte limit"),
            "{path}: the message names the limit: {message}"
        );
    }
    r.shutdown(Duration::from_secs(1)).await;
}

/// The health checker reads its probe through the same limit: the endless worker never
/// becomes ready (and the probe ends, so the next one runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_health_answer_fails_the_probe() {
    let url = endless_worker().await;
    let mut cfg = Config::with_workers(Mode::Regular, vec![spec(&url, WorkerType::Regular)]);
    cfg.retry.max_attempts = 1;
    cfg.health.timeout = Duration::from_secs(60);
    cfg.health.interval = Duration::from_secs(1);
    let r = router(cfg).await;
    let worker = r.registry().snapshot().all()[0].clone();
    // Every probe is answered at once with an over-long body; after the first ones ended the
    // worker is still not routable.
    assert!(
        eventually(Duration::from_secs(30), || worker.probed()).await,
        "a probe ended although the body never does"
    );
    assert!(!worker.is_routable());
    let reply = get(r.addr(), "/readiness").await;
    assert_eq!(reply.status, 503);
    r.shutdown(Duration::from_secs(1)).await;
}
