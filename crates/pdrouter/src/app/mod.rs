//! Composition root: builds the registry, policies, admission, dispatcher and listeners, wires
//! registry events to their listeners, and owns shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

mod store;

use pdrouter_admission::{Admission, AdmissionConfig, Observer, Sharer};
use pdrouter_policy::{Policy, PolicyKind, PolicySettings};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{Config, Mode, WorkerSpec};
use crate::dispatch::Dispatcher;
use crate::http::{AppState, app};
use crate::metrics::Metrics;
use crate::proxy::client::UpstreamClient;
use crate::registry::health::{self, HealthChecker};
use crate::registry::{BreakerState, Event, Registry, WorkerStatus};

/// Why the router could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// A startup worker could not be registered.
    #[error("{0}")]
    Worker(String),
    /// No tokenizer could be loaded (gRPC workers, or prefix_hash given a tokenizer path).
    #[error("{0}")]
    Tokenizer(String),
    /// The admission store client could not be built.
    #[error("{0}")]
    Store(String),
    /// The startup workers were not all ready within `--worker-startup-timeout-secs`.
    #[error("{0}")]
    WorkersNotReady(String),
    /// Pod discovery could not reach its API server's configuration.
    #[error("--service-discovery: {0}")]
    Discovery(String),
}

/// A running router.
#[derive(Debug)]
pub struct RouterHandle {
    addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    state: Arc<AppState>,
    admission: Option<Admission>,
    shutdown: watch::Sender<bool>,
    server: JoinHandle<()>,
    background: Vec<JoinHandle<()>>,
    _health: Option<Arc<HealthChecker>>,
}

impl RouterHandle {
    /// The bound router address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    /// The bound Prometheus address, if enabled.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }
    /// The worker registry.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.state.registry
    }
    /// The admission controller, when admission is on.
    pub fn admission(&self) -> Option<&Admission> {
        self.admission.as_ref()
    }
    /// The admission-store sharer, when `--admission-store` is given.
    pub fn sharer(&self) -> Option<&Arc<Sharer>> {
        self.state.sharer.as_ref()
    }
    /// The global request limiter, when on.
    pub fn limiter(&self) -> Option<&crate::limiter::Limiter> {
        self.state.limiter.as_ref()
    }
    /// Current metrics text.
    pub fn metrics_text(&self) -> String {
        self.state.metrics.encode()
    }

    /// Stops accepting, lets in-flight requests finish for up to `grace`, then stops.
    pub async fn shutdown(self, grace: Duration) {
        self.state.shutting_down.store(true, Ordering::Relaxed);
        let _ = self.shutdown.send(true);
        let mut server = self.server;
        if tokio::time::timeout(grace, &mut server).await.is_err() {
            tracing::warn!("grace period over; closing remaining connections");
            server.abort();
        }
        for b in self.background {
            b.abort();
        }
    }

    /// Waits for SIGTERM or Ctrl-C, then shuts down with the configured grace period.
    pub async fn run_until_signal(self) {
        self.run_until(shutdown_signal()).await;
    }

    /// Serves until `stop` completes, then shuts down as on a signal: stops accepting and
    /// lets in-flight requests finish within the configured grace period. For embedders that
    /// own the process's signals (the Python API stops a router from a method call), and for
    /// a [`shutdown_signal`] taken before the router is announced.
    pub async fn run_until(self, stop: impl std::future::Future<Output = ()>) {
        stop.await;
        tracing::info!("shutdown requested; finishing in-flight requests");
        let grace = self.state.cfg.shutdown_grace;
        self.shutdown(grace).await;
        tracing::info!("stopped");
    }
}

/// Completes on SIGTERM or SIGINT (Ctrl-C). The handlers are installed by this call (it must
/// run inside the Tokio runtime), not when the future is first polled: a signal sent at any
/// time after it returns is seen, so a caller that announces its address after calling it
/// (`entry::run`) shuts down gracefully on a signal sent right after the announcement.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = int.recv() => {}
                        _ = term.recv() => {}
                    }
                }
                (Ok(mut term), Err(_)) => {
                    term.recv().await;
                }
                (Err(_), _) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })
}

