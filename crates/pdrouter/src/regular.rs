//! Regular mode: one worker per request, body forwarded unchanged.

use axum::body::Body;
use axum::response::Response;

use crate::config::WorkerType;
use crate::dispatch::{Dispatcher, RequestCtx, exchange, model_fill, relay_response, worker_ok};
use crate::error::{ApiError, Leg};
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
            self.wanted(req, ctx, &self.policy),
        )
        .pick()?;
        let load = LoadGuard::new(worker.clone(), req.sub_requests() as u64);
        let fields: Vec<(&'static str, serde_json::Value)> = worker
            .dp_rank()
            .map(|r| ("routed_dp_rank", r.into()))
            .into_iter()
            .chain(model_fill(req, &worker))
            .collect();
        let body = req.body_with(&fields);
        let outcome = tracing::Instrument::instrument(
            exchange(
                &self.client,
                &worker,
                Leg::Worker,
                req.endpoint.path(),
                body,
                ctx,
                self.cfg.request_timeout,
            ),
            crate::telemetry::leg_span(Leg::Worker, worker.url()),
        )
        .await;
        self.registry.record_outcome(&worker, worker_ok(&outcome));
        let resp = outcome?;
        let (parts, body) = resp.into_parts();
        let relay = RelayBody::new(
            Some(body),
            std::collections::VecDeque::new(),
            None,
            req.stream,
            load,
            None,
        );
        Ok(relay_response(parts, Body::new(relay)))
    }
}
