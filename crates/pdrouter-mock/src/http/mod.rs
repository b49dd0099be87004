//! HTTP front-end: SGLang's HTTP and OpenAI-style API over the engine model.

mod body;
pub(crate) mod handlers;
mod output;
mod render;
mod request;

pub(crate) use handlers::router;
