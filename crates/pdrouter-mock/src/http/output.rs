//! What an HTTP mock worker generates for one request: the token pieces, where the stop
//! conditions end them, the finish reason and the deterministic logprobs.
//!
//! Conventions (tests rely on them):
//! - The `k`-th generated token is the text ` tok{k}` with id `OUTPUT_ID_BASE + k`; a request
//!   whose `response_format` is a JSON schema instead generates a JSON document that fits the
//!   schema, four bytes per token.
//! - Generation ends at the request's token cap (`length`), at a `stop` string (the text ends
//!   before it) or a `stop_token_ids` id (its text is left out), whichever comes first; a worker
//!   that reaches its own output length ends with the EOS id, as a real model does (`stop`).
//! - Prompt position `j` has logprob `-((j % 16) + 1) / 16` (none for position 0) and id
//!   `input_ids[j]`, or `j` for a text prompt. A Prefill worker reports every position but the
//!   last, a Decode worker only the last, a regular worker all of them: a PD pair's two lists
//!   put together are what one regular worker answers.

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::config::Role;

/// Id of the first generated token.
pub(crate) const OUTPUT_ID_BASE: u64 = 1000;

/// The id a natural end generates.
const EOS_ID: u64 = pdrouter_tokenizer::bytelevel::EOS_TOKEN_IDS[0] as u64;

/// Most stop strings and stop ids honoured per request.
const MAX_STOPS: usize = 64;

/// Deepest JSON schema nesting a document is generated for.
const MAX_SCHEMA_DEPTH: usize = 16;

/// How generation ended.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Finish {
    /// The request's token cap was reached.
    Length,
    /// A stop condition matched: the stop string or the token id.
    Stop(Value),
}

impl Finish {
    /// The OpenAI `finish_reason`.
    pub(crate) fn openai(&self) -> &'static str {
        match self {
            Finish::Length => "length",
            Finish::Stop(_) => "stop",
        }
    }

    /// SGLang's `meta_info.finish_reason` after `tokens` tokens.
    pub(crate) fn sglang(&self, tokens: u32) -> SglangFinish<'_> {
        match self {
            Finish::Length => SglangFinish::Length { length: tokens },
            Finish::Stop(matched) => SglangFinish::Stop { matched },
        }
    }
}

/// SGLang's `meta_info.finish_reason`: `{"type": "length", "length": N}` or
/// `{"type": "stop", "matched": M}`.
#[derive(Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub(crate) enum SglangFinish<'a> {
    /// The cap was reached after `length` tokens.
    Length { length: u32 },
    /// A stop string, a stop token id or EOS matched.
    Stop { matched: &'a Value },
}

/// The generated output, the same for every sample of a request.
#[derive(Debug)]
pub(crate) struct Output {
    /// Text of each generated token, as the client sees it (a stop match cut).
    pub(crate) pieces: Vec<String>,
    pub(crate) finish: Finish,
}

impl Output {
    /// Tokens generated.
    pub(crate) fn tokens(&self) -> u32 {
        u32::try_from(self.pieces.len()).unwrap_or(u32::MAX)
    }

    /// The text of the first `done` tokens.
    pub(crate) fn text(&self, done: usize) -> String {
        self.pieces[..done.min(self.pieces.len())].concat()
    }
}

/// Stop conditions of a request.
#[derive(Debug, Default)]
pub(crate) struct Stops {
    strings: Vec<String>,
    ids: Vec<u64>,
}

impl Stops {
    /// Reads `stop` (a string or a list of them) and `stop_token_ids` from `params`.
    pub(crate) fn from(params: Option<&Map<String, Value>>) -> Stops {
        let Some(p) = params else {
            return Stops::default();
        };
        let strings = match p.get("stop") {
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            _ => Vec::new(),
        };
        let ids = match p.get("stop_token_ids") {
            Some(Value::Array(items)) => items.iter().filter_map(Value::as_u64).collect(),
            _ => Vec::new(),
        };
        Stops {
            strings: strings
                .into_iter()
                .filter(|s| !s.is_empty())
                .take(MAX_STOPS)
                .collect(),
            ids: ids.into_iter().take(MAX_STOPS).collect(),
        }
    }
}

