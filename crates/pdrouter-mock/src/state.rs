//! Shared runtime state: knobs ([`MockControls`]) and counters ([`MockStats`]).

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::{oneshot, watch};

use crate::bootstrap::Rooms;
use crate::config::{HttpRuntime, KvConnectorKind, MockConfig, Role};
use crate::engine::Engine;
use crate::kv::KvTable;

/// Snapshot of a worker's request counters (the numbers of `GET /mock/stats`).
///
/// Only generation requests (the POST routes) are counted.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MockStats {
    /// Generation requests received since start.
    pub requests_total: u64,
    /// TCP connections accepted on the worker's port since start (any protocol).
    pub connections_total: u64,
    /// Generation requests whose response is not yet fully sent.
    pub inflight: u64,
    /// High-water mark of `inflight` (see [`MockControls::reset_max_inflight`]).
    pub max_inflight: u64,
    /// The last valid JSON body received by a generation route, if any (in
    /// gRPC mode: the last `GenerateRequest`, decoded to JSON).
    pub last_request: Option<serde_json::Value>,
    /// `Abort` calls received (gRPC mode).
    pub aborts_total: u64,
    /// Multimodal items accepted by `Encode` (encode role).
    pub encode_items_total: u64,
    /// Token ids of the last finished generation (gRPC mode).
    pub last_output_ids: Option<Vec<u32>>,
    /// The headers of the last generation request (names lower-case, every value of a
    /// repeated header in order; values that are not text are lossily decoded).
    pub last_headers: Option<Headers>,
    /// vLLM mode, producer: requests whose KV blocks are held for a consumer now (LMCache:
    /// on the consumer, pushed entries not yet used).
    pub kv_held_requests: u64,
    /// vLLM mode, producer: KV blocks held now.
    pub kv_held_blocks: u64,
    /// vLLM mode, producer: requests whose blocks were held since start (LMCache: pushes the
    /// consumer stored).
    pub kv_produced_total: u64,
    /// vLLM mode, producer: pulls served (held blocks handed to a consumer and freed; LMCache:
    /// pushed entries a consumer request used).
    pub kv_pulled_total: u64,
    /// vLLM mode, producer: held requests freed unpulled (abort timeout, or replaced by a
    /// request with the same id).
    pub kv_expired_total: u64,
    /// vLLM mode, consumer: requests whose prompt KV was pulled from their producer.
    pub kv_relayed_total: u64,
    /// vLLM mode: requests that computed their whole prompt themselves (no
    /// `kv_transfer_params`, or a failed pull).
    pub kv_recomputed_total: u64,
    /// vLLM mode, consumer: pulls that failed (the request was recomputed).
    pub kv_pull_failed_total: u64,
    /// vLLM mode, producer: prefills that ended before their token cap (nothing held).
    pub prefill_early_end_total: u64,
    /// vLLM mode, LMCache producer: prompt KV pushes its peer accepted.
    pub kv_pushed_total: u64,
    /// vLLM mode, LMCache producer: pushes that failed (the answer still succeeded).
    pub kv_push_failed_total: u64,
}

/// Request headers as recorded: name → values in the order received.
pub type Headers = BTreeMap<String, Vec<String>>;

/// A request's headers by name, each name's values in order (lossy UTF-8).
fn headers_of(headers: &axum::http::HeaderMap) -> Headers {
    let mut map = Headers::new();
    for (name, value) in headers {
        map.entry(name.as_str().to_owned())
            .or_default()
            .push(String::from_utf8_lossy(value.as_bytes()).into_owned());
    }
    map
}

/// Runtime knobs of a running worker, shared with its request handlers.
///
/// Every setter takes effect for requests that reach the corresponding
/// decision point afterwards.
/// Renders a recorded request as the JSON `/mock/stats` shows.
pub(crate) type RenderRequest = Arc<dyn Fn() -> Option<serde_json::Value> + Send + Sync>;

/// The last generation request, kept as cheaply as its protocol allows: a large prompt must not
/// cost the mock a JSON encoding per request, or the mock, not the router, would dominate
/// what a benchmark with long prompts measures.
#[derive(Clone)]
enum LastRequest {
    /// A JSON body as received.
    Body(Bytes),
    /// A decoded gRPC request, rendered on demand.
    Decoded(RenderRequest),
}

impl std::fmt::Debug for LastRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Body(b) => f.debug_tuple("Body").field(&b.len()).finish(),
            Self::Decoded(_) => f.write_str("Decoded"),
        }
    }
}

