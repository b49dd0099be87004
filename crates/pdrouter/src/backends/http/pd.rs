//! HTTP PD: one Prefill and one Decode request per client request, sent at once, each the
//! client's body with the same KV bootstrap ticket.
//!
//! Order, once the core has picked and admitted the pair:
//! 1. Both legs are sent at once. The Prefill leg is the core's leg task
//!    ([`crate::core::leg`]), here over an HTTP exchange whose body it drains ([`HttpPrefill`]).
//! 2. The client's response head is sent once Decode answered and either the Prefill phase
//!    is over or (streaming only) Decode produced its first frame; a Prefill failure before
//!    that is answered with its real status, after it as an SSE error event. A client
//!    disconnect aborts both legs.
//! 3. A `/generate` request with `return_logprob` keeps the Prefill answer (bounded) to put its
//!    prompt logprobs in front of Decode's ([`super::logprobs`]): the leg's outcome then waits
//!    for the Prefill body's end (the grace bounds it after Decode is done), a non-streaming
//!    answer is read whole and merged, and streamed events carrying the list wait for the
//!    outcome. The slot and load are released as without it.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;

use crate::proxy::client::UpstreamBody;
use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http_body::Frame;
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::PrefillLeg;
use super::bootstrap;
use super::exchange::{exchange, exchange_with, relay_response};
use super::logprobs::{PromptLogprobs, SseMerge};
use super::relay::{FirstByte, RelayBody};
use crate::core::leg::{self, LegJob, PrefillAnswer, PrefillHolds};
use crate::core::{Core, Pair, RequestCtx, worker_ok};
use crate::error::{ApiError, Leg};
use crate::proxy::client::UpstreamClient;
use crate::registry::Worker;
use crate::request::ParsedRequest;

/// Most bytes of a Prefill answer kept to read its prompt logprobs (the cap on every worker
/// body the router reads whole).
const PREFILL_CAPTURE_LIMIT: usize = crate::proxy::client::INFO_BODY_LIMIT;

/// Most bytes of a non-streaming Decode answer read whole to merge prompt logprobs into it.
const DECODE_MERGE_LIMIT: usize = SseMerge::EVENT_LIMIT;

/// A Prefill worker's HTTP answer, drained by the leg task.
struct HttpPrefill {
    body: UpstreamBody,
    worker: Arc<Worker>,
}

impl PrefillAnswer for HttpPrefill {
    type Kept = PromptLogprobs;

    async fn drain(&mut self, keep: bool) -> Result<Option<PromptLogprobs>, ApiError> {
        let url = self.worker.url();
        let mut kept = Vec::new();
        while let Some(frame) = self.body.frame().await {
            let frame = frame.map_err(|_| ApiError::upstream_broken(Leg::Prefill, url))?;
            if let (true, Some(data)) = (keep, frame.data_ref()) {
                if kept.len() + data.len() > PREFILL_CAPTURE_LIMIT {
                    return Err(ApiError::upstream_too_large(
                        Leg::Prefill,
                        url,
                        PREFILL_CAPTURE_LIMIT,
                    ));
                }
                kept.extend_from_slice(data);
            }
        }
        Ok(keep.then(|| PromptLogprobs::from_body(&kept)))
    }
}

/// What the two legs are sent when it is not SGLang's bootstrap ticket: the bodies, and
/// headers for the Prefill worker only.
pub(super) struct Legs {
    pub(super) prefill: Bytes,
    pub(super) decode: Bytes,
    pub(super) prefill_headers: Vec<(http::HeaderName, http::HeaderValue)>,
}

