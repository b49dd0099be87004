//! The answer of a server-streaming gRPC call read straight off its HTTP/2 stream: the
//! response head, length-prefixed protobuf messages, and the status in the trailers.
//!
//! Invariants:
//! - A call succeeded only if the worker said so: `grpc-status: 0` in the trailers, or in the
//!   head of a trailers-only answer. A stream that ends without one, mid-message, or after a
//!   non-200 HTTP status is an error, never a short success.
//! - Every message is at most the stated limit, bounded before a byte of it is buffered, and
//!   uncompressed (the router never offers an encoding, so a compressed one is an error).
//! - Received bytes are handed back to the connection's flow-control window as soon as they
//!   are buffered here: the window stays open for the other streams on the connection, and
//!   what sits here is bounded by one message plus one DATA frame.
//! - Status codes follow gRPC's HTTP/2 mapping: RST_STREAM reasons as gRPC's protocol
//!   document lists them, HTTP statuses as its HTTP-to-gRPC table; an unreadable
//!   `grpc-status` is `Unknown`. `grpc-message` is percent-decoded.
//! - Dropping the answer before its end resets the stream (CANCEL), which tells the worker.

use std::marker::PhantomData;
use std::task::{Context, Poll, ready};

use bytes::{Buf as _, BytesMut};
use h2::RecvStream;
use http::{HeaderMap, StatusCode};
use tonic::{Code, Status};

/// Length of a message's prefix: the compressed flag and a big-endian u32 length.
const PREFIX: usize = 5;

/// A server-streaming call's answer: decoded `R` messages, then the call's status.
pub(super) struct Replies<R> {
    body: RecvStream,
    buf: BytesMut,
    limit: usize,
    state: State,
    _message: PhantomData<fn() -> R>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading DATA frames.
    Body,
    /// The body ended; the trailers are next.
    Trailers,
    /// The status was read (or an error returned): nothing follows.
    Done,
}

impl<R> Replies<R> {
    /// The answer whose head is `head`: an error when the head already says the call failed
    /// (an HTTP status other than 200, or a trailers-only answer with a non-zero status).
    pub(super) fn start(head: http::Response<RecvStream>, limit: usize) -> Result<Self, Status> {
        let (parts, body) = head.into_parts();
        if parts.status != StatusCode::OK {
            return Err(http_status(parts.status));
        }
        let mut state = State::Body;
        if let Some(status) = grpc_status(&parts.headers) {
            // Trailers-only: the head is the whole answer.
            if status.code() != Code::Ok {
                return Err(status);
            }
            state = State::Done;
        }
        Ok(Replies {
            body,
            buf: BytesMut::new(),
            limit,
            state,
            _message: PhantomData,
        })
    }
}

