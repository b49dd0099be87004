//! The HTTP backend. A PD pair of SGLang engines gets both legs at once, each body the
//! client's with one KV bootstrap ticket spliced in ([`bootstrap`]); a pair of vLLM engines a
//! Prefill leg first, whose KV transfer params go to the Decode leg ([`vllm`]); a regular
//! worker the client's body. The answer is the worker's body relayed frame by frame ([`relay`]), with the
//! Prefill's prompt logprobs put in front of Decode's when asked for ([`logprobs`]).

pub mod bootstrap;
pub mod exchange;
mod legs;
pub mod logprobs;
mod mooncake;
mod one;
mod pd;
pub mod relay;
mod vllm;

use std::sync::Arc;

use axum::response::Response;

use crate::core::{Backend, Core, Pair, RequestCtx};
use crate::error::ApiError;
use crate::proxy::client::UpstreamClient;
use crate::registry::{LoadGuard, Worker};
use crate::request::ParsedRequest;

/// An HTTP Prefill leg: what it keeps of its answer is the prompt logprobs.
pub(crate) type PrefillLeg = crate::core::PrefillLeg<logprobs::PromptLogprobs>;

/// HTTP workers, through the pooled upstream client.
#[derive(Debug)]
pub struct HttpBackend {
    pub(crate) client: UpstreamClient,
}

impl Backend for HttpBackend {
    /// HTTP requests are sent as received (the router's fields spliced in per attempt).
    type Prepared = ();
    type Answer = Response;

    fn prompt_tokens(&self, req: &ParsedRequest, _: &()) -> u64 {
        req.prompt_tokens
    }

    async fn send_pd(
        &self,
        core: &Core,
        req: &ParsedRequest,
        ctx: &RequestCtx,
        _: &(),
        pair: Pair,
    ) -> Result<Response, ApiError> {
        match pair.prefill.kv_connector() {
            Some(connector) => vllm::send(&self.client, core, req, ctx, pair, connector).await,
            None => pd::send(&self.client, core, req, ctx, pair, None).await,
        }
    }

    async fn send_one(
        &self,
        core: &Core,
        req: &ParsedRequest,
        ctx: &RequestCtx,
        _: &(),
        worker: Arc<Worker>,
        load: LoadGuard,
    ) -> Result<Response, ApiError> {
        one::send(&self.client, core, req, ctx, worker, load).await
    }
}
