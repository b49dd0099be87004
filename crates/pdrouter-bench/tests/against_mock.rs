//! Black-box: the generator against in-process mock workers on ephemeral
//! ports.

use std::time::Duration;

use pdrouter_bench::{
    Load, LoadOptions, PromptDist, read_csv, render_svg, run, series_from_records, write_csv,
};
use pdrouter_mock::{MockConfig, MockWorker, Role};
use serde_json::json;

fn opts(url: String, load: Load) -> LoadOptions {
    let mut o = LoadOptions::new(url);
    o.load = load;
    o.duration = Duration::from_millis(300);
    o.timeout = Duration::from_secs(20);
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_gets_successful_requests() {
    let w = MockWorker::start(MockConfig::new(Role::Regular))
        .await
        .unwrap();
    let report = run(opts(w.url(), Load::Closed { concurrency: 4 }))
        .await
        .unwrap();
    let s = &report.summary;
    assert!(s.ok > 0, "{s:?}");
    assert_eq!(s.ok, s.requests, "every request succeeds: {s:?}");
    assert_eq!(s.status_counts.get("200"), Some(&s.requests));
    assert_eq!(s.share_429, 0.0);
    assert_eq!(s.concurrency, Some(4));
    assert_eq!(report.records.len(), s.requests);
    assert!(
        report
            .records
            .iter()
            .all(|r| r.ttft_ms.is_some_and(|t| t <= r.latency_ms))
    );
    // The mock counts exactly what was sent, over at most 4 connections at once.
    let stats = w.stats();
    assert_eq!(stats.requests_total, s.requests as u64);
    assert!(stats.max_inflight <= 4, "{stats:?}");
    assert!(stats.last_request.unwrap()["messages"][0]["content"].is_string());
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_streaming_with_heavy_tailed_prompts() {
    let w = MockWorker::start(MockConfig::new(Role::Regular))
        .await
        .unwrap();
    let mut o = opts(w.url(), Load::Open { rate: 200.0 });
    o.stream = true;
    o.prompt_dist = PromptDist::Lognormal;
    o.prompt_mean_tokens = 50;
    o.path = "/v1/completions".to_owned();
    o.label = "open".to_owned();
    let report = run(o).await.unwrap();
    let s = &report.summary;
    assert!(s.ok > 0, "{s:?}");
    assert_eq!(s.mode, "open");
    assert_eq!(s.rate, Some(200.0));
    assert!(
        report
            .records
            .iter()
            .all(|r| r.is_ok() && r.ttft_ms.is_some())
    );
    let lens: std::collections::HashSet<u32> =
        report.records.iter().map(|r| r.prompt_tokens).collect();
    assert!(
        lens.len() > 1 || report.records.len() == 1,
        "prompt lengths vary"
    );
    // The records survive the CSV round trip and plot.
    let mut csv = Vec::new();
    write_csv(&mut csv, &report.records).unwrap();
    let back = read_csv(&csv[..]).unwrap();
    assert_eq!(back.len(), report.records.len());
    let svg = render_svg("t", &series_from_records(&back));
    assert!(svg.contains(&format!("open (n={})", s.ok)), "{svg}");
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_counted_by_status_and_extra_fields_and_headers_are_sent() {
    let w = MockWorker::start(MockConfig::new(Role::Decode))
        .await
        .unwrap();
    let mut o = opts(w.url(), Load::Closed { concurrency: 2 });
    o.path = "/generate".to_owned();
    o.duration = Duration::from_millis(100);
    // A decode worker refuses requests without bootstrap_room.
    let refused = run(o.clone()).await.unwrap().summary;
    assert_eq!(refused.ok, 0);
    assert_eq!(refused.status_counts.get("400"), Some(&refused.requests));
    assert!(refused.rejected_latency_ms.count > 0);
    o.extra.insert("bootstrap_room".to_owned(), json!(1));
    o.headers.push((
        "x-smg-priority".parse().unwrap(),
        "interactive".parse().unwrap(),
    ));
    let served = run(o).await.unwrap().summary;
    assert!(served.ok > 0 && served.ok == served.requests, "{served:?}");
    let stats = w.stats();
    assert_eq!(stats.last_request.unwrap()["bootstrap_room"], 1);
    assert_eq!(
        stats.last_headers.unwrap()["x-smg-priority"],
        ["interactive"]
    );
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_target_counts_failures() {
    // Nothing listens on port 0: every connect is refused.
    let url = "http://127.0.0.1:0".to_owned();
    let mut o = opts(url, Load::Closed { concurrency: 1 });
    o.duration = Duration::from_millis(50);
    let s = run(o).await.unwrap().summary;
    assert_eq!(s.ok, 0);
    assert!(s.requests > 0);
    assert_eq!(s.status_counts.get("error"), Some(&s.requests));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_cap_ends_the_run() {
    let w = MockWorker::start(MockConfig::new(Role::Regular))
        .await
        .unwrap();
    for load in [Load::Closed { concurrency: 4 }, Load::Open { rate: 1000.0 }] {
        let before = w.stats().requests_total;
        let mut o = opts(w.url(), load);
        // The cap, not the duration, ends these runs.
        o.duration = Duration::from_secs(3600);
        o.max_requests = Some(10);
        let s = run(o).await.unwrap().summary;
        assert_eq!(s.requests, 10, "{load:?}");
        assert_eq!(s.ok, 10, "{s:?}");
        assert_eq!(w.stats().requests_total - before, 10);
        assert!(
            s.duration_secs < 3600.0,
            "the window is the run, not the hour"
        );
    }
    w.shutdown().await;
}

/// A tiny HTTP/1.1 server that answers each request with the next of `answers` (cycling),
/// each a complete raw response, on keep-alive connections.
async fn canned_server(answers: Vec<String>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let answers = std::sync::Arc::new(answers);
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let (answers, next) = (answers.clone(), next.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    // One request: the head, then content-length bytes of body.
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while buf.len() < head_end + len {
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..head_end + len);
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if s.write_all(answers[i % answers.len()].as_bytes())
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    url
}

/// A 200 event stream with `events` as its body (one chunk).
fn sse_answer(events: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n\
         {:x}\r\n{events}\r\n0\r\n\r\n",
        events.len()
    )
}

fn mixed_answers() -> Vec<String> {
    vec![
        sse_answer("data: {\"text\":\"a\"}\n\ndata: [DONE]\n\n"),
        // The router's way of failing after the head: an error event, then [DONE].
        sse_answer(
            "data: {\"text\":\"a\"}\n\ndata: {\"error\":{\"code\":\"prefill_worker_error\"}}\n\n\
             data: [DONE]\n\n",
        ),
        // Ends cleanly but without [DONE]: cut short.
        sse_answer("data: {\"text\":\"a\"}\n\n"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_complete_streams_without_error_events_are_ok() {
    let url = canned_server(mixed_answers()).await;
    let mut o = opts(url, Load::Closed { concurrency: 1 });
    o.stream = true;
    o.duration = Duration::from_secs(3600);
    o.max_requests = Some(6);
    let report = run(o).await.unwrap();
    let s = &report.summary;
    assert_eq!(s.requests, 6);
    assert_eq!(s.status_counts.get("200"), Some(&6), "{s:?}");
    assert_eq!((s.ok, s.incomplete_2xx), (2, 4), "{s:?}");
    assert!((s.error_rate - 4.0 / 6.0).abs() < 1e-9, "{s:?}");
    // Percentiles over OK requests and over all of them.
    assert_eq!(s.latency_ms.count, 2);
    assert_eq!(s.ttft_ms.count, 2);
    assert_eq!(s.latency_all_ms.count, 6);
    assert_eq!(s.rejected_latency_ms.count, 4);
    let oks: Vec<bool> = report.records.iter().map(|r| r.is_ok()).collect();
    assert_eq!(oks.iter().filter(|ok| **ok).count(), 2);
}

/// Runs the `pdrouter-bench` binary and returns its exit status and stdout.
async fn bench_binary(args: Vec<String>) -> (std::process::ExitStatus, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_pdrouter-bench"))
        .args(args)
        .arg("--quiet")
        .output()
        .await
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exit_status_says_whether_the_run_succeeded() {
    let args = |url: &str, extra: &[&str]| {
        let mut a: Vec<String> = ["--url", url, "--requests", "6", "--stream"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    // Every request fails: non-zero, after printing the summary.
    let failing = MockWorker::start(MockConfig::new(Role::Regular))
        .await
        .unwrap();
    failing.controls().set_fail_rate(1.0);
    let (status, out) = bench_binary(args(&failing.url(), &[])).await;
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(out.contains("kv: "), "{out}");
    failing.shutdown().await;
    // Two of six OK: fine without a limit, a failure above --max-error-rate 0.5.
    let mixed = canned_server(mixed_answers()).await;
    let (status, out) = bench_binary(args(&mixed, &[])).await;
    assert!(status.success(), "{out}");
    let (status, out) = bench_binary(args(&mixed, &["--max-error-rate", "0.5"])).await;
    assert_eq!(status.code(), Some(1), "{out}");
    let (status, out) = bench_binary(args(&mixed, &["--max-error-rate", "0.7"])).await;
    assert!(status.success(), "{out}");
    // A bad rate is a usage error.
    let (status, _) = bench_binary(args(&mixed, &["--max-error-rate", "2"])).await;
    assert_eq!(status.code(), Some(2));
}
