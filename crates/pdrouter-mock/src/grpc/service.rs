//! The `SglangScheduler` service over the shared engine model, and that model's one way to
//! run a generation ([`Scheduler::run`] for a role's own work before the first token,
//! [`Scheduler::run_with`] for a front that decides it, as vLLM's does), which every gRPC
//! front-end goes through.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use futures_util::stream::BoxStream;
use pdrouter_proto::common::{GetTokenizerChunk, GetTokenizerRequest};
use pdrouter_proto::scheduler::sglang_scheduler_server::SglangScheduler;
use pdrouter_proto::scheduler::{
    AbortRequest, AbortResponse, GenerateRequest, GenerateResponse, GetModelInfoRequest,
    GetModelInfoResponse, GetServerInfoRequest, GetServerInfoResponse, HealthCheckRequest,
    HealthCheckResponse,
};
use pdrouter_tokenizer::{bundle, bytelevel};
use serde_json::json;
use tonic::{Request, Response, Status};

use super::aborts::{AbortHandle, Aborts};
use super::generate::{Generation, Length, Plan};
use super::view;
use crate::bootstrap::{LONG_POLL_LIMIT, await_room, await_room_tag};
use crate::config::Role;
use crate::state::{InflightGuard, Shared};

/// Piece size of the `GetTokenizer` stream; small, so that even the tiny
/// byte-level bundle arrives in several chunks as a real one would.
pub(crate) const TOKENIZER_CHUNK_BYTES: usize = 1024;

/// Everything the gRPC front-end serves besides the engine model.
#[derive(Debug)]
pub(crate) struct Scheduler {
    pub(crate) shared: Arc<Shared>,
    aborts: Arc<Aborts>,
    tokenizer_zip: Arc<[u8]>,
    tokenizer_sha256: Arc<str>,
    started: Instant,
}

impl Scheduler {
    pub(crate) fn new(shared: Arc<Shared>) -> std::io::Result<Self> {
        let (zip, sha) = bundle::pack(bytelevel::files())
            .map_err(|e| std::io::Error::other(format!("building the tokenizer bundle: {e}")))?;
        Ok(Scheduler {
            shared,
            aborts: Arc::default(),
            tokenizer_zip: zip.into(),
            tokenizer_sha256: sha.into(),
            started: Instant::now(),
        })
    }

    /// Everything before the first token: hang switch, injected failure,
    /// then the role's work (prefill compute and room hand-over, or the
    /// decode wait for its prefill), then the configured delay.
    async fn prepare(
        &self,
        req: &GenerateRequest,
        ticket: Option<&Ticket>,
        encoded: &[EncodedItem],
    ) -> Result<(), Status> {
        let s = &self.shared;
        // An engine-mode prefill is held inside the engine (holding its slot, like a stalled
        // engine), as in the HTTP front-end.
        let engine_prefill = s.engine.is_some() && s.role == Role::Prefill;
        gate(s, !engine_prefill).await?;
        let delay = s.controls.delay();
        // EPD: every item's embedding must have reached this worker (its encode worker
        // finished the item's room, holding that item) before the prompt can be computed;
        // the wait is bounded, and its end fails the request.
        if !encoded.is_empty() {
            let waits = futures_util::future::try_join_all(encoded.iter().map(await_item));
            tokio::time::timeout(s.encode_wait, waits)
                .await
                .map_err(|_| {
                    Status::deadline_exceeded(format!(
                        "the embeddings of the {} image items did not all arrive within {:?}",
                        encoded.len(),
                        s.encode_wait
                    ))
                })??;
        }
        match s.role {
            Role::Prefill => {
                // Plan::new checked the ticket exists.
                let room = ticket.map_or(0, |d| d.room);
                match &s.engine {
                    Some(engine) => {
                        let tokens = req.tokenized.as_ref().map_or(0, |t| t.input_ids.len());
                        engine
                            .prefill(tokens as u64, delay, &[room], s.controls.wait_while_hung())
                            .await;
                    }
                    None => {
                        sleep(delay).await;
                        s.rooms.finish(room);
                    }
                }
                return Ok(());
            }
            Role::Decode => {
                if let Some(d) = ticket {
                    await_ticket(d, "prefill of room").await?;
                }
            }
            Role::Regular | Role::Encode => {}
        }
        sleep(delay).await;
        Ok(())
    }

    /// One generation of SGLang's or TokenSpeed's front-end, in SGLang's messages:
    /// validation, the role's work before the first token (see [`Scheduler::prepare`]), then
    /// the stream.
    pub(crate) async fn run(
        &self,
        req: GenerateRequest,
        ticket: Option<Ticket>,
        encoded: Vec<EncodedItem>,
    ) -> Result<Stream<GenerateResponse>, Status> {
        let s = &self.shared;
        let guard = InflightGuard::begin(s);
        let length = Length::of(s.role, s.controls.output_tokens(), s.engine.is_some());
        let work = |_: &Plan| self.prepare(&req, ticket.as_ref(), &encoded);
        let (stream, _) = self.run_with(&req, s.role, length, work, guard).await?;
        Ok(stream)
    }

