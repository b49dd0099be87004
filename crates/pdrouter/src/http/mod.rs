//! The HTTP boundary (the only module that knows axum's routing, extractors, middleware and
//! servers): routes, middleware, handlers, and the Prometheus listener.
//!
//! Every error leaves through [`crate::error::ApiError`], so clients always get the JSON error
//! body (`{"error":{type,code,message,param}}`) and `X-SMG-Error-Code`. Probes (`/health`, `/liveness`, `/readiness`, `/health_generate`)
//! and model information (`/v1/models`, `/get_model_info`, `/get_server_info`) stay open when
//! `--api-key` is set, as in SMG; inference and admin routes require it.

mod conn;
mod handlers;
mod middleware;
mod serve;
mod workers;

pub use serve::{ConnLimits, serve};

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
}

/// Builds the router's HTTP application.
pub fn app(state: Arc<AppState>) -> Router {
    let infer = |endpoint| post_service(handlers::Infer::new(state.clone(), endpoint));
    let protected = Router::new()
        .route("/generate", infer(Endpoint::Generate))
        .route("/v1/chat/completions", infer(Endpoint::ChatCompletions))
        .route("/v1/completions", infer(Endpoint::Completions))
        .route("/v1/responses", infer(Endpoint::Responses))
        .route("/workers", post(workers::add).get(workers::list))
        .route(
            "/workers/{id}",
            get(workers::get_one)
                .put(workers::update)
                .delete(workers::remove),
        );
    // Without a key there is nothing to check: leave the layer off the hot path entirely.
    let protected = match &state.cfg.api_key {
        Some(key) => protected.route_layer(middleware::AuthLayer(Arc::from(key.as_str()))),
        None => protected,
    };
    let open = Router::new()
        .route("/health", get(handlers::health))
        .route("/liveness", get(handlers::liveness))
        .route("/readiness", get(handlers::readiness))
        .route("/health_generate", get(handlers::health_generate))
        .route("/v1/models", get(handlers::models))
        .route("/get_server_info", get(handlers::server_info))
        .route("/get_model_info", get(handlers::model_info));
    protected
        .merge(open)
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(middleware::ObserveLayer(state.clone()))
        .with_state(state)
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
