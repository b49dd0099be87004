//! SGLang `/generate`: `text` or `input_ids`, one prompt or a list. Several prompts or
//! samples are answered as a list (item `i * n + j`); streamed events carry the text so far
//! and, for a list, the item's `index`.

use std::borrow::Cow;

use bytes::Bytes;
use serde::Serialize;
use serde_json::{Map, Value};

use super::{
    Answer, Input, LogprobAsk, Source, data, flag, ids, matched, sampling, top_count, unsupported,
};
use crate::error::ApiError;
use crate::grpc::output::Delta;
use crate::grpc::translate::logprobs;
use crate::json_map::Field as _;
use pdrouter_tokenizer::FinishReason;

pub(crate) fn input(o: &Map<String, Value>) -> Result<Input, ApiError> {
    let none = Map::new();
    let sp = match o.field("sampling_params") {
        None | Some(Value::Null) => &none,
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err(ApiError::invalid_field(
                "sampling_params",
                "must be an object",
            ));
        }
    };
    let (params, unset) = sampling(sp, &["max_new_tokens"])?;
    let prompts = match (o.field("text"), o.field("input_ids")) {
        (Some(Value::String(t)), None) => vec![Source::Text(t.clone())],
        (Some(Value::Array(items)), None) if !items.is_empty() => items
            .iter()
            .enumerate()
            .map(|(i, t)| {
                t.as_str()
                    .map(|s| Source::Text(s.to_owned()))
                    .ok_or_else(|| {
                        ApiError::invalid_field(&format!("text[{i}]"), "must be a string")
                    })
            })
            .collect::<Result<_, _>>()?,
        (None, Some(Value::Array(items))) if items.first().is_some_and(Value::is_array) => items
            .iter()
            .enumerate()
            .map(|(i, v)| ids(v, &format!("input_ids[{i}]")).map(Source::Ids))
            .collect::<Result<_, _>>()?,
        (None, Some(v)) => vec![Source::Ids(ids(v, "input_ids")?)],
        _ => {
            return Err(ApiError::invalid_field(
                "text",
                "or 'input_ids' (exactly one) is required",
            ));
        }
    };
    for k in ["return_logprob", "top_logprobs_num", "logprob_start_len"] {
        if o.field(k).is_some_and(Value::is_array) {
            return Err(unsupported(&format!("a list of '{k}' (one per prompt)")));
        }
    }
    let output = flag(o, "return_logprob")?.unwrap_or(false);
    let top = top_count(o, "top_logprobs_num")?.unwrap_or(0);
    let start = match o.field("logprob_start_len") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_i64() {
            Some(-1) => None,
            Some(s) => Some(u32::try_from(s).map_err(|_| {
                ApiError::invalid_field("logprob_start_len", "must be -1 or a position")
            })?),
            None => {
                return Err(ApiError::invalid_field(
                    "logprob_start_len",
                    "must be an integer",
                ));
            }
        },
    };
    Ok(Input {
        prompts,
        params,
        unset,
        logprobs: LogprobAsk {
            output,
            top,
            input_from: start.filter(|_| output),
            text: flag(o, "return_text_in_logprobs")?.unwrap_or(false),
        },
        include_usage: false,
        instructions: None,
        echo: false,
        chat: None,
    })
}

/// One `/generate` answer item, serialized as it is built: no JSON tree per answer. Fields
/// are declared in name order, the order these answers have always printed.
#[derive(Serialize)]
struct Item<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<usize>,
    meta_info: Meta<'a>,
    output_ids: &'a [u32],
    text: &'a str,
}

/// `meta_info`; the logprob fields, when asked for, sort between `id` and `prompt_tokens`.
#[derive(Serialize)]
struct Meta<'a> {
    cached_tokens: u32,
    completion_tokens: u32,
    finish_reason: Option<Finish>,
    id: Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    input_token_logprobs: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    input_top_logprobs: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_token_logprobs: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_top_logprobs: Option<Value>,
    prompt_tokens: u32,
}

/// SGLang's `finish_reason` object: `{type}`, with `length` or `matched` by type.
#[derive(Serialize)]
struct Finish {
    #[serde(skip_serializing_if = "Option::is_none")]
    length: Option<u32>,
    /// `Some(null)` for a stop that matched nothing the router knows of.
    #[serde(skip_serializing_if = "Option::is_none")]
    matched: Option<Value>,
    r#type: &'static str,
}

