//! Upstream HTTP client: pooled keep-alive HTTP/1 connections to workers. Plain `http://`
//! workers are spoken to on the requesting task itself ([`super::h1`]); `https://` workers
//! through hyper's pooled client over rustls (trust roots are the system's — honouring
//! `SSL_CERT_FILE` / `SSL_CERT_DIR` — plus the Mozilla set bundled with webpki-roots).
//!
//! Errors are classified here into [`UpstreamError`] (connect, timeout, broken, too large) so
//! callers map them per leg without inspecting hyper's error types.
//!
//! Bodies the router reads whole (health probes, model and server info, DP discovery) are
//! capped at [`INFO_BODY_LIMIT`]: a worker that streams an endless answer costs one bounded
//! buffer and an error, never unbounded memory. Relayed answers are streamed, never collected.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

pub use super::error::{INFO_BODY_LIMIT, UpstreamError};
pub use super::h1::Fields;

/// The kind of a pooled (TLS) client failure.
fn classify(e: &hyper_util::client::legacy::Error) -> UpstreamError {
    if e.is_connect() {
        UpstreamError::Connect
    } else {
        UpstreamError::Broken
    }
}

/// Shared client (cheap to clone: one reference count, where hyper's client clones several
/// and is a few hundred bytes that every task holding a clone would carry).
#[derive(Clone, Debug)]
pub struct UpstreamClient {
    inner: std::sync::Arc<Clients>,
}

#[derive(Debug)]
struct Clients {
    plain: super::h1::Client,
    tls: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

/// A worker's response body: read off a plain connection by the reading task (`Left`), or
/// from hyper's pooled TLS client (`Right`). Either way its errors are boxed, and the callers
/// map every kind to a broken leg.
pub type UpstreamBody = http_body_util::Either<super::h1::InlineBody, Incoming>;

/// Trust roots for `https://` workers: the system store (which honours `SSL_CERT_FILE` and
/// `SSL_CERT_DIR`) plus the bundled Mozilla roots.
pub(crate) fn tls_config() -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::debug!(error = %e, "skipping a system certificate source");
    }
    let (added, ignored) = roots.add_parsable_certificates(native.certs);
    tracing::debug!(added, ignored, "loaded system trust roots");
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        // ring implements every default protocol version; this cannot fail.
        .expect("ring supports the default TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

impl Default for UpstreamClient {
    fn default() -> Self {
        Self::new()
    }
}

impl UpstreamClient {
    /// A client with keep-alive pooling and Nagle off (small SSE frames must not wait).
    pub fn new() -> Self {
        Self::with_tls(tls_config())
    }

    /// The same, trusting what `tls` says for `https://` (a cluster's own CA, a client
    /// certificate).
    pub fn with_tls(tls: rustls::ClientConfig) -> Self {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(5)));
        http.set_keepalive(Some(Duration::from_secs(60)));
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let inner = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(1024)
            .build(connector);
        Self {
            inner: std::sync::Arc::new(Clients {
                plain: super::h1::Client::default(),
                tls: inner,
            }),
        }
    }

    /// Sends a request (its body whole) and waits for the response head (at most `timeout`).
    pub async fn send(
        &self,
        req: Request<Bytes>,
        timeout: Duration,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        self.send_with(req, timeout, Fields::Kept).await
    }

    /// [`UpstreamClient::send`]; with [`Fields::Dropped`] an answer from a plain `http://`
    /// worker comes without its header fields (for a caller that reads only the status and
    /// the body).
    pub async fn send_with(
        &self,
        req: Request<Bytes>,
        timeout: Duration,
        fields: Fields,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        if req.uri().scheme() == Some(&http::uri::Scheme::HTTP) {
            let sent = self.inner.plain.send_with(req, fields);
            return match tokio::time::timeout(timeout, sent).await {
                Ok(r) => r.map(|resp| resp.map(Either::Left)),
                Err(_) => Err(UpstreamError::Timeout),
            };
        }
        let sent = self.inner.tls.request(req.map(Full::new));
        match tokio::time::timeout(timeout, sent).await {
            Ok(Ok(resp)) => Ok(resp.map(Either::Right)),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "upstream request failed");
                Err(classify(&e))
            }
            Err(_) => Err(UpstreamError::Timeout),
        }
    }

    /// GETs `url` and reads the whole body (at most [`INFO_BODY_LIMIT`] bytes), all within
    /// `timeout`.
    pub async fn get(
        &self,
        url: &str,
        api_key: Option<&str>,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), UpstreamError> {
        let mut builder = Request::get(url);
        if let Some(k) = api_key {
            builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {k}"));
        }
        let req = builder
            .body(Bytes::new())
            .map_err(|_| UpstreamError::Connect)?;
        let fut = async {
            let resp = self.send(req, timeout).await?;
            let status = resp.status();
            let body = http_body_util::Limited::new(resp.into_body(), INFO_BODY_LIMIT)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        UpstreamError::TooLarge
                    } else {
                        UpstreamError::Broken
                    }
                })?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(timeout, fut)
            .await
            .unwrap_or(Err(UpstreamError::Timeout))
    }
}

