//! A gRPC worker's client: a tonic channel for every call but `Generate`, and the HTTP/2
//! lanes `Generate` streams are started on (see [`super::lane`]; the streams themselves are
//! [`super::stream`]'s).
//!
//! Invariants: a worker's channel and lanes connect on first use and are reused by every
//! call after it (HTTP/2 multiplexes the streams); a `Generate` whose prompt exceeds
//! [`super::bulk::BULK_PROMPT_BYTES`] goes on a second lane of its own (the *bulk lane*): on
//! one connection, the hundreds of kilobytes of a long prompt would sit in front of every
//! small request's frames, in the TCP stream and in the connection's flow control window,
//! until the worker had read them. The bulk lane's connection runs on its own thread (see
//! [`super::bulk`]) and its messages are encoded before they are sent, on the encoding
//! thread (see [`super::encoded`]), so long prompts are encoded and written off the async
//! workers; the worker's runtime is learned by asking each known service's `HealthCheck`
//! (the configured hint first) and cached on the channel until a call finds the service
//! gone (`Unimplemented`), which forgets it; a `Generate` dropped while it is still starting
//! sends `Abort` for its request id, as its stream does once started; a vLLM worker's KV
//! configuration is asked once ([`WorkerChannel::vllm_kv`]) and kept for the channel's life.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use pdrouter_proto::common::GetTokenizerRequest;
use pdrouter_proto::scheduler::sglang_scheduler_client::SglangSchedulerClient;
use pdrouter_proto::scheduler::{
    GetModelInfoRequest, GetModelInfoResponse, GetServerInfoRequest, GetServerInfoResponse,
    HealthCheckRequest,
};
use pdrouter_proto::tokenspeed_scheduler as ts;
use pdrouter_proto::tokenspeed_scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use pdrouter_proto::vllm_engine as vl;
use pdrouter_proto::vllm_engine::vllm_engine_client::VllmEngineClient;
use pdrouter_tokenizer::bundle;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::encoded::SharedEncoding;
use super::lane::{self, Lane, Message};
use super::replies::Replies;
use super::runtime::{self, Call, Runtime};
use super::stream::{AbortOnDrop, Auth, Inner, with_auth};
pub use super::stream::{LegStream, Legs};
use super::vllm::{self, VllmKv};

/// HTTP/2 keep-alive ping period on worker channels.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// Longest a TCP connect to a worker may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on learning the runtime of a worker before a `Generate` (normally already known
/// from its health checks).
const DETECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest message accepted from a worker.
const MESSAGE_LIMIT: usize = 64 << 20;

/// A gRPC worker's client, connected lazily and shared by every request to it.
#[derive(Debug)]
pub struct WorkerChannel {
    /// `http://host:port` for tonic.
    endpoint: String,
    /// `authorization: Bearer KEY` sent with every call, when the worker has a key.
    auth: Option<Auth>,
    /// The runtime to ask first.
    hint: Option<Runtime>,
    /// The learned runtime: 0 unknown, else 1 + its index in [`Runtime::ALL`].
    runtime: AtomicU8,
    channel: OnceLock<Result<Channel, String>>,
    /// `Generate`'s lane, and the bulk lane: a second connection for long prompts.
    lanes: Result<[Lane; 2], String>,
    /// [`WorkerChannel::auth`] as a header for the lanes.
    auth_header: Option<http::HeaderValue>,
    /// A vLLM worker's KV configuration, once asked.
    vllm_kv: tokio::sync::OnceCell<VllmKv>,
}

impl WorkerChannel {
    /// A channel to `grpc://host:port` (already validated), sending `api_key` as a bearer
    /// token, asking `hint`'s service first; nothing connects yet. A key that cannot be a
    /// header value is not sent (the registry's key validation refuses those first).
    pub fn new(grpc_url: &str, api_key: Option<&str>, hint: Option<Runtime>) -> Self {
        let rest = grpc_url.strip_prefix("grpc://").unwrap_or(grpc_url);
        let bearer = api_key.map(|k| format!("Bearer {k}"));
        Self {
            endpoint: format!("http://{rest}"),
            auth: bearer.as_ref().and_then(|b| b.parse().ok()),
            auth_header: bearer.and_then(|b| http::HeaderValue::try_from(b).ok()),
            lanes: Lane::new(rest, false).and_then(|l| Ok([l, Lane::new(rest, true)?])),
            hint,
            runtime: AtomicU8::new(0),
            channel: OnceLock::new(),
            vllm_kv: tokio::sync::OnceCell::new(),
        }
    }