#[derive(Debug)]
pub struct MockControls {
    delay_us: AtomicU64,
    token_interval_us: AtomicU64,
    output_tokens: AtomicU32,
    fail_rate_bits: AtomicU64,
    healthy: AtomicBool,
    garbage: AtomicBool,
    hang: Mutex<Hang>,
    hold_body_open: watch::Sender<bool>,
    requests_total: AtomicU64,
    connections_total: AtomicU64,
    inflight: AtomicU64,
    max_inflight: AtomicU64,
    last_request: Mutex<Option<LastRequest>>,
    aborts_total: AtomicU64,
    encode_items_total: AtomicU64,
    last_output_ids: Mutex<Option<Vec<u32>>>,
    /// Kept as received: made into [`Headers`] only when the stats are read, so recording
    /// costs a request nothing but a lock (a benchmark's fleet serves every request).
    last_headers: Mutex<Option<axum::http::HeaderMap>>,
}

/// The hang switch and the requests it holds, oldest first.
#[derive(Debug, Default)]
struct Hang {
    on: bool,
    held: VecDeque<oneshot::Sender<()>>,
}

fn duration_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl MockControls {
    pub(crate) fn new(cfg: &MockConfig) -> Self {
        MockControls {
            delay_us: AtomicU64::new(duration_us(cfg.delay)),
            token_interval_us: AtomicU64::new(duration_us(cfg.token_interval)),
            output_tokens: AtomicU32::new(cfg.output_tokens),
            fail_rate_bits: AtomicU64::new(clamp_rate(cfg.fail_rate).to_bits()),
            healthy: AtomicBool::new(true),
            garbage: AtomicBool::new(false),
            hang: Mutex::new(Hang::default()),
            hold_body_open: watch::Sender::new(false),
            requests_total: AtomicU64::new(0),
            connections_total: AtomicU64::new(0),
            inflight: AtomicU64::new(0),
            max_inflight: AtomicU64::new(0),
            last_request: Mutex::new(None),
            aborts_total: AtomicU64::new(0),
            encode_items_total: AtomicU64::new(0),
            last_output_ids: Mutex::new(None),
            last_headers: Mutex::new(None),
        }
    }

    /// Sets the time before the first byte of generation responses.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_us.store(duration_us(delay), Ordering::Relaxed);
    }

    /// Current time before the first byte.
    pub fn delay(&self) -> Duration {
        Duration::from_micros(self.delay_us.load(Ordering::Relaxed))
    }

    /// Sets the time between generated tokens.
    pub fn set_token_interval(&self, interval: Duration) {
        self.token_interval_us
            .store(duration_us(interval), Ordering::Relaxed);
    }

    /// Current time between generated tokens.
    pub fn token_interval(&self) -> Duration {
        Duration::from_micros(self.token_interval_us.load(Ordering::Relaxed))
    }

    /// Sets how many tokens a decode/regular worker generates per output.
    pub fn set_output_tokens(&self, tokens: u32) {
        self.output_tokens.store(tokens, Ordering::Relaxed);
    }

    /// Current number of tokens generated per output.
    pub fn output_tokens(&self) -> u32 {
        self.output_tokens.load(Ordering::Relaxed)
    }

    /// Sets the fraction of generation requests answered 500 (clamped to 0..=1;
    /// NaN counts as 0).
    pub fn set_fail_rate(&self, rate: f64) {
        self.fail_rate_bits
            .store(clamp_rate(rate).to_bits(), Ordering::Relaxed);
    }

    /// Current failure fraction.
    pub fn fail_rate(&self) -> f64 {
        f64::from_bits(self.fail_rate_bits.load(Ordering::Relaxed))
    }

    /// `false` makes `/health` and `/health_generate` answer 503.
    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
    }

    /// Whether health probes currently succeed.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// `true` makes generation routes answer 200 with a body that is not JSON.
    pub fn set_garbage(&self, garbage: bool) {
        self.garbage.store(garbage, Ordering::Relaxed);
    }

    /// Whether generation routes currently answer garbage.
    pub fn garbage(&self) -> bool {
        self.garbage.load(Ordering::Relaxed)
    }

    /// `true` makes generation requests wait without answering until the
    /// hang is cleared (they then proceed normally), they are let through by
    /// [`release_hung`](Self::release_hung), or the worker shuts down. An
    /// engine-mode prefill worker holds them while they occupy an engine
    /// running slot (a stalled engine); other workers hold them on arrival.
    pub fn set_hang(&self, hang: bool) {
        let mut h = self.lock_hang();
        h.on = hang;
        if !hang {
            for held in h.held.drain(..) {
                let _ = held.send(());
            }
        }
    }

    /// Whether generation requests currently hang.
    pub fn hang(&self) -> bool {
        self.lock_hang().on
    }

    /// Lets the `n` oldest requests held by the hang proceed, in arrival
    /// order, while the hang stays on (a gate that tests open one request
    /// at a time). Returns how many were let through: fewer than `n` when
    /// fewer are held.
    pub fn release_hung(&self, n: usize) -> usize {
        let mut h = self.lock_hang();
        let mut released = 0;
        while released < n {
            let Some(held) = h.held.pop_front() else {
                break;
            };
            // A request that went away (client gone) is skipped, not counted.
            if held.send(()).is_ok() {
                released += 1;
            }
        }
        released
    }

    /// Requests currently held by the hang.
    pub fn hung(&self) -> usize {
        let mut h = self.lock_hang();
        h.held.retain(|held| !held.is_closed());
        h.held.len()
    }

    fn lock_hang(&self) -> std::sync::MutexGuard<'_, Hang> {
        self.hang.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `true` makes successful generation answers send their whole content and then keep the
    /// body open (never its end) until the switch is cleared or the worker shuts down, like an
    /// engine whose response never finishes.
    pub fn set_hold_body_open(&self, hold: bool) {
        self.hold_body_open.send_replace(hold);
    }

    /// Whether generation answers currently keep their body open.
    pub fn hold_body_open(&self) -> bool {
        *self.hold_body_open.borrow()
    }

    /// Resolves once the hold-body-open switch is cleared (or the worker is gone).
    pub(crate) fn body_released(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.hold_body_open.subscribe();
        async move {
            let _ = rx.wait_for(|hold| !*hold).await;
        }
    }

    /// Resets the `max_inflight` high-water mark to the current `inflight`.
    pub fn reset_max_inflight(&self) {
        let now = self.inflight.load(Ordering::SeqCst);
        self.max_inflight.store(now, Ordering::SeqCst);
    }

    /// Snapshot of the counters.
    pub(crate) fn stats(&self) -> MockStats {
        let last = self
            .last_request
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        MockStats {
            requests_total: self.requests_total.load(Ordering::SeqCst),
            connections_total: self.connections_total.load(Ordering::SeqCst),
            inflight: self.inflight.load(Ordering::SeqCst),
            max_inflight: self.max_inflight.load(Ordering::SeqCst),
            last_request: last.and_then(|r| match r {
                LastRequest::Body(b) => serde_json::from_slice(&b).ok(),
                LastRequest::Decoded(render) => render(),
            }),
            aborts_total: self.aborts_total.load(Ordering::SeqCst),
            encode_items_total: self.encode_items_total.load(Ordering::SeqCst),
            last_output_ids: self
                .last_output_ids
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            last_headers: self
                .last_headers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map(headers_of),
            // Filled by `Shared::stats`, which owns the KV table.
            kv_held_requests: 0,
            kv_held_blocks: 0,
            kv_produced_total: 0,
            kv_pulled_total: 0,
            kv_expired_total: 0,
            kv_relayed_total: 0,
            kv_recomputed_total: 0,
            kv_pull_failed_total: 0,
            prefill_early_end_total: 0,
            kv_pushed_total: 0,
            kv_push_failed_total: 0,
        }
    }

    /// Counts one accepted connection.
    pub(crate) fn record_connection(&self) {
        self.connections_total.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts one `Abort` call.
    pub(crate) fn record_abort(&self) {
        self.aborts_total.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts `n` multimodal items accepted by `Encode`.
    pub(crate) fn record_encode_items(&self, n: u64) {
        self.encode_items_total.fetch_add(n, Ordering::SeqCst);
    }

    /// Records the ids of a finished generation.
    pub(crate) fn record_output(&self, ids: &[u32]) {
        *self
            .last_output_ids
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(ids.to_vec());
    }

    /// Records the last valid JSON body (kept as bytes; parsed on demand).
    pub(crate) fn record_request(&self, body: Bytes) {
        *self.last_request.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(LastRequest::Body(body));
    }

    /// Records the last decoded request, rendered as JSON only when the stats are read.
    pub(crate) fn record_decoded(&self, render: RenderRequest) {
        *self.last_request.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(LastRequest::Decoded(render));
    }

    /// Records the headers of a generation request.
    pub(crate) fn record_headers(&self, headers: axum::http::HeaderMap) {
        let previous = self
            .last_headers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(headers);
        // Dropped outside the lock.
        drop(previous);
    }

    /// Waits while the hang switch is on, until the hang is cleared or this
    /// request is released.
    pub(crate) async fn wait_while_hung(&self) {
        let rx = {
            let mut h = self.lock_hang();
            if !h.on {
                return;
            }
            let (tx, rx) = oneshot::channel();
            h.held.push_back(tx);
            rx
        };
        // The sender lives in `held` until it is used, so this ends only on
        // release (or when the worker's state is dropped at shutdown).
        let _ = rx.await;
    }

    /// Whether this request should fail (random draw against the fail rate).
    pub(crate) fn draw_failure(&self) -> bool {
        let rate = self.fail_rate();
        rate > 0.0 && (rate >= 1.0 || rand::random_bool(rate))
    }

    fn begin(&self) {
        self.requests_total.fetch_add(1, Ordering::SeqCst);
        let now = self.inflight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_inflight.fetch_max(now, Ordering::SeqCst);
    }
}

fn clamp_rate(rate: f64) -> f64 {
    if rate.is_nan() {
        0.0
    } else {
        rate.clamp(0.0, 1.0)
    }
}

/// Everything the request handlers share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) role: Role,
    pub(crate) model: String,
    pub(crate) dp_size: u32,
    /// gRPC mode: the engine protocol spoken ([`GrpcRuntime::Vllm`](crate::config::GrpcRuntime)
    /// for a vLLM gRPC worker, however configured).
    pub(crate) grpc_runtime: crate::config::GrpcRuntime,
    pub(crate) api_key: Option<String>,
    /// gRPC: the default sampling parameters `GetModelInfo` reports (a JSON
    /// object), if any.
    pub(crate) default_sampling_params: Option<String>,
    /// EPD Prefill: bound on the wait for the items' embeddings.
    pub(crate) encode_wait: std::time::Duration,
    pub(crate) controls: MockControls,
    /// Bootstrap rooms whose prefill finished (filled by the engine-mode
    /// prefill and by every gRPC prefill).
    pub(crate) rooms: Arc<Rooms>,
    /// Engine mode, if configured.
    pub(crate) engine: Option<Arc<Engine>>,
    /// HTTP mode: the server imitated.
    pub(crate) http_runtime: HttpRuntime,
    /// The worker's bound address (a vLLM producer names it as `remote_host`/`remote_port`).
    pub(crate) addr: SocketAddr,
    /// vLLM mode: the KV blocks held for consumers and the transfer counters.
    pub(crate) kv: KvTable,
    /// vLLM mode: the KV connector imitated.
    pub(crate) kv_connector: KvConnectorKind,
    /// vLLM mode, LMCache: the consumer this worker pushes to, if any.
    pub(crate) lmcache_peer: Option<String>,
    /// gRPC: the text the model writes instead of the built-in sentence.
    pub(crate) output_text: Option<String>,
}

