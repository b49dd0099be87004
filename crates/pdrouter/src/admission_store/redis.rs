//! The Redis lease store: one multiplexed connection, one Lua script per exchange.
//!
//! The connection is opened lazily and dropped on any error, so the next exchange reconnects
//! (a restarted store is found again without a separate task). `EVALSHA` falls back to loading
//! the script when the store does not know it (after a restart).

use std::time::Duration;

use pdrouter_admission::{Exchange, LeaseStore, ShareGrant, ShareReport, StoreError};
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
        Ok(RedisLeases {
            url: url.clone(),
            client,
            conn: Mutex::new(None),
            script: Script::new(LEASE_SCRIPT),
            prefix: key_prefix(group),
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
        call.arg(&self.replica).arg(seq).arg(self.ttl_ms);
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
}

impl LeaseStore for RedisLeases {
    fn exchange<'a>(&'a self, seq: u64, reports: &'a [ShareReport]) -> Exchange<'a> {
        Box::pin(self.run(seq, reports))
    }
}

/// The key prefix of `group`'s hashes.
pub fn key_prefix(group: &str) -> String {
    format!("pdrouter:admission:{{{group}}}:")
}
