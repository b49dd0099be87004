//! The bytes of an HTTP/1.1 exchange's heads: the request head the router writes, and the
//! response head it parses, with what frames the body that follows (RFC 9112 §6).
//!
//! Invariants:
//! - A response head is accepted only whole and within [`MAX_HEAD_BYTES`] and
//!   [`MAX_HEADERS`]; anything else is [`BrokenHead`], never a partial answer.
//! - The framing is decided once, here: no body (HEAD, 1xx, 204, 304), chunked (the last
//!   transfer coding), a length (every `Content-Length` agreeing), or up to the close.
//! - A connection is reusable after the body only on an HTTP/1.1 answer whose framing ends by
//!   itself and that does not say `Connection: close`.

use std::mem::MaybeUninit;

use http::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode, Version};

/// Largest response head read (hyper's default buffer bound is of the same order).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Most header fields in a response head (hyper's default).
pub const MAX_HEADERS: usize = 100;

/// How the body after a head is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body at all.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Everything until the worker closes the connection.
    UntilClose,
}

/// Whether a response head's fields are wanted as a `HeaderMap`, or only its status and
/// framing (a Prefill leg's answer, whose fields nobody reads: making the map is most of a
/// head's parsing cost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fields {
    Kept,
    Dropped,
}

/// A parsed response head.
#[derive(Debug)]
pub struct Head {
    pub response: Response<()>,
    pub framing: Framing,
    /// Whether the connection may carry another exchange once the body is read.
    pub keep_alive: bool,
    /// Bytes of the buffer the head took.
    pub len: usize,
}

/// A response head that cannot be taken: not HTTP/1.x, over a bound, or with framing that
/// contradicts itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokenHead;

/// Appends `req`'s head to `out`: request line, `Host` (unless given), the request's own
/// headers, and the body's length.
pub fn write_request_head<B>(
    req: &http::Request<B>,
    authority: &str,
    body_len: usize,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(req.method().as_str().as_bytes());
    out.push(b' ');
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    if !req.headers().contains_key(HOST) {
        push_header(out, HOST.as_str(), authority.as_bytes());
    }
    for (name, value) in req.headers() {
        // The length is the body's own; a transfer coding is never applied to a body
        // sent whole.
        if name == CONTENT_LENGTH || name == TRANSFER_ENCODING {
            continue;
        }
        push_header(out, name.as_str(), value.as_bytes());
    }
    // A GET or HEAD without a body says nothing of one, as clients do.
    if body_len > 0 || !matches!(*req.method(), Method::GET | Method::HEAD) {
        let mut digits = [0u8; 20];
        push_header(
            out,
            CONTENT_LENGTH.as_str(),
            format_len(body_len, &mut digits),
        );
    }
    out.extend_from_slice(b"\r\n");
}

