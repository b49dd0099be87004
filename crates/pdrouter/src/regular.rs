//! Regular mode: one worker per request. An HTTP worker gets the body unchanged (the
//! router's fields spliced in); a gRPC worker one `Generate` stream of the request the router
//! translated once, with the same answer building as gRPC PD (`grpc::answer`).

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use tokio::time::Instant;

use crate::config::WorkerType;
use crate::dispatch::{Dispatcher, RequestCtx, exchange, model_fill, relay_response, worker_ok};
use crate::error::{ApiError, Leg};
use crate::grpc::answer::{self, GrpcPlan, Source};
use crate::grpc::client::Legs;
use crate::proxy::relay::RelayBody;
use crate::registry::{LoadGuard, Worker};
use crate::request::ParsedRequest;
use crate::select::Candidates;

impl Dispatcher {
    pub(crate) async fn regular_attempt(
        &self,
        req: &ParsedRequest,
        ctx: &RequestCtx,
        grpc: Option<&GrpcPlan>,
    ) -> Result<Response, ApiError> {
        let worker = Candidates::new(
            self.registry.clone(),
            self.policy.clone(),
            WorkerType::Regular,
            self.wanted(req, ctx, &self.policy),
        )
        .pick()?;
        let load = LoadGuard::new(worker.clone(), req.sub_requests() as u64);
        if let Some(grpc) = grpc {
            return self.grpc_regular_send(ctx, grpc, worker, load).await;
        }
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

    /// One `Generate` stream to a gRPC worker; the answer owns the stream and `load`.
    async fn grpc_regular_send(
        &self,
        ctx: &RequestCtx,
        grpc: &GrpcPlan,
        worker: Arc<Worker>,
        load: LoadGuard,
    ) -> Result<Response, ApiError> {
        let Some(ch) = worker.grpc() else {
            return Err(ApiError::internal(
                "a gRPC regular worker without a channel",
            ));
        };
        let runtime = ch
            .detect(self.cfg.health.timeout)
            .await
            .map_err(|s| crate::grpc::answer::status_error(Leg::Worker, worker.url(), &s))?;
        if grpc.plan.logprobs.input_from.is_some() && !runtime.serves_prompt_logprobs() {
            return Err(crate::grpc::translate::unsupported_on(
                "prompt logprobs (logprob_start_len)",
                runtime,
            ));
        }
        let defaults = worker
            .model()
            .map(|m| m.sampling_defaults.clone())
            .unwrap_or_default();
        let mut reqs = grpc.plan.calls(runtime, &defaults);
        // Fresh ids per attempt, so an abort of a failed one never hits its retry.
        let base = format!("{}-{:x}", ctx.request_id, rand::random::<u32>());
        let several = reqs.len() > 1;
        for (i, r) in reqs.iter_mut().enumerate() {
            r.req.request_id = if several {
                format!("{base}-{i}")
            } else {
                base.clone()
            };
            r.dp_rank = worker.dp_rank();
        }
        let deadline = crate::config::deadline_after(Instant::now(), self.cfg.request_timeout);
        let stream = tracing::Instrument::instrument(
            answer::start(
                Leg::Worker,
                &worker,
                Legs::start(ch, reqs),
                deadline,
                &self.registry,
            ),
            crate::telemetry::leg_span(Leg::Worker, worker.url()),
        )
        .await?;
        let src = Source {
            worker,
            stream,
            load,
            leg: None,
            input: None,
        };
        self.grpc_answer(ctx, grpc, base, src, deadline).await
    }
}
