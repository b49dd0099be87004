//! Active health checking: one probe loop per registered worker.
//!
//! Rules: a pending worker is probed at once and becomes ready on its first good probe (so a
//! router started against live workers is ready within about a second); a ready worker becomes
//! not ready after `failure_threshold` consecutive failures; a not-ready worker becomes ready
//! after `success_threshold` consecutive successes; after ten times `failure_threshold`
//! consecutive failures a worker is marked failed (still probed, so it can come back).
//! Until a worker has been ready once it is probed every second, so a late starter is picked
//! up quickly whatever the interval. Status changes go through [`Registry::set_status`].
//!
//! Also what the router asks a worker's engine about itself, at startup, on `POST /workers`
//! and with a worker's first good probe: its `dp_size` ([`discover_dp_size`]) and the model
//! it serves ([`learn_model`]).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::AbortHandle;

use super::{Event, Registry, ServedModel, Worker, WorkerStatus};
use crate::config::{HealthConfig, HttpEngine, WorkerSpec, is_grpc_url};
use crate::proxy::client::{UpstreamClient, UpstreamError};

/// Multiple of the failure threshold after which a worker counts as failed.
const FAILED_AFTER_THRESHOLDS: u32 = 10;

/// Consecutive probe results, and what they mean for the status.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProbeCounts {
    successes: u32,
    failures: u32,
}

impl ProbeCounts {
    /// Records one probe and returns the status the worker should move to, if any.
    pub fn record(
        &mut self,
        ok: bool,
        current: WorkerStatus,
        cfg: &HealthConfig,
    ) -> Option<WorkerStatus> {
        if ok {
            self.successes += 1;
            self.failures = 0;
            match current {
                WorkerStatus::Pending => Some(WorkerStatus::Ready),
                WorkerStatus::NotReady | WorkerStatus::Failed
                    if self.successes >= cfg.success_threshold =>
                {
                    Some(WorkerStatus::Ready)
                }
                _ => None,
            }
        } else {
            self.failures += 1;
            self.successes = 0;
            let failed_after = cfg
                .failure_threshold
                .saturating_mul(FAILED_AFTER_THRESHOLDS);
            match current {
                WorkerStatus::Draining => None,
                _ if self.failures >= failed_after && current != WorkerStatus::Failed => {
                    Some(WorkerStatus::Failed)
                }
                WorkerStatus::Ready | WorkerStatus::Pending
                    if self.failures >= cfg.failure_threshold =>
                {
                    Some(WorkerStatus::NotReady)
                }
                _ => None,
            }
        }
    }
}

/// Runs the probe loops.
#[derive(Debug)]
pub struct HealthChecker {
    tasks: Mutex<HashMap<String, AbortHandle>>,
    probed: Arc<tokio::sync::Notify>,
}

impl HealthChecker {
    /// Starts checking every worker registered from now on (and those already registered).
    pub fn start(registry: &Arc<Registry>, client: UpstreamClient, cfg: HealthConfig) -> Arc<Self> {
        let checker = Arc::new(Self {
            tasks: Mutex::new(HashMap::new()),
            probed: Arc::new(tokio::sync::Notify::new()),
        });
        let weak_reg = Arc::downgrade(registry);
        let weak_chk = Arc::downgrade(&checker);
        let spawn = {
            let client = client.clone();
            let cfg = cfg.clone();
            move |reg: &Weak<Registry>, chk: &Arc<HealthChecker>, w: &Arc<Worker>| {
                let Ok(rt) = tokio::runtime::Handle::try_current() else {
                    return;
                };
                let h = rt.spawn(probe_loop(
                    reg.clone(),
                    w.clone(),
                    client.clone(),
                    cfg.clone(),
                    chk.probed.clone(),
                ));
                chk.tasks
                    .lock()
                    .insert(w.id().to_string(), h.abort_handle());
            }
        };
        let spawn2 = spawn.clone();
        registry.subscribe(Arc::new(move |e: &Event| {
            let Some(chk) = weak_chk.upgrade() else {
                return;
            };
            match e {
                Event::Registered(w) => spawn2(&weak_reg, &chk, w),
                Event::Replaced { old, new } => {
                    chk.stop(old.id());
                    spawn2(&weak_reg, &chk, new);
                }
                Event::Removed(w) => chk.stop(w.id()),
                _ => {}
            }
        }));
        let weak_reg = Arc::downgrade(registry);
        for w in registry.snapshot().all() {
            spawn(&weak_reg, &checker, w);
        }
        checker
    }

    /// Waits until every worker registered now has had its first probe, or until `deadline`.
    pub async fn first_round(&self, registry: &Registry, deadline: tokio::time::Instant) {
        loop {
            // Registered before the check, so a probe finishing in between is not missed.
            let probed = self.probed.notified();
            tokio::pin!(probed);
            probed.as_mut().enable();
            if registry.snapshot().all().iter().all(|w| w.probed()) {
                return;
            }
            if tokio::time::timeout_at(deadline, probed).await.is_err() {
                return;
            }
        }
    }

