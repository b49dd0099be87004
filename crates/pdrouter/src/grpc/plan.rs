//! A request translated once ([`Plan`]): the `GenerateRequest` of each prompt and what the
//! answer is made of (endpoint, stop conditions, samples, logprobs asked for, images), kept
//! for every attempt; [`Plan::calls`] gives one attempt's calls for a worker's runtime.
//!
//! `translate` builds a plan from a request body and turns the output back into a body;
//! `output` reads a plan's shape for its choices. The plan is theirs in common, so it sits
//! below both.

use std::sync::Arc;

use pdrouter_proto::scheduler::{GenerateRequest, SamplingParams};
use pdrouter_tokenizer::{DecodeOptions, StopConditions, Tokenizer};
use serde_json::{Map, Value};

use super::runtime::{Call, Runtime};
use crate::request::Endpoint;

/// Which logprobs the client asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogprobAsk {
    /// Logprobs of the generated tokens.
    pub output: bool,
    /// Alternatives per position.
    pub top: u32,
    /// Logprobs of the prompt from this position (`/generate`'s `logprob_start_len`).
    pub input_from: Option<u32>,
    /// Show each token's text in SGLang's logprob tuples (`return_text_in_logprobs`).
    pub text: bool,
}

/// A request translated once, sent (with fresh tickets) by every attempt.
#[derive(Debug)]
pub struct Plan {
    /// One request per prompt, without `request_id` and `disaggregated_params`.
    pub requests: Vec<GenerateRequest>,
    /// The endpoint answered.
    pub endpoint: Endpoint,
    /// SSE answer.
    pub stream: bool,
    /// The model the client named (empty: the Decode worker's, per attempt).
    pub model: String,
    /// Stop conditions matched in the router.
    pub stop: StopConditions,
    /// Detokenizer options.
    pub decode: DecodeOptions,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// Prompt length in tokens, per prompt.
    pub prompt_tokens: Vec<u32>,
    /// Samples per prompt.
    pub n: usize,
    /// The answer is a list (`/generate` with several prompts or samples).
    pub listed: bool,
    /// Logprobs asked for.
    pub logprobs: LogprobAsk,
    /// Sampling fields the client left unset (engine names).
    pub unset: Arc<[&'static str]>,
    /// `/v1/responses`: the instructions, echoed in the answer.
    pub instructions: Option<String>,
    /// `/v1/completions` `echo`: each choice's text starts with its prompt.
    pub echo: bool,
    /// The images of a chat request with image parts (EPD): sent to Encode workers, and
    /// described (without pixels) in both legs' requests.
    pub images: Option<Arc<crate::images::PromptImages>>,
    /// Chat: how the answer's tool calls and reasoning are parsed (none: the text as is).
    pub chat: Option<Arc<super::chat_parse::ChatParsing>>,
    /// `seed`: the sampling seed, for the engines whose message carries one.
    pub seed: Option<u64>,
}

impl Plan {
    /// The text of prompt `i` (its ids decoded when it was given as ids).
    pub fn prompt_text(&self, i: usize, t: &Tokenizer) -> String {
        let Some(input) = self.requests.get(i).and_then(|r| r.tokenized.as_ref()) else {
            return String::new();
        };
        if !input.original_text.is_empty() {
            return input.original_text.clone();
        }
        t.decode(&input.input_ids, self.decode).unwrap_or_default()
    }
}

impl Plan {
    /// The requests of one attempt: unset sampling fields filled from `defaults` (the
    /// worker's reported default sampling parameters), where they have the right type.
    pub fn requests_with(&self, defaults: &Map<String, Value>) -> Vec<GenerateRequest> {
        let mut reqs = self.requests.clone();
        if defaults.is_empty() || self.unset.is_empty() {
            return reqs;
        }
        for r in &mut reqs {
            if let Some(sp) = r.sampling_params.as_mut() {
                apply_defaults(sp, &self.unset, defaults);
            }
        }
        reqs
    }
}

impl Plan {
    /// The calls of one attempt on a worker of `runtime`, without ids, rank or ticket: for
    /// SGLang and vLLM the unset sampling fields filled from `defaults` (see
    /// [`Plan::requests_with`]); TokenSpeed leaves them out and applies its own.
    pub fn calls(&self, runtime: Runtime, defaults: &Map<String, Value>) -> Vec<Call> {
        let reqs = match runtime {
            // vLLM's message leaves only `temperature` and `max_tokens` absent; its other
            // scalars take the worker's defaults as SGLang's do.
            Runtime::Sglang | Runtime::Vllm => self.requests_with(defaults),
            Runtime::TokenSpeed => self.requests.clone(),
        };
        reqs.into_iter()
            .map(|req| Call {
                req,
                unset: Arc::clone(&self.unset),
                dp_rank: None,
                kv: None,
                images: crate::images::CallImages {
                    images: self.images.clone(),
                    encode: Vec::new(),
                },
                shared: None,
                kv_params: None,
                seed: self.seed,
            })
            .collect()
    }
}

fn apply_defaults(sp: &mut SamplingParams, unset: &[&str], d: &Map<String, Value>) {
    for &k in unset {
        let Some(v) = d.get(k) else { continue };
        let f = v.as_f64().filter(|f| f.is_finite()).map(|f| f as f32);
        match (k, f) {
            ("temperature", Some(f)) => sp.temperature = f,
            ("top_p", Some(f)) => sp.top_p = f,
            ("min_p", Some(f)) => sp.min_p = f,
            ("frequency_penalty", Some(f)) => sp.frequency_penalty = f,
            ("presence_penalty", Some(f)) => sp.presence_penalty = f,
            ("repetition_penalty", Some(f)) => sp.repetition_penalty = f,
            ("top_k", _) => {
                if let Some(k) = v.as_i64().and_then(|k| i32::try_from(k).ok()) {
                    sp.top_k = k;
                }
            }
            ("max_new_tokens", _) => {
                if let Some(m) = v.as_u64().and_then(|m| u32::try_from(m).ok()) {
                    sp.max_new_tokens = Some(m);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::translate::sampling;

    #[test]
    fn worker_defaults_fill_only_unset_fields_of_the_right_type() {
        let o: Map<String, Value> =
            serde_json::from_str(r#"{"temperature":0.3,"max_tokens":9}"#).unwrap();
        let (mut sp, unset) = sampling(&o, &["max_tokens"]).unwrap();
        assert!(!unset.contains(&"temperature") && !unset.contains(&"max_new_tokens"));
        let d: Map<String, Value> = serde_json::from_str(
            r#"{"temperature":0.9,"top_p":0.5,"top_k":"x","min_p":0.1,"max_new_tokens":3}"#,
        )
        .unwrap();
        apply_defaults(&mut sp, &unset, &d);
        assert_eq!(sp.temperature, 0.3);
        assert_eq!(sp.top_p, 0.5);
        assert_eq!(sp.top_k, -1, "a default of the wrong type is ignored");
        assert_eq!(sp.min_p, 0.1);
        assert_eq!(sp.max_new_tokens, Some(9));
        assert_eq!(sp.repetition_penalty, 1.0);
    }
}