    /// `msg` as a call with the worker's credential.
    pub(crate) fn call<T>(&self, msg: T) -> tonic::Request<T> {
        with_auth(tonic::Request::new(msg), self.auth.as_ref())
    }

    /// The shared channel; the first call builds it (must run on a tokio runtime).
    fn channel(&self) -> Result<Channel, Status> {
        let built = self.channel.get_or_init(|| {
            Endpoint::from_shared(self.endpoint.clone())
                .map(|e| {
                    e.tcp_nodelay(true)
                        .connect_timeout(CONNECT_TIMEOUT)
                        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
                        .keep_alive_timeout(lane::KEEP_ALIVE_TIMEOUT)
                        .keep_alive_while_idle(true)
                        .http2_adaptive_window(true)
                        .http2_max_concurrent_reset_streams(lane::RESET_STREAMS)
                        .http2_reset_stream_duration(lane::RESET_STREAM_DURATION)
                        // See the lanes' builder: a count over the connection's life.
                        .http2_max_local_error_reset_streams(None)
                        .connect_lazy()
                })
                .map_err(|e| e.to_string())
        });
        built
            .clone()
            .map_err(|e| Status::invalid_argument(format!("bad worker endpoint: {e}")))
    }

    /// The lane for a `Generate`: the bulk lane or the shared one.
    fn lane(&self, bulk: bool) -> Result<&Lane, Status> {
        match &self.lanes {
            Ok([shared, long]) => Ok(if bulk { long } else { shared }),
            Err(e) => Err(Status::invalid_argument(format!(
                "bad worker endpoint: {e}"
            ))),
        }
    }

    fn sglang(&self) -> Result<SglangSchedulerClient<Channel>, Status> {
        Ok(sglang_on(self.channel()?))
    }

    fn tokenspeed(&self) -> Result<TokenSpeedSchedulerClient<Channel>, Status> {
        Ok(tokenspeed_on(self.channel()?))
    }

    fn vllm(&self) -> Result<VllmEngineClient<Channel>, Status> {
        Ok(vllm_on(self.channel()?))
    }

    /// The worker's runtime, once a `HealthCheck` has told it.
    pub fn runtime(&self) -> Option<Runtime> {
        let i = self.runtime.load(Ordering::Acquire);
        Runtime::ALL.get(usize::from(i).checked_sub(1)?).copied()
    }

    fn learn(&self, r: Option<Runtime>) {
        let i = r.and_then(|r| Runtime::ALL.iter().position(|&x| x == r));
        self.runtime
            .store(i.map_or(0, |i| i as u8 + 1), Ordering::Release);
    }

    /// Forgets the runtime when `status` says its service is gone, so the next health check
    /// asks every service again.
    fn check<T>(&self, r: Result<T, Status>) -> Result<T, Status> {
        if let Err(s) = &r
            && s.code() == Code::Unimplemented
        {
            self.learn(None);
        }
        r
    }

    /// One runtime's `HealthCheck`.
    async fn health_of(&self, rt: Runtime, timeout: Duration) -> Result<bool, Status> {
        // Each runtime's client and message; the answer is `healthy` in all three.
        let healthy = match rt {
            Runtime::Sglang => {
                let mut c = self.sglang()?;
                health_within(timeout, c.health_check(self.call(HealthCheckRequest {})))
                    .await?
                    .healthy
            }
            Runtime::TokenSpeed => {
                let mut c = self.tokenspeed()?;
                health_within(
                    timeout,
                    c.health_check(self.call(ts::HealthCheckRequest {})),
                )
                .await?
                .healthy
            }
            Runtime::Vllm => {
                let mut c = self.vllm()?;
                health_within(
                    timeout,
                    c.health_check(self.call(vl::HealthCheckRequest {})),
                )
                .await?
                .healthy
            }
        };
        Ok(healthy)
    }