impl Shared {
    /// The state of a worker configured by `cfg` and bound on `addr`.
    pub(crate) fn new(cfg: &MockConfig, addr: SocketAddr) -> Self {
        let rooms = Arc::new(Rooms::default());
        Shared {
            http_runtime: cfg.http_runtime,
            addr,
            kv: {
                let table = KvTable::new(cfg.kv_abort_timeout, cfg.dp_size);
                // A Mooncake pull for a transfer gone must not wait for it.
                if cfg.kv_connector == KvConnectorKind::Mooncake {
                    table.remember_gone()
                } else {
                    table
                }
            },
            kv_connector: cfg.kv_connector,
            lmcache_peer: cfg.lmcache_peer.clone(),
            output_text: cfg.output_text.clone(),
            role: cfg.role,
            model: cfg.model.clone(),
            dp_size: cfg.dp_size,
            grpc_runtime: cfg.grpc_protocol(),
            api_key: cfg.api_key.clone(),
            default_sampling_params: cfg.default_sampling_params.clone(),
            encode_wait: cfg.encode_wait,
            controls: MockControls::new(cfg),
            engine: cfg
                .engine
                .clone()
                .map(|e| Arc::new(Engine::new(e, Arc::clone(&rooms)))),
            rooms,
        }
    }
}

impl Shared {
    /// The counters of the controls and of the KV table together.
    pub(crate) fn stats(&self) -> MockStats {
        let mut st = self.controls.stats();
        let kv = self.kv.snapshot();
        st.kv_held_requests = kv.held_requests;
        st.kv_held_blocks = kv.held_blocks;
        st.kv_produced_total = kv.produced_total;
        st.kv_pulled_total = kv.pulled_total;
        st.kv_expired_total = kv.expired_total;
        st.kv_relayed_total = kv.relayed_total;
        st.kv_recomputed_total = kv.recomputed_total;
        st.kv_pull_failed_total = kv.pull_failed_total;
        st.prefill_early_end_total = kv.early_end_total;
        st.kv_pushed_total = kv.pushed_total;
        st.kv_push_failed_total = kv.push_failed_total;
        st
    }
}

/// Counts one generation request as in flight until dropped.
#[derive(Debug)]
pub(crate) struct InflightGuard {
    shared: Arc<Shared>,
}

impl InflightGuard {
    /// Counts a new generation request (total and in flight).
    pub(crate) fn begin(shared: &Arc<Shared>) -> Self {
        shared.controls.begin();
        InflightGuard {
            shared: Arc::clone(shared),
        }
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.shared.controls.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}