    /// One generation whose work before the first token its front-end decides (vLLM's KV
    /// legs), in SGLang's messages: validation, the plan of a `role` worker whose model
    /// answers at `length`, then `work` (given the plan; it owns the hang switch, the injected
    /// failure and the delay, see [`gate`]), then the stream, which keeps `guard` (the request
    /// counted since it arrived) to its end. Returns what the work returned, `None` when an
    /// `Abort` came first (the stream then reports the abort).
    pub(crate) async fn run_with<T, W>(
        &self,
        req: &GenerateRequest,
        role: Role,
        length: Length,
        work: impl FnOnce(&Plan) -> W,
        guard: InflightGuard,
    ) -> Result<(Stream<GenerateResponse>, Option<T>), Status>
    where
        W: Future<Output = Result<T, Status>>,
    {
        let s = &self.shared;
        let rank = req.data_parallel_rank;
        if u32::try_from(rank).is_ok_and(|r| r >= s.dp_size) {
            return Err(Status::invalid_argument(format!(
                "data_parallel_rank {rank} is out of range (dp_size {})",
                s.dp_size
            )));
        }
        let mut plan = Plan::new(role, req, length)?;
        if let Some(text) = &s.output_text {
            plan.write_text(text.as_bytes());
        }
        let mut abort = self.aborts.register(&req.request_id);
        let work = work(&plan);
        let done = tokio::select! {
            r = work => Some(r?),
            // The generation then reports the abort as its only message.
            () = abort.aborted() => None,
        };
        let interval = match role {
            Role::Prefill => Duration::ZERO,
            _ => s.controls.token_interval(),
        };
        let generation = Generation::new(req, plan, interval, abort, guard, Arc::clone(s));
        Ok((generation.into_stream(), done))
    }

    /// Seconds since the service started.
    pub(crate) fn uptime_seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Aborts every running generation with `request_id`; `false` if none.
    pub(crate) fn abort_running(&self, request_id: &str) -> bool {
        self.aborts.abort(request_id)
    }

    /// Registers a watcher of the generations with `request_id`: its handle tells whether an
    /// `Abort` reached them.
    pub(crate) fn watch_aborts(&self, request_id: &str) -> AbortHandle {
        self.aborts.register(request_id)
    }
}

/// The gate every generation passes before its work: the hang switch (unless `hang` is
/// false: an engine-mode prefill waits for it inside the engine, holding its slot), then the
/// injected failure (`INTERNAL`).
pub(crate) async fn gate(s: &Shared, hang: bool) -> Result<(), Status> {
    if hang {
        s.controls.wait_while_hung().await;
    }
    if s.controls.draw_failure() {
        return Err(Status::internal("mock injected failure"));
    }
    Ok(())
}

/// Waits (at most [`LONG_POLL_LIMIT`]) until the ticket's room is finished at its
/// `host:port`; a ticket without an address is not waited for. `what` names the awaited work
/// in the deadline error.
async fn await_ticket(t: &Ticket, what: &str) -> Result<(), Status> {
    if t.port <= 0 || t.host.is_empty() {
        return Ok(());
    }
    let port = u16::try_from(t.port)
        .map_err(|_| Status::invalid_argument(format!("bad bootstrap_port {}", t.port)))?;
    match tokio::time::timeout(LONG_POLL_LIMIT, await_room(&t.host, port, t.room)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(msg)) => Err(Status::unavailable(msg)),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "{what} {} did not finish in time",
            t.room
        ))),
    }
}

/// Waits until an image item's room is finished at its encode worker and checks the room
/// holds that item (the encode worker tags the room with the item's content hash).
async fn await_item(e: &EncodedItem) -> Result<(), Status> {
    let t = &e.ticket;
    let port = u16::try_from(t.port)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| {
            Status::invalid_argument(format!("item {}: bad bootstrap_port {}", e.index, t.port))
        })?;
    let tag = await_room_tag(&t.host, port, t.room)
        .await
        .map_err(Status::unavailable)?;
    if tag.as_deref() != Some(e.hash.as_str()) {
        return Err(Status::failed_precondition(format!(
            "item {}: room {} holds {}, the request names {}",
            e.index,
            t.room,
            tag.as_deref().unwrap_or("no item"),
            e.hash
        )));
    }
    Ok(())
}

/// An image item whose embedding a Prefill waits for: where it comes from, and which item it
/// is (its content hash, lower-case hex).
#[derive(Debug, Clone)]
pub(crate) struct EncodedItem {
    pub(crate) index: u32,
    pub(crate) ticket: Ticket,
    pub(crate) hash: String,
}

/// The KV hand-over ticket of a request, whichever protocol carried it.
#[derive(Debug, Clone)]
pub(crate) struct Ticket {
    pub(crate) host: String,
    pub(crate) port: i32,
    pub(crate) room: u64,
}

