//! Mock SGLang-style inference worker for pdrouter's tests, benchmarks and demo.
//!
//! A [`MockWorker`] is a small HTTP server speaking the subset of the SGLang /
//! OpenAI API that a prefill/decode router talks to:
//!
//! * `GET /health`, `GET /health_generate` — 200, or 503 when made unhealthy
//!   through [`MockControls::set_healthy`];
//! * `GET /v1/models`, `GET /get_server_info`, `GET /get_model_info`;
//! * `POST /generate`, `POST /v1/chat/completions`, `POST /v1/completions`
//!   and (minimally) `POST /v1/responses`, answered as JSON or, with
//!   `"stream": true`, as server-sent events ending in `data: [DONE]`;
//! * `GET /mock/stats` — the numbers of [`MockStats`] (with the last generation request's
//!   body and headers) plus the role;
//! * `POST /mock/controls` — change the runtime knobs of [`MockControls`] from
//!   outside the process (body: any subset of `{"delay_ms", "fail_rate",
//!   "healthy", "garbage", "hang", "release_hung", "hold_body_open",
//!   "token_interval_ms", "output_tokens", "reset_max_inflight"}`); answers the
//!   current settings (with `hung`, the number of requests the hang holds).
//!
//! With [`MockConfig::engine`] set (`--engine`), a prefill worker behaves
//! like a continuous-batching engine: at most
//! [`EngineConfig::max_running`] requests prefill at once, the rest wait in
//! the engine's own FIFO, and prefill takes time proportional to the prompt
//! (words of the text, or token ids). With [`EngineConfig::chunk_tokens`]
//! (`--chunked-prefill-tokens C`, and `--step-overhead-ms` for
//! [`EngineConfig::step_overhead`]) it schedules like an engine with chunked
//! prefill instead: forward steps of at most `C` prompt tokens and
//! `max_running` requests taken from the head of one FIFO, each step lasting
//! its fixed overhead plus its tokens at the token rate, so throughput is the
//! token rate whatever the concurrency and a long prompt delays every prompt
//! behind it. It also serves a KV bootstrap endpoint
//! on its own port ([`MockWorker::bootstrap_addr`]): `GET /room/{room}`
//! answers once that room's prefill has finished. A decode worker in engine
//! mode asks that endpoint (from `bootstrap_host`/`bootstrap_port`/
//! `bootstrap_room` in the body) before it generates the requested number of
//! tokens, one per [`MockConfig::token_interval`]. `/get_server_info` then
//! reports `max_running_requests` = `max_running`, and `/mock/stats` adds
//! `engine_queue_len` and `max_engine_queue_wait_ms`.
//!
//! With [`MockConfig::api_key`] (`--api-key`) every route but `/mock/*` answers 401 unless
//! the request carries exactly one `Authorization: Bearer KEY`.
//!
//! Generated text is made of the tokens `" tok0"`, `" tok1"`, … A worker of
//! role [`Role::Prefill`] answers with the first token only, after the
//! configured delay; [`Role::Decode`] and [`Role::Regular`] workers produce
//! [`MockConfig::output_tokens`] tokens (capped by the request's
//! `max_tokens` / `max_new_tokens` / `max_completion_tokens` /
//! `max_output_tokens`), spaced by [`MockConfig::token_interval`]. Prefill and
//! decode workers reject generation requests lacking `bootstrap_room` with
//! 400 `{"error":{"message":"missing bootstrap_room"}}`.
//!
//! With [`MockConfig::grpc`] set (`--grpc`), the worker speaks SGLang's
//! scheduler gRPC protocol (the `pdrouter-proto` crate) on the same engine
//! model instead: `Generate` streams token ids (the bytes of
//! [`GRPC_OUTPUT_TEXT`], ending with the EOS id of the byte-level tokenizer
//! that `GetTokenizer` serves), then a `Complete` repeating them; a Prefill
//! worker samples one token and finishes its `bootstrap_room`, a Decode
//! worker first waits (bounded) for that room through
//! `GET /room/{room}` at the ticket's `bootstrap_host:bootstrap_port`, which
//! a gRPC worker answers on its own port. `Abort`, `HealthCheck`,
//! `GetModelInfo` (with the configured default sampling parameters) and
//! `GetServerInfo` (with `dp_size`) are served too, and
//! the same port answers HTTP/1.1 `GET /health`, `GET /mock/stats` (adding
//! `aborts_total` and `last_output_ids`, with `last_request` the decoded
//! `GenerateRequest`) and `POST /mock/controls`. [`MockWorker::url`] is then
//! `grpc://ADDR`. With [`MockConfig::grpc_runtime`] [`GrpcRuntime::TokenSpeed`]
//! (`--runtime tokenspeed`) the worker speaks TokenSpeed's scheduler protocol
//! instead, over the same engine model, and only that service answers (vLLM's engine
//! protocol: see vLLM mode below).
//!
//! With [`MockConfig::http_runtime`] [`HttpRuntime::Vllm`] (`--runtime vllm`) the
//! worker imitates vLLM's OpenAI server (0.11) with the NIXL KV connector instead: `GET
//! /health` (empty body), `GET /version`, `GET /v1/models` (`owned_by: "vllm"`), `POST
//! /v1/completions` and `POST /v1/chat/completions` (`X-Request-Id` echoed, answers named
//! `cmpl-ID` / `chatcmpl-ID`, `usage.prompt_tokens_details.cached_tokens`); every SGLang
//! route answers 404 `{"detail":"Not Found"}` and no `bootstrap_room` is needed, whatever
//! the role. A body with `kv_transfer_params.do_remote_decode` is a prefill leg: it must not
//! stream and must cap its output at exactly one token (400 otherwise); its answer carries a
//! top-level `kv_transfer_params` naming this worker (`remote_engine_id`, `remote_host`,
//! `remote_port`), the request and one block per 16 prompt tokens, which the worker holds
//! until a decode leg pulls them or [`MockConfig::kv_abort_timeout`]
//! (`--kv-abort-timeout-ms`, 480 s) passes. A prompt containing `[[eos]]` ends the prefill
//! early instead (`finish_reason: "stop"`, no token, `kv_transfer_params: null`, nothing
//! held). A body with `do_remote_prefill` is a decode leg: it first pulls those blocks
//! (`POST /mock/nixl/pull` on the producer's port) and reports the whole blocks that moved
//! as cached tokens, or recomputes (0 cached) when the pull fails. `/mock/stats` adds
//! `aborts_total` (clients gone mid-answer) and the `kv_*` and `prefill_early_end_total`
//! counters of [`MockStats`].
//!
//! [`MockConfig::kv_connector`] (`--kv-connector`, vLLM mode only) picks the KV connector
//! imitated; the above is [`KvConnectorKind::Nixl`], the default. With
//! [`KvConnectorKind::Mooncake`] the router sends both legs at once, tied by a
//! `transfer_id` in their `kv_transfer_params`: a Prefill worker serves a bootstrap server on
//! its own port ([`MockWorker::bootstrap_addr`]; the engine's `--bootstrap-port` if given,
//! else a free one) answering `GET /query` with `{"RANK": {"engine_id": ID}}` for each of
//! its `--dp-size` ranks; a producer leg (`do_remote_decode`, `transfer_id`; as strict as
//! NIXL's) computes on the rank its `X-data-parallel-rank` header names (default 0, 400
//! beyond `dp_size`), then holds the prompt's blocks under the transfer id for that rank's
//! engine id and answers one token (`kv_transfer_params: null`). A consumer leg
//! (`do_remote_prefill`, `remote_bootstrap_addr`, `remote_engine_id`, `transfer_id`) pulls
//! them with `POST {remote_bootstrap_addr}/mock/mooncake/pull`, which waits (at most 30 s, or
//! the abort timeout when shorter) for a producer that has not finished yet: cached tokens
//! are the prompt's whole blocks when it got them, 0 (recompute) on a wrong engine id, a
//! wait run out, or a transfer already pulled or expired (refused at once: the producer
//! remembers such transfer ids for one abort timeout). With [`KvConnectorKind::LmCache`]
//! the router sends plain legs one after the other (Prefill capped at one token, then
//! Decode); a worker with [`MockConfig::lmcache_peer`] (`--lmcache-peer URL`) pushes a
//! one-token request's prompt KV to that consumer (`POST /mock/lmcache/push`, keyed by a
//! hash of the prompt or the messages' roles and contents) before answering, and any
//! LMCache worker reports a request whose prompt was pushed to it as cached (whole blocks,
//! used once, kept at most the abort timeout). `/mock/stats` adds `kv_connector`, Mooncake's
//! `engine_ids`, and the push counters `kv_pushed_total` / `kv_push_failed_total`.
//!
//! vLLM mode with [`MockConfig::grpc`] (`--grpc --runtime vllm`, or [`GrpcRuntime::Vllm`])
//! speaks vLLM's engine gRPC protocol instead of its OpenAI server: only
//! `vllm.grpc.engine.VllmEngine` answers, `Generate` runs on the gRPC engine model (token ids
//! in and out) and every leg above is the same, its params read from the request's
//! `kv_transfer_params_json` and a NIXL producer's returned in its final `complete`'s; the
//! same KV table, counters, routes (NIXL's pull, LMCache's push, on the gRPC port) and
//! Mooncake bootstrap server serve it, a Mooncake producer's rank being its
//! `data_parallel_rank`. `GetServerInfo` reports the connector, KV role and engine id. Every
//! vLLM generation ended early, by `Abort` or by its client leaving, counts one
//! `aborts_total`.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use pdrouter_mock::{MockConfig, MockWorker, Role};
//! let worker = MockWorker::start(MockConfig::new(Role::Decode)).await?;
//! println!("decode worker at {}", worker.url());
//! worker.controls().set_healthy(false);
//! worker.shutdown().await;
//! # Ok(()) }
//! ```

mod bootstrap;
mod cli;
mod config;
mod engine;
mod files;
mod grpc;
mod http;
mod kv;
mod state;
mod vllm_kv;
mod worker;

pub use bootstrap::rendezvous_in_process;
pub use cli::{CliError, MockArgs, RuntimeArg, run_cli};
pub use config::{GrpcRuntime, HttpRuntime, KvConnectorKind, MockConfig, ParseRoleError, Role};
pub use engine::EngineConfig;
pub use files::FileServer;
pub use grpc::OUTPUT_TEXT as GRPC_OUTPUT_TEXT;
pub use state::{Headers, MockControls, MockStats};
pub use worker::{MockWorker, PortReservation};