    /// `HealthCheck` of the known runtime, or of each known service in turn (the hint first)
    /// until one answers: that one is the worker's runtime. A service that is not there
    /// answers `Unimplemented`; any other failure ends the search (the worker is down).
    pub async fn health(&self, timeout: Duration) -> Result<(Runtime, bool), Status> {
        if let Some(rt) = self.runtime() {
            let healthy = self.check(self.health_of(rt, timeout).await)?;
            return Ok((rt, healthy));
        }
        for rt in Runtime::detection_order(self.hint) {
            match self.health_of(rt, timeout).await {
                Ok(healthy) => {
                    self.learn(Some(rt));
                    return Ok((rt, healthy));
                }
                Err(s) if s.code() == Code::Unimplemented => continue,
                Err(s) => return Err(s),
            }
        }
        Err(Status::unimplemented(
            "the worker serves none of the known engine services (SGLang, TokenSpeed, vLLM)",
        ))
    }

    /// `HealthCheck`: whether the worker says it is healthy, within `timeout`.
    pub async fn healthy(&self, timeout: Duration) -> bool {
        matches!(self.health(timeout).await, Ok((_, true)))
    }

    /// The standard health service's `Check` for the whole server: whether it is `SERVING`
    /// within `timeout` (how encode workers, which have no scheduler service, are checked).
    pub async fn serving(&self, timeout: Duration) -> bool {
        use pdrouter_proto::grpc::health::v1::HealthCheckRequest as Check;
        use pdrouter_proto::grpc::health::v1::health_check_response::ServingStatus;
        use pdrouter_proto::grpc::health::v1::health_client::HealthClient;
        let Ok(channel) = self.channel() else {
            return false;
        };
        let mut c = HealthClient::new(channel);
        let call = c.check(self.call(Check::default()));
        matches!(
            tokio::time::timeout(timeout, call).await,
            Ok(Ok(r)) if r.get_ref().status == ServingStatus::Serving as i32
        )
    }

    /// TokenSpeed's encoder `Encode` (EPD): whether the worker accepted the item, within
    /// `timeout`.
    pub async fn encode(
        &self,
        req: pdrouter_proto::tokenspeed_encoder::EncodeRequest,
        timeout: Duration,
    ) -> Result<bool, Status> {
        use pdrouter_proto::tokenspeed_encoder::token_speed_encoder_client::TokenSpeedEncoderClient;
        let mut c = TokenSpeedEncoderClient::new(self.channel()?);
        let mut req = self.call(req);
        crate::telemetry::propagate_to_grpc(req.metadata_mut());
        match tokio::time::timeout(timeout, c.encode(req)).await {
            Ok(r) => Ok(r?.get_ref().accepted),
            Err(_) => Err(Status::deadline_exceeded("Encode did not answer in time")),
        }
    }

    /// The worker's runtime, asking its services when it is not known yet.
    pub async fn detect(&self, timeout: Duration) -> Result<Runtime, Status> {
        match self.runtime() {
            Some(rt) => Ok(rt),
            None => self.health(timeout).await.map(|(rt, _)| rt),
        }
    }

    /// `GetModelInfo` in SGLang's form, within `timeout`.
    pub async fn fetch_model_info(
        &self,
        timeout: Duration,
    ) -> Result<GetModelInfoResponse, Status> {
        let late = |_| Status::deadline_exceeded("GetModelInfo did not answer in time");
        let work = async {
            let r = match self.detect(timeout).await? {
                Runtime::Sglang => self
                    .sglang()?
                    .get_model_info(self.call(GetModelInfoRequest {}))
                    .await
                    .map(|r| r.into_inner()),
                Runtime::TokenSpeed => self
                    .tokenspeed()?
                    .get_model_info(self.call(ts::GetModelInfoRequest {}))
                    .await
                    .map(|r| runtime::model_info_from_tokenspeed(r.into_inner())),
                Runtime::Vllm => self
                    .vllm()?
                    .get_model_info(self.call(vl::GetModelInfoRequest {}))
                    .await
                    .map(|r| vllm::model_info_from_vllm(r.into_inner())),
            };
            self.check(r)
        };
        tokio::time::timeout(timeout, work).await.map_err(late)?
    }

