//! A gRPC worker's HTTP/2 connection for `Generate` calls, and the calls on it, driven
//! without tonic's channel.
//!
//! Through a tonic channel each call crossed three tasks besides its own: the channel's
//! buffer task, hyper's client task, and a task spawned per call to write its request body.
//! Here the caller's task opens the stream, queues the whole framed message with the end of
//! the stream in the same step, and reads the answer ([`super::replies`]); only the
//! connection's own task, h2's I/O driver, remains. Other calls (health, model info, abort,
//! tokenizer) keep the tonic channel.
//!
//! Invariants:
//! - At most one connection per lane is in use; it is made on first use, and concurrent
//!   callers that find none wait for one connect (the connect lock), not one each.
//! - A call that finds its connection closed before any of it was sent forgets that
//!   connection and goes once more on a new one: nothing of it reached the worker. Once the
//!   stream is open, a failure is the call's.
//! - The connection's task ends when the worker closes the connection, when a keep-alive
//!   ping goes unanswered for [`KEEP_ALIVE_TIMEOUT`], or when the lane and every stream on the
//!   connection are gone. Ending it fails the streams still on it.
//! - The connection's task gathers the streams of callers that are ready together into one
//!   write ([`super::coalesce`]).
//! - A bulk lane connects and runs its connection task on the bulk thread
//!   ([`super::bulk`]), so a long prompt's bytes are written there.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use http::header::{CONTENT_TYPE, TE};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderValue, Method, Request, Uri};
use tokio::net::TcpStream;
use tonic::Status;

use super::replies::{Replies, h2_status};
use super::runtime::Runtime;

/// Longest a TCP connect and HTTP/2 handshake to a worker may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 keep-alive ping period, sent whether or not streams are open.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a keep-alive ping may go unanswered before the connection is dropped.
pub(super) const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// TCP keep-alive idle time: a worker host that vanished without a close is noticed.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);
/// Receive windows: a stream may have this much unread before the worker must wait, and
/// the connection all its streams together. Fixed and generous (engines answer in small
/// frames; what is received is released at once, see the replies' module).
const STREAM_WINDOW: u32 = 2 << 20;
const CONNECTION_WINDOW: u32 = 5 << 20;
/// Largest response head accepted.
const MAX_HEADER_LIST: u32 = 16 << 10;
/// Streams the router cancelled whose late frames are still recognised, and for how long.
/// The router cancels a stream whenever it is done before the engine (a stop string, a
/// client gone, a Prefill leg past its grace); at thousands of requests a second h2's
/// defaults (10 streams, 30 s) forget them at once, and every frame the engine had in flight
/// on one then counts as a protocol error.
pub(super) const RESET_STREAMS: usize = 4096;
pub(super) const RESET_STREAM_DURATION: Duration = Duration::from_secs(2);

/// The message of a call: already framed (prefix included), or encoded elsewhere and still
/// to be framed (a long prompt's, sent as it is rather than copied behind a prefix).
pub(super) enum Message {
    Framed(Bytes),
    Encoded(Bytes),
}

/// One lane's connection (see the module docs).
pub(super) struct Lane {
    /// `Generate`'s URI in SGLang's, TokenSpeed's and vLLM's service.
    generate: [Uri; 3],
    authority: Authority,
    bulk: bool,
    /// The connection in use, with its number (to forget exactly the one found closed).
    current: parking_lot::Mutex<Option<(u64, SendRequest<Bytes>)>>,
    made: AtomicU64,
    connecting: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane")
            .field("authority", &self.authority)
            .field("bulk", &self.bulk)
            .finish_non_exhaustive()
    }
}

impl Lane {
    /// A lane to `host:port`; nothing connects yet.
    pub(super) fn new(host_port: &str, bulk: bool) -> Result<Self, String> {
        let authority: Authority = host_port.parse().map_err(|e| format!("{e}"))?;
        if authority.port_u16().is_none() {
            return Err(format!("{host_port} has no port"));
        }
        let uri = |service: &str| -> Result<Uri, String> {
            let path = PathAndQuery::try_from(format!("/{service}/Generate"))
                .map_err(|e| e.to_string())?;
            Uri::builder()
                .scheme(Scheme::HTTP)
                .authority(authority.clone())
                .path_and_query(path)
                .build()
                .map_err(|e| e.to_string())
        };
        let generate = [
            uri(pdrouter_proto::SCHEDULER_SERVICE)?,
            uri(pdrouter_proto::TOKENSPEED_SCHEDULER_SERVICE)?,
            uri(pdrouter_proto::VLLM_ENGINE_SERVICE)?,
        ];
        Ok(Lane {
            generate,
            authority,
            bulk,
            current: parking_lot::Mutex::new(None),
            made: AtomicU64::new(0),
            connecting: tokio::sync::Mutex::new(()),
        })
    }

