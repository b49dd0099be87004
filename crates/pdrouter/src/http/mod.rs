//! The HTTP boundary (the only module that knows axum's routing, extractors, middleware and
//! servers): routes, middleware, handlers, and the Prometheus listener.
//!
//! Every error leaves through [`crate::error::ApiError`], so clients always get the JSON error
//! body (`{"error":{type,code,message,param}}`) and `X-SMG-Error-Code`. Probes (`/health`, `/liveness`, `/readiness`, `/health_generate`)
//! and model information (`/v1/models` and `/v1/models/{id}`, `/get_model_info`, `/get_server_info`) stay open when
//! `--api-key` is set, as in SMG; inference routes require it. The control plane (`/workers`)
//! requires an admin `--control-plane-api-keys` key when such keys are given, else `--api-key`.

mod conn;
mod cors;
mod front;
mod handlers;
mod middleware;
mod serve;
mod workers;

pub(crate) use front::Front;
pub use serve::ConnLimits;
pub(crate) use serve::serve;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::config::Config;
use crate::dispatch::Dispatcher;
use crate::metrics::Metrics;
use crate::proxy::client::UpstreamClient;
use crate::registry::Registry;
use crate::request::Endpoint;
use axum::Router;
use axum::routing::{get, post, post_service};
use middleware::Gate;
use tokio::net::TcpListener;

/// Shared state of all handlers.
#[derive(Debug)]
pub struct AppState {
    pub(crate) cfg: Arc<Config>,
    pub(crate) dispatcher: Arc<Dispatcher>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) client: UpstreamClient,
    pub(crate) shutting_down: AtomicBool,
    /// The global request limiter, when on.
    pub(crate) limiter: Option<crate::limiter::Limiter>,
    /// The admission-store sharer, when `--admission-store` is given (for `/workers`).
    pub(crate) sharer: Option<Arc<pdrouter_admission::Sharer>>,
}

/// Builds the router's HTTP application: axum's router for every route, and beside it a direct
/// way in for inference requests (see [`Front`]).
pub(crate) fn app(state: Arc<AppState>) -> Front {
    // The router keeps the inference routes for what `Front` does not take (other methods).
    let inference = Endpoint::ALL.iter().fold(Router::new(), |r, &e| {
        r.route(
            e.path(),
            post_service(handlers::Infer::new(state.clone(), e)),
        )
    });
    let control = Router::new()
        .route("/workers", post(workers::add).get(workers::list))
        .route(
            "/workers/{id}",
            get(workers::get_one)
                .put(workers::update)
                .delete(workers::remove),
        );
    // One gate for the inference routes, shared by the router and `Front`.
    let api_key_gate = state
        .cfg
        .api_key
        .as_deref()
        .map(|k| Arc::new(Gate::ApiKey(k.into())));
    // Control-plane keys, when given, are the only way onto the control plane; otherwise
    // `--api-key` guards it like inference.
    let control_gate = match state.cfg.edge.control_plane_keys.as_slice() {
        [] => api_key_gate.clone(),
        keys => Some(Arc::new(Gate::ControlPlane(keys.to_vec()))),
    };
    // Without a credential there is nothing to check: leave the layer off the hot path.
    let gated = |routes: Router<Arc<AppState>>, gate: Option<Arc<Gate>>| match gate {
        Some(g) => routes.route_layer(middleware::AuthLayer(g)),
        None => routes,
    };
    let protected = gated(inference, api_key_gate.clone()).merge(gated(control, control_gate));
    let open = Router::new()
        .route("/health", get(handlers::health))
        .route("/liveness", get(handlers::liveness))
        .route("/readiness", get(handlers::readiness))
        .route("/health_generate", get(handlers::health_generate))
        .route("/v1/models", get(handlers::models))
        .route("/v1/models/{*model}", get(handlers::model))
        .route("/get_server_info", get(handlers::server_info))
        .route("/get_model_info", get(handlers::model_info));
    let mut app = protected
        .merge(open)
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed);
    // Only with origins configured, so other deployments keep the smaller request future.
    let cors = state.cfg.edge.cors.clone().map(Arc::new);
    if let Some(cors) = &cors {
        app = app.layer(cors::CorsLayer(cors.clone()));
    }
    let router = app
        .layer(middleware::ObserveLayer(state.clone()))
        .with_state(state.clone());
    Front::new(&state, router, api_key_gate, cors)
}

/// Serves `GET /metrics` (the Prometheus exposition of `metrics`) on its own listener until the
/// task is aborted.
pub(crate) async fn serve_metrics(listener: TcpListener, metrics: Arc<Metrics>) {
    let prom = Router::new().route(
        "/metrics",
        get(move || {
            let m = metrics.clone();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    m.encode(),
                )
            }
        }),
    );
    let _ = axum::serve(listener, prom).await;
}
