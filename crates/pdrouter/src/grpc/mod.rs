//! gRPC workers (SGLang's or TokenSpeed's scheduler protocol): the per-worker channel and
//! runtime, the router-side tokenizer, and the translation between OpenAI/SGLang JSON and
//! token-id generation.
//!
//! - [`runtime`]: the two engine protocols, the router's one working form of a `Generate`
//!   call ([`runtime::Call`]) and its conversion to and from each protocol's messages.
//! - [`client`]: one lazily connected tonic channel per worker, runtime detection by
//!   `HealthCheck`, `GetModelInfo`, `GetTokenizer`, and [`client::LegStream`], a `Generate`
//!   stream that sends `Abort` when it is dropped before its end.
//! - [`encode`]: EPD's `Encode` calls, one per image item, fire-and-forget.
//! - [`cpu_pool`]: the low-priority threads large prompts are tokenized on, so they never
//!   take the CPU from the async workers serving small requests.
//! - [`info`]: `GetModelInfo` and `GetServerInfo` shown as SGLang's HTTP server shows
//!   `/get_model_info` and `/get_server_info`.
//! - [`tokenizer`]: where the router's tokenizer comes from, resolved once at startup.
//! - [`translate`]: request bodies to `GenerateRequest`s, the output back to response bodies
//!   and SSE events (per endpoint).
//! - [`output`]: the engine's messages turned into choices (text, finish, usage, logprobs).
//! - [`answer`]: a worker's started `Generate` streams turned into the client's answer,
//!   shared by PD (Decode's streams) and regular mode (the one worker's).
//!
//! The PD flow itself (selection, admission, both legs) lives beside the HTTP one in
//! `pd::grpc`; the regular one beside HTTP's in `regular`.

pub mod answer;
pub mod bulk;
pub mod client;
pub mod cpu_pool;
pub mod encode;
pub mod encoded;
pub mod info;
pub mod output;
pub mod runtime;
pub mod tokenizer;
pub mod translate;
