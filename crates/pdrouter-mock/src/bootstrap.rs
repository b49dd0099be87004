//! The KV bootstrap rendezvous between a prefill and a decode worker.
//!
//! * [`Rooms`]: the rooms a prefill worker has finished (kept [`ROOM_RETENTION`], each with
//!   an optional tag saying what finished it) and the long polls waiting for the others. A
//!   waiter that goes away leaves no entry behind for a room that never finished.
//! * The prefill worker serves `GET /room/{room}` ([`bootstrap_router`] on a separate
//!   bootstrap port, or [`room_routes`] on a gRPC worker's own port); the answer comes only
//!   once that room's prefill has finished (long poll, at most [`LONG_POLL_LIMIT`]).
//! * A decode worker asks that endpoint (from the `bootstrap_host`/`bootstrap_port`/
//!   `bootstrap_room` of its request body, [`await_bootstrap`], or a gRPC ticket,
//!   [`await_room`]) and starts generating only after the answer, through one process-wide
//!   keep-alive client.
//! * With [`rendezvous_in_process`] on (a process running several workers, `--pairs`), a
//!   decode worker whose room is served by a worker of the same process waits on that
//!   worker's [`Rooms`] directly: the same wait (until the room finishes, at most
//!   [`LONG_POLL_LIMIT`], answering its tag), without an HTTP exchange per request.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

/// How long a finished room stays answerable.
const ROOM_RETENTION: Duration = Duration::from_secs(300);
/// Longest a bootstrap long poll is held before it answers 504.
pub(crate) const LONG_POLL_LIMIT: Duration = Duration::from_secs(600);

/// Rendezvous of bootstrap rooms: finished rooms and their waiters.
#[derive(Debug, Default)]
pub(crate) struct Rooms {
    inner: Mutex<RoomsInner>,
}

#[derive(Debug, Default)]
struct RoomsInner {
    /// `true` once the room's prefill finished.
    rooms: HashMap<u64, watch::Sender<bool>>,
    /// Finished rooms in finishing order, for expiry.
    finished: VecDeque<(Instant, u64)>,
    /// What finished each room, when its finisher said (an encode worker: the item's
    /// content hash), until it expires.
    tags: HashMap<u64, String>,
}

impl Rooms {
    fn lock(&self) -> std::sync::MutexGuard<'_, RoomsInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks `room` finished and wakes its waiters.
    pub(crate) fn finish(&self, room: u64) {
        self.finish_tagged(room, None);
    }

    /// Marks `room` finished with what finished it (shown by `GET /room/{room}`).
    pub(crate) fn finish_tagged(&self, room: u64, tag: Option<String>) {
        let now = Instant::now();
        let mut inner = self.lock();
        if let Some(tag) = tag {
            inner.tags.insert(room, tag);
        }
        inner
            .rooms
            .entry(room)
            .or_insert_with(|| watch::Sender::new(false))
            .send_replace(true);
        inner.finished.push_back((now, room));
        while let Some(&(at, old)) = inner.finished.front() {
            if now.duration_since(at) < ROOM_RETENTION {
                break;
            }
            inner.finished.pop_front();
            inner.rooms.remove(&old);
            inner.tags.remove(&old);
        }
    }

    /// What finished `room`, if its finisher said.
    pub(crate) fn tag(&self, room: u64) -> Option<String> {
        self.lock().tags.get(&room).cloned()
    }

    /// Whether `room` has finished (and not yet expired).
    #[cfg(test)]
    pub(crate) fn is_finished(&self, room: u64) -> bool {
        self.lock().rooms.get(&room).is_some_and(|s| *s.borrow())
    }

    /// Waits until `room` has finished. Cancel-safe: a dropped waiter leaves
    /// no entry behind for a room that never finished.
    pub(crate) async fn wait(&self, room: u64) {
        let rx = self
            .lock()
            .rooms
            .entry(room)
            .or_insert_with(|| watch::Sender::new(false))
            .subscribe();
        let mut waiter = RoomWaiter {
            rooms: self,
            room,
            rx: Some(rx),
        };
        if let Some(rx) = waiter.rx.as_mut() {
            // The sender lives in the map until the room finishes or expires.
            let _ = rx.wait_for(|done| *done).await;
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().rooms.len()
    }
}

/// Removes a never-finished room's entry when its last waiter goes away.
#[derive(Debug)]
struct RoomWaiter<'a> {
    rooms: &'a Rooms,
    room: u64,
    rx: Option<watch::Receiver<bool>>,
}

