//! OpenAI/SGLang JSON to token-id `GenerateRequest`s, and the engine's output back to
//! response bodies and SSE events.
//!
//! Served: `/v1/chat/completions` ([`chat`]), `/v1/completions` ([`completions`]),
//! `/generate` ([`generate`]) and `/v1/responses` ([`responses`], text only), streaming and
//! not, with `n` samples per prompt (the engine's `n`; its messages name the sample in
//! `index`), prompt lists (one `GenerateRequest` per prompt), and logprobs ([`logprobs`]).
//! What a gRPC worker would need translated that is not served is refused with 501
//! `not_implemented` naming the field, never forwarded half-translated.
//!
//! Sampling fields the client leaves unset are filled from the worker's reported defaults
//! (`GetModelInfo`), then with the engines' own defaults: proto zeros would be rejected or
//! change the sampling.
//!
//! The [`Plan`] built here is defined in `grpc::plan` (re-exported here), below `output`, which
//! reads it too.

pub mod chat;
pub mod completions;
pub mod fields;
pub mod generate;
pub mod logprobs;
pub mod responses;

use std::sync::Arc;

use bytes::Bytes;
use pdrouter_proto::scheduler::{GenerateRequest, SamplingParams, TokenizedInput, sampling_params};
use pdrouter_tokenizer::{DecodeOptions, FinishReason, StopConditions, Tokenizer};
use serde_json::{Map, Value, json};

use super::output::{Delta, Output, Usage};
pub use super::plan::{LogprobAsk, Plan};
use super::runtime::Runtime;
use crate::config::ChatParsers;
use crate::error::ApiError;
use crate::json_map::Field as _;
use crate::request::{Endpoint, ParsedRequest};

use crate::request::MAX_CHOICES;
/// Most alternatives per logprob position.
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// Sampling fields a worker's reported defaults may fill, by their engine names.
const WORKER_DEFAULTABLE: [&str; 8] = [
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "max_new_tokens",
];

/// A request's shape, for 501s: what is not served for gRPC workers yet.
pub(crate) fn unsupported(what: &str) -> ApiError {
    ApiError::not_implemented(format!(
        "{what} is not served for gRPC workers yet; leave it out or use HTTP workers"
    ))
}

/// A request's shape, for 501s: what workers of `runtime` cannot serve.
pub(crate) fn unsupported_on(what: &str, runtime: Runtime) -> ApiError {
    ApiError::not_implemented(format!(
        "{what} is not served by {runtime} workers; leave it out or use SGLang workers"
    ))
}

pub(crate) fn num(o: &Map<String, Value>, k: &str) -> Result<Option<f64>, ApiError> {
    match o.field(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|f| f.is_finite())
            .map(Some)
            .ok_or_else(|| ApiError::invalid_field(k, "must be a number")),
    }
}

pub(crate) fn uint(o: &Map<String, Value>, k: &str) -> Result<Option<u32>, ApiError> {
    match o.field(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| ApiError::invalid_field(k, "must be a non-negative integer below 2^32")),
    }
}

pub(crate) fn flag(o: &Map<String, Value>, k: &str) -> Result<Option<bool>, ApiError> {
    match o.field(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::invalid_field(k, "must be true or false")),
    }
}

/// A top-logprobs count, at most [`MAX_TOP_LOGPROBS`].
pub(crate) fn top_count(o: &Map<String, Value>, k: &str) -> Result<Option<u32>, ApiError> {
    match uint(o, k)? {
        Some(n) if n > MAX_TOP_LOGPROBS => Err(ApiError::invalid_field(
            k,
            format!("must be at most {MAX_TOP_LOGPROBS}"),
        )),
        n => Ok(n),
    }
}

pub(crate) fn ids(v: &Value, k: &str) -> Result<Vec<u32>, ApiError> {
    v.as_array()
        .and_then(|a| {
            a.iter()
                .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
                .collect::<Option<Vec<u32>>>()
        })
        .ok_or_else(|| ApiError::invalid_field(k, "must be an array of token ids"))
}

