//! Response bodies that keep the in-flight guard alive until they are done.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use futures_util::Stream;
use http_body::{Frame, SizeHint};

use crate::state::InflightGuard;

/// A body of known length sent in one frame; holds an optional guard until
/// hyper drops it (fully written or connection gone).
#[derive(Debug)]
struct OnceBody {
    data: Option<Bytes>,
    _guard: Option<InflightGuard>,
}

impl http_body::Body for OnceBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.get_mut().data.take().map(|d| Ok(Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

pub(crate) const JSON: &str = "application/json";
pub(crate) const SSE: &str = "text/event-stream";

/// A complete response whose body is `data`.
pub(crate) fn full(
    status: StatusCode,
    content_type: &'static str,
    data: impl Into<Bytes>,
    guard: Option<InflightGuard>,
) -> Response {
    let data = data.into();
    let body = OnceBody {
        data: (!data.is_empty()).then_some(data),
        _guard: guard,
    };
    let mut resp = Response::new(Body::new(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if content_type == SSE {
        resp.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
    resp
}

/// `v` as a complete JSON response with `status`.
pub(crate) fn json(status: StatusCode, v: &serde_json::Value) -> Response {
    full(
        status,
        JSON,
        serde_json::to_vec(v).unwrap_or_default(),
        None,
    )
}

/// JSON error `{"error":{"message":..}}` with the given status.
pub(crate) fn error(status: StatusCode, message: &str, guard: Option<InflightGuard>) -> Response {
    let body = serde_json::json!({ "error": { "message": message } });
    full(
        status,
        JSON,
        serde_json::to_vec(&body).unwrap_or_default(),
        guard,
    )
}

/// A body that relays `inner` and then, instead of ending, waits for `release`.
struct HeldOpen {
    inner: Body,
    release: Option<Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
}

impl http_body::Body for HeldOpen {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if let Some(frame) = std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            return Poll::Ready(Some(frame));
        }
        if let Some(release) = this.release.as_mut() {
            std::task::ready!(release.as_mut().poll(cx));
            this.release = None;
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.release.is_none() && self.inner.is_end_stream()
    }

    // The default (unknown) size: the answer goes out chunked, so the client cannot tell it
    // is complete until the final chunk, which waits for `release`.
}

/// `resp` with its body kept open after its content until `release` resolves.
pub(crate) fn held_open(
    resp: Response,
    release: impl std::future::Future<Output = ()> + Send + 'static,
) -> Response {
    resp.map(|inner| {
        Body::new(HeldOpen {
            inner,
            release: Some(Box::pin(release)),
        })
    })
}

/// A 200 server-sent-events response streamed from `stream`.
pub(crate) fn sse_stream<S>(stream: S) -> Response
where
    S: Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
{
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(SSE));
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}
