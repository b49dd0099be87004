//! `/v1/completions`: a prompt that is a string, token ids, or a list of either (one
//! `GenerateRequest` per prompt); choice `i * n + j` is sample `j` of prompt `i`. With `echo`
//! each choice's text starts with its prompt (streamed first).

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::{
    Answer, DONE, Input, LogprobAsk, Source, data, final_choices, finish_str, flag, ids,
    include_usage, matched, sampling, top_count, uint, unsupported, usage_json,
};
use crate::error::ApiError;
use crate::grpc::output::Delta;
use crate::grpc::translate::logprobs;
use crate::json_map::Field as _;

fn prompt(v: &Value, field: &str) -> Result<Source, ApiError> {
    match v {
        Value::String(s) => Ok(Source::Text(s.clone())),
        Value::Array(_) => ids(v, field).map(Source::Ids),
        _ => Err(ApiError::invalid_field(
            field,
            "must be a string or a list of token ids",
        )),
    }
}

fn is_id_list(items: &[Value]) -> bool {
    items.iter().all(|x| x.is_u64() || x.is_i64())
}

pub(crate) fn input(o: &Map<String, Value>) -> Result<Input, ApiError> {
    let echo = flag(o, "echo")?.unwrap_or(false);
    if o.field("suffix").is_some_and(|s| !s.is_null()) {
        return Err(unsupported("'suffix'"));
    }
    if uint(o, "best_of")?.is_some_and(|b| b > 1) {
        return Err(unsupported("'best_of' above 1"));
    }
    let prompts = match o.field("prompt") {
        Some(Value::Array(items)) if !items.is_empty() && is_id_list(items) => {
            vec![prompt(&o["prompt"], "prompt")?]
        }
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .enumerate()
            .map(|(i, p)| prompt(p, &format!("prompt[{i}]")))
            .collect::<Result<_, _>>()?,
        Some(p @ Value::String(_)) => vec![prompt(p, "prompt")?],
        _ => {
            return Err(ApiError::invalid_field(
                "prompt",
                "must be a string, a list of strings, or token ids",
            ));
        }
    };
    let top = top_count(o, "logprobs")?;
    if echo && top.is_some() {
        return Err(unsupported("'echo' with 'logprobs'"));
    }
    let (params, unset) = sampling(o, &["max_tokens"])?;
    Ok(Input {
        prompts,
        params,
        unset,
        logprobs: LogprobAsk {
            output: top.is_some(),
            top: top.unwrap_or(0),
            ..LogprobAsk::default()
        },
        include_usage: include_usage(o)?,
        instructions: None,
        echo,
        chat: None,
    })
}

fn choice_logprobs(
    a: &Answer<'_>,
    index: usize,
    range: std::ops::Range<usize>,
    offset: usize,
) -> Value {
    if !a.plan.logprobs.output {
        return Value::Null;
    }
    let lps = &a.out.choices[index].logprobs[range];
    logprobs::completions(&a.out.tokenizer, lps, offset)
}

fn envelope(a: &Answer<'_>, choices: Value, usage: impl serde::Serialize) -> Value {
    json!({
        "id": format!("cmpl-{}", a.id),
        "object": "text_completion",
        "created": a.created,
        "model": a.model,
        "choices": choices,
        "usage": usage,
    })
}

pub(crate) fn body(a: &Answer<'_>) -> Value {
    let choices = final_choices(a, |i, c| {
        let text = if a.plan.echo {
            a.plan.prompt_text(c.prompt, &a.out.tokenizer) + &c.full
        } else {
            c.full.clone()
        };
        json!({
            "text": text,
            "logprobs": choice_logprobs(a, i, 0..c.logprobs.len(), 0),
        })
    });
    envelope(a, choices, usage_json(a.out.usage()))
}

/// With `echo`, each choice's prompt, before its first token.
pub(crate) fn start(a: &Answer<'_>) -> Vec<Bytes> {
    if !a.plan.echo {
        return Vec::new();
    }
    let t = &a.out.tokenizer;
    a.out
        .choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let choice = json!([{
                "index": i,
                "text": a.plan.prompt_text(c.prompt, t),
                "logprobs": null,
                "finish_reason": null,
            }]);
            data(&envelope(a, choice, Value::Null))
        })
        .collect()
}

pub(crate) fn delta(a: &Answer<'_>, d: &Delta) -> Vec<Bytes> {
    let mut out = Vec::new();
    let c = &a.out.choices[d.index];
    if !d.text.is_empty() || !d.logprobs.is_empty() {
        let offset = c.full.len().saturating_sub(d.text.len());
        out.push(data(&envelope(
            a,
            json!([{
                "index": d.index,
                "text": d.text,
                "logprobs": choice_logprobs(a, d.index, d.logprobs.clone(), offset),
                "finish_reason": null,
            }]),
            Value::Null,
        )));
    }
    if d.finished {
        out.push(data(&envelope(
            a,
            json!([{
                "index": d.index,
                "text": "",
                "logprobs": null,
                "finish_reason": finish_str(c.finish.as_ref()),
                "matched_stop": matched(c.finish.as_ref()),
            }]),
            Value::Null,
        )));
    }
    out
}

pub(crate) fn end(a: &Answer<'_>) -> Vec<Bytes> {
    let mut out = Vec::new();
    if a.plan.include_usage {
        out.push(data(&envelope(a, json!([]), usage_json(a.out.usage()))));
    }
    out.push(DONE);
    out
}
