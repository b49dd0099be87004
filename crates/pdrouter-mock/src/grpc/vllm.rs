//! The `VllmEngine` service (vLLM's engine gRPC protocol) over the same engine model as
//! SGLang's front-end and the same KV hand-over as the HTTP vLLM front ([`crate::vllm_kv`]).
//!
//! A `Generate` request is read ([`read`]) into SGLang's message (absent `temperature` and
//! `max_tokens` take the engine default and the model's own length; `logprobs: k` asks for
//! output logprobs with `k` alternatives, `prompt_logprobs` for the prompt's from its start),
//! its KV leg (from `kv_transfer_params_json`, through a body-like map read by the HTTP
//! front's rules) and the facts the leg's work needs. [`Scheduler::run_with`] runs it as a
//! regular worker's request, its work before the first token being the leg's
//! ([`vllm_kv::prepare`]); its answers are written back in vLLM's messages ([`Answer`]): no
//! request id, `cached_tokens` the prompt tokens a transfer brought, and a producer's
//! `complete` carrying what [`vllm_kv::hold`] returned when its answer was ready.
//!
//! Invariants: every failure is a gRPC status, never an in-band message; a producer holds its
//! blocks once, when its first `complete` is ready, and not at all when aborted or ended
//! early; one generation counts at most one `aborts_total`, whether an `Abort` named it or
//! its client dropped the stream before its end (see [`DropWatch`]).

use std::sync::Arc;

use futures_util::StreamExt as _;
use pdrouter_proto::common::{GetTokenizerChunk, GetTokenizerRequest};
use pdrouter_proto::scheduler as sg;
use pdrouter_proto::scheduler::sglang_scheduler_server::SglangScheduler;
use pdrouter_proto::vllm_engine as vl;
use pdrouter_proto::vllm_engine::vllm_engine_server::VllmEngine;
use serde_json::{Map, Value, json};
use tonic::{Request, Response, Status};

use super::aborts::AbortHandle;
use super::generate::{Length, Plan};
use super::service::{Scheduler, Stream, gate};
use super::view;
use crate::config::{KvConnectorKind, Role};
use crate::state::{InflightGuard, Shared};
use crate::vllm_kv::{self, Body, Holder, KvLeg, LegFacts, params as kv_params, transfer};

/// vLLM's engine service in front of a [`Scheduler`].
#[derive(Debug)]
pub(crate) struct VllmFront {
    pub(crate) inner: Scheduler,
}

/// A `Generate` request as the engine model runs it.
#[derive(Debug)]
struct Read {
    req: sg::GenerateRequest,
    leg: KvLeg,
    /// The leg's facts but `capped`, which the plan decides.
    facts: LegFacts,
    length: Length,
    output_logprobs: bool,
    prompt_logprobs: bool,
}

fn invalid(msg: impl Into<String>) -> Status {
    Status::invalid_argument(msg)
}

/// The request's KV parameters and the fields the leg rules read, as the body of an HTTP
/// completion request would carry them (`kv_transfer_params`, `stream`, `max_tokens`,
/// `min_tokens`, the prompt's text).
fn kv_body(r: &vl::GenerateRequest, text: &str) -> Result<Map<String, Value>, Status> {
    const FIELD: &str = "kv_transfer_params_json";
    let params = match r.kv_transfer_params_json.as_deref() {
        None => Value::Null,
        Some(j) => match serde_json::from_str::<Value>(j) {
            Ok(v @ (Value::Object(_) | Value::Null)) => v,
            Ok(_) => return Err(invalid(format!("{FIELD} must be a JSON object"))),
            Err(e) => return Err(invalid(format!("{FIELD} is not JSON: {e}"))),
        },
    };
    let sp = r.sampling_params.as_ref();
    let mut body = Map::new();
    body.insert("kv_transfer_params".to_owned(), params);
    body.insert("stream".to_owned(), json!(r.stream));
    if let Some(max) = sp.and_then(|p| p.max_tokens) {
        body.insert("max_tokens".to_owned(), json!(max));
    }
    if let Some(min) = sp.map(|p| p.min_tokens).filter(|&m| m > 0) {
        body.insert("min_tokens".to_owned(), json!(min));
    }
    body.insert("prompt".to_owned(), json!(text));
    Ok(body)
}

