//! Worker lifecycle over real sockets: the /workers API, health checks against killed and
//! restarted workers, circuit breakers, and fault mapping (refused, hung, 500s, garbage).

use std::time::Duration;

use crate::support::*;
use pdrouter::config::WorkerType;

/// Deadline for an event a test waits for; only a broken router takes this long.
const EVENT: Duration = Duration::from_secs(30);

fn fast_health(cfg: &mut pdrouter::Config) {
    cfg.health.enabled = true;
    cfg.health.interval = Duration::from_secs(1);
    cfg.health.timeout = Duration::from_secs(1);
    cfg.health.failure_threshold = 1;
    cfg.health.success_threshold = 1;
}

fn count(r: &pdrouter::RouterHandle) -> usize {
    r.registry().snapshot().all().len()
}

#[tokio::test]
async fn workers_api_add_list_get_delete() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let extra = mock(Role::Prefill, 0).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    fast_health(&mut cfg);
    let r = router(cfg).await;
    let body = format!(
        r#"{{"url":"{}","worker_type":"prefill","bootstrap_port":9001}}"#,
        extra.url()
    );
    let added = post(r.addr(), "/workers", &body).await;
    assert_eq!(added.status, 202, "{}", added.text());
    let id = added.json()["worker_id"].as_str().unwrap().to_string();
    let reg = r.registry().clone();
    let id2 = id.clone();
    assert!(
        eventually(Duration::from_secs(5), || reg
            .snapshot()
            .find(&id2)
            .is_some_and(
                |w| w.status() == pdrouter::registry::WorkerStatus::Ready
            ))
        .await
    );
    let list = get(r.addr(), "/workers").await.json();
    assert_eq!(list["total"], 3);
    assert_eq!(list["stats"]["prefill_count"], 2);
    assert_eq!(list["stats"]["decode_count"], 1);
    assert_eq!(list["stats"]["regular_count"], 0);
    let one = get(r.addr(), &format!("/workers/{id}")).await;
    assert_eq!(one.status, 200);
    let w = one.json();
    assert_eq!(w["url"], extra.url());
    assert_eq!(w["worker_type"], "prefill");
    assert_eq!(w["bootstrap_port"], 9001);
    assert_eq!(w["circuit_breaker"], "closed");
    for key in ["id", "status", "load"] {
        assert!(w.get(key).is_some(), "{key}");
    }
    // Duplicate URL.
    let dup = post(r.addr(), "/workers", &body).await;
    assert_eq!(dup.status, 409);
    dup.error_code();
    // Delete, then it is gone.
    let del = send(r.addr(), "DELETE", &format!("/workers/{id}"), "", &[]).await;
    assert_eq!(del.status, 202);
    assert_eq!(get(r.addr(), &format!("/workers/{id}")).await.status, 404);
    assert_eq!(
        send(r.addr(), "DELETE", "/workers/nope", "", &[])
            .await
            .status,
        404
    );
    assert_eq!(count(&r), 2);
}

#[tokio::test]
async fn invalid_worker_bodies_never_change_the_registry() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let r = router(pd_config(&[&p], &[&d])).await;
    let bad = [
        "{",
        "[]",
        r#"{"worker_type":"prefill"}"#,
        r#"{"url":"ftp://x","worker_type":"prefill"}"#,
        r#"{"url":"http://127.0.0.1:1","worker_type":"chef"}"#,
        r#"{"url":"http://127.0.0.1:1","worker_type":"regular"}"#,
        r#"{"url":"http://127.0.0.1:1"}"#,
        r#"{"url":"http://127.0.0.1:1","worker_type":"prefill","bootstrap_port":70000}"#,
        r#"{"url":"http://127.0.0.1:1","worker_type":"decode","bootstrap_port":80}"#,
        r#"{"url":"http://127.0.0.1:1","worker_type":"prefill","colour":"red"}"#,
        r#"{"url":5,"worker_type":"prefill"}"#,
    ];
    for body in bad {
        let reply = post(r.addr(), "/workers", body).await;
        assert_eq!(reply.status, 400, "{body}: {}", reply.text());
        reply.error_code();
    }
    assert_eq!(count(&r), 2);
}

