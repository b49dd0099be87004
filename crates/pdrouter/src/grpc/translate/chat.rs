//! `/v1/chat/completions`: messages through the chat template; one choice per sample.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::{
    Answer, DONE, Input, LogprobAsk, Source, data, final_choices, finish_str, flag, include_usage,
    matched, sampling, top_count, usage_json,
};
use crate::chat_template::chat_input;
use crate::error::ApiError;
use crate::grpc::output::Delta;
use crate::grpc::translate::logprobs;

/// `body` is shared so that a chat with images can keep it for the image path without a copy.
pub(crate) fn input(body: &Arc<Map<String, Value>>) -> Result<Input, ApiError> {
    let o = &**body;
    let messages = o
        .get("messages")
        .filter(|m| m.is_array())
        .ok_or_else(|| ApiError::invalid_field("messages", "must be an array"))?;
    // Image parts need the encode path (pixels to encode workers, placeholders expanded in
    // the prompt), which `plan` takes or refuses; rendered as text they would reach the
    // engine as an image token without an image.
    let images = pdrouter_vision::image_parts(messages).map_err(|e| ApiError::image_prompt(&e))?;
    let prompt = if images.is_empty() {
        Source::Chat(chat_input(
            messages,
            o.get("tools"),
            o.get("chat_template_kwargs"),
        ))
    } else {
        Source::Images(crate::images::ImageChat::new(Arc::clone(body)))
    };
    let output = flag(o, "logprobs")?.unwrap_or(false);
    let top = top_count(o, "top_logprobs")?;
    if top.is_some() && !output {
        return Err(ApiError::invalid_field(
            "top_logprobs",
            "needs 'logprobs': true",
        ));
    }
    let (params, unset) = sampling(o, &["max_completion_tokens", "max_tokens"])?;
    Ok(Input {
        prompts: vec![prompt],
        params,
        unset,
        logprobs: LogprobAsk {
            output,
            top: top.unwrap_or(0),
            ..LogprobAsk::default()
        },
        include_usage: include_usage(o),
        instructions: None,
        echo: false,
    })
}

fn choice_logprobs(a: &Answer<'_>, index: usize, range: std::ops::Range<usize>) -> Value {
    if !a.plan.logprobs.output {
        return Value::Null;
    }
    let lps = &a.out.choices[index].logprobs[range];
    logprobs::chat(&a.out.tokenizer, lps)
}

pub(crate) fn body(a: &Answer<'_>) -> Value {
    let choices = final_choices(a, |i, c| {
        json!({
            "message": {"role": "assistant", "content": c.full},
            "logprobs": choice_logprobs(a, i, 0..c.logprobs.len()),
        })
    });
    json!({
        "id": format!("chatcmpl-{}", a.id),
        "object": "chat.completion",
        "created": a.created,
        "model": a.model,
        "choices": choices,
        "usage": usage_json(a.out.usage()),
    })
}

fn chunk(a: &Answer<'_>, choices: Value, usage: Value) -> Bytes {
    data(&json!({
        "id": format!("chatcmpl-{}", a.id),
        "object": "chat.completion.chunk",
        "created": a.created,
        "model": a.model,
        "choices": choices,
        "usage": usage,
    }))
}

/// The assistant role, once per choice.
pub(crate) fn start(a: &Answer<'_>) -> Vec<Bytes> {
    (0..a.out.choices.len())
        .map(|i| {
            chunk(
                a,
                json!([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
                Value::Null,
            )
        })
        .collect()
}

pub(crate) fn delta(a: &Answer<'_>, d: &Delta) -> Vec<Bytes> {
    let mut out = Vec::new();
    if !d.text.is_empty() || !d.logprobs.is_empty() {
        out.push(chunk(
            a,
            json!([{
                "index": d.index,
                "delta": {"content": d.text},
                "logprobs": choice_logprobs(a, d.index, d.logprobs.clone()),
                "finish_reason": null,
            }]),
            Value::Null,
        ));
    }
    if d.finished {
        let f = a.out.choices[d.index].finish.as_ref();
        out.push(chunk(
            a,
            json!([{
                "index": d.index,
                "delta": {},
                "logprobs": null,
                "finish_reason": finish_str(f),
                "matched_stop": matched(f),
            }]),
            Value::Null,
        ));
    }
    out
}

pub(crate) fn end(a: &Answer<'_>) -> Vec<Bytes> {
    let mut out = Vec::new();
    if a.plan.include_usage {
        out.push(chunk(a, json!([]), usage_json(a.out.usage())));
    }
    out.push(DONE);
    out
}
