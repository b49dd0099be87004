//! The accept loop: HTTP/1.1 connections served straight by hyper.
//!
//! Why not `axum::serve`: it sniffs every connection for HTTP/2 (an extra rewind layer) and
//! rebuilds the router's route table for each connection, which costs several KB per open
//! connection — and an admission queue exists to hold many open connections. Here the router
//! is built once and each connection gets a cheap clone. Graceful shutdown: stop accepting,
//! tell every connection to finish its current request and close, then wait for them.

use std::time::Duration;

use axum::Router;
use futures_util::FutureExt;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Serves `app` on `listener` until `stop` turns true, then drains open connections (the
/// caller bounds how long that may take).
pub async fn serve(listener: TcpListener, app: Router, mut stop: watch::Receiver<bool>) {
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder.keep_alive(true);
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
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let service = TowerToHyperService::new(app.clone());
                    let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
                    // `map`, not an `async` block: a block would keep the moved-from connection
                    // beside the one it awaits, doubling the task (800 bytes per connection).
                    tokio::spawn(conn.map(log_end));
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