#[tokio::test]
async fn killed_worker_goes_unhealthy_traffic_moves_and_it_recovers() {
    // p1's port stays reserved while it is down, so nobody else can take it before the restart.
    let reserved = PortReservation::new().unwrap();
    let port = reserved.port();
    let mut first = MockConfig::new(Role::Regular);
    first.port = port;
    let p1 = MockWorker::start(first).await.unwrap();
    let p2 = mock(Role::Regular, 0).await;
    let mut cfg = regular_config(&[&p1, &p2]);
    fast_health(&mut cfg);
    cfg.retry.max_attempts = 1;
    let r = router(cfg).await;
    let reg = r.registry().clone();
    let all_ready = |reg: &std::sync::Arc<pdrouter::registry::Registry>| {
        reg.snapshot().all().iter().all(|w| w.is_routable())
    };
    assert!(eventually(EVENT, || all_ready(&reg)).await);
    p1.shutdown().await;
    let w1 = reg.snapshot().all()[0].clone();
    assert!(eventually(EVENT, || !w1.is_routable()).await);
    for _ in 0..5 {
        assert_eq!(
            post(r.addr(), "/v1/completions", COMPLETION).await.status,
            200
        );
    }
    assert_eq!(
        metric(
            &r,
            &format!("smg_worker_health{{worker=\"http://127.0.0.1:{port}\"}}")
        ),
        Some(0.0)
    );
    // Restart on the same port: the health checker brings it back.
    let mut cfg = MockConfig::new(Role::Regular);
    cfg.port = port;
    let p1 = MockWorker::start(cfg).await.unwrap();
    assert!(eventually(EVENT, || w1.is_routable()).await);
    drop((p1, reserved));
}

/// Two regular mocks behind a round_robin router; the first always fails until told otherwise.
async fn bad_and_good(
    breaker_timeout: Duration,
) -> (MockWorker, MockWorker, pdrouter::RouterHandle) {
    let bad = mock(Role::Regular, 0).await;
    let good = mock(Role::Regular, 0).await;
    bad.controls().set_fail_rate(1.0);
    let mut cfg = regular_config(&[&bad, &good]);
    cfg.breaker.failure_threshold = 2;
    cfg.breaker.success_threshold = 1;
    cfg.breaker.timeout = breaker_timeout;
    cfg.policy = pdrouter_policy::PolicyKind::RoundRobin;
    let r = router(cfg).await;
    (bad, good, r)
}

#[tokio::test]
async fn breaker_opens_on_failures_and_moves_traffic() {
    // An hour: the breaker cannot turn half-open during the test, however slow the machine.
    let (bad, _good, r) = bad_and_good(Duration::from_secs(3600)).await;
    let w = r.registry().snapshot().all()[0].clone();
    for _ in 0..6 {
        let _ = post(r.addr(), "/v1/completions", COMPLETION).await;
    }
    assert_eq!(w.breaker().state(), pdrouter::registry::BreakerState::Open);
    let series = format!("smg_worker_cb_state{{worker=\"{}\"}}", bad.url());
    assert_eq!(metric(&r, &series), Some(1.0));
    let before = bad.stats().requests_total;
    for _ in 0..4 {
        assert_eq!(
            post(r.addr(), "/v1/completions", COMPLETION).await.status,
            200
        );
    }
    assert_eq!(
        bad.stats().requests_total,
        before,
        "open breaker gets no traffic"
    );
}

