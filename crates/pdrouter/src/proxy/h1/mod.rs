//! HTTP/1.1 to plain `http://` workers, on the task of the request that uses the
//! connection.
//!
//! A pooled client that runs each connection as a task of its own hands every request to it
//! and every answer back through channels: two task wake-ups per leg (and, with several
//! runtime threads, a thread crossing), plus a pool checkout future and the dispatch
//! machinery. Here the request's own task writes the request and reads the answer's head;
//! the response body owns the connection until its end and then puts it back in the
//! [`pool::Pool`]. `https://` workers keep the TLS-capable pooled client.
//!
//! Invariants:
//! - A request goes out at most twice, the second time on a new connection, and only when the
//!   first went out on a reused connection that ended before a byte of the answer came
//!   back: the worker had closed the idle connection as the request was sent, so it never
//!   saw the request.
//! - Every connection ends with the exchange on it unless the exchange ended cleanly on a
//!   keep-alive answer (see [`body`]); a dropped request future closes its connection, which
//!   is how the worker learns that the client left.
//! - Connecting is bounded by [`CONNECT_TIMEOUT`]; the whole head exchange by the caller's
//!   timeout.

pub mod body;
pub mod head;
pub mod pool;

#[cfg(test)]
mod tests;

use std::future::poll_fn;
use std::io;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::uri::Authority;
use http::{Method, Request, Response};
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;

pub use body::InlineBody;
pub use head::Fields;

use super::error::UpstreamError;

/// Longest wait for a new connection (the pooled client's setting).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// TCP keep-alive idle time on worker connections: a worker host that vanished without a
/// close is noticed during a long stream.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// Bodies up to this size go out in the same write as the head.
const COALESCE_BODY_BYTES: usize = 16 * 1024;

/// Smallest free space a read is given.
const READ_CHUNK: usize = 8 * 1024;

/// A connection and what was read from it but not yet taken.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) io: TcpStream,
    pub(crate) buf: BytesMut,
}

impl Conn {
    fn new(io: TcpStream) -> Self {
        Self {
            io,
            buf: BytesMut::new(),
        }
    }

    /// Reads what the socket has into the buffer: the byte count, 0 at the end of the stream.
    pub(crate) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < READ_CHUNK / 2 {
            self.buf.reserve(READ_CHUNK);
        }
        loop {
            ready!(self.io.poll_read_ready(cx))?;
            match self.io.try_read_buf(&mut self.buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }
}

/// How one attempt of an exchange failed.
enum Failure {
    /// The connection ended before any of the answer: safe to send again on a new one if
    /// this one was reused.
    Unanswered,
    /// Anything else.
    Broken,
}

/// The inline client: see the module docs.
#[derive(Debug, Default)]
pub struct Client {
    pool: Arc<pool::Pool>,
}

impl Client {
    /// Sends `req` (an `http://` URL with a host) and returns the answer's head, its body
    /// still on the connection. The caller bounds the time.
    #[cfg(test)]
    pub async fn send(&self, req: Request<Bytes>) -> Result<Response<InlineBody>, UpstreamError> {
        self.send_with(req, head::Fields::Kept).await
    }

    /// [`Client::send`], with the answer's header fields kept or not.
    pub async fn send_with(
        &self,
        req: Request<Bytes>,
        fields: head::Fields,
    ) -> Result<Response<InlineBody>, UpstreamError> {
        let host = req
            .uri()
            .authority()
            .cloned()
            .ok_or(UpstreamError::Connect)?;
        let body_len = req.body().len();
        let mut head = Vec::with_capacity(256 + body_len.min(COALESCE_BODY_BYTES));
        head::write_request_head(&req, host.as_str(), body_len, &mut head);
        let (parts, mut body) = req.into_parts();
        if body_len <= COALESCE_BODY_BYTES {
            head.extend_from_slice(&body);
            body = Bytes::new();
        }
        let method = parts.method;
        if let Some(conn) = self.pool.take(&host) {
            match exchange(conn, &head, &body, &method, fields).await {
                Ok((h, conn)) => return Ok(self.answer(h, conn, host)),
                Err(Failure::Broken) => return Err(UpstreamError::Broken),
                Err(Failure::Unanswered) => {
                    tracing::debug!(%host, "a kept connection was closed; sending on a new one");
                }
            }
        }
        let io = connect(&host).await?;
        match exchange(Conn::new(io), &head, &body, &method, fields).await {
            Ok((h, conn)) => Ok(self.answer(h, conn, host)),
            Err(_) => Err(UpstreamError::Broken),
        }
    }

    fn answer(&self, head: head::Head, conn: Conn, host: Authority) -> Response<InlineBody> {
        let (parts, ()) = head.response.into_parts();
        let body = InlineBody::new(conn, head.framing, head.keep_alive, self.pool.clone(), host);
        Response::from_parts(parts, body)
    }

    /// The idle connection pool (for the tests' counts).
    #[cfg(test)]
    pub(crate) fn pool(&self) -> &pool::Pool {
        &self.pool
    }
}

/// Opens a connection to `host` (its port, or 80), Nagle off and TCP keep-alive on.
async fn connect(host: &Authority) -> Result<TcpStream, UpstreamError> {
    let name = host.host().trim_start_matches('[').trim_end_matches(']');
    let port = host.port_u16().unwrap_or(80);
    let io = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((name, port))).await {
        Ok(Ok(io)) => io,
        Ok(Err(e)) => {
            tracing::debug!(%host, error = %e, "connecting to the worker failed");
            return Err(UpstreamError::Connect);
        }
        Err(_) => {
            tracing::debug!(%host, "connecting to the worker timed out");
            return Err(UpstreamError::Connect);
        }
    };
    // Small SSE frames must not wait for an acknowledgement.
    let _ = io.set_nodelay(true);
    let keepalive = socket2::TcpKeepalive::new().with_time(TCP_KEEPALIVE);
    let _ = socket2::SockRef::from(&io).set_tcp_keepalive(&keepalive);
    Ok(io)
}

/// Writes the request (`head`, with the body in it or in `body`) and reads the answer's
/// head; the connection comes back with the bytes read past the head.
async fn exchange(
    mut conn: Conn,
    head: &[u8],
    body: &[u8],
    method: &Method,
    fields: head::Fields,
) -> Result<(head::Head, Conn), Failure> {
    let written = async {
        conn.io.write_all(head).await?;
        if !body.is_empty() {
            conn.io.write_all(body).await?;
        }
        io::Result::Ok(())
    };
    if written.await.is_err() {
        return Err(Failure::Unanswered);
    }
    loop {
        let n = match poll_fn(|cx| conn.poll_fill(cx)).await {
            Ok(n) => n,
            Err(_) if conn.buf.is_empty() => return Err(Failure::Unanswered),
            Err(_) => return Err(Failure::Broken),
        };
        if n == 0 {
            return Err(if conn.buf.is_empty() {
                Failure::Unanswered
            } else {
                Failure::Broken
            });
        }
        match head::parse_response_head(&conn.buf, method, fields) {
            Ok(Some(h)) => {
                let _ = conn.buf.split_to(h.len);
                return Ok((h, conn));
            }
            Ok(None) => {}
            Err(head::BrokenHead) => return Err(Failure::Broken),
        }
    }
}
