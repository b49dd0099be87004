//! The response body relayed to the client, with everything the request holds riding inside it.
//!
//! [`RelayBody`] forwards the worker's frames one by one (SSE chunks are never buffered) and
//! owns the request's load guards, so load is released exactly when the body ends or the client
//! goes away, not when the response head is sent. In PD mode it also watches the Prefill leg:
//! a Prefill failure after the head was sent ends the stream with an SSE error event, a
//! client disconnect before the body finished cancels the Prefill leg too, and the end of the
//! Decode answer tells a Prefill leg still open that Decode is done (it frees its slot then).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::pd::PrefillLeg;
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
    inner: Option<Incoming>,
    prefill: Option<PrefillLeg>,
    streaming: bool,
    _load: LoadGuard,
    ttft: Option<FirstByte>,
    finished: bool,
}

impl RelayBody {
    /// Relays `read` (frames already read from the worker's body), then the rest of `inner`
    /// (`None` when the body was read to its end).
    pub fn new(
        inner: Option<Incoming>,
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
        }
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
        if let Some(p) = self.prefill.take() {
            p.decode_finished();
        }
        Poll::Ready(None)
    }

    fn fail(&mut self, err: ApiError) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        self.inner = None;
        self.finished = true;
        if self.streaming {
            Poll::Ready(Some(Ok(Frame::data(err.sse_event()))))
        } else {
            Poll::Ready(Some(Err(err.message.into())))
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