#[tokio::test]
async fn breaker_turns_half_open_on_its_own_and_a_success_closes_it() {
    let (bad, _good, r) = bad_and_good(Duration::from_secs(1)).await;
    let series = format!("smg_worker_cb_state{{worker=\"{}\"}}", bad.url());
    // Round robin sends every other request to the failing worker: two failures open it.
    for _ in 0..4 {
        let _ = post(r.addr(), "/v1/completions", COMPLETION).await;
    }
    let opens = format!(
        "smg_worker_cb_transitions_total{{worker=\"{}\",to=\"open\"}}",
        bad.url()
    );
    assert!(metric(&r, &opens).unwrap_or(0.0) >= 1.0);
    bad.controls().set_fail_rate(0.0);
    // Half-open is published at its instant (no request needed), then a success closes it.
    assert!(eventually(EVENT, || metric(&r, &series) == Some(2.0)).await);
    for _ in 0..4 {
        assert_eq!(
            post(r.addr(), "/v1/completions", COMPLETION).await.status,
            200
        );
    }
    assert_eq!(metric(&r, &series), Some(0.0));
}

#[tokio::test]
async fn hung_worker_is_a_504_and_500s_a_502() {
    let w = mock(Role::Regular, 0).await;
    let mut cfg = regular_config(&[&w]);
    cfg.request_timeout = Duration::from_secs(1);
    let r = router(cfg).await;
    w.controls().set_hang(true);
    let reply = post(r.addr(), "/v1/completions", COMPLETION).await;
    assert_eq!(reply.status, 504, "{}", reply.text());
    assert_eq!(reply.error_code(), "worker_timeout");
    w.controls().set_hang(false);
    w.controls().set_fail_rate(1.0);
    let reply = post(r.addr(), "/v1/completions", COMPLETION).await;
    assert_eq!(reply.status, 502);
    assert_eq!(reply.error_code(), "worker_error");
    assert!(eventually(Duration::from_secs(5), || total_load(&r) == 0).await);
}

#[tokio::test]
async fn pd_failure_is_charged_to_the_failing_leg_only() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.breaker.failure_threshold = 1;
    let r = router(cfg).await;
    p.controls().set_fail_rate(1.0);
    assert_eq!(
        post(r.addr(), "/v1/chat/completions", CHAT).await.status,
        502
    );
    let snap = r.registry().snapshot();
    let pw = snap.of_type(WorkerType::Prefill)[0].clone();
    let dw = snap.of_type(WorkerType::Decode)[0].clone();
    assert!(
        eventually(Duration::from_secs(5), || pw.breaker().state()
            == pdrouter::registry::BreakerState::Open)
        .await
    );
    assert_eq!(
        dw.breaker().state(),
        pdrouter::registry::BreakerState::Closed
    );
}

#[tokio::test]
async fn a_worker_speaking_garbage_is_a_502() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(b"\x00\x01 this is not http\r\n\r\n").await;
            });
        }
    });
    let mut cfg = pdrouter::Config::with_workers(
        pdrouter::config::Mode::Regular,
        vec![spec(&url, WorkerType::Regular)],
    );
    cfg.health.enabled = false;
    cfg.retry.max_attempts = 1;
    let r = router(cfg).await;
    let reply = post(r.addr(), "/v1/completions", COMPLETION).await;
    assert_eq!(reply.status, 502, "{}", reply.text());
    assert_eq!(reply.error_code(), "worker_bad_response");
    assert!(eventually(Duration::from_secs(5), || total_load(&r) == 0).await);
}

#[tokio::test]
async fn a_router_started_against_live_workers_serves_its_first_request() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.health.enabled = true;
    let r = router(cfg).await;
    // No waiting for readiness: the first probe round ran before the router took traffic.
    let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(get(r.addr(), "/readiness").await.status, 200);
}

