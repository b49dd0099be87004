//! gRPC front-end: SGLang's scheduler protocol over the same engine model
//! as the HTTP front-end (roles, delays, rooms, stats, controls).
//!
//! One port serves HTTP/2 gRPC (`/sglang.grpc.scheduler.SglangScheduler/*`)
//! and plain HTTP/1.1 `GET /health`, `GET /mock/stats`, `POST
//! /mock/controls` and the KV bootstrap long poll `GET /room/{room}`, which
//! a decode worker asks with the ticket's `bootstrap_host:bootstrap_port`.

mod aborts;
mod generate;
mod service;
mod view;

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use pdrouter_proto::SCHEDULER_SERVICE;
use pdrouter_proto::scheduler::sglang_scheduler_server::SglangSchedulerServer;
use serde_json::{Value, json};

pub use generate::OUTPUT_TEXT;

use crate::engine::room_routes;
use crate::http::handlers;
use crate::state::Shared;

/// Largest accepted gRPC message (a prompt of token ids).
const MESSAGE_LIMIT: usize = 64 * 1024 * 1024;

/// The routes of a gRPC-mode worker.
pub(crate) fn router(shared: Arc<Shared>) -> std::io::Result<Router> {
    let scheduler = service::Scheduler::new(Arc::clone(&shared))?;
    let grpc = SglangSchedulerServer::new(scheduler)
        .max_decoding_message_size(MESSAGE_LIMIT)
        .max_encoding_message_size(MESSAGE_LIMIT);
    let rooms = Arc::clone(&shared.rooms);
    Ok(Router::new()
        .route("/health", get(handlers::health))
        .route("/mock/stats", get(stats))
        .route("/mock/controls", post(handlers::set_controls))
        .with_state(shared)
        .merge(room_routes(rooms))
        .route_service(&format!("/{SCHEDULER_SERVICE}/{{*method}}"), grpc))
}

/// `GET /mock/stats` of a gRPC worker: the common fields, the abort count
/// and the ids of the last finished generation.
async fn stats(State(s): State<Arc<Shared>>) -> Response {
    let st = s.controls.stats();
    let mut map = handlers::stats_fields(&s, &st);
    map.insert("aborts_total".to_owned(), json!(st.aborts_total));
    map.insert("last_output_ids".to_owned(), json!(st.last_output_ids));
    axum::Json(Value::Object(map)).into_response()
}
