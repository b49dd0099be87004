//! Idle keep-alive connections to plain HTTP workers, per `host:port`.
//!
//! Invariants:
//! - A connection is here only between exchanges, with nothing of a previous answer left
//!   unread (the body that read it to its end put it back).
//! - At most [`MAX_IDLE_PER_HOST`] per host; none older than [`IDLE_TIMEOUT`] is handed out,
//!   and every host's expired ones are closed at least every [`SWEEP_EVERY`] of use, so a
//!   worker that left the fleet does not keep sockets open for long.
//! - The most recently used connection is reused first (warm in the worker's accept path
//!   and in the kernel); one the worker closed while it waited is dropped, not handed out.

use std::collections::HashMap;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;

use http::uri::Authority;
use parking_lot::Mutex;
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Idle connections older than this are closed (hyper's pooled client used the same).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Most idle connections kept per host.
pub const MAX_IDLE_PER_HOST: usize = 1024;

/// How often, at most, every host's expired connections are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct Idle {
    io: TcpStream,
    since: Instant,
}

#[derive(Debug)]
struct Hosts {
    by_host: HashMap<Authority, Vec<Idle>, foldhash::fast::RandomState>,
    swept: Instant,
}

/// See the module docs.
#[derive(Debug)]
pub struct Pool {
    hosts: Mutex<Hosts>,
}

impl Default for Pool {
    fn default() -> Self {
        Self {
            hosts: Mutex::new(Hosts {
                by_host: HashMap::default(),
                swept: Instant::now(),
            }),
        }
    }
}

impl Pool {
    /// A live idle connection to `host`, if one is kept.
    pub fn take(&self, host: &Authority) -> Option<TcpStream> {
        let now = Instant::now();
        // Closed outside the lock.
        let mut dropped = Vec::new();
        let found = {
            let mut hosts = self.hosts.lock();
            let list = hosts.by_host.get_mut(host)?;
            let mut found = None;
            while let Some(idle) = list.pop() {
                if now.duration_since(idle.since) > IDLE_TIMEOUT {
                    // Every one below is older still.
                    dropped.push(idle);
                    dropped.append(list);
                    break;
                }
                if is_open(&idle.io) {
                    found = Some(idle.io);
                    break;
                }
                dropped.push(idle);
            }
            found
        };
        drop(dropped);
        found
    }

    /// Keeps `io`, a connection to `host` whose last answer was read to its end.
    pub fn put(&self, host: Authority, io: TcpStream) {
        let now = Instant::now();
        // The last read took the answer's final bytes without seeing the socket empty, so
        // its readiness still says "readable": cleared here (no syscall), so that readiness
        // seen later means the worker sent something, which for an idle connection is its
        // close.
        let _ = io.try_io(Interest::READABLE, || {
            Err::<(), _>(std::io::ErrorKind::WouldBlock.into())
        });
        let mut expired = Vec::new();
        {
            let mut hosts = self.hosts.lock();
            if now.duration_since(hosts.swept) > SWEEP_EVERY {
                hosts.swept = now;
                for list in hosts.by_host.values_mut() {
                    let keep = list.partition_point(|i| now.duration_since(i.since) > IDLE_TIMEOUT);
                    expired.extend(list.drain(..keep));
                }
                hosts.by_host.retain(|_, list| !list.is_empty());
            }
            let list = hosts.by_host.entry(host).or_default();
            if list.len() < MAX_IDLE_PER_HOST {
                list.push(Idle { io, since: now });
            } else {
                expired.push(Idle { io, since: now });
            }
        }
        drop(expired);
    }

    /// Idle connections kept for `host`.
    #[cfg(test)]
    pub fn idle(&self, host: &Authority) -> usize {
        self.hosts.lock().by_host.get(host).map_or(0, Vec::len)
    }
}

/// Whether an idle connection is still open: nothing to read on it (readiness cleared when
/// it was put back), or a read that would block. Data or the end of the stream on an idle
/// connection both mean it cannot carry another exchange.
fn is_open(io: &TcpStream) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    match io.poll_read_ready(&mut cx) {
        Poll::Pending => true,
        Poll::Ready(Err(_)) => false,
        Poll::Ready(Ok(())) => {
            let mut probe = [0u8; 1];
            matches!(io.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        }
    }
}