/// The leg `body` asks for, checked as the HTTP front checks it (a Mooncake producer computes
/// on DP rank `rank`).
fn leg_of(s: &Shared, body: &Map<String, Value>, rank: u32) -> Result<KvLeg, Status> {
    let mut leg = kv_params::leg_for(s.kv_connector, body)
        .map_err(|m| invalid(format!("kv_transfer_params_json: {m}")))?;
    if leg.produces() {
        kv_params::check_producer(Body::Completion, body).map_err(invalid)?;
    }
    if let KvLeg::ProduceTransfer { rank: r, .. } = &mut leg {
        *r = rank;
    }
    Ok(leg)
}

/// vLLM's sampling parameters as SGLang's (unset or zero scalars: the engine defaults).
fn sampling(p: vl::SamplingParams) -> sg::SamplingParams {
    let or = |v: f32, default: f32| if v > 0.0 { v } else { default };
    sg::SamplingParams {
        temperature: p.temperature.unwrap_or(1.0),
        top_p: or(p.top_p, 1.0),
        top_k: i32::try_from(p.top_k).ok().filter(|&k| k > 0).unwrap_or(-1),
        min_p: p.min_p,
        frequency_penalty: p.frequency_penalty,
        presence_penalty: p.presence_penalty,
        repetition_penalty: or(p.repetition_penalty, 1.0),
        max_new_tokens: p.max_tokens,
        min_new_tokens: p.min_tokens,
        stop: p.stop,
        stop_token_ids: p.stop_token_ids,
        skip_special_tokens: p.skip_special_tokens,
        spaces_between_special_tokens: p.spaces_between_special_tokens,
        ignore_eos: p.ignore_eos,
        n: p.n,
        logit_bias: p
            .logit_bias
            .into_iter()
            .map(|(id, bias)| (id.to_string(), bias))
            .collect(),
        ..Default::default()
    }
}

/// Reads a `Generate` request: token ids only, a DP rank of this worker, well-formed KV
/// parameters for the configured connector (a producer as strict as over HTTP).
fn read(s: &Shared, r: vl::GenerateRequest) -> Result<Read, Status> {
    let tokenized = match &r.input {
        Some(vl::generate_request::Input::Tokenized(t)) => t.clone(),
        Some(vl::generate_request::Input::Text(_)) => {
            return Err(invalid("text input is not supported, send token ids"));
        }
        None => vl::TokenizedInput::default(),
    };
    let rank = match r.data_parallel_rank {
        None => 0,
        Some(rank) => u32::try_from(rank)
            .ok()
            .filter(|&k| k < s.dp_size)
            .ok_or_else(|| {
                invalid(format!(
                    "data_parallel_rank {rank} is out of range (dp_size {})",
                    s.dp_size
                ))
            })?,
    };
    let body = kv_body(&r, &tokenized.original_text)?;
    let leg = leg_of(s, &body, rank)?;
    let sp = r.sampling_params.unwrap_or_default();
    let length = if kv_params::has_eos_marker(Body::Completion, &body) {
        Length::EosFirst
    } else if s.engine.is_some() {
        // An engine generates what it is asked for, as in HTTP vLLM mode.
        Length::Asked(s.controls.output_tokens())
    } else {
        Length::Natural(s.controls.output_tokens())
    };
    let prompt_tokens = tokenized.input_ids.len() as u64;
    let lmcache = leg == KvLeg::Plain && s.kv_connector == KvConnectorKind::LmCache;
    let prompt_key = lmcache
        .then(|| {
            let prompt = Map::from_iter([("prompt".to_owned(), json!(tokenized.input_ids))]);
            transfer::prompt_key(Body::Completion, &prompt)
        })
        .flatten();
    let facts = LegFacts {
        prompt_tokens,
        compute_tokens: prompt_tokens,
        prompt_key,
        one_token: sp.max_tokens == Some(1),
        capped: false,
    };
    let (logprobs, prompt_logprobs) = (sp.logprobs, sp.prompt_logprobs);
    let req = sg::GenerateRequest {
        request_id: r.request_id,
        tokenized: Some(sg::TokenizedInput {
            original_text: tokenized.original_text,
            input_ids: tokenized.input_ids,
        }),
        sampling_params: Some(sampling(sp)),
        return_logprob: logprobs.is_some() || prompt_logprobs.is_some(),
        logprob_start_len: if prompt_logprobs.is_some() { 0 } else { -1 },
        top_logprobs_num: logprobs.unwrap_or(0).max(0),
        data_parallel_rank: i32::try_from(rank).unwrap_or(0),
        stream: r.stream,
        ..Default::default()
    };
    Ok(Read {
        req,
        leg,
        facts,
        length,
        output_logprobs: logprobs.is_some(),
        prompt_logprobs: prompt_logprobs.is_some(),
    })
}

