//! Regular mode over gRPC: one `Generate` stream per prompt to the one worker, the answer
//! built from its tokens as in PD.

use std::sync::Arc;

use axum::response::Response;
use tokio::time::Instant;

use super::answer::{self, GrpcPlan, Source};
use super::calls::{self, channel};
use crate::core::{Core, RequestCtx};
use crate::error::{ApiError, Leg};
use crate::grpc::client::Legs;
use crate::registry::{LoadGuard, Worker};

/// Sends the request's calls to `worker`; the answer owns the streams and `load`.
pub(super) async fn send(
    core: &Core,
    ctx: &RequestCtx,
    grpc: &GrpcPlan,
    worker: Arc<Worker>,
    load: LoadGuard,
) -> Result<Response, ApiError> {
    let ch = channel(&worker, Leg::Worker)?;
    let runtime = calls::runtime(&worker, Leg::Worker, core.cfg.health.timeout).await?;
    calls::check(&grpc.plan, runtime)?;
    let tag = u64::from(rand::random::<u32>());
    let (mut reqs, request_id) = calls::calls(&grpc.plan, runtime, &worker, ctx, tag);
    calls::on_rank(&mut reqs, &worker);
    let deadline = crate::config::deadline_after(Instant::now(), core.cfg.request_timeout);
    let stream = tracing::Instrument::instrument(
        answer::start(
            Leg::Worker,
            &worker,
            Legs::start(ch, reqs),
            deadline,
            &core.registry,
        ),
        crate::telemetry::leg_span(Leg::Worker, worker.url()),
    )
    .await?;
    let src = Source {
        worker,
        stream,
        load,
        leg: None,
    };
    answer::answer(core, ctx, grpc, request_id, src, deadline).await
}
