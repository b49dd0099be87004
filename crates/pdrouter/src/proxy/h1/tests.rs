//! The inline client against scripted loopback servers: framings, reuse, a kept connection
//! the worker closed, early drops, and broken answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body::Body as _;
use http_body_util::BodyExt as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::*;

/// One scripted answer: what to write back once a request's head (and body, by its length)
/// is in; then whether to close the connection.
#[derive(Clone)]
struct Answer {
    bytes: Vec<u8>,
    close: bool,
}

fn answer(text: &str) -> Answer {
    Answer {
        bytes: text.as_bytes().to_vec(),
        close: false,
    }
}

/// `text`, then the connection closed.
fn closing(text: &str) -> Answer {
    Answer {
        close: true,
        ..answer(text)
    }
}

/// A server answering each request with the next script entry; counts accepted
/// connections and hands every request it read to `seen`.
struct Server {
    url: String,
    host: Authority,
    accepted: Arc<AtomicUsize>,
    seen: mpsc::UnboundedReceiver<Vec<u8>>,
}

async fn server(script: Vec<Answer>) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let (tx, seen) = mpsc::unbounded_channel();
    let script = Arc::new(tokio::sync::Mutex::new(script.into_iter()));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut io, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let (script, tx) = (script.clone(), tx.clone());
            tokio::spawn(async move {
                while let Some(req) = read_request(&mut io).await {
                    let _ = tx.send(req);
                    let Some(a) = script.lock().await.next() else {
                        return;
                    };
                    if io.write_all(&a.bytes).await.is_err() || a.close {
                        return;
                    }
                }
            });
        }
    });
    Server {
        url: format!("http://{addr}"),
        host: Authority::try_from(addr.to_string().as_str()).unwrap(),
        accepted,
        seen,
    }
}

/// One request (head and `content-length` body), `None` at the end of the connection.
async fn read_request(io: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |v| v.trim().parse::<usize>().unwrap());
            if buf.len() >= end + 4 + len {
                return Some(buf);
            }
        }
        let n = io.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn post(url: &str, body: &str) -> Request<Bytes> {
    Request::post(format!("{url}/generate"))
        .header("x-request-id", "r-1")
        .body(Bytes::from(body.to_owned()))
        .unwrap()
}

async fn text(resp: Response<InlineBody>) -> String {
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn a_length_answer_is_read_and_its_connection_reused() {
    let mut s = server(vec![
        answer("HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-a: 1\r\n\r\nhello"),
        answer("HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok"),
    ])
    .await;
    let client = Client::default();
    let resp = client.send(post(&s.url, "{\"a\":1}")).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-a"], "1");
    // The body was all in the head's read: the connection is home before the body is read.
    assert_eq!(client.pool().idle(&s.host), 1);
    assert_eq!(text(resp).await, "hello");
    let req = String::from_utf8(s.seen.recv().await.unwrap()).unwrap();
    assert!(req.starts_with("POST /generate HTTP/1.1\r\n"), "{req}");
    assert!(req.contains("x-request-id: r-1\r\n"), "{req}");
    assert!(req.ends_with("content-length: 7\r\n\r\n{\"a\":1}"), "{req}");
    let resp = client.send(post(&s.url, "")).await.unwrap();
    assert_eq!(
        (resp.status().as_u16(), text(resp).await.as_str()),
        (201, "ok")
    );
    assert_eq!(
        s.accepted.load(Ordering::SeqCst),
        1,
        "one connection for both"
    );
    assert_eq!(client.pool().idle(&s.host), 1);
}

#[tokio::test]
async fn a_chunked_answer_is_decoded_across_reads_and_trailers() {
    // Written as one buffer; the client sees it in whatever reads the kernel makes.
    let s = server(vec![answer(
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
         5;ext=1\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nx-t: 1\r\n\r\n",
    )])
    .await;
    let client = Client::default();
    let resp = client.send(post(&s.url, "x")).await.unwrap();
    assert_eq!(text(resp).await, "hello 0123456789");
    assert_eq!(
        client.pool().idle(&s.host),
        1,
        "a clean chunked end is reusable"
    );
}

#[tokio::test]
async fn a_stream_is_relayed_as_it_arrives() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (go_tx, mut go) = mpsc::unbounded_channel::<&'static str>();
    tokio::spawn(async move {
        let (mut io, _) = listener.accept().await.unwrap();
        read_request(&mut io).await.unwrap();
        io.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            .await
            .unwrap();
        while let Some(part) = go.recv().await {
            io.write_all(part.as_bytes()).await.unwrap();
        }
    });
    let client = Client::default();
    let mut body = client.send(post(&url, "")).await.unwrap().into_body();
    go_tx.send("6\r\ndata: ").unwrap();
    assert_eq!(
        body.frame().await.unwrap().unwrap().into_data().unwrap(),
        "data: "
    );
    // Split inside the chunk-size line and the CRLF after the data.
    go_tx.send("\r\n3").unwrap();
    go_tx.send("\r\nabc\r").unwrap();
    assert_eq!(
        body.frame().await.unwrap().unwrap().into_data().unwrap(),
        "abc"
    );
    go_tx.send("\n0\r\n\r\n").unwrap();
    assert!(body.frame().await.is_none());
    assert!(body.is_end_stream());
}

