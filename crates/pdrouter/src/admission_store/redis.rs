//! The Redis lease store: one multiplexed connection, one Lua script per exchange, and one
//! subscription for the group's pushes.
//!
//! The connection is opened lazily and dropped on any error, so the next exchange reconnects
//! (a restarted store is found again without a separate task). `EVALSHA` falls back to loading
//! the script when the store does not know it (after a restart).
//!
//! The script publishes the calling replica's id on the group's channel when a share should
//! move (see its header); [`RedisLeases::listen`] subscribes to it and hands every other
//! replica's message to the sharer, which exchanges early. Pushes only shorten the wait: a
//! replica that misses them (its subscription is down) still moves shares at its polls.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;

use pdrouter_admission::{Exchange, LeaseStore, Push, ShareGrant, ShareReport, StoreError};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Script};
use tokio::sync::Mutex;

use super::StoreUrl;

/// The lease script (see its header for the protocol).
const LEASE_SCRIPT: &str = include_str!("lease.lua");

/// One replica's view of the Redis store.
pub struct RedisLeases {
    url: StoreUrl,
    client: Client,
    conn: Mutex<Option<MultiplexedConnection>>,
    script: Script,
    /// `pdrouter:admission:{GROUP}:`: the braces keep a group's keys in one cluster slot.
    prefix: String,
    /// `pdrouter:admission:{GROUP}:push`: where the script announces that a share should move.
    channel: String,
    replica: String,
    ttl_ms: u64,
    timeout: Duration,
}

impl std::fmt::Debug for RedisLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLeases")
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

impl RedisLeases {
    /// A store client for `group`, as replica `replica`, with leases of `ttl` and exchanges
    /// bounded by `timeout` (connecting included). Connects on first use.
    pub fn new(
        url: &StoreUrl,
        group: &str,
        replica: String,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<Self, String> {
        let client = Client::open(url.secret())
            .map_err(|e| format!("--admission-store {url}: {}", url.scrub(&e.to_string())))?;
        let prefix = key_prefix(group);
        Ok(RedisLeases {
            url: url.clone(),
            client,
            conn: Mutex::new(None),
            script: Script::new(LEASE_SCRIPT),
            channel: format!("{prefix}push"),
            prefix,
            replica,
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1),
            timeout,
        })
    }

    /// The key of worker `key`'s hash.
    pub fn worker_key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn error(&self, what: &str, e: &redis::RedisError) -> StoreError {
        StoreError(format!(
            "{what} {}: {}",
            self.url,
            self.url.scrub(&e.to_string())
        ))
    }

    async fn connection(&self) -> Result<MultiplexedConnection, StoreError> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let c = self
            .client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await
            .map_err(|e| self.error("cannot connect to", &e))?;
        *slot = Some(c.clone());
        Ok(c)
    }

    async fn run(&self, seq: u64, reports: &[ShareReport]) -> Result<Vec<ShareGrant>, StoreError> {
        if reports.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.connection().await?;
        let mut call = self.script.prepare_invoke();
        call.arg(&self.replica)
            .arg(seq)
            .arg(self.ttl_ms)
            .arg(&self.channel);
        for r in reports {
            call.key(self.worker_key(&r.key))
                .arg(r.limit)
                .arg(r.held)
                .arg(r.demand);
        }
        let answer: Result<Vec<(u32, u32, u32, u32)>, _> = call.invoke_async(&mut conn).await;
        match answer {
            Ok(rows) => Ok(rows
                .into_iter()
                .map(|(share, limit, replicas, contended)| ShareGrant {
                    share,
                    limit,
                    replicas,
                    contended: contended != 0,
                })
                .collect()),
            Err(e) => {
                // Reconnect next time: the connection may be broken or pointing at a dead store.
                *self.conn.lock().await = None;
                Err(self.error("exchange with", &e))
            }
        }
    }

    /// Listens to the group's pushes until the returned task is aborted, calling `on_push` for
    /// every message another replica's exchange published, with what it announced.
    ///
    /// A subscription that fails or is closed is opened again after `retry` (connecting is
    /// bounded by the exchange timeout); failures are logged at debug level only, since
    /// exchanges report the store's health. A subscription is also replaced by a new one
    /// every `renew`: a silently cut connection carries no traffic to notice it by, so this
    /// bounds how long pushes can be lost unnoticed.
    pub fn listen(
        self: &Arc<Self>,
        retry: Duration,
        renew: Duration,
        on_push: impl Fn(Push) + Send + Sync + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                match tokio::time::timeout(renew, me.subscribed(&on_push)).await {
                    Err(_renew) => continue,
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "admission store push subscription lost");
                    }
                }
                tokio::time::sleep(retry).await;
            }
        })
    }

    /// One subscription, until it fails or the store closes it.
    async fn subscribed(&self, on_push: &(impl Fn(Push) + Send + Sync)) -> Result<(), StoreError> {
        let subscribe = async {
            let mut pubsub = self.client.get_async_pubsub().await?;
            pubsub.subscribe(&self.channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        let mut pubsub = tokio::time::timeout(self.timeout, subscribe)
            .await
            .map_err(|_| StoreError(format!("cannot subscribe to {}: timed out", self.url)))?
            .map_err(|e| self.error("cannot subscribe to", &e))?;
        let mut messages = pubsub.on_message();
        while let Some(msg) = messages.next().await {
            if let Some(push) = parse_push(msg.get_payload_bytes(), &self.replica) {
                on_push(push);
            }
        }
        Ok(())
    }
}

impl LeaseStore for RedisLeases {
    fn exchange<'a>(&'a self, seq: u64, reports: &'a [ShareReport]) -> Exchange<'a> {
        Box::pin(self.run(seq, reports))
    }
}

/// What a push message announces: `want ID` or `free ID`. `None` for this replica's own
/// messages (they ask nothing of it); a kind this version does not know counts as both.
pub fn parse_push(payload: &[u8], me: &str) -> Option<Push> {
    let text = std::str::from_utf8(payload).ok()?;
    let (kind, id) = text.split_once(' ').unwrap_or(("", text));
    if id == me {
        return None;
    }
    Some(match kind {
        "want" => Push::Wanted,
        "free" => Push::Freed,
        _ => Push::Both,
    })
}

/// The key prefix of `group`'s hashes.
pub fn key_prefix(group: &str) -> String {
    format!("pdrouter:admission:{{{group}}}:")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushes_name_their_kind_and_sender_and_our_own_are_ignored() {
        assert_eq!(parse_push(b"want r2", "r1"), Some(Push::Wanted));
        assert_eq!(parse_push(b"free r2", "r1"), Some(Push::Freed));
        assert_eq!(parse_push(b"want r1", "r1"), None);
        assert_eq!(parse_push(b"free r1", "r1"), None);
        // A kind this version does not know: both.
        assert_eq!(parse_push(b"grow r2", "r1"), Some(Push::Both));
        assert_eq!(parse_push(b"r2", "r1"), Some(Push::Both));
        assert_eq!(parse_push(b"\xff\xfe", "r1"), None);
    }
}
