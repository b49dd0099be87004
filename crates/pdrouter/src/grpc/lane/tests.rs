//! The lane against a scripted HTTP/2 server on loopback: what a call sends, how answers
//! of every shape are read, and how connections are shared and replaced.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use h2::server::SendResponse;
use h2::{Reason, RecvStream};
use pdrouter_proto::scheduler::{GenerateRequest, GenerateResponse};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tonic::Code;

use super::*;

type Handler =
    Arc<dyn Fn(Request<RecvStream>, SendResponse<Bytes>) -> BoxFuture<'static, ()> + Send + Sync>;

struct Server {
    addr: String,
    accepts: Arc<AtomicUsize>,
    /// One message per connection the server saw end.
    closed: mpsc::UnboundedReceiver<()>,
}

/// A server running `handler` for every stream; with `one_stream`, each connection is shut
/// down gracefully after its first stream.
async fn serve(one_stream: bool, handler: Handler) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let accepts = Arc::new(AtomicUsize::new(0));
    let (closed_tx, closed) = mpsc::unbounded_channel();
    let counted = accepts.clone();
    tokio::spawn(async move {
        loop {
            let Ok((io, _)) = listener.accept().await else {
                return;
            };
            counted.fetch_add(1, Ordering::SeqCst);
            let (handler, closed_tx) = (handler.clone(), closed_tx.clone());
            tokio::spawn(async move {
                let mut conn = h2::server::handshake(io).await.unwrap();
                while let Some(Ok((req, respond))) = conn.accept().await {
                    tokio::spawn(handler(req, respond));
                    if one_stream {
                        conn.graceful_shutdown();
                    }
                }
                let _ = closed_tx.send(());
            });
        }
    });
    Server {
        addr,
        accepts,
        closed,
    }
}

fn handler<F, Fut>(f: F) -> Handler
where
    F: Fn(Request<RecvStream>, SendResponse<Bytes>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    Arc::new(move |req, respond| Box::pin(f(req, respond)))
}

fn grpc_head() -> http::Response<()> {
    http::Response::builder()
        .header("content-type", "application/grpc")
        .body(())
        .unwrap()
}

fn trailers(code: i32, message: &str) -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", code.into());
    if !message.is_empty() {
        t.insert("grpc-message", message.parse().unwrap());
    }
    t
}

fn reply(id: &str) -> GenerateResponse {
    GenerateResponse {
        request_id: id.to_owned(),
        ..Default::default()
    }
}

fn framed<M: prost::Message>(msg: &M) -> Bytes {
    crate::grpc::encoded::framed(msg)
}

/// Answers every stream with `replies`, then status 0.
fn answering(replies: Vec<GenerateResponse>) -> Handler {
    handler(move |_req, mut respond| {
        let replies = replies.clone();
        async move {
            let mut send = respond.send_response(grpc_head(), false).unwrap();
            for r in &replies {
                send.send_data(framed(r), false).unwrap();
            }
            send.send_trailers(trailers(0, "")).unwrap();
        }
    })
}

async fn call(lane: &Lane, limit: usize) -> Result<Replies<GenerateResponse>, Status> {
    let msg = GenerateRequest {
        request_id: "r-1".to_owned(),
        ..Default::default()
    };
    lane.generate(
        Runtime::Sglang,
        HeaderMap::new(),
        Message::Framed(framed(&msg)),
        limit,
    )
    .await
}

/// Every message, then the error the answer ended with, if any.
async fn read_all(mut replies: Replies<GenerateResponse>) -> (Vec<String>, Option<Status>) {
    let mut ids = Vec::new();
    while let Some(r) = replies.next().await {
        match r {
            Ok(m) => ids.push(m.request_id),
            Err(s) => return (ids, Some(s)),
        }
    }
    (ids, None)
}

/// Every message of an answer that must end well.
async fn ids(replies: Replies<GenerateResponse>) -> Vec<String> {
    match read_all(replies).await {
        (ids, None) => ids,
        (_, Some(s)) => panic!("the answer failed: {s:?}"),
    }
}