impl Drop for RoomWaiter<'_> {
    fn drop(&mut self) {
        drop(self.rx.take());
        let mut inner = self.rooms.lock();
        let abandoned = inner
            .rooms
            .get(&self.room)
            .is_some_and(|s| !*s.borrow() && s.receiver_count() == 0);
        if abandoned {
            inner.rooms.remove(&self.room);
        }
    }
}

/// The bootstrap endpoint's routes, served at `addr`: `GET /room/{room}` (long poll) and
/// `GET /health`.
pub(crate) fn bootstrap_router(rooms: Arc<Rooms>, addr: SocketAddr) -> Router {
    room_routes(rooms, addr).route("/health", get(|| async { StatusCode::OK }))
}

/// `GET /room/{room}` alone, served at `addr` (a gRPC worker serves it on its own port);
/// the rooms are also waitable in process from there when the shortcut is on.
pub(crate) fn room_routes<S>(rooms: Arc<Rooms>, addr: SocketAddr) -> Router<S> {
    serve_in_process(addr, &rooms);
    Router::new()
        .route("/room/{room}", get(room))
        .with_state(rooms)
}

async fn room(State(rooms): State<Arc<Rooms>>, Path(room): Path<String>) -> Response {
    let Ok(room) = room.parse::<u64>() else {
        return (StatusCode::BAD_REQUEST, "room must be an unsigned integer").into_response();
    };
    match tokio::time::timeout(LONG_POLL_LIMIT, rooms.wait(room)).await {
        Ok(()) => axum::Json(json!({ "room": room, "ready": true, "tag": rooms.tag(room) }))
            .into_response(),
        Err(_) => (StatusCode::GATEWAY_TIMEOUT, "prefill did not finish").into_response(),
    }
}

/// The rooms a request body names (`bootstrap_room` as a number or an array
/// of numbers).
pub(crate) fn rooms_of(req: &serde_json::Map<String, Value>) -> Vec<u64> {
    match req.get("bootstrap_room") {
        Some(Value::Number(n)) => n.as_u64().into_iter().collect(),
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_u64).collect(),
        _ => Vec::new(),
    }
}

/// The `(host, port, room)` rendezvous points of a decode request; entries
/// whose port is null or missing are skipped (nothing to ask).
pub(crate) fn bootstrap_points(req: &serde_json::Map<String, Value>) -> Vec<(String, u16, u64)> {
    let as_list = |key: &str| match req.get(key) {
        Some(Value::Array(items)) => items.clone(),
        Some(v) => vec![v.clone()],
        None => Vec::new(),
    };
    let (hosts, ports, rooms) = (
        as_list("bootstrap_host"),
        as_list("bootstrap_port"),
        as_list("bootstrap_room"),
    );
    rooms
        .iter()
        .enumerate()
        .filter_map(|(i, room)| {
            let host = hosts.get(i).or(hosts.first())?.as_str()?.to_owned();
            let port = u16::try_from(ports.get(i).or(ports.first())?.as_u64()?).ok()?;
            Some((host, port, room.as_u64()?))
        })
        .collect()
}

/// Asks `http://host:port/room/{room}` and waits for its answer.
pub(crate) async fn await_room(host: &str, port: u16, room: u64) -> Result<(), String> {
    await_room_tag(host, port, room).await.map(drop)
}

/// [`await_room`], returning the room's tag (what finished it), if any.
pub(crate) async fn await_room_tag(
    host: &str,
    port: u16,
    room: u64,
) -> Result<Option<String>, String> {
    let authority = authority(host, port);
    if let Some(rooms) = in_process(&authority) {
        // What `GET /room/{room}` would answer, without the exchange.
        return match tokio::time::timeout(LONG_POLL_LIMIT, rooms.wait(room)).await {
            Ok(()) => Ok(rooms.tag(room)),
            Err(_) => Err(format!(
                "bootstrap {authority} room {room}: {}",
                StatusCode::GATEWAY_TIMEOUT
            )),
        };
    }
    let uri: hyper::Uri = format!("http://{authority}/room/{room}")
        .parse()
        .map_err(|e| format!("bootstrap {authority}: {e}"))?;
    let resp = peer_client()
        .get(uri)
        .await
        .map_err(|e| format!("bootstrap {authority}: {e}"))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if status.is_success() {
        let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        Ok(answer["tag"].as_str().map(str::to_owned))
    } else {
        Err(format!("bootstrap {authority} room {room}: {status}"))
    }
}

