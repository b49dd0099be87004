//! The router's end-to-end tests: real `pdrouter-mock` workers and a real router on
//! ephemeral loopback ports, one module per feature. One binary rather than one per file:
//! each binary links the whole router, and dozens of them cost minutes of linking and
//! gigabytes of disk. Select a module with its name as the filter, e.g.
//! `cargo test -p pdrouter --test e2e admission_e2e::`.

mod support;

mod admission_e2e;
mod admission_store;
mod allocations;
mod bad_input;
mod chaos;
mod cli;
mod client_connections;
mod demo;
mod discovery;
mod edge;
mod flag_ranges;
mod fuzz_input;
mod global_limiter;
mod grpc_chat_parsing;
mod grpc_endpoints;
mod grpc_epd;
mod grpc_epd_images;
mod grpc_fields;
mod grpc_pd;
mod grpc_regular;
mod grpc_responses_tools;
mod grpc_tokenspeed;
mod grpc_vllm;
mod help_output;
mod lifecycle;
mod metric_labels;
mod models;
mod pd_flow;
mod pd_logprobs;
mod policies_e2e;
mod prefill_release;
mod priority_e2e;
mod proptest_select;
mod replicas;
mod telemetry;
mod tls;
mod vllm_connectors;
mod vllm_pd;
mod worker_auth;
mod worker_bodies;
