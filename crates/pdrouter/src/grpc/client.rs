//! One tonic channel per gRPC worker, and `Generate` streams that abort themselves.
//!
//! Invariants: a worker's channel is created on first use and reused by every call after it
//! (HTTP/2 multiplexes the streams); a [`LegStream`] that is dropped before its stream ended
//! (or before the `Complete` of its last sample) sends `Abort` for its request id, so a client
//! disconnect or a failed sibling leg never leaves a generation running on a worker; [`Legs`]
//! holds the streams of one leg (one per prompt) and drops them together.

use std::sync::OnceLock;
use std::time::Duration;

use futures_util::StreamExt as _;
use pdrouter_proto::common::GetTokenizerRequest;
use pdrouter_proto::scheduler::sglang_scheduler_client::SglangSchedulerClient;
use pdrouter_proto::scheduler::{
    AbortRequest, GenerateRequest, GenerateResponse, GetModelInfoRequest, GetModelInfoResponse,
    HealthCheckRequest,
};
use pdrouter_tokenizer::bundle;
use tonic::transport::{Channel, Endpoint};
use tonic::{Status, Streaming};

/// HTTP/2 keep-alive ping period on worker channels.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a keep-alive ping may go unanswered before the connection is dropped.
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a TCP connect to a worker may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on an `Abort` sent from a drop.
const ABORT_TIMEOUT: Duration = Duration::from_secs(5);

/// A gRPC worker's client, connected lazily and shared by every request to it.
#[derive(Debug)]
pub struct WorkerChannel {
    /// `http://host:port` for tonic.
    endpoint: String,
    /// `authorization: Bearer KEY` sent with every call, when the worker has a key.
    auth: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    client: OnceLock<Result<SglangSchedulerClient<Channel>, String>>,
}

impl WorkerChannel {
    /// A channel to `grpc://host:port` (already validated), sending `api_key` as a bearer
    /// token; nothing connects yet. A key that cannot be a header value is not sent (the
    /// registry's key validation refuses those first).
    pub fn new(grpc_url: &str, api_key: Option<&str>) -> Self {
        let rest = grpc_url.strip_prefix("grpc://").unwrap_or(grpc_url);
        Self {
            endpoint: format!("http://{rest}"),
            auth: api_key.and_then(|k| format!("Bearer {k}").parse().ok()),
            client: OnceLock::new(),
        }
    }

    /// `msg` as a call with the worker's credential.
    pub(crate) fn call<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Some(a) = &self.auth {
            r.metadata_mut().insert("authorization", a.clone());
        }
        r
    }

    /// The shared client; the first call builds the channel (must run on a tokio runtime).
    pub fn client(&self) -> Result<SglangSchedulerClient<Channel>, Status> {
        let built = self.client.get_or_init(|| {
            Endpoint::from_shared(self.endpoint.clone())
                .map(|e| {
                    let channel = e
                        .tcp_nodelay(true)
                        .connect_timeout(CONNECT_TIMEOUT)
                        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
                        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
                        .keep_alive_while_idle(true)
                        .http2_adaptive_window(true)
                        .connect_lazy();
                    SglangSchedulerClient::new(channel).max_decoding_message_size(64 << 20)
                })
                .map_err(|e| e.to_string())
        });
        built
            .clone()
            .map_err(|e| Status::invalid_argument(format!("bad worker endpoint: {e}")))
    }

    /// `HealthCheck`: whether the worker says it is healthy, within `timeout`.
    pub async fn healthy(&self, timeout: Duration) -> bool {
        let Ok(mut c) = self.client() else {
            return false;
        };
        matches!(
            tokio::time::timeout(timeout, c.health_check(self.call(HealthCheckRequest {}))).await,
            Ok(Ok(r)) if r.get_ref().healthy
        )
    }

    /// `GetModelInfo`, within `timeout`.
    pub async fn model_info(&self, timeout: Duration) -> Option<GetModelInfoResponse> {
        let mut c = self.client().ok()?;
        match tokio::time::timeout(timeout, c.get_model_info(self.call(GetModelInfoRequest {})))
            .await
        {
            Ok(Ok(r)) => Some(r.into_inner()),
            _ => None,
        }
    }

    /// `GetServerInfo`'s `dp_size` (a number in the server arguments), within `timeout`.
    pub async fn dp_size(&self, timeout: Duration) -> Option<u32> {
        use pdrouter_proto::prost_types::value::Kind;
        use pdrouter_proto::scheduler::GetServerInfoRequest;
        let mut c = self.client().ok()?;
        let info = match tokio::time::timeout(
            timeout,
            c.get_server_info(self.call(GetServerInfoRequest {})),
        )
        .await
        {
            Ok(Ok(r)) => r.into_inner(),
            _ => return None,
        };
        match info.server_args?.fields.get("dp_size")?.kind {
            Some(Kind::NumberValue(n))
                if n >= 1.0 && n <= f64::from(u32::MAX) && n.fract() == 0.0 =>
            {
                Some(n as u32)
            }
            _ => None,
        }
    }

    /// `GetTokenizer`: receives the bundle (size-limited, checksum verified) and extracts it
    /// into a fresh private directory under `dest_parent`.
    pub async fn fetch_tokenizer(
        &self,
        timeout: Duration,
        dest_parent: &std::path::Path,
    ) -> Result<bundle::Unpacked, String> {
        let fetch = async {
            let mut c = self.client().map_err(|s| s.message().to_owned())?;
            let mut stream = c
                .get_tokenizer(self.call(GetTokenizerRequest {}))
                .await
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

    /// Starts `Generate`. The returned stream aborts the request if dropped before its end;
    /// so does a call dropped while it is still starting.
    pub async fn generate(&self, req: GenerateRequest) -> Result<LegStream, Status> {
        let client = self.client()?;
        let mut guard = AbortOnDrop {
            client: Some(client.clone()),
            request_id: req.request_id.clone(),
            auth: self.auth.clone(),
        };
        let samples = req.sampling_params.as_ref().map_or(1, |s| s.n.max(1));
        let mut call = self.call(req);
        crate::telemetry::propagate_to_grpc(call.metadata_mut());
        let stream = client.clone().generate(call).await?.into_inner();
        Ok(LegStream {
            stream,
            completes_left: samples,
            abort: AbortOnDrop {
                client: guard.client.take(),
                request_id: std::mem::take(&mut guard.request_id),
                auth: guard.auth.take(),
            },
        })
    }
}

/// Sends `Abort` for `request_id` on drop, unless disarmed (`client` taken).
struct AbortOnDrop {
    client: Option<SglangSchedulerClient<Channel>>,
    request_id: String,
    auth: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        let Some(mut client) = self.client.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let request_id = std::mem::take(&mut self.request_id);
        let auth = self.auth.take();
        rt.spawn(async move {
            let mut req = tonic::Request::new(AbortRequest {
                request_id,
                reason: "client went away or the other leg failed".to_owned(),
            });
            if let Some(a) = auth {
                req.metadata_mut().insert("authorization", a);
            }
            let _ = tokio::time::timeout(ABORT_TIMEOUT, client.abort(req)).await;
        });
    }
}