/// Counts one abort when dropped armed: a generation whose client went away before its end,
/// unless an `Abort` reached it (counted by `Abort`).
#[derive(Debug)]
struct DropWatch {
    shared: Arc<Shared>,
    aborts: AbortHandle,
    armed: bool,
}

impl DropWatch {
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for DropWatch {
    fn drop(&mut self) {
        if self.armed && !self.aborts.is_aborted() {
            self.shared.controls.record_abort();
        }
    }
}

/// `inner`, counting an abort if it is dropped before its end (an error ends it too).
fn watched(inner: Stream<vl::GenerateResponse>, watch: DropWatch) -> Stream<vl::GenerateResponse> {
    futures_util::stream::unfold((inner, watch), |(mut inner, mut watch)| async move {
        match inner.next().await {
            Some(item) => {
                if item.is_err() {
                    watch.disarm();
                }
                Some((item, (inner, watch)))
            }
            None => {
                watch.disarm();
                None
            }
        }
    })
    .boxed()
}

/// Writes the engine model's answers in vLLM's messages.
#[derive(Debug)]
struct Answer {
    shared: Arc<Shared>,
    request_id: String,
    leg: KvLeg,
    prompt_tokens: u64,
    /// Prompt tokens a transfer brought.
    cached: u32,
    output_logprobs: bool,
    prompt_logprobs: bool,
    /// A producer's params once held (`Some(None)`: nothing to name).
    held: Option<Option<String>>,
}

fn output_logprobs(l: sg::OutputLogProbs) -> vl::OutputLogProbs {
    vl::OutputLogProbs {
        token_logprobs: l.token_logprobs,
        token_ids: l.token_ids,
        top_logprobs: l.top_logprobs.into_iter().map(top).collect(),
    }
}

fn input_logprobs(l: sg::InputLogProbs) -> vl::InputLogProbs {
    vl::InputLogProbs {
        token_logprobs: l
            .token_logprobs
            .into_iter()
            .map(|v| vl::InputTokenLogProb { value: v.value })
            .collect(),
        token_ids: l.token_ids,
        top_logprobs: l.top_logprobs.into_iter().map(top).collect(),
    }
}

fn top(t: sg::TopLogProbs) -> vl::TopLogProbs {
    vl::TopLogProbs {
        values: t.values,
        token_ids: t.token_ids,
    }
}

impl Answer {
    /// A producer's `kv_transfer_params_json` for a `complete` ending with `finish`: held
    /// once, at the first `complete`, unless aborted (nothing held, nothing counted).
    fn params(&mut self, finish: &str) -> Result<Option<String>, Status> {
        if let Some(done) = &self.held {
            return Ok(done.clone());
        }
        let holder = match &self.leg {
            KvLeg::Produce => Holder::Nixl(&self.request_id),
            KvLeg::ProduceTransfer { transfer_id, rank } => Holder::Mooncake(*rank, transfer_id),
            _ => return Ok(None),
        };
        if finish == "abort" {
            return Ok(None);
        }
        let capped = finish == "length";
        let held = vllm_kv::hold(&self.shared, holder, self.prompt_tokens, capped)
            .map_err(|full| Status::unavailable(full.to_string()))?;
        let json = held.map(|v| v.to_string());
        self.held = Some(json.clone());
        Ok(json)
    }