impl<R: prost::Message + Default> Replies<R> {
    /// The next message; `None` after a successful end. After an error, `None`.
    pub(super) fn poll_message(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<R, Status>>> {
        let r = self.poll_inner(cx);
        if let Poll::Ready(Some(Err(_)) | None) = r {
            self.state = State::Done;
        }
        r
    }

    fn poll_inner(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<R, Status>>> {
        loop {
            if let Some(message) = self.take_message().transpose() {
                return Poll::Ready(Some(message));
            }
            match self.state {
                State::Done => return Poll::Ready(None),
                State::Body => match ready!(self.body.poll_data(cx)) {
                    Some(Ok(chunk)) => {
                        // The bytes are ours now: let the worker send more.
                        let _ = self.body.flow_control().release_capacity(chunk.len());
                        self.buf.extend_from_slice(&chunk);
                    }
                    Some(Err(e)) => return Poll::Ready(Some(Err(h2_status(&e)))),
                    None if !self.buf.is_empty() => {
                        return Poll::Ready(Some(Err(Status::internal(
                            "the worker ended the stream in the middle of a message",
                        ))));
                    }
                    None => self.state = State::Trailers,
                },
                State::Trailers => {
                    let status = match ready!(self.body.poll_trailers(cx)) {
                        Ok(Some(trailers)) => grpc_status(&trailers).unwrap_or_else(no_status),
                        Ok(None) => no_status(),
                        Err(e) => h2_status(&e),
                    };
                    self.state = State::Done;
                    return Poll::Ready((status.code() != Code::Ok).then_some(Err(status)));
                }
            }
        }
    }

    /// The first whole message in the buffer, if there is one. Refuses a prefix announcing
    /// a message over the limit, or compressed, before its body arrives.
    fn take_message(&mut self) -> Result<Option<R>, Status> {
        let Some(prefix) = self.buf.get(..PREFIX) else {
            return Ok(None);
        };
        if prefix[0] != 0 {
            return Err(Status::internal(
                "the worker sent a compressed message, but no compression was offered",
            ));
        }
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if len > self.limit {
            return Err(Status::out_of_range(format!(
                "the worker sent a message of {len} bytes; the limit is {} bytes",
                self.limit
            )));
        }
        let Some(body) = self.buf.get(PREFIX..PREFIX + len) else {
            // Reserve what the rest needs once, not a doubling per DATA frame.
            self.buf.reserve(PREFIX + len - self.buf.len());
            return Ok(None);
        };
        let message = R::decode(body)
            .map_err(|e| Status::internal(format!("the worker's message does not decode: {e}")))?;
        self.buf.advance(PREFIX + len);
        Ok(Some(message))
    }
}

impl<R: prost::Message + Default> futures_util::Stream for Replies<R> {
    type Item = Result<R, Status>;

    fn poll_next(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_message(cx)
    }
}

fn no_status() -> Status {
    Status::internal("the worker ended the stream without a grpc-status")
}

/// The status `grpc-status` and `grpc-message` state, when `grpc-status` is there.
fn grpc_status(headers: &HeaderMap) -> Option<Status> {
    let code = headers.get("grpc-status")?;
    let code = std::str::from_utf8(code.as_bytes())
        .ok()
        .and_then(|c| c.parse::<i32>().ok())
        .map_or(Code::Unknown, Code::from_i32);
    let message = headers
        .get("grpc-message")
        .map(|m| percent_decode(m.as_bytes()))
        .unwrap_or_default();
    Some(Status::new(code, message))
}

/// `grpc-message`'s percent-encoding undone; bytes that are not valid UTF-8 are replaced.
fn percent_decode(raw: &[u8]) -> String {
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let escaped = match raw.get(i..i + 3) {
            Some([b'%', h, l]) => hex(*h).zip(hex(*l)).map(|(h, l)| (h * 16 + l) as u8),
            _ => None,
        };
        match escaped {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(raw[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A non-200 answer's status, by gRPC's HTTP-to-gRPC status table.
fn http_status(status: StatusCode) -> Status {
    let code = match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(code, format!("the worker answered HTTP {status}"))
}

/// A stream's HTTP/2 error as a status: a reset by its reason, as gRPC's protocol document
/// maps them, anything else (the connection lost) `Unknown`.
pub(super) fn h2_status(e: &h2::Error) -> Status {
    use h2::Reason;
    let code = match e.reason() {
        Some(
            Reason::NO_ERROR
            | Reason::PROTOCOL_ERROR
            | Reason::INTERNAL_ERROR
            | Reason::FLOW_CONTROL_ERROR
            | Reason::SETTINGS_TIMEOUT
            | Reason::FRAME_SIZE_ERROR
            | Reason::COMPRESSION_ERROR
            | Reason::CONNECT_ERROR,
        ) => Code::Internal,
        Some(Reason::REFUSED_STREAM) => Code::Unavailable,
        Some(Reason::CANCEL) => Code::Cancelled,
        Some(Reason::ENHANCE_YOUR_CALM) => Code::ResourceExhausted,
        Some(Reason::INADEQUATE_SECURITY) => Code::PermissionDenied,
        _ => Code::Unknown,
    };
    Status::new(code, format!("HTTP/2 stream to the worker failed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_message_is_percent_decoded() {
        assert_eq!(percent_decode(b"plain"), "plain");
        assert_eq!(percent_decode(b"a%20b%25c"), "a b%c");
        assert_eq!(percent_decode(b"%E2%82%AC"), "€");
        // Not an escape: kept as it is.
        assert_eq!(percent_decode(b"100%"), "100%");
        assert_eq!(percent_decode(b"%zz%2"), "%zz%2");
        assert_eq!(percent_decode(b"%FF"), "\u{fffd}");
    }

    #[test]
    fn statuses_follow_the_grpc_tables() {
        let mut h = HeaderMap::new();
        assert!(grpc_status(&h).is_none());
        h.insert("grpc-status", "12".parse().unwrap());
        h.insert("grpc-message", "no%20such%20method".parse().unwrap());
        let s = grpc_status(&h).unwrap();
        assert_eq!(
            (s.code(), s.message()),
            (Code::Unimplemented, "no such method")
        );
        h.insert("grpc-status", "x".parse().unwrap());
        assert_eq!(grpc_status(&h).unwrap().code(), Code::Unknown);
        h.insert("grpc-status", "99".parse().unwrap());
        assert_eq!(grpc_status(&h).unwrap().code(), Code::Unknown);
        for (http, code) in [
            (400, Code::Internal),
            (401, Code::Unauthenticated),
            (403, Code::PermissionDenied),
            (404, Code::Unimplemented),
            (429, Code::Unavailable),
            (502, Code::Unavailable),
            (503, Code::Unavailable),
            (504, Code::Unavailable),
            (500, Code::Unknown),
        ] {
            assert_eq!(
                http_status(StatusCode::from_u16(http).unwrap()).code(),
                code
            );
        }
        for (reason, code) in [
            (h2::Reason::REFUSED_STREAM, Code::Unavailable),
            (h2::Reason::CANCEL, Code::Cancelled),
            (h2::Reason::ENHANCE_YOUR_CALM, Code::ResourceExhausted),
            (h2::Reason::NO_ERROR, Code::Internal),
            (h2::Reason::PROTOCOL_ERROR, Code::Internal),
        ] {
            assert_eq!(h2_status(&h2::Error::from(reason)).code(), code);
        }
    }
}
