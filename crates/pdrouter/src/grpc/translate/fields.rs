//! Every request field the gRPC translation knows, per endpoint, and what becomes of it:
//! read (translated into the engine's request, or used by the router), ignored for a stated
//! reason, or refused with 501 naming it when it asks for something not served.
//!
//! Over HTTP the engine's own server reads the body; over gRPC the router is that server, so
//! a field it neither reads nor names here would be a silent drop. Fields no table names
//! (neither OpenAI's nor the engines' own) are ignored, as the engines' servers ignore them.
//!
//! Invariants: a refused field is accepted only with a value that asks for nothing (null,
//! false, zero, an empty list, object or string, or `["text"]`); every read field is validated by the
//! endpoint's translation (the end-to-end tests send each a malformed value and expect a 400
//! naming it); docs/grpc.md lists every ignored and refused field.

use serde_json::{Map, Value};

use super::unsupported;
use crate::error::ApiError;
use crate::json_map::Field as _;
use crate::request::Endpoint;

/// What becomes of a request field over gRPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Translated into the engine's request, or used by the router.
    Read,
    /// Accepted and without effect, for the reason given.
    Ignored(&'static str),
    /// 501 unless its value asks for nothing.
    Refused,
}

use Fate::{Ignored, Read, Refused};

/// Field names and their fates.
type Table = &'static [(&'static str, Fate)];

/// Sampling fields of the engines' own servers, read at the top level of chat and
/// completions bodies and in `/generate`'s `sampling_params`.
const SAMPLING: Table = &[
    ("temperature", Read),
    ("top_p", Read),
    ("top_k", Read),
    ("min_p", Read),
    ("frequency_penalty", Read),
    ("presence_penalty", Read),
    ("repetition_penalty", Read),
    ("stop", Read),
    ("stop_token_ids", Read),
    ("skip_special_tokens", Read),
    ("spaces_between_special_tokens", Read),
    ("ignore_eos", Read),
    ("no_stop_trim", Read),
    ("regex", Read),
    ("json_schema", Read),
    ("ebnf", Read),
    ("logit_bias", Read),
    ("min_tokens", Read),
    ("structural_tag", Refused),
    ("stop_regex", Refused),
    ("custom_params", Refused),
];

const NO_STORE: &str = "nothing is stored: each request stands alone";
const ABUSE_ID: &str = "an end-user id for a provider's abuse monitoring; no engine uses it";
const CACHE_KEY: &str =
    "routing already follows the prompt itself (cache_aware); engines take no cache key";
const TIER: &str = "one service tier; priority classes come from the priority headers";
const ROUTER_ID: &str = "the router names every request (X-Request-Id)";
const HANDOFF: &str = "the router chooses the KV handoff of every PD pair";

/// OpenAI's fields about the provider's account rather than the answer (chat and responses).
const PROVIDER: Table = &[
    ("user", Ignored(ABUSE_ID)),
    ("safety_identifier", Ignored(ABUSE_ID)),
    ("metadata", Ignored(NO_STORE)),
    ("store", Ignored(NO_STORE)),
    ("prompt_cache_key", Ignored(CACHE_KEY)),
    ("prompt_cache_retention", Ignored(CACHE_KEY)),
    ("service_tier", Ignored(TIER)),
];

/// `/v1/chat/completions`, beyond [`SAMPLING`] and [`PROVIDER`].
const CHAT: Table = &[
    ("messages", Read),
    ("model", Read),
    ("stream", Read),
    ("stream_options", Read),
    ("n", Read),
    ("max_tokens", Read),
    ("max_completion_tokens", Read),
    ("logprobs", Read),
    ("top_logprobs", Read),
    ("seed", Read),
    ("response_format", Read),
    ("tools", Read),
    ("tool_choice", Read),
    ("functions", Read),
    ("function_call", Read),
    ("parallel_tool_calls", Read),
    ("reasoning_effort", Read),
    ("chat_template_kwargs", Read),
    ("separate_reasoning", Read),
    ("add_generation_prompt", Read),
    ("rid", Ignored(ROUTER_ID)),
    (
        "verbosity",
        Ignored("no open model's template takes an answer length"),
    ),
    ("audio", Refused),
    ("modalities", Refused),
    ("prediction", Refused),
    ("web_search_options", Refused),
    ("continue_final_message", Refused),
    ("documents", Refused),
    ("echo", Refused),
    ("lora_path", Refused),
    ("return_hidden_states", Refused),
];

/// `/v1/completions`, beyond [`SAMPLING`].
const COMPLETIONS: Table = &[
    ("prompt", Read),
    ("model", Read),
    ("stream", Read),
    ("stream_options", Read),
    ("n", Read),
    ("max_tokens", Read),
    ("logprobs", Read),
    ("echo", Read),
    ("seed", Read),
    ("best_of", Read),
    ("user", Ignored(ABUSE_ID)),
    ("rid", Ignored(ROUTER_ID)),
    ("suffix", Refused),
    ("lora_path", Refused),
    ("return_hidden_states", Refused),
];

/// `/v1/responses`, beyond [`PROVIDER`] (its sampling fields are OpenAI's only).
const RESPONSES: Table = &[
    ("input", Read),
    ("instructions", Read),
    ("model", Read),
    ("stream", Read),
    ("max_output_tokens", Read),
    ("temperature", Read),
    ("top_p", Read),
    ("text", Read),
    (
        "truncation",
        Ignored("a prompt over the context is refused either way"),
    ),
    ("previous_response_id", Refused),
    ("conversation", Refused),
    ("background", Refused),
    ("tools", Read),
    ("tool_choice", Read),
    ("parallel_tool_calls", Read),
    ("max_tool_calls", Refused),
    ("reasoning", Refused),
    ("include", Refused),
    ("prompt", Refused),
    ("top_logprobs", Refused),
];