fn strings(o: &Map<String, Value>, k: &str) -> Result<Vec<String>, ApiError> {
    match o.field(k) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::invalid_field(k, "must be a string or an array of strings")),
        Some(_) => Err(ApiError::invalid_field(
            k,
            "must be a string or an array of strings",
        )),
    }
}

/// Sampling fields from `o` (top level for OpenAI bodies, `sampling_params` for
/// `/generate`), with the engine names of the fields the client left unset.
pub(crate) fn sampling(
    o: &Map<String, Value>,
    max_keys: &[&str],
) -> Result<(SamplingParams, Vec<&'static str>), ApiError> {
    let mut unset = Vec::with_capacity(WORKER_DEFAULTABLE.len());
    let mut f = |k: &'static str, default: f32| {
        num(o, k).map(|v| match v {
            Some(x) => x as f32,
            None => {
                unset.push(k);
                default
            }
        })
    };
    let temperature = f("temperature", 1.0)?;
    let top_p = f("top_p", 1.0)?;
    let min_p = f("min_p", 0.0)?;
    let frequency_penalty = f("frequency_penalty", 0.0)?;
    let presence_penalty = f("presence_penalty", 0.0)?;
    let repetition_penalty = f("repetition_penalty", 1.0)?;
    let mut max_new_tokens = None;
    for k in max_keys {
        if let Some(m) = uint(o, k)? {
            max_new_tokens = Some(m);
            break;
        }
    }
    if max_new_tokens.is_none() {
        unset.push("max_new_tokens");
    }
    let top_k = match o.field("top_k") {
        None | Some(Value::Null) => {
            unset.push("top_k");
            -1
        }
        Some(v) => v
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| ApiError::invalid_field("top_k", "must be an integer"))?,
    };
    let constraint = constraint(o)?;
    debug_assert!(unset.iter().all(|k| WORKER_DEFAULTABLE.contains(k)));
    let params = SamplingParams {
        temperature,
        top_p,
        top_k,
        min_p,
        frequency_penalty,
        presence_penalty,
        repetition_penalty,
        max_new_tokens,
        stop: strings(o, "stop")?,
        stop_token_ids: match o.field("stop_token_ids") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => ids(v, "stop_token_ids")?,
        },
        skip_special_tokens: flag(o, "skip_special_tokens")?.unwrap_or(true),
        spaces_between_special_tokens: flag(o, "spaces_between_special_tokens")?.unwrap_or(true),
        constraint,
        n: 1,
        min_new_tokens: uint(o, "min_new_tokens")?
            .or(uint(o, "min_tokens")?)
            .unwrap_or(0),
        ignore_eos: flag(o, "ignore_eos")?.unwrap_or(false),
        no_stop_trim: flag(o, "no_stop_trim")?.unwrap_or(false),
        logit_bias: logit_bias(o)?,
        ..Default::default()
    };
    Ok((params, unset))
}

/// `regex`, `json_schema` or `ebnf` (strings; at most one) as the output constraint.
fn constraint(o: &Map<String, Value>) -> Result<Option<sampling_params::Constraint>, ApiError> {
    use sampling_params::Constraint;
    let mut found = None;
    for k in ["regex", "json_schema", "ebnf"] {
        let text = match o.field(k) {
            None | Some(Value::Null) => continue,
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(ApiError::invalid_field(k, "must be a string")),
        };
        if found.is_some() {
            return Err(ApiError::invalid_field(
                k,
                "cannot be combined with another of regex, json_schema and ebnf",
            ));
        }
        found = Some(match k {
            "regex" => Constraint::Regex(text),
            "json_schema" => Constraint::JsonSchema(text),
            _ => Constraint::EbnfGrammar(text),
        });
    }
    Ok(found)
}