    /// `GetModelInfo`, within `timeout`; `None` on any failure.
    pub async fn model_info(&self, timeout: Duration) -> Option<GetModelInfoResponse> {
        self.fetch_model_info(timeout).await.ok()
    }

    /// `GetServerInfo` in SGLang's form, within `timeout`.
    pub async fn fetch_server_info(
        &self,
        timeout: Duration,
    ) -> Result<GetServerInfoResponse, Status> {
        let late = |_| Status::deadline_exceeded("GetServerInfo did not answer in time");
        let work = async {
            let r = match self.detect(timeout).await? {
                Runtime::Sglang => self
                    .sglang()?
                    .get_server_info(self.call(GetServerInfoRequest {}))
                    .await
                    .map(|r| r.into_inner()),
                Runtime::TokenSpeed => self
                    .tokenspeed()?
                    .get_server_info(self.call(ts::GetServerInfoRequest {}))
                    .await
                    .map(|r| runtime::server_info_from_tokenspeed(r.into_inner())),
                Runtime::Vllm => self
                    .vllm()?
                    .get_server_info(self.call(vl::GetServerInfoRequest {}))
                    .await
                    .map(|r| vllm::server_info_from_vllm(r.into_inner())),
            };
            self.check(r)
        };
        tokio::time::timeout(timeout, work).await.map_err(late)?
    }

    /// `GetServerInfo`'s `dp_size` (a number in the server arguments), within `timeout`.
    pub async fn dp_size(&self, timeout: Duration) -> Option<u32> {
        use pdrouter_proto::prost_types::value::Kind;
        let info = self.fetch_server_info(timeout).await.ok()?;
        match info.server_args?.fields.get("dp_size")?.kind {
            Some(Kind::NumberValue(n))
                if n >= 1.0 && n <= f64::from(u32::MAX) && n.fract() == 0.0 =>
            {
                Some(n as u32)
            }
            _ => None,
        }
    }

    /// A vLLM worker's KV configuration from its `GetServerInfo`, asked once within `timeout`
    /// (a failed ask is not kept: the next call asks again).
    pub async fn vllm_kv(&self, timeout: Duration) -> Result<&VllmKv, Status> {
        self.vllm_kv
            .get_or_try_init(|| async {
                let info = self.fetch_server_info(timeout).await?;
                Ok(VllmKv::of(&info))
            })
            .await
    }

    /// The KV configuration, if it has been learned.
    pub fn known_vllm_kv(&self) -> Option<&VllmKv> {
        self.vllm_kv.get()
    }

    /// `GetTokenizer`: receives the bundle (size-limited, checksum verified) and extracts it
    /// into a fresh private directory under `dest_parent`.
    pub async fn fetch_tokenizer(
        &self,
        timeout: Duration,
        dest_parent: &std::path::Path,
    ) -> Result<bundle::Unpacked, String> {
        let fetch = async {
            let started = match self
                .detect(timeout)
                .await
                .map_err(|s| s.message().to_owned())?
            {
                Runtime::Sglang => {
                    let mut c = self.sglang().map_err(|s| s.message().to_owned())?;
                    c.get_tokenizer(self.call(GetTokenizerRequest {})).await
                }
                Runtime::TokenSpeed => {
                    let mut c = self.tokenspeed().map_err(|s| s.message().to_owned())?;
                    c.get_tokenizer(self.call(GetTokenizerRequest {})).await
                }
                Runtime::Vllm => {
                    let mut c = self.vllm().map_err(|s| s.message().to_owned())?;
                    c.get_tokenizer(self.call(GetTokenizerRequest {})).await
                }
            };
            let mut stream = started
                .map_err(|s| format!("GetTokenizer failed: {}", s.message()))?
                .into_inner();
            let mut receiver = bundle::Receiver::new(bundle::Limits::default());
            while let Some(chunk) = stream
                .message()
                .await
                .map_err(|s| format!("GetTokenizer stream failed: {}", s.message()))?
            {
                receiver
                    .push(&chunk.data, &chunk.sha256)
                    .map_err(|e| e.to_string())?;
            }
            Ok::<_, String>(receiver)
        };
        let receiver = tokio::time::timeout(timeout, fetch)
            .await
            .map_err(|_| "GetTokenizer did not finish in time".to_owned())??;
        let dest = dest_parent.to_owned();
        tokio::task::spawn_blocking(move || receiver.finish(&dest).map_err(|e| e.to_string()))
            .await
            .map_err(|e| e.to_string())?
    }

