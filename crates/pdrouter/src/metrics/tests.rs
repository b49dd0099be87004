//! The exposition is a wire contract: dashboards and alerts read these names, help strings,
//! label sets and buckets. One series of every family is recorded and the whole text is
//! compared with `exposition.golden`; a difference there is a change of the contract, not
//! a refactor. `UPDATE_METRICS_GOLDEN=1 cargo test -p pdrouter --lib metrics` rewrites it.

use std::sync::Arc;
use std::time::Duration;

use pdrouter_admission::{
    Admission, AdmissionConfig, Observer, Priority, PriorityClasses, PriorityOutcome, Rejection,
};

use super::{AfterDecode, KvHandoff, Metrics};
use crate::config::{BreakerConfig, WorkerSpec, WorkerType};
use crate::limiter::LimiterObserver;
use crate::registry::{BreakerState, Event, Registry, Worker, WorkerStatus};

const GOLDEN: &str = include_str!("exposition.golden");

fn worker(registry: &Registry, url: &str, worker_type: WorkerType) -> Arc<Worker> {
    let spec = WorkerSpec::new(url, worker_type);
    registry
        .register(&spec, None, WorkerStatus::Ready)
        .expect("registered")
        .remove(0)
}

/// Records at least one series of every family, with fixed values.
fn populated() -> Arc<Metrics> {
    let m = Metrics::new();
    m.discovery_registered("prefill");
    m.discovery_registered("prefill");
    m.discovery_deregistered("prefill");
    m.discovery_sync_error();
    let admission = Admission::new(
        AdmissionConfig {
            max_inflight_per_worker: 4,
            max_inflight_tokens_per_worker: Some(1000),
            queue_size: 8,
            queue_timeout: Duration::from_secs(60),
            priorities: None,
        },
        m.clone() as Arc<dyn Observer>,
    );
    let breaker = BreakerConfig {
        enabled: true,
        failure_threshold: 1,
        success_threshold: 1,
        timeout: Duration::from_secs(10),
        window: Duration::from_secs(120),
    };
    let registry = Registry::new(breaker, Some(admission));
    let p = worker(&registry, "http://p:1", WorkerType::Prefill);
    let d = worker(&registry, "http://d:1", WorkerType::Decode);
    let e = worker(&registry, "grpc://e:1", WorkerType::Encode);

    let route = "/v1/chat/completions";
    let ms = Duration::from_millis;
    m.http_request(
        &http::Method::POST,
        route,
        http::StatusCode::OK,
        None,
        ms(20),
    );
    m.http_request(
        &http::Method::POST,
        route,
        http::StatusCode::TOO_MANY_REQUESTS,
        Some("queue_full"),
        ms(3),
    );
    m.connection_opened();
    m.routed(route);
    m.route_error(route, "queue_full");
    m.retry(route);

    for w in [&p, &d, &e] {
        m.on_event(&Event::Registered(Arc::clone(w)));
    }
    m.on_event(&Event::StatusChanged {
        worker: Arc::clone(&d),
        from: WorkerStatus::Ready,
        to: WorkerStatus::NotReady,
    });
    m.on_event(&Event::BreakerChanged {
        worker: Arc::clone(&d),
        to: BreakerState::Open,
    });
    m.worker_load(&p);

    m.ttft(ms(150));
    m.prefill_duration(ms(120));
    m.encode_sent(&e);
    m.encode_failed(&e);
    m.prefill_after_decode(AfterDecode::Drained);
    m.kv_handoff(KvHandoff::Recomputed);

    m.inflight_changed(&Arc::from("http://p:1"), 1);
    m.tokens_changed(&Arc::from("http://p:1"), 40);
    m.queued_changed(2);
    Observer::admitted(&*m, ms(7));
    m.rejected(Rejection::QueueTimeout);
    m.admission_limits("http://p:1", 4, Some(1000));

    m.decided(true);
    m.decided(false);
    m.levels(3, 1);
    m.manual_keys(5);

    m.store_share("http://p:1", 2, 4);
    m.store_exchanged(ms(2));
    m.store_failed();
    m.store_lease_age(Some(Duration::from_millis(1500)));

    m.priority_limits(&PriorityClasses::uniform(8, Duration::from_secs(60)));
    m.priority_resolved(&crate::priority::Resolution {
        priority: Priority::Default,
        requested: Priority::System,
        unknown_value: false,
        tenant: "acme",
    });
    m.priority_resolved(&crate::priority::Resolution {
        priority: Priority::Default,
        requested: Priority::Default,
        unknown_value: true,
        tenant: "anonymous",
    });
    Observer::priority_outcome(
        &*m,
        Priority::Interactive,
        PriorityOutcome::Admitted {
            waited: ms(4),
            promoted: true,
        },
    );
    Observer::priority_levels(&*m, Priority::Interactive, 1, 2);
    m
}

