//! HTTP front-end: SGLang's HTTP and OpenAI-style API over the engine model, or vLLM's
//! OpenAI server with the NIXL, Mooncake or LMCache KV connector (`vllm`, over the
//! transport-neutral [`crate::vllm_kv`]), and the KV transfers' serving routes (`nixl`,
//! `mooncake`, `lmcache`), which a vLLM gRPC worker mounts too.

mod body;
pub(crate) mod front;
pub(crate) mod handlers;
pub(crate) mod lmcache;
mod mooncake;
pub(crate) mod nixl;
mod output;
mod render;
mod request;
mod vllm;

use std::sync::Arc;

use crate::config::HttpRuntime;
use crate::state::Shared;

/// The routes of the server the worker imitates.
pub(crate) fn router(shared: Arc<Shared>) -> axum::Router {
    match shared.http_runtime {
        HttpRuntime::Sglang => handlers::router(shared),
        HttpRuntime::Vllm => vllm::router(shared),
    }
}

/// vLLM mode, Mooncake producer: the routes of its bootstrap server.
pub(crate) fn mooncake_bootstrap_router(shared: Arc<Shared>) -> axum::Router {
    mooncake::bootstrap_router(shared)
}