/// Sends both legs to `pair` (`legs`, else the client's body with one bootstrap ticket) and
/// relays Decode's answer.
pub(super) async fn send(
    client: &UpstreamClient,
    core: &Core,
    req: &ParsedRequest,
    ctx: &RequestCtx,
    pair: Pair,
    legs: Option<Legs>,
) -> Result<Response, ApiError> {
    let Pair {
        prefill,
        permit,
        prefill_load,
        decode,
        decode_load,
    } = pair;
    let (prefill_body, decode_body, prefill_headers) = match legs {
        Some(l) => (l.prefill, l.decode, l.prefill_headers),
        None => {
            let (p, d) = bootstrap::bodies(req, &prefill, &decode);
            (p, d, Vec::new())
        }
    };
    let capture = req.logprobs;
    let path = req.endpoint.path();
    let timeout = core.cfg.request_timeout;
    let start = {
        let client = client.clone();
        let worker = prefill.clone();
        let ctx = ctx.clone();
        move || async move {
            let head = exchange_with(
                &client,
                &worker,
                Leg::Prefill,
                path,
                prefill_body,
                &ctx,
                timeout,
                prefill_headers,
            )
            .await?;
            Ok(HttpPrefill {
                body: head.into_body(),
                worker,
            })
        }
    };
    let deadline = crate::config::deadline_after(Instant::now(), timeout);
    let holds = PrefillHolds::new(permit, prefill_load);
    let job = LegJob::new(core, prefill, holds, deadline, capture);
    let mut leg = leg::spawn(start, job);

    let decode_head = tracing::Instrument::instrument(
        exchange(
            client,
            &decode,
            Leg::Decode,
            path,
            decode_body,
            ctx,
            timeout,
        ),
        crate::telemetry::leg_span(Leg::Decode, decode.url()),
    );
    // Pinned here, not moved into `beside`: the exchange's future is large.
    tokio::pin!(decode_head);
    // A Prefill failure cancels the Decode leg (dropped on return).
    let (head, prefill_done) = leg.beside(&mut decode_head).await?;
    core.registry.record_outcome(&decode, worker_ok(&head));
    let resp = head?;
    let (parts, mut body) = resp.into_parts();
    let mut read = VecDeque::new();
    let mut decode_complete = false;
    if !prefill_done {
        let wait = prefill_or_decode(&mut leg, &mut body, &mut read, req.stream, &decode);
        decode_complete = match tokio::time::timeout(timeout, wait).await {
            Ok(r) => r?,
            Err(_) => return Err(ApiError::upstream_timeout(Leg::Decode, decode.url())),
        };
    }
    let decoded = Decoded {
        parts,
        body,
        read,
        complete: decode_complete,
        load: decode_load,
    };
    let first_byte = FirstByte {
        started: ctx.started,
        metrics: core.metrics.clone(),
    };
    if capture && !req.stream {
        // Boxed: the rare path's state stays out of every request's future.
        return Box::pin(merged(timeout, &decode, leg, decoded, first_byte)).await;
    }
    Ok(relay(req, &decode, leg, decoded, first_byte))
}

/// Decode's answer as far as it was read before the client's response head.
struct Decoded {
    parts: http::response::Parts,
    body: UpstreamBody,
    read: VecDeque<Frame<Bytes>>,
    /// The whole answer is in `read` (the Prefill leg was told so).
    complete: bool,
    load: crate::registry::LoadGuard,
}

/// A non-streaming answer that asked for prompt logprobs: the Prefill phase is over (such an
/// answer waits for it), so Decode's whole answer is read and the Prefill's prompt logprobs
/// merged into it.
async fn merged(
    timeout: std::time::Duration,
    decode: &Worker,
    mut leg: PrefillLeg,
    decoded: Decoded,
    first_byte: FirstByte,
) -> Result<Response, ApiError> {
    let Decoded {
        mut parts,
        body,
        read,
        complete,
        load,
    } = decoded;
    let rest = (!complete).then_some(body);
    let whole = read_whole(read, rest, timeout, decode).await?;
    let merged = match leg.take_kept() {
        Some(lp) => lp.merge_body(whole),
        None => whole,
    };
    parts.headers.remove(http::header::CONTENT_LENGTH);
    let read = VecDeque::from([Frame::data(merged)]);
    let relay = RelayBody::new(None, read, None, false, load, Some(first_byte));
    Ok(relay_response(parts, Body::new(relay)))
}

