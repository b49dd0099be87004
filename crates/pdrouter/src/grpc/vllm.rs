//! vLLM's engine protocol (`vllm.grpc.engine.VllmEngine`) seen from the router's working form:
//! a [`Call`] as vLLM's `GenerateRequest`, vLLM's answers and self-descriptions in SGLang's
//! form, and what a worker's `GetServerInfo` says about its KV connector ([`VllmKv`]).
//!
//! Invariants:
//! - A call's sampling scalars are sent as SGLang's form holds them (the client's values, the
//!   worker's reported defaults for the rest), except `temperature` and `max_tokens`, which
//!   vLLM's message can leave absent: those are absent when the client left them unset, so
//!   the engine applies its own defaults, as its HTTP server does.
//! - What vLLM's message cannot carry is refused before anything is sent
//!   ([`unsupported`]), never dropped.
//! - Prompt logprobs are asked from the prompt's start (vLLM has no start position) and cut
//!   to the client's start when they come back, so the answer has the shape SGLang's has.
//! - The KV connector's parameters travel as JSON text, verbatim both ways; the router only
//!   checks that a returned one is a JSON object (or `null`).

use pdrouter_proto::prost_types::{self, value::Kind};
use pdrouter_proto::scheduler::{
    GenerateComplete, GenerateRequest, GenerateResponse, GenerateStreamChunk, GetModelInfoResponse,
    GetServerInfoResponse, InputLogProbs, InputTokenLogProb, OutputLogProbs, TopLogProbs,
    generate_complete, generate_response, sampling_params,
};
use pdrouter_proto::vllm_engine as vl;

use super::runtime::Call;
use crate::config::KvConnector;

impl Call {
    /// vLLM's message: the prompt's ids, the sampling parameters in vLLM's fields, the leg's
    /// KV connector parameters and the DP rank.
    pub fn into_vllm(self) -> vl::GenerateRequest {
        let Call {
            req,
            unset,
            dp_rank,
            kv_params,
            seed,
            ..
        } = self;
        let set = |k: &str| !unset.contains(&k);
        let prompt_logprobs = req.logprob_start_len >= 0;
        let top = req.top_logprobs_num.max(0);
        let sampling_params = req.sampling_params.map(|p| vl::SamplingParams {
            temperature: set("temperature").then_some(p.temperature),
            top_p: p.top_p,
            // SGLang's -1 (any token) is vLLM's 0.
            top_k: u32::try_from(p.top_k).unwrap_or(0),
            min_p: p.min_p,
            frequency_penalty: p.frequency_penalty,
            presence_penalty: p.presence_penalty,
            repetition_penalty: p.repetition_penalty,
            max_tokens: p.max_new_tokens.filter(|_| set("max_new_tokens")),
            min_tokens: p.min_new_tokens,
            stop: p.stop,
            stop_token_ids: p.stop_token_ids,
            skip_special_tokens: p.skip_special_tokens,
            spaces_between_special_tokens: p.spaces_between_special_tokens,
            ignore_eos: p.ignore_eos,
            n: p.n,
            constraint: p.constraint.map(|c| {
                use vl::sampling_params::Constraint as V;
                match c {
                    sampling_params::Constraint::Regex(s) => V::Regex(s),
                    sampling_params::Constraint::JsonSchema(s) => V::JsonSchema(s),
                    sampling_params::Constraint::EbnfGrammar(s) => V::Grammar(s),
                    sampling_params::Constraint::StructuralTag(s) => V::StructuralTag(s),
                }
            }),
            logprobs: req.return_logprob.then_some(top),
            prompt_logprobs: prompt_logprobs.then_some(top),
            // vLLM's seed is an int32; larger ones were refused ([`unsupported`]).
            seed: seed.and_then(|s| i32::try_from(s).ok()),
            include_stop_str_in_output: p.no_stop_trim,
            // Keys were checked to be token ids ([`unsupported`]).
            logit_bias: p
                .logit_bias
                .into_iter()
                .filter_map(|(k, v)| Some((k.parse().ok()?, v)))
                .collect(),
            truncate_prompt_tokens: None,
        });
        vl::GenerateRequest {
            request_id: req.request_id,
            input: req.tokenized.map(|t| {
                vl::generate_request::Input::Tokenized(vl::TokenizedInput {
                    original_text: t.original_text,
                    input_ids: t.input_ids,
                })
            }),
            sampling_params,
            stream: req.stream,
            kv_transfer_params_json: kv_params,
            data_parallel_rank: dp_rank.map(|r| i32::try_from(r).unwrap_or(i32::MAX)),
        }
    }
}