/// Subscribes every listener of registry events: metrics, admission waiters, policies.
fn wire_events(
    registry: &Registry,
    metrics: &Arc<Metrics>,
    admission: Option<&Admission>,
    policies: &[Arc<Policy>],
) {
    let m = metrics.clone();
    registry.set_load_hook(Arc::new(move |w| m.worker_load(w)));
    let m = metrics.clone();
    registry.subscribe(Arc::new(move |e| m.on_event(e)));
    if let Some(adm) = admission.cloned() {
        registry.subscribe(Arc::new(move |e: &Event| {
            // An opening breaker removes capacity; everything else may add some.
            if !matches!(
                e,
                Event::BreakerChanged {
                    to: BreakerState::Open,
                    ..
                }
            ) {
                adm.notify();
            }
        }));
    }
    let ps = policies.to_vec();
    registry.subscribe(Arc::new(move |e: &Event| {
        if let Event::Removed(w) = e {
            for p in &ps {
                p.remove_worker(w.url());
            }
        }
    }));
}

/// Waits until every registered worker is ready, reporting progress every check interval;
/// fails once the timeout has passed with some still not ready.
async fn wait_for_ready_workers(
    registry: &Registry,
    wait: crate::config::StartupWait,
) -> Result<(), StartError> {
    let deadline = crate::config::deadline_after(tokio::time::Instant::now(), wait.timeout);
    loop {
        let snap = registry.snapshot();
        let waiting: Vec<String> = snap
            .all()
            .iter()
            .filter(|w| w.status() != WorkerStatus::Ready)
            .map(|w| w.url().to_string())
            .collect();
        if waiting.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(StartError::WorkersNotReady(format!(
                "workers not ready after {}s (--worker-startup-timeout-secs): {}",
                wait.timeout.as_secs(),
                waiting.join(", ")
            )));
        }
        tracing::info!(
            waiting = %waiting.join(", "),
            "waiting for the startup workers to be ready"
        );
        tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + wait.check_interval))
            .await;
    }
}

fn uses_prefix_hash(cfg: &Config) -> bool {
    [cfg.policy, cfg.prefill_policy, cfg.decode_policy].contains(&PolicyKind::PrefixHash)
}

/// How image parts are served: in EPD mode, for the vision model recognised in the model
/// directory (`--model-path`, else `--tokenizer-path`'s directory, else the tokenizer bundle a
/// worker sent); a vision model whose files are broken stops the router.
fn image_support(
    cfg: &Config,
    tokenizer: Option<&crate::grpc::tokenizer::RouterTokenizer>,
) -> Result<crate::images::ImageSupport, StartError> {
    use crate::images::{ImageInputs, ImageSupport};
    if cfg.mode != Mode::EpdGrpc {
        return Ok(ImageSupport::NoEncoders);
    }
    let t = &cfg.tokenizer;
    let dir = match (&t.model_path, &t.tokenizer_path) {
        (Some(m), _) => Some(m.clone()),
        (None, Some(p)) if p.is_dir() => Some(p.clone()),
        (None, Some(p)) => p.parent().map(std::path::Path::to_path_buf),
        (None, None) => tokenizer
            .and_then(|t| t.fetched_dir())
            .map(ToOwned::to_owned),
    };
    let Some(dir) = dir else {
        return Ok(ImageSupport::NotVisionModel);
    };
    match ImageInputs::load(&cfg.images, &dir) {
        Ok(Some(inputs)) => {
            tracing::info!(
                model_type = inputs.model().family().model_type(),
                dir = %dir.display(),
                "image inputs served"
            );
            Ok(ImageSupport::Model(Box::new(inputs)))
        }
        Ok(None) => {
            tracing::info!(
                dir = %dir.display(),
                "not a vision model this router preprocesses for: image inputs are refused"
            );
            Ok(ImageSupport::NotVisionModel)
        }
        Err(e) => Err(StartError::Tokenizer(format!("vision model: {e}"))),
    }
}

