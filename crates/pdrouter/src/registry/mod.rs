//! Worker registry: the set of workers, their status, and the events describing every change.
//!
//! Invariants:
//! - Readers load an immutable [`Snapshot`] (`ArcSwap`) and never lock; writers serialise on
//!   one mutex, build a new snapshot and swap it once.
//! - Every change (register, remove, replace, status change, breaker change) goes through
//!   [`Registry::publish`], which calls each listener exactly once per event. Nothing else
//!   writes a worker's status.
//! - Re-registering a URL (replace, or remove then add) keeps its in-flight load counter.
//! - Breaker transitions are applied only here (an outcome in [`Registry::record_outcome`], or
//!   the half-open timer) and each is published once by whoever applied it; readers of a
//!   breaker never change it. When a breaker opens, one timer is armed for its exact
//!   half-open instant; when it fires the worker turns half-open and the event goes out, so
//!   admission waiters are re-evaluated before new arrivals can see the worker as available.

pub mod breaker;
pub mod health;
mod worker;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use pdrouter_admission::Admission;

pub use breaker::{Breaker, BreakerState, Transition};
pub use worker::{LoadCounter, LoadGuard, LoadHook, ServedModel, Worker, WorkerStatus};

use crate::config::{BreakerConfig, WorkerSpec, WorkerType};

/// A change to the worker set.
#[derive(Debug, Clone)]
pub enum Event {
    /// A worker was added.
    Registered(Arc<Worker>),
    /// A worker was removed.
    Removed(Arc<Worker>),
    /// A worker was swapped for a new registration of the same URL.
    Replaced {
        /// The registration that left.
        old: Arc<Worker>,
        /// The registration that took its place.
        new: Arc<Worker>,
    },
    /// A worker's status changed.
    StatusChanged {
        /// The worker.
        worker: Arc<Worker>,
        /// Old status.
        from: WorkerStatus,
        /// New status.
        to: WorkerStatus,
    },
    /// A worker's circuit breaker changed state.
    BreakerChanged {
        /// The worker.
        worker: Arc<Worker>,
        /// New state.
        to: BreakerState,
    },
}

/// Listener called for every event, outside the registry's write lock.
pub type Listener = Arc<dyn Fn(&Event) + Send + Sync>;

/// An immutable view of the worker set, in registration order.
#[derive(Debug, Default)]
pub struct Snapshot {
    all: Vec<Arc<Worker>>,
    prefill: Vec<Arc<Worker>>,
    decode: Vec<Arc<Worker>>,
    regular: Vec<Arc<Worker>>,
    encode: Vec<Arc<Worker>>,
}

impl Snapshot {
    fn build(all: Vec<Arc<Worker>>) -> Self {
        let of = |t| {
            all.iter()
                .filter(|w| w.worker_type == t)
                .cloned()
                .collect::<Vec<_>>()
        };
        Self {
            prefill: of(WorkerType::Prefill),
            decode: of(WorkerType::Decode),
            regular: of(WorkerType::Regular),
            encode: of(WorkerType::Encode),
            all,
        }
    }

    /// Every worker.
    pub fn all(&self) -> &[Arc<Worker>] {
        &self.all
    }

    /// Workers of one type, in registration order (the `X-SMG-Target-Worker` index space).
    pub fn of_type(&self, t: WorkerType) -> &[Arc<Worker>] {
        match t {
            WorkerType::Prefill => &self.prefill,
            WorkerType::Decode => &self.decode,
            WorkerType::Regular => &self.regular,
            WorkerType::Encode => &self.encode,
        }
    }

    /// Looks a worker up by id, or by its URL.
    pub fn find(&self, id_or_url: &str) -> Option<&Arc<Worker>> {
        let trimmed = id_or_url.trim_end_matches('/');
        self.all
            .iter()
            .find(|w| w.id == id_or_url || &*w.url == trimmed)
    }
}

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// The URL is already registered.
    #[error("worker '{0}' is already registered")]
    Duplicate(String),
}

