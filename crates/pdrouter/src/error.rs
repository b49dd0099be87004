//! Every error a client can see, classified in one place.
//!
//! Leaves return [`ApiError`] values built by the constructors here; [`ApiError::into_response`]
//! is the only place that turns one into a status, the JSON error body and `X-SMG-Error-Code`.
//! Client mistakes are 4xx with a message that says what to fix, worker trouble is 502/503/504,
//! and only a router bug is a 500.
//!
//! This module imports no other module of the router: every status, code and message is
//! here, and a module with errors of its own says which constructor each one is (e.g.
//! `images::ImageInputError::into_api_error`, `limiter::Refusal::into_api_error`).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use pdrouter_admission::{Rejected, Rejection};

/// Header carrying the machine-readable error code.
pub const ERROR_CODE_HEADER: &str = "x-smg-error-code";

/// Which PD leg (or the single regular leg) an upstream error belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leg {
    /// The Prefill request of a PD pair.
    Prefill,
    /// The Decode request of a PD pair.
    Decode,
    /// The only request of regular mode.
    Worker,
}

impl Leg {
    /// Lower-case name used in codes and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Leg::Prefill => "prefill",
            Leg::Decode => "decode",
            Leg::Worker => "worker",
        }
    }
}

/// What is wrong with an unusable `image_url` content part: one variant per error code of
/// [`ApiError::image`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFault {
    /// `image_too_large`: over `--max-image-bytes` or `--max-image-pixels`.
    TooLarge,
    /// `invalid_image_url`: not a base64 image data URL or an http(s) URL.
    InvalidUrl,
    /// `image_url_refused`: a non-public address, credentials, a redirect to another scheme.
    Refused,
    /// `image_fetch_failed`: the server failed, timed out or redirected too often.
    FetchFailed,
    /// `invalid_image`: not PNG/JPEG/WebP, undecodable, unusable shape.
    Invalid,
}

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code (`X-SMG-Error-Code`).
    pub code: &'static str,
    /// Human-readable message saying what went wrong and what to do.
    pub message: String,
    /// `Retry-After` seconds, when the client should come back later.
    pub retry_after: Option<u64>,
    /// Whether another attempt on a fresh worker pair may succeed.
    pub retryable: bool,
    /// The worker refused the request as overloaded (HTTP 429 or 503, gRPC
    /// `ResourceExhausted`): a self-sizing limit backs off on it.
    pub worker_overloaded: bool,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after: None,
            retryable: false,
            worker_overloaded: false,
        }
    }

    /// Body is not JSON.
    pub fn malformed_json(detail: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("request body is not valid JSON: {detail}"),
        )
    }

    /// JSON of the wrong shape; `field` names what to fix.
    pub fn invalid_field(field: &str, what: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("field '{field}' {what}"),
        )
    }

    /// A bad request header.
    pub fn invalid_header(name: &str, what: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_header",
            format!("header '{name}' {what}"),
        )
    }

    /// Any other client mistake.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// An `image_url` content part that cannot be used (400), the message starting with the
    /// part's path (`messages[1].content[2]: ...`) and going on with `detail`; `fault` gives
    /// the code (see [`ImageFault`]). `images` says which fault each image error is.
    pub fn image(
        fault: ImageFault,
        part: impl std::fmt::Display,
        detail: impl std::fmt::Display,
    ) -> Self {
        let code = match fault {
            ImageFault::TooLarge => "image_too_large",
            ImageFault::InvalidUrl => "invalid_image_url",
            ImageFault::Refused => "image_url_refused",
            ImageFault::FetchFailed => "image_fetch_failed",
            ImageFault::Invalid => "invalid_image",
        };
        Self::new(StatusCode::BAD_REQUEST, code, format!("{part}: {detail}"))
    }

    /// A request whose images do not fit its prompt (400): `too_many_images` past the
    /// per-request limit, else `invalid_request` (a malformed content part, or a chat
    /// template that did not place each image exactly once).
    pub fn image_prompt(err: &pdrouter_vision::PromptError) -> Self {
        let code = match err {
            pdrouter_vision::PromptError::TooManyImages { .. } => "too_many_images",
            _ => "invalid_request",
        };
        Self::new(StatusCode::BAD_REQUEST, code, err.to_string())
    }

    /// Body larger than `--max-payload-size`.
    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("request body exceeds the {limit}-byte limit (--max-payload-size)"),
        )
    }

    /// Unknown route.
    pub fn not_found(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no route for '{path}'"),
        )
    }

    /// Unknown resource id.
    pub fn no_such(what: &str, id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no {what} with id '{id}'"),
        )
    }

    /// Wrong method on a known route.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "method not allowed on this route",
        )
    }

    /// A resource already exists.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    /// Missing or wrong API key.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or invalid API key; send 'Authorization: Bearer <key>'",
        )
    }

    /// A valid control-plane key whose role does not cover the control plane.
    pub fn forbidden() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "this key's role may not use the control plane; use a key with role admin",
        )
    }

    /// No ready worker of the needed type.
    pub fn no_worker(kind: &str) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_available_workers",
            format!("no healthy {kind} worker is available"),
        )
    }

    /// A named model that none of the registered workers serves.
    pub fn model_not_found(model: &str) -> Self {
        // The name is the client's: bounded, so a huge one is not echoed back whole.
        let shown: String = model.chars().take(256).collect();
        Self::new(
            StatusCode::NOT_FOUND,
            "model_not_found",
            format!("No worker available for model '{shown}'"),
        )
    }

    /// `/readiness` while a needed worker type has no ready worker.
    pub fn not_ready(missing: &str) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            format!("no ready {missing} worker"),
        )
    }

    /// `X-SMG-Target-Worker` names a worker that does not exist.
    pub fn target_out_of_range(index: usize, count: usize, kind: &str) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "target_worker_unavailable",
            format!(
                "X-SMG-Target-Worker {index} is out of range: there are {count} {kind} workers"
            ),
        )
    }

    /// `X-SMG-Target-Worker` names a worker that is not routable now.
    pub fn target_unavailable(index: usize) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "target_worker_unavailable",
            format!("X-SMG-Target-Worker {index} is not healthy"),
        )
    }

    /// A local Prefill admission rejection (never retried). The two queue rejections carry
    /// `Retry-After`: the controller's estimate from observed Prefill durations and the queue's
    /// measured drain rate, in whole seconds (already rounded up and clamped to at least 1 s and
    /// at most the admission cap).
    pub fn admission(rejected: Rejected, queue_timeout_secs: u64) -> Self {
        let retry_after = rejected
            .retry_after
            .map(|d| (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1));
        match rejected.reason {
            Rejection::QueueFull => Self {
                retry_after,
                ..Self::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "pd_prefill_queue_full",
                    "all Prefill workers are at their in-flight limit and the admission queue is full; retry later",
                )
            },
            Rejection::QueueTimeout => Self {
                retry_after,
                ..Self::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "pd_prefill_queue_timeout",
                    format!(
                        "waited {queue_timeout_secs}s for a Prefill slot without getting one; retry later"
                    ),
                )
            },
            Rejection::Unavailable => Self::no_worker("prefill"),
        }
    }

    /// The queue of prompts waiting to be tokenized (or images to be decoded) is full, or a
    /// request waited in it too long: 503 with `Retry-After: 1`.
    pub fn tokenizer_busy() -> Self {
        Self {
            retry_after: Some(1),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "tokenizer_busy",
                "the router's tokenizer queue is full; retry later",
            )
        }
    }

    /// The global limiter's queue is full (429 with `Retry-After: 1`, never retried).
    pub fn rate_limited() -> Self {
        Self {
            retry_after: Some(1),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                "the router is at --max-concurrent-requests and its queue is full; retry later",
            )
        }
    }

    /// A request waited `queue_timeout_secs` for a global limiter permit without getting one
    /// (408, never retried).
    pub fn queue_timeout(queue_timeout_secs: u64) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "queue_timeout",
            format!(
                "waited {queue_timeout_secs}s in the router's request queue without being \
                 admitted; retry later"
            ),
        )
    }

    /// Could not connect to a worker.
    pub fn connect_failed(leg: Leg, url: &str) -> Self {
        Self {
            retryable: true,
            ..Self::new(
                StatusCode::BAD_GATEWAY,
                match leg {
                    Leg::Prefill => "prefill_connect_failed",
                    Leg::Decode => "decode_connect_failed",
                    Leg::Worker => "worker_connect_failed",
                },
                format!("could not connect to {} worker {url}", leg.as_str()),
            )
        }
    }

    /// The worker did not answer in time.
    pub fn upstream_timeout(leg: Leg, url: &str) -> Self {
        Self {
            retryable: true,
            ..Self::new(
                StatusCode::GATEWAY_TIMEOUT,
                match leg {
                    Leg::Prefill => "prefill_timeout",
                    Leg::Decode => "decode_timeout",
                    Leg::Worker => "worker_timeout",
                },
                format!("{} worker {url} did not answer in time", leg.as_str()),
            )
        }
    }

    fn bad_response_code(leg: Leg) -> &'static str {
        match leg {
            Leg::Prefill => "prefill_bad_response",
            Leg::Decode => "decode_bad_response",
            Leg::Worker => "worker_bad_response",
        }
    }

    /// The worker broke the connection or sent something that is not HTTP.
    pub fn upstream_broken(leg: Leg, url: &str) -> Self {
        Self {
            retryable: true,
            ..Self::new(
                StatusCode::BAD_GATEWAY,
                Self::bad_response_code(leg),
                format!("{} worker {url} failed mid-response", leg.as_str()),
            )
        }
    }

    /// The worker's answer lacks what the router must read from it (`what`), or is not JSON.
    pub fn upstream_unreadable(leg: Leg, url: &str, what: &str) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            Self::bad_response_code(leg),
            format!(
                "{} worker {url} sent an answer without a readable {what}",
                leg.as_str()
            ),
        )
    }

    /// The worker sent a body longer than the router reads whole (`limit` bytes).
    pub fn upstream_too_large(leg: Leg, url: &str, limit: usize) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            Self::bad_response_code(leg),
            format!(
                "{} worker {url} sent a response body over the {limit}-byte limit",
                leg.as_str()
            ),
        )
    }

    /// The worker answered with an error status.
    pub fn upstream_status(leg: Leg, url: &str, status: StatusCode, detail: &str) -> Self {
        let retryable = status == StatusCode::REQUEST_TIMEOUT
            || status == StatusCode::TOO_MANY_REQUESTS
            || status.is_server_error();
        // A worker's 4xx is about the request itself, so the client sees it as is; a 5xx is the
        // worker's failure and surfaces as a gateway error.
        let client_status = if status.is_client_error() {
            status
        } else {
            StatusCode::BAD_GATEWAY
        };
        let detail = clip(detail);
        Self {
            retryable,
            worker_overloaded: status == StatusCode::TOO_MANY_REQUESTS
                || status == StatusCode::SERVICE_UNAVAILABLE,
            ..Self::new(
                client_status,
                match leg {
                    Leg::Prefill => "prefill_worker_error",
                    Leg::Decode => "decode_worker_error",
                    Leg::Worker => "worker_error",
                },
                format!(
                    "{} worker {url} answered {}: {detail}",
                    leg.as_str(),
                    status.as_u16()
                ),
            )
        }
    }

    /// A client sent part of a request head and not the rest in time.
    pub fn header_timeout(secs: u64) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "client_header_timeout",
            format!(
                "the request head was not complete {secs}s after its first byte \
                 (--client-header-timeout-secs); send the whole head at once"
            ),
        )
    }

    /// A client did not send its whole request body within the request timeout.
    pub fn body_timeout(secs: u64) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "client_body_timeout",
            format!(
                "the request body did not arrive within {secs}s (--request-timeout-secs); \
                 send the body as fast as the network allows"
            ),
        )
    }

    /// A feature this router does not serve for the request's workers (501, never retried).
    pub fn not_implemented(what: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::NOT_IMPLEMENTED,
            "not_implemented",
            what.to_string(),
        )
    }

    /// A gRPC worker's status: mapped to the HTTP status a client can act on, with the same
    /// codes as the HTTP legs (Unavailable is a connect failure, DeadlineExceeded a timeout).
    pub fn grpc_status(leg: Leg, url: &str, code: tonic::Code, detail: &str) -> Self {
        use tonic::Code;
        let status = match code {
            Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
                StatusCode::BAD_REQUEST
            }
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::NotFound => StatusCode::NOT_FOUND,
            _ => StatusCode::BAD_GATEWAY,
        };
        let base = match code {
            Code::Unavailable => Self::connect_failed(leg, url),
            Code::DeadlineExceeded => Self::upstream_timeout(leg, url),
            _ => Self::upstream_status(leg, url, status, detail),
        };
        let detail = clip(detail);
        Self {
            status,
            retryable: matches!(
                code,
                Code::Unavailable
                    | Code::DeadlineExceeded
                    | Code::ResourceExhausted
                    | Code::Internal
                    | Code::Unknown
                    | Code::Aborted
            ),
            message: format!(
                "{} worker {url} answered gRPC {code:?}: {detail}",
                leg.as_str()
            ),
            ..base
        }
    }

    /// The router is shutting down.
    pub fn shutting_down() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the router is shutting down",
        )
    }

    /// A router bug; the detail is logged, never sent.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!(%detail, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "internal router error",
        )
    }

    /// The JSON body `{"error":{"type","code","message","param"}}` (README, Errors).
    pub fn body_json(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "type": self.status.canonical_reason().unwrap_or("Error"),
                "code": self.code,
                "message": self.message,
                "param": null,
            }
        })
    }

    /// The error as an SSE event, for failures after a stream has started.
    pub fn sse_event(&self) -> bytes::Bytes {
        bytes::Bytes::from(format!("data: {}\n\ndata: [DONE]\n\n", self.body_json()))
    }

    /// The error as a complete HTTP/1.1 response that closes the connection, for the
    /// listener to write itself where no request reached the application (a head that never
    /// completed).
    pub fn http1_closing_response(&self) -> bytes::Bytes {
        let body = serde_json::to_vec(&self.body_json()).unwrap_or_default();
        let mut out = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\n{ERROR_CODE_HEADER}: {}\r\n\
             connection: close\r\ncontent-length: {}\r\n\r\n",
            self.status.as_u16(),
            self.status.canonical_reason().unwrap_or("Error"),
            self.code,
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(&body);
        out.into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.body_json()).unwrap_or_default();
        let mut resp = (self.status, body).into_response();
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(ERROR_CODE_HEADER, HeaderValue::from_static(self.code));
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp.extensions_mut().insert(ErrorCode(self.code));
        resp
    }
}