fn push_header(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// `n` in decimal, written into `buf`'s end.
fn format_len(mut n: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// Parses the response head at the start of `buf`: `Ok(None)` while it is incomplete.
/// Interim (1xx) answers before the final one are skipped; `len` counts them too. With
/// [`Fields::Dropped`] the response carries no headers (they are checked all the same:
/// httparse admits exactly the names and values a `HeaderMap` does).
pub fn parse_response_head(
    buf: &[u8],
    method: &Method,
    fields: Fields,
) -> Result<Option<Head>, BrokenHead> {
    let mut offset = 0;
    loop {
        let Some(mut head) = parse_one(&buf[offset..], method, fields)? else {
            return if buf.len() > MAX_HEAD_BYTES {
                Err(BrokenHead)
            } else {
                Ok(None)
            };
        };
        let status = head.response.status();
        if status.is_informational() {
            // 101 would switch protocols, which the router never asks for.
            if status == StatusCode::SWITCHING_PROTOCOLS {
                return Err(BrokenHead);
            }
            offset += head.len;
            continue;
        }
        head.len += offset;
        if head.len > MAX_HEAD_BYTES {
            return Err(BrokenHead);
        }
        return Ok(Some(head));
    }
}

fn parse_one(buf: &[u8], method: &Method, keep: Fields) -> Result<Option<Head>, BrokenHead> {
    // Left uninitialised: httparse writes the fields it finds, and an initialised array
    // would cost a few kilobytes of stores per answer.
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut parsed,
        buf,
        &mut fields,
    ) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(BrokenHead),
    };
    let status = parsed
        .code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or(BrokenHead)?;
    let http11 = parsed.version == Some(1);
    let mut headers = HeaderMap::new();
    if keep == Fields::Kept {
        headers.reserve(parsed.headers.len());
        for field in parsed.headers.iter() {
            let name = HeaderName::from_bytes(field.name.as_bytes()).map_err(|_| BrokenHead)?;
            let value = HeaderValue::from_bytes(field.value).map_err(|_| BrokenHead)?;
            headers.append(name, value);
        }
    }
    // Read off the parsed fields (every one a valid name and value by now), not the map:
    // no hashing of names the answer usually does not have.
    let framing = framing_of(status, method, parsed.headers)?;
    let close = has_token(parsed.headers, "connection", "close");
    let keep_alive = http11 && !close && framing != Framing::UntilClose;
    let mut response = Response::new(());
    *response.status_mut() = status;
    *response.version_mut() = if http11 {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    *response.headers_mut() = headers;
    Ok(Some(Head {
        response,
        framing,
        keep_alive,
        len,
    }))
}

/// RFC 9112 §6.3, for a client.
fn framing_of(
    status: StatusCode,
    method: &Method,
    fields: &[httparse::Header<'_>],
) -> Result<Framing, BrokenHead> {
    if *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok(Framing::Empty);
    }
    if named(fields, "transfer-encoding").next().is_some() {
        // Only a final `chunked` delimits the body; any other coding runs to the close.
        return Ok(match tokens(fields, "transfer-encoding").last() {
            Some(t) if t.eq_ignore_ascii_case("chunked") => Framing::Chunked,
            _ => Framing::UntilClose,
        });
    }
    let mut length = None;
    for value in named(fields, "content-length") {
        let text = visible(value).ok_or(BrokenHead)?;
        for part in text.split(',') {
            let part = part.trim();
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(BrokenHead);
            }
            let n: u64 = part.parse().map_err(|_| BrokenHead)?;
            if length.is_some_and(|l| l != n) {
                return Err(BrokenHead);
            }
            length = Some(n);
        }
    }
    Ok(match length {
        Some(0) => Framing::Empty,
        Some(n) => Framing::Length(n),
        None => Framing::UntilClose,
    })
}

/// The values of the fields called `name` (lowercase), in order.
fn named<'a>(
    fields: &'a [httparse::Header<'_>],
    name: &'static str,
) -> impl Iterator<Item = &'a [u8]> {
    fields
        .iter()
        .filter(move |f| f.name.eq_ignore_ascii_case(name))
        .map(|f| f.value)
}

/// A value as text when it is visible ASCII (tabs allowed), as `HeaderValue::to_str`.
fn visible(value: &[u8]) -> Option<&str> {
    std::str::from_utf8(value)
        .ok()
        .filter(|v| v.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b)))
}

