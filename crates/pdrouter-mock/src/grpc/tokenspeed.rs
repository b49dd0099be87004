//! The `TokenSpeedScheduler` service over the same engine model as SGLang's front-end.
//!
//! A request is read into SGLang's message (unset sampling scalars take the engine defaults
//! SGLang's senders would have filled in) and run by [`Scheduler::run`]; its answers are
//! written back in TokenSpeed's messages. What the request actually carried is recorded as
//! sent ([`view::tokenspeed_request`]): which sampling scalars were present, the full 63-bit
//! KV room. Prompt logprobs have no field in TokenSpeed's answers and are not sent.

use futures_util::StreamExt as _;
use pdrouter_proto::common::{GetTokenizerChunk, GetTokenizerRequest};
use pdrouter_proto::scheduler as sg;
use pdrouter_proto::scheduler::sglang_scheduler_server::SglangScheduler;
use pdrouter_proto::tokenspeed_scheduler as ts;
use pdrouter_proto::tokenspeed_scheduler::token_speed_scheduler_server::TokenSpeedScheduler;
use tonic::{Request, Response, Status};

use super::service::{EncodedItem, Scheduler, Stream, Ticket};
use super::view;

/// TokenSpeed's service in front of a [`Scheduler`].
#[derive(Debug)]
pub(crate) struct TokenSpeedFront {
    pub(crate) inner: Scheduler,
}

/// TokenSpeed's request as SGLang's, its KV ticket and its items' encode tickets (EPD).
type Converted = (sg::GenerateRequest, Option<Ticket>, Vec<EncodedItem>);

/// The image items a Prefill must wait for, checked against the request's items: one ticket
/// per item (by `item_index`), no pixels where an encode worker sends the embedding.
fn encoded_items(r: &ts::GenerateRequest) -> Result<Vec<EncodedItem>, Status> {
    let items = r.mm_inputs.as_ref().map_or(&[][..], |m| &m.items[..]);
    let Some(info) = &r.encode_bootstrap_info else {
        return Ok(Vec::new());
    };
    if info.items.len() != items.len() {
        return Err(Status::invalid_argument(format!(
            "{} image items but {} encode tickets",
            items.len(),
            info.items.len()
        )));
    }
    let mut seen = vec![false; items.len()];
    info.items
        .iter()
        .map(|i| {
            let index = i.item_index;
            let item = usize::try_from(index)
                .ok()
                .filter(|&k| k < items.len() && !std::mem::replace(&mut seen[k], true))
                .and_then(|k| items.get(k))
                .ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "item_index {index} is out of range or repeated"
                    ))
                })?;
            if item
                .encoder_input
                .as_ref()
                .is_some_and(|t| t.payload.is_some())
            {
                return Err(Status::invalid_argument(format!(
                    "item {index} carries its pixels: they go to its encode worker"
                )));
            }
            Ok(EncodedItem {
                index,
                hash: super::encoder::hex(&item.content_hash),
                ticket: Ticket {
                    host: i.bootstrap_host.clone(),
                    port: i.bootstrap_port,
                    room: u64::try_from(i.bootstrap_room).map_err(|_| {
                        Status::invalid_argument("an encode bootstrap_room is negative")
                    })?,
                },
            })
        })
        .collect()
}

fn to_sglang(r: ts::GenerateRequest) -> Result<Converted, Status> {
    let encoded = encoded_items(&r)?;
    let ticket = match &r.kv_bootstrap_info {
        Some(kv) => Some(Ticket {
            host: kv.bootstrap_host.clone(),
            port: kv.bootstrap_port,
            room: u64::try_from(kv.bootstrap_room)
                .map_err(|_| Status::invalid_argument("bootstrap_room is negative"))?,
        }),
        None => None,
    };
    let sampling_params = r.sampling_params.map(|p| sg::SamplingParams {
        temperature: p.temperature.unwrap_or(1.0),
        top_p: p.top_p.unwrap_or(1.0),
        top_k: p.top_k.unwrap_or(-1),
        min_p: p.min_p.unwrap_or(0.0),
        frequency_penalty: p.frequency_penalty.unwrap_or(0.0),
        presence_penalty: p.presence_penalty.unwrap_or(0.0),
        repetition_penalty: p.repetition_penalty.unwrap_or(1.0),
        max_new_tokens: p.max_new_tokens,
        min_new_tokens: p.min_new_tokens,
        stop: p.stop,
        stop_token_ids: p.stop_token_ids,
        ignore_eos: p.ignore_eos,
        skip_special_tokens: p.skip_special_tokens,
        spaces_between_special_tokens: p.spaces_between_special_tokens,
        n: p.n,
        no_stop_trim: p.no_stop_trim,
        ..Default::default()
    });
    let req = sg::GenerateRequest {
        request_id: r.request_id,
        tokenized: r.tokenized.map(|t| sg::TokenizedInput {
            original_text: t.original_text,
            input_ids: t.input_ids,
        }),
        sampling_params,
        return_logprob: r.return_logprob,
        logprob_start_len: r.logprob_start_len.unwrap_or(-1),
        top_logprobs_num: r.top_logprobs_num,
        // The room travels in the ticket; the placeholder only says there is one.
        disaggregated_params: ticket.as_ref().map(|t| sg::DisaggregatedParams {
            bootstrap_host: t.host.clone(),
            bootstrap_port: t.port,
            bootstrap_room: 0,
        }),
        data_parallel_rank: r.data_parallel_rank.unwrap_or(0),
        stream: r.stream,
        ..Default::default()
    };
    Ok((req, ticket, encoded))
}

