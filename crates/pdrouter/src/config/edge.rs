//! The client-facing edge's settings: which headers carry a request id, which browser origins
//! may call the router (CORS), the server certificate (TLS), and the control-plane keys that
//! guard the admin routes.
//!
//! Everything here is parsed and checked once at startup, so a bad value fails the command
//! line (exit 2) with one line naming the flag; at run time `crate::edge` and `crate::http`
//! only compare bytes. Control-plane keys never appear in `Debug` output or logs: only their
//! id, name and role.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use http::{HeaderName, HeaderValue};

use super::ConfigError;

/// Headers read for the request id when `--request-id-headers` is not given, in order.
pub const DEFAULT_REQUEST_ID_HEADERS: &[&str] = &[
    "x-request-id",
    "x-correlation-id",
    "x-trace-id",
    "request-id",
];

/// Most names `--request-id-headers` and origins `--cors-allowed-origins` may list: each
/// request walks the lists.
pub const MAX_LIST_LEN: usize = 64;

/// The edge settings (see the module docs).
#[derive(Debug, Clone)]
pub struct EdgeConfig {
    /// Headers whose first valid value is the request id, in order; a fresh id otherwise.
    pub request_id_headers: Vec<HeaderName>,
    /// Origins answered with `Access-Control-Allow-Origin`; empty turns CORS off.
    pub cors: Option<Cors>,
    /// Server certificate and key; `None` serves plain HTTP.
    pub tls: Option<ServerTls>,
    /// Keys for the control plane (`/workers`); empty leaves it to `--api-key`.
    pub control_plane_keys: Vec<ControlPlaneKey>,
}

impl Default for EdgeConfig {
    fn default() -> Self {
        Self {
            request_id_headers: DEFAULT_REQUEST_ID_HEADERS
                .iter()
                .map(|h| HeaderName::from_static(h))
                .collect(),
            cors: None,
            tls: None,
            control_plane_keys: Vec::new(),
        }
    }
}

/// Parses `--request-id-headers` (empty: the defaults).
pub fn request_id_headers(names: &[String]) -> Result<Vec<HeaderName>, ConfigError> {
    if names.is_empty() {
        return Ok(EdgeConfig::default().request_id_headers);
    }
    if names.len() > MAX_LIST_LEN {
        return Err(ConfigError(format!(
            "--request-id-headers lists {} names; at most {MAX_LIST_LEN}",
            names.len()
        )));
    }
    names
        .iter()
        .map(|n| {
            HeaderName::from_bytes(n.trim().as_bytes()).map_err(|_| {
                ConfigError(format!(
                    "--request-id-headers: '{n}' is not an HTTP header name"
                ))
            })
        })
        .collect()
}

/// Which browser origins may call the router.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cors {
    /// `*`: any origin (answered with `*`, so browsers send no credentials).
    Any,
    /// Exactly these origins (`scheme://host[:port]`), echoed back when they match.
    Origins(Vec<HeaderValue>),
}

/// Parses `--cors-allowed-origins` (empty: CORS off).
pub fn cors(origins: &[String]) -> Result<Option<Cors>, ConfigError> {
    if origins.is_empty() {
        return Ok(None);
    }
    if origins.len() > MAX_LIST_LEN {
        return Err(ConfigError(format!(
            "--cors-allowed-origins lists {} origins; at most {MAX_LIST_LEN}",
            origins.len()
        )));
    }
    if origins.iter().any(|o| o.trim() == "*") {
        return Ok(Some(Cors::Any));
    }
    let mut list = Vec::with_capacity(origins.len());
    for raw in origins {
        let o = raw.trim().trim_end_matches('/');
        let rest = o
            .strip_prefix("http://")
            .or_else(|| o.strip_prefix("https://"));
        let ok = rest.is_some_and(|r| !r.is_empty() && !r.contains(['/', '?', '#', ' ']));
        let value = HeaderValue::from_str(o)
            .ok()
            .filter(|_| ok)
            .ok_or_else(|| {
                ConfigError(format!(
                    "--cors-allowed-origins: '{raw}' is not an origin; give scheme://host[:port] \
                 (e.g. https://app.example.com) or *"
                ))
            })?;
        list.push(value);
    }
    Ok(Some(Cors::Origins(list)))
}

