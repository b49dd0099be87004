//! HTTP requests, client connections and routed inference requests: what the router's
//! listener saw, by method, route template, status and error code. The method label is one of
//! a fixed set ([`method_label`]); paths arrive as route templates (or `other`).
//!
//! Series the router updates on every request (`POST` or `GET` on a hot route, status 200
//! without an error code) keep their handles once made: a family lookup hashes the labels
//! under a lock, and these families never drop a series, so a kept handle stays the one the
//! registry exposes. A series is still made on its first update, never before.

use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::family::{HistFamily, latency_histogram};
use super::labels::{
    EndpointLabel, ErrorLabels, HOT_ROUTES, ResponseLabels, RouteLabels, hot_route,
};

/// Methods whose hot routes keep their series' handles.
const HOT_METHODS: [&str; 2] = ["POST", "GET"];

/// One route's kept handles: its request counter and duration histogram.
type RouteSeries = (Counter, Histogram);

/// The HTTP and routing families.
#[derive(Debug)]
pub(super) struct RequestMetrics {
    http_requests: Family<RouteLabels, Counter>,
    http_duration: HistFamily<RouteLabels>,
    http_responses: Family<ResponseLabels, Counter>,
    http_connections: Gauge,
    router_requests: Family<EndpointLabel, Counter>,
    router_errors: Family<ErrorLabels, Counter>,
    /// Kept handles, by [`HOT_METHODS`] then [`HOT_ROUTES`] index.
    hot_routes: [[OnceLock<RouteSeries>; HOT_ROUTES.len()]; HOT_METHODS.len()],
    /// Kept `router_requests` handles, by [`HOT_ROUTES`] index.
    hot_routed: [OnceLock<Counter>; HOT_ROUTES.len()],
    /// The `200`/`none` response counter, kept.
    ok_responses: OnceLock<Counter>,
}

impl RequestMetrics {
    /// Creates the families and registers them, in exposition order.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let http_requests: Family<RouteLabels, Counter> = Family::default();
        let http_duration: HistFamily<RouteLabels> =
            Family::new_with_constructor(latency_histogram);
        let http_responses: Family<ResponseLabels, Counter> = Family::default();
        let http_connections: Gauge = Gauge::default();
        let router_requests: Family<EndpointLabel, Counter> = Family::default();
        let router_errors: Family<ErrorLabels, Counter> = Family::default();
        registry.register(
            "smg_http_requests",
            "HTTP requests received, by method and route",
            http_requests.clone(),
        );
        registry.register(
            "smg_http_request_duration_seconds",
            "Time from request received to response head sent, by method and route",
            http_duration.clone(),
        );
        registry.register(
            "smg_http_responses",
            "HTTP responses sent, by status and error code",
            http_responses.clone(),
        );
        registry.register(
            "smg_http_connections_active",
            "Client connections open on the router's listener (at most --max-connections)",
            http_connections.clone(),
        );
        registry.register(
            "smg_router_requests",
            "Inference requests routed, by endpoint",
            router_requests.clone(),
        );
        registry.register(
            "smg_router_request_errors",
            "Inference requests that ended in an error, by endpoint and code",
            router_errors.clone(),
        );
        Self {
            http_requests,
            http_duration,
            http_responses,
            http_connections,
            router_requests,
            router_errors,
            hot_routes: Default::default(),
            hot_routed: Default::default(),
            ok_responses: OnceLock::new(),
        }
    }

    /// One HTTP request handled.
    pub(super) fn http_request(
        &self,
        method: &http::Method,
        path: &str,
        status: http::StatusCode,
        code: Option<&'static str>,
        elapsed: Duration,
    ) {
        let method = method_label(method);
        let hot = HOT_METHODS
            .iter()
            .position(|m| *m == method)
            .zip(hot_route(path));
        match hot {
            Some((m, r)) => {
                let (requests, duration) = self.hot_routes[m][r].get_or_init(|| {
                    let route = RouteLabels::new(method, path);
                    (
                        self.http_requests.get_or_create(&route).clone(),
                        self.http_duration.get_or_create(&route).clone(),
                    )
                });
                requests.inc();
                duration.observe(elapsed.as_secs_f64());
            }
            None => {
                let route = RouteLabels::new(method, path);
                self.http_requests.get_or_create(&route).inc();
                self.http_duration
                    .get_or_create(&route)
                    .observe(elapsed.as_secs_f64());
            }
        }
        let labels = ResponseLabels {
            status_code: status.as_u16(),
            error_code: code.unwrap_or("none"),
        };
        if status == http::StatusCode::OK && code.is_none() {
            self.ok_responses
                .get_or_init(|| self.http_responses.get_or_create(&labels).clone())
                .inc();
        } else {
            self.http_responses.get_or_create(&labels).inc();
        }
    }

    /// A client connection was accepted.
    pub(super) fn connection_opened(&self) {
        self.http_connections.inc();
    }

    /// A client connection closed.
    pub(super) fn connection_closed(&self) {
        self.http_connections.dec();
    }

    /// One inference request routed.
    pub(super) fn routed(&self, route: &'static str) {
        let series = || {
            self.router_requests
                .get_or_create(&EndpointLabel { route })
                .clone()
        };
        match hot_route(route) {
            Some(r) => self.hot_routed[r].get_or_init(series).inc(),
            None => series().inc(),
        };
    }

    /// One inference request failed.
    pub(super) fn route_error(&self, route: &'static str, code: &'static str) {
        self.router_errors
            .get_or_create(&ErrorLabels {
                route,
                error_code: code,
            })
            .inc();
    }
}

/// The `method` label: a method some route serves (`HEAD` with `GET`), else `other`. Any token
/// is a valid extension method, so taking it as sent would let clients create series (each
/// with a histogram) without bound, before any key is checked.
pub fn method_label(method: &http::Method) -> &'static str {
    use http::Method;
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        _ => "other",
    }
}