/// Whether vLLM's `int32` seed can carry `seed`.
pub fn seed_fits(seed: Option<u64>) -> bool {
    seed.is_none_or(|s| i32::try_from(s).is_ok())
}

/// The first field of `req` vLLM's message cannot carry, if any (the caller refuses the
/// request naming it).
pub fn unsupported(req: &GenerateRequest) -> Option<&'static str> {
    let p = req.sampling_params.as_ref();
    if !req.token_ids_logprob.is_empty() {
        return Some("token_ids_logprob");
    }
    if req.return_hidden_states {
        return Some("return_hidden_states");
    }
    if !req.lora_id.is_empty() {
        return Some("lora_path");
    }
    if !req.custom_logit_processor.is_empty() {
        return Some("custom_logit_processor");
    }
    if p.is_some_and(|p| p.custom_params.is_some()) {
        return Some("custom_params");
    }
    if p.is_some_and(|p| p.stream_interval.is_some()) {
        return Some("stream_interval");
    }
    if p.is_some_and(|p| p.logit_bias.keys().any(|k| k.parse::<i32>().is_err())) {
        return Some("logit_bias with keys that are not token ids");
    }
    None
}

fn output_logprobs(l: vl::OutputLogProbs) -> OutputLogProbs {
    OutputLogProbs {
        token_logprobs: l.token_logprobs,
        token_ids: l.token_ids,
        top_logprobs: l.top_logprobs.into_iter().map(top_logprobs).collect(),
    }
}

fn top_logprobs(t: vl::TopLogProbs) -> TopLogProbs {
    TopLogProbs {
        values: t.values,
        token_ids: t.token_ids,
    }
}

/// Prompt logprobs from position `from` on (vLLM sends them from the prompt's start).
fn input_logprobs(l: vl::InputLogProbs, from: usize) -> InputLogProbs {
    let skip = |n: usize| from.min(n);
    InputLogProbs {
        token_logprobs: {
            let n = skip(l.token_logprobs.len());
            l.token_logprobs
                .into_iter()
                .skip(n)
                .map(|v| InputTokenLogProb { value: v.value })
                .collect()
        },
        token_ids: l.token_ids.into_iter().skip(from).collect(),
        top_logprobs: l
            .top_logprobs
            .into_iter()
            .skip(from)
            .map(top_logprobs)
            .collect(),
    }
}

/// A vLLM answer of request `request_id` in SGLang's form, with the connector parameters a
/// `Complete` carried; prompt logprobs cut to start at `prompt_from`.
pub fn response_from_vllm(
    m: vl::GenerateResponse,
    request_id: &str,
    prompt_from: usize,
) -> (GenerateResponse, Option<String>) {
    use vl::generate_response::Response as V;
    let mut kv = None;
    let response = m.response.map(|r| match r {
        V::Chunk(c) => generate_response::Response::Chunk(GenerateStreamChunk {
            token_ids: c.token_ids,
            prompt_tokens: c.prompt_tokens,
            completion_tokens: c.completion_tokens,
            cached_tokens: c.cached_tokens,
            output_logprobs: c.output_logprobs.map(output_logprobs),
            input_logprobs: c.input_logprobs.map(|l| input_logprobs(l, prompt_from)),
            index: c.index,
            ..Default::default()
        }),
        V::Complete(c) => {
            kv = c.kv_transfer_params_json;
            generate_response::Response::Complete(GenerateComplete {
                output_ids: c.output_ids,
                finish_reason: c.finish_reason,
                prompt_tokens: c.prompt_tokens,
                completion_tokens: c.completion_tokens,
                cached_tokens: c.cached_tokens,
                output_logprobs: c.output_logprobs.map(output_logprobs),
                input_logprobs: c.input_logprobs.map(|l| input_logprobs(l, prompt_from)),
                index: c.index,
                matched_stop: c.matched_stop.map(|s| match s {
                    vl::generate_complete::MatchedStop::MatchedTokenId(id) => {
                        generate_complete::MatchedStop::MatchedTokenId(id)
                    }
                    vl::generate_complete::MatchedStop::MatchedStopStr(s) => {
                        generate_complete::MatchedStop::MatchedStopStr(s)
                    }
                }),
                ..Default::default()
            })
        }
    });
    let m = GenerateResponse {
        request_id: request_id.to_owned(),
        response,
    };
    (m, kv)
}