/// Generates up to `natural` tokens (the worker's own length), at most `cap` (the request's).
pub(crate) fn generate(
    natural: u32,
    cap: Option<u32>,
    stops: &Stops,
    schema: Option<&Value>,
) -> Output {
    // Only the tokens the cap lets through are formatted: a worker's own length may be far
    // beyond what the request asks for.
    let natural_cap = cap.map_or(natural, |c| c.min(natural));
    let candidates: Vec<String> = match schema {
        Some(schema) => json_pieces(schema),
        None => (0..natural_cap).map(|k| format!(" tok{k}")).collect(),
    };
    let limit = cap.map_or(candidates.len(), |c| (c as usize).min(candidates.len()));
    let mut pieces = Vec::with_capacity(limit);
    let mut text = String::new();
    for (k, piece) in candidates.into_iter().take(limit).enumerate() {
        let id = OUTPUT_ID_BASE + k as u64;
        if stops.ids.contains(&id) {
            pieces.push(String::new());
            return Output {
                pieces,
                finish: Finish::Stop(json!(id)),
            };
        }
        // A stop string may end inside this piece or span earlier ones.
        let from = text.len().saturating_sub(longest(&stops.strings));
        text.push_str(&piece);
        pieces.push(piece);
        if let Some((at, s)) = first_match(&text, from, &stops.strings) {
            cut_at(&mut pieces, at);
            return Output {
                pieces,
                finish: Finish::Stop(json!(s)),
            };
        }
    }
    let capped = cap.is_some_and(|c| c as usize <= pieces.len());
    Output {
        pieces,
        finish: if capped {
            Finish::Length
        } else {
            Finish::Stop(json!(EOS_ID))
        },
    }
}

fn longest(strings: &[String]) -> usize {
    strings.iter().map(String::len).max().unwrap_or(0)
}

/// The earliest stop string starting at or after byte `from` (rounded to a char boundary).
fn first_match<'a>(text: &str, from: usize, stops: &'a [String]) -> Option<(usize, &'a str)> {
    let from = (from..=text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    stops
        .iter()
        .filter_map(|s| {
            text[from..]
                .find(s.as_str())
                .map(|i| (from + i, s.as_str()))
        })
        .min_by_key(|&(i, _)| i)
}

/// Truncates the concatenation of `pieces` to `at` bytes, keeping one entry per token.
fn cut_at(pieces: &mut [String], at: usize) {
    let mut start = 0;
    for p in pieces.iter_mut() {
        let end = start + p.len();
        if end > at {
            p.truncate(at.saturating_sub(start));
        }
        start = end;
    }
}

/// A JSON document fitting `schema`, in four-byte pieces.
fn json_pieces(schema: &Value) -> Vec<String> {
    let doc = instance(schema, schema, 0).to_string();
    let mut pieces = Vec::new();
    let mut piece = String::new();
    for c in doc.chars() {
        piece.push(c);
        if piece.len() >= 4 {
            pieces.push(std::mem::take(&mut piece));
        }
    }
    if !piece.is_empty() {
        pieces.push(piece);
    }
    pieces
}

/// The simplest value `schema` accepts (`root` resolves local `$ref`s).
fn instance(schema: &Value, root: &Value, depth: usize) -> Value {
    if depth > MAX_SCHEMA_DEPTH {
        return Value::Null;
    }
    let Some(s) = schema.as_object() else {
        return Value::Null;
    };
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        let target = r
            .strip_prefix('#')
            .and_then(|p| root.pointer(p))
            .unwrap_or(&Value::Null);
        return instance(target, root, depth + 1);
    }
    if let Some(v) = s.get("const") {
        return v.clone();
    }
    if let Some(v) = s
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return v.clone();
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(first) = s.get(key).and_then(Value::as_array).and_then(|a| a.first()) {
            return instance(first, root, depth + 1);
        }
    }
    let ty = match s.get("type") {
        Some(Value::Array(types)) => types.first().and_then(Value::as_str),
        Some(t) => t.as_str(),
        None => s.contains_key("properties").then_some("object"),
    };
    match ty {
        Some("object") => {
            let mut out = Map::new();
            if let Some(props) = s.get("properties").and_then(Value::as_object) {
                for (name, sub) in props {
                    out.insert(name.clone(), instance(sub, root, depth + 1));
                }
            }
            Value::Object(out)
        }
        Some("array") => {
            let min = s
                .get("minItems")
                .and_then(Value::as_u64)
                .unwrap_or(0)
                .min(4);
            let item = s.get("items").unwrap_or(&Value::Null);
            Value::Array((0..min).map(|_| instance(item, root, depth + 1)).collect())
        }
        Some("string") => json!("tok"),
        Some("integer") => json!(0),
        Some("number") => json!(0.0),
        Some("boolean") => json!(false),
        _ => Value::Null,
    }
}

/// Whether a `/generate` request asks for logprobs (`return_logprob`, or per prompt).
pub(crate) fn wants_logprobs(req: &Map<String, Value>) -> bool {
    match req.get("return_logprob") {
        Some(Value::Bool(b)) => *b,
        Some(Value::Array(items)) => items.iter().any(|v| v.as_bool() == Some(true)),
        _ => false,
    }
}

