//! Minimal HTTP/1 client helpers for the integration tests.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::HeaderValue;
use hyper::{HeaderMap, Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// Upper bound for anything a test waits on.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// A fully received response.
#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn content_type(&self) -> &str {
        self.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// The payloads of the `data:` lines of an SSE body, in order.
    pub fn sse_data(&self) -> Vec<String> {
        sse_payloads(&self.text())
    }

    /// The JSON `data:` payloads, checking the stream ends with `[DONE]`.
    pub fn sse_json(&self) -> Vec<Value> {
        let data = self.sse_data();
        assert_eq!(
            data.last().map(String::as_str),
            Some("[DONE]"),
            "body: {}",
            self.text()
        );
        assert_eq!(data.iter().filter(|d| *d == "[DONE]").count(), 1);
        data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).expect("SSE data is JSON"))
            .collect()
    }
}

pub fn sse_payloads(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter(|ev| !ev.trim().is_empty())
        .map(|ev| {
            ev.lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect()
}

/// Opens one HTTP/1 connection; the returned task drives it (abort it to
/// close the socket).
pub async fn connect(addr: SocketAddr) -> (SendRequest<Full<Bytes>>, JoinHandle<()>) {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (sender, task)
}

fn build(
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> Request<Full<Bytes>> {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    if body.is_some() {
        req = req.header("content-type", HeaderValue::from_static("application/json"));
    }
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(Full::new(Bytes::from(body.unwrap_or("").to_owned())))
        .expect("request")
}

/// Sends a request on a fresh connection and returns the response head with
/// the unread body (and the connection task).
pub async fn start_request(
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: Option<&str>,
) -> hyper::Result<(hyper::Response<Incoming>, JoinHandle<()>)> {
    let (mut sender, task) = connect(addr).await;
    let resp = sender
        .send_request(build(addr, method, path, body, &[]))
        .await?;
    Ok((resp, task))
}

/// Sends a request on a fresh connection and reads the whole response.
pub async fn try_request(
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: Option<&str>,
) -> hyper::Result<Resp> {
    let (resp, _task) = start_request(addr, method, path, body).await?;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await?.to_bytes();
    Ok(Resp {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

pub async fn request(addr: SocketAddr, method: Method, path: &str, body: Option<&str>) -> Resp {
    tokio::time::timeout(TIMEOUT, try_request(addr, method, path, body))
        .await
        .expect("request timed out")
        .expect("request failed")
}

pub async fn get(addr: SocketAddr, path: &str) -> Resp {
    request(addr, Method::GET, path, None).await
}

pub async fn post(addr: SocketAddr, path: &str, body: &Value) -> Resp {
    request(addr, Method::POST, path, Some(&body.to_string())).await
}

/// POSTs `body` with the given extra headers.
pub async fn post_with(
    addr: SocketAddr,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> Resp {
    let exchange = async {
        let (mut sender, _conn) = connect(addr).await;
        let req = build(addr, Method::POST, path, Some(&body.to_string()), headers);
        let resp = sender.send_request(req).await.expect("response");
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        Resp {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    };
    tokio::time::timeout(TIMEOUT, exchange)
        .await
        .expect("request timed out")
}

/// A prompt of `tokens` tokens as vLLM mode counts them (one token per four bytes).
pub fn prompt(tokens: usize) -> String {
    "abcd".repeat(tokens)
}

/// Starts a worker, or fails the test.
pub async fn start(cfg: pdrouter_mock::MockConfig) -> pdrouter_mock::MockWorker {
    pdrouter_mock::MockWorker::start(cfg)
        .await
        .expect("start worker")
}

pub async fn post_raw(addr: SocketAddr, path: &str, body: &str) -> Resp {
    request(addr, Method::POST, path, Some(body)).await
}

/// Polls `cond` every few milliseconds until it holds; panics after
/// [`TIMEOUT`].
pub async fn wait_until<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A tonic client of SGLang's scheduler service on a gRPC mock at `addr`.
pub async fn grpc_client(
    addr: SocketAddr,
) -> pdrouter_proto::scheduler::sglang_scheduler_client::SglangSchedulerClient<
    tonic::transport::Channel,
> {
    tokio::time::timeout(
        TIMEOUT,
        pdrouter_proto::scheduler::sglang_scheduler_client::SglangSchedulerClient::connect(
            format!("http://{addr}"),
        ),
    )
    .await
    .expect("connect in time")
    .expect("connect")
}

/// A streamed `Generate` of `input` (byte-level ids), with a KV ticket `(port, room)` on
/// 127.0.0.1 when given.
pub fn grpc_request(
    id: &str,
    input: &str,
    ticket: Option<(u16, i32)>,
) -> pdrouter_proto::scheduler::GenerateRequest {
    use pdrouter_proto::scheduler::{DisaggregatedParams, SamplingParams, TokenizedInput};
    pdrouter_proto::scheduler::GenerateRequest {
        request_id: id.to_owned(),
        tokenized: Some(TokenizedInput {
            original_text: input.to_owned(),
            input_ids: pdrouter_tokenizer::bytelevel::encode_plain(input),
        }),
        sampling_params: Some(SamplingParams {
            temperature: 0.7,
            top_p: 1.0,
            top_k: -1,
            n: 1,
            ..Default::default()
        }),
        disaggregated_params: ticket.map(|(port, room)| DisaggregatedParams {
            bootstrap_host: "127.0.0.1".to_owned(),
            bootstrap_port: i32::from(port),
            bootstrap_room: room,
        }),
        stream: true,
        ..Default::default()
    }
}
