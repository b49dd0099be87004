//! What the listener attaches to each client connection: the request-head deadline and the
//! open-connection count.
//!
//! **Head deadline.** A request head must be complete `--client-header-timeout-secs` after
//! its first byte, or the client gets a 408 and the connection is closed; a connection that
//! sends nothing (an idle keep-alive connection, or a fresh one) is never cut by it. hyper's
//! own `header_read_timeout` cannot do this: its clock starts when hyper begins waiting for a
//! head, so it also closes every keep-alive connection idle for that long.
//!
//! How: [`HeadDeadlineIo`] wraps the socket and [`Tracked`] wraps the service, sharing one
//! [`ConnState`]. The service counts heads (hyper calls it the moment a head is complete) and
//! marks the connection busy until the response body is dropped. The socket starts the clock
//! when bytes arrive while the connection is not busy and no head completed since, and only
//! checks it while hyper waits for more bytes. Bytes that arrive while a request is in
//! progress (its body, or a pipelined next head) do not start the clock.
//!
//! **Connection count.** [`OpenConnection`] holds one of the listener's `--max-connections`
//! permits and one unit of `smg_http_connections_active` for as long as the connection task
//! runs.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

use crate::error::ApiError;
use crate::metrics::Metrics;

/// The listener's head-deadline settings, shared by its connections.
#[derive(Debug)]
pub(crate) struct HeadPolicy {
    timeout: Duration,
    /// The 408 written to a connection whose head did not complete in time.
    response: Bytes,
}

impl HeadPolicy {
    pub(crate) fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            response: ApiError::header_timeout(timeout.as_secs()).http1_closing_response(),
        }
    }
}

/// What a connection's socket and service share.
#[derive(Debug, Default)]
pub(crate) struct ConnState {
    /// Request heads completed on this connection.
    heads: AtomicU64,
    /// Requests whose response body has not been dropped yet.
    busy: AtomicU32,
}

/// The client socket with the head deadline; see the module docs.
#[derive(Debug)]
pub(crate) struct HeadDeadlineIo<T = TcpStream> {
    io: T,
    state: Arc<ConnState>,
    policy: Arc<HeadPolicy>,
    /// The clock of the head being received: heads completed before it, and its deadline.
    armed: Option<(u64, Instant)>,
    /// Timer for `armed`, made only once hyper waits for more of the head (most heads arrive
    /// in one read and never need it).
    sleep: Option<Pin<Box<Sleep>>>,
    /// Whether everything hyper wrote has been flushed, so a 408 cannot interleave with it.
    write_clean: bool,
}

impl<T: AsyncRead + AsyncWrite + Unpin> HeadDeadlineIo<T> {
    pub(crate) fn new(io: T, state: Arc<ConnState>, policy: Arc<HeadPolicy>) -> Self {
        Self {
            io,
            state,
            policy,
            armed: None,
            sleep: None,
            write_clean: true,
        }
    }

    /// Bytes arrived: start the clock if they begin a new head.
    fn saw_bytes(&mut self) {
        let heads = self.state.heads.load(Ordering::Acquire);
        if matches!(self.armed, Some((h, _)) if h == heads) {
            return;
        }
        if self.state.busy.load(Ordering::Acquire) == 0 {
            self.armed = Some((heads, Instant::now() + self.policy.timeout));
            self.sleep = None;
        } else {
            self.disarm();
        }
    }

    fn disarm(&mut self) {
        self.armed = None;
        self.sleep = None;
    }

    /// Hyper waits for bytes: whether the head being received is past its deadline (if not,
    /// the timer wakes this task when it is).
    fn head_expired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some((heads, deadline)) = self.armed else {
            return false;
        };
        if heads != self.state.heads.load(Ordering::Acquire)
            || self.state.busy.load(Ordering::Acquire) > 0
        {
            self.disarm();
            return false;
        }
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        sleep.as_mut().poll(cx).is_ready()
    }

    /// Best effort: a socket that cannot take the 408 at once is just closed.
    fn send_timeout_response(&mut self, cx: &mut Context<'_>) {
        if self.write_clean {
            let response = self.policy.response.clone();
            let _ = Pin::new(&mut self.io).poll_write(cx, &response);
        }
    }

    fn expire(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        tracing::debug!("request head incomplete at its deadline; closing the connection");
        self.send_timeout_response(cx);
        self.disarm();
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "request head not complete in time",
        )))
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for HeadDeadlineIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                this.saw_bytes();
                // A head trickling in byte by byte is checked here too, not only while idle.
                if matches!(this.armed, Some((_, deadline)) if Instant::now() >= deadline) {
                    return this.expire(cx);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if this.head_expired(cx) => this.expire(cx),
            other => other,
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for HeadDeadlineIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.write_clean = false;
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.write_clean = false;
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let flushed = ready!(Pin::new(&mut this.io).poll_flush(cx));
        this.write_clean = flushed.is_ok();
        Poll::Ready(flushed)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Marks the connection busy while it lives.
#[derive(Debug)]
pub(crate) struct Busy(Arc<ConnState>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The connection's service, counting heads and keeping the connection busy until the
/// response body is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Tracked<S> {
    inner: S,
    state: Arc<ConnState>,
}

impl<S> Tracked<S> {
    pub(crate) fn new(inner: S, state: Arc<ConnState>) -> Self {
        Self { inner, state }
    }
}

impl<S, B> hyper::service::Service<Request<Incoming>> for Tracked<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>>,
{
    type Response = Response<BusyBody<B>>;
    type Error = S::Error;
    type Future = TrackedFuture<S::Future>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        // Busy first, so the socket never sees a completed head on an idle connection.
        self.state.busy.fetch_add(1, Ordering::AcqRel);
        self.state.heads.fetch_add(1, Ordering::AcqRel);
        TrackedFuture {
            inner: self.inner.call(req),
            busy: Some(Busy(self.state.clone())),
        }
    }
}

pin_project! {
    /// [`Tracked`]'s response future: moves the busy mark into the response body.
    #[derive(Debug)]
    pub(crate) struct TrackedFuture<F> {
        #[pin]
        inner: F,
        busy: Option<Busy>,
    }
}

impl<F, B, E> Future for TrackedFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<BusyBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let out = ready!(this.inner.poll(cx));
        let busy = this.busy.take();
        Poll::Ready(out.map(|resp| resp.map(|inner| BusyBody { inner, _busy: busy })))
    }
}

pin_project! {
    /// A response body that keeps its connection marked busy until hyper drops it.
    #[derive(Debug)]
    pub(crate) struct BusyBody<B> {
        #[pin]
        inner: B,
        _busy: Option<Busy>,
    }
}

impl<B: Body> Body for BusyBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// One accepted client connection: a `--max-connections` permit and one unit of the
/// connection gauge, both given back when dropped (the connection task ended).
#[derive(Debug)]
pub(crate) struct OpenConnection {
    _permit: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl OpenConnection {
    pub(crate) fn new(permit: OwnedSemaphorePermit, metrics: Arc<Metrics>) -> Self {
        metrics.connection_opened();
        Self {
            _permit: permit,
            metrics,
        }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.metrics.connection_closed();
    }
}
