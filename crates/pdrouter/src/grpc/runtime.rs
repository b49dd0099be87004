//! The one form the router works in for a `Generate`, and its conversion to and from each
//! engine protocol's messages.
//!
//! A gRPC worker runs SGLang's scheduler service, TokenSpeed's, or vLLM's engine service (a
//! [`Runtime`], with the [`KvTicket`], defined in `crate::engine` and re-exported here;
//! vLLM's conversions are [`super::vllm`]'s). The router translates requests once into
//! SGLang's `GenerateRequest` (its working form: it carries everything the engines need) plus
//! what SGLang's message cannot say — which sampling fields the client left unset, the
//! worker's DP rank, the KV ticket with its full room, vLLM's connector parameters — as a
//! [`Call`]. Each worker's channel turns a `Call` into its engine's message at send time and
//! the engine's messages back into SGLang's form, so translation, output, PD and regular
//! dispatch are the same code for every runtime.
//!
//! Invariants: a TokenSpeed request carries a sampling scalar only when the client set it
//! (the engine applies its own defaults to the rest); a room is below the runtime's
//! [`Runtime::max_room`] (2^31 for SGLang's `int32`, 2^63 for TokenSpeed's `int64`); both
//! legs of a PD pair speak the same runtime (selection filters Decode by the Prefill's).

use pdrouter_proto::scheduler::{
    DisaggregatedParams, GenerateComplete, GenerateRequest, GenerateResponse, GenerateStreamChunk,
    GetModelInfoResponse, GetServerInfoResponse, OutputLogProbs, TopLogProbs, generate_complete,
    generate_response, sampling_params,
};
use pdrouter_proto::tokenspeed_scheduler as ts;

// The runtimes and the ticket are below `grpc` and `images`, which both use them; re-exported
// here, where callers of the gRPC protocols look for them.
pub use crate::engine::{KvTicket, Runtime};

/// One `Generate` call in the router's working form.
#[derive(Debug, Clone)]
pub struct Call {
    /// The request, without `disaggregated_params` and `data_parallel_rank` (set from the
    /// fields below for SGLang).
    pub req: GenerateRequest,
    /// Sampling fields the client left unset (engine names), absent from TokenSpeed requests.
    pub unset: std::sync::Arc<[&'static str]>,
    /// The worker entry's DP rank in a DP-aware pool.
    pub dp_rank: Option<u32>,
    /// The KV ticket in PD.
    pub kv: Option<KvTicket>,
    /// The request's images (EPD, TokenSpeed only): items on both legs, encode tickets on
    /// the Prefill's.
    pub images: crate::images::CallImages,
    /// The encoding this call shares with its sibling leg (a long prompt in PD, see
    /// [`Call::share_encoding`]).
    pub shared: Option<super::encoded::SharedEncoding>,
    /// vLLM: the KV connector's parameters for this leg, a JSON object's text.
    pub kv_params: Option<String>,
    /// The sampling seed (TokenSpeed's and vLLM's messages carry it; SGLang's has no field).
    pub seed: Option<u64>,
}

impl Call {
    /// Lets `a` and `b`, the two legs of one prompt, share one encoding of their message, when
    /// every field the messages are built from is equal (in EPD the Prefill's carries encode
    /// tickets, and a DP-aware pool may give the legs different ranks: those encode their
    /// own).
    pub fn share_encoding(a: &mut Call, b: &mut Call) {
        let same = a.dp_rank == b.dp_rank
            && a.kv == b.kv
            && a.images.images.is_none()
            && b.images.images.is_none()
            && a.images.encode.is_empty()
            && b.images.encode.is_empty()
            && a.unset == b.unset
            && a.kv_params == b.kv_params
            && a.seed == b.seed
            && a.req == b.req;
        if same {
            let shared = super::encoded::SharedEncoding::default();
            a.shared = Some(shared.clone());
            b.shared = Some(shared);
        }
    }

    /// The request id.
    pub fn request_id(&self) -> &str {
        &self.req.request_id
    }

    /// The prompt's size on the wire, roughly: its text plus its token ids (in bytes).
    pub fn prompt_bytes(&self) -> usize {
        self.req.tokenized.as_ref().map_or(0, |t| {
            t.original_text
                .len()
                .saturating_add(t.input_ids.len().saturating_mul(4))
        })
    }

    /// Whether this call goes on the bulk lane (a prompt above
    /// [`super::bulk::BULK_PROMPT_BYTES`]): its own connection, its message encoded before it
    /// is sent.
    pub fn on_bulk_lane(&self) -> bool {
        self.prompt_bytes() > super::bulk::BULK_PROMPT_BYTES
    }