#[tokio::test]
async fn a_kept_connection_the_worker_closed_is_replaced_unseen() {
    let mut s = server(vec![
        closing("HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\na"),
        answer("HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nb"),
    ])
    .await;
    let client = Client::default();
    let resp = client.send(post(&s.url, "")).await.unwrap();
    assert_eq!(text(resp).await, "a");
    s.seen.recv().await.unwrap();
    // The worker's close may or may not have reached the client before the next send; it
    // is either dropped when taken or found unanswered and replaced.
    let resp = client.send(post(&s.url, "")).await.unwrap();
    assert_eq!(text(resp).await, "b");
    assert_eq!(s.accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn answers_that_cannot_carry_another_exchange_close_it() {
    for (text_, why) in [
        (
            "HTTP/1.1 200 OK\r\ncontent-length: 1\r\nconnection: close\r\n\r\na",
            "Connection: close",
        ),
        ("HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\na", "HTTP/1.0"),
    ] {
        let s = server(vec![answer(text_)]).await;
        let client = Client::default();
        let resp = client.send(post(&s.url, "")).await.unwrap();
        assert_eq!(text(resp).await, "a");
        assert_eq!(client.pool().idle(&s.host), 0, "{why}");
    }
    // Delimited by the close: read to the end, then nothing to keep.
    let s = server(vec![closing("HTTP/1.1 200 OK\r\n\r\nuntil close")]).await;
    let client = Client::default();
    let resp = client.send(post(&s.url, "")).await.unwrap();
    assert_eq!(text(resp).await, "until close");
    assert_eq!(client.pool().idle(&s.host), 0);
}

#[tokio::test]
async fn a_body_dropped_before_its_end_closes_the_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (closed_tx, closed) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut io, _) = listener.accept().await.unwrap();
        read_request(&mut io).await.unwrap();
        io.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npart")
            .await
            .unwrap();
        let mut rest = [0u8; 16];
        let _ = closed_tx.send(io.read(&mut rest).await.map_or(0, |n| n));
    });
    let client = Client::default();
    let resp = client.send(post(&url, "")).await.unwrap();
    let mut body = resp.into_body();
    assert_eq!(
        body.frame().await.unwrap().unwrap().into_data().unwrap(),
        "part"
    );
    drop(body);
    assert_eq!(closed.await.unwrap(), 0, "the worker saw the close");
}

#[tokio::test]
async fn short_and_broken_answers_are_errors() {
    // A body cut short by the close.
    let s = server(vec![closing(
        "HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc",
    )])
    .await;
    let client = Client::default();
    let body = client.send(post(&s.url, "")).await.unwrap().into_body();
    assert!(body.collect().await.is_err());
    assert_eq!(client.pool().idle(&s.host), 0);
    for bad in [
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabXY",
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\nab\r\n0\r\n\r\n",
    ] {
        let s = server(vec![answer(bad)]).await;
        let body = client.send(post(&s.url, "")).await.unwrap().into_body();
        assert!(body.collect().await.is_err(), "{bad:?}");
        assert_eq!(client.pool().idle(&s.host), 0);
    }
    // Not HTTP at all, and an answer that ends inside its head.
    for bad in [
        answer("SSH-2.0-OpenSSH_9.6\r\n\r\n"),
        closing("HTTP/1.1 200 OK\r\ncontent-le"),
    ] {
        let s = server(vec![bad]).await;
        let err = client.send(post(&s.url, "")).await.unwrap_err();
        assert_eq!(err, UpstreamError::Broken);
    }
}

#[tokio::test]
async fn a_fresh_connection_closed_unanswered_is_broken_not_resent() {
    let s = server(vec![closing("")]).await;
    let client = Client::default();
    let err = client.send(post(&s.url, "")).await.unwrap_err();
    assert_eq!(err, UpstreamError::Broken);
    assert_eq!(s.accepted.load(Ordering::SeqCst), 1, "sent once");
}

#[tokio::test]
async fn nothing_listening_is_a_connect_failure() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let err = Client::default().send(post(&url, "")).await.unwrap_err();
    assert_eq!(err, UpstreamError::Connect);
}

#[tokio::test]
async fn a_large_body_goes_out_whole_after_the_head() {
    let mut s = server(vec![answer("HTTP/1.1 204 No Content\r\n\r\n")]).await;
    let client = Client::default();
    let big = "x".repeat(COALESCE_BODY_BYTES * 3 + 7);
    let resp = client.send(post(&s.url, &big)).await.unwrap();
    assert_eq!(resp.status(), 204);
    assert!(resp.body().is_end_stream());
    let seen = s.seen.recv().await.unwrap();
    assert!(seen.ends_with(big.as_bytes()));
    assert_eq!(client.pool().idle(&s.host), 1);
}

#[tokio::test(start_paused = true)]
async fn idle_connections_expire_and_are_swept_for_every_host() {
    let ok = "HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\na";
    let (a, b) = (
        server(vec![answer(ok)]).await,
        server(vec![answer(ok)]).await,
    );
    let client = Client::default();
    assert_eq!(
        text(client.send(post(&a.url, "")).await.unwrap()).await,
        "a"
    );
    assert_eq!(client.pool().idle(&a.host), 1);
    tokio::time::advance(pool::IDLE_TIMEOUT + std::time::Duration::from_secs(1)).await;
    // Another host's use sweeps the expired one, which was never taken again.
    assert_eq!(
        text(client.send(post(&b.url, "")).await.unwrap()).await,
        "a"
    );
    assert_eq!(client.pool().idle(&a.host), 0);
    assert_eq!(client.pool().idle(&b.host), 1);
    tokio::time::advance(pool::IDLE_TIMEOUT + std::time::Duration::from_secs(1)).await;
    assert!(
        client.pool().take(&b.host).is_none(),
        "an expired one is not handed out"
    );
    assert_eq!(client.pool().idle(&b.host), 0);
}