    fn convert(&mut self, m: sg::GenerateResponse) -> Result<vl::GenerateResponse, Status> {
        use sg::generate_response::Response as S;
        use vl::generate_response::Response as V;
        let (out, inp) = (self.output_logprobs, self.prompt_logprobs);
        let response = match m.response {
            None => None,
            Some(S::Chunk(c)) => Some(V::Chunk(vl::GenerateStreamChunk {
                token_ids: c.token_ids,
                prompt_tokens: c.prompt_tokens,
                completion_tokens: c.completion_tokens,
                cached_tokens: self.cached,
                output_logprobs: c.output_logprobs.filter(|_| out).map(output_logprobs),
                input_logprobs: c.input_logprobs.filter(|_| inp).map(input_logprobs),
                index: c.index,
            })),
            Some(S::Complete(c)) => Some(V::Complete(vl::GenerateComplete {
                kv_transfer_params_json: self.params(&c.finish_reason)?,
                output_ids: c.output_ids,
                finish_reason: c.finish_reason,
                prompt_tokens: c.prompt_tokens,
                completion_tokens: c.completion_tokens,
                cached_tokens: self.cached,
                output_logprobs: c.output_logprobs.filter(|_| out).map(output_logprobs),
                input_logprobs: c.input_logprobs.filter(|_| inp).map(input_logprobs),
                index: c.index,
                matched_stop: c.matched_stop.map(|s| match s {
                    sg::generate_complete::MatchedStop::MatchedTokenId(id) => {
                        vl::generate_complete::MatchedStop::MatchedTokenId(id)
                    }
                    sg::generate_complete::MatchedStop::MatchedStopStr(s) => {
                        vl::generate_complete::MatchedStop::MatchedStopStr(s)
                    }
                }),
            })),
            // vLLM has no error message: a failure is the stream's status.
            Some(S::Error(e)) => return Err(Status::internal(e.message)),
        };
        Ok(vl::GenerateResponse { response })
    }
}

impl VllmFront {
    /// One `Generate`: read, the leg's work before the first token, then the answers.
    async fn respond(
        &self,
        req: vl::GenerateRequest,
    ) -> Result<Stream<vl::GenerateResponse>, Status> {
        let s = &self.inner.shared;
        // Counted from its arrival, refused or not, as over HTTP.
        let guard = InflightGuard::begin(s);
        let read = read(s, req)?;
        let (leg, facts) = (&read.leg, &read.facts);
        let hang = !(leg.produces() && s.engine.is_some());
        let work = |plan: &Plan| {
            let facts = LegFacts {
                capped: plan.finish_reason == "length",
                ..facts.clone()
            };
            async move {
                gate(s, hang).await?;
                let prepared = vllm_kv::prepare(s, leg, &facts).await;
                if !prepared.delay.is_zero() {
                    tokio::time::sleep(prepared.delay).await;
                }
                Ok(prepared.cached)
            }
        };
        let (stream, cached) = self
            .inner
            .run_with(&read.req, Role::Regular, read.length, work, guard)
            .await?;
        let mut answer = Answer {
            shared: Arc::clone(s),
            request_id: read.req.request_id.clone(),
            leg: read.leg,
            prompt_tokens: read.facts.prompt_tokens,
            cached: u32::try_from(cached.unwrap_or(0)).unwrap_or(u32::MAX),
            output_logprobs: read.output_logprobs,
            prompt_logprobs: read.prompt_logprobs,
            held: None,
        };
        Ok(stream
            .map(move |m| m.and_then(|m| answer.convert(m)))
            .boxed())
    }

