//! gRPC workers (SGLang's or TokenSpeed's scheduler protocol): the per-worker channel and
//! runtime, the router-side tokenizer, and the translation between OpenAI/SGLang JSON and
//! token-id generation.
//!
//! - [`runtime`]: the two engine protocols, the router's one working form of a `Generate`
//!   call ([`runtime::Call`]) and its conversion to and from each protocol's messages.
//! - [`client`]: one lazily connected tonic channel per worker, runtime detection by
//!   `HealthCheck`, `GetModelInfo`, `GetTokenizer`, and [`client::LegStream`], a `Generate`
//!   stream that sends `Abort` when it is dropped before its end.
//! - [`cpu_pool`]: the low-priority threads large prompts are tokenized on, so they never
//!   take the CPU from the async workers serving small requests.
//! - [`info`]: `GetModelInfo` and `GetServerInfo` shown as SGLang's HTTP server shows
//!   `/get_model_info` and `/get_server_info`.
//! - [`tokenizer`]: where the router's tokenizer comes from, resolved once at startup.
//! - [`translate`]: request bodies to `GenerateRequest`s, the output back to response bodies
//!   and SSE events (per endpoint).
//! - [`plan`]: a request translated once ([`plan::Plan`]), what every attempt sends.
//! - [`output`]: the engine's messages turned into choices (text, finish, usage, logprobs).
//!
//! What a request does with these (selection, admission, the legs, the answer) is the request
//! core's and the gRPC backend's (`backends::grpc`); this module knows neither.

pub mod bulk;
pub mod client;
pub mod cpu_pool;
pub mod encoded;
pub mod info;
pub mod output;
pub mod plan;
pub mod runtime;
pub mod tokenizer;
pub mod translate;