    /// Starts `rt`'s `Generate` with `message`, `headers` added to the call's own; answers
    /// over `limit` bytes fail the stream.
    pub(super) async fn generate<R>(
        &self,
        rt: Runtime,
        headers: HeaderMap,
        message: Message,
        limit: usize,
    ) -> Result<Replies<R>, Status> {
        let index = match rt {
            Runtime::Sglang => 0,
            Runtime::TokenSpeed => 1,
            Runtime::Vllm => 2,
        };
        let mut request = Request::new(());
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.generate[index].clone();
        *request.headers_mut() = headers;
        let h = request.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert(TE, HeaderValue::from_static("trailers"));
        let mut again = true;
        let (number, mut ready) = loop {
            let (number, fresh, sender) = self.connection().await?;
            match sender.ready().await {
                Ok(ready) => break (number, ready),
                // Closed before the call was sent: once more, on a new connection.
                Err(_) if again && !fresh => {
                    self.forget(number);
                    again = false;
                }
                Err(e) => {
                    self.forget(number);
                    return Err(Status::unavailable(format!(
                        "cannot open a stream to the worker: {e}"
                    )));
                }
            }
        };
        let (response, mut send) = ready.send_request(request, false).map_err(|e| {
            self.forget(number);
            Status::unavailable(format!("cannot open a stream to the worker: {e}"))
        })?;
        let sent = match message {
            Message::Framed(bytes) => send.send_data(bytes, true),
            Message::Encoded(bytes) => {
                let mut prefix = [0u8; 5];
                prefix[1..].copy_from_slice(&u32::try_from(bytes.len()).unwrap_or(0).to_be_bytes());
                send.send_data(Bytes::copy_from_slice(&prefix), false)
                    .and_then(|()| send.send_data(bytes, true))
            }
        };
        sent.map_err(|e| h2_status(&e))?;
        let head = response.await.map_err(|e| h2_status(&e))?;
        Replies::start(head, limit)
    }

    /// The connection in use, or a new one: its number, whether it was made for this call,
    /// and its sender.
    async fn connection(&self) -> Result<(u64, bool, SendRequest<Bytes>), Status> {
        if let Some((n, s)) = &*self.current.lock() {
            return Ok((*n, false, s.clone()));
        }
        let _one = self.connecting.lock().await;
        if let Some((n, s)) = &*self.current.lock() {
            return Ok((*n, false, s.clone()));
        }
        let sender = if self.bulk {
            match super::bulk::handle() {
                Some(h) => h
                    .spawn(connect(self.authority.clone()))
                    .await
                    .map_err(|e| Status::unavailable(format!("connecting failed: {e}")))??,
                None => connect(self.authority.clone()).await?,
            }
        } else {
            connect(self.authority.clone()).await?
        };
        let n = self.made.fetch_add(1, Ordering::Relaxed);
        *self.current.lock() = Some((n, sender.clone()));
        Ok((n, true, sender))
    }

    /// Drops connection `number` if it is still the one in use.
    fn forget(&self, number: u64) {
        let mut current = self.current.lock();
        if current.as_ref().is_some_and(|(n, _)| *n == number) {
            *current = None;
        }
    }
}

/// Connects to `authority`, runs the HTTP/2 handshake and spawns the connection's task on
/// the current runtime.
async fn connect(authority: Authority) -> Result<SendRequest<Bytes>, Status> {
    let work = async {
        let name = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let port = authority.port_u16().unwrap_or(80);
        let io = TcpStream::connect((name, port)).await.map_err(|e| {
            Status::unavailable(format!("cannot connect to the worker at {authority}: {e}"))
        })?;
        let _ = io.set_nodelay(true);
        let keepalive = socket2::TcpKeepalive::new().with_time(TCP_KEEPALIVE);
        let _ = socket2::SockRef::from(&io).set_tcp_keepalive(&keepalive);
        let (sender, mut conn) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_header_list_size(MAX_HEADER_LIST)
            .max_concurrent_reset_streams(RESET_STREAMS)
            .reset_stream_duration(RESET_STREAM_DURATION)
            // h2 counts those frames over the connection's whole life and, past 1,024,
            // closes it (ENHANCE_YOUR_CALM), failing every stream on it: a guard against
            // hostile servers that an engine the router is configured with is not.
            // Measured: a busy gRPC PD router lost its Decode connection after ~30k
            // requests.
            .max_local_error_reset_streams(None)
            .enable_push(false)
            .handshake::<_, Bytes>(io)
            .await
            .map_err(|e| Status::unavailable(format!("HTTP/2 handshake failed: {e}")))?;
        let pings = conn.ping_pong();
        let host = authority.clone();
        tokio::spawn(async move {
            tokio::select! {
                r = super::coalesce::drive(conn) => {
                    if let Err(e) = r {
                        tracing::debug!(worker = %host, error = %e, "gRPC connection ended");
                    }
                }
                () = keep_alive(pings) => {
                    tracing::warn!(worker = %host, "gRPC keep-alive ping unanswered; connection dropped");
                }
            }
        });
        Ok(sender)
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, work).await {
        Ok(r) => r,
        Err(_) => Err(Status::unavailable(format!(
            "connecting to the worker at {authority} timed out"
        ))),
    }
}

/// Pings every [`KEEP_ALIVE_INTERVAL`]; returns when one goes unanswered for
/// [`KEEP_ALIVE_TIMEOUT`] (or cannot be sent: the connection is going).
async fn keep_alive(pings: Option<h2::PingPong>) {
    let Some(mut pings) = pings else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(KEEP_ALIVE_INTERVAL).await;
        if pings.send_ping(h2::Ping::opaque()).is_err() {
            return std::future::pending().await;
        }
        let pong = std::future::poll_fn(|cx| pings.poll_pong(cx));
        match tokio::time::timeout(KEEP_ALIVE_TIMEOUT, pong).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return std::future::pending().await,
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests;
