//! Kubernetes pod discovery against a scripted API server on loopback that speaks LIST and
//! WATCH (newline-delimited JSON events, resourceVersion, bookmarks, a 410 that forces a
//! fresh LIST): pods that turn ready become workers, pods that turn not ready, terminate or
//! are deleted stop being ones, annotations give ports, a worker added by hand is never
//! touched, and PD admission keeps working across the churn. The pods are `pdrouter-mock`s.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use parking_lot::Mutex;
use pdrouter::RouterHandle;
use pdrouter::config::{Config, DiscoverySettings, KubeSource, Mode, WorkerType};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::support::*;

const TOKEN: &str = "discovery-test-token";

#[derive(Default)]
struct ApiState {
    /// What a LIST answers.
    pods: Vec<Value>,
    version: u64,
    lists: usize,
    /// Every request's path and query, in order.
    requests: Vec<String>,
    /// The open WATCH of each label selector.
    watches: std::collections::HashMap<String, mpsc::Sender<Result<Bytes, std::io::Error>>>,
    unauthorized: usize,
}

/// The scripted API server.
#[derive(Clone)]
struct Api {
    state: Arc<Mutex<ApiState>>,
    _dir: Arc<tempfile::TempDir>,
    kubeconfig: std::path::PathBuf,
}

async fn serve(State(s): State<Arc<Mutex<ApiState>>>, req: Request) -> Response {
    let pq = req
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    let authorized = req
        .headers()
        .get("authorization")
        .is_some_and(|v| v == format!("Bearer {TOKEN}").as_str());
    let mut st = s.lock();
    st.requests.push(pq.clone());
    if !authorized {
        st.unauthorized += 1;
        return (axum::http::StatusCode::UNAUTHORIZED, "no").into_response();
    }
    let selector = pq
        .split(['?', '&'])
        .find_map(|p| p.strip_prefix("labelSelector="))
        .unwrap_or_default()
        .to_owned();
    if pq.contains("watch=true") {
        let (tx, rx) = mpsc::channel(64);
        st.watches.insert(selector, tx);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        return Body::from_stream(stream).into_response();
    }
    st.lists += 1;
    st.version += 1;
    let body = json!({"kind": "PodList", "apiVersion": "v1",
        "metadata": {"resourceVersion": st.version.to_string()},
        "items": st.pods.iter().filter(|p| format!("app%3D{}", p["metadata"]["labels"]["app"].as_str().unwrap_or_default()) == selector).collect::<Vec<_>>()});
    axum::Json(body).into_response()
}

impl Api {
    async fn start() -> Api {
        let state = Arc::new(Mutex::new(ApiState::default()));
        let app = axum::Router::new()
            .fallback(serve)
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("config");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: test\n\
                 contexts:\n- name: test\n  context: {{cluster: c, user: u}}\n\
                 clusters:\n- name: c\n  cluster: {{server: 'http://{addr}'}}\n\
                 users:\n- name: u\n  user: {{token: {TOKEN}}}\n"
            ),
        )
        .unwrap();
        Api {
            state,
            _dir: Arc::new(dir),
            kubeconfig,
        }
    }

    fn settings(&self, selectors: &[(WorkerType, &str)], port: u16) -> DiscoverySettings {
        DiscoverySettings {
            selectors: selectors
                .iter()
                .map(|(r, app)| (*r, vec![("app".to_owned(), (*app).to_owned())]))
                .collect(),
            port,
            namespace: Some("ml".into()),
            source: KubeSource::File(self.kubeconfig.clone()),
        }
    }

    fn set_pods(&self, pods: Vec<Value>) {
        self.state.lock().pods = pods;
    }

    /// The open WATCH of the pods of app `app`.
    fn watch(&self, app: &str) -> Option<mpsc::Sender<Result<Bytes, std::io::Error>>> {
        let st = self.state.lock();
        st.watches
            .get(&format!("app%3D{app}"))
            .filter(|tx| !tx.is_closed())
            .cloned()
    }

    /// Sends one WATCH event to the watch of `app`'s pods, once one is open.
    async fn event(&self, app: &str, kind: &str, object: Value) {
        let line = format!("{}\n", json!({"type": kind, "object": object}));
        assert!(
            eventually(Duration::from_secs(10), || self.watch(app).is_some()).await,
            "the router opened no watch"
        );
        let sent = self.watch(app).unwrap().send(Ok(Bytes::from(line))).await;
        assert!(sent.is_ok(), "{:?}", self.state.lock().requests);
    }

    /// Ends `app`'s open WATCH (the server's timeout).
    fn end_watch(&self, app: &str) {
        self.state.lock().watches.remove(&format!("app%3D{app}"));
    }

    fn lists(&self) -> usize {
        self.state.lock().lists
    }
}

