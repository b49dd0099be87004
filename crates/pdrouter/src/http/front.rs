//! The front door of every client connection: an inference request (POST on an inference
//! route's exact path) goes straight to its route's service stack; every other request goes
//! through axum's router.
//!
//! Why: through the router an inference request paid about 4,000 instructions and 9
//! allocations before its handler ran (the route lookup, the matched-path and parameter
//! extensions, a boxed route future per layer and their wrappers, the tower adapter's clone of
//! the router), 5% of a small HTTP PD request's work in the router.
//!
//! Invariants:
//! - The stack is the one the router runs for these routes, in the same order: the access
//!   record and request id ([`Observe`]), CORS when origins are configured, the API key when
//!   one is configured, then [`Infer`]. So the answer, the headers and the metrics are the same
//!   whichever way a request comes in.
//! - A request whose method or path is anything else reaches the router untouched: 404, 405,
//!   CORS preflights (`OPTIONS`) and every other route keep the router's answers.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request};
use axum::response::Response;
use futures_util::future::Either;
use hyper::body::Incoming;
use tower_service::Service;

use super::AppState;
use super::cors::CorsService;
use super::handlers::Infer;
use super::middleware::{Auth, Gate, Observe};
use crate::request::Endpoint;

/// One inference route's services, outermost first.
type Stack = Observe<CorsService<Auth<Infer>>>;

/// The service every client connection is served by; see the module docs. Cloned per
/// connection: an `Arc` and the router's handle.
#[derive(Clone)]
pub(crate) struct Front {
    stacks: Arc<[Stack; 4]>,
    router: Router,
}

impl std::fmt::Debug for Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Front").finish_non_exhaustive()
    }
}

impl Front {
    /// `router` serves everything; the inference routes also get their direct stacks, guarded
    /// by `gate` (the inference routes' credential, if any), with `cors` (the origins, if any):
    /// the ones the router's layers hold.
    pub(crate) fn new(
        state: &Arc<AppState>,
        router: Router,
        gate: Option<Arc<Gate>>,
        cors: Option<Arc<crate::edge::Cors>>,
    ) -> Self {
        let stacks = Endpoint::ALL.map(|endpoint| {
            let infer = Infer::new(state.clone(), endpoint);
            let guarded = CorsService::new(Auth::new(infer, gate.clone()), cors.clone());
            Observe::route(guarded, state.clone(), endpoint.path())
        });
        Self {
            stacks: Arc::new(stacks),
            router,
        }
    }
}

/// The inference route `method` and `path` name exactly, as an index into [`Endpoint::ALL`].
fn inference_route(method: &Method, path: &str) -> Option<usize> {
    if method != Method::POST {
        return None;
    }
    Endpoint::ALL.iter().position(|e| e.path() == path)
}

impl hyper::service::Service<Request<Incoming>> for Front {
    type Response = Response;
    type Error = Infallible;
    type Future = Either<
        <Stack as Service<axum::extract::Request>>::Future,
        <Router as Service<Request<Incoming>>>::Future,
    >;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        match inference_route(req.method(), req.uri().path()) {
            // The stack's services are always ready (none holds back), as the router's are.
            Some(i) => Either::Left(self.stacks[i].clone().call(req.map(Body::new))),
            None => Either::Right(self.router.clone().call(req)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_post_on_an_inference_path_takes_the_direct_way() {
        for (i, e) in Endpoint::ALL.iter().enumerate() {
            assert_eq!(inference_route(&Method::POST, e.path()), Some(i));
            assert_eq!(inference_route(&Method::GET, e.path()), None);
            assert_eq!(inference_route(&Method::OPTIONS, e.path()), None);
            assert_eq!(inference_route(&Method::PUT, e.path()), None);
            assert_eq!(
                inference_route(&Method::POST, &format!("{}/", e.path())),
                None
            );
            assert_eq!(
                inference_route(&Method::POST, &e.path().to_uppercase()),
                None
            );
        }
        for other in [
            "/",
            "/health",
            "/workers",
            "/v1/models",
            "/generate_x",
            "//generate",
        ] {
            assert_eq!(inference_route(&Method::POST, other), None, "{other}");
        }
    }
}