/// Item `i`; `finished` false while it is still streaming.
fn item<'a>(a: &Answer<'a>, i: usize, finished: bool) -> Item<'a> {
    let c = &a.out.choices[i];
    let u = a.out.choice_usage(i);
    let finish_reason = finished.then(|| match &c.finish {
        Some(FinishReason::Length) => Finish {
            length: Some(u.completion),
            matched: None,
            r#type: "length",
        },
        Some(FinishReason::Abort) => Finish {
            length: None,
            matched: None,
            r#type: "abort",
        },
        f => Finish {
            length: None,
            matched: Some(matched(f.as_ref())),
            r#type: "stop",
        },
    });
    let id = if a.plan.listed {
        Cow::Owned(format!("{}-{i}", a.id))
    } else {
        Cow::Borrowed(a.id)
    };
    let lp = a.plan.logprobs;
    let (output, input) = if lp.output {
        let t = &a.out.tokenizer;
        (
            Some(logprobs::sglang(t, &c.logprobs, lp.text)),
            Some(logprobs::sglang(t, a.out.input_logprobs(c.prompt), lp.text)),
        )
    } else {
        (None, None)
    };
    let (output_token_logprobs, output_top_logprobs) = output.unzip();
    let (input_token_logprobs, input_top_logprobs) = input.unzip();
    Item {
        index: a.plan.listed.then_some(i),
        meta_info: Meta {
            cached_tokens: u.cached,
            completion_tokens: if finished {
                u.completion
            } else {
                u32::try_from(c.ids.len()).unwrap_or(u32::MAX)
            },
            finish_reason,
            id,
            input_token_logprobs,
            input_top_logprobs,
            output_token_logprobs,
            output_top_logprobs,
            prompt_tokens: u.prompt,
        },
        output_ids: &c.ids,
        text: &c.full,
    }
}

/// The whole non-streaming body, serialized.
pub(crate) fn body(a: &Answer<'_>) -> Vec<u8> {
    let written = if a.plan.listed {
        let items: Vec<Item<'_>> = (0..a.out.choices.len()).map(|i| item(a, i, true)).collect();
        serde_json::to_vec(&items)
    } else {
        serde_json::to_vec(&item(a, 0, true))
    };
    // Plain structs, strings and numbers: serializing them into memory cannot fail.
    written.unwrap_or_default()
}

pub(crate) fn delta(a: &Answer<'_>, d: &Delta) -> Vec<Bytes> {
    if d.text.is_empty() && d.logprobs.is_empty() && !d.finished {
        return Vec::new();
    }
    vec![data(&item(a, d.index, d.finished))]
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use pdrouter_proto::scheduler::generate_response::Response as Msg;
    use pdrouter_proto::scheduler::{GenerateComplete, GenerateResponse, OutputLogProbs};
    use pdrouter_tokenizer::{Tokenizer, bytelevel};

    use super::*;
    use crate::grpc::output::Output;
    use crate::grpc::translate::{self, Answer};
    use crate::request::{Endpoint, parse};

    /// The answer is written straight from structs: its text must be the one a JSON tree
    /// (keys in name order) prints, logprob fields and list included.
    #[tokio::test]
    async fn bodies_print_like_a_json_tree() {
        let dir = tempfile::tempdir().unwrap();
        for (name, data) in bytelevel::files() {
            std::fs::write(dir.path().join(name), data).unwrap();
        }
        let tok = Arc::new(Tokenizer::load(dir.path(), None).unwrap());
        for body in [
            r#"{"text":"hi"}"#,
            r#"{"text":["a","b"],"return_logprob":true,"top_logprobs_num":1}"#,
        ] {
            let req = parse(Endpoint::Generate, bytes::Bytes::from(body)).unwrap();
            let plan = translate::plan(&req, &tok).await.unwrap();
            let mut out = Output::new(tok.clone(), &plan);
            for prompt in 0..plan.prompt_tokens.len() {
                let done = GenerateResponse {
                    request_id: "r".to_owned(),
                    response: Some(Msg::Complete(GenerateComplete {
                        output_ids: vec![79, 75],
                        finish_reason: if prompt == 0 { "stop" } else { "length" }.to_owned(),
                        completion_tokens: 2,
                        output_logprobs: Some(OutputLogProbs {
                            token_logprobs: vec![-0.5, -0.25],
                            token_ids: vec![79, 75],
                            top_logprobs: Vec::new(),
                        }),
                        ..Default::default()
                    })),
                };
                out.absorb(prompt, done, "u").unwrap();
            }
            let a = Answer {
                plan: &plan,
                model: "m",
                id: "req",
                out: &out,
                created: 0,
            };
            let written = self::body(&a);
            let tree: Value = serde_json::from_slice(&written).unwrap();
            assert_eq!(
                String::from_utf8(written).unwrap(),
                tree.to_string(),
                "{body}"
            );
            let first = if plan.listed { &tree[0] } else { &tree };
            assert_eq!(first["text"], "OK");
            assert_eq!(
                first["meta_info"]["finish_reason"],
                serde_json::json!({"type": "stop", "matched": null})
            );
            if plan.listed {
                let second = &tree[1]["meta_info"];
                assert_eq!(second["id"], "req-1");
                assert_eq!(
                    second["finish_reason"],
                    serde_json::json!({"type": "length", "length": 2})
                );
                assert_eq!(second["output_token_logprobs"][1][1], 75);
            }
        }
    }
}