/// The server's certificate chain and key, loaded and checked at startup.
#[derive(Clone)]
pub struct ServerTls {
    /// Where the chain came from (for logs).
    pub cert_path: PathBuf,
    /// The rustls configuration every accepted connection uses.
    pub config: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert_path", &self.cert_path)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads a PEM certificate chain and a PEM private key (PKCS#8, PKCS#1 or SEC1) and checks
    /// that they belong together.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self, ConfigError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let read = |flag: &str, path: &Path| {
            std::fs::read(path)
                .map_err(|e| ConfigError(format!("{flag}: cannot read '{}': {e}", path.display())))
        };
        let cert_pem = read("--tls-cert-path", cert_path)?;
        let key_pem = read("--tls-key-path", key_path)?;
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| {
                ConfigError(format!(
                    "--tls-cert-path: '{}' is not a PEM certificate chain: {e}",
                    cert_path.display()
                ))
            })?;
        if chain.is_empty() {
            return Err(ConfigError(format!(
                "--tls-cert-path: '{}' holds no PEM certificate",
                cert_path.display()
            )));
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            ConfigError(format!(
                "--tls-key-path: '{}' holds no PEM private key: {e}",
                key_path.display()
            ))
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ConfigError(format!("TLS: {e}")))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| {
                ConfigError(format!(
                    "--tls-cert-path/--tls-key-path: the certificate and key do not make a \
                     usable pair: {e}"
                ))
            })?;
        // The listener speaks HTTP/1.1 only.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            cert_path: cert_path.to_path_buf(),
            config: Arc::new(config),
        })
    }
}

/// Parses `--tls-cert-path` / `--tls-key-path` (both or neither).
pub fn server_tls(
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<Option<ServerTls>, ConfigError> {
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(c), Some(k)) => ServerTls::load(c, k).map(Some),
        (Some(_), None) => Err(ConfigError(
            "--tls-cert-path needs --tls-key-path (the certificate's private key)".into(),
        )),
        (None, Some(_)) => Err(ConfigError(
            "--tls-key-path needs --tls-cert-path (the server certificate)".into(),
        )),
    }
}

/// What a control-plane key may do. Neither role is an inference credential (inference is
/// guarded by `--api-key` alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The control plane (`/workers`, every method).
    Admin,
    /// Known, but refused on the control plane (403 rather than 401).
    User,
}

/// One `--control-plane-api-keys` entry, `id:name:role:key`.
#[derive(Clone)]
pub struct ControlPlaneKey {
    /// Identifier (logged with admin actions).
    pub id: String,
    /// Description.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// The secret (never logged or printed).
    pub key: String,
}

impl std::fmt::Debug for ControlPlaneKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlaneKey")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