/// The registry.
pub struct Registry {
    snapshot: ArcSwap<Snapshot>,
    write: Mutex<()>,
    listeners: Mutex<Vec<Listener>>,
    next_id: AtomicU64,
    breaker: BreakerConfig,
    admission: Option<Admission>,
    // Load counters by URL, so a URL registered again keeps its in-flight count.
    loads: Mutex<HashMap<String, std::sync::Weak<LoadCounter>>>,
    load_hook: Mutex<Option<LoadHook>>,
    /// The runtime asked first when a gRPC worker's runtime is learned (`--runtime`).
    runtime_hint: Mutex<Option<crate::grpc::runtime::Runtime>>,
    http_engine: Mutex<Option<crate::config::HttpEngine>>,
    kv_connector: Mutex<crate::config::KvConnector>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("workers", &self.snapshot.load().all.len())
            .finish()
    }
}

impl Registry {
    /// An empty registry. With admission, Prefill workers get a ledger slot at registration.
    pub fn new(breaker: BreakerConfig, admission: Option<Admission>) -> Arc<Self> {
        Arc::new(Self {
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            write: Mutex::new(()),
            listeners: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            breaker,
            admission,
            loads: Mutex::new(HashMap::new()),
            load_hook: Mutex::new(None),
            runtime_hint: Mutex::new(None),
            http_engine: Mutex::new(None),
            kv_connector: Mutex::new(crate::config::KvConnector::default()),
        })
    }

    /// The engine of HTTP workers registered afterwards (`--runtime sglang|vllm`), instead
    /// of detecting it, and the KV connector of those that are vLLM's (`--kv-connector`);
    /// a worker's own spec says otherwise where it does.
    pub fn set_http_engine(
        &self,
        engine: Option<crate::config::HttpEngine>,
        connector: crate::config::KvConnector,
    ) {
        *self.http_engine.lock() = engine;
        *self.kv_connector.lock() = connector;
    }

    /// Sets the runtime asked first for gRPC workers registered afterwards.
    pub fn set_runtime_hint(&self, hint: Option<crate::grpc::runtime::Runtime>) {
        *self.runtime_hint.lock() = hint;
    }

    /// Adds a listener for every later event.
    pub fn subscribe(&self, listener: Listener) {
        self.listeners.lock().push(listener);
    }

