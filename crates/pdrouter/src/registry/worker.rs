//! One registered worker: identity, status, load, breaker and (for Prefill with admission on)
//! its admission slot.
//!
//! Status is written only through [`super::Registry::set_status`], which publishes the event;
//! this module exposes no status setter of its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use arc_swap::ArcSwapOption;
use pdrouter_admission::Slot;
use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;

use super::breaker::Breaker;
use crate::config::WorkerType;

/// Lifecycle status; only `Ready` is routable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum WorkerStatus {
    /// Registered, not yet probed successfully.
    Pending = 0,
    /// Routable.
    Ready = 1,
    /// Failing health checks.
    NotReady = 2,
    /// Failing for a long time.
    Failed = 3,
    /// Being removed; in-flight requests finish, nothing new is sent.
    Draining = 4,
}

impl WorkerStatus {
    pub(crate) fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Ready,
            2 => Self::NotReady,
            3 => Self::Failed,
            4 => Self::Draining,
            _ => Self::Pending,
        }
    }

    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Ready => "ready",
            Self::NotReady => "not_ready",
            Self::Failed => "failed",
            Self::Draining => "draining",
        }
    }
}

/// In-flight load, shared by every registration of the same URL so a replace keeps counts.
#[derive(Debug, Default)]
pub struct LoadCounter(AtomicU64);

impl LoadCounter {
    /// Current load.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Holds `units` of a worker's load; releases them on drop.
#[derive(Debug)]
#[must_use = "the load is released when the guard drops"]
pub struct LoadGuard {
    worker: Arc<Worker>,
    units: u64,
}

impl LoadGuard {
    /// Takes `units` of load on `worker`.
    pub fn new(worker: Arc<Worker>, units: u64) -> Self {
        worker.load.0.fetch_add(units, Ordering::Relaxed);
        worker.load_changed();
        Self { worker, units }
    }

    /// The worker this guard holds load on.
    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.worker.load.0.fetch_sub(self.units, Ordering::Relaxed);
        self.worker.load_changed();
    }
}

/// The model a worker's engine said it serves, and the engine's own description of it.
#[derive(Debug, Clone, PartialEq)]
pub struct ServedModel {
    /// The name clients use (`model` in requests, `id` in `/v1/models`).
    pub id: String,
    /// The engine's `/v1/models` entry for `id`, as reported (empty when it had none).
    pub card: serde_json::Map<String, serde_json::Value>,
    /// When the router learned it (Unix seconds): the `created` of a card without one.
    pub learned_at: u64,
    /// The sampling parameters the engine applies to fields a request leaves unset, as it
    /// reported them (gRPC `GetModelInfo`; empty when it reported none).
    pub sampling_defaults: serde_json::Map<String, serde_json::Value>,
}

impl ServedModel {
    /// A model known by name only, learned now.
    pub fn named(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            card: serde_json::Map::new(),
            sampling_defaults: serde_json::Map::new(),
            learned_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }
}

/// Hook called whenever a worker's load changes (metrics gauge).
pub type LoadHook = Arc<dyn Fn(&Worker) + Send + Sync>;

/// A registered worker.
pub struct Worker {
    pub(crate) id: String,
    /// Shared, so metric labels name the worker without copying the string.
    pub(crate) url: Arc<str>,
    pub(crate) base_url: String,
    /// `base_url` and the key, parsed once for the requests sent to an HTTP worker.
    pub(crate) origin: Option<crate::proxy::client::Origin>,
    pub(crate) worker_type: WorkerType,
    pub(crate) bootstrap_port: Option<u16>,
    pub(crate) bootstrap_host: String,
    pub(crate) dp_rank: Option<u32>,
    pub(crate) api_key: Option<String>,
    pub(crate) status: AtomicU8,
    pub(crate) load: Arc<LoadCounter>,
    pub(crate) breaker: Breaker,
    pub(crate) slot: Option<Arc<Slot>>,
    pub(crate) model: ArcSwapOption<ServedModel>,
    pub(crate) probed: std::sync::atomic::AtomicBool,
    pub(crate) load_hook: Option<LoadHook>,
    /// The metrics' handle on this worker's load series and the count of removals from that
    /// family when it was taken: the load hook sets the series through it, without a label
    /// or a lookup, while no series has been removed since (see the metrics' worker module).
    pub(crate) load_series: parking_lot::Mutex<Option<(u64, Gauge)>>,
    /// The gRPC channel of a `grpc://` worker, shared by its DP-rank entries.
    pub(crate) grpc: Option<std::sync::Arc<crate::grpc::client::WorkerChannel>>,
    /// An HTTP worker's engine: 0 not learned yet (served as SGLang's), 1 SGLang, 2 vLLM.
    pub(crate) http_engine: AtomicU8,
    /// The engine was given (`--runtime`), not to be detected.
    pub(crate) engine_given: bool,
    /// How a vLLM worker's PD pairs move the KV.
    pub(crate) kv_connector: crate::config::KvConnector,
    /// A vLLM Mooncake Prefill's engine ids by DP rank, once its bootstrap server said them.
    pub(crate) engine_ids: ArcSwapOption<Vec<String>>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.id)
            .field("url", &self.url)
            .field("type", &self.worker_type)
            .field("status", &self.status())
            .field("load", &self.load())
            .finish()
    }
}

