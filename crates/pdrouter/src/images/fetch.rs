//! Fetching `http(s)://` images for `image_url` parts, within the operator's limits.
//!
//! Invariants:
//! - Every fetch ends within `--image-fetch-timeout-secs`, all hops and the body included
//!   (one `tokio::time` deadline around the whole fetch; no other timer can end it first).
//! - At most [`MAX_REDIRECTS`] redirects are followed; every hop's URL is checked again
//!   (scheme, credentials, address policy) before it is requested.
//! - A connection is only ever made to an address the [`AddressPolicy`] allows: IP literals
//!   are checked before the request, host names in the connector's resolver, which hands the
//!   connector only the allowed addresses it resolved (so the checked address is the one
//!   connected to).
//! - At most `--max-image-bytes` bytes of a body are held: a larger `Content-Length` is refused
//!   before reading, and a body without one is cut off one byte past the limit.
//!
//! The client is the router's hyper stack (hyper-util's pooled client, rustls for https with
//! the same trust roots as `https://` workers), with its own resolver; no proxy environment
//! variables are honoured.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::TokioExecutor;

use super::address::AddressPolicy;
use crate::config::ImageConfig;

/// Most redirects followed for one image.
pub const MAX_REDIRECTS: usize = 3;

/// How fetching an image failed; every case is about the client's URL or the server it names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// Not a URL the router can request.
    #[error("'{0}' is not a valid http(s) URL")]
    InvalidUrl(String),
    /// The URL names a user or password.
    #[error("image URLs must not carry credentials")]
    Credentials,
    /// A redirect to another scheme.
    #[error("redirected to a '{0}' URL; only http and https are fetched")]
    Scheme(String),
    /// The host is (or resolves only to) addresses the policy refuses.
    #[error(
        "image host '{host}' is not a public address; the router does not fetch from private \
         networks (--allow-private-image-urls)"
    )]
    PrivateAddress {
        /// The host as written in the URL.
        host: String,
    },
    /// The host name does not resolve.
    #[error("image host '{host}' cannot be resolved")]
    Resolve {
        /// The host as written in the URL.
        host: String,
    },
    /// No connection could be made.
    #[error("could not connect to the image server")]
    Connect,
    /// The whole fetch took longer than allowed.
    #[error("the image was not fetched within {secs}s (--image-fetch-timeout-secs)")]
    Timeout {
        /// The limit, in seconds.
        secs: u64,
    },
    /// A status other than success or redirect.
    #[error("the image server answered {0}")]
    Status(u16),
    /// Redirected more often than allowed.
    #[error("the image URL redirected more than {max} times")]
    TooManyRedirects {
        /// The limit.
        max: usize,
    },
    /// A redirect without a usable `Location`.
    #[error("the image server redirected without a usable Location")]
    BadRedirect,
    /// The body is over the byte limit.
    #[error("the image is over the {limit}-byte limit (--max-image-bytes)")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// The connection broke or the answer was not HTTP.
    #[error("the image server broke off its answer")]
    Broken,
}

/// Raised by the resolver when every address of a host is refused.
#[derive(Debug, thiserror::Error)]
#[error("every address of {0} is refused")]
struct Refused(String);

/// Raised by the resolver when a host does not resolve.
#[derive(Debug, thiserror::Error)]
#[error("{0} does not resolve")]
struct Unresolved(String);

/// Resolves host names and keeps only the addresses the policy allows.
#[derive(Debug, Clone)]
struct GuardedResolver {
    policy: Arc<AddressPolicy>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let policy = self.policy.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> = match tokio::net::lookup_host((host.as_str(), 0)).await
            {
                Ok(addrs) => addrs.collect(),
                Err(_) => Vec::new(),
            };
            if resolved.is_empty() {
                return Err(Box::new(Unresolved(host)) as BoxError);
            }
            let allowed: Vec<SocketAddr> = resolved
                .into_iter()
                .filter(|a| policy.allows(a.ip()))
                .collect();
            if allowed.is_empty() {
                return Err(Box::new(Refused(host)) as BoxError);
            }
            Ok(allowed.into_iter())
        })
    }
}

/// Fetches images over http(s) within the configured limits (cheap to clone).
#[derive(Debug, Clone)]
pub struct ImageFetcher {
    client: Client<HttpsConnector<HttpConnector<GuardedResolver>>, Empty<Bytes>>,
    policy: Arc<AddressPolicy>,
    max_bytes: u64,
    timeout: Duration,
}

/// One hop's request target.
#[derive(Debug)]
struct Target {
    uri: Uri,
    host: String,
}

/// `Location` schemes: RFC 3986 `scheme ":"` before any `/`, `?` or `#`.
fn scheme_of(s: &str) -> Option<&str> {
    let end = s.find(':')?;
    let scheme = &s[..end];
    let mut chars = scheme.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(scheme)
}