#[tokio::test]
async fn a_call_sends_grpc_headers_and_its_framed_message() {
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let server = serve(
        false,
        handler(move |req, mut respond| {
            let seen_tx = seen_tx.clone();
            async move {
                let (parts, mut body) = req.into_parts();
                let mut bytes = Vec::new();
                while let Some(chunk) = body.data().await {
                    let chunk = chunk.unwrap();
                    let _ = body.flow_control().release_capacity(chunk.len());
                    bytes.extend_from_slice(&chunk);
                }
                let _ = seen_tx.send((parts, bytes));
                let mut send = respond.send_response(grpc_head(), false).unwrap();
                send.send_trailers(trailers(0, "")).unwrap();
            }
        }),
    )
    .await;
    let lane = Lane::new(&server.addr, false).unwrap();
    let mut headers = HeaderMap::new();
    headers.insert("authorization", "Bearer k".parse().unwrap());
    let msg = GenerateRequest {
        request_id: "r-9".to_owned(),
        ..Default::default()
    };
    let replies = lane
        .generate::<GenerateResponse>(
            Runtime::Sglang,
            headers,
            Message::Framed(framed(&msg)),
            1 << 20,
        )
        .await
        .unwrap();
    assert!(ids(replies).await.is_empty());
    let (parts, body) = seen.recv().await.unwrap();
    assert_eq!(parts.method, Method::POST);
    assert_eq!(
        parts.uri.path(),
        "/sglang.grpc.scheduler.SglangScheduler/Generate"
    );
    assert_eq!(parts.headers["content-type"], "application/grpc");
    assert_eq!(parts.headers["te"], "trailers");
    assert_eq!(parts.headers["authorization"], "Bearer k");
    let encoded = prost::Message::encode_to_vec(&msg);
    assert_eq!(body[0], 0, "uncompressed");
    assert_eq!(&body[1..5], &(encoded.len() as u32).to_be_bytes());
    assert_eq!(&body[5..], &encoded[..]);

    // An encoded message goes out framed the same way.
    let replies = lane
        .generate::<GenerateResponse>(
            Runtime::Vllm,
            HeaderMap::new(),
            Message::Encoded(Bytes::from(encoded.clone())),
            1 << 20,
        )
        .await
        .unwrap();
    assert!(ids(replies).await.is_empty());
    let (parts, again) = seen.recv().await.unwrap();
    assert_eq!(parts.uri.path(), "/vllm.grpc.engine.VllmEngine/Generate");
    assert_eq!(again, body);
}

#[tokio::test]
async fn messages_split_or_joined_across_frames_arrive_whole_and_in_order() {
    let server = serve(
        false,
        handler(|_req, mut respond| async move {
            let (a, b, c) = (
                framed(&reply("a")),
                framed(&reply("bb")),
                framed(&reply("c")),
            );
            let mut send = respond.send_response(grpc_head(), false).unwrap();
            // a whole with b's first three bytes; b's prefix cut inside; b's rest and c.
            let mut first = a.to_vec();
            first.extend_from_slice(&b[..3]);
            send.send_data(Bytes::from(first), false).unwrap();
            send.send_data(b.slice(3..4), false).unwrap();
            let mut rest = b[4..].to_vec();
            rest.extend_from_slice(&c);
            send.send_data(Bytes::from(rest), false).unwrap();
            send.send_trailers(trailers(0, "")).unwrap();
        }),
    )
    .await;
    let lane = Lane::new(&server.addr, false).unwrap();
    let replies = call(&lane, 1 << 20).await.unwrap();
    assert_eq!(ids(replies).await, ["a", "bb", "c"]);
}