/// Says what the tokenizer flags do in this configuration, so they are never silently unused.
fn log_tokenizer_use(cfg: &Config) {
    let given = cfg.tokenizer.tokenizer_path.is_some() || cfg.tokenizer.model_path.is_some();
    if !given || cfg.mode.is_grpc() {
        return;
    }
    if uses_prefix_hash(cfg) {
        tracing::info!(
            "--model-path/--tokenizer-path: prefix_hash keys on the first --prefix-token-count \
             tokens of each prompt"
        );
    } else {
        tracing::warn!(
            "--model-path/--tokenizer-path are used with http:// workers only by the prefix_hash \
             policy, which is not in use: the tokenizer is not loaded"
        );
    }
}

/// Starts the router described by `cfg` (already validated).
pub async fn start(cfg: Config) -> Result<RouterHandle, StartError> {
    let parts = Parts::new(cfg);
    register_startup_workers(&parts).await?;
    let health = await_startup_workers(&parts).await?;
    let tokenizer = load_tokenizer(&parts).await?;
    let images = image_support(&parts.cfg, tokenizer.as_deref())?;
    let mut background = Vec::new();
    let sharer = store::share_through_store(&parts, &mut background).await?;
    spawn_policy_ticks(&parts, &mut background);
    if let Some(d) = &parts.cfg.discovery {
        let sink = crate::discovery::Sink {
            registry: parts.registry.clone(),
            metrics: parts.metrics.clone(),
            client: parts.client.clone(),
            cfg: parts.cfg.clone(),
        };
        background.extend(crate::discovery::spawn(d, sink).map_err(StartError::Discovery)?);
    }
    log_tokenizer_use(&parts.cfg);
    let dispatcher = new_dispatcher(&parts, tokenizer, images);
    let state = new_app_state(&parts, dispatcher, sharer);
    listen(state, parts.admission, background, health).await
}

/// What [`start`] builds before it registers the startup workers, and its later steps share.
struct Parts {
    cfg: Arc<Config>,
    metrics: Arc<Metrics>,
    admission: Option<Admission>,
    sizer: Option<Arc<crate::sizing::Sizer>>,
    registry: Arc<Registry>,
    policies: Policies,
    client: UpstreamClient,
}

impl Parts {
    /// Metrics, admission and its sizer, the registry and the policies, with the registry's
    /// events wired to all of them.
    fn new(cfg: Config) -> Self {
        let cfg = Arc::new(cfg);
        let metrics = new_metrics(&cfg);
        let admission = new_admission(&cfg, &metrics);
        let sizer = new_sizer(&cfg, admission.as_ref(), &metrics);
        let registry = Registry::new(cfg.breaker, admission.clone());
        registry.set_runtime_hint(cfg.grpc_runtime);
        registry.set_http_engine(cfg.http_engine, cfg.kv_connector);
        let policies = Policies::new(&cfg);
        wire_events(&registry, &metrics, admission.as_ref(), &policies.all());
        if let Some(sizer) = &sizer {
            forget_removed_slots(&registry, sizer);
        }
        Self {
            cfg,
            metrics,
            admission,
            sizer,
            registry,
            policies,
            client: UpstreamClient::new(),
        }
    }
}

/// The metrics, knowing the priority classes' limits when there are classes (admission's, else
/// the global limiter's).
fn new_metrics(cfg: &Config) -> Arc<Metrics> {
    let metrics = Metrics::new();
    let classes = cfg.admission.and_then(|a| a.priorities);
    if let Some(classes) = classes.or(cfg.limiter.and_then(|l| l.priorities)) {
        metrics.priority_limits(&classes);
    }
    metrics
}