    fn stop(&self, id: &str) {
        if let Some(h) = self.tasks.lock().remove(id) {
            h.abort();
        }
    }
}

impl Drop for HealthChecker {
    fn drop(&mut self) {
        for (_, h) in self.tasks.lock().drain() {
            h.abort();
        }
    }
}

async fn probe_loop(
    reg: Weak<Registry>,
    worker: Arc<Worker>,
    client: UpstreamClient,
    cfg: HealthConfig,
    probed: Arc<tokio::sync::Notify>,
) {
    let url = format!("{}{}", worker.base_url(), cfg.endpoint);
    let mut counts = ProbeCounts::default();
    let mut ever_ready = worker.status() == WorkerStatus::Ready;
    loop {
        let ok = match worker.grpc_healthy(cfg.timeout).await {
            Some(ok) => ok,
            None => match client.get(&url, worker.api_key(), cfg.timeout).await {
                Ok((status, _)) => status.is_success(),
                Err(e) => {
                    tracing::debug!(worker = worker.url(), error = %e, "health probe failed");
                    false
                }
            },
        };
        let Some(registry) = reg.upgrade() else {
            return;
        };
        // Learned before the worker turns ready, so that its first requests already go to
        // the model it serves, spoken to as its engine wants.
        if ok
            && worker.model_id().is_none()
            && let Err(e) = learn_model(&client, &worker, cfg.timeout).await
        {
            tracing::debug!(worker = worker.url(), error = %e, "could not learn the model id");
        }
        if let Some(next) = counts.record(ok, worker.status(), &cfg) {
            registry.set_status(&worker, next);
        }
        worker
            .probed
            .store(true, std::sync::atomic::Ordering::Release);
        probed.notify_waiters();
        ever_ready |= worker.status() == WorkerStatus::Ready;
        drop(registry);
        let wait = if ever_ready {
            cfg.interval
        } else {
            cfg.interval.min(Duration::from_secs(1))
        };
        tokio::time::sleep(wait).await;
    }
}

/// GETs `path` on the worker (with its key) and parses a 2xx JSON answer. A transport failure
/// (unreachable, over-long body) is kept in `failure` (the first one) and reads as no answer.
async fn get_json(
    client: &UpstreamClient,
    worker: &Worker,
    path: &str,
    timeout: Duration,
    failure: &mut Option<UpstreamError>,
) -> Option<serde_json::Value> {
    let url = format!("{}{path}", worker.base_url());
    match client.get(&url, worker.api_key(), timeout).await {
        Ok((s, body)) if s.is_success() => serde_json::from_slice(&body).ok(),
        Ok(_) => None,
        Err(e) => {
            failure.get_or_insert(e);
            None
        }
    }
}

/// Asks a worker for its `dp_size` (for `--dp-aware`); a gRPC worker's runtime is learned
/// with `hint` asked first.
pub async fn discover_dp_size(
    client: &UpstreamClient,
    spec: &WorkerSpec,
    timeout: Duration,
    hint: Option<crate::grpc::runtime::Runtime>,
) -> Option<u32> {
    if is_grpc_url(&spec.url) {
        let ch = crate::grpc::client::WorkerChannel::new(&spec.url, spec.api_key.as_deref(), hint);
        return ch.dp_size(timeout).await;
    }
    let url = format!("{}/get_server_info", spec.url);
    let (status, body) = client
        .get(&url, spec.api_key.as_deref(), timeout)
        .await
        .ok()?;
    if !status.is_success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
    v["dp_size"].as_u64().and_then(|n| u32::try_from(n).ok())
}

/// A new worker's status: pending until probed with health checks on, else ready.
pub(crate) fn initial_status(health: &HealthConfig) -> WorkerStatus {
    if health.enabled {
        WorkerStatus::Pending
    } else {
        WorkerStatus::Ready
    }
}

/// Registers a worker added while the router runs (`POST /workers`, pod discovery): its DP
/// ranks asked first when `dp_aware` (or `--dp-aware`), pending until probed with health
/// checks on, else ready with its model asked at once.
pub(crate) async fn register_running(
    registry: &Registry,
    client: &UpstreamClient,
    cfg: &crate::config::Config,
    spec: &WorkerSpec,
    dp_aware: bool,
) -> Result<Vec<Arc<Worker>>, super::RegisterError> {
    let dp = if dp_aware || cfg.dp_aware {
        discover_dp_size(client, spec, cfg.health.timeout, cfg.grpc_runtime).await
    } else {
        None
    };
    let added = registry.register(spec, dp, initial_status(&cfg.health))?;
    if !cfg.health.enabled {
        learn_models(client, &added, cfg.health.timeout).await;
    }
    Ok(added)
}