async fn sleep(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

pub(crate) type Stream<T> = BoxStream<'static, Result<T, Status>>;

#[tonic::async_trait]
impl SglangScheduler for Scheduler {
    type GenerateStream = Stream<GenerateResponse>;
    type GetTokenizerStream = Stream<GetTokenizerChunk>;

    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let s = &self.shared;
        s.controls
            .record_headers(request.metadata().clone().into_headers());
        let req = request.into_inner();
        let recorded = req.clone();
        s.controls.record_decoded(std::sync::Arc::new(move || {
            serde_json::to_value(view::generate_request(&recorded)).ok()
        }));
        let ticket = req.disaggregated_params.as_ref().map(|d| Ticket {
            host: d.bootstrap_host.clone(),
            port: d.bootstrap_port,
            // A negative room is refused by Plan::new before the ticket is used.
            room: u64::try_from(d.bootstrap_room).unwrap_or(0),
        });
        Ok(Response::new(self.run(req, ticket, Vec::new()).await?))
    }

    async fn health_check(
        &self,
        _request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let healthy = self.shared.controls.healthy();
        Ok(Response::new(HealthCheckResponse {
            healthy,
            message: if healthy {
                "ok"
            } else {
                "unhealthy (mock control)"
            }
            .to_owned(),
        }))
    }

    async fn abort(
        &self,
        request: Request<AbortRequest>,
    ) -> Result<Response<AbortResponse>, Status> {
        let id = request.into_inner().request_id;
        self.shared.controls.record_abort();
        let success = self.aborts.abort(&id);
        Ok(Response::new(AbortResponse {
            success,
            message: if success {
                format!("aborted {id}")
            } else {
                format!("no running request {id}")
            },
        }))
    }

    async fn get_model_info(
        &self,
        _request: Request<GetModelInfoRequest>,
    ) -> Result<Response<GetModelInfoResponse>, Status> {
        let model = &self.shared.model;
        let context = bytelevel::MAX_POSITION_EMBEDDINGS as i32;
        Ok(Response::new(GetModelInfoResponse {
            model_path: model.clone(),
            // Not a local path: a router fetches the files with GetTokenizer.
            tokenizer_path: model.clone(),
            is_generation: true,
            served_model_name: model.clone(),
            max_context_length: context,
            vocab_size: bytelevel::VOCAB_SIZE as i32,
            model_type: "mock".to_owned(),
            eos_token_ids: bytelevel::EOS_TOKEN_IDS
                .iter()
                .map(|&id| id as i32)
                .collect(),
            pad_token_id: bytelevel::ENDOFTEXT as i32,
            bos_token_id: -1,
            max_req_input_len: context - 1,
            architectures: vec!["MockForCausalLM".to_owned()],
            default_sampling_params_json: self
                .shared
                .default_sampling_params
                .clone()
                .unwrap_or_default(),
            ..Default::default()
        }))
    }

    async fn get_server_info(
        &self,
        _request: Request<GetServerInfoRequest>,
    ) -> Result<Response<GetServerInfoResponse>, Status> {
        let s = &self.shared;
        let max_running = s.engine.as_ref().map_or(128, |e| e.config.max_running);
        let server_args = json!({
            "model_path": s.model,
            "tokenizer_path": s.model,
            "served_model_name": s.model,
            "dp_size": s.dp_size,
            "disaggregation_mode": s.role.disaggregation_mode(),
            "max_running_requests": max_running,
            "context_length": bytelevel::MAX_POSITION_EMBEDDINGS,
        });
        let scheduler_info = json!({ "max_running_requests": max_running });
        let as_struct = |v: serde_json::Value| match v {
            serde_json::Value::Object(map) => Some(view::object_to_struct(&map)),
            _ => None,
        };
        let stats = s.controls.stats();
        Ok(Response::new(GetServerInfoResponse {
            server_args: as_struct(server_args),
            scheduler_info: as_struct(scheduler_info),
            active_requests: i32::try_from(stats.inflight).unwrap_or(i32::MAX),
            uptime_seconds: self.uptime_seconds(),
            sglang_version: "mock".to_owned(),
            server_type: "grpc".to_owned(),
            max_total_num_tokens: 1 << 20,
            ..Default::default()
        }))
    }

    async fn get_tokenizer(
        &self,
        _request: Request<GetTokenizerRequest>,
    ) -> Result<Response<Self::GetTokenizerStream>, Status> {
        let chunks: Vec<_> = bundle::chunks(
            &self.tokenizer_zip,
            &self.tokenizer_sha256,
            TOKENIZER_CHUNK_BYTES,
        )
        .map(|(data, sha256)| {
            Ok(GetTokenizerChunk {
                data: data.to_vec(),
                sha256: sha256.to_owned(),
            })
        })
        .collect();
        Ok(Response::new(futures_util::stream::iter(chunks).boxed()))
    }
}