    /// The KV transfer configuration `GetServerInfo` reports: connector, role and engine id
    /// of a Prefill (producer) or Decode (consumer) worker; none for a regular one.
    fn kv_config(&self) -> (String, String, String) {
        let s = &self.inner.shared;
        let role = match s.role {
            Role::Prefill => "kv_producer",
            Role::Decode => "kv_consumer",
            Role::Regular | Role::Encode => return Default::default(),
        };
        let connector = match s.kv_connector {
            KvConnectorKind::Nixl => "NixlConnector",
            KvConnectorKind::Mooncake => "MooncakeConnector",
            KvConnectorKind::LmCache => "LMCacheConnectorV1",
        };
        let engine = vllm_kv::reported_engine_id(s);
        (connector.to_owned(), role.to_owned(), engine.to_owned())
    }
}

#[tonic::async_trait]
impl VllmEngine for VllmFront {
    type GenerateStream = Stream<vl::GenerateResponse>;
    type GetTokenizerStream = Stream<GetTokenizerChunk>;

    async fn generate(
        &self,
        request: Request<vl::GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let s = &self.inner.shared;
        s.controls
            .record_headers(request.metadata().clone().into_headers());
        let req = request.into_inner();
        let recorded = req.clone();
        s.controls.record_decoded(Arc::new(move || {
            serde_json::to_value(view::vllm_request(&recorded)).ok()
        }));
        // Armed until the answer ends: this call dropped before it answers counts too.
        let mut watch = DropWatch {
            shared: Arc::clone(s),
            aborts: self.inner.watch_aborts(&req.request_id),
            armed: true,
        };
        match self.respond(req).await {
            Ok(stream) => Ok(Response::new(watched(stream, watch))),
            Err(status) => {
                watch.disarm();
                Err(status)
            }
        }
    }

    async fn health_check(
        &self,
        _request: Request<vl::HealthCheckRequest>,
    ) -> Result<Response<vl::HealthCheckResponse>, Status> {
        let r = self
            .inner
            .health_check(Request::new(sg::HealthCheckRequest {}))
            .await?
            .into_inner();
        Ok(Response::new(vl::HealthCheckResponse {
            healthy: r.healthy,
            message: r.message,
        }))
    }

    async fn abort(
        &self,
        request: Request<vl::AbortRequest>,
    ) -> Result<Response<vl::AbortResponse>, Status> {
        for id in request.into_inner().request_ids {
            if self.inner.abort_running(&id) {
                self.inner.shared.controls.record_abort();
            }
        }
        Ok(Response::new(vl::AbortResponse {}))
    }

    async fn get_model_info(
        &self,
        _request: Request<vl::GetModelInfoRequest>,
    ) -> Result<Response<vl::GetModelInfoResponse>, Status> {
        let m = self
            .inner
            .get_model_info(Request::new(sg::GetModelInfoRequest {}))
            .await?
            .into_inner();
        Ok(Response::new(vl::GetModelInfoResponse {
            model_path: m.model_path,
            is_generation: m.is_generation,
            max_context_length: u32::try_from(m.max_context_length).unwrap_or(0),
            vocab_size: u32::try_from(m.vocab_size).unwrap_or(0),
            supports_vision: m.supports_vision,
            served_model_name: m.served_model_name,
            tokenizer_path: m.tokenizer_path,
            model_type: m.model_type,
            architectures: m.architectures,
            eos_token_ids: m.eos_token_ids,
            pad_token_id: m.pad_token_id,
            bos_token_id: m.bos_token_id,
            max_req_input_len: m.max_req_input_len,
            default_sampling_params_json: m.default_sampling_params_json,
        }))
    }