    /// Sets the hook called on every load change of workers registered afterwards.
    pub fn set_load_hook(&self, hook: LoadHook) {
        *self.load_hook.lock() = Some(hook);
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> arc_swap::Guard<Arc<Snapshot>> {
        self.snapshot.load()
    }

    fn publish(&self, event: Event) {
        let listeners = self.listeners.lock().clone();
        for l in &listeners {
            l(&event);
        }
    }

    /// The gRPC channel of `spec`'s worker, `None` for an HTTP worker. Built once per
    /// registration and shared by its DP-rank entries: one connection per worker.
    fn channel(&self, spec: &WorkerSpec) -> Option<Arc<crate::grpc::client::WorkerChannel>> {
        crate::config::is_grpc_url(&spec.url).then(|| {
            Arc::new(crate::grpc::client::WorkerChannel::new(
                &spec.url,
                spec.api_key.as_deref(),
                *self.runtime_hint.lock(),
            ))
        })
    }

    fn build(
        &self,
        spec: &WorkerSpec,
        dp_rank: Option<u32>,
        initial: WorkerStatus,
        grpc: Option<Arc<crate::grpc::client::WorkerChannel>>,
    ) -> Arc<Worker> {
        let url = match dp_rank {
            Some(r) => format!("{}@{r}", spec.url),
            None => spec.url.clone(),
        };
        let load = {
            let mut loads = self.loads.lock();
            loads.retain(|_, w| w.strong_count() > 0);
            match loads.get(&url).and_then(|w| w.upgrade()) {
                Some(l) => l,
                None => {
                    let l = Arc::new(LoadCounter::default());
                    loads.insert(url.clone(), Arc::downgrade(&l));
                    l
                }
            }
        };
        let slot = match (&self.admission, spec.worker_type) {
            (Some(a), WorkerType::Prefill) => Some(a.slot(&url)),
            _ => None,
        };
        let id = format!("w{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let given = spec.engine.or(*self.http_engine.lock());
        let kv_connector = spec.kv_connector.unwrap_or(*self.kv_connector.lock());
        Arc::new(Worker {
            id,
            bootstrap_host: worker::host_of(&spec.url),
            url: url.into(),
            base_url: spec.url.clone(),
            origin: crate::proxy::client::Origin::parse(&spec.url, spec.api_key.as_deref()),
            worker_type: spec.worker_type,
            bootstrap_port: spec.bootstrap_port,
            dp_rank,
            api_key: spec.api_key.clone(),
            status: std::sync::atomic::AtomicU8::new(initial as u8),
            load,
            breaker: Breaker::new(self.breaker),
            slot,
            model: Default::default(),
            probed: std::sync::atomic::AtomicBool::new(false),
            load_hook: self.load_hook.lock().clone(),
            load_series: Default::default(),
            grpc,
            http_engine: std::sync::atomic::AtomicU8::new(given.map_or(0, worker::engine_code)),
            engine_given: given.is_some(),
            kv_connector,
            engine_ids: Default::default(),
        })
    }

    /// Registers a worker (one per DP rank when `dp_ranks` is given). Refuses a URL that is
    /// already registered with the same type.
    pub fn register(
        &self,
        spec: &WorkerSpec,
        dp_ranks: Option<u32>,
        initial: WorkerStatus,
    ) -> Result<Vec<Arc<Worker>>, RegisterError> {
        let added = {
            let _w = self.write.lock();
            let cur = self.snapshot.load_full();
            if cur
                .all
                .iter()
                .any(|w| w.base_url == spec.url && w.worker_type == spec.worker_type)
            {
                return Err(RegisterError::Duplicate(spec.url.clone()));
            }
            let added: Vec<Arc<Worker>> = match dp_ranks {
                Some(n) if n > 1 => {
                    let ch = self.channel(spec);
                    (0..n)
                        .map(|r| self.build(spec, Some(r), initial, ch.clone()))
                        .collect()
                }
                _ => vec![self.build(spec, None, initial, self.channel(spec))],
            };
            let mut all = cur.all.clone();
            all.extend(added.iter().cloned());
            self.snapshot.store(Arc::new(Snapshot::build(all)));
            added
        };
        for w in &added {
            self.publish(Event::Registered(w.clone()));
        }
        Ok(added)
    }

    /// Replaces every registration of `spec.url` with `spec.worker_type` (one per DP rank) by
    /// an entry built from `spec`, keeping its rank, status, load counter, admission slot and
    /// model id (the breaker starts closed). Publishes one `Replaced` event per entry and
    /// returns the new entries; none when nothing matched.
    pub fn replace(&self, spec: &WorkerSpec) -> Vec<Arc<Worker>> {
        let pairs = {
            let _w = self.write.lock();
            let cur = self.snapshot.load_full();
            let mut all = cur.all.clone();
            let mut pairs = Vec::new();
            let ch = self.channel(spec);
            for entry in all
                .iter_mut()
                .filter(|w| w.base_url == spec.url && w.worker_type == spec.worker_type)
            {
                let new = self.build(spec, entry.dp_rank, entry.status(), ch.clone());
                new.model.store(entry.model());
                pairs.push((std::mem::replace(entry, new.clone()), new));
            }
            if !pairs.is_empty() {
                self.snapshot.store(Arc::new(Snapshot::build(all)));
            }
            pairs
        };
        pairs
            .into_iter()
            .map(|(old, new)| {
                self.publish(Event::Replaced {
                    old,
                    new: new.clone(),
                });
                new
            })
            .collect()
    }

    /// Marks a worker draining (no new requests), then removes it from the set.
    pub fn remove(&self, id: &str) -> Option<Arc<Worker>> {
        let removed = {
            let _w = self.write.lock();
            let cur = self.snapshot.load_full();
            let w = cur.all.iter().find(|w| w.id == id)?.clone();
            let all: Vec<_> = cur
                .all
                .iter()
                .filter(|x| !Arc::ptr_eq(x, &w))
                .cloned()
                .collect();
            self.snapshot.store(Arc::new(Snapshot::build(all)));
            w
        };
        self.set_status(&removed, WorkerStatus::Draining);
        if let (Some(a), Some(_)) = (&self.admission, removed.slot()) {
            a.forget(removed.url());
        }
        self.publish(Event::Removed(removed.clone()));
        Some(removed)
    }

    /// The only way a worker's status changes; publishes one event when it does.
    pub fn set_status(&self, worker: &Arc<Worker>, to: WorkerStatus) {
        let from = WorkerStatus::from_u8(worker.status.swap(to as u8, Ordering::AcqRel));
        if from != to {
            tracing::info!(worker = %worker.url, from = from.as_str(), to = to.as_str(), "worker status changed");
            self.publish(Event::StatusChanged {
                worker: worker.clone(),
                from,
                to,
            });
        }
    }

    /// Records a request outcome on the worker's breaker, publishing any transition and arming
    /// the half-open timer when it opens.
    pub fn record_outcome(self: &Arc<Self>, worker: &Arc<Worker>, success: bool) {
        if let Some(t) = worker.breaker.record(success) {
            self.breaker_changed(worker, t);
        }
    }

    /// Turns the worker's breaker half-open if its timeout has passed, publishing the change.
    /// The timer armed when the breaker opened calls this at the exact instant; without a Tokio
    /// runtime at that moment nothing could be armed, and calling this is the way to recover.
    pub fn poll_breaker(self: &Arc<Self>, worker: &Arc<Worker>) -> BreakerState {
        if let Some(t) = worker.breaker.half_open_if_due() {
            // A replaced or removed entry's old breaker no longer describes the URL.
            let current = self.snapshot().all.iter().any(|w| Arc::ptr_eq(w, worker));
            if current {
                self.breaker_changed(worker, t);
            }
        }
        worker.breaker.state()
    }

    fn breaker_changed(self: &Arc<Self>, worker: &Arc<Worker>, t: Transition) {
        tracing::warn!(worker = %worker.url, state = t.to.as_str(), "circuit breaker changed");
        if let Some(at) = t.half_open_at {
            self.arm_half_open(worker, at);
        }
        self.publish(Event::BreakerChanged {
            worker: worker.clone(),
            to: t.to,
        });
    }

    fn arm_half_open(self: &Arc<Self>, worker: &Arc<Worker>, at: tokio::time::Instant) {
        let weak = Arc::downgrade(self);
        let w = worker.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    tokio::time::sleep_until(at).await;
                    if let Some(reg) = weak.upgrade() {
                        reg.poll_breaker(&w);
                    }
                });
            }
            Err(_) => tracing::warn!(
                worker = %worker.url,
                "no async runtime to time the breaker; it stays open until polled"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn cfg() -> BreakerConfig {
        BreakerConfig {
            enabled: true,
            failure_threshold: 1,
            success_threshold: 1,
            timeout: Duration::from_secs(5),
            window: Duration::from_secs(120),
        }
    }

    fn spec(url: &str, t: WorkerType) -> WorkerSpec {
        WorkerSpec::new(url, t)
    }

    #[test]
    fn dp_rank_entries_of_a_grpc_worker_share_one_channel() {
        let reg = Registry::new(cfg(), None);
        let ws = reg
            .register(
                &spec("grpc://127.0.0.1:1", WorkerType::Regular),
                Some(2),
                WorkerStatus::Ready,
            )
            .unwrap();
        let (a, b) = (ws[0].grpc.as_ref().unwrap(), ws[1].grpc.as_ref().unwrap());
        assert!(Arc::ptr_eq(a, b));
        let http = reg
            .register(
                &spec("http://127.0.0.1:1", WorkerType::Regular),
                Some(2),
                WorkerStatus::Ready,
            )
            .unwrap();
        assert!(http.iter().all(|w| w.grpc.is_none()));
    }

    fn recorder(reg: &Registry) -> Arc<Mutex<Vec<String>>> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        reg.subscribe(Arc::new(move |e: &Event| {
            let line = match e {
                Event::Registered(w) => format!("registered {}", w.url()),
                Event::Removed(w) => format!("removed {}", w.url()),
                Event::Replaced { new, .. } => format!("replaced {}", new.url()),
                Event::StatusChanged { worker, to, .. } => {
                    format!("status {} {}", worker.url(), to.as_str())
                }
                Event::BreakerChanged { worker, to } => {
                    format!("breaker {} {}", worker.url(), to.as_str())
                }
            };
            s.lock().push(line);
        }));
        seen
    }