/// Builds a JSON POST to a worker; a request id or key that cannot be a header value leaves
/// an empty request, which fails as a connection failure (it names no worker).
pub fn json_post(
    base_url: &str,
    path: &'static str,
    body: Bytes,
    api_key: Option<&str>,
    request_id: &str,
) -> Request<Bytes> {
    worker_post(
        Origin::parse(base_url, api_key).as_ref(),
        path,
        body,
        request_id,
    )
}

/// [`json_post`] to a worker whose origin was parsed already (`None`: it could not be, and
/// the empty request fails as a connection failure).
pub fn worker_post(
    origin: Option<&Origin>,
    path: &'static str,
    body: Bytes,
    request_id: &str,
) -> Request<Bytes> {
    origin
        .and_then(|o| o.post(path, body, request_id))
        .unwrap_or_else(|| Request::new(Bytes::new()))
}

/// A worker's `scheme://host[:port]` and credential, parsed once (at registration): a leg's
/// request URI is assembled from shared parts instead of formatting and parsing a string, and
/// the `Authorization` value is made once.
#[derive(Debug, Clone)]
pub struct Origin {
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
    auth: Option<http::HeaderValue>,
}

impl Origin {
    /// `None` when `base_url` is not `scheme://authority` (worker URLs are checked to be so
    /// at registration) or the key cannot be a header value.
    pub fn parse(base_url: &str, api_key: Option<&str>) -> Option<Self> {
        let parts = http::Uri::try_from(base_url).ok()?.into_parts();
        let auth = match api_key {
            Some(k) => Some(http::HeaderValue::try_from(format!("Bearer {k}")).ok()?),
            None => None,
        };
        Some(Self {
            scheme: parts.scheme?,
            authority: parts.authority?,
            auth,
        })
    }

    /// A JSON POST of `body` to `path` (one of the router's own routes) with the request id;
    /// `None` when the id cannot be a header value.
    fn post(&self, path: &'static str, body: Bytes, request_id: &str) -> Option<Request<Bytes>> {
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static(path));
        let uri = http::Uri::from_parts(parts).ok()?;
        let id = http::HeaderValue::from_str(request_id).ok()?;
        // The parts are set directly rather than through `http::request::Builder`, which
        // moves itself through a closure per header and parses names that are constants here.
        let mut req = Request::new(body);
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = uri;
        let h = req.headers_mut();
        h.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        h.insert(http::HeaderName::from_static("x-request-id"), id);
        if let Some(v) = &self.auth {
            h.insert(http::header::AUTHORIZATION, v.clone());
        }
        Some(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_post_carries_its_url_type_id_and_key() {
        let req = json_post(
            "http://w:8000",
            "/generate",
            Bytes::from_static(b"{}"),
            Some("k1"),
            "r-1",
        );
        assert_eq!(req.method(), http::Method::POST);
        assert_eq!(req.uri(), "http://w:8000/generate");
        let names: Vec<_> = req.headers().keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["content-type", "x-request-id", "authorization"]);
        assert_eq!(req.headers()["content-type"], "application/json");
        assert_eq!(req.headers()["x-request-id"], "r-1");
        assert_eq!(req.headers()["authorization"], "Bearer k1");
        let plain = json_post("http://w", "/v1/models", Bytes::new(), None, "r-2");
        assert!(!plain.headers().contains_key("authorization"));
        // A value that cannot be a header fails the whole request (it has no worker to go to).
        let bad = json_post("http://w", "/generate", Bytes::new(), None, "r\n1");
        assert_eq!(bad.uri(), "/");
        assert!(bad.headers().is_empty());
    }
}