/// The admission controller, when admission is on.
fn new_admission(cfg: &Config, metrics: &Arc<Metrics>) -> Option<Admission> {
    cfg.admission.map(|a| {
        // With a store, slots admit nothing until the store (or its fallback) gives them a
        // share; the sharer is the only one to set their limits.
        let shared = cfg.admission_store.is_some();
        Admission::new(
            AdmissionConfig {
                max_inflight_per_worker: if shared { 0 } else { a.max_inflight_per_worker },
                max_inflight_tokens_per_worker: a
                    .max_inflight_tokens_per_worker
                    .map(|t| if shared { 0 } else { t }),
                queue_size: a.queue_size,
                queue_timeout: a.queue_timeout,
                priorities: a.priorities,
            },
            metrics.clone() as Arc<dyn Observer>,
        )
    })
}

/// The sizer of admission's limits, when they are sized at run time (`auto`).
fn new_sizer(
    cfg: &Config,
    admission: Option<&Admission>,
    metrics: &Arc<Metrics>,
) -> Option<Arc<crate::sizing::Sizer>> {
    let (adm, auto) = (admission?, cfg.admission.and_then(|a| a.auto)?);
    let sizer = crate::sizing::Sizer::new(auto, adm.clone(), metrics.clone());
    Some(Arc::new(sizer))
}

/// The routing policies: `--policy`'s, and the Prefill, Decode and Encode workers' own.
struct Policies {
    policy: Arc<Policy>,
    prefill: Arc<Policy>,
    decode: Arc<Policy>,
    encode: Arc<Policy>,
}

impl Policies {
    fn new(cfg: &Config) -> Self {
        let settings = PolicySettings {
            cache: cfg.cache,
            prefix_hash: cfg.prefix_hash,
            manual: cfg.manual,
        };
        Self {
            policy: Arc::new(Policy::with_settings(cfg.policy, settings)),
            prefill: Arc::new(Policy::with_settings(cfg.prefill_policy, settings)),
            decode: Arc::new(Policy::with_settings(cfg.decode_policy, settings)),
            encode: Arc::new(Policy::with_settings(cfg.encode_policy, settings)),
        }
    }

    fn all(&self) -> Vec<Arc<Policy>> {
        vec![
            self.policy.clone(),
            self.prefill.clone(),
            self.decode.clone(),
            self.encode.clone(),
        ]
    }
}

/// Drops what the sizer learned of a worker once the worker is removed.
fn forget_removed_slots(registry: &Registry, sizer: &Arc<crate::sizing::Sizer>) {
    let sizer = sizer.clone();
    registry.subscribe(Arc::new(move |e: &Event| {
        if let Event::Removed(w) = e
            && let Some(slot) = w.slot()
        {
            sizer.forget(slot.key());
        }
    }));
}

/// Registers the startup workers (`--worker-urls` and the like), each asked for its `dp_size`
/// first with `--dp-aware`; the first that cannot be registered stops the router.
async fn register_startup_workers(parts: &Parts) -> Result<(), StartError> {
    let (cfg, registry, client) = (&parts.cfg, &parts.registry, &parts.client);
    let initial = health::initial_status(&cfg.health);
    for spec in &cfg.workers {
        // `--api-key` is also the key the router presents to its startup workers (unless one
        // has its own), on inference legs, health probes and information calls alike.
        let spec = &WorkerSpec {
            api_key: spec.api_key.clone().or_else(|| cfg.api_key.clone()),
            ..spec.clone()
        };
        let dp = if cfg.dp_aware {
            health::discover_dp_size(client, spec, cfg.health.timeout, cfg.grpc_runtime).await
        } else {
            None
        };
        registry
            .register(spec, dp, initial)
            .map_err(|e| StartError::Worker(e.to_string()))?;
    }
    Ok(())
}

