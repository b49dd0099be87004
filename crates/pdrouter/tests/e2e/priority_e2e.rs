//! Priority classes end to end, configured through the real command-line flags: the order in
//! which Prefill admission (over HTTP and gRPC workers) and the global limiter (regular mode)
//! serve waiting requests, per-class queue sizes and timeouts from the YAML file, the tenant
//! cap (`--trust-tenant-header`, `--tenant-header-name`, `--priority-scheduler-default-max-class`),
//! lenient header parsing, and the `smg_scheduler_*` metrics.
//!
//! Requests are held with the mock's hang switch and let through one at a time; which request
//! was admitted is read from the prompt the worker received. Waits are for events with a
//! generous deadline; nothing depends on the machine's speed.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;
use pdrouter::cli::{Cli, Command};

const EVENT: Duration = Duration::from_secs(30);

/// The config the flags give, with the mocks' bootstrap ports filled in (the flags cannot know
/// them before the mocks start).
fn config_from(args: &[String], mocks: &[&MockWorker]) -> pdrouter::Config {
    let mut argv = vec!["pdrouter".to_string()];
    argv.extend(args.iter().cloned());
    let Command::Launch(launch) = Cli::try_parse_args(argv).expect("flags parse").command else {
        panic!("launch expected");
    };
    let mut cfg = launch.into_config().expect("flags are valid");
    for spec in &mut cfg.workers {
        if let Some(m) = mocks.iter().find(|m| m.url() == spec.url) {
            spec.bootstrap_port = m.bootstrap_addr().map(|a| a.port());
        }
    }
    cfg.health.enabled = false;
    cfg.retry.max_attempts = 1;
    cfg.prometheus = None;
    cfg.port = 0;
    cfg.host = "127.0.0.1".parse().unwrap();
    cfg
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// One engine-mode Prefill and Decode mock and a PD router with admission (limit 1) plus
/// `extra` flags.
async fn pd(t: Transport, extra: &[&str]) -> (MockWorker, MockWorker, pdrouter::RouterHandle) {
    let p = t.engine(Role::Prefill).await;
    let d = t.engine(Role::Decode).await;
    let mut a = args(&[
        "--pd-disaggregation",
        "--prefill",
        &p.url(),
        "--decode",
        &d.url(),
        "--prefill-max-inflight-requests-per-worker",
        "1",
    ]);
    a.extend(args(extra));
    let cfg = config_from(&a, &[&p, &d]);
    let r = router(cfg).await;
    (p, d, r)
}

/// A regular-mode router over `w` with `--max-concurrent-requests 1`, priority classes on,
/// the file holding `yaml`, and `extra` flags.
async fn limiter_router(w: &MockWorker, yaml: &str, extra: &[&str]) -> pdrouter::RouterHandle {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("priority.yaml");
    std::fs::write(&file, yaml).unwrap();
    let mut a = args(&[
        "--worker-urls",
        &w.url(),
        "--max-concurrent-requests",
        "1",
        "--priority-scheduler-enabled",
        "--priority-scheduler-config",
        file.to_str().unwrap(),
    ]);
    a.extend(args(extra));
    // The file is read here, at startup.
    router(config_from(&a, &[w])).await
}

fn chat(content: &str) -> String {
    format!(r#"{{"model":"mock-model","messages":[{{"role":"user","content":"{content}"}}]}}"#)
}

fn spawn_chat(
    addr: SocketAddr,
    content: &str,
    headers: &[(&str, &str)],
) -> tokio::task::JoinHandle<Reply> {
    let body = chat(content);
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::spawn(async move {
        let h: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        send(addr, "POST", "/v1/chat/completions", body, &h).await
    })
}

/// Holds `w` with one request (its hang switch on) and returns that request.
async fn hold(addr: SocketAddr, w: &MockWorker) -> tokio::task::JoinHandle<Reply> {
    w.controls().set_hang(true);
    let holder = spawn_chat(addr, "holder", &[]);
    assert!(eventually(EVENT, || w.controls().hung() == 1).await);
    holder
}

/// A chat request naming `class`, answered.
async fn chat_as(addr: SocketAddr, content: &str, class: &str) -> Reply {
    let headers = [("x-smg-priority", class)];
    send(
        addr,
        "POST",
        "/v1/chat/completions",
        chat(content),
        &headers,
    )
    .await
}

/// Lets the request holding the worker finish and returns the prompt of the one admitted next
/// (which the worker then holds).
async fn next_admitted(w: &MockWorker, requests_before: u64) -> String {
    assert_eq!(w.controls().release_hung(1), 1);
    assert!(
        eventually(EVENT, || w.stats().requests_total == requests_before + 1
            && w.controls().hung() == 1)
        .await
    );
    last_prompt_text(w)
}

both_transports!(
    #[tokio::test]
    admission_serves_the_highest_class_first_then_in_arrival_order,
    per_class_queue_size_and_timeout_come_from_the_file,
);

async fn admission_serves_the_highest_class_first_then_in_arrival_order(t: Transport) {
    // Without a tenant, a request may use every class up to the default maximum.
    let (p, _d, r) = pd(
        t,
        &[
            "--priority-scheduler-enabled",
            "--priority-scheduler-default-max-class",
            "system",
        ],
    )
    .await;
    let adm = r.admission().unwrap().clone();
    let first = hold(r.addr(), &p).await;
    let mut waiters = Vec::new();
    for (i, (content, class)) in [
        ("bulk-1", "bulk"),
        ("default-1", "default"),
        ("interactive-1", "Interactive"),
        ("unknown-1", "urgent"),
        ("system-1", " SYSTEM "),
        ("interactive-2", "interactive"),
    ]
    .into_iter()
    .enumerate()
    {
        waiters.push(spawn_chat(r.addr(), content, &[("x-smg-priority", class)]));
        assert!(eventually(EVENT, || adm.queued() == i + 1).await);
    }
    assert_eq!(
        metric(&r, "smg_scheduler_queue_depth{class=\"interactive\"}"),
        Some(2.0)
    );
    let mut order = Vec::new();
    for n in 1..=6 {
        order.push(next_admitted(&p, n).await);
    }
    let expected = [
        "system-1",
        "interactive-1",
        "interactive-2",
        "default-1",
        "unknown-1",
        "bulk-1",
    ];
    for (got, want) in order.iter().zip(expected) {
        assert!(got.contains(want), "admitted {order:?}");
    }
    p.controls().set_hang(false);
    assert_eq!(first.await.unwrap().status, 200);
    for w in waiters {
        let reply = w.await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    assert!(eventually(EVENT, || adm.inflight_total() == 0 && adm.queued() == 0).await);
    assert_eq!(
        metric(
            &r,
            "smg_scheduler_admit_total{class=\"interactive\",outcome=\"admitted\"}"
        ),
        Some(2.0)
    );
    assert_eq!(
        metric(
            &r,
            "smg_scheduler_admit_total{class=\"default\",outcome=\"admitted\"}"
        ),
        Some(3.0),
        "holder, default-1 and the unknown value"
    );
    assert_eq!(
        metric(
            &r,
            "smg_scheduler_unknown_priority_value_total{tenant=\"anonymous\"}"
        ),
        Some(1.0)
    );
    for class in ["bulk", "default", "interactive", "system"] {
        let depth = format!("smg_scheduler_queue_depth{{class=\"{class}\"}}");
        let inflight = format!("smg_scheduler_inflight{{class=\"{class}\"}}");
        assert!(eventually(EVENT, || metric(&r, &depth) == Some(0.0)).await);
        assert!(eventually(EVENT, || metric(&r, &inflight) == Some(0.0)).await);
    }
}

async fn per_class_queue_size_and_timeout_come_from_the_file(t: Transport) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("priority.yaml");
    std::fs::write(
        &file,
        "classes:\n  bulk:\n    queue_size: 1\n    queue_timeout_secs: 1\n",
    )
    .unwrap();
    let (p, _d, r) = pd(
        t,
        &[
            "--priority-scheduler-enabled",
            "--priority-scheduler-config",
            file.to_str().unwrap(),
        ],
    )
    .await;
    let adm = r.admission().unwrap().clone();
    assert_eq!(
        metric(&r, "smg_scheduler_queue_size_limit{class=\"bulk\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(&r, "smg_scheduler_queue_size_limit{class=\"default\"}"),
        Some(100.0),
        "--prefill-queue-size's default"
    );
    let first = hold(r.addr(), &p).await;
    let bulk = spawn_chat(r.addr(), "bulk-1", &[("x-smg-priority", "bulk")]);
    assert!(eventually(EVENT, || adm.queued() == 1).await);
    // The bulk queue (1) is full; the default class still queues.
    let full = chat_as(r.addr(), "bulk-2", "bulk").await;
    assert_eq!(full.status, 429);
    assert_eq!(full.error_code(), "pd_prefill_queue_full");
    let default = spawn_chat(r.addr(), "default-1", &[]);
    // The bulk waiter times out after its class's 1 s, not the default 60 s.
    let timed_out = bulk.await.unwrap();
    assert_eq!(timed_out.status, 429);
    assert_eq!(timed_out.error_code(), "pd_prefill_queue_timeout");
    assert!(timed_out.header("retry-after").is_some());
    assert!(eventually(EVENT, || adm.queued() == 1).await);
    assert!(!default.is_finished());
    p.controls().set_hang(false);
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(default.await.unwrap().status, 200);
    assert_eq!(
        metric(
            &r,
            "smg_scheduler_admit_total{class=\"bulk\",outcome=\"rejected_queue_full\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &r,
            "smg_scheduler_admit_total{class=\"bulk\",outcome=\"rejected_queue_timeout\"}"
        ),
        Some(1.0)
    );
    assert!(eventually(EVENT, || adm.inflight_total() == 0 && adm.queued() == 0).await);
}

/// `--tenant-header-name`, `--trust-tenant-header`, the file's `tenant_policies` and
/// `--priority-scheduler-default-max-class`: a listed tenant may use its higher class, anyone
/// else is capped at the default maximum (and the cap is counted).
#[tokio::test]
async fn the_tenant_caps_the_class_in_the_global_limiter() {
    let w = mock(Role::Regular, 0).await;
    let r = limiter_router(
        &w,
        "tenant_policies:\n  \"header:vip\":\n    max_class: system\n",
        &[
            "--priority-scheduler-default-max-class",
            "bulk",
            "--trust-tenant-header",
            "--tenant-header-name",
            "x-team",
        ],
    )
    .await;
    let lim = r.limiter().unwrap().clone();
    let first = hold(r.addr(), &w).await;
    // Oldest first: a stranger asking for system (capped to bulk), then the listed tenant
    // asking for default, then an anonymous request (bulk by the default maximum).
    let stranger = spawn_chat(
        r.addr(),
        "stranger",
        &[("x-smg-priority", "system"), ("x-team", "mallory")],
    );
    assert!(eventually(EVENT, || lim.queued() == 1).await);
    let vip = spawn_chat(
        r.addr(),
        "vip",
        &[("x-smg-priority", "default"), ("x-team", "vip")],
    );
    assert!(eventually(EVENT, || lim.queued() == 2).await);
    let anonymous = spawn_chat(r.addr(), "anonymous", &[("x-smg-tenant-id", "vip")]);
    assert!(eventually(EVENT, || lim.queued() == 3).await);
    let order = [
        next_admitted(&w, 1).await,
        next_admitted(&w, 2).await,
        next_admitted(&w, 3).await,
    ];
    assert!(order[0].contains("vip"), "{order:?}");
    assert!(order[1].contains("stranger"), "{order:?}");
    assert!(order[2].contains("anonymous"), "{order:?}");
    w.controls().set_hang(false);
    for h in [first, stranger, vip, anonymous] {
        assert_eq!(h.await.unwrap().status, 200);
    }
    assert_eq!(
        metric(
            &r,
            "smg_scheduler_clamp_total{tenant=\"other\",requested_class=\"system\",effective_class=\"bulk\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &r,
            "smg_scheduler_clamp_total{tenant=\"anonymous\",requested_class=\"default\",effective_class=\"bulk\"}"
        ),
        Some(2.0),
        "the holder and the request whose tenant header is not --tenant-header-name"
    );
    assert!(eventually(EVENT, || lim.inflight() == 0 && lim.queued() == 0).await);
}

/// Without Prefill admission the classes order the global limiter, with its own per-class
/// timeouts (408 as usual) and queue sizes (429); a header value the router cannot read as
/// text is `default`, never an error.
#[tokio::test]
async fn the_global_limiter_orders_by_class_and_bad_header_values_are_default() {
    let w = mock(Role::Regular, 0).await;
    let r = limiter_router(
        &w,
        "classes:\n  bulk:\n    queue_size: 1\n    queue_timeout_secs: 1\n",
        &["--priority-scheduler-default-max-class", "interactive"],
    )
    .await;
    let lim = r.limiter().unwrap().clone();
    let first = hold(r.addr(), &w).await;
    let bulk = spawn_chat(r.addr(), "bulk", &[("x-smg-priority", "bulk")]);
    assert!(eventually(EVENT, || lim.queued() == 1).await);
    let full = chat_as(r.addr(), "bulk-2", "bulk").await;
    assert_eq!(full.status, 429);
    assert_eq!(full.error_code(), "rate_limit_exceeded");
    let timed_out = bulk.await.unwrap();
    assert_eq!(timed_out.status, 408);
    assert_eq!(timed_out.error_code(), "queue_timeout");
    // Non-UTF-8 bytes in the header: served as default.
    let odd = tokio::spawn({
        let addr = r.addr();
        async move {
            let req = http::Request::post(format!("http://{addr}/v1/chat/completions"))
                .header("content-type", "application/json")
                .header(
                    "x-smg-priority",
                    http::HeaderValue::from_bytes(b"\xffsystem").unwrap(),
                )
                .body(http_body_util::Full::new(bytes::Bytes::from(chat("odd"))))
                .unwrap();
            client().request(req).await.unwrap().status().as_u16()
        }
    });
    assert!(eventually(EVENT, || lim.queued() == 1).await);
    let inter = spawn_chat(r.addr(), "inter", &[("x-smg-priority", "interactive")]);
    assert!(eventually(EVENT, || lim.queued() == 2).await);
    assert!(next_admitted(&w, 1).await.contains("inter"));
    assert!(next_admitted(&w, 2).await.contains("odd"));
    w.controls().set_hang(false);
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(inter.await.unwrap().status, 200);
    assert_eq!(odd.await.unwrap(), 200);
    assert_eq!(
        metric(
            &r,
            "smg_scheduler_unknown_priority_value_total{tenant=\"anonymous\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &r,
            "smg_scheduler_admit_total{class=\"bulk\",outcome=\"rejected_queue_timeout\"}"
        ),
        Some(1.0)
    );
    assert!(eventually(EVENT, || lim.inflight() == 0 && lim.queued() == 0).await);
}