/// A running `Generate` stream. Dropping it before [`LegStream::next`] returned `None` (or an
/// error) sends `Abort` for its request.
pub struct LegStream {
    stream: Streaming<GenerateResponse>,
    /// Samples whose `Complete` has not come yet.
    completes_left: u32,
    abort: AbortOnDrop,
}

impl std::fmt::Debug for LegStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LegStream")
            .field("request_id", &self.abort.request_id)
            .finish()
    }
}

impl LegStream {
    /// The next message; `None` at the stream's end. The end, the last sample's `Complete`
    /// and any error disarm the abort (there is nothing left running to abort).
    pub async fn next(&mut self) -> Result<Option<GenerateResponse>, Status> {
        use pdrouter_proto::scheduler::generate_response::Response;
        let r = self.stream.message().await;
        let finished = match &r {
            Ok(Some(m)) => match m.response {
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
            self.abort.client = None;
        }
        r
    }
}

/// The `Generate` streams of one leg of a request (one per prompt of a batch), read as one:
/// each message is tagged with the position of the stream it came from. Dropping it drops
/// every stream still running, which aborts them.
pub struct Legs {
    set: futures_util::stream::SelectAll<
        futures_util::stream::BoxStream<'static, Result<(usize, GenerateResponse), Status>>,
    >,
}

impl std::fmt::Debug for Legs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Legs")
            .field("running", &self.set.len())
            .finish()
    }
}

impl Legs {
    /// Starts one `Generate` per request on `channel`, all at once. If one fails to start,
    /// the ones already started are dropped (aborted) and its status is returned.
    pub async fn start(
        channel: &WorkerChannel,
        reqs: Vec<GenerateRequest>,
    ) -> Result<Self, Status> {
        let streams =
            futures_util::future::try_join_all(reqs.into_iter().map(|r| channel.generate(r)))
                .await?;
        let mut set = futures_util::stream::SelectAll::new();
        for (i, leg) in streams.into_iter().enumerate() {
            set.push(
                futures_util::stream::unfold(Some(leg), move |leg| async move {
                    let mut leg = leg?;
                    match leg.next().await {
                        Ok(Some(m)) => Some((Ok((i, m)), Some(leg))),
                        Ok(None) => None,
                        // Nothing follows an error.
                        Err(s) => Some((Err(s), None)),
                    }
                })
                .boxed(),
            );
        }
        Ok(Self { set })
    }

    /// The next message of any stream, with its stream's position; `None` once all ended.
    pub async fn next(&mut self) -> Result<Option<(usize, GenerateResponse)>, Status> {
        self.set.next().await.transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_carry_the_workers_key() {
        let ch = WorkerChannel::new("grpc://h:1", Some("k1"));
        assert_eq!(ch.endpoint, "http://h:1");
        let r = ch.call(HealthCheckRequest {});
        assert_eq!(r.metadata().get("authorization").unwrap(), "Bearer k1");
        let plain = WorkerChannel::new("grpc://h:1", None);
        assert!(plain.call(()).metadata().get("authorization").is_none());
    }
}
