//! The accept loop: HTTP/1.1 connections served straight by hyper.
//!
//! Why not `axum::serve`: it sniffs every connection for HTTP/2 (an extra rewind layer) and
//! rebuilds the router's route table for each connection, which costs several KB per open
//! connection — and an admission queue exists to hold many open connections. Here the
//! application ([`Front`]: the router and the inference routes' direct stacks) is built once
//! and each connection gets a cheap clone, called by hyper as is (no tower adapter cloning it
//! again per request). Graceful shutdown: stop accepting,
//! tell every connection to finish its current request and close, then wait for them.
//!
//! Limits: at most `max_connections` connections are open at once — at the cap the loop stops
//! accepting, so new connections wait in the kernel's accept backlog until one closes — and
//! every request head must be complete within `header_timeout` of its first byte (see
//! [`super::conn`]).

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use super::Front;
use super::conn::{ConnState, HeadDeadlineIo, HeadPolicy, OpenConnection, Tracked};
use crate::metrics::Metrics;

/// Per-listener limits on client connections, and the TLS configuration when serving HTTPS.
#[derive(Debug, Clone)]
pub struct ConnLimits {
    /// Longest from a request head's first byte to its end; also bounds a TLS handshake.
    pub header_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
    /// Server TLS (`--tls-cert-path`); `None` serves plain HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// Serves `app` on `listener` until `stop` turns true, then drains open connections (the
/// caller bounds how long that may take).
pub(crate) async fn serve(
    listener: TcpListener,
    app: Front,
    mut stop: watch::Receiver<bool>,
    limits: ConnLimits,
    metrics: Arc<Metrics>,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder.keep_alive(true);
    // The head deadline is `conn`'s: hyper's would also cut idle keep-alive connections.
    builder.header_read_timeout(None);
    let head = Arc::new(HeadPolicy::new(limits.header_timeout));
    let tls = limits.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    let room = Arc::new(Semaphore::new(
        limits.max_connections.min(Semaphore::MAX_PERMITS),
    ));
    let stopped = async move {
        loop {
            let stop_now = *stop.borrow_and_update();
            if stop_now || stop.changed().await.is_err() {
                return;
            }
        }
    };
    tokio::pin!(stopped);
    loop {
        // At the cap, do not accept: the kernel keeps new connections in its backlog.
        let permit = tokio::select! {
            permit = room.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut stopped => break,
        };
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let open = OpenConnection::new(permit, metrics.clone());
                    let state = Arc::new(ConnState::default());
                    let service = Tracked::new(app.clone(), state.clone());
                    let Some(acceptor) = &tls else {
                        let io = TokioIo::new(HeadDeadlineIo::new(stream, state, head.clone()));
                        let conn = graceful.watch(builder.serve_connection(io, service));
                        // `map`, not an `async` block: a block would keep the moved-from
                        // connection beside the one it awaits, doubling the task (800 bytes
                        // per connection).
                        tokio::spawn(conn.map(move |ended| {
                            drop(open);
                            log_end(ended);
                        }));
                        continue;
                    };
                    // The handshake runs in the connection's task, so a slow client cannot
                    // hold up the accept loop, and is bounded like a request head.
                    let handshake = tokio::time::timeout(limits.header_timeout, acceptor.accept(stream));
                    let (builder, head, watcher) = (builder.clone(), head.clone(), graceful.watcher());
                    tokio::spawn(async move {
                        let tls = match handshake.await {
                            Ok(Ok(tls)) => tls,
                            Ok(Err(e)) => {
                                tracing::debug!(error = %e, "TLS handshake failed");
                                return;
                            }
                            Err(_) => {
                                tracing::debug!("TLS handshake not complete in time");
                                return;
                            }
                        };
                        let io = TokioIo::new(HeadDeadlineIo::new(tls, state, head));
                        log_end(watcher.watch(builder.serve_connection(io, service)).await);
                        drop(open);
                    });
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            () = &mut stopped => break,
        }
    }
    drop(listener);
    graceful.shutdown().await;
}

fn log_end(ended: Result<(), hyper::Error>) {
    if let Err(e) = ended {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}