    #[tokio::test]
    async fn every_change_publishes_exactly_one_event() {
        let reg = Registry::new(cfg(), None);
        let seen = recorder(&reg);
        let w = reg
            .register(
                &spec("http://a:1", WorkerType::Prefill),
                None,
                WorkerStatus::Pending,
            )
            .unwrap()
            .remove(0);
        reg.set_status(&w, WorkerStatus::Ready);
        reg.set_status(&w, WorkerStatus::Ready);
        assert!(matches!(
            reg.register(&spec("http://a:1", WorkerType::Prefill), None, WorkerStatus::Ready),
            Err(RegisterError::Duplicate(u)) if u == "http://a:1"
        ));
        let _g = LoadGuard::new(w.clone(), 2);
        let new = reg
            .replace(&spec("http://a:1", WorkerType::Prefill))
            .remove(0);
        assert_eq!(new.load(), 2, "replace keeps in-flight load");
        assert_eq!(new.status(), WorkerStatus::Ready, "and its status");
        assert!(
            reg.replace(&spec("http://a:1", WorkerType::Decode))
                .is_empty()
        );
        reg.remove(new.id());
        assert_eq!(
            *seen.lock(),
            vec![
                "registered http://a:1",
                "status http://a:1 ready",
                "replaced http://a:1",
                "status http://a:1 draining",
                "removed http://a:1",
            ]
        );
        assert!(reg.snapshot().all().is_empty());
    }

