//! Request interpretation and SGLang/OpenAI-shaped response rendering.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::Stream;
use serde_json::{Map, Value, json};

use crate::config::Role;
use crate::state::InflightGuard;

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

/// One generated output (a batch item or a choice).
#[derive(Debug)]
struct Output {
    prompt_tokens: u64,
    rid: String,
}

/// What to answer to one generation request.
#[derive(Debug)]
pub(crate) struct Plan {
    api: Api,
    /// Whether the client asked for server-sent events.
    pub(crate) stream: bool,
    model: String,
    id: String,
    created: u64,
    outputs: Vec<Output>,
    usage_prompt_tokens: u64,
    /// Tokens generated per output.
    pub(crate) tokens: u32,
    /// `/generate` answers a JSON array.
    batch: bool,
    include_usage: bool,
}

fn random_hex() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
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

/// Appends the text of tokens `from..to` (`" tok{k}"`).
fn push_tokens(s: &mut String, from: u32, to: u32) {
    for k in from..to {
        let _ = write!(s, " tok{k}");
    }
}

fn tokens_text(n: u32) -> String {
    let mut s = String::with_capacity(n as usize * 7);
    push_tokens(&mut s, 0, n);
    s
}

fn push_sse(out: &mut Vec<u8>, v: &Value) {
    out.extend_from_slice(b"data: ");
    // Serialising a `Value` into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, v);
    out.extend_from_slice(b"\n\n");
}

const DONE: &[u8] = b"data: [DONE]\n\n";

impl Plan {
    /// Interprets a generation request. `Err` carries a 400 message.
    pub(crate) fn new(
        api: Api,
        req: &Map<String, Value>,
        role: Role,
        default_model: &str,
        output_tokens: u32,
    ) -> Result<Plan, String> {
        let stream = matches!(req.get("stream"), Some(Value::Bool(true)));
        let model = match req.get("model") {
            Some(Value::String(m)) if !m.is_empty() => m.clone(),
            _ => default_model.to_owned(),
        };
        let include_usage = req
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false);

