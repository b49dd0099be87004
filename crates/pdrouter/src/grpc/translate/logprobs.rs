//! Logprobs in the shapes clients expect: OpenAI chat (`content` entries), OpenAI
//! completions (parallel lists), and SGLang's `[logprob, token_id, text]` tuples.

use pdrouter_tokenizer::{DecodeOptions, Tokenizer};
use serde_json::{Map, Value, json};

use crate::grpc::output::{InputLogprob, TokenLogprob};

/// A token's text on its own (special tokens included).
pub fn token_text(t: &Tokenizer, id: u32) -> String {
    let opts = DecodeOptions {
        skip_special_tokens: false,
        spaces_between_special_tokens: false,
    };
    t.decode(&[id], opts).unwrap_or_default()
}

fn entry(t: &Tokenizer, id: u32, logprob: f32) -> Value {
    let token = token_text(t, id);
    json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()})
}

/// OpenAI chat: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
pub fn chat(t: &Tokenizer, lps: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|lp| {
            let mut e = entry(t, lp.id, lp.logprob);
            e["top_logprobs"] = lp
                .top
                .iter()
                .map(|&(id, v)| entry(t, id, v))
                .collect::<Vec<_>>()
                .into();
            e
        })
        .collect();
    json!({ "content": content })
}

/// OpenAI completions: parallel `tokens`, `token_logprobs`, `top_logprobs` (token → logprob)
/// and `text_offset` (from `offset`, the length of the text before these tokens).
pub fn completions(t: &Tokenizer, lps: &[TokenLogprob], mut offset: usize) -> Value {
    let mut tokens = Vec::with_capacity(lps.len());
    let mut offsets = Vec::with_capacity(lps.len());
    for lp in lps {
        let s = token_text(t, lp.id);
        offsets.push(offset);
        offset += s.len();
        tokens.push(s);
    }
    let top: Vec<Value> = lps
        .iter()
        .map(|lp| {
            let m: Map<String, Value> = lp
                .top
                .iter()
                .map(|&(id, v)| (token_text(t, id), json!(v)))
                .collect();
            Value::Object(m)
        })
        .collect();
    json!({
        "tokens": tokens,
        "token_logprobs": lps.iter().map(|lp| lp.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": offsets,
    })
}

fn tuple(t: &Tokenizer, logprob: Option<f32>, id: u32, text: bool) -> Value {
    json!([logprob, id, text.then(|| token_text(t, id))])
}

fn tops(t: &Tokenizer, top: &[(u32, f32)], text: bool) -> Value {
    if top.is_empty() {
        return Value::Null;
    }
    top.iter()
        .map(|&(id, v)| tuple(t, Some(v), id, text))
        .collect::<Vec<_>>()
        .into()
}

/// A token's logprob as SGLang lists it: generated tokens always have one, the first prompt
/// token none.
pub trait Scored {
    /// The token.
    fn id(&self) -> u32;
    /// Its logprob, when there is one.
    fn logprob(&self) -> Option<f32>;
    /// The most likely tokens at its position, best first.
    fn top(&self) -> &[(u32, f32)];
}

impl Scored for TokenLogprob {
    fn id(&self) -> u32 {
        self.id
    }
    fn logprob(&self) -> Option<f32> {
        Some(self.logprob)
    }
    fn top(&self) -> &[(u32, f32)] {
        &self.top
    }
}

impl Scored for InputLogprob {
    fn id(&self) -> u32 {
        self.id
    }
    fn logprob(&self) -> Option<f32> {
        self.logprob
    }
    fn top(&self) -> &[(u32, f32)] {
        &self.top
    }
}

/// SGLang `meta_info` logprob lists of some tokens (generated: `output_token_logprobs` and
/// `output_top_logprobs`; the prompt's: `input_…`): the `[logprob, token_id, text]` tuples
/// and, per position, the alternatives' tuples.
pub fn sglang(t: &Tokenizer, lps: &[impl Scored], text: bool) -> (Value, Value) {
    let tokens = lps
        .iter()
        .map(|lp| tuple(t, lp.logprob(), lp.id(), text))
        .collect::<Vec<_>>();
    let tops = lps
        .iter()
        .map(|lp| tops(t, lp.top(), text))
        .collect::<Vec<_>>();
    (tokens.into(), tops.into())
}