/// Learns the startup workers' models, starts the health checker (when on) and gives its first
/// round a moment, then waits for every worker to be ready when `--worker-startup-timeout-secs`
/// asks to.
async fn await_startup_workers(parts: &Parts) -> Result<Option<Arc<HealthChecker>>, StartError> {
    let (cfg, registry, client) = (&parts.cfg, &parts.registry, &parts.client);
    if !cfg.health.enabled {
        // The health checker learns each worker's model with its first good probe; without
        // it, ask once now (bounded, like the first probe round below).
        health::learn_models(client, registry.snapshot().all(), cfg.health.timeout).await;
    }
    let health = cfg
        .health
        .enabled
        .then(|| HealthChecker::start(registry, client.clone(), cfg.health.clone()));
    if let Some(health) = &health {
        // Give the first probe round a moment before accepting traffic, so a router started
        // against live workers answers its first request instead of a 503. Bounded: a dead or
        // hanging worker only delays startup by this much.
        let deadline = tokio::time::Instant::now() + cfg.health.timeout.min(Duration::from_secs(2));
        health.first_round(registry, deadline).await;
    }
    if let Some(wait) = cfg.startup_wait {
        wait_for_ready_workers(registry, wait).await?;
    }
    Ok(health)
}

/// The router's tokenizer, when something reads one: gRPC workers (which take token ids), or
/// prefix_hash given a tokenizer path.
async fn load_tokenizer(
    parts: &Parts,
) -> Result<Option<Arc<crate::grpc::tokenizer::RouterTokenizer>>, StartError> {
    let cfg = &parts.cfg;
    // With http:// workers only prefix_hash reads a tokenizer: load it just then (a
    // --model-path naming a hub model, fine for SMG, must not stop a router that has no use
    // for it).
    let local_tokenizer = (cfg.tokenizer.tokenizer_path.is_some()
        || cfg.tokenizer.model_path.is_some())
        && uses_prefix_hash(cfg);
    if !(cfg.mode.is_grpc() || local_tokenizer) {
        return Ok(None);
    }
    let workers = parts.registry.snapshot().all().to_vec();
    let channels: Vec<_> = workers
        .iter()
        .filter_map(|w| Some((w.url(), w.grpc()?)))
        .collect();
    let t = crate::grpc::tokenizer::resolve(&cfg.tokenizer, &channels, cfg.health.timeout)
        .await
        .map_err(StartError::Tokenizer)?;
    tracing::info!(origin = %t.origin, "tokenizer loaded");
    Ok(Some(Arc::new(t)))
}

/// The policies' background work: every `--eviction-interval-secs`, eviction (and manual's
/// clock); with bucket policies, their periodic adjustment.
fn spawn_policy_ticks(parts: &Parts, background: &mut Vec<JoinHandle<()>>) {
    let policies = parts.policies.all();
    let ps = policies.clone();
    let metrics_for_keys = parts.metrics.clone();
    let every = parts.cfg.eviction_interval;
    // `sleep` saturates a far deadline; `interval` would panic adding a huge period.
    background.push(tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            // Trimming big trees is plain CPU work: keep it off the request threads.
            let batch = ps.clone();
            let _ = tokio::task::spawn_blocking(move || {
                for p in &batch {
                    p.evict();
                    if p.kind() == PolicyKind::Manual {
                        p.tick(crate::select::policy_clock_secs());
                    }
                }
            })
            .await;
            let keys = ps.iter().map(|p| p.manual_keys()).sum();
            metrics_for_keys.manual_keys(keys);
        }
    }));
    let buckets: Vec<Arc<Policy>> = policies
        .iter()
        .filter(|p| p.kind() == PolicyKind::Bucket)
        .cloned()
        .collect();
    if !buckets.is_empty() {
        let every = Duration::from_secs(pdrouter_policy::BUCKET_ADJUST_INTERVAL_SECS);
        background.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                for p in &buckets {
                    p.tick(crate::select::policy_clock_secs());
                }
            }
        }));
    }
}

