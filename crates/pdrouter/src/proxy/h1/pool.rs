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
//! - A connection keeps its read buffer while it waits (empty, its free space reused by the
//!   next exchange instead of a new allocation), unless the buffer grew past
//!   [`KEPT_BUFFER_BYTES`]: an idle connection holds at most that much memory.

use std::collections::HashMap;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;

use http::uri::Authority;
use parking_lot::Mutex;
use tokio::io::Interest;

use super::Conn;

/// Idle connections older than this are closed (hyper's pooled client used the same).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Most idle connections kept per host.
pub const MAX_IDLE_PER_HOST: usize = 1024;

/// How often, at most, every host's expired connections are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// Largest read buffer an idle connection keeps (a few reads' worth; a buffer grown for a
/// large head is let go).
const KEPT_BUFFER_BYTES: usize = 32 * 1024;

#[derive(Debug)]
struct Idle {
    conn: Conn,
    since: Instant,
}

#[derive(Debug)]
struct Hosts {
    /// By the authority's text as the worker's URL spells it. (`Authority`'s own hash folds
    /// case a byte at a time; a host spelled two ways only gets two lists.)
    by_host: HashMap<Box<str>, Vec<Idle>, foldhash::fast::RandomState>,
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
    pub(crate) fn take(&self, host: &Authority) -> Option<Conn> {
        let now = Instant::now();
        // Closed outside the lock.
        let mut dropped = Vec::new();
        let found = {
            let mut hosts = self.hosts.lock();
            let list = hosts.by_host.get_mut(host.as_str())?;
            let mut found = None;
            while let Some(idle) = list.pop() {
                if now.duration_since(idle.since) > IDLE_TIMEOUT {
                    // Every one below is older still.
                    dropped.push(idle);
                    dropped.append(list);
                    break;
                }
                if is_open(&idle.conn.io) {
                    found = Some(idle.conn);
                    break;
                }
                dropped.push(idle);
            }
            found
        };
        drop(dropped);
        found
    }

    /// Keeps `conn`, a connection to `host` whose last answer was read to its end (nothing
    /// left in its buffer).
    pub(crate) fn put(&self, host: &Authority, mut conn: Conn) {
        let now = Instant::now();
        debug_assert!(conn.buf.is_empty());
        if conn.buf.capacity() > KEPT_BUFFER_BYTES {
            conn.buf = bytes::BytesMut::new();
        }
        // The last read took the answer's final bytes without seeing the socket empty, so
        // its readiness still says "readable": cleared here (no syscall), so that readiness
        // seen later means the worker sent something, which for an idle connection is its
        // close.
        let _ = conn.io.try_io(Interest::READABLE, || {
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
            let idle = Idle { conn, since: now };
            match hosts.by_host.get_mut(host.as_str()) {
                Some(list) if list.len() < MAX_IDLE_PER_HOST => list.push(idle),
                Some(_) => expired.push(idle),
                None => {
                    hosts.by_host.insert(host.as_str().into(), vec![idle]);
                }
            }
        }
        drop(expired);
    }

    /// Idle connections kept for `host`.
    #[cfg(test)]
    pub fn idle(&self, host: &Authority) -> usize {
        self.hosts
            .lock()
            .by_host
            .get(host.as_str())
            .map_or(0, Vec::len)
    }
}

/// Whether an idle connection is still open: nothing to read on it (readiness cleared when
/// it was put back), or a read that would block. Data or the end of the stream on an idle
/// connection both mean it cannot carry another exchange.
fn is_open(io: &tokio::net::TcpStream) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    /// A connected loopback stream (its peer kept open by the listener's accepted end).
    async fn stream() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (ours, theirs) = tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        (ours.unwrap(), theirs.unwrap().0)
    }

    #[tokio::test]
    async fn an_idle_connection_keeps_a_small_read_buffer_and_lets_a_large_one_go() {
        let pool = Pool::default();
        let host: Authority = "w:1".parse().unwrap();
        let (small, _peer_a) = stream().await;
        let (large, _peer_b) = stream().await;
        let mut small = Conn::new(small);
        small.buf = BytesMut::with_capacity(8 * 1024);
        let mut large = Conn::new(large);
        large.buf = BytesMut::with_capacity(KEPT_BUFFER_BYTES + 1);
        pool.put(&host, small);
        pool.put(&host, large);
        assert_eq!(pool.idle(&host), 2);
        // Most recently put first.
        assert_eq!(pool.take(&host).unwrap().buf.capacity(), 0);
        assert!(pool.take(&host).unwrap().buf.capacity() >= 8 * 1024);
        assert!(pool.take(&host).is_none());
    }
}
