//! pdrouter: a router for prefill/decode-disaggregated LLM serving with per-worker Prefill
//! admission. See ARCHITECTURE.md for the map; `app::start` is the entry point.

pub mod admission_store;
pub mod app;
pub mod backends;
mod chat_template;
pub mod cli;
pub mod config;
pub mod core;
pub mod cpu_pool;
pub mod demo;
pub mod discovery;
pub mod dispatch;
pub mod edge;
pub mod engine;
pub mod entry;
pub mod error;
pub mod grpc;
pub mod http;
pub mod images;
mod json_map;
pub mod kv_handoff;
pub mod limiter;
pub mod metrics;
pub mod priority;
pub mod proxy;
pub mod registry;
pub mod request;
pub mod select;
mod sizing;
pub mod telemetry;

pub use app::{RouterHandle, StartError, start};
pub use config::Config;
