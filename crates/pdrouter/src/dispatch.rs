//! Dispatch: the request core and the backends put together. A request is prepared for the
//! mode's backend (over gRPC: translated once, for every attempt), then routed by the core
//! (`core::Core::route`: pick and admit, the legs, the answer, retries).

use std::future::Future;

use axum::response::Response;
use futures_util::future::Either;

use crate::backends::grpc::GrpcBackend;
use crate::backends::http::HttpBackend;
use crate::core::Core;
use crate::error::ApiError;
use crate::request::ParsedRequest;

pub use crate::core::RequestCtx;

/// Everything routing needs, built once by the composition root.
#[derive(Debug)]
pub struct Dispatcher {
    pub(crate) core: Core,
    pub(crate) http: HttpBackend,
    /// gRPC workers' backend, in the gRPC modes.
    pub(crate) grpc: Option<GrpcBackend>,
}

impl Dispatcher {
    /// Routes one inference request, retrying where allowed.
    ///
    /// Takes its arguments by reference so that a request parked in the admission queue holds
    /// them once, in the caller's future, not again in this one's; and returns the core's
    /// future itself (not one wrapping it) for HTTP workers, whose waiters it sizes.
    pub fn route<'a>(
        &'a self,
        req: &'a mut ParsedRequest,
        ctx: &'a RequestCtx,
    ) -> impl Future<Output = Result<Response, ApiError>> + Send + 'a {
        let req = &*req;
        self.core.metrics.routed(req.endpoint.path());
        match &self.grpc {
            None => Either::Left(self.core.route(&self.http, req, ctx, &())),
            // Boxed: the translation's state and the gRPC route's stay out of the HTTP path.
            Some(grpc) => Either::Right(Box::pin(self.grpc_route(grpc, req, ctx))),
        }
    }

    /// gRPC workers take token ids: the request is translated once, for every attempt.
    async fn grpc_route(
        &self,
        grpc: &GrpcBackend,
        req: &ParsedRequest,
        ctx: &RequestCtx,
    ) -> Result<Response, ApiError> {
        let plan = match grpc.plan(req).await {
            Ok(plan) => plan,
            Err(e) => {
                self.core.metrics.route_error(req.endpoint.path(), e.code);
                return Err(e);
            }
        };
        self.core.route(grpc, req, ctx, &plan).await
    }
}
