//! Request id, access metrics, API-key and control-plane key checks.

use std::convert::Infallible;
use std::future::{Future, Ready};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use futures_util::future::Either;
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;
use tracing::Instrument;
use tracing::instrument::Instrumented;

use super::AppState;
use crate::edge::{ControlPlaneKey, Role};
use crate::error::{ApiError, ErrorCode};

/// Request id carried on the request as an extension.
#[derive(Debug, Clone)]
pub(crate) struct RequestId(pub(crate) String);

const REQUEST_ID: &str = "x-request-id";

fn valid_id(v: &HeaderValue) -> Option<String> {
    let s = v.to_str().ok()?;
    (!s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic()))
        .then(|| s.to_string())
}

fn new_id() -> String {
    id_of(rand::random::<u64>(), rand::random::<u64>())
}

/// `a` and `b` as 32 lowercase hex digits (`{:016x}{:016x}`), written by hand: through the
/// formatting machinery this was about 1,400 instructions per request, over 1% of a small
/// HTTP PD request's.
fn id_of(a: u64, b: u64) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = String::with_capacity(32);
    for word in [a, b] {
        for shift in (0..16).rev() {
            id.push(char::from(HEX[(word >> (shift * 4)) as usize & 0xf]));
        }
    }
    id
}

/// Assigns the request id, opens the request span, records access metrics, echoes the id.
///
/// A hand-written layer rather than `axum::middleware::from_fn`: that one boxes an `async`
/// block holding the request, a `Next` and the inner future for as long as the request lives,
/// about 1.5 KB per request parked in the admission queue. This future is the inner one plus
/// the few fields the access record needs.
#[derive(Debug, Clone)]
pub(crate) struct ObserveLayer(pub(crate) Arc<AppState>);

impl<S> Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Observe<S> {
        Observe {
            inner,
            state: self.0.clone(),
            route: None,
        }
    }
}

/// See [`ObserveLayer`].
#[derive(Debug, Clone)]
pub(crate) struct Observe<S> {
    inner: S,
    state: Arc<AppState>,
    /// The route's path when the service serves one route only, without axum's router (which
    /// otherwise tells it through [`MatchedPath`]).
    route: Option<&'static str>,
}

impl<S> Observe<S> {
    /// Observes `inner`, the one service of route `route`.
    pub(crate) fn route(inner: S, state: Arc<AppState>, route: &'static str) -> Self {
        Self {
            inner,
            state,
            route: Some(route),
        }
    }
}

/// The route a request took, as its metrics and span name it.
#[derive(Debug)]
enum RouteLabel {
    Fixed(&'static str),
    Matched(MatchedPath),
    /// No route matched.
    Other,
}

impl RouteLabel {
    fn as_str(&self) -> &str {
        match self {
            Self::Fixed(path) => path,
            Self::Matched(path) => path.as_str(),
            Self::Other => "other",
        }
    }
}

impl<S> Service<Request> for Observe<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Observed<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        let started = Instant::now();
        let headers = req.headers();
        let id = self
            .state
            .cfg
            .edge
            .request_id_headers
            .iter()
            .find_map(|name| headers.get(name).and_then(valid_id))
            .unwrap_or_else(new_id);
        let path = match self.route {
            Some(route) => RouteLabel::Fixed(route),
            None => req
                .extensions()
                .get::<MatchedPath>()
                .cloned()
                .map_or(RouteLabel::Other, RouteLabel::Matched),
        };
        let method = req.method().clone();
        req.extensions_mut().insert(RequestId(id.clone()));
        let span = tracing::info_span!(
            "request",
            request_id = %id,
            method = %method,
            path = path.as_str(),
        );
        crate::telemetry::continue_client_trace(&span, req.headers());
        let inner = {
            let _entered = span.enter();
            self.inner.call(req)
        };
        Observed {
            inner: inner.instrument(span),
            record: Some(Record {
                state: self.state.clone(),
                started,
                id,
                method,
                path,
            }),
        }
    }
}

/// What the access record needs once the response is ready.
#[derive(Debug)]
struct Record {
    state: Arc<AppState>,
    started: Instant,
    id: String,
    method: Method,
    path: RouteLabel,
}

pin_project! {
    /// The response future of [`Observe`].
    #[derive(Debug)]
    pub(crate) struct Observed<F> {
        #[pin]
        inner: Instrumented<F>,
        record: Option<Record>,
    }

    impl<F> PinnedDrop for Observed<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // Dropped before the response was ready: the client hung up (or the server is
            // shutting down). Nothing is recorded as answered; say so when debugging.
            if let Some(record) = this.record.take() {
                this.inner.span().in_scope(|| {
                    tracing::debug!(
                        elapsed_ms = record.started.elapsed().as_millis() as u64,
                        "client went away before the response"
                    );
                });
            }
        }
    }
}