/// The prompt positions a worker of `role` reports logprobs for, out of `prompt` tokens.
fn input_positions(role: Role, prompt: usize) -> std::ops::Range<usize> {
    let last = prompt.saturating_sub(1);
    match role {
        Role::Prefill => 0..last,
        Role::Decode => last..prompt,
        // An encode worker never generates (it serves gRPC `Encode` only).
        Role::Regular | Role::Encode => 0..prompt,
    }
}

/// `meta_info.input_token_logprobs`: `[logprob, id, null]` per reported prompt position.
pub(crate) fn input_token_logprobs(role: Role, prompt: usize, ids: Option<&[Value]>) -> Value {
    input_positions(role, prompt)
        .map(|j| {
            let lp = (j > 0).then(|| -((j % 16) as f64 + 1.0) / 16.0);
            let id = ids
                .and_then(|ids| ids.get(j))
                .cloned()
                .unwrap_or_else(|| json!(j));
            json!([lp, id, null])
        })
        .collect()
}

/// `meta_info.output_token_logprobs` of the first `done` generated tokens.
pub(crate) fn output_token_logprobs(done: u32) -> Value {
    (0..done)
        .map(|k| {
            let lp = -f64::from(k % 32 + 1) / 8.0;
            json!([lp, OUTPUT_ID_BASE + u64::from(k), null])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(v: Value) -> Stops {
        Stops::from(v.as_object())
    }

    #[test]
    fn natural_end_is_eos_and_cap_is_length() {
        let out = generate(3, None, &Stops::default(), None);
        assert_eq!(out.text(3), " tok0 tok1 tok2");
        assert_eq!(out.finish, Finish::Stop(json!(EOS_ID)));
        let out = generate(8, Some(3), &Stops::default(), None);
        assert_eq!((out.tokens(), out.finish), (3, Finish::Length));
        // A cap above the worker's own length ends naturally.
        let out = generate(3, Some(5), &Stops::default(), None);
        assert_eq!(out.finish.openai(), "stop");
    }

    #[test]
    fn stop_strings_cut_the_text_before_the_match() {
        let out = generate(8, None, &stops(json!({"stop": ["zzz", "tok2"]})), None);
        assert_eq!(out.tokens(), 3);
        assert_eq!(out.text(3), " tok0 tok1 ");
        assert_eq!(out.finish, Finish::Stop(json!("tok2")));
        // Spanning two tokens.
        let out = generate(8, None, &stops(json!({"stop": "0 tok1"})), None);
        assert_eq!((out.tokens(), out.text(2)), (2, " tok".to_owned()));
        assert_eq!(json!(out.finish.sglang(2))["matched"], "0 tok1");
    }

    #[test]
    fn stop_token_ids_end_without_their_text() {
        let out = generate(8, None, &stops(json!({"stop_token_ids": [1001]})), None);
        assert_eq!(out.tokens(), 2);
        assert_eq!(out.text(2), " tok0");
        assert_eq!(
            json!(out.finish.sglang(2)),
            json!({"type": "stop", "matched": 1001})
        );
        // The tag comes first, as SGLang writes it.
        let length = serde_json::to_string(&Finish::Length.sglang(3)).unwrap_or_default();
        assert_eq!(length, r#"{"type":"length","length":3}"#);
    }

    #[test]
    fn json_schema_answers_fit_the_schema() {
        let schema = json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "pet": {"$ref": "#/$defs/Pet"}
            },
            "$defs": {"Pet": {"type": "object", "properties": {"kind": {"enum": ["cat"]}}}}
        });
        let out = generate(8, None, &Stops::default(), Some(&schema));
        let doc: Value = serde_json::from_str(&out.text(usize::MAX)).unwrap();
        assert_eq!(
            doc,
            json!({"name": "tok", "age": 0, "tags": [], "pet": {"kind": "cat"}})
        );
    }

    #[test]
    fn pd_logprob_halves_make_the_regular_list() {
        let ids = [json!(7), json!(8), json!(9)];
        let mut pd = input_token_logprobs(Role::Prefill, 3, Some(&ids))
            .as_array()
            .unwrap()
            .clone();
        pd.extend(
            input_token_logprobs(Role::Decode, 3, Some(&ids))
                .as_array()
                .unwrap()
                .clone(),
        );
        let regular = input_token_logprobs(Role::Regular, 3, Some(&ids));
        assert_eq!(Value::Array(pd), regular);
        assert_eq!(regular[0], json!([null, 7, null]));
        assert_eq!(regular[2], json!([-0.1875, 9, null]));
        assert_eq!(output_token_logprobs(2)[1], json!([-0.25, 1001, null]));
    }
}
