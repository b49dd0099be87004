//! SGLang/OpenAI-shaped response rendering: what one generation request is answered
//! ([`Plan`], built from what [`super::request`] reads of it and what [`super::output`]
//! generates), as a JSON body, as one SSE chunk (a prefill worker), or token by token as
//! SSE, with the Responses API's event sequence.

use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::Stream;
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::output::{self, Output, Stops};
use super::request::{self, Api, Prompt, Prompts, answer_schema, requested_tokens};
use crate::config::Role;
use crate::state::InflightGuard;

/// One sample of the answer (a batch item or a choice).
#[derive(Debug)]
struct Sample {
    prompt_tokens: u64,
    /// The prompt's token ids, when the request gave ids.
    prompt_ids: Option<Vec<Value>>,
    rid: String,
}

/// One `/generate` result object, SGLang's shape, keys in SGLang's order.
#[derive(Serialize)]
struct GenerateItem<'a> {
    text: String,
    meta_info: MetaInfo<'a>,
    /// A batch item's position.
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<usize>,
}

/// `/generate`'s answer: one object, or an array for a batch.
// Lives only until it is serialised; boxing the item would cost an allocation per answer.
#[allow(clippy::large_enum_variant)]
#[derive(Serialize)]
#[serde(untagged)]
enum GenerateAnswer<'a> {
    One(GenerateItem<'a>),
    Batch(Vec<GenerateItem<'a>>),
}

/// `meta_info` of a `/generate` result.
#[derive(Serialize)]
struct MetaInfo<'a> {
    id: &'a str,
    /// `null` until the last token.
    finish_reason: Option<output::SglangFinish<'a>>,
    prompt_tokens: u64,
    completion_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    input_token_logprobs: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_token_logprobs: Option<Value>,
}

/// What to answer to one generation request.
#[derive(Debug)]
pub(crate) struct Plan {
    api: Api,
    role: Role,
    /// Whether the client asked for server-sent events.
    pub(crate) stream: bool,
    model: String,
    id: String,
    created: u64,
    samples: Vec<Sample>,
    usage_prompt_tokens: u64,
    /// What every sample generates.
    out: Output,
    /// Tokens generated per sample.
    pub(crate) tokens: u32,
    /// `/generate` answers a JSON array.
    batch: bool,
    include_usage: bool,
    /// `/generate` reports logprobs in `meta_info`.
    logprobs: bool,
    /// vLLM mode: the prompt tokens served from cache, reported in
    /// `usage.prompt_tokens_details` (absent when `None`).
    cached_tokens: Option<u64>,
}

/// 32 random lowercase hex digits (what `format!("{:032x}", ..)` gives, without the
/// formatter's machinery: every answer draws one or two).
pub(crate) fn random_hex() -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let v = rand::random::<u128>();
    let mut out = String::with_capacity(32);
    for i in (0..32).rev() {
        out.push(char::from(DIGITS[((v >> (4 * i)) & 0xf) as usize]));
    }
    out
}

pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn push_sse(out: &mut Vec<u8>, v: &impl Serialize) {
    out.extend_from_slice(b"data: ");
    // Serialising a `Value` into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, v);
    out.extend_from_slice(b"\n\n");
}

const DONE: &[u8] = b"data: [DONE]\n\n";

/// The `rid` of each prompt: `/generate`'s own (one, or one per prompt) or random ones;
/// none for the OpenAI APIs.
fn request_ids(api: Api, req: &Map<String, Value>, prompts: usize) -> Vec<String> {
    match (api, req.get("rid")) {
        (Api::Generate, Some(Value::String(r))) if prompts == 1 => vec![r.clone()],
        (Api::Generate, Some(Value::Array(rs))) if rs.len() == prompts => rs
            .iter()
            .map(|r| r.as_str().map_or_else(random_hex, str::to_owned))
            .collect(),
        (Api::Generate, _) => (0..prompts).map(|_| random_hex()).collect(),
        _ => Vec::new(),
    }
}