/// `logit_bias`: token ids (as JSON object keys) to biases in [-100, 100].
fn logit_bias(o: &Map<String, Value>) -> Result<std::collections::HashMap<String, f32>, ApiError> {
    let bad = |what: String| ApiError::invalid_field("logit_bias", what);
    match o.field("logit_bias") {
        None | Some(Value::Null) => Ok(Default::default()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| {
                k.parse::<u32>()
                    .map_err(|_| bad(format!("key '{k}' is not a token id")))?;
                let b = v
                    .as_f64()
                    .filter(|b| (-100.0..=100.0).contains(b))
                    .ok_or_else(|| bad(format!("'{k}' must map to a number in [-100, 100]")))?;
                Ok((k.clone(), b as f32))
            })
            .collect(),
        Some(_) => Err(bad("must be an object of token ids to biases".into())),
    }
}

/// `seed`: a non-negative integer.
pub(crate) fn seed(o: &Map<String, Value>) -> Result<Option<u64>, ApiError> {
    match o.field("seed") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| ApiError::invalid_field("seed", "must be a non-negative integer")),
    }
}

/// One prompt before tokenization.
#[derive(Debug)]
pub(crate) enum Source {
    /// Messages rendered with the chat template (with the generation prompt).
    Chat(crate::chat_template::ChatPrompt),
    /// Text encoded as is.
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
    /// Chat messages with image parts: the prompt is built with the images
    /// ([`crate::images::ImageSupport::prompt`]).
    Images(crate::images::ImageChat),
}

/// What an endpoint's body asks for, before tokenization.
#[derive(Debug)]
pub(crate) struct Input {
    pub(crate) prompts: Vec<Source>,
    pub(crate) params: SamplingParams,
    pub(crate) unset: Vec<&'static str>,
    pub(crate) logprobs: LogprobAsk,
    pub(crate) include_usage: bool,
    pub(crate) instructions: Option<String>,
    pub(crate) echo: bool,
    /// Chat: what the answer's parsing is asked.
    pub(crate) chat: Option<crate::grpc::chat_parse::ChatAsk>,
}

/// `stream_options.include_usage` (an object whose flags are booleans).
pub(crate) fn include_usage(o: &Map<String, Value>) -> Result<bool, ApiError> {
    match o.field("stream_options") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Object(so)) => {
            for (k, v) in so {
                if !v.is_boolean() && !v.is_null() {
                    return Err(ApiError::invalid_field(
                        &format!("stream_options.{k}"),
                        "must be a boolean",
                    ));
                }
            }
            Ok(so.field("include_usage") == Some(&Value::Bool(true)))
        }
        Some(_) => Err(ApiError::invalid_field(
            "stream_options",
            "must be an object",
        )),
    }
}

fn tokenize(t: &Tokenizer, s: Source) -> Result<(String, Vec<u32>), ApiError> {
    let bad = |e: &dyn std::fmt::Display| ApiError::bad_request("invalid_request", e.to_string());
    match s {
        Source::Chat(input) => {
            let text = t
                .apply_chat_template(input.for_template(t))
                .map_err(|e| bad(&e))?;
            let ids = t.encode(&text).map_err(|e| bad(&e))?;
            Ok((text, ids))
        }
        Source::Text(text) => {
            let ids = t.encode(&text).map_err(|e| bad(&e))?;
            Ok((text, ids))
        }
        Source::Ids(ids) => {
            t.check_ids(&ids)
                .map_err(|e| ApiError::invalid_field("input_ids", e))?;
            Ok((String::new(), ids))
        }
        // `plan` builds these with their images before tokenizing the rest.
        Source::Images(_) => Err(ApiError::internal("an image prompt reached the tokenizer")),
    }
}

/// Translates a request for gRPC workers that are sent no images (image parts are refused).
pub async fn plan(req: &ParsedRequest, tokenizer: &Arc<Tokenizer>) -> Result<Plan, ApiError> {
    let images = crate::images::ImageSupport::NoEncoders;
    plan_with(req, tokenizer, &images, ChatParsers::default()).await
}

