//! Observability flags: the Prometheus listener, the log level and format, log files and
//! OpenTelemetry traces. Logging is set up before the rest of the configuration is used, so
//! [`TelemetryArgs::settings`] is read from the flags directly (by the binary).

use std::net::IpAddr;

use clap::Args;

use crate::config::ConfigError;
use crate::config::telemetry::{LogSettings, check_log_dir, otlp_endpoint, valid_log_level};

/// `launch` flags under "Observability".
#[derive(Debug, Args)]
pub struct TelemetryArgs {
    /// Prometheus listener address.
    #[arg(long, default_value = "0.0.0.0", help_heading = "Observability")]
    pub prometheus_host: IpAddr,
    /// Prometheus listener port, 0-65535 (0 = any free port).
    #[arg(long, default_value_t = 29000, help_heading = "Observability")]
    pub prometheus_port: u16,
    /// Log level: trace, debug, info, warn, error (or a tracing filter).
    #[arg(long, default_value = "info", help_heading = "Observability")]
    pub log_level: String,
    /// Structured JSON logs.
    #[arg(long, help_heading = "Observability")]
    pub log_json: bool,
    /// Also write logs to daily-rotated files in this directory (pdrouter.log.YYYY-MM-DD;
    /// the newest 7 are kept).
    #[arg(long, value_name = "DIR", help_heading = "Observability")]
    pub log_dir: Option<std::path::PathBuf>,
    /// Export OpenTelemetry spans over OTLP/gRPC: one per request, with children for the
    /// admission wait and each worker leg.
    #[arg(long, help_heading = "Observability")]
    pub enable_trace: bool,
    /// OTLP/gRPC collector for --enable-trace, host:port or http://host:port
    /// [default: localhost:4317].
    #[arg(long, value_name = "HOST:PORT", help_heading = "Observability")]
    pub otlp_traces_endpoint: Option<String>,
}

/// Where spans go when `--otlp-traces-endpoint` is not given.
const DEFAULT_OTLP_ENDPOINT: &str = "localhost:4317";

impl TelemetryArgs {
    fn endpoint(&self) -> &str {
        self.otlp_traces_endpoint
            .as_deref()
            .unwrap_or(DEFAULT_OTLP_ENDPOINT)
    }

    /// Settings that are valid but do nothing as given, one warning line each.
    pub fn unused(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.otlp_traces_endpoint.is_some() && !self.enable_trace {
            out.push("--otlp-traces-endpoint has no effect without --enable-trace; no spans are exported");
        }
        out
    }

    /// The log level, the collector address and the log directory (created if needed).
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        if !valid_log_level(&self.log_level) {
            return Err(ConfigError(format!(
                "--log-level '{}' is not one of trace, debug, info, warn, error",
                self.log_level
            )));
        }
        otlp_endpoint(self.endpoint())?;
        if let Some(dir) = &self.log_dir {
            check_log_dir(dir)?;
        }
        Ok(())
    }

    /// The Prometheus listener's address.
    pub(super) fn prometheus(&self) -> (IpAddr, u16) {
        (self.prometheus_host, self.prometheus_port)
    }

    /// What `crate::telemetry::init` needs.
    pub fn settings(&self) -> LogSettings {
        LogSettings {
            level: self.log_level.clone(),
            json: self.log_json,
            dir: self.log_dir.clone(),
            // Checked by `into_config` already; the scheme-less form gets `http://` here.
            otlp_endpoint: self
                .enable_trace
                .then(|| otlp_endpoint(self.endpoint()).ok())
                .flatten(),
        }
    }
}