/// SGLang's `/generate` (its sampling fields are in `sampling_params`, [`GENERATE_SAMPLING`]).
const GENERATE: Table = &[
    ("text", Read),
    ("input_ids", Read),
    ("sampling_params", Read),
    ("stream", Read),
    ("model", Read),
    ("return_logprob", Read),
    ("logprob_start_len", Read),
    ("top_logprobs_num", Read),
    ("return_text_in_logprobs", Read),
    ("rid", Ignored(ROUTER_ID)),
    ("bootstrap_host", Ignored(HANDOFF)),
    ("bootstrap_port", Ignored(HANDOFF)),
    ("bootstrap_room", Ignored(HANDOFF)),
    (
        "log_metrics",
        Ignored("the router's metrics count every request"),
    ),
    ("image_data", Refused),
    ("audio_data", Refused),
    ("video_data", Refused),
    ("modalities", Refused),
    ("lora_path", Refused),
    ("custom_logit_processor", Refused),
    ("return_hidden_states", Refused),
    ("session_params", Refused),
    ("token_ids_logprob", Refused),
    ("input_embeds", Refused),
];

/// `/generate`'s `sampling_params`, beyond [`SAMPLING`].
const GENERATE_SAMPLING: Table = &[
    ("n", Read),
    ("max_new_tokens", Read),
    ("min_new_tokens", Read),
];

/// The tables of `endpoint`'s top-level fields (`/generate` reads its sampling fields in
/// `sampling_params`).
fn tables(endpoint: Endpoint) -> &'static [Table] {
    match endpoint {
        Endpoint::ChatCompletions => &[CHAT, PROVIDER, SAMPLING],
        Endpoint::Completions => &[COMPLETIONS, SAMPLING],
        Endpoint::Responses => &[RESPONSES, PROVIDER],
        Endpoint::Generate => &[GENERATE],
    }
}

/// Every field `endpoint` knows at the top level of its body, with its fate (for the tests
/// and the docs).
pub fn known(endpoint: Endpoint) -> Vec<(&'static str, Fate)> {
    tables(endpoint)
        .iter()
        .flat_map(|t| t.iter().copied())
        .collect()
}

/// Every field `/generate` knows in `sampling_params`.
pub fn known_sampling_params() -> Vec<(&'static str, Fate)> {
    GENERATE_SAMPLING.iter().chain(SAMPLING).copied().collect()
}

/// Whether `v` asks for nothing.
fn no_op(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty() || a.len() == 1 && a[0] == "text",
        Value::Object(m) => m.is_empty(),
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::Bool(true) => false,
    }
}

fn refuse(o: &Map<String, Value>, table: &[(&str, Fate)], prefix: &str) -> Result<(), ApiError> {
    for (name, fate) in table {
        if *fate == Refused
            && let Some(v) = o.field(name)
            && !no_op(v)
        {
            return Err(unsupported(&format!("'{prefix}{name}'")));
        }
    }
    Ok(())
}

/// Refuses the fields of `o`, a body for `endpoint`, that ask for what is not served.
pub(crate) fn check(endpoint: Endpoint, o: &Map<String, Value>) -> Result<(), ApiError> {
    for t in tables(endpoint) {
        refuse(o, t, "")?;
    }
    if endpoint == Endpoint::Generate
        && let Some(Value::Object(sp)) = o.field("sampling_params")
    {
        refuse(sp, SAMPLING, "sampling_params.")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_field_is_listed_twice_and_no_ops_are_accepted() {
        for e in [
            Endpoint::ChatCompletions,
            Endpoint::Completions,
            Endpoint::Responses,
            Endpoint::Generate,
        ] {
            let names = known(e);
            let mut sorted: Vec<_> = names.iter().map(|(n, _)| *n).collect();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), names.len(), "{e:?} lists a field twice");
        }
        let body = |v: Value| match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        };
        let ok = body(serde_json::json!({"audio": null, "modalities": ["text"],
            "continue_final_message": false, "echo": false}));
        assert!(check(Endpoint::ChatCompletions, &ok).is_ok());
        let bad = body(serde_json::json!({"modalities": ["text", "audio"]}));
        let e = format!("{:?}", check(Endpoint::ChatCompletions, &bad).unwrap_err());
        assert!(e.contains("'modalities'"), "{e}");
        let sp = body(serde_json::json!({"sampling_params": {"stop_regex": "a+"}}));
        let e = format!("{:?}", check(Endpoint::Generate, &sp).unwrap_err());
        assert!(e.contains("sampling_params.stop_regex"), "{e}");
        // Of several refused fields, the table's first is named whatever the body's order.
        let two = body(
            serde_json::json!({"echo": true, "prediction": {"type": "content"},
            "messages": [], "audio": {"voice": "x"}}),
        );
        let e = format!("{:?}", check(Endpoint::ChatCompletions, &two).unwrap_err());
        assert!(e.contains("'audio'"), "{e}");
        let read_only = body(serde_json::json!({"messages": [], "model": "m", "top_k": 3}));
        assert!(check(Endpoint::ChatCompletions, &read_only).is_ok());
    }
}
