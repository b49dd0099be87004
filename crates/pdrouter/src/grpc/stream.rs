//! `Generate` streams of every runtime, read in SGLang's form, that abort themselves.
//!
//! Invariants: a [`LegStream`] that is dropped before its stream ended (or before the
//! `Complete` of its last sample) sends `Abort` for its request id, so a client disconnect or
//! a failed sibling leg never leaves a generation running on a worker; [`Legs`] holds the
//! streams of one leg (one per prompt) and drops them together; a vLLM answer's connector
//! parameters (on its `Complete`) are kept for whoever reads the leg
//! ([`Legs::take_kv_params`]).

use futures_util::StreamExt as _;
use pdrouter_proto::scheduler::sglang_scheduler_client::SglangSchedulerClient;
use pdrouter_proto::scheduler::{AbortRequest, GenerateResponse};
use pdrouter_proto::tokenspeed_scheduler as ts;
use pdrouter_proto::tokenspeed_scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use pdrouter_proto::vllm_engine as vl;
use pdrouter_proto::vllm_engine::vllm_engine_client::VllmEngineClient;
use tonic::Status;
use tonic::transport::Channel;

use super::replies::Replies;
use super::runtime::{self, Runtime};

/// `authorization` metadata value.
pub(super) type Auth = tonic::metadata::MetadataValue<tonic::metadata::Ascii>;

/// `r` with the worker's credential, when it has one.
pub(super) fn with_auth<T>(mut r: tonic::Request<T>, auth: Option<&Auth>) -> tonic::Request<T> {
    if let Some(a) = auth {
        r.metadata_mut().insert("authorization", a.clone());
    }
    r
}

/// Bound on an `Abort` sent from a drop.
const ABORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Sends `Abort` for `request_id` on drop, unless disarmed (`channel` taken).
pub(super) struct AbortOnDrop {
    channel: Option<Channel>,
    runtime: Runtime,
    request_id: String,
    auth: Option<Auth>,
}

impl AbortOnDrop {
    /// An armed abort of `request_id` on `channel`.
    pub(super) fn new(
        channel: Channel,
        runtime: Runtime,
        request_id: String,
        auth: Option<Auth>,
    ) -> Self {
        AbortOnDrop {
            channel: Some(channel),
            runtime,
            request_id,
            auth,
        }
    }

    /// Moves the armed abort out, leaving this one disarmed.
    pub(super) fn disarm_into(&mut self) -> AbortOnDrop {
        AbortOnDrop {
            channel: self.channel.take(),
            runtime: self.runtime,
            request_id: std::mem::take(&mut self.request_id),
            auth: self.auth.take(),
        }
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        let Some(channel) = self.channel.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let request_id = std::mem::take(&mut self.request_id);
        let auth = self.auth.take();
        let runtime = self.runtime;
        let reason = "client went away or the other leg failed".to_owned();
        rt.spawn(async move {
            match runtime {
                Runtime::Sglang => {
                    let req = with_auth(
                        tonic::Request::new(AbortRequest { request_id, reason }),
                        auth.as_ref(),
                    );
                    let mut c = SglangSchedulerClient::new(channel);
                    let _ = tokio::time::timeout(ABORT_TIMEOUT, c.abort(req)).await;
                }
                Runtime::TokenSpeed => {
                    let req = with_auth(
                        tonic::Request::new(ts::AbortRequest { request_id, reason }),
                        auth.as_ref(),
                    );
                    let mut c = TokenSpeedSchedulerClient::new(channel);
                    let _ = tokio::time::timeout(ABORT_TIMEOUT, c.abort(req)).await;
                }
                Runtime::Vllm => {
                    let msg = vl::AbortRequest {
                        request_ids: vec![request_id],
                    };
                    let req = with_auth(tonic::Request::new(msg), auth.as_ref());
                    let mut c = VllmEngineClient::new(channel);
                    let _ = tokio::time::timeout(ABORT_TIMEOUT, c.abort(req)).await;
                }
            }
        });
    }
}

/// A `Generate` response stream of any runtime.
pub(super) enum Inner {
    Sglang(Replies<GenerateResponse>),
    TokenSpeed(Replies<ts::GenerateResponse>),
    /// vLLM's, with the position prompt logprobs are wanted from.
    Vllm(Replies<vl::GenerateResponse>, usize),
}

/// A running `Generate` stream. Dropping it before [`LegStream::next`] returned `None` (or an
/// error) sends `Abort` for its request.
pub struct LegStream {
    stream: Inner,
    /// Samples whose `Complete` has not come yet.
    completes_left: u32,
    abort: AbortOnDrop,
    /// vLLM: the connector parameters the last `Complete` carried.
    kv_params: Option<String>,
}

impl std::fmt::Debug for LegStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LegStream")
            .field("request_id", &self.abort.request_id)
            .finish()
    }
}

