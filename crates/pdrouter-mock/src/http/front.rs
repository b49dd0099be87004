//! The connection service of an SGLang-mode HTTP worker.
//!
//! A POST on one of the four generation paths goes straight to its handler; every other
//! request goes to the axum router. Benchmarks put one mock process beside the load
//! generator on one core, so the router's route matching, middleware and extractors were a
//! large part of what each generation request cost that core.
//!
//! Invariant: a request gets the same answer either way. The direct path checks the API key
//! as the router's middleware does and buffers the body under the same limit, answering an
//! oversized body as the router's extractor does (413, the same text).

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::service::TowerToHyperService;

use super::handlers::{self, BODY_LIMIT};
use super::request::Api;
use crate::state::Shared;

/// One connection's service: `shared` for the direct path, `app` for everything else.
#[derive(Clone)]
pub(crate) struct Front {
    shared: Arc<Shared>,
    app: TowerToHyperService<Router>,
}

impl Front {
    pub(crate) fn new(shared: Arc<Shared>, app: Router) -> Self {
        Front {
            shared,
            app: TowerToHyperService::new(app),
        }
    }
}

/// The generation API a request goes straight to, if it is one (exact path, POST).
fn direct_api<B>(req: &Request<B>) -> Option<Api> {
    if req.method() != Method::POST {
        return None;
    }
    let path = req.uri().path();
    Api::ALL.into_iter().find(|api| api.path() == path)
}

impl hyper::service::Service<Request<Incoming>> for Front {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        match direct_api(&req) {
            Some(api) => {
                let shared = Arc::clone(&self.shared);
                Box::pin(async move { Ok(direct(shared, api, req).await) })
            }
            None => Box::pin(self.app.call(req.map(Body::new))),
        }
    }
}

/// A generation request without the router: key, body, handler.
async fn direct<B>(shared: Arc<Shared>, api: Api, req: Request<B>) -> Response
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let (parts, body) = req.into_parts();
    if !handlers::key_ok(&shared, &parts.headers) {
        return handlers::unauthorized();
    }
    let body = match Limited::new(body, BODY_LIMIT).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                "Failed to buffer the request body: length limit exceeded",
            )
                .into_response();
        }
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("Failed to buffer the request body: {e}"),
            )
                .into_response();
        }
    };
    handlers::generation(State(shared), api, parts.headers, body).await
}

#[cfg(test)]
mod tests {
    use http_body_util::Full;

    use super::*;
    use crate::config::{MockConfig, Role};

    fn shared(api_key: Option<&str>) -> Arc<Shared> {
        let mut cfg = MockConfig::new(Role::Regular);
        cfg.api_key = api_key.map(str::to_owned);
        Arc::new(Shared::new(&cfg, ([127, 0, 0, 1], 0).into()))
    }

    async fn answer(shared: Arc<Shared>, body: Bytes, key: Option<&str>) -> (StatusCode, Bytes) {
        let mut req = Request::builder().method(Method::POST).uri("/generate");
        if let Some(k) = key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        let Ok(req) = req.body(Full::new(body)) else {
            unreachable!("a valid request")
        };
        let resp = direct(shared, Api::Generate, req).await;
        let status = resp.status();
        let body = resp.into_body().collect().await.map(|c| c.to_bytes());
        (status, body.unwrap_or_default())
    }

    #[tokio::test]
    async fn the_direct_path_answers_what_the_router_would() {
        let ok = Bytes::from_static(br#"{"text":"hi"}"#);
        let (status, body) = answer(shared(None), ok.clone(), None).await;
        assert_eq!(status, StatusCode::OK, "{body:?}");
        // The key, as the router's middleware checks it.
        let (status, _) = answer(shared(Some("k1")), ok.clone(), None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, _) = answer(shared(Some("k1")), ok.clone(), Some("k2")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, _) = answer(shared(Some("k1")), ok, Some("k1")).await;
        assert_eq!(status, StatusCode::OK);
        // A body over the limit: 413, as the router's extractor answers it.
        let big = Bytes::from(vec![b' '; BODY_LIMIT + 1]);
        let (status, body) = answer(shared(None), big, None).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(
            body,
            "Failed to buffer the request body: length limit exceeded"
        );
    }

    #[test]
    fn only_an_exact_post_on_a_generation_path_goes_direct() {
        let req = |m: Method, p: &str| Request::builder().method(m).uri(p).body(()).ok();
        for (path, api) in [
            ("/generate", Api::Generate),
            ("/v1/chat/completions", Api::Chat),
            ("/v1/completions", Api::Completion),
            ("/v1/responses", Api::Responses),
        ] {
            let post = req(Method::POST, path).map(|r| direct_api(&r));
            assert_eq!(post, Some(Some(api)), "{path}");
            let get = req(Method::GET, path).map(|r| direct_api(&r));
            assert_eq!(get, Some(None), "GET {path}");
        }
        for path in [
            "/generate/",
            "/Generate",
            "/health",
            "/mock/stats",
            "/v1/models",
        ] {
            let post = req(Method::POST, path).map(|r| direct_api(&r));
            assert_eq!(post, Some(None), "{path}");
        }
    }
}
