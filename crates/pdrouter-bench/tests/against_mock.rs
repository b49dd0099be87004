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
async fn errors_are_counted_by_status_and_extra_fields_are_sent() {
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
    let served = run(o).await.unwrap().summary;
    assert!(served.ok > 0 && served.ok == served.requests, "{served:?}");
    assert_eq!(w.stats().last_request.unwrap()["bootstrap_room"], 1);
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