impl<F> Future for Observed<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let Ok(mut resp) = ready!(this.inner.as_mut().poll(cx));
        let Some(record) = this.record.take() else {
            // Polled again after completion: the record is already written.
            return Poll::Ready(Ok(resp));
        };
        let status = resp.status();
        let code = resp.extensions().get::<ErrorCode>().map(|c| c.0);
        this.inner.span().in_scope(|| {
            let status = status.as_u16();
            if status >= 500 {
                tracing::warn!(status, code, "request failed");
            } else if status >= 400 {
                tracing::debug!(status, code, "request rejected");
            } else {
                tracing::debug!(status, "request answered");
            }
        });
        let path = record.path.as_str();
        record.state.metrics.http_request(
            &record.method,
            path,
            status,
            code,
            record.started.elapsed(),
        );
        if let Ok(v) = HeaderValue::from_str(&record.id) {
            resp.headers_mut().insert(REQUEST_ID, v);
        }
        Poll::Ready(Ok(resp))
    }
}

/// Constant-time equality, so the key cannot be guessed byte by byte from response times.
fn same_key(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = given.len() ^ expected.len();
    for (i, b) in expected.iter().enumerate() {
        diff |= usize::from(given.get(i).copied().unwrap_or(0) ^ b);
    }
    diff == 0
}

/// Who may use the routes an [`AuthLayer`] wraps.
#[derive(Debug)]
pub(crate) enum Gate {
    /// `Authorization: Bearer <--api-key>`.
    ApiKey(Box<str>),
    /// A `--control-plane-api-keys` key: role admin passes, role user gets 403.
    ControlPlane(Vec<ControlPlaneKey>),
}

impl Gate {
    /// The bearer token of `req`, if it sent one.
    fn token(req: &Request) -> &[u8] {
        req.headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("")
            .trim()
            .as_bytes()
    }

    /// `None` when `req` may pass, else the error to answer.
    fn refuse(&self, req: &Request) -> Option<ApiError> {
        let given = Self::token(req);
        match self {
            Self::ApiKey(key) => (!same_key(given, key.as_bytes())).then(ApiError::unauthorized),
            Self::ControlPlane(keys) => {
                // Every key is compared, so the time taken does not tell which one matched.
                let mut found = None;
                for k in keys {
                    if same_key(given, k.key.as_bytes()) {
                        found = Some(k);
                    }
                }
                match found {
                    None => Some(ApiError::unauthorized()),
                    Some(k) if k.role != Role::Admin => {
                        tracing::debug!(key_id = %k.id, "control-plane key without role admin refused");
                        Some(ApiError::forbidden())
                    }
                    Some(k) => {
                        tracing::debug!(key_id = %k.id, "control-plane request");
                        None
                    }
                }
            }
        }
    }
}

/// Requires the credential its [`Gate`] names on the routes it wraps.
///
/// Checked synchronously in `call`, so an admitted request's future is the inner one, not an
/// extra block (see [`ObserveLayer`] for why that matters to queued requests).
#[derive(Debug, Clone)]
pub(crate) struct AuthLayer(pub(crate) Arc<Gate>);

impl<S> Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Auth<S> {
        Auth::new(inner, Some(self.0.clone()))
    }
}

/// See [`AuthLayer`].
#[derive(Debug, Clone)]
pub(crate) struct Auth<S> {
    inner: S,
    /// `None`: everyone passes.
    gate: Option<Arc<Gate>>,
}

impl<S> Auth<S> {
    pub(crate) fn new(inner: S, gate: Option<Arc<Gate>>) -> Self {
        Self { inner, gate }
    }
}

impl<S> Service<Request> for Auth<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<Ready<Result<Response, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        match self.gate.as_deref().and_then(|g| g.refuse(&req)) {
            None => Either::Right(self.inner.call(req)),
            Some(e) => Either::Left(std::future::ready(Ok(e.into_response()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_comparison() {
        assert!(same_key(b"secret", b"secret"));
        assert!(!same_key(b"secreT", b"secret"));
        assert!(!same_key(b"secret1", b"secret"));
        assert!(!same_key(b"", b"secret"));
    }

    #[test]
    fn generated_ids_are_the_words_in_hex() {
        for (a, b) in [
            (0, 0),
            (1, u64::MAX),
            (0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210),
        ] {
            assert_eq!(id_of(a, b), format!("{a:016x}{b:016x}"));
        }
        let id = new_id();
        assert_eq!(id.len(), 32);
        assert!(
            id.bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
    }
}