/// Asks each worker which model it serves, all at once, for at most `timeout` (2 s at most).
/// A worker that does not answer in time takes requests for any model until it is known.
pub(crate) async fn learn_models(
    client: &UpstreamClient,
    workers: &[Arc<Worker>],
    timeout: Duration,
) {
    let all = workers.iter().map(|w| learn_model(client, w, timeout));
    let bound = timeout.min(Duration::from_secs(2));
    let _ = tokio::time::timeout(bound, futures_util::future::join_all(all)).await;
}

/// Asks the worker's engine which model it serves and records it (see [`served_model`]; a
/// gRPC worker through `GetModelInfo`).
/// Returns the transport failure (e.g. an over-long body) when nothing was learned and a call
/// failed; answers that name no model are not an error.
pub(crate) async fn learn_model(
    client: &UpstreamClient,
    worker: &Worker,
    timeout: Duration,
) -> Result<(), UpstreamError> {
    // An encode worker serves no model of its own (it takes any request's items).
    if worker.worker_type() == crate::config::WorkerType::Encode {
        return Ok(());
    }
    if let Some(ch) = worker.grpc() {
        // gRPC engines name their model through `GetModelInfo`.
        if let Some(info) = ch.model_info(timeout).await {
            let defaults = sampling_defaults(&info);
            let id = if info.served_model_name.is_empty() {
                info.model_path
            } else {
                info.served_model_name
            };
            if !id.is_empty() {
                let mut model = ServedModel::named(&id);
                model.sampling_defaults = defaults;
                worker.set_model(model);
            }
        }
        // A vLLM worker's KV configuration, shown in `/workers` and used by its pairs.
        if ch.runtime() == Some(crate::grpc::runtime::Runtime::Vllm) {
            let _ = ch.vllm_kv(timeout).await;
        }
        return Ok(());
    }
    let mut failure = None;
    let server_info = get_json(client, worker, "/get_server_info", timeout, &mut failure).await;
    let named = server_info.as_ref().is_some_and(|v| {
        text_field(v, "served_model_name").is_some() || text_field(v, "model_path").is_some()
    });
    let model_info = if named {
        None
    } else {
        get_json(client, worker, "/get_model_info", timeout, &mut failure).await
    };
    let models = get_json(client, worker, "/v1/models", timeout, &mut failure).await;
    if worker.engine_unknown() && (server_info.is_some() || models.is_some()) {
        let engine = match engine_of(server_info.as_ref(), models.as_ref()) {
            Some(e) => e,
            None => version_engine(client, worker, timeout).await,
        };
        worker.set_http_engine(engine);
    }
    if let Some(m) = served_model(server_info.as_ref(), model_info.as_ref(), models.as_ref()) {
        worker.set_model(m);
        return Ok(());
    }
    failure.map_or(Ok(()), Err)
}

/// A gRPC engine's default sampling parameters: `default_sampling_params_json`, else
/// `preferred_sampling_params`; a report that is not a JSON object is ignored.
fn sampling_defaults(
    info: &pdrouter_proto::scheduler::GetModelInfoResponse,
) -> serde_json::Map<String, serde_json::Value> {
    [
        &info.default_sampling_params_json,
        &info.preferred_sampling_params,
    ]
    .into_iter()
    .filter(|s| !s.trim().is_empty())
    .find_map(|s| match serde_json::from_str(s) {
        Ok(serde_json::Value::Object(m)) => Some(m),
        _ => {
            tracing::warn!("ignoring default sampling parameters that are not a JSON object");
            None
        }
    })
    .unwrap_or_default()
}

/// The engine an HTTP worker's answers show: vLLM when its `/v1/models` says `owned_by:
/// "vllm"`, SGLang when it serves `/get_server_info`; `None`: ask `/version`.
fn engine_of(
    server_info: Option<&serde_json::Value>,
    models: Option<&serde_json::Value>,
) -> Option<HttpEngine> {
    let owned_by_vllm = models
        .and_then(|m| m.get("data"))
        .and_then(serde_json::Value::as_array)
        .is_some_and(|cards| {
            cards
                .iter()
                .any(|c| text_field(c, "owned_by") == Some("vllm"))
        });
    if owned_by_vllm {
        Some(HttpEngine::Vllm)
    } else if server_info.is_some() {
        Some(HttpEngine::Sglang)
    } else {
        None
    }
}

/// vLLM when the worker serves `GET /version` with a version string (vLLM's server does,
/// SGLang's answers `/get_server_info` instead), else SGLang.
async fn version_engine(client: &UpstreamClient, worker: &Worker, timeout: Duration) -> HttpEngine {
    let mut failure = None;
    let v = get_json(client, worker, "/version", timeout, &mut failure).await;
    if v.as_ref().and_then(|v| text_field(v, "version")).is_some() {
        HttpEngine::Vllm
    } else {
        HttpEngine::Sglang
    }
}

