//! CORS for browser clients (`--cors-allowed-origins`).
//!
//! A preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) is answered here,
//! before routing and before any key check (browsers never send credentials on a preflight):
//! 204 with the allow headers when the origin is allowed, 204 without them otherwise, so the
//! browser refuses the real request. The allowed request headers are the ones the preflight
//! asks for (SDKs add their own, such as the OpenAI SDK's `x-stainless-*`; the origin is
//! trusted already), or the router's own list when it asks for none. Every other request from an allowed origin gets
//! `Access-Control-Allow-Origin` (and `Vary: Origin`) on its response; other origins get no
//! CORS header at all. Requests without `Origin` (non-browser clients) are untouched.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::edge::Cors;

/// Methods the router serves, announced to preflights.
const ALLOWED_METHODS: &str = "GET, POST, PUT, DELETE, OPTIONS";
/// Headers announced to a preflight that asks for none; the request-id and routing headers
/// are the router's own.
const ALLOWED_HEADERS: &str = "authorization, content-type, x-request-id, x-correlation-id, \
                               x-smg-routing-key, x-smg-target-worker, x-smg-priority, \
                               traceparent, tracestate";
/// Response headers a browser script may read.
const EXPOSED_HEADERS: &str = "x-request-id, x-smg-error-code, retry-after";
/// How long a browser may cache a preflight answer, in seconds.
const MAX_AGE_SECS: &str = "3600";

/// See the module docs.
#[derive(Debug, Clone)]
pub(crate) struct CorsLayer(pub(crate) Arc<Cors>);

impl<S> Layer<S> for CorsLayer {
    type Service = CorsService<S>;

    fn layer(&self, inner: S) -> CorsService<S> {
        CorsService::new(inner, Some(self.0.clone()))
    }
}

/// See [`CorsLayer`].
#[derive(Debug, Clone)]
pub(crate) struct CorsService<S> {
    inner: S,
    /// `None`: no origins configured, requests pass untouched.
    cors: Option<Arc<Cors>>,
}

impl<S> CorsService<S> {
    pub(crate) fn new(inner: S, cors: Option<Arc<Cors>>) -> Self {
        Self { inner, cors }
    }
}

/// The answer to a preflight: `allow` is the origin to allow (none: refuse), `requested` the
/// preflight's `Access-Control-Request-Headers`.
fn preflight(allow: Option<HeaderValue>, requested: Option<HeaderValue>) -> Response {
    let mut resp = Response::new(axum::body::Body::empty());
    *resp.status_mut() = StatusCode::NO_CONTENT;
    if let Some(origin) = allow {
        let h = resp.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(ALLOWED_METHODS),
        );
        let headers = requested
            .filter(|v| !v.as_bytes().iter().all(u8::is_ascii_whitespace))
            .unwrap_or(HeaderValue::from_static(ALLOWED_HEADERS));
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, headers);
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static(MAX_AGE_SECS),
        );
    }
    resp.headers_mut().insert(
        header::VARY,
        HeaderValue::from_static("origin, access-control-request-headers"),
    );
    resp
}

impl<S> Service<Request> for CorsService<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = CorsFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let (Some(cors), Some(origin)) = (&self.cors, req.headers().get(header::ORIGIN)) else {
            return CorsFuture::Inner {
                inner: self.inner.call(req),
                allow: None,
            };
        };
        let allow = cors.allow(origin);
        if req.method() == Method::OPTIONS
            && req
                .headers()
                .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
        {
            let requested = req
                .headers()
                .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
                .cloned();
            return CorsFuture::Preflight {
                resp: Some(preflight(allow, requested)),
            };
        }
        CorsFuture::Inner {
            inner: self.inner.call(req),
            allow,
        }
    }
}

pin_project! {
    /// The response future of [`CorsService`].
    #[project = CorsProj]
    #[derive(Debug)]
    pub(crate) enum CorsFuture<F> {
        /// A preflight, answered without routing.
        Preflight { resp: Option<Response> },
        /// Any other request; `allow` is added to its response.
        Inner {
            #[pin]
            inner: F,
            allow: Option<HeaderValue>,
        },
    }
}

impl<F> Future for CorsFuture<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            CorsProj::Preflight { resp } => {
                Poll::Ready(Ok(resp.take().unwrap_or_else(|| preflight(None, None))))
            }
            CorsProj::Inner { inner, allow } => {
                let Ok(mut resp) = ready!(inner.poll(cx));
                if let Some(origin) = allow.take() {
                    let h = resp.headers_mut();
                    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
                    h.insert(
                        header::ACCESS_CONTROL_EXPOSE_HEADERS,
                        HeaderValue::from_static(EXPOSED_HEADERS),
                    );
                    h.append(header::VARY, HeaderValue::from_static("origin"));
                }
                Poll::Ready(Ok(resp))
            }
        }
    }
}
