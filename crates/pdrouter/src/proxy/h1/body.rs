//! A worker's response body, read straight off the connection it came on, which it owns
//! until the body ends.
//!
//! Invariants:
//! - The connection goes back to the pool only when the framing ended exactly at the end of
//!   what was read, on a keep-alive answer; the moment it ends (not when the body is
//!   dropped), so the next request can take it even if this body's reader is slow to let go.
//!   A body that came whole with its head is taken off the connection, which goes home
//!   before the body is read.
//! - Dropped before its end, or on any error, the body closes the connection: the worker
//!   sees the close as the client leaving.
//! - Chunk-size lines and trailers are bounded ([`MAX_LINE`], [`MAX_TRAILERS`]); a body
//!   that ends early or breaks its framing is an error, never a short success.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf as _, Bytes};
use http::uri::Authority;
use http_body::{Frame, SizeHint};

use super::Conn;
use super::head::Framing;
use super::pool::Pool;

/// Longest chunk-size line, extensions included.
const MAX_LINE: usize = 4096;

/// Most bytes of trailers after the last chunk (read and dropped: no worker answer carries
/// any that the router uses).
const MAX_TRAILERS: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// This many body bytes left.
    Length(u64),
    /// Before a chunk-size line.
    ChunkSize,
    /// Inside a chunk, this many bytes left.
    ChunkData(u64),
    /// The CRLF after a chunk's data.
    ChunkEnd,
    /// After the last chunk, this many trailer bytes read so far.
    Trailers(usize),
    /// Everything until the worker closes.
    UntilClose,
    Done,
}

/// See the module docs.
#[derive(Debug)]
pub struct InlineBody {
    /// A whole body that came in with the head, taken off the connection so that the
    /// connection could go home at once.
    whole: Option<Bytes>,
    conn: Option<Conn>,
    state: State,
    keep_alive: bool,
    home: Arc<Pool>,
    host: Authority,
}

fn broken(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl InlineBody {
    pub(super) fn new(
        conn: Conn,
        framing: Framing,
        keep_alive: bool,
        home: Arc<Pool>,
        host: Authority,
    ) -> Self {
        let mut conn = conn;
        let mut whole = None;
        let state = match framing {
            Framing::Empty => State::Done,
            Framing::Length(n) if conn.buf.len() as u64 >= n => {
                whole = Some(conn.buf.split_to(n as usize).freeze());
                State::Done
            }
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::ChunkSize,
            Framing::UntilClose => State::UntilClose,
        };
        let mut body = Self {
            whole,
            conn: Some(conn),
            state,
            keep_alive,
            home,
            host,
        };
        if state == State::Done {
            body.finish();
        }
        body
    }

    /// The framing ended: the connection goes home if it can carry another exchange.
    fn finish(&mut self) {
        self.state = State::Done;
        if let Some(conn) = self.conn.take()
            && self.keep_alive
            && conn.buf.is_empty()
        {
            self.home.put(&self.host, conn);
        }
    }

    fn fail(&mut self, e: io::Error) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.state = State::Done;
        self.conn = None;
        Poll::Ready(Some(Err(e)))
    }

    /// Advances the framing over what is buffered, reading more when it needs to.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Bytes>>> {
        loop {
            // The state is `Done` exactly when the connection is gone.
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            let buf = &mut conn.buf;
            match self.state {
                State::Length(left) | State::ChunkData(left) if !buf.is_empty() => {
                    let take = left.min(buf.len() as u64);
                    let data = buf.split_to(take as usize).freeze();
                    let left = left - take;
                    match self.state {
                        State::Length(_) if left == 0 => self.finish(),
                        State::Length(_) => self.state = State::Length(left),
                        _ if left == 0 => self.state = State::ChunkEnd,
                        _ => self.state = State::ChunkData(left),
                    }
                    return Poll::Ready(Some(Ok(data)));
                }
                State::UntilClose if !buf.is_empty() => {
                    return Poll::Ready(Some(Ok(buf.split().freeze())));
                }
                State::ChunkSize => match take_line(buf) {
                    Err(e) => return Poll::Ready(Some(Err(e))),
                    Ok(Some(line)) => {
                        self.state = match chunk_size(&line) {
                            Ok(0) => State::Trailers(0),
                            Ok(size) => State::ChunkData(size),
                            Err(e) => return Poll::Ready(Some(Err(e))),
                        };
                        continue;
                    }
                    Ok(None) if buf.len() > MAX_LINE => {
                        return Poll::Ready(Some(Err(broken("chunk-size line too long"))));
                    }
                    Ok(None) => {}
                },
                State::ChunkEnd if buf.len() >= 2 => {
                    if &buf[..2] != b"\r\n" {
                        return Poll::Ready(Some(Err(broken("chunk data not followed by CRLF"))));
                    }
                    buf.advance(2);
                    self.state = State::ChunkSize;
                    continue;
                }
                State::Trailers(seen) => match take_line(buf) {
                    Err(e) => return Poll::Ready(Some(Err(e))),
                    Ok(Some(line)) if line.is_empty() => {
                        self.finish();
                        return Poll::Ready(None);
                    }
                    Ok(Some(line)) => {
                        let seen = seen + line.len() + 2;
                        if seen > MAX_TRAILERS {
                            return Poll::Ready(Some(Err(broken("trailers too long"))));
                        }
                        self.state = State::Trailers(seen);
                        continue;
                    }
                    Ok(None) if buf.len() > MAX_LINE => {
                        return Poll::Ready(Some(Err(broken("trailer line too long"))));
                    }
                    Ok(None) => {}
                },
                _ => {}
            }
            // Nothing complete buffered: read on.
            let conn = self.conn.as_mut().expect("checked above");
            let n = ready!(conn.poll_fill(cx))?;
            if n == 0 {
                if self.state == State::UntilClose {
                    self.state = State::Done;
                    self.conn = None;
                    return Poll::Ready(None);
                }
                return Poll::Ready(Some(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the worker closed the connection before the body's end",
                ))));
            }
        }
    }
}

/// The next line of `buf` without its line end, if a whole one is buffered.
fn take_line(buf: &mut bytes::BytesMut) -> io::Result<Option<Bytes>> {
    let Some(end) = buf.iter().position(|&b| b == b'\n') else {
        return Ok(None);
    };
    if end == 0 || buf[end - 1] != b'\r' {
        return Err(broken("line not ended by CRLF"));
    }
    let line = buf.split_to(end + 1).freeze();
    Ok(Some(line.slice(..end - 1)))
}

/// A chunk-size line's size (hex digits, then optional `;extensions`).
fn chunk_size(line: &[u8]) -> io::Result<u64> {
    let digits = line
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    if digits.is_empty() || digits.len() > 16 {
        return Err(broken("bad chunk size"));
    }
    let text = std::str::from_utf8(digits).map_err(|_| broken("bad chunk size"))?;
    u64::from_str_radix(text, 16).map_err(|_| broken("bad chunk size"))
}

impl http_body::Body for InlineBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        if let Some(data) = this.whole.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        match ready!(this.poll_next(cx)) {
            Some(Ok(data)) => Poll::Ready(Some(Ok(Frame::data(data)))),
            Some(Err(e)) => this.fail(e),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.state == State::Done && self.whole.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match (self.state, &self.whole) {
            (State::Length(n), _) => SizeHint::with_exact(n),
            (State::Done, whole) => {
                SizeHint::with_exact(whole.as_ref().map_or(0, |b| b.len() as u64))
            }
            _ => SizeHint::default(),
        }
    }
}