/// The dispatcher: the routing core, and the backends of this mode's workers.
fn new_dispatcher(
    parts: &Parts,
    tokenizer: Option<Arc<crate::grpc::tokenizer::RouterTokenizer>>,
    images: crate::images::ImageSupport,
) -> Arc<Dispatcher> {
    Arc::new(Dispatcher {
        core: crate::core::Core {
            cfg: parts.cfg.clone(),
            registry: parts.registry.clone(),
            metrics: parts.metrics.clone(),
            admission: parts.admission.clone(),
            sizer: parts.sizer.clone(),
            policy: parts.policies.policy.clone(),
            prefill_policy: parts.policies.prefill.clone(),
            decode_policy: parts.policies.decode.clone(),
            // gRPC requests carry their token ids in the plan instead.
            prefix_tokenizer: tokenizer
                .as_ref()
                .filter(|_| !parts.cfg.mode.is_grpc())
                .map(|t| t.tokenizer.clone()),
        },
        http: crate::backends::http::HttpBackend {
            client: parts.client.clone(),
        },
        grpc: parts
            .cfg
            .mode
            .is_grpc()
            .then(|| crate::backends::grpc::GrpcBackend {
                tokenizer,
                images,
                encode_policy: parts.policies.encode.clone(),
                client: parts.client.clone(),
                parsers: parts.cfg.chat_parsers,
            }),
    })
}

/// What the HTTP handlers share, the global limiter (when on) included.
fn new_app_state(
    parts: &Parts,
    dispatcher: Arc<Dispatcher>,
    sharer: Option<Arc<Sharer>>,
) -> Arc<AppState> {
    let cfg = &parts.cfg;
    Arc::new(AppState {
        cfg: cfg.clone(),
        dispatcher,
        registry: parts.registry.clone(),
        metrics: parts.metrics.clone(),
        client: parts.client.clone(),
        shutting_down: Default::default(),
        limiter: cfg.limiter.map(|l| {
            crate::limiter::Limiter::new(
                l,
                parts.metrics.clone() as Arc<dyn crate::limiter::LimiterObserver>,
            )
        }),
        sharer,
    })
}

/// Binds the router's listener and, when `--prometheus-*` asks, the metrics one (served at
/// once); then serves the router until [`RouterHandle::shutdown`].
async fn listen(
    state: Arc<AppState>,
    admission: Option<Admission>,
    mut background: Vec<JoinHandle<()>>,
    health: Option<Arc<HealthChecker>>,
) -> Result<RouterHandle, StartError> {
    let cfg = state.cfg.clone();
    let metrics = &state.metrics;
    let listener = bind(SocketAddr::new(cfg.host, cfg.port)).await?;
    let addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: SocketAddr::new(cfg.host, cfg.port),
        source,
    })?;
    let metrics_addr = match cfg.prometheus {
        Some((host, port)) => {
            let l = bind(SocketAddr::new(host, port)).await?;
            let a = l.local_addr().ok();
            background.push(tokio::spawn(crate::http::serve_metrics(l, metrics.clone())));
            a
        }
        None => None,
    };

    let (tx, rx) = watch::channel(false);
    let limits = crate::http::ConnLimits {
        header_timeout: cfg.client_header_timeout,
        max_connections: cfg.max_connections,
        tls: cfg.edge.tls.as_ref().map(|t| t.config.clone()),
    };
    let server = tokio::spawn(crate::http::serve(
        listener,
        app(state.clone()),
        rx,
        limits,
        metrics.clone(),
    ));
    tracing::info!(
        %addr,
        mode = ?cfg.mode,
        admission = cfg.admission.is_some(),
        tls = cfg.edge.tls.is_some(),
        "router listening"
    );
    Ok(RouterHandle {
        addr,
        metrics_addr,
        state,
        admission,
        shutdown: tx,
        server,
        background,
        _health: health,
    })
}

#[cfg(test)]
mod tests;
