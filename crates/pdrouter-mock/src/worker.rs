//! The listening server and its lifecycle.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use futures_util::future::BoxFuture;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpSocket, lookup_host};
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

use crate::config::{GrpcRuntime, HttpRuntime, KvConnectorKind, MockConfig, Role};
use crate::kv::Sweeper;

use crate::state::{MockControls, MockStats, Shared};
use crate::{bootstrap, grpc, http};

/// A running mock worker.
///
/// Dropping it stops the server in the background; [`MockWorker::shutdown`]
/// does the same and waits until the port is released.
#[derive(Debug)]
pub struct MockWorker {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
    bootstrap: Option<Bootstrap>,
    grpc: bool,
    /// vLLM mode: frees unpulled KV blocks on time; stops when the worker is dropped.
    _kv_sweeper: Option<Sweeper>,
}

/// The KV bootstrap listener of an engine-mode prefill worker.
#[derive(Debug)]
struct Bootstrap {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl MockWorker {
    /// Binds `cfg.host:cfg.port` (port 0 picks a free one) and starts serving
    /// on the current tokio runtime.
    pub async fn start(cfg: MockConfig) -> io::Result<MockWorker> {
        if cfg.role == Role::Encode && !(cfg.grpc && cfg.grpc_runtime == GrpcRuntime::TokenSpeed) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the encode role is served over gRPC with TokenSpeed's protocol only \
                 (--grpc --runtime tokenspeed)",
            ));
        }
        let vllm = cfg.vllm();
        if cfg.grpc
            && cfg.http_runtime == HttpRuntime::Vllm
            && cfg.grpc_runtime == GrpcRuntime::TokenSpeed
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a gRPC worker speaks one engine's protocol: vLLM's or TokenSpeed's, not both",
            ));
        }
        let listener = bind(&cfg.host, cfg.port).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(&cfg, addr));
        let (app, protocol) = if cfg.grpc {
            (grpc::router(Arc::clone(&shared))?, Protocol::Auto)
        } else if cfg.http_runtime == HttpRuntime::Sglang {
            (http::router(Arc::clone(&shared)), Protocol::Http1Direct)
        } else {
            (http::router(Arc::clone(&shared)), Protocol::Http1)
        };
        // vLLM's NIXL and LMCache consumers reach the producer's own port (HTTP or gRPC); only
        // Mooncake's producer has a bootstrap server (on the engine's bootstrap port, else a
        // free one).
        let mooncake = vllm && cfg.kv_connector == KvConnectorKind::Mooncake;
        let bootstrap_port = cfg.engine.as_ref().map_or(0, |e| e.bootstrap_port);
        let serves_bootstrap =
            cfg.role == Role::Prefill && (mooncake || (cfg.engine.is_some() && !vllm));
        let bootstrap = if serves_bootstrap {
            let listener = bind(&cfg.host, bootstrap_port).await?;
            let addr = listener.local_addr()?;
            let app = if mooncake {
                http::mooncake_bootstrap_router(Arc::clone(&shared))
            } else {
                bootstrap::bootstrap_router(Arc::clone(&shared.rooms), addr)
            };
            let (stop, stop_rx) = oneshot::channel();
            let task = tokio::spawn(serve(listener, app, Protocol::Http1, None, stop_rx));
            Some(Bootstrap { addr, stop, task })
        } else {
            None
        };
        let (stop, stop_rx) = oneshot::channel();
        let task = tokio::spawn(serve(
            listener,
            app,
            protocol,
            Some(Arc::clone(&shared)),
            stop_rx,
        ));
        let kv_sweeper = vllm.then(|| shared.kv.spawn_sweeper());
        tracing::debug!(%addr, role = %cfg.role, grpc = cfg.grpc, vllm, "mock worker started");
        Ok(MockWorker {
            addr,
            shared,
            stop,
            task,
            bootstrap,
            grpc: cfg.grpc,
            _kv_sweeper: kv_sweeper,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL, e.g. `http://127.0.0.1:41234`, or `grpc://127.0.0.1:41234`
    /// in gRPC mode (the form a router's worker list takes).
    pub fn url(&self) -> String {
        let scheme = if self.grpc { "grpc" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Whether the worker speaks the gRPC protocol.
    pub fn is_grpc(&self) -> bool {
        self.grpc
    }

    /// Address of the KV bootstrap endpoint: `GET /room/{room}` of an engine-mode prefill
    /// worker, or `GET /query` and the pull of a vLLM-mode Mooncake prefill worker; no other
    /// worker has one.
    pub fn bootstrap_addr(&self) -> Option<SocketAddr> {
        self.bootstrap.as_ref().map(|b| b.addr)
    }

    /// The worker's role.
    pub fn role(&self) -> Role {
        self.shared.role
    }

    /// Current counters (the numbers of `GET /mock/stats`).
    pub fn stats(&self) -> MockStats {
        self.shared.stats()
    }

    /// Runtime knobs.
    pub fn controls(&self) -> &MockControls {
        &self.shared.controls
    }

    /// Stops listening and aborts every open connection at once, like a
    /// killed process: in-flight requests see their connection close. Returns
    /// once the listening socket is closed, so the port can be bound again.
    pub async fn shutdown(self) {
        let MockWorker {
            addr,
            stop,
            task,
            bootstrap,
            ..
        } = self;
        if let Some(b) = bootstrap {
            let _ = b.stop.send(());
            let _ = b.task.await;
        }
        let _ = stop.send(());
        if let Err(e) = task.await {
            tracing::warn!(%addr, error = %e, "mock worker task failed");
        }
        tracing::debug!(%addr, "mock worker stopped");
    }
}

/// A loopback port held for as long as the value lives: bound (with
/// `SO_REUSEADDR`) but not listening. Connections to it are refused, the
/// kernel hands it to no one else as an ephemeral port, and a worker started
/// on it (or any server that binds with `SO_REUSEADDR`, as tokio's listeners
/// do) can stop and start again on it without another process taking it in
/// between.
#[derive(Debug)]
pub struct PortReservation {
    _socket: TcpSocket,
    addr: SocketAddr,
}

impl PortReservation {
    /// Reserves a free port on `127.0.0.1`.
    pub fn new() -> io::Result<PortReservation> {
        let socket = TcpSocket::new_v4()?;
        socket.set_reuseaddr(true)?;
        socket.bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let addr = socket.local_addr()?;
        Ok(PortReservation {
            _socket: socket,
            addr,
        })
    }

    /// The reserved address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The reserved port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

async fn bind(host: &str, port: u16) -> io::Result<TcpListener> {
    let mut last_err = None;
    for addr in lookup_host((host, port)).await? {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        // Lets a restarted worker re-bind the port while connections of the
        // previous one linger in TIME_WAIT.
        socket.set_reuseaddr(true)?;
        if let Err(e) = socket.bind(addr) {
            last_err = Some(e);
            continue;
        }
        match socket.listen(1024) {
            Ok(listener) => return Ok(listener),
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{host}: no address to bind"),
        )
    }))
}

/// What a connection may speak.
#[derive(Clone, Copy, Debug)]
enum Protocol {
    /// HTTP/1.1 only.
    Http1,
    /// HTTP/1.1 only, generation requests straight to their handler
    /// ([`http::front::Front`]; needs the worker's state, `counted`).
    Http1Direct,
    /// HTTP/1.1 or HTTP/2 (prior knowledge, as gRPC clients connect),
    /// told apart by the connection preface.
    Auto,
}

/// Accepts connections (counted in `counted`'s stats, if given) until `stop` fires (or its
/// sender is dropped), then closes the listener and aborts all connections.
async fn serve(
    listener: TcpListener,
    app: Router,
    protocol: Protocol,
    counted: Option<Arc<Shared>>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    if let Some(shared) = &counted {
                        shared.controls.record_connection();
                    }
                    let _ = stream.set_nodelay(true);
                    let io = TokioIo::new(stream);
                    let conn: BoxFuture<'static, Result<(), String>> = match (protocol, &counted) {
                        (Protocol::Http1Direct, Some(shared)) => {
                            let front = http::front::Front::new(Arc::clone(shared), app.clone());
                            Box::pin(async move {
                                http1::Builder::new()
                                    .serve_connection(io, front)
                                    .await
                                    .map_err(|e| e.to_string())
                            })
                        }
                        (Protocol::Http1 | Protocol::Http1Direct, _) => {
                            let svc = TowerToHyperService::new(app.clone());
                            Box::pin(async move {
                                http1::Builder::new()
                                    .serve_connection(io, svc)
                                    .await
                                    .map_err(|e| e.to_string())
                            })
                        }
                        (Protocol::Auto, _) => {
                            let svc = TowerToHyperService::new(app.clone());
                            Box::pin(async move {
                                auto::Builder::new(TokioExecutor::new())
                                    .serve_connection(io, svc)
                                    .await
                                    .map_err(|e| e.to_string())
                            })
                        }
                    };
                    conns.spawn(async move {
                        let ended = conn.await;
                        if let Err(e) = ended {
                            tracing::trace!(error = %e, "mock connection ended with error");
                        }
                    });
                }
                Err(e) => {
                    // Typically EMFILE: back off instead of spinning.
                    tracing::warn!(error = %e, "mock worker accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    conns.shutdown().await;
}