/// A pod of app `app`, serving when `ready`, at `ip`, with `annotations`.
fn pod(name: &str, app: &str, ready: bool, annotations: Value, version: u32) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "ml", "labels": {"app": app},
            "annotations": annotations, "resourceVersion": version.to_string()},
        "status": {"phase": "Running", "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
    })
}

fn ports(m: &MockWorker) -> Value {
    json!({"smg.ai/worker-ports": m.addr().port().to_string()})
}

fn urls(r: &RouterHandle) -> Vec<String> {
    let snap = r.registry().snapshot();
    let mut u: Vec<String> = snap.all().iter().map(|w| w.base_url().to_owned()).collect();
    u.sort();
    u
}

async fn has(r: &RouterHandle, m: &MockWorker, want: bool) -> bool {
    let url = m.url();
    eventually(Duration::from_secs(10), || urls(r).contains(&url) == want).await
}

#[tokio::test]
async fn pods_become_workers_as_they_turn_ready_and_stop_being_ones() {
    let api = Api::start().await;
    let a = mock(Role::Regular, 0).await;
    let b = mock(Role::Regular, 0).await;
    let by_hand = mock(Role::Regular, 0).await;
    // Pod a listens on the discovery port; pod b names its own.
    api.set_pods(vec![pod("a", "llm", true, json!({}), 1)]);
    let mut cfg = Config::with_workers(Mode::Regular, vec![]);
    cfg.health.enabled = false;
    cfg.discovery = Some(api.settings(&[(WorkerType::Regular, "llm")], a.addr().port()));
    let r = router(cfg).await;
    assert!(has(&r, &a, true).await, "{:?}", urls(&r));
    let reply = post(r.addr(), "/generate", r#"{"text":"hi"}"#).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let added = post(
        r.addr(),
        "/workers",
        &json!({"url": by_hand.url()}).to_string(),
    )
    .await;
    assert_eq!(added.status, 202, "{}", added.text());

    api.event("llm", "ADDED", pod("b", "llm", true, ports(&b), 2))
        .await;
    assert!(has(&r, &b, true).await, "{:?}", urls(&r));
    api.event("llm", "MODIFIED", pod("b", "llm", false, ports(&b), 3))
        .await;
    assert!(has(&r, &b, false).await, "not ready: {:?}", urls(&r));
    api.event("llm", "MODIFIED", pod("b", "llm", true, ports(&b), 4))
        .await;
    assert!(has(&r, &b, true).await, "ready again: {:?}", urls(&r));
    let mut terminating = pod("b", "llm", true, ports(&b), 5);
    terminating["metadata"]["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
    api.event("llm", "MODIFIED", terminating).await;
    assert!(has(&r, &b, false).await, "terminating: {:?}", urls(&r));
    api.event("llm", "MODIFIED", pod("b", "llm", true, ports(&b), 6))
        .await;
    assert!(has(&r, &b, true).await);

    // A bookmark moves the version the next watch starts from.
    api.event(
        "llm",
        "BOOKMARK",
        json!({"metadata": {"resourceVersion": "77"}}),
    )
    .await;
    api.end_watch("llm");
    assert!(
        eventually(Duration::from_secs(10), || {
            api.state
                .lock()
                .requests
                .iter()
                .any(|q| q.contains("watch=true") && q.contains("resourceVersion=77"))
        })
        .await
    );

    // A 410 forces a fresh LIST, reconciled: a is gone from it, b stays.
    api.set_pods(vec![pod("b", "llm", true, ports(&b), 8)]);
    let lists = api.lists();
    api.event(
        "llm",
        "ERROR",
        json!({"kind": "Status", "code": 410, "reason": "Expired"}),
    )
    .await;
    assert!(eventually(Duration::from_secs(10), || api.lists() > lists).await);
    assert!(has(&r, &a, false).await, "{:?}", urls(&r));
    assert!(has(&r, &b, true).await);
    api.event("llm", "DELETED", pod("b", "llm", true, ports(&b), 9))
        .await;
    assert!(has(&r, &b, false).await);
    // The worker added by hand was never touched.
    assert!(urls(&r).contains(&by_hand.url()), "{:?}", urls(&r));

    let st = api.state.lock();
    assert_eq!(
        st.unauthorized, 0,
        "every call carried the kubeconfig's token"
    );
    assert!(
        st.requests
            .iter()
            .all(|q| q.starts_with("/api/v1/namespaces/ml/pods?labelSelector=app%3Dllm")),
        "{:?}",
        st.requests
    );
    drop(st);
    assert_eq!(
        metric(
            &r,
            "smg_discovery_registrations_total{worker_type=\"regular\"}"
        ),
        Some(4.0)
    );
    assert_eq!(
        metric(
            &r,
            "smg_discovery_deregistrations_total{worker_type=\"regular\"}"
        ),
        Some(4.0)
    );
    assert_eq!(
        metric(&r, "smg_discovery_workers{worker_type=\"regular\"}"),
        Some(0.0)
    );
}

#[tokio::test]
async fn pd_admission_holds_across_discovery_churn() {
    let api = Api::start().await;
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let prefill_pod = |ready, v| {
        let mut a = ports(&p);
        a["sglang.ai/bootstrap-port"] = json!("8998");
        pod("prefill-0", "prefill", ready, a, v)
    };
    api.set_pods(vec![
        prefill_pod(true, 1),
        pod("decode-0", "decode", true, ports(&d), 1),
    ]);
    let mut cfg = Config::with_workers(Mode::PdHttp, vec![]);
    cfg.health.enabled = false;
    cfg.admission = admission(1, 8, 10);
    cfg.discovery = Some(api.settings(
        &[
            (WorkerType::Prefill, "prefill"),
            (WorkerType::Decode, "decode"),
        ],
        80,
    ));
    let r = router(cfg).await;
    assert!(
        has(&r, &p, true).await && has(&r, &d, true).await,
        "{:?}",
        urls(&r)
    );
    let prefill = r
        .registry()
        .snapshot()
        .all()
        .iter()
        .find(|w| w.worker_type() == WorkerType::Prefill)
        .map(|w| w.bootstrap_port())
        .unwrap();
    assert_eq!(prefill, Some(8998));
    let reply = post(r.addr(), "/generate", r#"{"text":"hi"}"#).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    // The Prefill pod turns not ready and back: it returns clean, and requests are served.
    api.event("prefill", "MODIFIED", prefill_pod(false, 2))
        .await;
    assert!(has(&r, &p, false).await);
    let reply = post(r.addr(), "/generate", r#"{"text":"hi"}"#).await;
    assert_eq!(reply.status, 503, "no Prefill worker: {}", reply.text());
    api.event("prefill", "MODIFIED", prefill_pod(true, 3)).await;
    assert!(has(&r, &p, true).await);
    for _ in 0..3 {
        let reply = post(r.addr(), "/generate", r#"{"text":"hi"}"#).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    assert!(eventually(Duration::from_secs(10), || total_load(&r) == 0).await);
    let slots: u32 = r
        .registry()
        .snapshot()
        .all()
        .iter()
        .filter_map(|w| w.slot().map(|s| s.inflight()))
        .sum();
    assert_eq!(slots, 0, "every admission slot was released");
}