/// vLLM's `GetModelInfo` in SGLang's form.
pub fn model_info_from_vllm(m: vl::GetModelInfoResponse) -> GetModelInfoResponse {
    GetModelInfoResponse {
        model_path: m.model_path,
        tokenizer_path: m.tokenizer_path,
        is_generation: m.is_generation,
        served_model_name: m.served_model_name,
        max_context_length: i32::try_from(m.max_context_length).unwrap_or(i32::MAX),
        vocab_size: i32::try_from(m.vocab_size).unwrap_or(i32::MAX),
        supports_vision: m.supports_vision,
        model_type: m.model_type,
        eos_token_ids: m.eos_token_ids,
        pad_token_id: m.pad_token_id,
        bos_token_id: m.bos_token_id,
        max_req_input_len: m.max_req_input_len,
        architectures: m.architectures,
        default_sampling_params_json: m.default_sampling_params_json,
        ..Default::default()
    }
}

/// vLLM's `GetServerInfo` in SGLang's form: its KV configuration and DP size as launch
/// arguments (`kv_connector`, `kv_role`, `kv_engine_id`, `dp_size`), where SGLang's server
/// reports its own.
pub fn server_info_from_vllm(m: vl::GetServerInfoResponse) -> GetServerInfoResponse {
    let text = |s: String| prost_types::Value {
        kind: Some(Kind::StringValue(s)),
    };
    let dp_size = prost_types::Value {
        kind: Some(Kind::NumberValue(f64::from(m.data_parallel_size.max(1)))),
    };
    let fields = [
        ("kv_connector", text(m.kv_connector)),
        ("kv_role", text(m.kv_role)),
        ("kv_engine_id", text(m.kv_engine_id)),
        ("dp_size", dp_size),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    GetServerInfoResponse {
        server_args: Some(prost_types::Struct { fields }),
        active_requests: i32::try_from(m.active_requests).unwrap_or(i32::MAX),
        is_paused: m.is_paused,
        last_receive_timestamp: m.last_receive_timestamp,
        uptime_seconds: m.uptime_seconds,
        server_type: m.server_type,
        ..Default::default()
    }
}

/// What a vLLM worker's `GetServerInfo` says of its KV transfer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VllmKv {
    /// The connector, when the worker names one the router knows.
    pub connector: Option<KvConnector>,
    /// The connector's class name as reported (empty: none configured).
    pub connector_name: String,
    /// `kv_producer`, `kv_consumer`, `kv_both` or empty.
    pub role: String,
}

impl VllmKv {
    /// Reads the KV configuration of a server info in SGLang's form
    /// ([`server_info_from_vllm`]).
    pub fn of(info: &GetServerInfoResponse) -> Self {
        let arg = |k: &str| match info.server_args.as_ref().and_then(|a| a.fields.get(k)) {
            Some(prost_types::Value {
                kind: Some(Kind::StringValue(s)),
            }) => s.clone(),
            _ => String::new(),
        };
        let connector_name = arg("kv_connector");
        VllmKv {
            connector: connector_of(&connector_name),
            connector_name,
            role: arg("kv_role"),
        }
    }
}

/// The connector a vLLM `kv_connector` class name stands for (`NixlConnector`,
/// `MooncakeConnector`, `LMCacheConnectorV1`, ...); `None` for none or one the router does
/// not drive.
pub fn connector_of(class: &str) -> Option<KvConnector> {
    let c = class.to_ascii_lowercase();
    if c.contains("nixl") {
        Some(KvConnector::Nixl)
    } else if c.contains("mooncake") {
        Some(KvConnector::Mooncake)
    } else if c.contains("lmcache") {
        Some(KvConnector::Lmcache)
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