/// Response extension carrying the error code, for the metrics layer.
#[derive(Debug, Clone, Copy)]
pub struct ErrorCode(pub &'static str);

/// A worker's error detail, trimmed and cut to 512 bytes on a character boundary.
fn clip(detail: &str) -> String {
    let mut detail = detail.trim().to_string();
    if detail.len() > 512 {
        let mut cut = 512;
        while !detail.is_char_boundary(cut) {
            cut -= 1;
        }
        detail.truncate(cut);
    }
    detail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_errors_carry_retry_after_and_code() {
        let rejected = |reason, secs: Option<f64>| Rejected {
            reason,
            retry_after: secs.map(std::time::Duration::from_secs_f64),
        };
        let resp =
            ApiError::admission(rejected(Rejection::QueueTimeout, Some(3.0)), 60).into_response();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            resp.headers()[ERROR_CODE_HEADER],
            "pd_prefill_queue_timeout"
        );
        // The estimate, not the 60 s queue timeout.
        assert_eq!(resp.headers()[header::RETRY_AFTER], "3");
        let full = ApiError::admission(rejected(Rejection::QueueFull, Some(2.5)), 60);
        assert_eq!(full.code, "pd_prefill_queue_full");
        assert!(!full.retryable);
        assert_eq!(full.retry_after, Some(3), "rounded up to whole seconds");
        let unavailable = ApiError::admission(rejected(Rejection::Unavailable, None), 1);
        assert_eq!(unavailable.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(unavailable.retry_after, None);
    }

    #[test]
    fn a_closing_response_is_complete_http() {
        let raw = ApiError::header_timeout(7).http1_closing_response();
        let text = std::str::from_utf8(&raw).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            head.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
            "{head}"
        );
        assert!(head.contains("x-smg-error-code: client_header_timeout"));
        assert!(head.contains("connection: close"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "client_header_timeout");
        assert!(v["error"]["message"].as_str().unwrap().contains("7s"));
    }

    #[test]
    fn grpc_statuses_map_to_http() {
        use tonic::Code;
        let cases = [
            (Code::InvalidArgument, 400, false),
            (Code::OutOfRange, 400, false),
            (Code::FailedPrecondition, 400, false),
            (Code::ResourceExhausted, 429, true),
            (Code::Unavailable, 503, true),
            (Code::DeadlineExceeded, 504, true),
            (Code::Unimplemented, 501, false),
            (Code::NotFound, 404, false),
            (Code::Internal, 502, true),
            (Code::PermissionDenied, 502, false),
        ];
        for (code, status, retryable) in cases {
            let e = ApiError::grpc_status(Leg::Decode, "grpc://h:1", code, "why");
            assert_eq!(e.status.as_u16(), status, "{code:?}");
            assert_eq!(e.retryable, retryable, "{code:?}");
            assert!(e.message.contains("why"), "{}", e.message);
        }
        let e = ApiError::grpc_status(Leg::Prefill, "grpc://h:1", Code::Unavailable, "");
        assert_eq!(e.code, "prefill_connect_failed");
        let e = ApiError::grpc_status(Leg::Decode, "grpc://h:1", Code::DeadlineExceeded, "");
        assert_eq!(e.code, "decode_timeout");
        let e = ApiError::grpc_status(Leg::Decode, "grpc://h:1", Code::InvalidArgument, "");
        assert_eq!(e.code, "decode_worker_error");
    }

    #[test]
    fn body_has_spec_shape() {
        let v = ApiError::not_found("/x").body_json();
        assert_eq!(v["error"]["type"], "Not Found");
        assert_eq!(v["error"]["code"], "not_found");
        assert!(v["error"]["param"].is_null());
    }

    #[test]
    fn worker_status_mapping() {
        let e = ApiError::upstream_status(
            Leg::Decode,
            "http://d",
            StatusCode::SERVICE_UNAVAILABLE,
            "x",
        );
        assert_eq!(e.status, StatusCode::BAD_GATEWAY);
        assert!(e.retryable);
        assert!(e.worker_overloaded);
        let e = ApiError::upstream_status(Leg::Prefill, "http://p", StatusCode::BAD_REQUEST, "bad");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(!e.retryable);
        assert!(!e.worker_overloaded);
        let e =
            ApiError::upstream_status(Leg::Worker, "http://w", StatusCode::TOO_MANY_REQUESTS, "");
        assert!(e.retryable);
        assert!(e.worker_overloaded);
        let e = ApiError::upstream_status(
            Leg::Prefill,
            "http://p",
            StatusCode::INTERNAL_SERVER_ERROR,
            "",
        );
        assert!(!e.worker_overloaded);
        let e = ApiError::grpc_status(Leg::Prefill, "grpc://p", tonic::Code::ResourceExhausted, "");
        assert!(e.worker_overloaded);
        let e = ApiError::grpc_status(Leg::Prefill, "grpc://p", tonic::Code::Unavailable, "");
        assert!(
            !e.worker_overloaded,
            "a connection failure says nothing of load"
        );
    }
}
