//! gRPC front-end: SGLang's or TokenSpeed's scheduler protocol, or vLLM's engine protocol,
//! over the same engine model as the HTTP front-end (roles, delays, rooms, stats,
//! controls).
//!
//! One port serves HTTP/2 gRPC (`/sglang.grpc.scheduler.SglangScheduler/*`,
//! `/tokenspeed.grpc.scheduler.TokenSpeedScheduler/*` for a TokenSpeed worker, or
//! `/vllm.grpc.engine.VllmEngine/*` for a vLLM worker: only its runtime's service answers, so
//! a router detecting the runtime gets `Unimplemented` from the others) and plain HTTP/1.1
//! `GET /health`, `GET /mock/stats`, `POST /mock/controls` and the KV hand-over: SGLang's and
//! TokenSpeed's bootstrap long poll `GET /room/{room}`, which a decode worker asks with the
//! ticket's `bootstrap_host:bootstrap_port`, or a vLLM worker's NIXL pull (`POST
//! /mock/nixl/pull`) and LMCache push (`POST /mock/lmcache/push`), the HTTP vLLM front's
//! routes.

mod aborts;
mod encoder;
mod generate;
mod service;
mod tokenspeed;
mod view;
mod vllm;

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use pdrouter_proto::grpc::health::v1::health_server::HealthServer;
use pdrouter_proto::scheduler::sglang_scheduler_server::SglangSchedulerServer;
use pdrouter_proto::tokenspeed_encoder::token_speed_encoder_server::TokenSpeedEncoderServer;
use pdrouter_proto::tokenspeed_scheduler::token_speed_scheduler_server::TokenSpeedSchedulerServer;
use pdrouter_proto::vllm_engine::vllm_engine_server::VllmEngineServer;
use pdrouter_proto::{
    SCHEDULER_SERVICE, TOKENSPEED_ENCODER_SERVICE, TOKENSPEED_SCHEDULER_SERVICE,
    VLLM_ENGINE_SERVICE,
};
use serde_json::{Value, json};

pub use generate::OUTPUT_TEXT;

use crate::bootstrap::room_routes;
use crate::config::{GrpcRuntime, KvConnectorKind};
use crate::http::{handlers, lmcache, nixl};
use crate::state::Shared;

/// Largest accepted gRPC message (a prompt of token ids).
const MESSAGE_LIMIT: usize = 64 * 1024 * 1024;

/// The routes of a gRPC-mode worker.
pub(crate) fn router(shared: Arc<Shared>) -> std::io::Result<Router> {
    let scheduler = service::Scheduler::new(Arc::clone(&shared))?;
    let runtime = shared.grpc_runtime;
    let encode = shared.role == crate::config::Role::Encode;
    let encoder = encoder::Encoder {
        shared: Arc::clone(&shared),
    };
    let health = HealthServer::new(encoder::Health {
        shared: Arc::clone(&shared),
    });
    let rooms = Arc::clone(&shared.rooms);
    let lmcache = shared.kv_connector == KvConnectorKind::LmCache;
    let hooks = Router::new()
        .route("/health", get(handlers::health))
        .route("/mock/stats", get(stats))
        .route("/mock/controls", post(handlers::set_controls));
    if runtime == GrpcRuntime::Vllm {
        // vLLM's hand-over is its connector's, through the HTTP vLLM front's routes; no rooms.
        let hooks = hooks.route(nixl::PULL_PATH, post(nixl::serve_pull));
        let hooks = if lmcache {
            hooks.route(lmcache::PUSH_PATH, post(lmcache::serve_push))
        } else {
            hooks
        };
        let grpc = VllmEngineServer::new(vllm::VllmFront { inner: scheduler })
            .max_decoding_message_size(MESSAGE_LIMIT)
            .max_encoding_message_size(MESSAGE_LIMIT);
        let path = format!("/{VLLM_ENGINE_SERVICE}/{{*method}}");
        return Ok(hooks.with_state(shared).route_service(&path, grpc));
    }
    let served_at = shared.addr;
    let router = hooks
        .with_state(shared)
        .merge(room_routes(rooms, served_at));
    if encode {
        // Checked at start: an encode worker speaks TokenSpeed's protocol.
        let grpc = TokenSpeedEncoderServer::new(encoder)
            .max_decoding_message_size(MESSAGE_LIMIT)
            .max_encoding_message_size(MESSAGE_LIMIT);
        return Ok(router
            .route_service(&format!("/{TOKENSPEED_ENCODER_SERVICE}/{{*method}}"), grpc)
            .route_service("/grpc.health.v1.Health/{*method}", health));
    }
    Ok(if runtime == GrpcRuntime::TokenSpeed {
        let front = tokenspeed::TokenSpeedFront { inner: scheduler };
        let grpc = TokenSpeedSchedulerServer::new(front)
            .max_decoding_message_size(MESSAGE_LIMIT)
            .max_encoding_message_size(MESSAGE_LIMIT);
        router.route_service(
            &format!("/{TOKENSPEED_SCHEDULER_SERVICE}/{{*method}}"),
            grpc,
        )
    } else {
        let grpc = SglangSchedulerServer::new(scheduler)
            .max_decoding_message_size(MESSAGE_LIMIT)
            .max_encoding_message_size(MESSAGE_LIMIT);
        router.route_service(&format!("/{SCHEDULER_SERVICE}/{{*method}}"), grpc)
    })
}

/// `GET /mock/stats` of a gRPC worker: the common fields, the abort count
/// and the ids of the last finished generation; a vLLM worker's KV fields too.
async fn stats(State(s): State<Arc<Shared>>) -> Response {
    let st = s.stats();
    let mut map = handlers::stats_fields(&s, &st);
    if s.grpc_runtime == GrpcRuntime::Vllm {
        crate::vllm_kv::insert_stats(&mut map, &s, &st);
    }
    map.insert("aborts_total".to_owned(), json!(st.aborts_total));
    map.insert(
        "encode_items_total".to_owned(),
        json!(st.encode_items_total),
    );
    map.insert("last_output_ids".to_owned(), json!(st.last_output_ids));
    axum::Json(Value::Object(map)).into_response()
}
