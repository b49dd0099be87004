//! The gRPC backend, for SGLang's and TokenSpeed's schedulers and vLLM's engine: the router
//! translates each request once into token-id `Generate` calls ([`plan`](GrpcBackend::plan)),
//! sends them to the chosen workers ([`pd`]: both legs at once, one KV ticket per prompt,
//! EPD's `Encode` calls first ([`encode`]); [`vllm`]: vLLM pairs, the legs in the order their
//! KV connector needs; [`one`]: regular mode) and builds the client's answer from the
//! answering worker's tokens ([`answer`]); the leg task reads a Prefill's streams as
//! [`prefill`] says. What every attempt does to its calls — the
//! worker's runtime, its default sampling parameters, fresh request ids, the DP rank — is
//! [`calls`]'s.

mod answer;
mod calls;
mod encode;
mod one;
mod pd;
mod prefill;
mod vllm;

use std::sync::Arc;

use axum::response::Response;
use pdrouter_policy::Policy;

pub(crate) use answer::GrpcPlan;

use crate::core::{Backend, Core, Pair, RequestCtx};
use crate::error::ApiError;
use crate::registry::{LoadGuard, Worker};
use crate::request::ParsedRequest;

/// A gRPC Prefill leg: what it keeps of its answer is each prompt's prompt logprobs (and a
/// vLLM Prefill's connector parameters).
pub(crate) type PrefillLeg = crate::core::PrefillLeg<prefill::PrefillKept>;

/// gRPC workers: the router's tokenizer, what image parts get, and the Encode policy.
#[derive(Debug)]
pub struct GrpcBackend {
    /// The router's tokenizer (gRPC workers take token ids).
    pub(crate) tokenizer: Option<Arc<crate::grpc::tokenizer::RouterTokenizer>>,
    /// What chat requests' image parts get: served in EPD over a vision model.
    pub(crate) images: crate::images::ImageSupport,
    /// Chooses each image's Encode worker (EPD).
    pub(crate) encode_policy: Arc<Policy>,
    /// How chat answers' tool calls and reasoning are parsed.
    pub(crate) parsers: crate::config::ChatParsers,
    /// HTTP requests a vLLM Mooncake pair needs (its Prefill's bootstrap server).
    pub(crate) client: crate::proxy::client::UpstreamClient,
}

impl GrpcBackend {
    /// Translates `req` once for every attempt.
    pub(crate) async fn plan(&self, req: &ParsedRequest) -> Result<Box<GrpcPlan>, ApiError> {
        let Some(t) = &self.tokenizer else {
            return Err(ApiError::internal("gRPC mode without a tokenizer"));
        };
        let plan = crate::grpc::translate::plan_with(req, &t.tokenizer, &self.images, self.parsers)
            .await?;
        Ok(Box::new(GrpcPlan::new(Arc::new(plan), t.tokenizer.clone())))
    }
}

impl Backend for GrpcBackend {
    type Prepared = GrpcPlan;
    type Answer = Response;

    /// Counted by the tokenizer, as the translation saw them.
    fn prompt_tokens(&self, _: &ParsedRequest, plan: &GrpcPlan) -> u64 {
        plan.prompt_tokens()
    }

    async fn send_pd(
        &self,
        core: &Core,
        _: &ParsedRequest,
        ctx: &RequestCtx,
        plan: &GrpcPlan,
        pair: Pair,
    ) -> Result<Response, ApiError> {
        pd::send(self, core, ctx, plan, pair).await
    }

    async fn send_one(
        &self,
        core: &Core,
        _: &ParsedRequest,
        ctx: &RequestCtx,
        plan: &GrpcPlan,
        worker: Arc<Worker>,
        load: LoadGuard,
    ) -> Result<Response, ApiError> {
        one::send(core, ctx, plan, worker, load).await
    }
}