/// Parses `--control-plane-api-keys` entries: `id:name:role:key`, split at the first three
/// colons (the key may hold colons), role `admin` or `user` in any case. The error message
/// names the entry by its id only, never by its key.
pub fn control_plane_keys(entries: &[String]) -> Result<Vec<ControlPlaneKey>, ConfigError> {
    if entries.len() > MAX_LIST_LEN {
        return Err(ConfigError(format!(
            "--control-plane-api-keys lists {} keys; at most {MAX_LIST_LEN}",
            entries.len()
        )));
    }
    let mut keys: Vec<ControlPlaneKey> = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let n = i + 1;
        let mut parts = entry.splitn(4, ':');
        let (Some(id), Some(name), Some(role), Some(key)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(ConfigError(format!(
                "--control-plane-api-keys: entry {n} is not id:name:role:key"
            )));
        };
        let role = match role.to_ascii_lowercase().as_str() {
            "admin" => Role::Admin,
            "user" => Role::User,
            _ => {
                return Err(ConfigError(format!(
                    "--control-plane-api-keys: entry {n} (id '{id}') has role '{role}'; use \
                     admin or user"
                )));
            }
        };
        if id.is_empty() || key.is_empty() {
            return Err(ConfigError(format!(
                "--control-plane-api-keys: entry {n} needs a non-empty id and key"
            )));
        }
        if !bearer_usable(key) {
            return Err(ConfigError(format!(
                "--control-plane-api-keys: the key of entry {n} (id '{id}') must be usable in \
                 an HTTP header: visible ASCII and spaces"
            )));
        }
        if keys.iter().any(|k| k.id == id) {
            return Err(ConfigError(format!(
                "--control-plane-api-keys: id '{id}' is given twice"
            )));
        }
        keys.push(ControlPlaneKey {
            id: id.to_string(),
            name: name.to_string(),
            role,
            key: key.to_string(),
        });
    }
    Ok(keys)
}

/// Whether `key` can be sent as `Authorization: Bearer KEY`: the header value the proxy builds
/// from it (`crate::proxy::forward::bearer`) must be valid. Checked here because config stands
/// on its own; a test in `crate::edge` keeps the two checks the same.
pub fn bearer_usable(key: &str) -> bool {
    HeaderValue::try_from(format!("Bearer {key}")).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn request_id_headers_default_and_custom() {
        let d = request_id_headers(&[]).unwrap();
        assert_eq!(d[0], "x-request-id");
        assert_eq!(d.len(), DEFAULT_REQUEST_ID_HEADERS.len());
        let c = request_id_headers(&strings(&["X-Trace-Id", "x-my-id"])).unwrap();
        assert_eq!(c, vec!["x-trace-id", "x-my-id"]);
        let e = request_id_headers(&strings(&["bad header"])).unwrap_err();
        assert!(e.0.contains("--request-id-headers"), "{e}");
    }

    #[test]
    fn cors_origins_are_checked() {
        assert_eq!(cors(&[]).unwrap(), None);
        assert_eq!(cors(&strings(&["*"])).unwrap(), Some(Cors::Any));
        let c = cors(&strings(&["https://a.example", "http://localhost:3000/"])).unwrap();
        let want = ["https://a.example", "http://localhost:3000"].map(HeaderValue::from_static);
        assert_eq!(c, Some(Cors::Origins(want.to_vec())));
        for bad in ["a.example", "https://a.example/path", "ftp://x", "https://"] {
            let e = cors(&strings(&[bad])).unwrap_err();
            assert!(e.0.contains("--cors-allowed-origins"), "{bad}: {e}");
        }
    }

    #[test]
    fn control_plane_keys_parse_and_never_show_the_key() {
        let k = control_plane_keys(&strings(&[
            "svc1:CI Pipeline:admin:secret:with:colons",
            "svc2:Monitoring:USER:readonly-456",
        ]))
        .unwrap();
        assert_eq!(k[0].role, Role::Admin);
        assert_eq!(k[0].key, "secret:with:colons");
        assert_eq!(k[1].role, Role::User);
        assert!(!format!("{k:?}").contains("secret"));
        for (bad, needle) in [
            ("svc1:n:admin", "id:name:role:key"),
            ("svc1:n:root:topsecret", "role 'root'"),
            (":n:admin:k", "non-empty"),
            ("svc1:n:admin:", "non-empty"),
            ("svc1:n:admin:bad\u{7}key", "HTTP header"),
        ] {
            let e = control_plane_keys(&strings(&[bad])).unwrap_err();
            assert!(e.0.contains(needle), "{bad}: {e}");
            assert!(!e.0.contains("topsecret"), "{e}");
        }
        let twice = control_plane_keys(&strings(&["a:n:admin:k1", "a:m:user:k2"]));
        assert!(twice.unwrap_err().0.contains("twice"));
    }
}
