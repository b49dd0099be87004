//! What a generation request asks for, read from its JSON body: which API it came through
//! ([`Api`]), its prompts (token counts and ids, batch or not, samples per prompt), the
//! output length it names, the JSON schema its answer must fit, and in engine mode its
//! prompt length in words. Nothing here decides the answer (`output.rs`) or renders it
//! (`render.rs`).

use serde_json::{Map, Value};

/// Which generation API a request came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Api {
    /// SGLang native `POST /generate`.
    Generate,
    /// OpenAI `POST /v1/chat/completions`.
    Chat,
    /// OpenAI `POST /v1/completions`.
    Completion,
    /// OpenAI `POST /v1/responses` (minimal).
    Responses,
}

impl Api {
    /// Every generation API an SGLang worker serves.
    pub(crate) const ALL: [Api; 4] = [Api::Generate, Api::Chat, Api::Completion, Api::Responses];

    /// Its path.
    pub(crate) fn path(self) -> &'static str {
        match self {
            Api::Generate => "/generate",
            Api::Chat => "/v1/chat/completions",
            Api::Completion => "/v1/completions",
            Api::Responses => "/v1/responses",
        }
    }
}

/// One prompt: its token count and, when the request gave token ids, the ids.
pub(super) type Prompt = (u64, Option<Vec<Value>>);

/// The prompts of a request, whether `/generate` answers them as a batch (a JSON array),
/// and the samples per prompt (`n`).
#[derive(Debug)]
pub(super) struct Prompts {
    pub(super) each: Vec<Prompt>,
    pub(super) batch: bool,
    pub(super) n: usize,
}

/// Reads a request's prompts. `Err` carries a 400 message.
pub(super) fn prompts(api: Api, req: &Map<String, Value>) -> Result<Prompts, String> {
    let prompts = match api {
        Api::Generate => generate_prompts(req),
        Api::Chat => {
            let prompt = match req.get("messages") {
                Some(Value::Array(msgs)) => msgs
                    .iter()
                    .map(|m| 4 + content_tokens(m.get("content")))
                    .sum(),
                _ => return Err("messages must be an array".to_owned()),
            };
            Prompts {
                each: vec![(prompt, None)],
                batch: false,
                n: samples(req.get("n")),
            }
        }
        Api::Completion => Prompts {
            each: completion_prompts(req.get("prompt"))?
                .into_iter()
                .map(|p| (p, None))
                .collect(),
            batch: false,
            n: samples(req.get("n")),
        },
        Api::Responses => {
            let prompt = match req.get("input") {
                Some(Value::String(s)) => text_tokens(s),
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|it| match it {
                        Value::String(s) => text_tokens(s),
                        _ => content_tokens(it.get("content")),
                    })
                    .sum(),
                _ => 0,
            };
            Prompts {
                each: vec![(prompt, None)],
                batch: false,
                n: 1,
            }
        }
    };
    if prompts.each.is_empty() {
        return Err("empty batch".to_owned());
    }
    Ok(prompts)
}

/// `/generate`: `text` (one or a list) or `input_ids` (one list of ids or a list of them);
/// several samples of one prompt are answered as a batch too.
fn generate_prompts(req: &Map<String, Value>) -> Prompts {
    let (each, batch) = match (req.get("text"), req.get("input_ids")) {
        (Some(Value::String(s)), _) => (vec![(text_tokens(s), None)], false),
        (Some(Value::Array(items)), _) => (
            items
                .iter()
                .map(|v| (v.as_str().map_or(0, text_tokens), None))
                .collect(),
            true,
        ),
        (_, Some(Value::Array(ids))) if ids.first().is_some_and(Value::is_array) => (
            ids.iter()
                .map(|v| {
                    let ids = v.as_array().cloned().unwrap_or_default();
                    (len_u64(&ids), Some(ids))
                })
                .collect(),
            true,
        ),
        (_, Some(Value::Array(ids))) => (vec![(len_u64(ids), Some(ids.clone()))], false),
        _ => (vec![(0, None)], false),
    };
    let n = samples(req.get("sampling_params").and_then(|p| p.get("n")));
    Prompts {
        each,
        batch: batch || n > 1,
        n,
    }
}

/// `/v1/completions`: the token counts of `prompt` (a string, a list of ids, or a list of
/// strings or id lists).
fn completion_prompts(prompt: Option<&Value>) -> Result<Vec<u64>, String> {
    Ok(match prompt {
        Some(Value::String(s)) => vec![text_tokens(s)],
        Some(Value::Array(items)) if items.is_empty() => vec![0],
        Some(Value::Array(items)) => match &items[0] {
            Value::Number(_) => vec![len_u64(items)],
            _ => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => text_tokens(s),
                    Value::Array(ids) => len_u64(ids),
                    _ => 0,
                })
                .collect(),
        },
        _ => return Err("prompt must be a string or an array".to_owned()),
    })
}

/// Rough token count of a text: one token per four bytes.
fn text_tokens(s: &str) -> u64 {
    (s.len() as u64).div_ceil(4)
}

fn len_u64(v: &[Value]) -> u64 {
    v.len() as u64
}