    #[test]
    fn replace_renews_every_dp_rank_and_keeps_what_requests_hold() {
        let reg = Registry::new(cfg(), None);
        let mut old = spec("http://a:1", WorkerType::Prefill);
        let ranks = reg.register(&old, Some(2), WorkerStatus::Ready).unwrap();
        reg.set_status(&ranks[1], WorkerStatus::NotReady);
        ranks[0].set_model(ServedModel::named("m"));
        let _g = LoadGuard::new(ranks[1].clone(), 3);
        old.bootstrap_port = Some(9100);
        let new = reg.replace(&old);
        let urls: Vec<&str> = new.iter().map(|w| w.url()).collect();
        assert_eq!(urls, ["http://a:1@0", "http://a:1@1"]);
        assert!(new.iter().all(|w| w.bootstrap_port() == Some(9100)));
        assert_eq!(new[0].model_id().as_deref(), Some("m"));
        assert_eq!(new[1].status(), WorkerStatus::NotReady);
        assert_eq!(new[1].load(), 3);
        assert_eq!(new[1].dp_rank(), Some(1));
        let snap = reg.snapshot();
        assert_eq!(snap.all().len(), 2);
        assert!(snap.all().iter().zip(&new).all(|(a, b)| Arc::ptr_eq(a, b)));
    }

    #[tokio::test(start_paused = true)]
    async fn breaker_half_open_is_published_at_its_instant() {
        let reg = Registry::new(cfg(), None);
        let w = reg
            .register(
                &spec("http://a:1", WorkerType::Decode),
                None,
                WorkerStatus::Ready,
            )
            .unwrap()
            .remove(0);
        let seen = recorder(&reg);
        reg.record_outcome(&w, false);
        assert!(!w.is_routable());
        tokio::time::sleep(Duration::from_secs(5)).await;
        tokio::task::yield_now().await;
        assert_eq!(
            *seen.lock(),
            vec!["breaker http://a:1 open", "breaker http://a:1 half_open"]
        );
        assert!(w.is_routable());
    }

    #[tokio::test(start_paused = true)]
    async fn a_removed_workers_breaker_timer_publishes_nothing() {
        let reg = Registry::new(cfg(), None);
        let w = reg
            .register(
                &spec("http://a:1", WorkerType::Decode),
                None,
                WorkerStatus::Ready,
            )
            .unwrap()
            .remove(0);
        let seen = recorder(&reg);
        reg.record_outcome(&w, false);
        reg.remove(w.id());
        tokio::time::sleep(Duration::from_secs(5)).await;
        tokio::task::yield_now().await;
        assert_eq!(
            *seen.lock(),
            vec![
                "breaker http://a:1 open",
                "status http://a:1 draining",
                "removed http://a:1",
            ],
            "no event (and so no metric series) for a worker that is gone"
        );
    }

    #[test]
    fn dp_ranks_register_separately() {
        let reg = Registry::new(cfg(), None);
        let ws = reg
            .register(
                &spec("http://a:1", WorkerType::Prefill),
                Some(2),
                WorkerStatus::Ready,
            )
            .unwrap();
        let urls: Vec<_> = ws.iter().map(|w| w.url().to_string()).collect();
        assert_eq!(urls, vec!["http://a:1@0", "http://a:1@1"]);
        assert_eq!(ws[1].base_url(), "http://a:1");
        assert_eq!(ws[1].dp_rank(), Some(1));
    }
}
