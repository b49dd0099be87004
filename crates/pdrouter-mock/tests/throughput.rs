//! Throughput smoke check (ignored by default; run with `--ignored --nocapture`).

mod common;

use std::time::Instant;

use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use pdrouter_mock::{MockConfig, MockWorker, Role};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement, not a check"]
async fn keep_alive_throughput() {
    let w = MockWorker::start(MockConfig::new(Role::Regular))
        .await
        .unwrap();
    let addr = w.addr();
    let per_conn = 5_000;
    let conns = 16;
    let body =
        r#"{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":8}"#;
    let t = Instant::now();
    let tasks: Vec<_> = (0..conns)
        .map(|_| {
            tokio::spawn(async move {
                let (mut sender, _conn) = common::connect(addr).await;
                for _ in 0..per_conn {
                    let req = Request::builder()
                        .method(Method::POST)
                        .uri("/v1/chat/completions")
                        .header("host", addr.to_string())
                        .body(Full::new(bytes::Bytes::from_static(body.as_bytes())))
                        .unwrap();
                    let resp = sender.send_request(req).await.unwrap();
                    assert_eq!(resp.status(), StatusCode::OK);
                    resp.into_body().collect().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let n = per_conn * conns;
    let secs = t.elapsed().as_secs_f64();
    println!("{n} requests in {secs:.2}s = {:.0} req/s", n as f64 / secs);
    assert_eq!(w.stats().requests_total, n as u64);
    w.shutdown().await;
}