#[tokio::test]
async fn statuses_in_trailers_heads_and_resets_are_the_calls() {
    // Messages, then a failure status in the trailers.
    let server = serve(
        false,
        handler(|_req, mut respond| async move {
            let mut send = respond.send_response(grpc_head(), false).unwrap();
            send.send_data(framed(&reply("a")), false).unwrap();
            send.send_trailers(trailers(8, "queue%20full")).unwrap();
        }),
    )
    .await;
    let lane = Lane::new(&server.addr, false).unwrap();
    let (ids, status) = read_all(call(&lane, 1 << 20).await.unwrap()).await;
    assert_eq!(ids, vec!["a".to_owned()]);
    let status = status.unwrap();
    assert_eq!(
        (status.code(), status.message()),
        (Code::ResourceExhausted, "queue full")
    );

    // Trailers-only: the head is the status.
    let server = serve(
        false,
        handler(|_req, mut respond| async move {
            let mut head = grpc_head();
            head.headers_mut().extend(trailers(12, "no%20Generate"));
            respond.send_response(head, true).unwrap();
        }),
    )
    .await;
    let lane = Lane::new(&server.addr, false).unwrap();
    let status = call(&lane, 1 << 20).await.err().unwrap();
    assert_eq!(
        (status.code(), status.message()),
        (Code::Unimplemented, "no Generate")
    );

    // An HTTP error status.
    let server = serve(
        false,
        handler(|_req, mut respond| async move {
            let head = http::Response::builder().status(503).body(()).unwrap();
            respond.send_response(head, true).unwrap();
        }),
    )
    .await;
    let lane = Lane::new(&server.addr, false).unwrap();
    assert_eq!(
        call(&lane, 1 << 20).await.err().unwrap().code(),
        Code::Unavailable
    );

    // A reset after a message.
    let server = serve(
        false,
        handler(|_req, mut respond| async move {
            let mut send = respond.send_response(grpc_head(), false).unwrap();
            send.send_data(framed(&reply("a")), false).unwrap();
            send.send_reset(Reason::REFUSED_STREAM);
        }),
    )
    .await;
    let lane = Lane::new(&server.addr, false).unwrap();
    // The reset may overtake the head.
    let status = match call(&lane, 1 << 20).await {
        Ok(replies) => read_all(replies).await.1.expect("the reset is an error"),
        Err(s) => s,
    };
    assert_eq!(status.code(), Code::Unavailable);
}

#[tokio::test]
async fn an_end_without_a_status_or_inside_a_message_is_an_error() {
    for cut in [false, true] {
        let server = serve(
            false,
            handler(move |_req, mut respond| async move {
                let mut send = respond.send_response(grpc_head(), false).unwrap();
                let a = framed(&reply("abc"));
                let end = if cut { a.len() - 1 } else { a.len() };
                // Ends with the data: no trailers.
                send.send_data(a.slice(..end), true).unwrap();
            }),
        )
        .await;
        let lane = Lane::new(&server.addr, false).unwrap();
        let (ids, status) = read_all(call(&lane, 1 << 20).await.unwrap()).await;
        assert_eq!(ids.len(), usize::from(!cut));
        let status = status.expect("never a short success");
        assert_eq!(status.code(), Code::Internal, "{status:?}");
    }
}

#[tokio::test]
async fn oversized_or_compressed_messages_are_refused_from_their_prefix() {
    for compressed in [false, true] {
        let server = serve(
            false,
            handler(move |_req, mut respond| async move {
                let mut send = respond.send_response(grpc_head(), false).unwrap();
                // Only the prefix: the refusal must not wait for the body.
                let len: u32 = if compressed { 3 } else { 1_000 };
                let mut prefix = vec![u8::from(compressed)];
                prefix.extend_from_slice(&len.to_be_bytes());
                send.send_data(Bytes::from(prefix), false).unwrap();
                std::future::pending::<()>().await;
            }),
        )
        .await;
        let lane = Lane::new(&server.addr, false).unwrap();
        let (ids, status) = read_all(call(&lane, 100).await.unwrap()).await;
        assert!(ids.is_empty());
        let want = if compressed {
            Code::Internal
        } else {
            Code::OutOfRange
        };
        assert_eq!(status.unwrap().code(), want);
    }
}