/// Resolves a redirect's `Location` against the URL that answered it.
fn join(base: &Uri, location: &str) -> Result<String, FetchError> {
    let loc = location.trim();
    if loc.is_empty() {
        return Err(FetchError::BadRedirect);
    }
    if scheme_of(loc).is_some() {
        return Ok(loc.to_owned());
    }
    let scheme = base.scheme_str().unwrap_or("http");
    if loc.starts_with("//") {
        return Ok(format!("{scheme}:{loc}"));
    }
    let authority = base.authority().map_or("", |a| a.as_str());
    if loc.starts_with('/') {
        return Ok(format!("{scheme}://{authority}{loc}"));
    }
    let path = base.path();
    let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
    let dir = if dir.is_empty() { "/" } else { dir };
    Ok(format!("{scheme}://{authority}{dir}{loc}"))
}

fn clip(url: &str) -> String {
    url.chars().take(200).collect()
}

impl ImageFetcher {
    /// A fetcher with the limits and address policy of `config`.
    pub fn new(config: &ImageConfig) -> Self {
        Self::with_policy(config, AddressPolicy::from_flag(config.allow_private_urls))
    }

    pub(crate) fn with_policy(config: &ImageConfig, policy: AddressPolicy) -> Self {
        let policy = Arc::new(policy);
        let mut http = HttpConnector::new_with_resolver(GuardedResolver {
            policy: policy.clone(),
        });
        http.enforce_http(false);
        http.set_nodelay(true);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(crate::proxy::client::tls_config())
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(4)
            .build(connector);
        ImageFetcher {
            client,
            policy,
            max_bytes: config.max_bytes,
            timeout: config.fetch_timeout,
        }
    }

    /// The body of `url`, following redirects, within the time and byte limits.
    pub async fn fetch(&self, url: &str) -> Result<Bytes, FetchError> {
        let secs = self.timeout.as_secs();
        tokio::time::timeout(self.timeout, self.follow(url))
            .await
            .unwrap_or(Err(FetchError::Timeout { secs }))
    }

    /// Checks one hop's URL: http(s), a host, no credentials, an allowed IP literal.
    fn target(&self, url: &str) -> Result<Target, FetchError> {
        if let Some(scheme) = scheme_of(url)
            && !scheme.eq_ignore_ascii_case("http")
            && !scheme.eq_ignore_ascii_case("https")
        {
            return Err(FetchError::Scheme(scheme.chars().take(32).collect()));
        }
        let uri: Uri = url.parse().map_err(|_| FetchError::InvalidUrl(clip(url)))?;
        let authority = uri
            .authority()
            .ok_or_else(|| FetchError::InvalidUrl(clip(url)))?;
        if authority.as_str().contains('@') {
            return Err(FetchError::Credentials);
        }
        let host = authority.host().to_owned();
        if host.is_empty() {
            return Err(FetchError::InvalidUrl(clip(url)));
        }
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>()
            && !self.policy.allows(ip)
        {
            return Err(FetchError::PrivateAddress { host });
        }
        Ok(Target { uri, host })
    }

    async fn follow(&self, url: &str) -> Result<Bytes, FetchError> {
        let mut target = self.target(url)?;
        for hop in 0..=MAX_REDIRECTS {
            let req = Request::get(target.uri.clone())
                .header(
                    header::USER_AGENT,
                    concat!("pdrouter/", env!("CARGO_PKG_VERSION")),
                )
                .header(header::ACCEPT, "image/png, image/jpeg, image/webp")
                .body(Empty::new())
                .map_err(|_| FetchError::InvalidUrl(clip(url)))?;
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| classify(&e, &target.host))?;
            let status = resp.status();
            if matches!(
                status,
                StatusCode::MOVED_PERMANENTLY
                    | StatusCode::FOUND
                    | StatusCode::SEE_OTHER
                    | StatusCode::TEMPORARY_REDIRECT
                    | StatusCode::PERMANENT_REDIRECT
            ) {
                if hop == MAX_REDIRECTS {
                    return Err(FetchError::TooManyRedirects { max: MAX_REDIRECTS });
                }
                let location = resp
                    .headers()
                    .get(header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .ok_or(FetchError::BadRedirect)?;
                target = self.target(&join(&target.uri, location)?)?;
                continue;
            }
            if !status.is_success() {
                return Err(FetchError::Status(status.as_u16()));
            }
            let too_large = FetchError::TooLarge {
                limit: self.max_bytes,
            };
            let announced = resp
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if announced.is_some_and(|n| n > self.max_bytes) {
                return Err(too_large);
            }
            let limit = usize::try_from(self.max_bytes).unwrap_or(usize::MAX);
            return match Limited::new(resp.into_body(), limit).collect().await {
                Ok(body) => Ok(body.to_bytes()),
                Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large),
                Err(_) => Err(FetchError::Broken),
            };
        }
        Err(FetchError::TooManyRedirects { max: MAX_REDIRECTS })
    }
}

/// A client error as a [`FetchError`]: the resolver's verdicts are found in its source chain.
fn classify(e: &hyper_util::client::legacy::Error, host: &str) -> FetchError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.downcast_ref::<Refused>().is_some() {
            return FetchError::PrivateAddress {
                host: host.to_owned(),
            };
        }
        if err.downcast_ref::<Unresolved>().is_some() {
            return FetchError::Resolve {
                host: host.to_owned(),
            };
        }
        source = err.source();
    }
    if e.is_connect() {
        FetchError::Connect
    } else {
        FetchError::Broken
    }
}

#[cfg(test)]
mod tests;