/// Translates a request for gRPC workers; a chat request's image parts are served or refused
/// as `images` says.
pub async fn plan_with(
    req: &ParsedRequest,
    tokenizer: &Arc<Tokenizer>,
    images: &crate::images::ImageSupport,
    parsers: ChatParsers,
) -> Result<Plan, ApiError> {
    let body = request_tree(req)?;
    let o = &*body;
    fields::check(req.endpoint, o)?;
    let seed = match req.endpoint {
        Endpoint::Generate => None,
        _ => seed(o)?,
    };
    let input = match req.endpoint {
        Endpoint::ChatCompletions => chat::input(&body)?,
        Endpoint::Completions => completions::input(o)?,
        Endpoint::Generate => generate::input(o)?,
        Endpoint::Responses => responses::input(o)?,
    };
    let Input {
        prompts,
        mut params,
        unset,
        logprobs,
        include_usage,
        instructions,
        echo,
        chat,
    } = input;
    let n = req.n.max(1);
    // Request parsing bounded prompts and prompts × n (`crate::request::MAX_CHOICES`).
    debug_assert!(prompts.len().saturating_mul(n) <= MAX_CHOICES);
    params.n = u32::try_from(n).unwrap_or(u32::MAX);
    let listed = req.endpoint == Endpoint::Generate && (req.batch.is_some() || n > 1);
    let (tokenized, images) = tokenize_prompts(req, tokenizer, images, prompts).await?;
    if tokenized.iter().any(|(_, ids)| ids.is_empty()) {
        return Err(ApiError::bad_request(
            "invalid_request",
            "the prompt is empty after tokenization",
        ));
    }
    let stop = StopConditions::new(
        tokenizer,
        &params.stop,
        &params.stop_token_ids,
        params.ignore_eos,
        params.no_stop_trim,
    )
    .map_err(|e| ApiError::invalid_field("stop", e))?;
    let model = req.model.as_deref().unwrap_or_default();
    let chat = chat.and_then(|ask| {
        // The model's name picks the parsers; without one, the tokenizer's directory name.
        let named = match model {
            "" => tokenizer.source().to_string_lossy().into_owned(),
            m => m.to_owned(),
        };
        let prompt = tokenized.first().map_or("", |(text, _)| text.as_str());
        crate::grpc::chat_parse::ChatParsing::new(ask, parsers, &named, prompt, tokenizer)
            .map(Arc::new)
    });
    let decode = DecodeOptions {
        skip_special_tokens: params.skip_special_tokens
            && !chat.as_ref().is_some_and(|c| c.keeps_special_tokens()),
        spaces_between_special_tokens: false,
    };
    let prompt_tokens = tokenized
        .iter()
        .map(|(_, ids)| u32::try_from(ids.len()).unwrap_or(u32::MAX))
        .collect();
    let requests = generate_requests(tokenized, &params, &logprobs);
    Ok(Plan {
        requests,
        endpoint: req.endpoint,
        stream: req.stream,
        model: model.to_owned(),
        stop,
        decode,
        include_usage,
        prompt_tokens,
        n,
        listed,
        logprobs,
        unset: unset.into(),
        instructions,
        echo,
        images,
        chat,
        seed,
    })
}

/// The request's JSON object: the tree the handler kept for gRPC workers, or the body read
/// again when it was parsed without it.
fn request_tree(req: &ParsedRequest) -> Result<Arc<serde_json::Map<String, Value>>, ApiError> {
    if let Some(o) = req.shared_tree() {
        return Ok(o);
    }
    let body: Value = serde_json::from_slice(&req.raw).map_err(ApiError::malformed_json)?;
    let Value::Object(o) = body else {
        return Err(ApiError::malformed_json("expected an object"));
    };
    Ok(Arc::new(o))
}