/// The client's answer: Decode's body relayed frame by frame (through the prompt-logprobs
/// merger when asked for), owning the Decode load and, while it runs, the Prefill leg.
fn relay(
    req: &ParsedRequest,
    decode: &Worker,
    leg: PrefillLeg,
    decoded: Decoded,
    first_byte: FirstByte,
) -> Response {
    let Decoded {
        parts,
        body,
        read,
        complete,
        load,
    } = decoded;
    let capture = req.logprobs;
    let (inner, leg) = match (complete, capture) {
        (true, false) => {
            leg.decode_finished();
            (None, None)
        }
        // Decode's events wait for the Prefill's logprobs; Decode is done already.
        (true, true) => (None, Some(leg)),
        (false, _) => (Some(body), Some(leg)),
    };
    let mut relay = RelayBody::new(inner, read, leg, req.stream, load, Some(first_byte));
    if capture {
        relay = relay.merging_logprobs(decode.url());
    }
    relay_response(parts, Body::new(relay))
}

/// Decode's whole answer: the frames `read` so far, then the rest of `body` (at most
/// [`DECODE_MERGE_LIMIT`] bytes in all, within `timeout`).
async fn read_whole(
    read: VecDeque<Frame<Bytes>>,
    body: Option<UpstreamBody>,
    timeout: std::time::Duration,
    decode: &Worker,
) -> Result<Bytes, ApiError> {
    let too_large = || ApiError::upstream_too_large(Leg::Decode, decode.url(), DECODE_MERGE_LIMIT);
    let mut whole = bytes::BytesMut::new();
    for f in read {
        if let Some(d) = f.data_ref() {
            whole.extend_from_slice(d);
        }
    }
    let Some(mut body) = body else {
        return Ok(whole.freeze());
    };
    let rest = async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| ApiError::upstream_broken(Leg::Decode, decode.url()))?;
            if let Some(d) = frame.data_ref() {
                if whole.len() + d.len() > DECODE_MERGE_LIMIT {
                    return Err(too_large());
                }
                whole.extend_from_slice(d);
            }
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, rest).await {
        Ok(r) => r?,
        Err(_) => return Err(ApiError::upstream_timeout(Leg::Decode, decode.url())),
    }
    Ok(whole.freeze())
}

/// Most Decode bytes a non-streaming request reads ahead while it waits for Prefill to end;
/// past it, it waits for Prefill without reading on.
const DECODE_READ_AHEAD: usize = 4 << 20;

/// Waits, once Decode's response head is in, until the client's response can start. Returns
/// whether Decode's whole answer is already in `read` (the Prefill leg was then told so).
///
/// Streaming: until the Prefill phase is over or Decode's first frame arrives. Non-streaming:
/// until the Prefill phase is over, which includes "Decode has the whole answer and the
/// Prefill worker has answered". A non-streaming answer is one block that real engines can
/// only finish after Prefill did, so waiting for Prefill costs nothing and lets a Prefill
/// failure surface as its real status (and be retried) — but once Decode has the whole
/// answer, the KV has moved and a Prefill body that does not end must not hold it.
async fn prefill_or_decode(
    leg: &mut PrefillLeg,
    body: &mut UpstreamBody,
    read: &mut VecDeque<Frame<Bytes>>,
    stream: bool,
    decode: &Worker,
) -> Result<bool, ApiError> {
    let mut read_bytes = 0;
    let mut decode_complete = false;
    loop {
        tokio::select! {
            biased;
            outcome = poll_fn(|cx| leg.poll_outcome(cx)) => {
                outcome?;
                return Ok(decode_complete);
            }
            frame = body.frame(), if !decode_complete && read_bytes <= DECODE_READ_AHEAD => {
                match frame {
                    Some(Ok(f)) => {
                        read_bytes += f.data_ref().map_or(0, Bytes::len);
                        read.push_back(f);
                        if stream {
                            return Ok(false);
                        }
                    }
                    Some(Err(_)) => {
                        return Err(ApiError::upstream_broken(Leg::Decode, decode.url()));
                    }
                    None => {
                        decode_complete = true;
                        leg.decode_done();
                        if stream {
                            return Ok(true);
                        }
                    }
                }
            }
        }
    }
}