/// The exposition with the samples of each family in a fixed order: a family's series come
/// out of a hash map, so they are sorted by their labels (`le` aside, so that a histogram's
/// buckets keep their own order within the stable sort).
fn normalized(text: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let mut samples: Vec<&str> = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            samples.sort_by_key(|l| series_key(l));
            out.append(&mut samples);
            out.push(line);
        } else {
            samples.push(line);
        }
    }
    samples.sort_by_key(|l| series_key(l));
    out.append(&mut samples);
    out.join("\n") + "\n"
}

/// A sample line without its value and its `le` label.
fn series_key(line: &str) -> String {
    let series = line.rsplit_once(' ').map_or(line, |(s, _)| s);
    let at = series.find(",le=\"").or_else(|| series.find("{le=\""));
    match at {
        Some(at) => {
            let value = at + ",le=\"".len();
            let end = series[value..]
                .find('"')
                .map_or(series.len(), |e| value + e + 1);
            format!("{}{}", &series[..at], &series[end..])
        }
        None => series.to_owned(),
    }
}

/// The metric name of a sample line.
fn sample_name(line: &str) -> &str {
    line.split(['{', ' ']).next().unwrap_or_default()
}

#[test]
fn exposition_matches_the_golden_file() {
    let text = normalized(&populated().encode());
    if std::env::var_os("UPDATE_METRICS_GOLDEN").is_some() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/metrics/exposition.golden");
        std::fs::write(path, &text).expect("golden file written");
        return;
    }
    let (want, got): (Vec<_>, Vec<_>) = (GOLDEN.lines().collect(), text.lines().collect());
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(
            w,
            g,
            "line {} of the exposition differs from the golden file",
            i + 1
        );
    }
    assert_eq!(
        want.len(),
        got.len(),
        "the exposition has a different number of lines"
    );
}

#[test]
fn every_registered_family_is_in_the_golden_file() {
    // Families are listed by `# HELP` even with no series; each must also have a sample, so
    // that its label set is pinned too.
    let text = populated().encode();
    for help in text.lines().filter_map(|l| l.strip_prefix("# HELP ")) {
        let name = help.split(' ').next().unwrap_or_default();
        let of_family = |l: &&str| {
            let sample = sample_name(l);
            sample == name
                || ["_total", "_bucket", "_sum", "_count"]
                    .iter()
                    .any(|suffix| sample.strip_suffix(suffix) == Some(name))
        };
        assert!(
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .any(|l| of_family(&l)),
            "{name} has no series in the test exposition"
        );
    }
}