/// The tokens of a comma-separated header, all its fields in order, empty ones skipped.
fn tokens<'a>(
    fields: &'a [httparse::Header<'_>],
    name: &'static str,
) -> impl Iterator<Item = &'a str> {
    named(fields, name)
        .filter_map(visible)
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Whether a comma-separated header lists `token` (case-insensitive).
fn has_token(fields: &[httparse::Header<'_>], name: &'static str, token: &str) -> bool {
    tokens(fields, name).any(|t| t.eq_ignore_ascii_case(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Head {
        parse_response_head(text.as_bytes(), &Method::POST, Fields::Kept)
            .unwrap()
            .expect("complete")
    }

    #[test]
    fn the_request_head_carries_host_headers_and_the_length() {
        let req = http::Request::post("http://w:8000/generate?x=1")
            .header("content-type", "application/json")
            .header("content-length", "999")
            .body(())
            .unwrap();
        let mut out = Vec::new();
        write_request_head(&req, "w:8000", 12, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /generate?x=1 HTTP/1.1\r\nhost: w:8000\r\ncontent-type: application/json\r\n\
             content-length: 12\r\n\r\n"
        );
        let get = http::Request::get("http://w/health").body(()).unwrap();
        let mut out = Vec::new();
        write_request_head(&get, "w", 0, &mut out);
        assert_eq!(out, b"GET /health HTTP/1.1\r\nhost: w\r\n\r\n");
        let empty_post = http::Request::post("http://w/").body(()).unwrap();
        let mut out = Vec::new();
        write_request_head(&empty_post, "w", 0, &mut out);
        assert!(out.ends_with(b"content-length: 0\r\n\r\n"));
    }

    #[test]
    fn framing_follows_the_head() {
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello");
        assert_eq!(
            (h.framing, h.keep_alive, h.len),
            (Framing::Length(5), true, 38)
        );
        assert_eq!(h.response.headers()["content-length"], "5");
        let h = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Chunked, true));
        let h = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::UntilClose, false));
        let h = head("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::UntilClose, false));
        let h = head("HTTP/1.1 204 No Content\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Empty, true));
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: Close\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Empty, false));
        let h = head("HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Length(2), false));
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 7, 7\r\ncontent-length: 7\r\n\r\n");
        assert_eq!(h.framing, Framing::Length(7));
        let resp = b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n";
        let h = parse_response_head(resp, &Method::HEAD, Fields::Kept)
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Empty);
    }

    #[test]
    fn a_head_read_for_its_status_has_the_same_framing_and_no_fields() {
        let texts = [
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-a: 1\r\n\r\nhello",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 503 Busy\r\nConnection: close\r\ncontent-length: 2\r\n\r\n",
            "HTTP/1.0 200 OK\r\nserver: w\r\n\r\n",
        ];
        for text in texts {
            let kept = head(text);
            let dropped = parse_response_head(text.as_bytes(), &Method::POST, Fields::Dropped)
                .unwrap()
                .unwrap();
            assert_eq!(
                (
                    kept.response.status(),
                    kept.framing,
                    kept.keep_alive,
                    kept.len
                ),
                (
                    dropped.response.status(),
                    dropped.framing,
                    dropped.keep_alive,
                    dropped.len
                ),
                "{text:?}"
            );
            assert!(!kept.response.headers().is_empty());
            assert!(dropped.response.headers().is_empty());
        }
    }

    #[test]
    fn interim_answers_are_skipped() {
        let text =
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 1\r\n\r\nx";
        let h = head(text);
        assert_eq!(h.response.status(), StatusCode::CREATED);
        assert_eq!(&text[h.len..], "x");
        let partial = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n";
        assert!(
            parse_response_head(partial.as_bytes(), &Method::POST, Fields::Kept)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn bad_heads_are_broken_not_partial() {
        let bad = [
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\n\r\n",
            "HTTP/2 200\r\n\r\n",
            "SSH-2.0-OpenSSH\r\n\r\n",
            "HTTP/1.1 999999 Big\r\n\r\n",
        ];
        for text in bad {
            for fields in [Fields::Kept, Fields::Dropped] {
                assert_eq!(
                    parse_response_head(text.as_bytes(), &Method::POST, fields).unwrap_err(),
                    BrokenHead,
                    "{text:?}"
                );
            }
        }
        let many: String = (0..=MAX_HEADERS).map(|i| format!("x-{i}: v\r\n")).collect();
        let text = format!("HTTP/1.1 200 OK\r\n{many}\r\n");
        assert!(parse_response_head(text.as_bytes(), &Method::POST, Fields::Kept).is_err());
        let endless = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD_BYTES));
        assert!(parse_response_head(endless.as_bytes(), &Method::POST, Fields::Dropped).is_err());
        // Names and values a header map refuses are refused without one too.
        for field in ["bad name: v", "x: a\x01b", "x: a\x7fb", "(x): v"] {
            let text = format!("HTTP/1.1 200 OK\r\n{field}\r\ncontent-length: 0\r\n\r\n");
            for fields in [Fields::Kept, Fields::Dropped] {
                assert!(
                    parse_response_head(text.as_bytes(), &Method::POST, fields).is_err(),
                    "{field:?} {fields:?}"
                );
            }
        }
    }
}
