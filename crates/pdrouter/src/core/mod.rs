//! The request core: one path for every mode, engine and transport.
//!
//! A request goes through the same steps whatever its workers speak:
//! 1. **prepare** — work before admission, done once for every attempt (the backend's, e.g.
//!    a gRPC request's translation to token ids);
//! 2. **pick and admit** ([`pair`]) — the Prefill worker through admission when it is on (may
//!    wait, may be rejected), then the Decode worker and its load, only once the Prefill
//!    reservation succeeded; in regular mode one worker and its load;
//! 3. **run the legs** — the backend's ([`Backend`]): the Prefill leg always as the one task
//!    of [`leg`], which owns the slot and the Prefill load until the Prefill phase is over;
//! 4. **relay** — the backend's answer, a response whose body owns the Decode load and the
//!    Prefill leg, so a client disconnect aborts what still runs and releases the load;
//! 5. **retry** ([`Core::route`]) — a failed attempt is retried with a fresh selection
//!    when its error says a retry may help and nothing reached the client; local admission
//!    rejections never are.
//!
//! The core knows neither the client-facing server nor any worker protocol: a backend brings
//! those, and its answer type is the core's result.

pub mod leg;
mod pair;

use std::future::Future;
use std::sync::Arc;

use pdrouter_admission::Admission;
use pdrouter_policy::Policy;
use tokio::time::Instant;

use crate::config::Config;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::proxy::forward::Forwarded;
use crate::proxy::retry::backoff;
use crate::registry::{LoadGuard, Registry, Worker};
use crate::request::ParsedRequest;

pub use leg::PrefillLeg;
pub(crate) use pair::Pair;

/// Per-request facts from the client-facing edge.
#[derive(Debug, Clone)]
pub struct RequestCtx {
    /// `x-request-id` (a `Box<str>`: this struct lives in every waiting request's future).
    pub request_id: Box<str>,
    /// `X-SMG-Target-Worker` (a `u32`, which leaves room for `priority` in the request's
    /// future, held for the whole wait).
    pub target: Option<u32>,
    /// `X-SMG-Routing-Key`.
    pub routing_key: Option<Arc<str>>,
    /// Client headers passed on to workers (trace context, client credential).
    pub forwarded: Option<Arc<Forwarded>>,
    /// When the request arrived.
    pub started: Instant,
    /// Its priority class (`default` unless priority classes are on).
    pub priority: pdrouter_admission::Priority,
}

/// What differs per engine and transport: how a chosen pair (or worker) is sent the request
/// and its answer relayed. See ARCHITECTURE.md, "Adding an engine".
pub(crate) trait Backend: Sync {
    /// The request as prepared once for every attempt.
    type Prepared: Sync + ?Sized;
    /// The client's answer.
    type Answer: Send;

    /// The prompt tokens a token budget charges for the request.
    fn prompt_tokens(&self, req: &ParsedRequest, prepared: &Self::Prepared) -> u64;

    /// Sends both legs to the chosen pair and returns the answer, which owns `pair`'s Decode
    /// load; the Prefill leg runs through [`leg::spawn`] with the pair's slot and Prefill
    /// load.
    fn send_pd(
        &self,
        core: &Core,
        req: &ParsedRequest,
        ctx: &RequestCtx,
        prepared: &Self::Prepared,
        pair: Pair,
    ) -> impl Future<Output = Result<Self::Answer, ApiError>> + Send;

    /// Sends the request to one worker (regular mode); the answer owns `load`.
    fn send_one(
        &self,
        core: &Core,
        req: &ParsedRequest,
        ctx: &RequestCtx,
        prepared: &Self::Prepared,
        worker: Arc<Worker>,
        load: LoadGuard,
    ) -> impl Future<Output = Result<Self::Answer, ApiError>> + Send;
}

/// The state every request path shares, built once by the composition root.
#[derive(Debug)]
pub struct Core {
    pub(crate) cfg: Arc<Config>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) admission: Option<Admission>,
    /// Sizes the admission limits at run time (`auto`), when configured.
    pub(crate) sizer: Option<Arc<crate::sizing::Sizer>>,
    pub(crate) policy: Arc<Policy>,
    pub(crate) prefill_policy: Arc<Policy>,
    pub(crate) decode_policy: Arc<Policy>,
    /// The tokenizer prefix_hash keys http:// workers' requests with, when the router has one
    /// (`None` in the gRPC modes: their requests carry their ids in the plan).
    pub(crate) prefix_tokenizer: Option<Arc<pdrouter_tokenizer::Tokenizer>>,
}

impl Core {
    /// Routes one request prepared for `backend`, retrying where allowed: the one retry
    /// loop. A failed attempt is retried (a fresh selection, backoff with jitter) only when
    /// its error says a retry may help; counts the request's retries and its final error.
    ///
    /// Takes its arguments by reference so that a request parked in the admission queue holds
    /// them once, in the caller's future, not again in this one's.
    pub(crate) async fn route<B: Backend>(
        &self,
        backend: &B,
        req: &ParsedRequest,
        ctx: &RequestCtx,
        prepared: &B::Prepared,
    ) -> Result<B::Answer, ApiError> {
        let mut n = 1;
        let result = loop {
            if let Err(e) = self.check_model(req) {
                break Err(e);
            }
            let outcome = if self.cfg.mode.is_pd() {
                self.pd_attempt(backend, req, ctx, prepared).await
            } else {
                // Boxed: regular requests never wait for admission, and inline their attempt
                // would size every PD request's future (a parked waiter's) to it.
                Box::pin(self.one_attempt(backend, req, ctx, prepared)).await
            };
            match outcome {
                Err(e) if e.retryable && n < self.cfg.retry.max_attempts => {
                    n += 1;
                    self.metrics.retry(req.endpoint.path());
                    tracing::debug!(code = e.code, attempt = n, "retrying");
                    tokio::time::sleep(backoff(&self.cfg.retry, n)).await;
                }
                other => break other,
            }
        };
        if let Err(e) = &result {
            self.metrics.route_error(req.endpoint.path(), e.code);
        }
        result
    }
}

/// Whether an outcome speaks well of the worker: transport errors and 408/429/5xx count
/// against it (the retryable ones), a 4xx the request caused does not. The one breaker rule
/// for every leg of every transport.
pub(crate) fn worker_ok<T>(outcome: &Result<T, ApiError>) -> bool {
    !matches!(outcome, Err(e) if e.retryable)
}
