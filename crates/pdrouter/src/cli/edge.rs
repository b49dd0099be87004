//! Edge flags: request-id headers, CORS origins, server TLS and control-plane keys.

use clap::Args;

use crate::config::ConfigError;
use crate::config::edge::{EdgeConfig, control_plane_keys, cors, request_id_headers, server_tls};

/// `launch` flags under "Edge".
#[derive(Debug, Args)]
pub struct EdgeArgs {
    /// Headers read for the request id, in order; the first valid one wins, else a fresh id.
    /// The id is echoed as `x-request-id` [default: x-request-id x-correlation-id x-trace-id
    /// request-id].
    #[arg(long, num_args = 1.., value_name = "HEADER", help_heading = "Edge")]
    pub request_id_headers: Vec<String>,
    /// Browser origins allowed to call the router (scheme://host[:port], or * for any);
    /// preflights are answered and allowed origins get Access-Control-Allow-Origin.
    #[arg(long, num_args = 1.., value_name = "ORIGIN", help_heading = "Edge")]
    pub cors_allowed_origins: Vec<String>,
    /// Serve HTTPS with this PEM certificate chain (needs --tls-key-path).
    #[arg(long, value_name = "FILE", help_heading = "Edge")]
    pub tls_cert_path: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert-path.
    #[arg(long, value_name = "FILE", help_heading = "Edge")]
    pub tls_key_path: Option<std::path::PathBuf>,
    /// Control-plane keys 'id:name:role:key', role admin or user; when given, /workers needs
    /// an admin key (user: 403) instead of --api-key.
    #[arg(long, num_args = 1.., value_name = "ID:NAME:ROLE:KEY", help_heading = "Edge")]
    pub control_plane_api_keys: Vec<String>,
}

impl EdgeArgs {
    /// The edge settings, each list parsed and the certificate loaded (so a bad file fails
    /// here, before anything listens).
    pub(super) fn resolve(self) -> Result<EdgeConfig, ConfigError> {
        Ok(EdgeConfig {
            request_id_headers: request_id_headers(&self.request_id_headers)?,
            cors: cors(&self.cors_allowed_origins)?,
            tls: server_tls(self.tls_cert_path.as_deref(), self.tls_key_path.as_deref())?,
            control_plane_keys: control_plane_keys(&self.control_plane_api_keys)?,
        })
    }
}
