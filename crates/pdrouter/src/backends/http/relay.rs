//! The response body relayed to the client, with everything the request holds riding inside it.
//!
//! [`RelayBody`] forwards the worker's frames one by one (SSE chunks are never buffered) and
//! owns the request's load guards, so load is released exactly when the body ends or the client
//! goes away, not when the response head is sent. In PD mode it also watches the Prefill leg:
//! a Prefill failure after the head was sent ends the stream with an SSE error event, a
//! client disconnect before the body finished cancels the Prefill leg too, and the end of the
//! Decode answer tells a Prefill leg still open that Decode is done (it frees its slot then).
//! A request that asked for logprobs has Decode's events pass through an [`SseMerge`]: events
//! carrying prompt logprobs wait for the Prefill's outcome, which brings the Prefill's list.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use crate::proxy::client::UpstreamBody;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

use super::PrefillLeg;
use super::logprobs::SseMerge;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::registry::LoadGuard;

/// Error type of the relayed body (the worker's connection broke mid-body).
pub type RelayError = Box<dyn std::error::Error + Send + Sync>;

/// Time-to-first-byte bookkeeping for PD.
#[derive(Debug)]
pub struct FirstByte {
    /// When the client request arrived.
    pub started: Instant,
    /// Where to record it.
    pub metrics: Arc<Metrics>,
}

/// Relayed worker body; see the module docs.
#[derive(Debug)]
pub struct RelayBody {
    read: VecDeque<Frame<Bytes>>,
    inner: Option<UpstreamBody>,
    prefill: Option<PrefillLeg>,
    streaming: bool,
    _load: LoadGuard,
    ttft: Option<FirstByte>,
    finished: bool,
    /// Merging the Prefill's prompt logprobs into Decode's events, with Decode's url.
    merge: Option<(SseMerge, Arc<str>)>,
}

impl RelayBody {
    /// Relays `read` (frames already read from the worker's body), then the rest of `inner`
    /// (`None` when the body was read to its end).
    pub fn new(
        inner: Option<UpstreamBody>,
        read: VecDeque<Frame<Bytes>>,
        prefill: Option<PrefillLeg>,
        streaming: bool,
        load: LoadGuard,
        ttft: Option<FirstByte>,
    ) -> Self {
        Self {
            read,
            inner,
            prefill,
            streaming,
            _load: load,
            ttft,
            finished: false,
            merge: None,
        }
    }

    /// Merges the Prefill's prompt logprobs into the relayed events (see the module docs).
    pub fn merging_logprobs(mut self, decode_url: &str) -> Self {
        self.merge = Some((SseMerge::default(), Arc::from(decode_url)));
        self
    }

    fn saw_data(&mut self) {
        if let Some(t) = self.ttft.take() {
            t.metrics.ttft(t.started.elapsed());
        }
    }

    /// The worker's answer is complete: a Prefill leg still open is told that Decode is done.
    fn complete(&mut self) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        self.finished = true;
        self.inner = None;
        self.merge = None;
        if let Some(p) = self.prefill.take() {
            p.decode_finished();
        }
        Poll::Ready(None)
    }

    fn fail(&mut self, err: ApiError) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        self.inner = None;
        self.finished = true;
        // Nothing read but not yet sent follows the error.
        self.read.clear();
        self.merge = None;
        if self.streaming {
            Poll::Ready(Some(Ok(Frame::data(err.sse_event()))))
        } else {
            Poll::Ready(Some(Err(err.message.into())))
        }
    }
}

impl RelayBody {
    /// [`Body::poll_frame`] when merging: Decode's frames go through the merger, which lets
    /// events out once the Prefill's lists are known (or when they need none).
    fn poll_merged(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        loop {
            let Some((merge, url)) = self.merge.as_mut() else {
                return Poll::Ready(None);
            };
            if let Some(event) = merge.pop() {
                self.saw_data();
                return Poll::Ready(Some(Ok(Frame::data(event))));
            }
            if self.finished {
                return Poll::Ready(None);
            }
            if let Some(p) = self.prefill.as_mut()
                && let Poll::Ready(outcome) = p.poll_outcome(cx)
            {
                let logprobs = p.take_kept();
                self.prefill = None;
                match outcome {
                    Ok(()) => merge.set_prefill(logprobs),
                    Err(e) => return self.fail(e),
                }
                continue;
            }
            if merge.waiting() && self.prefill.is_none() {
                // No leg to wait for (it was over before this body): nothing to merge.
                merge.set_prefill(None);
                continue;
            }
            let decode_done = self.inner.is_none() && self.read.is_empty();
            if decode_done {
                if merge.holding() {
                    // Decode is done; its held events wait for the Prefill's outcome, whose
                    // waker is registered above.
                    if let Some(p) = self.prefill.as_mut() {
                        p.decode_done();
                    }
                    return Poll::Pending;
                }
                return self.complete();
            }
            if merge.full() {
                return Poll::Pending;
            }
            let frame = match self.read.pop_front() {
                Some(f) => Some(Ok(f)),
                None => match self.inner.as_mut() {
                    Some(inner) => ready!(Pin::new(inner).poll_frame(cx)),
                    None => None,
                },
            };
            match frame {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref()
                        && merge.push(data).is_err()
                    {
                        let url = url.clone();
                        return self.fail(ApiError::upstream_too_large(
                            crate::error::Leg::Decode,
                            &url,
                            SseMerge::EVENT_LIMIT,
                        ));
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "worker body broke mid-stream");
                    let url = url.clone();
                    return self.fail(ApiError::upstream_broken(crate::error::Leg::Decode, &url));
                }
                None => {
                    merge.finish();
                    self.inner = None;
                }
            }
        }
    }
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = RelayError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.merge.is_some() {
            return this.poll_merged(cx);
        }
        if let Some(f) = this.read.pop_front() {
            if f.is_data() {
                this.saw_data();
            }
            return Poll::Ready(Some(Ok(f)));
        }
        if this.finished {
            return Poll::Ready(None);
        }
        if let Some(p) = this.prefill.as_mut()
            && let Poll::Ready(outcome) = p.poll_outcome(cx)
        {
            this.prefill = None;
            if let Err(e) = outcome {
                return this.fail(e);
            }
        }
        let Some(inner) = this.inner.as_mut() else {
            return this.complete();
        };
        match ready!(Pin::new(inner).poll_frame(cx)) {
            Some(Ok(frame)) => {
                if frame.is_data() {
                    this.saw_data();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "worker body broke mid-stream");
                this.fail(ApiError::upstream_broken(
                    crate::error::Leg::Decode,
                    "(stream)",
                ))
            }
            None => this.complete(),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished && self.read.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
