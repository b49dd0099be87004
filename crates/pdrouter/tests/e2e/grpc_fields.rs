//! Every request field the gRPC translation knows, end to end over a gRPC mock: a read field
//! with a malformed value is a 400 naming it (so it is really read and checked), an ignored
//! field is accepted, a refused one is a 501 naming it; OpenAI's own parameter lists are all
//! covered, and docs/grpc.md names every field that is ignored or refused.

use pdrouter::grpc::translate::fields::{Fate, known, known_sampling_params};
use pdrouter::request::Endpoint;
use serde_json::{Value, json};

use crate::support::*;

/// The parameters of OpenAI's API reference, per endpoint.
const OPENAI_CHAT: &[&str] = &[
    "messages",
    "model",
    "audio",
    "frequency_penalty",
    "function_call",
    "functions",
    "logit_bias",
    "logprobs",
    "max_completion_tokens",
    "max_tokens",
    "metadata",
    "modalities",
    "n",
    "parallel_tool_calls",
    "prediction",
    "presence_penalty",
    "prompt_cache_key",
    "prompt_cache_retention",
    "reasoning_effort",
    "response_format",
    "safety_identifier",
    "seed",
    "service_tier",
    "stop",
    "store",
    "stream",
    "stream_options",
    "temperature",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "user",
    "verbosity",
    "web_search_options",
];
const OPENAI_COMPLETIONS: &[&str] = &[
    "model",
    "prompt",
    "best_of",
    "echo",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "max_tokens",
    "n",
    "presence_penalty",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "suffix",
    "temperature",
    "top_p",
    "user",
];
const OPENAI_RESPONSES: &[&str] = &[
    "background",
    "conversation",
    "include",
    "input",
    "instructions",
    "max_output_tokens",
    "max_tool_calls",
    "metadata",
    "model",
    "parallel_tool_calls",
    "previous_response_id",
    "prompt",
    "prompt_cache_key",
    "prompt_cache_retention",
    "reasoning",
    "safety_identifier",
    "service_tier",
    "store",
    "stream",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "truncation",
    "user",
];

fn path(e: Endpoint) -> &'static str {
    match e {
        Endpoint::ChatCompletions => "/v1/chat/completions",
        Endpoint::Completions => "/v1/completions",
        Endpoint::Responses => "/v1/responses",
        Endpoint::Generate => "/generate",
    }
}

fn minimal(e: Endpoint) -> Value {
    match e {
        Endpoint::ChatCompletions => {
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        }
        Endpoint::Completions => json!({"prompt": "hi", "max_tokens": 2}),
        Endpoint::Responses => json!({"input": "hi", "max_output_tokens": 2}),
        Endpoint::Generate => json!({"text": "hi", "sampling_params": {"max_new_tokens": 2}}),
    }
}

/// A value no field accepts; `/generate`'s logprob fields take lists (one per prompt, not
/// served), so theirs is a word.
fn malformed(name: &str) -> Value {
    match name {
        "return_logprob" | "top_logprobs_num" | "logprob_start_len" => json!("yes"),
        _ => json!([[[]]]),
    }
}

#[tokio::test]
async fn every_known_field_is_read_ignored_or_refused_as_listed() {
    let w = grpc_mock(Role::Regular, |_| {}).await;
    let r = router(regular_config(&[&w])).await;
    for e in [
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Responses,
        Endpoint::Generate,
    ] {
        let ok = post(r.addr(), path(e), &minimal(e).to_string()).await;
        assert_eq!(ok.status, 200, "{e:?}: {}", ok.text());
        let mut cases: Vec<(String, Fate, Value)> = known(e)
            .into_iter()
            .map(|(n, f)| (n.to_owned(), f, minimal(e)))
            .collect();
        if e == Endpoint::Generate {
            // sampling_params' own fields, named with their path.
            cases.extend(
                known_sampling_params()
                    .into_iter()
                    .map(|(n, f)| (format!("sampling_params.{n}"), f, minimal(e))),
            );
        }
        for (name, fate, mut body) in cases {
            let (slot, key) = match name.strip_prefix("sampling_params.") {
                Some(inner) => (&mut body["sampling_params"], inner.to_owned()),
                None => (&mut body, name.clone()),
            };
            slot[&key] = match fate {
                Fate::Read => malformed(&key),
                Fate::Ignored(_) => json!("anything"),
                Fate::Refused => json!(true),
            };
            let reply = post(r.addr(), path(e), &body.to_string()).await;
            let text = reply.text();
            let (want, names) = match fate {
                // Named by its path, or inside sampling_params by its key.
                Fate::Read => (400, vec![format!("'{key}"), format!("'{name}")]),
                Fate::Ignored(_) => (200, vec![String::new()]),
                Fate::Refused => (501, vec![format!("'{name}'")]),
            };
            assert_eq!(reply.status, want, "{e:?} {name}: {text}");
            assert!(
                names.iter().any(|n| text.contains(n)),
                "{e:?} {name}: {text}"
            );
        }
    }
    assert!(eventually(std::time::Duration::from_secs(10), || total_load(&r) == 0).await);
}

#[test]
fn openai_parameters_are_all_listed_and_the_docs_name_every_untranslated_one() {
    for (e, openai) in [
        (Endpoint::ChatCompletions, OPENAI_CHAT),
        (Endpoint::Completions, OPENAI_COMPLETIONS),
        (Endpoint::Responses, OPENAI_RESPONSES),
    ] {
        let known: Vec<&str> = known(e).into_iter().map(|(n, _)| n).collect();
        for f in openai {
            assert!(known.contains(f), "{e:?}: OpenAI's '{f}' is not listed");
        }
    }
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/grpc.md"),
    )
    .unwrap();
    for e in [
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Responses,
        Endpoint::Generate,
    ] {
        let all = known(e).into_iter().chain(if e == Endpoint::Generate {
            known_sampling_params()
        } else {
            Vec::new()
        });
        for (name, fate) in all {
            if fate != Fate::Read {
                assert!(
                    docs.contains(&format!("`{name}`")),
                    "docs/grpc.md does not name '{name}' ({fate:?})"
                );
            }
        }
    }
}