    /// A `Generate` call's own headers: the worker's credential and the trace context.
    fn generate_headers(&self) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        if let Some(a) = &self.auth_header {
            headers.insert(http::header::AUTHORIZATION, a.clone());
        }
        crate::telemetry::propagate_to_worker(&mut headers);
        headers
    }

    /// Starts `Generate` on the bulk lane: the message encoded on the encoding thread (or
    /// taken from the sibling leg that encoded it), then sent as those bytes.
    async fn generate_bulk(
        &self,
        rt: Runtime,
        mut call: Call,
        from: usize,
    ) -> Result<Inner, Status> {
        let shared = call.shared.take().unwrap_or_default();
        let (lane, headers) = (self.lane(true)?, self.generate_headers());
        Ok(match rt {
            Runtime::Sglang => {
                let bytes = shared.encode(rt, call.into_sglang()).await?;
                Inner::Sglang(
                    self.check(
                        lane.generate(rt, headers, Message::Encoded(bytes), MESSAGE_LIMIT)
                            .await,
                    )?,
                )
            }
            Runtime::TokenSpeed => {
                let bytes = shared.encode(rt, call.into_tokenspeed()).await?;
                Inner::TokenSpeed(
                    self.check(
                        lane.generate(rt, headers, Message::Encoded(bytes), MESSAGE_LIMIT)
                            .await,
                    )?,
                )
            }
            Runtime::Vllm => {
                let bytes = shared.encode(rt, call.into_vllm()).await?;
                Inner::Vllm(
                    self.check(
                        lane.generate(rt, headers, Message::Encoded(bytes), MESSAGE_LIMIT)
                            .await,
                    )?,
                    from,
                )
            }
        })
    }

    /// Starts `Generate` on the shared lane, the message encoded where the call runs.
    async fn generate_small<R>(&self, rt: Runtime, msg: Message) -> Result<Replies<R>, Status> {
        let lane = self.lane(false)?;
        self.check(
            lane.generate(rt, self.generate_headers(), msg, MESSAGE_LIMIT)
                .await,
        )
    }

    /// Starts `Generate` in the worker's runtime. The returned stream aborts the request if
    /// dropped before its end; so does a call dropped while it is still starting.
    pub async fn generate(&self, mut call: Call) -> Result<LegStream, Status> {
        let rt = match self.runtime() {
            Some(rt) => rt,
            // Boxed: asking the services is rare (health checks learn the runtime first),
            // and inline its calls' state would triple the size of every call's future.
            None => Box::pin(self.detect(DETECT_TIMEOUT)).await?,
        };
        let mut guard = AbortOnDrop::new(
            self.channel()?,
            rt,
            call.request_id().to_owned(),
            self.auth.clone(),
        );
        let samples = call.samples();
        // vLLM sends prompt logprobs from the prompt's start; the stream cuts them.
        let from = usize::try_from(call.req.logprob_start_len).unwrap_or(0);
        let stream = if call.on_bulk_lane() {
            // Boxed: the encoding's wait would otherwise sit in every call's future.
            Box::pin(self.generate_bulk(rt, call, from)).await?
        } else {
            let shared = call.shared.take();
            match rt {
                Runtime::Sglang => {
                    let msg = Message::Framed(SharedEncoding::framed(shared.as_ref(), rt, || {
                        call.into_sglang()
                    }));
                    Inner::Sglang(self.generate_small(rt, msg).await?)
                }
                Runtime::TokenSpeed => {
                    let msg = Message::Framed(SharedEncoding::framed(shared.as_ref(), rt, || {
                        call.into_tokenspeed()
                    }));
                    Inner::TokenSpeed(self.generate_small(rt, msg).await?)
                }
                Runtime::Vllm => {
                    let msg = Message::Framed(SharedEncoding::framed(shared.as_ref(), rt, || {
                        call.into_vllm()
                    }));
                    Inner::Vllm(self.generate_small(rt, msg).await?, from)
                }
            }
        };
        Ok(LegStream::new(stream, samples, guard.disarm_into()))
    }
}

