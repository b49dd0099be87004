//! Nothing a client sends can grow the number of metric series: methods, paths, statuses and
//! error codes all map onto fixed sets, before and after authentication.

use std::collections::BTreeSet;

use crate::support::*;
use bytes::Bytes;

/// Label sets of one family in a Prometheus exposition (the text between the braces).
fn series(exposition: &str, family: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix(family)?.strip_prefix('{'))
        .filter_map(|l| l.split_once('}').map(|(labels, _)| labels.to_string()))
        .collect()
}

#[tokio::test]
async fn a_thousand_distinct_methods_and_paths_add_no_series() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.api_key = Some("secret".into());
    let r = router(cfg).await;
    for i in 0..1000 {
        let method = format!("M{i}");
        // Without the key: labels are taken before authentication.
        let a = send(r.addr(), &method, "/v1/chat/completions", CHAT, &[]).await;
        assert!((400..500).contains(&a.status), "{method}: {}", a.status);
        let b = send(r.addr(), &method, &format!("/p{i}"), Bytes::new(), &[]).await;
        assert!((400..500).contains(&b.status), "{method}: {}", b.status);
    }
    assert_eq!(get(r.addr(), "/health").await.status, 200);
    let scrape = get(r.metrics_addr().expect("prometheus listener"), "/metrics").await;
    assert_eq!(scrape.status, 200);
    let text = scrape.text();

    let routes = series(&text, "smg_http_requests_total");
    assert_eq!(
        routes,
        BTreeSet::from([
            r#"method="GET",path="/health""#.to_string(),
            r#"method="other",path="/v1/chat/completions""#.to_string(),
            r#"method="other",path="other""#.to_string(),
        ]),
        "{text}"
    );
    let total: f64 = text
        .lines()
        .filter(|l| l.starts_with("smg_http_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(total, 2001.0);
    assert_eq!(
        series(&text, "smg_http_request_duration_seconds_count"),
        routes
    );
    let responses = series(&text, "smg_http_responses_total");
    assert!(
        (2..=4).contains(&responses.len()),
        "statuses and codes: {responses:?}"
    );
    assert_eq!(p.stats().requests_total, 0, "nothing reached a worker");
}