/// `n` samples of each prompt, a prompt's `rid` suffixed `-j` for its `j`th sample when
/// there are several.
fn samples_of(prompts: Vec<Prompt>, rids: &[String], n: usize) -> Vec<Sample> {
    let mut all = Vec::with_capacity(prompts.len() * n);
    for (i, (p, ids)) in prompts.into_iter().enumerate() {
        for j in 0..n {
            let rid = match rids.get(i) {
                Some(r) if n > 1 => format!("{r}-{j}"),
                Some(r) => r.clone(),
                None => String::new(),
            };
            all.push(Sample {
                prompt_tokens: p,
                prompt_ids: ids.clone(),
                rid,
            });
        }
    }
    all
}

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

        let Prompts {
            each: prompts,
            batch,
            n,
        } = request::prompts(api, req)?;

        let mut limit = requested_tokens(api, req);
        if role == Role::Prefill {
            // A prefill engine computes the prompt and samples one token.
            limit = Some(limit.map_or(1, |c| c.min(1)));
        }
        let stops = match api {
            Api::Generate => Stops::from(req.get("sampling_params").and_then(Value::as_object)),
            Api::Chat | Api::Completion => Stops::from(Some(req)),
            Api::Responses => Stops::default(),
        };
        let out = output::generate(
            output_tokens,
            limit,
            &stops,
            answer_schema(api, req).as_ref(),
        );

        let usage_prompt_tokens = prompts.iter().map(|p| p.0).sum();
        let rids = request_ids(api, req, prompts.len());
        let all = samples_of(prompts, &rids, n);

        let hex = random_hex();
        let id = match api {
            Api::Generate => hex,
            Api::Chat => format!("chatcmpl-{hex}"),
            Api::Completion => format!("cmpl-{hex}"),
            Api::Responses => format!("resp_{hex}"),
        };
        Ok(Plan {
            api,
            role,
            stream,
            model,
            id,
            created: now_secs(),
            samples: all,
            usage_prompt_tokens,
            tokens: out.tokens(),
            out,
            batch,
            include_usage,
            logprobs: api == Api::Generate && output::wants_logprobs(req),
            cached_tokens: None,
        })
    }

    /// Names the answer after the request id the client gave (vLLM: `cmpl-ID`,
    /// `chatcmpl-ID`).
    pub(crate) fn set_request_id(&mut self, rid: &str) {
        self.id = match self.api {
            Api::Generate => rid.to_owned(),
            Api::Chat => format!("chatcmpl-{rid}"),
            Api::Completion => format!("cmpl-{rid}"),
            Api::Responses => format!("resp_{rid}"),
        };
    }

    /// Reports `tokens` prompt tokens as cached in the usage.
    pub(crate) fn set_cached_tokens(&mut self, tokens: u64) {
        self.cached_tokens = Some(tokens);
    }

    /// Prompt tokens of the whole request (every prompt of a batch).
    pub(crate) fn prompt_tokens(&self) -> u64 {
        self.usage_prompt_tokens
    }

    /// Whether generation stopped at the request's token cap (not at a stop or EOS).
    pub(crate) fn capped(&self) -> bool {
        self.out.finish == output::Finish::Length
    }

    fn usage(&self) -> Value {
        let completion = u64::from(self.tokens) * self.samples.len() as u64;
        let mut usage = json!({
            "prompt_tokens": self.usage_prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.usage_prompt_tokens + completion,
        });
        if let Some(cached) = self.cached_tokens {
            usage["prompt_tokens_details"] = json!({ "cached_tokens": cached });
        }
        usage
    }

    /// A `/generate` result object after `done` tokens.
    fn generate_item(&self, i: usize, done: u32, finished: bool) -> GenerateItem<'_> {
        let sample = &self.samples[i];
        let logprobs = self.logprobs.then(|| {
            let prompt = usize::try_from(sample.prompt_tokens).unwrap_or(usize::MAX);
            (
                output::input_token_logprobs(self.role, prompt, sample.prompt_ids.as_deref()),
                output::output_token_logprobs(done),
            )
        });
        let (input_token_logprobs, output_token_logprobs) = logprobs.unzip();
        GenerateItem {
            text: self.out.text(done as usize),
            meta_info: MetaInfo {
                id: &sample.rid,
                finish_reason: finished.then(|| self.out.finish.sglang(done)),
                prompt_tokens: sample.prompt_tokens,
                completion_tokens: done,
                input_token_logprobs,
                output_token_logprobs,
            },
            index: self.batch.then_some(i),
        }
    }

    /// A streamed chat or completion chunk.
    fn choice_chunk(&self, choices: Vec<Value>) -> Value {
        let object = match self.api {
            Api::Chat => "chat.completion.chunk",
            _ => "text_completion",
        };
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// One streamed choice: `text` as a chat delta or a completion's text.
    fn stream_choice(&self, i: usize, text: Option<&str>, finish: Option<&str>) -> Value {
        let mut c = json!({ "index": i, "logprobs": null, "finish_reason": finish });
        if self.api == Api::Chat {
            c["delta"] = match text {
                Some(t) => json!({ "content": t }),
                None => json!({}),
            };
        } else {
            c["text"] = json!(text.unwrap_or(""));
        }
        c
    }

    fn message_id(&self) -> String {
        format!("msg_{}", self.id.trim_start_matches("resp_"))
    }

    fn output_text_part(text: &str) -> Value {
        json!({ "type": "output_text", "text": text, "annotations": [] })
    }

    /// The message item of a Responses answer; `text` is `None` while it is being generated.
    fn message_item(&self, text: Option<&str>) -> Value {
        let (status, content) = match text {
            Some(t) => ("completed", json!([Self::output_text_part(t)])),
            None => ("in_progress", json!([])),
        };
        json!({
            "type": "message",
            "id": self.message_id(),
            "status": status,
            "role": "assistant",
            "content": content,
        })
    }

    fn response_object(&self, text: Option<&str>) -> Value {
        let (status, output, usage) = match text {
            Some(text) => {
                let p = self.usage_prompt_tokens;
                let c = u64::from(self.tokens);
                (
                    "completed",
                    json!([self.message_item(Some(text))]),
                    json!({
                        "input_tokens": p,
                        "input_tokens_details": { "cached_tokens": 0 },
                        "output_tokens": c,
                        "output_tokens_details": { "reasoning_tokens": 0 },
                        "total_tokens": p + c,
                    }),
                )
            }
            None => ("in_progress", json!([]), Value::Null),
        };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": null,
            "incomplete_details": null,
            "instructions": null,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": true,
            "tool_choice": "auto",
            "tools": [],
            "usage": usage,
        })
    }

    /// The complete non-streaming JSON body.
    pub(crate) fn full_body(&self) -> Vec<u8> {
        // `/generate` answers are written straight from their fields: no tree of maps built
        // only to be serialised.
        match self.api {
            Api::Generate => serde_json::to_vec(&self.generate_answer()),
            _ => serde_json::to_vec(&self.full_value()),
        }
        .unwrap_or_default()
    }

    /// `/generate`'s whole answer: its one item, or a batch's array of them.
    fn generate_answer(&self) -> GenerateAnswer<'_> {
        if self.batch {
            GenerateAnswer::Batch(
                (0..self.samples.len())
                    .map(|i| self.generate_item(i, self.tokens, true))
                    .collect(),
            )
        } else {
            GenerateAnswer::One(self.generate_item(0, self.tokens, true))
        }
    }

    /// The complete non-streaming answer, as JSON to add fields to.
    pub(crate) fn full_value(&self) -> Value {
        let text = self.out.text(self.tokens as usize);
        let finish = self.out.finish.openai();
        match self.api {
            Api::Generate => serde_json::to_value(self.generate_answer()).unwrap_or_default(),
            Api::Chat => json!({
                "id": self.id,
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "choices": (0..self.samples.len()).map(|i| json!({
                    "index": i,
                    "message": { "role": "assistant", "content": text },
                    "logprobs": null,
                    "finish_reason": finish,
                })).collect::<Vec<_>>(),
                "usage": self.usage(),
            }),
            Api::Completion => json!({
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": (0..self.samples.len()).map(|i| json!({
                    "index": i,
                    "text": text,
                    "logprobs": null,
                    "finish_reason": finish,
                })).collect::<Vec<_>>(),
                "usage": self.usage(),
            }),
            Api::Responses => self.response_object(Some(&text)),
        }
    }

    /// The whole answer as one SSE data chunk (per output for `/generate`)
    /// followed by `[DONE]` — what a prefill worker streams.
    pub(crate) fn single_chunk_sse(&self) -> Vec<u8> {
        let text = self.out.text(self.tokens as usize);
        let mut out = Vec::with_capacity(256);
        match self.api {
            Api::Generate => {
                for i in 0..self.samples.len() {
                    push_sse(&mut out, &self.generate_item(i, self.tokens, true));
                }
            }
            Api::Chat | Api::Completion => {
                let finish = Some(self.out.finish.openai());
                let choices = (0..self.samples.len())
                    .map(|i| {
                        let mut c = self.stream_choice(i, Some(&text), finish);
                        if self.api == Api::Chat {
                            c["delta"]["role"] = json!("assistant");
                        }
                        c
                    })
                    .collect();
                let mut chunk = self.choice_chunk(choices);
                if self.include_usage {
                    chunk["usage"] = self.usage();
                }
                push_sse(&mut out, &chunk);
            }
            Api::Responses => {
                let mut seq = 0;
                push_response_event(
                    &mut out,
                    &mut seq,
                    "response.completed",
                    json!({ "response": self.response_object(Some(&text)) }),
                );
                return out;
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
            plan: self,
            interval,
            step: 0,
            sequence: 0,
            phase: Phase::Head,
            _guard: guard,
        };
        futures_util::stream::unfold(state, |mut st| async move {
            let chunk = st.next_chunk().await?;
            Some((Ok(chunk), st))
        })
    }
}