/// Each prompt's text and ids: a chat with images through the image path, the rest on the
/// CPU pool (large prompts off the async workers).
async fn tokenize_prompts(
    req: &ParsedRequest,
    tokenizer: &Arc<Tokenizer>,
    images: &crate::images::ImageSupport,
    mut prompts: Vec<Source>,
) -> Result<
    (
        Vec<(String, Vec<u32>)>,
        Option<Arc<crate::images::PromptImages>>,
    ),
    ApiError,
> {
    let with_images = match prompts.as_mut_slice() {
        [Source::Images(chat)] => Some(std::mem::take(chat)),
        _ => None,
    };
    if let Some(chat) = with_images {
        let (text, ids, imgs) = images.prompt(tokenizer, chat, req.raw.len()).await?;
        return Ok((vec![(text, ids)], Some(Arc::new(imgs))));
    }
    let (tok, inline) = (tokenizer.clone(), tokenizer.offload_threshold());
    let tokenized = crate::cpu_pool::offload(inline, req.raw.len(), move || {
        prompts
            .into_iter()
            .map(|s| tokenize(&tok, s))
            .collect::<Result<Vec<_>, ApiError>>()
    })
    .await??;
    Ok((tokenized, None))
}

/// One streaming `GenerateRequest` per tokenized prompt, each with the request's sampling
/// parameters and logprob asks.
fn generate_requests(
    tokenized: Vec<(String, Vec<u32>)>,
    params: &SamplingParams,
    logprobs: &LogprobAsk,
) -> Vec<GenerateRequest> {
    tokenized
        .into_iter()
        .map(|(original_text, input_ids)| GenerateRequest {
            tokenized: Some(TokenizedInput {
                original_text,
                input_ids,
            }),
            sampling_params: Some(params.clone()),
            return_logprob: logprobs.output || logprobs.input_from.is_some(),
            logprob_start_len: logprobs
                .input_from
                .map_or(-1, |s| i32::try_from(s).unwrap_or(i32::MAX)),
            top_logprobs_num: i32::try_from(logprobs.top).unwrap_or(0),
            stream: true,
            ..Default::default()
        })
        .collect()
}

/// An answer's `usage` object, typed: it is on every answer, and a tree costs an allocation
/// per key.
#[derive(Debug, serde::Serialize)]
pub(crate) struct UsageJson {
    prompt_tokens: u32,
    completion_tokens: u32,
    total_tokens: u32,
    prompt_tokens_details: CachedTokens,
    /// With reasoning parsed: how many completion tokens it took.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) completion_tokens_details: Option<ReasoningTokens>,
}

#[derive(Debug, serde::Serialize)]
struct CachedTokens {
    cached_tokens: u32,
}

#[derive(Debug, serde::Serialize)]
pub(crate) struct ReasoningTokens {
    pub(crate) reasoning_tokens: usize,
}

pub(crate) fn usage_json(u: Usage) -> UsageJson {
    UsageJson {
        prompt_tokens: u.prompt,
        completion_tokens: u.completion,
        total_tokens: u.prompt.saturating_add(u.completion),
        prompt_tokens_details: CachedTokens {
            cached_tokens: u.cached,
        },
        completion_tokens_details: None,
    }
}

pub(crate) fn matched(f: Option<&FinishReason>) -> Value {
    match f.map(|f| (f.matched_token(), f.matched_text())) {
        Some((Some(id), _)) => json!(id),
        Some((_, Some(s))) => json!(s),
        _ => Value::Null,
    }
}

/// Final OpenAI choices: what `each` makes of a choice, with its `index`, `finish_reason`
/// and `matched_stop`.
pub(crate) fn final_choices(
    a: &Answer<'_>,
    each: impl Fn(usize, &super::output::Choice) -> Value,
) -> Value {
    a.out
        .choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = each(i, c);
            v["index"] = json!(i);
            v["finish_reason"] = finish_str(c.finish.as_ref());
            v["matched_stop"] = matched(c.finish.as_ref());
            v
        })
        .collect::<Vec<_>>()
        .into()
}

