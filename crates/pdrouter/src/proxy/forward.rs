//! The client headers that travel on to workers, and which credential a worker gets.
//!
//! Requests to workers are built from scratch, so nothing reaches a worker unless it is listed
//! here: hop-by-hop headers (`connection`, `te`, `upgrade`, …) and everything else the client
//! sent stay behind. What goes on, on every leg:
//! - trace context (`traceparent`, `tracestate`), correlation ids (`x-correlation-id`,
//!   `x-request-id-*`) and `x-smg-routing-key`, as the client sent them (with
//!   `--enable-trace`, `dispatch::exchange` then replaces the trace context with the leg
//!   span's: see `telemetry`);
//! - `x-request-id`, the router's own (the client's, or the one it generated);
//! - exactly one `Authorization`: the worker's own key when it has one (a startup worker has
//!   `--api-key`), otherwise the client's header, otherwise none.
//!
//! Values are copied out of the client's request: hyper's header values are slices of the
//! connection's read buffer, and a request parked in the admission queue must not pin it.

use std::sync::Arc;

use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderName, HeaderValue};

/// Headers passed on exactly as the client sent them.
const PASSED_ON: [&str; 4] = [
    "traceparent",
    "tracestate",
    "x-correlation-id",
    "x-smg-routing-key",
];

/// Headers whose name starts with this are passed on too (`x-request-id` itself is the
/// router's, set by [`super::client::json_post`]).
const PASSED_ON_PREFIX: &str = "x-request-id-";

/// What one client request passes on to its workers.
#[derive(Debug, Default)]
pub struct Forwarded {
    headers: Vec<(HeaderName, HeaderValue)>,
    authorization: Option<HeaderValue>,
}

/// Copies a value into its own allocation (see the module docs).
fn owned(v: &HeaderValue) -> Option<HeaderValue> {
    let mut copy = HeaderValue::from_bytes(v.as_bytes()).ok()?;
    copy.set_sensitive(v.is_sensitive());
    Some(copy)
}

impl Forwarded {
    /// Picks what to pass on from a client's headers; `None` when there is nothing.
    pub fn from_client(headers: &HeaderMap) -> Option<Arc<Self>> {
        let mut out = Self::default();
        for (name, value) in headers {
            let n = name.as_str();
            if PASSED_ON.contains(&n) || n.starts_with(PASSED_ON_PREFIX) {
                out.headers.extend(owned(value).map(|v| (name.clone(), v)));
            }
        }
        // Only the first: a worker gets one Authorization, whatever the client sent.
        out.authorization = headers.get(AUTHORIZATION).and_then(owned).map(|mut v| {
            v.set_sensitive(true);
            v
        });
        (!out.headers.is_empty() || out.authorization.is_some()).then(|| Arc::new(out))
    }

    /// Adds the passed-on headers to a request for a worker, and the client's `Authorization`
    /// unless the worker has a key of its own (already set on the request).
    pub fn apply<B>(&self, req: &mut http::Request<B>, worker_has_key: bool) {
        let headers = req.headers_mut();
        for (name, value) in &self.headers {
            headers.append(name.clone(), value.clone());
        }
        if !worker_has_key && let Some(auth) = &self.authorization {
            headers.insert(AUTHORIZATION, auth.clone());
        }
    }
}

/// The `Authorization` value for a worker key, marked sensitive so it is never printed.
pub fn bearer(key: &str) -> Option<HeaderValue> {
    let mut v = HeaderValue::try_from(format!("Bearer {key}")).ok()?;
    v.set_sensitive(true);
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client_headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn sent(f: Option<&Forwarded>, worker_key: Option<&str>) -> HeaderMap {
        let mut req = http::Request::new(());
        if let Some(k) = worker_key {
            req.headers_mut().insert(AUTHORIZATION, bearer(k).unwrap());
        }
        if let Some(f) = f {
            f.apply(&mut req, worker_key.is_some());
        }
        req.headers().clone()
    }

    #[test]
    fn passes_on_trace_and_correlation_headers_only() {
        let h = client_headers(&[
            ("traceparent", "00-abc-def-01"),
            ("tracestate", "k=v"),
            ("x-correlation-id", "c1"),
            ("x-request-id-upstream", "u1"),
            ("x-smg-routing-key", "user-7"),
            ("connection", "keep-alive, x-correlation-id"),
            ("te", "trailers"),
            ("upgrade", "h2c"),
            ("cookie", "secret"),
            ("x-request-id", "client-id"),
        ]);
        let f = Forwarded::from_client(&h).unwrap();
        let out = sent(Some(&f), None);
        for name in [
            "traceparent",
            "tracestate",
            "x-correlation-id",
            "x-request-id-upstream",
            "x-smg-routing-key",
        ] {
            assert_eq!(out.get(name), h.get(name), "{name}");
        }
        for name in ["connection", "te", "upgrade", "cookie", "x-request-id"] {
            assert!(out.get(name).is_none(), "{name} must not be passed on");
        }
        assert!(Forwarded::from_client(&client_headers(&[("te", "x")])).is_none());
    }

    #[test]
    fn exactly_one_authorization_and_the_workers_key_wins() {
        let h = client_headers(&[
            ("authorization", "Bearer client"),
            ("authorization", "Bearer second"),
        ]);
        let f = Forwarded::from_client(&h).unwrap();
        let out = sent(Some(&f), None);
        let auth: Vec<_> = out.get_all(AUTHORIZATION).iter().collect();
        assert_eq!(auth, ["Bearer client"]);
        let out = sent(Some(&f), Some("worker"));
        let auth: Vec<_> = out.get_all(AUTHORIZATION).iter().collect();
        assert_eq!(auth, ["Bearer worker"]);
        assert!(sent(None, None).get(AUTHORIZATION).is_none());
        assert!(bearer("bad\nkey").is_none());
    }
}