        // (prompt tokens per prompt, batch?, token cap, samples per prompt)
        let (prompts, batch, limit, n): (Vec<u64>, bool, Option<u32>, usize) = match api {
            Api::Generate => {
                let (prompts, batch) = match (req.get("text"), req.get("input_ids")) {
                    (Some(Value::String(s)), _) => (vec![text_tokens(s)], false),
                    (Some(Value::Array(items)), _) => (
                        items
                            .iter()
                            .map(|v| v.as_str().map_or(0, text_tokens))
                            .collect(),
                        true,
                    ),
                    (_, Some(Value::Array(ids))) if ids.first().is_some_and(Value::is_array) => (
                        ids.iter()
                            .map(|v| v.as_array().map_or(0, |a| len_u64(a)))
                            .collect(),
                        true,
                    ),
                    (_, Some(Value::Array(ids))) => (vec![len_u64(ids)], false),
                    _ => (vec![0], false),
                };
                let n = samples(req.get("sampling_params").and_then(|p| p.get("n")));
                (prompts, batch || n > 1, requested_tokens(api, req), n)
            }
            Api::Chat => {
                let prompt = match req.get("messages") {
                    Some(Value::Array(msgs)) => msgs
                        .iter()
                        .map(|m| 4 + content_tokens(m.get("content")))
                        .sum(),
                    _ => return Err("messages must be an array".to_owned()),
                };
                (
                    vec![prompt],
                    false,
                    requested_tokens(api, req),
                    samples(req.get("n")),
                )
            }
            Api::Completion => {
                let prompts = match req.get("prompt") {
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
                };
                (
                    prompts,
                    false,
                    requested_tokens(api, req),
                    samples(req.get("n")),
                )
            }
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
                (vec![prompt], false, requested_tokens(api, req), 1)
            }
        };
        if prompts.is_empty() {
            return Err("empty batch".to_owned());
        }

        let mut tokens = output_tokens;
        if let Some(limit) = limit {
            tokens = tokens.min(limit);
        }
        if role == Role::Prefill {
            tokens = tokens.min(1);
        }

        let rids: Vec<String> = match (api, req.get("rid")) {
            (Api::Generate, Some(Value::String(r))) if prompts.len() == 1 => vec![r.clone()],
            (Api::Generate, Some(Value::Array(rs))) if rs.len() == prompts.len() => rs
                .iter()
                .map(|r| r.as_str().map_or_else(random_hex, str::to_owned))
                .collect(),
            (Api::Generate, _) => prompts.iter().map(|_| random_hex()).collect(),
            _ => Vec::new(),
        };
        let mut outputs = Vec::with_capacity(prompts.len() * n);
        for (i, &p) in prompts.iter().enumerate() {
            for j in 0..n {
                let rid = match rids.get(i) {
                    Some(r) if n > 1 => format!("{r}-{j}"),
                    Some(r) => r.clone(),
                    None => String::new(),
                };
                outputs.push(Output {
                    prompt_tokens: p,
                    rid,
                });
            }
        }

        let hex = random_hex();
        let id = match api {
            Api::Generate => hex,
            Api::Chat => format!("chatcmpl-{hex}"),
            Api::Completion => format!("cmpl-{hex}"),
            Api::Responses => format!("resp_{hex}"),
        };
        Ok(Plan {
            api,
            stream,
            model,
            id,
            created: now_secs(),
            outputs,
            usage_prompt_tokens: prompts.iter().sum(),
            tokens,
            batch,
            include_usage,
        })
    }

    fn usage(&self) -> Value {
        let completion = u64::from(self.tokens) * self.outputs.len() as u64;
        json!({
            "prompt_tokens": self.usage_prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.usage_prompt_tokens + completion,
        })
    }

    /// A `/generate` result object after `done` tokens.
    fn generate_item(&self, i: usize, text: &str, done: u32, finished: bool) -> Value {
        let out = &self.outputs[i];
        let finish = if finished {
            json!({ "type": "length", "length": done })
        } else {
            Value::Null
        };
        let mut v = json!({
            "text": text,
            "meta_info": {
                "id": out.rid,
                "finish_reason": finish,
                "prompt_tokens": out.prompt_tokens,
                "completion_tokens": done,
            },
        });
        if self.batch {
            v["index"] = json!(i);
        }
        v
    }

    fn chat_chunk(&self, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    fn completion_chunk(&self, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    fn message_id(&self) -> String {
        format!("msg_{}", self.id.trim_start_matches("resp_"))
    }

    fn response_object(&self, text: Option<&str>) -> Value {
        let (status, output, usage) = match text {
            Some(text) => {
                let p = self.usage_prompt_tokens;
                let c = u64::from(self.tokens);
                (
                    "completed",
                    json!([{
                        "type": "message",
                        "id": self.message_id(),
                        "status": "completed",
                        "role": "assistant",
                        "content": [{ "type": "output_text", "text": text, "annotations": [] }],
                    }]),
                    json!({ "input_tokens": p, "output_tokens": c, "total_tokens": p + c }),
                )
            }
            None => ("in_progress", json!([]), Value::Null),
        };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": output,
            "usage": usage,
        })
    }

    /// The complete non-streaming JSON body.
    pub(crate) fn full_body(&self) -> Vec<u8> {
        let text = tokens_text(self.tokens);
        let v = match self.api {
            Api::Generate => {
                if self.batch {
                    Value::Array(
                        (0..self.outputs.len())
                            .map(|i| self.generate_item(i, &text, self.tokens, true))
                            .collect(),
                    )
                } else {
                    self.generate_item(0, &text, self.tokens, true)
                }
            }
            Api::Chat => json!({
                "id": self.id,
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "choices": (0..self.outputs.len()).map(|i| json!({
                    "index": i,
                    "message": { "role": "assistant", "content": text },
                    "logprobs": null,
                    "finish_reason": "length",
                })).collect::<Vec<_>>(),
                "usage": self.usage(),
            }),
            Api::Completion => json!({
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": (0..self.outputs.len()).map(|i| json!({
                    "index": i,
                    "text": text,
                    "logprobs": null,
                    "finish_reason": "length",
                })).collect::<Vec<_>>(),
                "usage": self.usage(),
            }),
            Api::Responses => self.response_object(Some(&text)),
        };
        serde_json::to_vec(&v).unwrap_or_default()
    }

    /// The whole answer as one SSE data chunk (per output for `/generate`)
    /// followed by `[DONE]` — what a prefill worker streams.
    pub(crate) fn single_chunk_sse(&self) -> Vec<u8> {
        let text = tokens_text(self.tokens);
        let mut out = Vec::with_capacity(256);
        match self.api {
            Api::Generate => {
                for i in 0..self.outputs.len() {
                    push_sse(&mut out, &self.generate_item(i, &text, self.tokens, true));
                }
            }
            Api::Chat => {
                let choices = (0..self.outputs.len())
                    .map(|i| {
                        json!({
                            "index": i,
                            "delta": { "role": "assistant", "content": text },
                            "logprobs": null,
                            "finish_reason": "length",
                        })
                    })
                    .collect();
                let mut chunk = self.chat_chunk(choices);
                if self.include_usage {
                    chunk["usage"] = self.usage();
                }
                push_sse(&mut out, &chunk);
            }
            Api::Completion => {
                let choices = (0..self.outputs.len())
                    .map(|i| {
                        json!({
                            "index": i,
                            "text": text,
                            "logprobs": null,
                            "finish_reason": "length",
                        })
                    })
                    .collect();
                let mut chunk = self.completion_chunk(choices);
                if self.include_usage {
                    chunk["usage"] = self.usage();
                }
                push_sse(&mut out, &chunk);
            }
            Api::Responses => {
                push_sse(
                    &mut out,
                    &json!({
                        "type": "response.completed",
                        "response": self.response_object(Some(&text)),
                    }),
                );
            }
        }
        out.extend_from_slice(DONE);
        out
    }

    /// Streams the answer token by token, `interval` apart; `guard` lives as
    /// long as the stream.
    pub(crate) fn into_stream(
        self,
        interval: Duration,
        guard: InflightGuard,
    ) -> impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
        let state = TokenStream {
            texts: vec![String::new(); self.outputs.len()],
            plan: self,
            interval,
            step: 0,
            phase: Phase::Head,
            _guard: guard,
        };
        futures_util::stream::unfold(state, |mut st| async move {
            let chunk = st.next_chunk().await?;
            Some((Ok(chunk), st))
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Head,
    Tokens,
    Tail,
    Done,
}

/// State of a token-by-token SSE answer.
#[derive(Debug)]
struct TokenStream {
    plan: Plan,
    interval: Duration,
    /// Cumulative text per output (used by `/generate` and `/v1/responses`).
    texts: Vec<String>,
    step: u32,
    phase: Phase,
    _guard: InflightGuard,
}

impl TokenStream {
    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            match self.phase {
                Phase::Head => {
                    self.phase = Phase::Tokens;
                    if let Some(head) = self.head() {
                        return Some(head);
                    }
                }
                Phase::Tokens => {
                    if self.step >= self.plan.tokens {
                        self.phase = Phase::Tail;
                        continue;
                    }
                    if self.step > 0 && !self.interval.is_zero() {
                        tokio::time::sleep(self.interval).await;
                    }
                    let chunk = self.token(self.step);
                    self.step += 1;
                    return Some(chunk);
                }
                Phase::Tail => {
                    self.phase = Phase::Done;
                    return Some(self.tail());
                }
                Phase::Done => return None,
            }
        }
    }

    fn head(&self) -> Option<Bytes> {
        let plan = &self.plan;
        let mut out = Vec::new();
        match plan.api {
            Api::Generate | Api::Completion => return None,
            Api::Chat => {
                for i in 0..plan.outputs.len() {
                    push_sse(
                        &mut out,
                        &plan.chat_chunk(vec![json!({
                            "index": i,
                            "delta": { "role": "assistant", "content": "" },
                            "logprobs": null,
                            "finish_reason": null,
                        })]),
                    );
                }
            }
            Api::Responses => push_sse(
                &mut out,
                &json!({ "type": "response.created", "response": plan.response_object(None) }),
            ),
        }
        Some(out.into())
    }

    fn token(&mut self, k: u32) -> Bytes {
        let plan = &self.plan;
        let mut tok = String::with_capacity(8);
        push_tokens(&mut tok, k, k + 1);
        let mut out = Vec::with_capacity(160 * plan.outputs.len());
        match plan.api {
            Api::Generate => {
                let last = k + 1 == plan.tokens;
                for (i, text) in self.texts.iter_mut().enumerate() {
                    text.push_str(&tok);
                    push_sse(&mut out, &plan.generate_item(i, text, k + 1, last));
                }
            }
            Api::Chat => {
                for i in 0..plan.outputs.len() {
                    push_sse(
                        &mut out,
                        &plan.chat_chunk(vec![json!({
                            "index": i,
                            "delta": { "content": tok },
                            "logprobs": null,
                            "finish_reason": null,
                        })]),
                    );
                }
            }
            Api::Completion => {
                for i in 0..plan.outputs.len() {
                    push_sse(
                        &mut out,
                        &plan.completion_chunk(vec![json!({
                            "index": i,
                            "text": tok,
                            "logprobs": null,
                            "finish_reason": null,
                        })]),
                    );
                }
            }
            Api::Responses => {
                self.texts[0].push_str(&tok);
                push_sse(
                    &mut out,
                    &json!({
                        "type": "response.output_text.delta",
                        "item_id": plan.message_id(),
                        "output_index": 0,
                        "content_index": 0,
                        "delta": tok,
                    }),
                );
            }
        }
        out.into()
    }

    fn tail(&self) -> Bytes {
        let plan = &self.plan;
        let mut out = Vec::new();
        match plan.api {
            Api::Generate => {
                if plan.tokens == 0 {
                    for i in 0..plan.outputs.len() {
                        push_sse(&mut out, &plan.generate_item(i, "", 0, true));
                    }
                }
            }
            Api::Chat | Api::Completion => {
                for i in 0..plan.outputs.len() {
                    let chunk = if plan.api == Api::Chat {
                        plan.chat_chunk(vec![json!({
                            "index": i,
                            "delta": {},
                            "logprobs": null,
                            "finish_reason": "length",
                        })])
                    } else {
                        plan.completion_chunk(vec![json!({
                            "index": i,
                            "text": "",
                            "logprobs": null,
                            "finish_reason": "length",
                        })])
                    };
                    push_sse(&mut out, &chunk);
                }
                if plan.include_usage {
                    let mut chunk = if plan.api == Api::Chat {
                        plan.chat_chunk(Vec::new())
                    } else {
                        plan.completion_chunk(Vec::new())
                    };
                    chunk["usage"] = plan.usage();
                    push_sse(&mut out, &chunk);
                }
            }
            Api::Responses => push_sse(
                &mut out,
                &json!({
                    "type": "response.completed",
                    "response": plan.response_object(Some(&self.texts[0])),
                }),
            ),
        }
        out.extend_from_slice(DONE);
        out.into()
    }
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
mod engine_count_tests {
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