pub(crate) fn finish_str(f: Option<&FinishReason>) -> Value {
    f.map_or(Value::Null, |f| json!(f.as_str()))
}

/// Unix seconds now.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Everything an answer body is made from.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    /// The translated request.
    pub plan: &'a Plan,
    /// The model named in the answer.
    pub model: &'a str,
    /// The request id.
    pub id: &'a str,
    /// The output so far.
    pub out: &'a Output,
    /// Unix seconds of the answer's creation.
    pub created: u64,
}

/// The whole non-streaming body, serialized.
pub fn full_body(a: &Answer<'_>) -> Vec<u8> {
    let tree = match a.plan.endpoint {
        Endpoint::ChatCompletions => return chat::body(a),
        Endpoint::Completions => completions::body(a),
        Endpoint::Responses => responses::body(a),
        Endpoint::Generate => return generate::body(a),
    };
    serde_json::to_vec(&tree).unwrap_or_default()
}

/// One SSE `data:` event carrying `v` as JSON.
pub(crate) fn data(v: &impl serde::Serialize) -> Bytes {
    let mut event = b"data: ".to_vec();
    // Trees and plain structs: serializing them into memory cannot fail.
    let _ = serde_json::to_writer(&mut event, v);
    event.extend_from_slice(b"\n\n");
    Bytes::from(event)
}

pub(crate) const DONE: Bytes = Bytes::from_static(b"data: [DONE]\n\n");

/// The SSE events of one streaming answer, in order.
#[derive(Debug)]
pub struct Events {
    /// Unix seconds of the answer's creation, the same in every event.
    pub created: u64,
    /// Next `/v1/responses` sequence number.
    seq: u64,
    /// Chat: each choice's parsing state, once it streamed.
    chat: Vec<Option<crate::grpc::chat_parse::ChoiceParser>>,
    /// `/v1/responses`: the items streamed.
    responses: responses::Stream,
}

impl Default for Events {
    fn default() -> Self {
        Self::new()
    }
}

impl Events {
    /// Events of an answer created now.
    pub fn new() -> Self {
        Self {
            created: now(),
            seq: 0,
            chat: Vec::new(),
            responses: responses::Stream::default(),
        }
    }

    /// The events before the first token.
    pub fn start(&mut self, a: &Answer<'_>) -> Vec<Bytes> {
        match a.plan.endpoint {
            Endpoint::ChatCompletions => chat::start(a),
            Endpoint::Responses => responses::start(a, &mut self.responses, &mut self.seq),
            Endpoint::Completions => completions::start(a),
            Endpoint::Generate => Vec::new(),
        }
    }

    /// The events of what one message added.
    pub fn delta(&mut self, a: &Answer<'_>, d: &Delta) -> Vec<Bytes> {
        match a.plan.endpoint {
            Endpoint::ChatCompletions => chat::delta(a, d, &mut self.chat),
            Endpoint::Completions => completions::delta(a, d),
            Endpoint::Responses => responses::delta(a, d, &mut self.responses, &mut self.seq),
            Endpoint::Generate => generate::delta(a, d),
        }
    }

    /// The events after the last choice ended.
    pub fn end(&mut self, a: &Answer<'_>) -> Vec<Bytes> {
        match a.plan.endpoint {
            Endpoint::ChatCompletions => chat::end(a, &self.chat),
            Endpoint::Completions => completions::end(a),
            Endpoint::Responses => responses::end(a, &mut self.responses, &mut self.seq),
            Endpoint::Generate => vec![DONE],
        }
    }

    /// A failure after the stream started.
    pub fn error(&mut self, a: &Answer<'_>, e: &ApiError) -> Bytes {
        match a.plan.endpoint {
            Endpoint::Responses => responses::error(e, &mut self.seq),
            _ => e.sse_event(),
        }
    }
}