fn output_logprobs(l: sg::OutputLogProbs) -> ts::OutputLogProbs {
    ts::OutputLogProbs {
        token_logprobs: l.token_logprobs,
        token_ids: l.token_ids,
        top_logprobs: l
            .top_logprobs
            .into_iter()
            .map(|t| ts::TopLogProbs {
                values: t.values,
                token_ids: t.token_ids,
            })
            .collect(),
    }
}

/// An SGLang answer as TokenSpeed's.
fn to_tokenspeed(m: sg::GenerateResponse) -> Result<ts::GenerateResponse, Status> {
    use sg::generate_response::Response as S;
    use ts::generate_response::Response as T;
    let response = match m.response {
        None => None,
        Some(S::Chunk(c)) => Some(T::Chunk(ts::GenerateStreamChunk {
            token_ids: c.token_ids,
            prompt_tokens: c.prompt_tokens,
            completion_tokens: c.completion_tokens,
            cached_tokens: c.cached_tokens,
            output_logprobs: c.output_logprobs.map(output_logprobs),
            index: c.index,
        })),
        Some(S::Complete(c)) => Some(T::Complete(ts::GenerateComplete {
            output_ids: c.output_ids,
            finish_reason: c.finish_reason,
            prompt_tokens: c.prompt_tokens,
            completion_tokens: c.completion_tokens,
            cached_tokens: c.cached_tokens,
            output_logprobs: c.output_logprobs.map(output_logprobs),
            matched_stop: c.matched_stop.map(|s| match s {
                sg::generate_complete::MatchedStop::MatchedTokenId(id) => {
                    ts::generate_complete::MatchedStop::MatchedTokenId(id)
                }
                sg::generate_complete::MatchedStop::MatchedStopStr(s) => {
                    ts::generate_complete::MatchedStop::MatchedStopStr(s)
                }
            }),
            index: c.index,
        })),
        // TokenSpeed has no error message: a failure is the stream's status.
        Some(S::Error(e)) => return Err(Status::internal(e.message)),
    };
    Ok(ts::GenerateResponse {
        request_id: m.request_id,
        response,
    })
}

#[tonic::async_trait]
impl TokenSpeedScheduler for TokenSpeedFront {
    type GenerateStream = Stream<ts::GenerateResponse>;
    type GetTokenizerStream = Stream<GetTokenizerChunk>;

    async fn generate(
        &self,
        request: Request<ts::GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let s = &self.inner.shared;
        s.controls
            .record_headers(request.metadata().clone().into_headers());
        let req = request.into_inner();
        let recorded = req.clone();
        s.controls.record_decoded(std::sync::Arc::new(move || {
            serde_json::to_value(view::tokenspeed_request(&recorded)).ok()
        }));
        let (req, ticket, encoded) = to_sglang(req)?;
        let stream = self.inner.run(req, ticket, encoded).await?;
        Ok(Response::new(
            stream.map(|m| m.and_then(to_tokenspeed)).boxed(),
        ))
    }

    async fn health_check(
        &self,
        _request: Request<ts::HealthCheckRequest>,
    ) -> Result<Response<ts::HealthCheckResponse>, Status> {
        let r = self
            .inner
            .health_check(Request::new(sg::HealthCheckRequest {}))
            .await?
            .into_inner();
        Ok(Response::new(ts::HealthCheckResponse {
            healthy: r.healthy,
            message: r.message,
        }))
    }

    async fn abort(
        &self,
        request: Request<ts::AbortRequest>,
    ) -> Result<Response<ts::AbortResponse>, Status> {
        let ts::AbortRequest { request_id, reason } = request.into_inner();
        let r = self
            .inner
            .abort(Request::new(sg::AbortRequest { request_id, reason }))
            .await?
            .into_inner();
        Ok(Response::new(ts::AbortResponse {
            success: r.success,
            message: r.message,
        }))
    }

