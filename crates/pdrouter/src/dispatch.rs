//! Dispatch: the request core and the backends put together. A request is prepared for the
//! mode's backend (over gRPC: translated once, for every attempt), then routed by the core
//! (`core::Core::route`: pick and admit, the legs, the answer, retries).

use axum::response::Response;

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
    /// them once, in the caller's future, not again in this one's.
    pub async fn route(
        &self,
        req: &mut ParsedRequest,
        ctx: &RequestCtx,
    ) -> Result<Response, ApiError> {
        let req = &*req;
        let route = req.endpoint.path();
        self.core.metrics.routed(route);
        let Some(grpc) = &self.grpc else {
            return self.core.route(&self.http, req, ctx, &()).await;
        };
        // gRPC workers take token ids: the request is translated once, for every attempt.
        // Boxed: an HTTP request parked in the admission queue holds this future, which must
        // not grow by the translation's state.
        let plan = match Box::pin(grpc.plan(req)).await {
            Ok(plan) => plan,
            Err(e) => {
                self.core.metrics.route_error(route, e.code);
                return Err(e);
            }
        };
        self.core.route(grpc, req, ctx, &plan).await
    }
}