#[test]
fn kept_series_handles_count_into_the_exposed_series() {
    use http::{Method, StatusCode};
    let m = Metrics::new();
    let ok = (StatusCode::OK, None);
    let requests = [
        (Method::POST, "/generate", ok),
        (Method::POST, "/generate", ok),
        (Method::POST, "/generate", ok),
        (Method::GET, "/generate", ok),
        (Method::PUT, "/generate", ok),
        (Method::POST, "/workers", ok),
        (
            Method::POST,
            "/generate",
            (StatusCode::BAD_REQUEST, Some("invalid_request")),
        ),
    ];
    for (method, path, (status, code)) in requests {
        m.http_request(&method, path, status, code, Duration::from_millis(2));
    }
    let text = m.encode();
    for line in [
        r#"smg_http_requests_total{method="POST",path="/generate"} 4"#,
        r#"smg_http_requests_total{method="GET",path="/generate"} 1"#,
        r#"smg_http_requests_total{method="PUT",path="/generate"} 1"#,
        r#"smg_http_requests_total{method="POST",path="/workers"} 1"#,
        r#"smg_http_request_duration_seconds_count{method="POST",path="/generate"} 4"#,
        r#"smg_http_responses_total{status_code="200",error_code="none"} 6"#,
        r#"smg_http_responses_total{status_code="400",error_code="invalid_request"} 1"#,
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} missing from:\n{text}"
        );
    }
    // A route never requested has no series.
    assert!(!text.contains(r#"path="/v1/chat/completions""#));

    // Per-request counters with kept handles: routed requests and PD outcomes.
    for route in ["/generate", "/generate", "/v1/completions", "/workers"] {
        m.routed(route);
    }
    for outcome in [
        AfterDecode::Drained,
        AfterDecode::Drained,
        AfterDecode::Failed,
    ] {
        m.prefill_after_decode(outcome);
    }
    m.kv_handoff(KvHandoff::Relayed);
    m.kv_handoff(KvHandoff::Relayed);
    let text = m.encode();
    for line in [
        r#"smg_router_requests_total{route="/generate"} 2"#,
        r#"smg_router_requests_total{route="/v1/completions"} 1"#,
        r#"smg_router_requests_total{route="/workers"} 1"#,
        r#"smg_pd_prefill_after_decode_total{outcome="drained"} 2"#,
        r#"smg_pd_prefill_after_decode_total{outcome="failed"} 1"#,
        r#"smg_pd_kv_handoffs_total{outcome="relayed"} 2"#,
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} missing from:\n{text}"
        );
    }
    assert!(!text.contains(r#"outcome="aborted""#));
}

/// The line of the load series of `url`, if it is exposed.
fn load_line(m: &Metrics, url: &str) -> Option<String> {
    let prefix = format!(r#"smg_worker_requests_active{{worker="{url}"}} "#);
    m.encode()
        .lines()
        .find(|l| l.starts_with(&prefix))
        .map(str::to_owned)
}

#[test]
fn a_kept_load_handle_is_taken_again_after_its_series_was_removed() {
    use crate::registry::LoadGuard;
    let m = Metrics::new();
    let breaker = BreakerConfig {
        enabled: false,
        failure_threshold: 1,
        success_threshold: 1,
        timeout: Duration::from_secs(10),
        window: Duration::from_secs(120),
    };
    let registry = Registry::new(breaker, None);
    let hook = m.clone();
    registry.set_load_hook(Arc::new(move |w| hook.worker_load(w)));
    let events = m.clone();
    registry.subscribe(Arc::new(move |e| events.on_event(e)));
    let url = "http://p:1";
    let old = worker(&registry, url, WorkerType::Prefill);
    let held = LoadGuard::new(old.clone(), 1);
    assert_eq!(
        load_line(&m, url).as_deref(),
        Some(r#"smg_worker_requests_active{worker="http://p:1"} 1"#)
    );

    // Removed while busy: its series stays; a new registration of the URL shares it (and
    // the URL's load count) and keeps its own handle on it.
    let _ = registry.remove(old.id());
    let new = worker(&registry, url, WorkerType::Prefill);
    drop(LoadGuard::new(new.clone(), 1));
    assert!(load_line(&m, url).is_some_and(|l| l.ends_with(" 1")));

    // The old entry's last request ends: the series goes.
    drop(held);
    assert_eq!(load_line(&m, url), None);

    // The new entry's next request brings it back, not a handle on the removed series.
    let busy = LoadGuard::new(new.clone(), 1);
    assert!(
        load_line(&m, url).is_some_and(|l| l.ends_with(" 1")),
        "{:?}",
        load_line(&m, url)
    );
    drop(busy);
    assert!(load_line(&m, url).is_some_and(|l| l.ends_with(" 0")));
}
