//! SGLang `/generate`: `text` or `input_ids`, one prompt or a list. Several prompts or
//! samples are answered as a list (item `i * n + j`); streamed events carry the text so far
//! and, for a list, the item's `index`.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::{
    Answer, Input, LogprobAsk, Source, data, flag, ids, matched, sampling, top_count, unsupported,
};
use crate::error::ApiError;
use crate::grpc::output::Delta;
use crate::grpc::translate::logprobs;
use pdrouter_tokenizer::FinishReason;

pub(crate) fn input(o: &Map<String, Value>) -> Result<Input, ApiError> {
    let sp = match o.get("sampling_params") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => {
            return Err(ApiError::invalid_field(
                "sampling_params",
                "must be an object",
            ));
        }
    };
    let (params, unset) = sampling(&sp, &["max_new_tokens"])?;
    let prompts = match (o.get("text"), o.get("input_ids")) {
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
        if o.get(k).is_some_and(Value::is_array) {
            return Err(unsupported(&format!("a list of '{k}' (one per prompt)")));
        }
    }
    let output = flag(o, "return_logprob")?.unwrap_or(false);
    let top = top_count(o, "top_logprobs_num")?.unwrap_or(0);
    let start = match o.get("logprob_start_len") {
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
    })
}

/// Item `i`; `finished` false while it is still streaming.
fn item(a: &Answer<'_>, i: usize, finished: bool) -> Value {
    let c = &a.out.choices[i];
    let u = a.out.choice_usage(i);
    let finish = match (finished, &c.finish) {
        (false, _) => Value::Null,
        (true, Some(FinishReason::Length)) => json!({"type": "length", "length": u.completion}),
        (true, Some(FinishReason::Abort)) => json!({"type": "abort"}),
        (true, f) => json!({"type": "stop", "matched": matched(f.as_ref())}),
    };
    let id = if a.plan.listed {
        format!("{}-{i}", a.id)
    } else {
        a.id.to_owned()
    };
    let mut meta = json!({
        "id": id,
        "prompt_tokens": u.prompt,
        "completion_tokens": if finished { u.completion } else { u32::try_from(c.ids.len()).unwrap_or(u32::MAX) },
        "cached_tokens": u.cached,
        "finish_reason": finish,
    });
    let lp = a.plan.logprobs;
    if lp.output {
        let t = &a.out.tokenizer;
        logprobs::sglang_output(t, &c.logprobs, lp.text, &mut meta);
        logprobs::sglang_input(t, a.out.input_logprobs(c.prompt), lp.text, &mut meta);
    }
    let mut v = json!({"text": c.full, "output_ids": c.ids, "meta_info": meta});
    if a.plan.listed {
        v["index"] = json!(i);
    }
    v
}

pub(crate) fn body(a: &Answer<'_>) -> Value {
    if a.plan.listed {
        (0..a.out.choices.len())
            .map(|i| item(a, i, true))
            .collect::<Vec<_>>()
            .into()
    } else {
        item(a, 0, true)
    }
}

pub(crate) fn delta(a: &Answer<'_>, d: &Delta) -> Vec<Bytes> {
    if d.text.is_empty() && d.logprobs.is_empty() && !d.finished {
        return Vec::new();
    }
    vec![data(&item(a, d.index, d.finished))]
}