/// This process's workers' rooms by the address their `GET /room` is served on; `None` until
/// [`rendezvous_in_process`] turns the shortcut on.
static IN_PROCESS: Mutex<Option<HashMap<String, Weak<Rooms>>>> = Mutex::new(None);

/// Turns on the in-process rendezvous (see the module docs) for workers started from now on.
pub fn rendezvous_in_process() {
    IN_PROCESS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new);
}

/// Makes `rooms`, served at `addr`, waitable in process (when the shortcut is on).
fn serve_in_process(addr: SocketAddr, rooms: &Arc<Rooms>) {
    if let Some(map) = IN_PROCESS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()
    {
        map.retain(|_, w| w.strong_count() > 0);
        map.insert(addr.to_string(), Arc::downgrade(rooms));
    }
}

/// The rooms served at `authority` by a live worker of this process, if the shortcut is on.
fn in_process(authority: &str) -> Option<Arc<Rooms>> {
    IN_PROCESS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()?
        .get(authority)?
        .upgrade()
}

/// `host:port` as a URI authority (an IPv6 host in brackets).
pub(crate) fn authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Most idle connections kept per peer worker.
const PEER_IDLE_PER_HOST: usize = 32;

/// The client a worker talks to its peers with (bootstrap long polls, KV pulls and pushes),
/// shared by the process: a decode worker reaches its prefill worker once per request, and a
/// new connection each time would cost that worker an accept (and both a handshake) per
/// request; kept-alive connections are reused instead.
pub(crate) fn peer_client() -> &'static Client<HttpConnector, Full<Bytes>> {
    static CLIENT: OnceLock<Client<HttpConnector, Full<Bytes>>> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(PEER_IDLE_PER_HOST)
            .build(connector)
    })
}

/// Waits for every rendezvous point of a decode request (concurrently).
pub(crate) async fn await_bootstrap(req: &serde_json::Map<String, Value>) -> Result<(), String> {
    let points = bootstrap_points(req);
    let waits = points
        .iter()
        .map(|(host, port, room)| await_room(host, *port, *room));
    for r in futures_util::future::join_all(waits).await {
        r?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn rooms_answer_only_after_finish() {
        let rooms = Arc::new(Rooms::default());
        let r = Arc::clone(&rooms);
        let waiter = tokio::spawn(async move { r.wait(7).await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        assert!(!rooms.is_finished(7));
        rooms.finish(7);
        waiter.await.unwrap();
        assert!(rooms.is_finished(7));
        // A late waiter returns at once.
        rooms.wait(7).await;
    }

    #[tokio::test(start_paused = true)]
    async fn cancelled_waiters_leave_nothing_behind() {
        let rooms = Rooms::default();
        let _ = tokio::time::timeout(Duration::from_millis(5), rooms.wait(1)).await;
        assert_eq!(rooms.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn finished_rooms_expire() {
        let rooms = Rooms::default();
        rooms.finish(1);
        tokio::time::advance(ROOM_RETENTION + Duration::from_secs(1)).await;
        rooms.finish(2);
        assert!(!rooms.is_finished(1));
        assert!(rooms.is_finished(2));
        assert_eq!(rooms.len(), 1);
    }

    #[test]
    fn bootstrap_points_pair_hosts_ports_and_rooms() {
        let req = |v: Value| v.as_object().unwrap().clone();
        let one =
            req(json!({"bootstrap_host":"10.0.0.1","bootstrap_port":8998,"bootstrap_room":5}));
        assert_eq!(
            bootstrap_points(&one),
            vec![("10.0.0.1".to_owned(), 8998, 5)]
        );
        let batch = req(json!({
            "bootstrap_host":["a","b"],"bootstrap_port":[1,null],"bootstrap_room":[10,11]
        }));
        assert_eq!(bootstrap_points(&batch), vec![("a".to_owned(), 1, 10)]);
        let no_port = req(json!({"bootstrap_host":"a","bootstrap_port":null,"bootstrap_room":1}));
        assert!(bootstrap_points(&no_port).is_empty());
        assert_eq!(rooms_of(&batch), vec![10, 11]);
        assert_eq!(rooms_of(&one), vec![5]);
        assert!(rooms_of(&req(json!({}))).is_empty());
    }
}