/// `count` summed over the text of an OpenAI-style content (string or array of parts).
fn content_count(content: Option<&Value>, count: fn(&str) -> u64) -> u64 {
    match content {
        Some(Value::String(s)) => count(s),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| match p {
                Value::String(s) => count(s),
                Value::Object(o) => o.get("text").and_then(Value::as_str).map_or(0, count),
                _ => 0,
            })
            .sum(),
        _ => 0,
    }
}

/// Tokens in an OpenAI-style content.
fn content_tokens(content: Option<&Value>) -> u64 {
    content_count(content, text_tokens)
}

/// A token cap from a request field, if it is a non-negative integer.
fn cap(v: Option<&Value>) -> Option<u32> {
    v.and_then(Value::as_u64)
        .map(|c| u32::try_from(c).unwrap_or(u32::MAX))
}

/// Number of samples per prompt (`n`), 1..=256.
fn samples(v: Option<&Value>) -> usize {
    v.and_then(Value::as_u64)
        .map_or(1, |n| n.clamp(1, 256) as usize)
}

/// The JSON schema a request asks its answer to fit, if any.
pub(super) fn answer_schema(api: Api, req: &Map<String, Value>) -> Option<Value> {
    let format = match api {
        Api::Generate => {
            let s = req.get("sampling_params")?.get("json_schema")?;
            return match s {
                Value::String(text) => serde_json::from_str(text).ok(),
                other => Some(other.clone()),
            };
        }
        Api::Chat => req.get("response_format")?,
        Api::Responses => req.get("text")?.get("format")?,
        Api::Completion => return None,
    };
    if format.get("type")?.as_str()? != "json_schema" {
        return None;
    }
    // Chat nests the schema under `json_schema`, Responses puts it beside `type`.
    format
        .get("json_schema")
        .unwrap_or(format)
        .get("schema")
        .cloned()
}

/// Words in a text, the engine-mode token count.
fn words(s: &str) -> u64 {
    s.split_whitespace().count() as u64
}

fn content_words(content: Option<&Value>) -> u64 {
    content_count(content, words)
}

/// Words (or token ids) of a text-or-ids prompt, or of a list of them.
fn prompt_input_words(v: Option<&Value>) -> u64 {
    match v {
        Some(Value::String(s)) => words(s),
        Some(Value::Array(items)) => items
            .iter()
            .map(|it| match it {
                Value::String(s) => words(s),
                Value::Number(_) => 1,
                Value::Array(ids) => len_u64(ids),
                other => content_words(other.get("content")),
            })
            .sum(),
        _ => 0,
    }
}

/// Prompt length of a request in engine mode: words of the text (all
/// prompts of a batch together), or the number of token ids.
pub(crate) fn prompt_words(api: Api, req: &Map<String, Value>) -> u64 {
    match api {
        Api::Generate => match req.get("text") {
            Some(t @ (Value::String(_) | Value::Array(_))) => prompt_input_words(Some(t)),
            _ => prompt_input_words(req.get("input_ids")),
        },
        Api::Chat => match req.get("messages") {
            Some(Value::Array(msgs)) => msgs.iter().map(|m| content_words(m.get("content"))).sum(),
            _ => 0,
        },
        Api::Completion => prompt_input_words(req.get("prompt")),
        Api::Responses => prompt_input_words(req.get("input")),
    }
}

/// The output length a request asks for, if it names one.
pub(crate) fn requested_tokens(api: Api, req: &Map<String, Value>) -> Option<u32> {
    match api {
        Api::Generate => cap(req
            .get("sampling_params")
            .and_then(|p| p.get("max_new_tokens"))),
        Api::Chat => cap(req.get("max_completion_tokens")).or(cap(req.get("max_tokens"))),
        Api::Completion => cap(req.get("max_tokens")),
        Api::Responses => cap(req.get("max_output_tokens")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn prompt_words_counts_words_or_ids() {
        let g = obj(json!({"text": "w1 w2  w3"}));
        assert_eq!(prompt_words(Api::Generate, &g), 3);
        let gb = obj(json!({"text": ["a b", "c"]}));
        assert_eq!(prompt_words(Api::Generate, &gb), 3);
        let ids = obj(json!({"input_ids": [1, 2, 3, 4]}));
        assert_eq!(prompt_words(Api::Generate, &ids), 4);
        let ids_batch = obj(json!({"input_ids": [[1, 2], [3]]}));
        assert_eq!(prompt_words(Api::Generate, &ids_batch), 3);
        let chat = obj(json!({"messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "one two three"}]}
        ]}));
        assert_eq!(prompt_words(Api::Chat, &chat), 5);
        let c = obj(json!({"prompt": "x y"}));
        assert_eq!(prompt_words(Api::Completion, &c), 2);
        let r = obj(json!({"input": "p q r s"}));
        assert_eq!(prompt_words(Api::Responses, &r), 4);
    }

    #[test]
    fn requested_tokens_reads_each_api_field() {
        let g = obj(json!({"sampling_params": {"max_new_tokens": 5}}));
        assert_eq!(requested_tokens(Api::Generate, &g), Some(5));
        let chat = obj(json!({"max_tokens": 4, "max_completion_tokens": 6}));
        assert_eq!(requested_tokens(Api::Chat, &chat), Some(6));
        assert_eq!(requested_tokens(Api::Completion, &obj(json!({}))), None);
        let r = obj(json!({"max_output_tokens": 2}));
        assert_eq!(requested_tokens(Api::Responses, &r), Some(2));
    }
}