#[tokio::test]
async fn workers_api_registers_each_dp_rank() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let mut extra = MockConfig::new(Role::Prefill);
    extra.dp_size = 2;
    let extra = MockWorker::start(extra).await.unwrap();
    let r = router(pd_config(&[&p], &[&d])).await;
    let body = format!(
        r#"{{"url":"{}","worker_type":"prefill","dp_aware":true}}"#,
        extra.url()
    );
    let added = post(r.addr(), "/workers", &body).await;
    assert_eq!(added.status, 202, "{}", added.text());
    assert_eq!(added.json()["worker_ids"].as_array().unwrap().len(), 2);
    let urls: Vec<String> = get(r.addr(), "/workers").await.json()["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["url"].as_str().unwrap().to_string())
        .collect();
    assert!(urls.contains(&format!("{}@0", extra.url())));
    assert!(urls.contains(&format!("{}@1", extra.url())));
}

#[tokio::test]
async fn workers_api_updates_a_worker_in_place() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    // Both legs are held until the update is checked, so the request keeps its slot and load
    // however slowly this machine runs.
    p.controls().set_hang(true);
    d.controls().set_hang(true);
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.admission = admission(1, 4, 30);
    let r = router(cfg).await;
    let snap = r.registry().snapshot();
    let id = snap.of_type(WorkerType::Prefill)[0].id().to_string();
    let decode_id = snap.of_type(WorkerType::Decode)[0].id().to_string();
    let addr = r.addr();
    let put = |id: String, body: &'static str| async move {
        send(addr, "PUT", &format!("/workers/{id}"), body, &[]).await
    };
    // A request holds the only Prefill slot while its worker is updated.
    let first = tokio::spawn(async move { post(addr, "/v1/chat/completions", CHAT).await });
    let adm = r.admission().unwrap().clone();
    assert!(eventually(EVENT, || p.stats().inflight == 1 && d.stats().inflight == 1).await);
    assert_eq!(adm.inflight_total(), 1);
    let reply = put(id.clone(), r#"{"bootstrap_port":9100}"#).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let w = reply.json();
    assert_eq!(w["url"], p.url());
    assert_eq!(w["bootstrap_port"], 9100);
    assert_eq!(w["status"], "ready");
    assert_eq!(
        w["admission_inflight"], 1,
        "the in-flight request keeps its slot"
    );
    assert_eq!(w["load"], 1, "and its load");
    p.controls().set_hang(false);
    d.controls().set_hang(false);
    assert_eq!(first.await.unwrap().status, 200);
    // The next request is sent with the new port; null clears it.
    assert_eq!(post(addr, "/v1/chat/completions", CHAT).await.status, 200);
    assert_eq!(d.stats().last_request.unwrap()["bootstrap_port"], 9100);
    let new_id = w["id"].as_str().unwrap().to_string();
    let reply = put(new_id.clone(), r#"{"bootstrap_port":null}"#).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply.json()["bootstrap_port"].is_null());
    // Bad input is refused and changes nothing.
    let current = || async {
        get(
            addr,
            &format!(
                "/workers/{}",
                p.url().replace(':', "%3A").replace('/', "%2F")
            ),
        )
        .await
        .json()
    };
    let before = current().await;
    for body in [
        "{",
        "[]",
        "{}",
        r#"{"colour":"red"}"#,
        r#"{"bootstrap_port":70000}"#,
        r#"{"bootstrap_port":"9100"}"#,
        r#"{"api_key":""}"#,
        r#"{"api_key":5}"#,
    ] {
        let id = before["id"].as_str().unwrap().to_string();
        let reply = put(id, body).await;
        assert_eq!(reply.status, 400, "{body}: {}", reply.text());
        reply.error_code();
    }
    let reply = put(decode_id, r#"{"bootstrap_port":80}"#).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert_eq!(put("nope".into(), r#"{"api_key":"k"}"#).await.status, 404);
    assert_eq!(current().await, before);
    assert_eq!(count(&r), 2);
    assert!(eventually(Duration::from_secs(5), || total_load(&r) == 0).await);
    assert_eq!(adm.inflight_total(), 0);
}