impl Worker {
    /// Registry id (used by `/workers/{id}`).
    pub fn id(&self) -> &str {
        &self.id
    }
    /// Identity URL as configured (`@rank` appended for a DP rank); the metrics label.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The URL as a shared string (metric labels hold it).
    pub(crate) fn url_shared(&self) -> &Arc<str> {
        &self.url
    }
    /// URL requests are sent to.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }
    /// [`Worker::base_url`] and [`Worker::api_key`], parsed (`None` if either cannot be
    /// sent: requests to the worker then fail as connection failures).
    pub(crate) fn origin(&self) -> Option<&crate::proxy::client::Origin> {
        self.origin.as_ref()
    }
    /// Role.
    pub fn worker_type(&self) -> WorkerType {
        self.worker_type
    }
    /// KV bootstrap port.
    pub fn bootstrap_port(&self) -> Option<u16> {
        self.bootstrap_port
    }
    /// Host part of the URL, sent as `bootstrap_host`.
    pub fn bootstrap_host(&self) -> &str {
        &self.bootstrap_host
    }
    /// DP rank, for a `--dp-aware` rank worker.
    pub fn dp_rank(&self) -> Option<u32> {
        self.dp_rank
    }
    /// Key sent to the worker, if any.
    pub fn api_key(&self) -> Option<&str> {
        self.api_key.as_deref()
    }
    /// Lifecycle status.
    pub fn status(&self) -> WorkerStatus {
        WorkerStatus::from_u8(self.status.load(Ordering::Acquire))
    }
    /// In-flight load.
    pub fn load(&self) -> u64 {
        self.load.get()
    }
    /// Circuit breaker.
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }
    /// Admission slot (Prefill workers with admission on).
    pub fn slot(&self) -> Option<&Arc<Slot>> {
        self.slot.as_ref()
    }
    /// Model id the worker reported, if known.
    pub fn model_id(&self) -> Option<String> {
        self.model.load().as_ref().map(|m| m.id.clone())
    }
    /// What the worker reported about its model, if known.
    pub fn model(&self) -> Option<Arc<ServedModel>> {
        self.model.load_full()
    }
    /// Whether a request for `model` may go here: the worker serves it, or has not said what
    /// it serves (its engine did not answer yet, or reported nothing), so it takes any.
    pub fn serves(&self, model: &str) -> bool {
        self.model.load().as_ref().is_none_or(|m| m.id == model)
    }
    /// Records what the engine reported.
    pub(crate) fn set_model(&self, model: ServedModel) {
        self.model.store(Some(Arc::new(model)));
    }
    /// The gRPC channel, for a `grpc://` worker.
    pub fn grpc(&self) -> Option<&crate::grpc::client::WorkerChannel> {
        self.grpc.as_deref()
    }
    /// A gRPC worker's health within `timeout`: an encode worker's from the standard health
    /// service, the others' from their runtime's `HealthCheck`; `None` for an HTTP worker.
    pub async fn grpc_healthy(&self, timeout: std::time::Duration) -> Option<bool> {
        let ch = self.grpc()?;
        Some(if self.worker_type == crate::config::WorkerType::Encode {
            ch.serving(timeout).await
        } else {
            ch.healthy(timeout).await
        })
    }

    /// An HTTP worker's engine (SGLang's until learned otherwise); `None` for a gRPC worker.
    pub fn http_engine(&self) -> Option<crate::config::HttpEngine> {
        use crate::config::HttpEngine;
        if self.grpc.is_some() {
            return None;
        }
        Some(match self.http_engine.load(Ordering::Acquire) {
            2 => HttpEngine::Vllm,
            _ => HttpEngine::Sglang,
        })
    }

    /// What an HTTP worker's PD partner must share with it; `None` for a gRPC worker.
    pub fn pairing(&self) -> Option<crate::config::HttpPairing> {
        use crate::config::{HttpEngine, HttpPairing};
        self.http_engine().map(|e| match e {
            HttpEngine::Sglang => HttpPairing::Sglang,
            HttpEngine::Vllm => HttpPairing::Vllm(self.kv_connector),
        })
    }

    /// A vLLM worker's KV connector (a gRPC worker's as it reported it, once asked, else the
    /// configured one); `None` for other workers.
    pub fn kv_connector(&self) -> Option<crate::config::KvConnector> {
        if let Some(ch) = self.grpc() {
            let reported = ch.known_vllm_kv().and_then(|k| k.connector);
            return (ch.runtime() == Some(crate::config::Runtime::Vllm))
                .then(|| reported.unwrap_or(self.kv_connector));
        }
        (self.http_engine() == Some(crate::config::HttpEngine::Vllm)).then_some(self.kv_connector)
    }

    /// The engine given for this HTTP worker (not detected), if any.
    pub(crate) fn given_engine(&self) -> Option<crate::config::HttpEngine> {
        self.engine_given.then(|| self.http_engine()).flatten()
    }

    /// The KV connector this worker would use as a vLLM worker.
    pub(crate) fn connector(&self) -> crate::config::KvConnector {
        self.kv_connector
    }

    /// A Mooncake Prefill's engine ids by DP rank, once learned.
    pub(crate) fn engine_ids(&self) -> Option<Arc<Vec<String>>> {
        self.engine_ids.load_full()
    }

    /// Records what a Mooncake Prefill's bootstrap server said.
    pub(crate) fn set_engine_ids(&self, ids: Arc<Vec<String>>) {
        self.engine_ids.store(Some(ids));
    }

    /// Whether the HTTP worker's engine is still to be learned from what it serves.
    pub(crate) fn engine_unknown(&self) -> bool {
        self.grpc.is_none() && self.http_engine.load(Ordering::Acquire) == 0
    }

    /// Records an HTTP worker's engine (once learned, or as given).
    pub(crate) fn set_http_engine(&self, engine: crate::config::HttpEngine) {
        if self.engine_given {
            return;
        }
        self.http_engine
            .store(engine_code(engine), Ordering::Release);
    }

    /// A gRPC worker's runtime, once its health checks learned it.
    pub fn runtime(&self) -> Option<crate::grpc::runtime::Runtime> {
        self.grpc()
            .and_then(crate::grpc::client::WorkerChannel::runtime)
    }
    /// Whether the health checker has finished at least one probe of this worker.
    pub fn probed(&self) -> bool {
        self.probed.load(Ordering::Acquire)
    }

    /// Whether new requests may be sent: ready and breaker not open.
    pub fn is_routable(&self) -> bool {
        self.status() == WorkerStatus::Ready && self.breaker.allows()
    }

    fn load_changed(&self) {
        if let Some(hook) = &self.load_hook {
            hook(self);
        }
    }
}

/// The stored form of an engine (see [`Worker::http_engine`]).
pub(crate) fn engine_code(engine: crate::config::HttpEngine) -> u8 {
    match engine {
        crate::config::HttpEngine::Sglang => 1,
        crate::config::HttpEngine::Vllm => 2,
    }
}

impl pdrouter_policy::WorkerRef for &Worker {
    fn url(&self) -> &str {
        &self.url
    }
    fn load(&self) -> u64 {
        self.load.get()
    }
}

/// Extracts the host of an `http(s)://host[:port]` URL (brackets kept off IPv6).
pub(crate) fn host_of(url: &str) -> String {
    url.parse::<http::Uri>()
        .ok()
        .and_then(|u| u.host().map(|h| h.trim_matches(['[', ']']).to_string()))
        .unwrap_or_default()
}