/// Appends one Responses-API event (`event:` line and data with its `type` and
/// `sequence_number`).
fn push_response_event(out: &mut Vec<u8>, seq: &mut u64, kind: &str, mut fields: Value) {
    fields["type"] = json!(kind);
    fields["sequence_number"] = json!(*seq);
    *seq += 1;
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(kind.as_bytes());
    out.push(b'\n');
    push_sse(out, &fields);
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
    step: u32,
    /// Next Responses-API `sequence_number`.
    sequence: u64,
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

    fn head(&mut self) -> Option<Bytes> {
        let plan = &self.plan;
        let mut out = Vec::new();
        match plan.api {
            Api::Generate | Api::Completion => return None,
            Api::Chat => {
                for i in 0..plan.samples.len() {
                    let mut c = plan.stream_choice(i, Some(""), None);
                    c["delta"]["role"] = json!("assistant");
                    push_sse(&mut out, &plan.choice_chunk(vec![c]));
                }
            }
            Api::Responses => {
                let seq = &mut self.sequence;
                let response = plan.response_object(None);
                push_response_event(
                    &mut out,
                    seq,
                    "response.created",
                    json!({ "response": response }),
                );
                push_response_event(
                    &mut out,
                    seq,
                    "response.in_progress",
                    json!({ "response": response }),
                );
                push_response_event(
                    &mut out,
                    seq,
                    "response.output_item.added",
                    json!({ "output_index": 0, "item": plan.message_item(None) }),
                );
                push_response_event(
                    &mut out,
                    seq,
                    "response.content_part.added",
                    json!({
                        "item_id": plan.message_id(),
                        "output_index": 0,
                        "content_index": 0,
                        "part": Plan::output_text_part(""),
                    }),
                );
            }
        }
        Some(out.into())
    }

    fn token(&mut self, k: u32) -> Bytes {
        let plan = &self.plan;
        let piece = plan.out.pieces[k as usize].as_str();
        let mut out = Vec::with_capacity(160 * plan.samples.len());
        match plan.api {
            Api::Generate => {
                let last = k + 1 == plan.tokens;
                for i in 0..plan.samples.len() {
                    push_sse(&mut out, &plan.generate_item(i, k + 1, last));
                }
            }
            Api::Chat | Api::Completion => {
                for i in 0..plan.samples.len() {
                    let c = plan.stream_choice(i, Some(piece), None);
                    push_sse(&mut out, &plan.choice_chunk(vec![c]));
                }
            }
            Api::Responses => push_response_event(
                &mut out,
                &mut self.sequence,
                "response.output_text.delta",
                json!({
                    "item_id": plan.message_id(),
                    "output_index": 0,
                    "content_index": 0,
                    "delta": piece,
                    "logprobs": [],
                }),
            ),
        }
        out.into()
    }

    fn tail(&mut self) -> Bytes {
        let plan = &self.plan;
        let mut out = Vec::new();
        match plan.api {
            Api::Generate => {
                if plan.tokens == 0 {
                    for i in 0..plan.samples.len() {
                        push_sse(&mut out, &plan.generate_item(i, 0, true));
                    }
                }
            }
            Api::Chat | Api::Completion => {
                let finish = Some(plan.out.finish.openai());
                for i in 0..plan.samples.len() {
                    let c = plan.stream_choice(i, None, finish);
                    push_sse(&mut out, &plan.choice_chunk(vec![c]));
                }
                if plan.include_usage {
                    let mut chunk = plan.choice_chunk(Vec::new());
                    chunk["usage"] = plan.usage();
                    push_sse(&mut out, &chunk);
                }
            }
            Api::Responses => {
                let text = plan.out.text(plan.tokens as usize);
                let seq = &mut self.sequence;
                let at = |key: &str, v: Value| {
                    let mut e = json!({
                        "item_id": plan.message_id(),
                        "output_index": 0,
                        "content_index": 0,
                    });
                    e[key] = v;
                    e
                };
                let mut done = at("text", json!(text));
                done["logprobs"] = json!([]);
                push_response_event(&mut out, seq, "response.output_text.done", done);
                let part = at("part", Plan::output_text_part(&text));
                push_response_event(&mut out, seq, "response.content_part.done", part);
                push_response_event(
                    &mut out,
                    seq,
                    "response.output_item.done",
                    json!({ "output_index": 0, "item": plan.message_item(Some(&text)) }),
                );
                push_response_event(
                    &mut out,
                    seq,
                    "response.completed",
                    json!({ "response": plan.response_object(Some(&text)) }),
                );
                return out.into();
            }
        }
        out.extend_from_slice(DONE);
        out.into()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::{Api, Plan, random_hex};
    use crate::config::Role;

    fn generate_body(req: Value, role: Role) -> (String, u64) {
        let Value::Object(req) = req else {
            unreachable!("an object")
        };
        let plan = match Plan::new(Api::Generate, &req, role, "m", 8) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        let body = String::from_utf8(plan.full_body()).unwrap_or_default();
        (body, plan.prompt_tokens())
    }

    #[test]
    fn generate_bodies_have_sglangs_keys_in_sglangs_order() {
        let (body, p) = generate_body(
            json!({"text": "a b", "rid": "r1", "sampling_params": {"max_new_tokens": 2}}),
            Role::Regular,
        );
        let want = format!(
            r#"{{"text":" tok0 tok1","meta_info":{{"id":"r1","finish_reason":{{"type":"length","length":2}},"prompt_tokens":{p},"completion_tokens":2}}}}"#
        );
        assert_eq!(body, want);

        // A batch: one object per prompt, each with its index; a natural end stops at EOS.
        let (body, _) = generate_body(json!({"text": ["a", "b"], "rid": ["x", "y"]}), Role::Decode);
        let items: Vec<Value> = serde_json::from_str(&body).unwrap_or_default();
        assert_eq!(items.len(), 2);
        for (i, (item, rid)) in items.iter().zip(["x", "y"]).enumerate() {
            assert_eq!(item["index"], json!(i));
            assert_eq!(item["meta_info"]["id"], rid);
            assert_eq!(item["meta_info"]["finish_reason"]["type"], "stop");
            let keys: Vec<&str> = item
                .as_object()
                .map(|o| o.keys().map(String::as_str).collect())
                .unwrap_or_default();
            assert_eq!(keys, ["text", "meta_info", "index"]);
        }

        // Logprobs come last in meta_info.
        let (body, _) = generate_body(
            json!({"input_ids": [5, 6, 7], "return_logprob": true,
                   "sampling_params": {"max_new_tokens": 1}}),
            Role::Regular,
        );
        let item: Value = serde_json::from_str(&body).unwrap_or_default();
        let keys: Vec<&str> = item["meta_info"]
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        assert_eq!(
            keys,
            [
                "id",
                "finish_reason",
                "prompt_tokens",
                "completion_tokens",
                "input_token_logprobs",
                "output_token_logprobs"
            ]
        );
        assert_eq!(
            item["meta_info"]["output_token_logprobs"][0][1],
            json!(1000)
        );
        assert!(item.get("index").is_none());
    }

    #[test]
    fn random_hex_is_32_lowercase_hex_digits_and_varies() {
        let a = random_hex();
        let b = random_hex();
        for h in [&a, &b] {
            assert_eq!(h.len(), 32, "{h}");
            assert!(
                h.bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)),
                "{h}"
            );
        }
        assert_ne!(a, b);
    }
}