    /// Samples per prompt.
    pub fn samples(&self) -> u32 {
        self.req.sampling_params.as_ref().map_or(1, |s| s.n.max(1))
    }

    /// SGLang's message.
    pub fn into_sglang(self) -> GenerateRequest {
        let mut req = self.req;
        req.data_parallel_rank = self
            .dp_rank
            .map_or(0, |r| i32::try_from(r).unwrap_or(i32::MAX));
        req.disaggregated_params = self.kv.map(|k| DisaggregatedParams {
            bootstrap_host: k.host,
            bootstrap_port: k.port.map_or(0, i32::from),
            // Rooms for SGLang workers are drawn below 2^31; saturate rather than wrap.
            bootstrap_room: i32::try_from(k.room).unwrap_or(i32::MAX),
        });
        req
    }

    /// TokenSpeed's message: only the sampling scalars the client set, the full room.
    pub fn into_tokenspeed(self) -> ts::GenerateRequest {
        let Call {
            req,
            unset,
            dp_rank,
            kv,
            images,
            shared: _,
            kv_params: _,
            seed,
        } = self;
        let set = |k: &str| !unset.contains(&k);
        let sampling_params = req.sampling_params.map(|p| {
            let keep = |k: &str, v| set(k).then_some(v);
            ts::SamplingParams {
                temperature: keep("temperature", p.temperature),
                top_p: keep("top_p", p.top_p),
                top_k: set("top_k").then_some(p.top_k),
                min_p: keep("min_p", p.min_p),
                frequency_penalty: keep("frequency_penalty", p.frequency_penalty),
                presence_penalty: keep("presence_penalty", p.presence_penalty),
                repetition_penalty: keep("repetition_penalty", p.repetition_penalty),
                max_new_tokens: p.max_new_tokens.filter(|_| set("max_new_tokens")),
                min_new_tokens: p.min_new_tokens,
                stop: p.stop,
                stop_token_ids: p.stop_token_ids,
                ignore_eos: p.ignore_eos,
                skip_special_tokens: p.skip_special_tokens,
                spaces_between_special_tokens: p.spaces_between_special_tokens,
                n: p.n,
                logit_bias: p.logit_bias,
                constraint: p.constraint.map(|c| match c {
                    sampling_params::Constraint::Regex(s) => {
                        ts::sampling_params::Constraint::Regex(s)
                    }
                    sampling_params::Constraint::JsonSchema(s) => {
                        ts::sampling_params::Constraint::JsonSchema(s)
                    }
                    sampling_params::Constraint::EbnfGrammar(s) => {
                        ts::sampling_params::Constraint::EbnfGrammar(s)
                    }
                    sampling_params::Constraint::StructuralTag(s) => {
                        ts::sampling_params::Constraint::StructuralTag(s)
                    }
                }),
                custom_params: p.custom_params,
                no_stop_trim: p.no_stop_trim,
                sampling_seed: seed,
            }
        });
        ts::GenerateRequest {
            request_id: req.request_id,
            tokenized: req.tokenized.map(|t| ts::TokenizedInput {
                input_ids: t.input_ids,
                original_text: t.original_text,
            }),
            sampling_params,
            return_logprob: req.return_logprob,
            logprob_start_len: (req.logprob_start_len >= 0).then_some(req.logprob_start_len),
            top_logprobs_num: req.top_logprobs_num,
            token_ids_logprob: req.token_ids_logprob,
            stream: req.stream,
            mm_inputs: images.images.as_ref().map(|i| i.mm_inputs()),
            encode_bootstrap_info: (!images.encode.is_empty())
                .then(|| crate::images::wire::encode_bootstrap_info(&images.encode)),
            kv_bootstrap_info: kv.map(|k| ts::KvBootstrapInfo {
                bootstrap_port: k.wire_port(),
                bootstrap_room: k.wire_room(),
                bootstrap_host: k.host,
            }),
            data_parallel_rank: dp_rank.map(|r| i32::try_from(r).unwrap_or(i32::MAX)),
        }
    }
}

fn output_logprobs(l: ts::OutputLogProbs) -> OutputLogProbs {
    OutputLogProbs {
        token_logprobs: l.token_logprobs,
        token_ids: l.token_ids,
        top_logprobs: l
            .top_logprobs
            .into_iter()
            .map(|t| TopLogProbs {
                values: t.values,
                token_ids: t.token_ids,
            })
            .collect(),
    }
}

/// A TokenSpeed `Generate` message in SGLang's form.
pub fn response_from_tokenspeed(m: ts::GenerateResponse) -> GenerateResponse {
    use ts::generate_response::Response as T;
    let response = m.response.map(|r| match r {
        T::Chunk(c) => generate_response::Response::Chunk(GenerateStreamChunk {
            token_ids: c.token_ids,
            prompt_tokens: c.prompt_tokens,
            completion_tokens: c.completion_tokens,
            cached_tokens: c.cached_tokens,
            output_logprobs: c.output_logprobs.map(output_logprobs),
            index: c.index,
            ..Default::default()
        }),
        T::Complete(c) => generate_response::Response::Complete(GenerateComplete {
            output_ids: c.output_ids,
            finish_reason: c.finish_reason,
            prompt_tokens: c.prompt_tokens,
            completion_tokens: c.completion_tokens,
            cached_tokens: c.cached_tokens,
            output_logprobs: c.output_logprobs.map(output_logprobs),
            matched_stop: c.matched_stop.map(|s| match s {
                ts::generate_complete::MatchedStop::MatchedTokenId(id) => {
                    generate_complete::MatchedStop::MatchedTokenId(id)
                }
                ts::generate_complete::MatchedStop::MatchedStopStr(s) => {
                    generate_complete::MatchedStop::MatchedStopStr(s)
                }
            }),
            index: c.index,
            ..Default::default()
        }),
    });
    GenerateResponse {
        request_id: m.request_id,
        response,
    }
}

/// TokenSpeed's `GetModelInfo` in SGLang's form (TokenSpeed serves generation models only).
pub fn model_info_from_tokenspeed(m: ts::GetModelInfoResponse) -> GetModelInfoResponse {
    GetModelInfoResponse {
        model_path: m.model_path,
        tokenizer_path: m.tokenizer_path,
        is_generation: true,
        weight_version: m.weight_version,
        served_model_name: m.served_model_name,
        max_context_length: m.max_context_length,
        vocab_size: m.vocab_size,
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

/// TokenSpeed's `GetServerInfo` in SGLang's form (its version where SGLang puts its own).
pub fn server_info_from_tokenspeed(m: ts::GetServerInfoResponse) -> GetServerInfoResponse {
    GetServerInfoResponse {
        server_args: m.server_args,
        scheduler_info: m.scheduler_info,
        active_requests: m.active_requests,
        is_paused: m.is_paused,
        uptime_seconds: m.uptime_seconds,
        sglang_version: m.tokenspeed_version,
        server_type: "grpc".to_owned(),
        start_time: m.start_time,
        max_total_num_tokens: m.max_total_num_tokens,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use pdrouter_proto::scheduler::{SamplingParams, TokenizedInput};

    use super::*;

    fn sampling(temperature: f32, max_new_tokens: Option<u32>) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p: 1.0,
            top_k: -1,
            repetition_penalty: 1.0,
            max_new_tokens,
            n: 1,
            ..Default::default()
        }
    }

    fn call(unset: &[&'static str]) -> Call {
        Call {
            req: GenerateRequest {
                request_id: "r".to_owned(),
                tokenized: Some(TokenizedInput {
                    original_text: "hi".to_owned(),
                    input_ids: vec![1, 2],
                }),
                sampling_params: Some(sampling(0.0, Some(5))),
                logprob_start_len: -1,
                stream: true,
                ..Default::default()
            },
            unset: unset.into(),
            dp_rank: None,
            kv: Some(KvTicket {
                host: "p".to_owned(),
                port: Some(8998),
                room: (1 << 40) + 3,
            }),
            images: Default::default(),
            shared: None,
            kv_params: None,
            seed: None,
        }
    }

    #[test]
    fn tokenspeed_gets_only_the_scalars_the_client_set() {
        let all_unset = [
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "frequency_penalty",
            "presence_penalty",
            "repetition_penalty",
            "max_new_tokens",
        ];
        let sp = call(&all_unset).into_tokenspeed().sampling_params.unwrap();
        assert_eq!(sp.temperature, None);
        assert_eq!(sp.top_p, None);
        assert_eq!(sp.top_k, None);
        assert_eq!(sp.min_p, None);
        assert_eq!(sp.frequency_penalty, None);
        assert_eq!(sp.presence_penalty, None);
        assert_eq!(sp.repetition_penalty, None);
        assert_eq!(sp.max_new_tokens, None);

        // An explicit zero temperature is sent.
        let sp = call(&["top_p"]).into_tokenspeed().sampling_params.unwrap();
        assert_eq!(sp.temperature, Some(0.0));
        assert_eq!(sp.top_k, Some(-1));
        assert_eq!(sp.max_new_tokens, Some(5));
        assert_eq!(sp.top_p, None);
    }

    #[test]
    fn tokenspeed_keeps_the_full_room_and_the_text() {
        let r = call(&[]).into_tokenspeed();
        let kv = r.kv_bootstrap_info.unwrap();
        assert_eq!(kv.bootstrap_room, (1 << 40) + 3);
        assert_eq!((kv.bootstrap_host.as_str(), kv.bootstrap_port), ("p", 8998));
        let t = r.tokenized.unwrap();
        assert_eq!((t.input_ids, t.original_text.as_str()), (vec![1, 2], "hi"));
        assert_eq!(r.logprob_start_len, None);
        assert_eq!(r.data_parallel_rank, None);
        let mut c = call(&[]);
        c.dp_rank = Some(0);
        assert_eq!(c.into_tokenspeed().data_parallel_rank, Some(0));
    }

    #[test]
    fn sglang_gets_its_ticket_and_rank() {
        let mut c = call(&["temperature"]);
        c.kv.as_mut().unwrap().room = 77;
        c.dp_rank = Some(2);
        let r = c.into_sglang();
        let d = r.disaggregated_params.unwrap();
        assert_eq!((d.bootstrap_room, d.bootstrap_port), (77, 8998));
        assert_eq!(r.data_parallel_rank, 2);
        // SGLang's scalars are always filled.
        assert_eq!(r.sampling_params.unwrap().temperature, 0.0);
    }

    #[test]
    fn tokenspeed_answers_read_as_sglang_ones() {
        let m = response_from_tokenspeed(ts::GenerateResponse {
            request_id: "r".to_owned(),
            response: Some(ts::generate_response::Response::Complete(
                ts::GenerateComplete {
                    output_ids: vec![5],
                    finish_reason: "stop".to_owned(),
                    completion_tokens: 1,
                    matched_stop: Some(ts::generate_complete::MatchedStop::MatchedTokenId(5)),
                    index: 2,
                    ..Default::default()
                },
            )),
        });
        let Some(generate_response::Response::Complete(c)) = m.response else {
            panic!("{m:?}")
        };
        assert_eq!(
            (c.output_ids, c.index, c.completion_tokens),
            (vec![5], 2, 1)
        );
        assert_eq!(
            c.matched_stop,
            Some(generate_complete::MatchedStop::MatchedTokenId(5))
        );
    }

    /// A call whose prompt is `ids` ids long: above the bulk threshold from 16 Ki ids on.
    fn long_call(ids: u32) -> Call {
        let mut c = call(&["top_k"]);
        c.req.tokenized = Some(TokenizedInput {
            original_text: "w".repeat(ids as usize),
            input_ids: (0..ids).collect(),
        });
        c
    }

    fn shares(a: &mut Call, b: &mut Call) -> bool {
        Call::share_encoding(a, b);
        assert_eq!(a.shared.is_some(), b.shared.is_some());
        a.shared.is_some()
    }

    #[test]
    fn legs_share_an_encoding_only_for_equal_messages() {
        let long = long_call(16 * 1024);
        assert!(long.prompt_bytes() > super::super::bulk::BULK_PROMPT_BYTES);
        assert!(shares(&mut long.clone(), &mut long.clone()));
        // A short prompt's legs share theirs too (framed, where the first is sent).
        let short = call(&[]);
        assert!(!short.on_bulk_lane());
        assert!(shares(&mut short.clone(), &mut short.clone()));
        // Any field that makes the messages differ keeps the encodings apart.
        let differ: [fn(&mut Call); 5] = [
            |c| c.dp_rank = Some(1),
            |c| c.kv.as_mut().unwrap().room += 1,
            |c| c.req.request_id.push('x'),
            |c| c.unset = std::sync::Arc::from(&["top_k", "top_p"][..]),
            |c| {
                c.images.encode.push(crate::images::EncodeTicket {
                    item_index: 0,
                    at: c.kv.clone().unwrap(),
                })
            },
        ];
        for (change, base) in differ.iter().flat_map(|c| [(c, &long), (c, &short)]) {
            let mut a = base.clone();
            let mut b = base.clone();
            change(&mut b);
            assert!(!shares(&mut a, &mut b), "{b:?}");
        }
    }
}