fn text_field<'a>(v: &'a serde_json::Value, key: &str) -> Option<&'a str> {
    v.get(key)
        .and_then(serde_json::Value::as_str)
        .filter(|s| !s.is_empty())
}

/// The model a worker serves, from what its engine reported: `served_model_name`, else
/// `model_path` (from `/get_server_info`, or `/get_model_info`), else the first `/v1/models`
/// entry. The card is the `/v1/models` entry of that id, when there is one.
pub(crate) fn served_model(
    server_info: Option<&serde_json::Value>,
    model_info: Option<&serde_json::Value>,
    models: Option<&serde_json::Value>,
) -> Option<ServedModel> {
    let cards: &[serde_json::Value] = models
        .and_then(|m| m.get("data"))
        .and_then(serde_json::Value::as_array)
        .map_or(&[], Vec::as_slice);
    let id = server_info
        .and_then(|v| text_field(v, "served_model_name"))
        .or_else(|| server_info.and_then(|v| text_field(v, "model_path")))
        .or_else(|| model_info.and_then(|v| text_field(v, "model_path")))
        .or_else(|| cards.first().and_then(|c| text_field(c, "id")))?;
    let mut model = ServedModel::named(id);
    if let Some(serde_json::Value::Object(card)) =
        cards.iter().find(|c| text_field(c, "id") == Some(id))
    {
        model.card = card.clone();
    }
    Some(model)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> HealthConfig {
        HealthConfig {
            enabled: true,
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            failure_threshold: 2,
            success_threshold: 2,
            endpoint: "/health".into(),
        }
    }

    #[test]
    fn the_model_comes_from_served_name_then_path_then_the_model_list() {
        use serde_json::json;
        let list = json!({"data": [
            {"id": "first", "object": "model", "root": "r1"},
            {"id": "served", "object": "model", "max_model_len": 4096},
        ]});
        let info = json!({"served_model_name": "served", "model_path": "/models/x"});
        let m = served_model(Some(&info), None, Some(&list)).unwrap();
        assert_eq!(m.id, "served");
        assert_eq!(
            m.card["max_model_len"], 4096,
            "the engine's own card is kept"
        );
        let info = json!({"served_model_name": "", "model_path": "/models/x"});
        let m = served_model(Some(&info), None, Some(&list)).unwrap();
        assert_eq!(m.id, "/models/x");
        assert!(m.card.is_empty(), "no card of that id");
        let m = served_model(None, Some(&json!({"model_path": "/p"})), Some(&list)).unwrap();
        assert_eq!(m.id, "/p");
        let m = served_model(Some(&json!({})), None, Some(&list)).unwrap();
        assert_eq!((m.id.as_str(), &m.card["root"]), ("first", &json!("r1")));
        assert!(served_model(Some(&json!({"model_path": 3})), None, None).is_none());
        assert!(served_model(None, None, Some(&json!({"data": []}))).is_none());
    }

    #[test]
    fn pending_becomes_ready_on_first_success() {
        let mut c = ProbeCounts::default();
        assert_eq!(
            c.record(true, WorkerStatus::Pending, &cfg()),
            Some(WorkerStatus::Ready)
        );
    }

    #[test]
    fn thresholds_apply_both_ways() {
        let cfg = cfg();
        let mut c = ProbeCounts::default();
        assert_eq!(c.record(false, WorkerStatus::Ready, &cfg), None);
        assert_eq!(
            c.record(false, WorkerStatus::Ready, &cfg),
            Some(WorkerStatus::NotReady)
        );
        assert_eq!(c.record(true, WorkerStatus::NotReady, &cfg), None);
        assert_eq!(
            c.record(true, WorkerStatus::NotReady, &cfg),
            Some(WorkerStatus::Ready)
        );
        // A success in between resets the failure run.
        assert_eq!(c.record(false, WorkerStatus::Ready, &cfg), None);
        assert_eq!(c.record(true, WorkerStatus::Ready, &cfg), None);
        assert_eq!(c.record(false, WorkerStatus::Ready, &cfg), None);
    }

    #[test]
    fn long_dead_worker_becomes_failed_and_can_recover() {
        let cfg = cfg();
        let mut c = ProbeCounts::default();
        let mut status = WorkerStatus::Ready;
        for _ in 0..20 {
            if let Some(s) = c.record(false, status, &cfg) {
                status = s;
            }
        }
        assert_eq!(status, WorkerStatus::Failed);
        c.record(true, status, &cfg);
        assert_eq!(c.record(true, status, &cfg), Some(WorkerStatus::Ready));
    }
}
