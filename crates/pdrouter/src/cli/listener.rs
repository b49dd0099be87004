//! Listener flags: where the router listens, how large and how long a request may be, how
//! many client connections it holds, and the key inference routes require.

use std::net::IpAddr;
use std::time::Duration;

use clap::Args;

use crate::config::edge::bearer_usable;
use crate::config::{ConfigError, DEFAULT_CLIENT_HEADER_TIMEOUT_SECS, DEFAULT_MAX_CONNECTIONS};

/// `launch` flags under "Listener".
#[derive(Debug, Args)]
pub struct ListenerArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0", help_heading = "Listener")]
    pub host: IpAddr,
    /// Port to listen on, 0-65535 (0 = any free port; the bound address is printed).
    #[arg(long, default_value_t = 30000, help_heading = "Listener")]
    pub port: u16,
    /// Largest accepted request body in bytes, 1-4294967296.
    #[arg(long, default_value_t = 536_870_912, help_heading = "Listener")]
    pub max_payload_size: usize,
    /// Longest a backend request may take, in seconds, 1-604800 (7 days).
    #[arg(long, default_value_t = 1800, help_heading = "Listener")]
    pub request_timeout_secs: u64,
    /// Time in-flight requests get to finish on SIGTERM/Ctrl-C, in seconds, 0-86400.
    #[arg(long, default_value_t = 180, help_heading = "Listener")]
    pub shutdown_grace_period_secs: u64,
    /// Longest a client may take from the first byte of a request head to its end, in seconds
    /// (1-3600); a stalled head gets 408 and its connection is closed. Idle keep-alive
    /// connections are not affected.
    #[arg(long, default_value_t = DEFAULT_CLIENT_HEADER_TIMEOUT_SECS, help_heading = "Listener")]
    pub client_header_timeout_secs: u64,
    /// Most client connections open at once (1-1048576); further connections wait in the
    /// accept backlog until one closes [default: 32768, or the open-file limit minus 256 when
    /// that is lower].
    #[arg(long, help_heading = "Listener")]
    pub max_connections: Option<usize>,
    /// Require `Authorization: Bearer KEY` on inference and admin routes; also the key sent
    /// to the startup workers.
    #[arg(long, help_heading = "Listener")]
    pub api_key: Option<String>,
}

/// The listener's part of [`Config`](crate::config::Config).
#[derive(Debug)]
pub(super) struct Listener {
    pub(super) host: IpAddr,
    pub(super) port: u16,
    pub(super) max_payload_size: usize,
    pub(super) request_timeout: Duration,
    pub(super) shutdown_grace: Duration,
    pub(super) client_header_timeout: Duration,
    pub(super) max_connections: usize,
    pub(super) api_key: Option<String>,
}

impl ListenerArgs {
    /// The listener settings. The API key is checked here because it is sent as a header
    /// value; the numeric ranges are checked with the whole configuration (`Config::validate`).
    pub(super) fn resolve(self) -> Result<Listener, ConfigError> {
        if self.api_key.as_deref() == Some("") {
            return Err(ConfigError("--api-key must not be empty".into()));
        }
        if let Some(key) = &self.api_key
            && !bearer_usable(key)
        {
            return Err(ConfigError(
                "--api-key must be usable in an HTTP header: visible ASCII and spaces".into(),
            ));
        }
        Ok(Listener {
            host: self.host,
            port: self.port,
            max_payload_size: self.max_payload_size,
            request_timeout: Duration::from_secs(self.request_timeout_secs),
            shutdown_grace: Duration::from_secs(self.shutdown_grace_period_secs),
            client_header_timeout: Duration::from_secs(self.client_header_timeout_secs),
            max_connections: self.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS),
            api_key: self.api_key,
        })
    }
}
