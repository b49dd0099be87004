//! Regular mode: one worker per request, body forwarded unchanged.

use axum::body::Body;
use axum::response::Response;

use crate::config::WorkerType;
use crate::dispatch::{Dispatcher, RequestCtx, error_detail, relay_response, upstream_error};
use crate::error::{ApiError, Leg};
use crate::proxy::client::json_post;
use crate::proxy::relay::RelayBody;
use crate::registry::LoadGuard;
use crate::request::ParsedRequest;
use crate::select::Candidates;

impl Dispatcher {
    pub(crate) async fn regular_attempt(
        &self,
        req: &ParsedRequest,
        ctx: &RequestCtx,
    ) -> Result<Response, ApiError> {
        let worker = Candidates::new(
            self.registry.clone(),
            self.policy.clone(),
            WorkerType::Regular,
            Self::wanted(req, ctx),
        )
        .pick()?;
        let load = LoadGuard::new(worker.clone(), req.sub_requests() as u64);
        let rank: Vec<(&'static str, serde_json::Value)> = worker
            .dp_rank()
            .map(|r| ("routed_dp_rank", r.into()))
            .into_iter()
            .collect();
        let body = req.body_with(&rank);
        let upstream = json_post(
            worker.base_url(),
            req.endpoint.path(),
            body,
            worker.api_key(),
            &ctx.request_id,
        );
        let resp = match self.client.send(upstream, self.cfg.request_timeout).await {
            Ok(r) => r,
            Err(e) => {
                self.registry.record_outcome(&worker, false);
                return Err(upstream_error(e, Leg::Worker, worker.url()));
            }
        };
        let status = resp.status();
        if !status.is_success() {
            let detail = error_detail(resp.into_body()).await;
            let err = ApiError::upstream_status(Leg::Worker, worker.url(), status, &detail);
            self.registry.record_outcome(&worker, !err.retryable);
            return Err(err);
        }
        self.registry.record_outcome(&worker, true);
        let (parts, body) = resp.into_parts();
        let relay = RelayBody::new(body, None, None, req.stream, vec![load], None);
        Ok(relay_response(parts, Body::new(relay)))
    }
}