/// A `HealthCheck` call's answer, within `timeout`.
async fn health_within<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, Status> {
    match tokio::time::timeout(timeout, call).await {
        Ok(r) => Ok(r?.into_inner()),
        Err(_) => Err(Status::deadline_exceeded(
            "HealthCheck did not answer in time",
        )),
    }
}

fn sglang_on(channel: Channel) -> SglangSchedulerClient<Channel> {
    SglangSchedulerClient::new(channel).max_decoding_message_size(MESSAGE_LIMIT)
}

fn tokenspeed_on(channel: Channel) -> TokenSpeedSchedulerClient<Channel> {
    TokenSpeedSchedulerClient::new(channel).max_decoding_message_size(MESSAGE_LIMIT)
}

fn vllm_on(channel: Channel) -> VllmEngineClient<Channel> {
    VllmEngineClient::new(channel).max_decoding_message_size(MESSAGE_LIMIT)
}

impl Legs {
    /// Starts one `Generate` per call on `channel`, all at once. If one fails to start,
    /// the ones already started are dropped (aborted) and its status is returned.
    pub async fn start(channel: &WorkerChannel, mut calls: Vec<Call>) -> Result<Self, Status> {
        if calls.len() == 1
            && let Some(call) = calls.pop()
        {
            // No join to set up. The call's future is large (tonic's state): boxed, it stays
            // out of every future that awaits this one.
            return Ok(Legs::one(Box::pin(channel.generate(call)).await?));
        }
        let streams =
            futures_util::future::try_join_all(calls.into_iter().map(|c| channel.generate(c)))
                .await?;
        Ok(Legs::many(streams))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `Generate` call holds this future until its stream starts, and it is moved while
    /// being set up: a path that keeps a second call's state inline would grow it, and the
    /// copying of it for every call, as the long-prompt path did before it was boxed.
    #[tokio::test]
    async fn the_generate_future_stays_small() {
        let channel = WorkerChannel::new("grpc://127.0.0.1:1", None, None);
        let call = Call {
            req: Default::default(),
            unset: std::sync::Arc::from(&[][..]),
            dp_rank: None,
            kv: None,
            images: Default::default(),
            shared: None,
            kv_params: None,
            seed: None,
        };
        let size = std::mem::size_of_val(&channel.generate(call));
        eprintln!("generate future: {size} bytes");
        assert!(
            size <= GENERATE_FUTURE_BUDGET,
            "generate future grew to {size} bytes"
        );
    }

    /// The `Generate` future's bound: 3,424 bytes in a debug build when written; with the
    /// runtime's detection inline, 4,912.
    const GENERATE_FUTURE_BUDGET: usize = 4_096;

    #[test]
    fn calls_carry_the_workers_key() {
        let ch = WorkerChannel::new("grpc://h:1", Some("k1"), None);
        assert_eq!(ch.endpoint, "http://h:1");
        let r = ch.call(HealthCheckRequest {});
        assert_eq!(r.metadata().get("authorization").unwrap(), "Bearer k1");
        let plain = WorkerChannel::new("grpc://h:1", None, None);
        assert!(plain.call(()).metadata().get("authorization").is_none());
    }
}