impl LegStream {
    /// A started stream of `samples` samples, aborted by `abort` when dropped unfinished.
    pub(super) fn new(stream: Inner, samples: u32, abort: AbortOnDrop) -> Self {
        LegStream {
            stream,
            completes_left: samples,
            abort,
            kv_params: None,
        }
    }

    /// The next message; `None` at the stream's end. The end, the last sample's `Complete`
    /// and any error disarm the abort (there is nothing left running to abort).
    pub async fn next(&mut self) -> Result<Option<GenerateResponse>, Status> {
        std::future::poll_fn(|cx| self.poll_message(cx))
            .await
            .transpose()
    }

    /// [`LegStream::next`] as a poll (`None` at the end), so [`Legs`] reads the streams in
    /// place instead of moving each one through a future per message.
    fn poll_message(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<GenerateResponse, Status>>> {
        use futures_util::Stream as _;
        use pdrouter_proto::scheduler::generate_response::Response;
        let r = match &mut self.stream {
            Inner::Sglang(s) => std::task::ready!(std::pin::Pin::new(s).poll_next(cx)),
            Inner::TokenSpeed(s) => std::task::ready!(std::pin::Pin::new(s).poll_next(cx))
                .map(|m| m.map(runtime::response_from_tokenspeed)),
            Inner::Vllm(s, from) => {
                let from = *from;
                let id = &self.abort.request_id;
                std::task::ready!(std::pin::Pin::new(s).poll_next(cx)).map(|m| {
                    m.map(|m| {
                        let (m, kv) = super::vllm::response_from_vllm(m, id, from);
                        if kv.is_some() {
                            self.kv_params = kv;
                        }
                        m
                    })
                })
            }
        };
        let finished = match &r {
            Some(Ok(m)) => match m.response {
                Some(Response::Complete(_)) => {
                    self.completes_left = self.completes_left.saturating_sub(1);
                    self.completes_left == 0
                }
                Some(Response::Error(_)) => true,
                _ => false,
            },
            _ => true,
        };
        if finished {
            self.abort.channel = None;
        }
        std::task::Poll::Ready(r)
    }
}

/// One stream of a [`Legs`], tagged with its position; it ends after an error.
struct Tagged {
    index: usize,
    leg: LegStream,
    failed: bool,
}

impl futures_util::Stream for Tagged {
    type Item = Result<(usize, GenerateResponse), Status>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.failed {
            return std::task::Poll::Ready(None);
        }
        let r = std::task::ready!(this.leg.poll_message(cx));
        // Nothing follows an error.
        this.failed = matches!(r, Some(Err(_)));
        let index = this.index;
        std::task::Poll::Ready(r.map(|r| r.map(|m| (index, m))))
    }
}

/// The `Generate` streams of one leg of a request (one per prompt of a batch), read as one:
/// each message is tagged with the position of the stream it came from. Dropping it drops
/// every stream still running, which aborts them.
pub struct Legs {
    streams: Streams,
    /// vLLM: the connector parameters of a single prompt's `Complete`, once read.
    kv_params: Option<String>,
}

/// One stream (a single prompt, the usual case) is read directly; several through a
/// `SelectAll`, whose task bookkeeping one stream does not need.
enum Streams {
    One(Option<Box<Tagged>>),
    Many(futures_util::stream::SelectAll<Tagged>),
}

impl std::fmt::Debug for Legs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let running = match &self.streams {
            Streams::One(one) => usize::from(one.is_some()),
            Streams::Many(set) => set.len(),
        };
        f.debug_struct("Legs").field("running", &running).finish()
    }
}

impl Legs {
    /// A leg of one prompt's stream.
    pub(super) fn one(leg: LegStream) -> Self {
        Self {
            streams: Streams::One(Some(Box::new(Tagged {
                index: 0,
                leg,
                failed: false,
            }))),
            kv_params: None,
        }
    }

    /// A leg of several prompts' streams, in prompt order.
    pub(super) fn many(streams: Vec<LegStream>) -> Self {
        let set = streams
            .into_iter()
            .enumerate()
            .map(|(index, leg)| Tagged {
                index,
                leg,
                failed: false,
            })
            .collect();
        Self {
            streams: Streams::Many(set),
            kv_params: None,
        }
    }

    /// The connector parameters a vLLM worker's `Complete` carried (one prompt's leg), once
    /// the leg has been read that far.
    pub fn take_kv_params(&mut self) -> Option<String> {
        self.kv_params.take()
    }

    /// The next message of any stream, with its stream's position; `None` once all ended.
    pub async fn next(&mut self) -> Result<Option<(usize, GenerateResponse)>, Status> {
        match &mut self.streams {
            Streams::One(slot) => {
                let Some(one) = slot else {
                    return Ok(None);
                };
                let r = one.next().await;
                if let Some(kv) = one.leg.kv_params.take() {
                    self.kv_params = Some(kv);
                }
                if r.is_none() {
                    // Ended: dropped now, as `SelectAll` drops an ended stream.
                    *slot = None;
                }
                r.transpose()
            }
            Streams::Many(set) => set.next().await.transpose(),
        }
    }
}