    async fn get_server_info(
        &self,
        _request: Request<vl::GetServerInfoRequest>,
    ) -> Result<Response<vl::GetServerInfoResponse>, Status> {
        let s = &self.inner.shared;
        let (kv_connector, kv_role, kv_engine_id) = self.kv_config();
        Ok(Response::new(vl::GetServerInfoResponse {
            active_requests: u32::try_from(s.controls.stats().inflight).unwrap_or(u32::MAX),
            is_paused: false,
            last_receive_timestamp: 0.0,
            uptime_seconds: self.inner.uptime_seconds(),
            server_type: "vllm-grpc".to_owned(),
            kv_connector,
            kv_role,
            kv_engine_id,
            data_parallel_size: i32::try_from(s.dp_size).unwrap_or(i32::MAX),
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
    use crate::config::MockConfig;

    fn shared(role: Role, connector: KvConnectorKind, engine: bool) -> Shared {
        let mut cfg = MockConfig::new(role);
        cfg.grpc = true;
        cfg.grpc_runtime = crate::config::GrpcRuntime::Vllm;
        cfg.kv_connector = connector;
        cfg.dp_size = 2;
        cfg.engine = engine.then(crate::engine::EngineConfig::new);
        Shared::new(&cfg, "127.0.0.1:9".parse().unwrap())
    }

    fn req(sp: vl::SamplingParams, kv: Option<&str>) -> vl::GenerateRequest {
        vl::GenerateRequest {
            request_id: "r".to_owned(),
            input: Some(vl::generate_request::Input::Tokenized(vl::TokenizedInput {
                original_text: "x".to_owned(),
                input_ids: vec![1; 20],
            })),
            sampling_params: Some(sp),
            kv_transfer_params_json: kv.map(str::to_owned),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn sampling_and_logprobs_map_onto_sglangs_message() {
        let s = shared(Role::Regular, KvConnectorKind::Nixl, false);
        let sp = vl::SamplingParams {
            max_tokens: Some(3),
            top_k: 0,
            logprobs: Some(2),
            ..Default::default()
        };
        let r = read(&s, req(sp, None)).unwrap();
        let sg = r.req.sampling_params.as_ref().unwrap();
        assert_eq!((sg.temperature, sg.top_p, sg.top_k), (1.0, 1.0, -1));
        assert_eq!(sg.max_new_tokens, Some(3));
        assert!(r.req.return_logprob && r.output_logprobs && !r.prompt_logprobs);
        assert_eq!((r.req.top_logprobs_num, r.req.logprob_start_len), (2, -1));
        assert_eq!((r.leg, r.length), (KvLeg::Plain, Length::Natural(8)));
        let prompt = vl::SamplingParams {
            prompt_logprobs: Some(0),
            ..Default::default()
        };
        let r = read(&s, req(prompt, None)).unwrap();
        assert!(r.req.return_logprob && !r.output_logprobs && r.prompt_logprobs);
        assert_eq!(r.req.logprob_start_len, 0);
    }

    #[tokio::test]
    async fn legs_ranks_and_lengths_follow_the_request() {
        let s = shared(Role::Prefill, KvConnectorKind::Mooncake, true);
        let one = vl::SamplingParams {
            max_tokens: Some(1),
            ..Default::default()
        };
        let mut r = req(
            one.clone(),
            Some(r#"{"do_remote_decode":true,"transfer_id":"t"}"#),
        );
        r.data_parallel_rank = Some(1);
        let read1 = read(&s, r).unwrap();
        let want = KvLeg::ProduceTransfer {
            transfer_id: "t".to_owned(),
            rank: 1,
        };
        assert_eq!(read1.leg, want);
        assert_eq!(
            read1.length,
            Length::Asked(8),
            "an engine generates what it is asked"
        );
        assert!(read1.facts.one_token);
        for rank in [-1, 2] {
            let mut r = req(one.clone(), None);
            r.data_parallel_rank = Some(rank);
            assert_eq!(
                read(&s, r).unwrap_err().code(),
                tonic::Code::InvalidArgument
            );
        }
        let mut eos = req(one, None);
        if let Some(vl::generate_request::Input::Tokenized(t)) = &mut eos.input {
            t.original_text = "a [[eos]]".to_owned();
        }
        assert_eq!(read(&s, eos).unwrap().length, Length::EosFirst);
        let lm = shared(Role::Decode, KvConnectorKind::LmCache, false);
        let a = read(&lm, req(vl::SamplingParams::default(), None)).unwrap();
        let b = read(&lm, req(vl::SamplingParams::default(), None)).unwrap();
        assert!(a.facts.prompt_key.is_some());
        assert_eq!(
            a.facts.prompt_key, b.facts.prompt_key,
            "keyed by the prompt's ids"
        );
    }
}