#[tokio::test]
async fn dropping_an_unfinished_answer_cancels_its_stream() {
    let (reset_tx, mut reset) = mpsc::unbounded_channel();
    let server = serve(
        false,
        handler(move |_req, mut respond| {
            let reset_tx = reset_tx.clone();
            async move {
                let mut send = respond.send_response(grpc_head(), false).unwrap();
                send.send_data(framed(&reply("a")), false).unwrap();
                let reason = std::future::poll_fn(|cx| send.poll_reset(cx)).await;
                let _ = reset_tx.send(reason.ok());
            }
        }),
    )
    .await;
    let lane = Lane::new(&server.addr, false).unwrap();
    let mut replies = call(&lane, 1 << 20).await.unwrap();
    assert_eq!(replies.next().await.unwrap().unwrap().request_id, "a");
    drop(replies);
    assert_eq!(reset.recv().await.unwrap(), Some(Reason::CANCEL));
}

#[tokio::test]
async fn calls_share_one_connection_and_a_closed_one_is_replaced() {
    let mut server = serve(true, answering(vec![reply("a")])).await;
    let lane = Arc::new(Lane::new(&server.addr, false).unwrap());
    // The server closes each connection gracefully after its first stream.
    assert_eq!(ids(call(&lane, 1 << 20).await.unwrap()).await, ["a"]);
    assert_eq!(server.accepts.load(Ordering::SeqCst), 1);
    // The worker closed it: the next call finds it closed before sending and reconnects.
    server.closed.recv().await.unwrap();
    assert_eq!(ids(call(&lane, 1 << 20).await.unwrap()).await, ["a"]);
    assert_eq!(server.accepts.load(Ordering::SeqCst), 2);

    let server = serve(false, answering(vec![reply("b")])).await;
    let lane = Arc::new(Lane::new(&server.addr, false).unwrap());
    let calls = (0..8).map(|_| {
        let lane = lane.clone();
        tokio::spawn(async move { ids(call(&lane, 1 << 20).await.unwrap()).await })
    });
    for r in futures_util::future::join_all(calls).await {
        assert_eq!(r.unwrap(), ["b"]);
    }
    assert_eq!(
        server.accepts.load(Ordering::SeqCst),
        1,
        "one connection for all"
    );
}

#[tokio::test]
async fn a_refused_connect_is_unavailable_and_a_bad_address_is_refused_up_front() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let lane = Lane::new(&addr, false).unwrap();
    assert_eq!(
        call(&lane, 1 << 20).await.err().unwrap().code(),
        Code::Unavailable
    );
    assert!(Lane::new("h", false).is_err());
    assert!(Lane::new("h:x", false).is_err());
}

#[tokio::test]
async fn a_bulk_lane_runs_its_connection_on_the_bulk_thread() {
    let server = serve(false, answering(vec![reply("a")])).await;
    let lane = Lane::new(&server.addr, true).unwrap();
    let replies = call(&lane, 1 << 20).await.unwrap();
    assert_eq!(ids(replies).await, ["a"]);
    let on_bulk = super::super::bulk::handle()
        .unwrap()
        .metrics()
        .num_alive_tasks();
    assert!(
        on_bulk >= 1,
        "the connection task lives on the bulk runtime"
    );
}

/// A worker that stops answering (here: its connection no longer read after the call
/// arrived) is found by the keep-alive ping, and the calls on the connection fail instead
/// of waiting for ever.
#[tokio::test(start_paused = true)]
async fn an_unanswered_keep_alive_ping_drops_the_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (got_tx, got) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (io, _) = listener.accept().await.unwrap();
        let mut conn = h2::server::handshake(io).await.unwrap();
        let stream = conn.accept().await;
        let _ = got_tx.send(());
        // Held, never polled again: no answer, no pong.
        let _keep = (conn, stream);
        std::future::pending::<()>().await;
    });
    let lane = Lane::new(&addr, false).unwrap();
    let started = tokio::time::Instant::now();
    let bound = std::time::Duration::from_secs(600);
    let status = tokio::time::timeout(bound, call(&lane, 1 << 20))
        .await
        .expect("the call fails instead of waiting")
        .err()
        .expect("the call fails");
    got.await.unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= KEEP_ALIVE_INTERVAL + KEEP_ALIVE_TIMEOUT,
        "failed after {waited:?}: {status:?}"
    );
    assert!(waited < KEEP_ALIVE_INTERVAL * 2 + KEEP_ALIVE_TIMEOUT);
}