    async fn get_model_info(
        &self,
        _request: Request<ts::GetModelInfoRequest>,
    ) -> Result<Response<ts::GetModelInfoResponse>, Status> {
        let m = self
            .inner
            .get_model_info(Request::new(sg::GetModelInfoRequest {}))
            .await?
            .into_inner();
        Ok(Response::new(ts::GetModelInfoResponse {
            model_path: m.model_path,
            tokenizer_path: m.tokenizer_path,
            served_model_name: m.served_model_name,
            model_type: m.model_type,
            architectures: m.architectures,
            max_context_length: m.max_context_length,
            max_req_input_len: m.max_req_input_len,
            vocab_size: m.vocab_size,
            eos_token_ids: m.eos_token_ids,
            pad_token_id: m.pad_token_id,
            bos_token_id: m.bos_token_id,
            weight_version: m.weight_version,
            default_sampling_params_json: m.default_sampling_params_json,
            supports_vision: m.supports_vision,
            ..Default::default()
        }))
    }

    async fn get_server_info(
        &self,
        _request: Request<ts::GetServerInfoRequest>,
    ) -> Result<Response<ts::GetServerInfoResponse>, Status> {
        let m = self
            .inner
            .get_server_info(Request::new(sg::GetServerInfoRequest {}))
            .await?
            .into_inner();
        Ok(Response::new(ts::GetServerInfoResponse {
            server_args: m.server_args,
            scheduler_info: m.scheduler_info,
            active_requests: m.active_requests,
            is_paused: m.is_paused,
            uptime_seconds: m.uptime_seconds,
            max_total_num_tokens: m.max_total_num_tokens,
            tokenspeed_version: "mock".to_owned(),
            start_time: m.start_time,
        }))
    }

    async fn get_tokenizer(
        &self,
        request: Request<GetTokenizerRequest>,
    ) -> Result<Response<Self::GetTokenizerStream>, Status> {
        self.inner.get_tokenizer(request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_scalars_take_engine_defaults_and_the_room_is_kept() {
        let (req, ticket, _) = to_sglang(ts::GenerateRequest {
            request_id: "r".to_owned(),
            sampling_params: Some(ts::SamplingParams {
                temperature: Some(0.0),
                ..Default::default()
            }),
            kv_bootstrap_info: Some(ts::KvBootstrapInfo {
                bootstrap_host: "h".to_owned(),
                bootstrap_port: 7,
                bootstrap_room: 1 << 50,
            }),
            ..Default::default()
        })
        .unwrap();
        let sp = req.sampling_params.unwrap();
        assert_eq!((sp.temperature, sp.top_p, sp.top_k), (0.0, 1.0, -1));
        assert_eq!(ticket.unwrap().room, 1 << 50);
        assert_eq!(req.logprob_start_len, -1);

        let negative = to_sglang(ts::GenerateRequest {
            kv_bootstrap_info: Some(ts::KvBootstrapInfo {
                bootstrap_room: -1,
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(negative.unwrap_err().code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn encode_tickets_must_match_the_items_one_to_one_without_pixels() {
        let item = |pixels: bool| ts::MultimodalItem {
            content_hash: vec![0xab, 0xcd],
            encoder_input: Some(ts::TensorData {
                shape: vec![4, 1176],
                dtype: "bfloat16".to_owned(),
                payload: pixels.then(|| ts::tensor_data::Payload::Inline(vec![0; 4])),
            }),
            ..Default::default()
        };
        let ticket = |index: u32, room: i64| ts::EncodeItemBootstrapInfo {
            item_index: index,
            bootstrap_host: "127.0.0.1".to_owned(),
            bootstrap_port: 9,
            bootstrap_room: room,
        };
        let req = |items: Vec<ts::MultimodalItem>, tickets: Vec<ts::EncodeItemBootstrapInfo>| {
            ts::GenerateRequest {
                mm_inputs: Some(ts::MultimodalInputs { items }),
                encode_bootstrap_info: Some(ts::EncodeBootstrapInfo { items: tickets }),
                ..Default::default()
            }
        };
        let ok = encoded_items(&req(
            vec![item(false), item(false)],
            vec![ticket(1, 5), ticket(0, 6)],
        ))
        .unwrap();
        assert_eq!((ok[0].index, ok[0].ticket.room), (1, 5));
        assert_eq!(ok[1].hash, "abcd");
        let refused = [
            req(vec![item(false)], vec![ticket(0, 1), ticket(0, 2)]),
            req(
                vec![item(false), item(false)],
                vec![ticket(0, 1), ticket(0, 2)],
            ),
            req(vec![item(false)], vec![ticket(1, 1)]),
            req(vec![item(true)], vec![ticket(0, 1)]),
            req(vec![item(false)], vec![ticket(0, -1)]),
        ];
        for r in refused {
            assert_eq!(
                encoded_items(&r).unwrap_err().code(),
                tonic::Code::InvalidArgument
            );
        }
        // Items without tickets (PD, or a Decode) wait for nothing.
        let mut plain = req(vec![item(true)], vec![]);
        plain.encode_bootstrap_info = None;
        assert!(encoded_items(&plain).unwrap().is_empty());
    }
}
