//! The Kubernetes API server, as pod discovery uses it: a LIST of pods (their
//! `resourceVersion`) and a WATCH from it (newline-delimited JSON events), with the
//! credentials of the pod's service account (in-cluster) or of a kubeconfig file's current
//! context (a bearer token or a client certificate, the cluster's CA).
//!
//! Invariants: the service-account token is read again for every call (the kubelet rotates
//! it); a LIST body and a WATCH line are bounded ([`MAX_LIST_BYTES`], [`MAX_EVENT_BYTES`]);
//! an expired `resourceVersion` (410 Gone, as a status or an ERROR event) is reported as
//! [`KubeError::Gone`] so the caller lists again.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::proxy::client::UpstreamBody;
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Limited};
use serde_json::Value;

use crate::config::KubeSource;
use crate::proxy::client::UpstreamClient;

/// Largest LIST answer read (a few thousand pods).
pub const MAX_LIST_BYTES: usize = 64 << 20;
/// Largest single WATCH event read (one pod).
pub const MAX_EVENT_BYTES: usize = 4 << 20;
/// Longest a LIST or the head of a WATCH may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the service account's credentials are mounted in a pod.
const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// A failed call.
#[derive(Debug)]
pub enum KubeError {
    /// The `resourceVersion` is too old: list again.
    Gone,
    /// Anything else, with what happened.
    Other(String),
}

impl std::fmt::Display for KubeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KubeError::Gone => f.write_str("resourceVersion expired (410 Gone)"),
            KubeError::Other(s) => f.write_str(s),
        }
    }
}

#[derive(Debug, Clone)]
enum Token {
    None,
    Value(String),
    File(PathBuf),
}

/// A client of one API server.
#[derive(Debug, Clone)]
pub struct KubeApi {
    /// `https://host:port` (or `http://` in a kubeconfig), without a trailing slash.
    base: String,
    token: Token,
    client: UpstreamClient,
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn tls(
    ca: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let Some(ca) = ca else {
        if client.is_none() {
            return Ok(crate::proxy::client::tls_config());
        }
        return Err("a client certificate needs the cluster's certificate-authority".into());
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&ca) {
        let cert = cert.map_err(|e| format!("the cluster CA is not PEM: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("the cluster CA is not a usable certificate: {e}"))?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    match client {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(&cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("the client certificate is not PEM: {e}"))?;
            let key = PrivateKeyDer::from_pem_slice(&key)
                .map_err(|e| format!("the client key is not PEM: {e}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("the client certificate and key do not match: {e}"))
        }
    }
}

/// `field` of `o` as bytes: `FIELD-data` (base64) or the file `FIELD` names (relative to
/// `dir`).
fn data_or_file(o: &Value, field: &str, dir: &Path) -> Result<Option<Vec<u8>>, String> {
    use base64::Engine as _;
    if let Some(d) = o.get(format!("{field}-data")).and_then(Value::as_str) {
        return base64::engine::general_purpose::STANDARD
            .decode(d.trim())
            .map(Some)
            .map_err(|e| format!("kubeconfig {field}-data is not base64: {e}"));
    }
    match o.get(field).and_then(Value::as_str) {
        Some(f) => read(&dir.join(f)).map(Some),
        None => Ok(None),
    }
}

/// The entry named `name` in the kubeconfig list `list` (`clusters`, `users`, `contexts`).
fn named<'a>(cfg: &'a Value, list: &str, name: &str, inner: &str) -> Result<&'a Value, String> {
    cfg.get(list)
        .and_then(Value::as_array)
        .and_then(|l| {
            l.iter()
                .find(|e| e.get("name").and_then(Value::as_str) == Some(name))
        })
        .and_then(|e| e.get(inner))
        .ok_or_else(|| format!("kubeconfig has no {inner} named '{name}'"))
}

impl KubeApi {
    /// A client for `source`.
    pub fn new(source: &KubeSource) -> Result<Self, String> {
        match source {
            KubeSource::InCluster { host, port } => {
                let dir = Path::new(SERVICE_ACCOUNT);
                let ca = read(&dir.join("ca.crt"))?;
                let host = match host.parse::<std::net::Ipv6Addr>() {
                    Ok(v6) => format!("[{v6}]"),
                    Err(_) => host.clone(),
                };
                Ok(KubeApi {
                    base: format!("https://{host}:{port}"),
                    token: Token::File(dir.join("token")),
                    client: UpstreamClient::with_tls(tls(Some(ca), None)?),
                })
            }
            KubeSource::File(path) => Self::from_kubeconfig(path),
        }
    }

    fn from_kubeconfig(path: &Path) -> Result<Self, String> {
        let text = read(path)?;
        let cfg: Value = serde_norway::from_slice(&text)
            .map_err(|e| format!("{} is not a kubeconfig: {e}", path.display()))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let current = cfg
            .get("current-context")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{} has no current-context", path.display()))?;
        let ctx = named(&cfg, "contexts", current, "context")?;
        let cluster_name = ctx
            .get("cluster")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let cluster = named(&cfg, "clusters", cluster_name, "cluster")?;
        let server = cluster
            .get("server")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("kubeconfig cluster '{cluster_name}' has no server"))?;
        if cluster.get("insecure-skip-tls-verify") == Some(&Value::Bool(true)) {
            return Err(
                "kubeconfig insecure-skip-tls-verify is not supported; give the \
                        cluster's certificate-authority"
                    .into(),
            );
        }
        let ca = data_or_file(cluster, "certificate-authority", dir)?;
        let user = match ctx.get("user").and_then(Value::as_str) {
            Some(u) => named(&cfg, "users", u, "user")?.clone(),
            None => Value::Null,
        };
        if user.get("exec").is_some() || user.get("auth-provider").is_some() {
            return Err(
                "kubeconfig exec and auth-provider credentials are not supported; \
                        use a token or a client certificate"
                    .into(),
            );
        }
        let token = match (user.get("token"), user.get("tokenFile")) {
            (Some(Value::String(t)), _) => Token::Value(t.clone()),
            (_, Some(Value::String(f))) => Token::File(dir.join(f)),
            _ => Token::None,
        };
        let client = match (
            data_or_file(&user, "client-certificate", dir)?,
            data_or_file(&user, "client-key", dir)?,
        ) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => return Err("kubeconfig gives a client certificate without its key".into()),
        };
        Ok(KubeApi {
            base: server.trim_end_matches('/').to_owned(),
            token,
            client: UpstreamClient::with_tls(tls(ca, client)?),
        })
    }

    fn request(&self, path_query: &str) -> Result<hyper::Request<Bytes>, KubeError> {
        let mut b = hyper::Request::get(format!("{}{path_query}", self.base))
            .header(hyper::header::ACCEPT, "application/json");
        let token = match &self.token {
            Token::None => None,
            Token::Value(t) => Some(t.clone()),
            Token::File(f) => Some(
                String::from_utf8_lossy(&read(f).map_err(KubeError::Other)?)
                    .trim()
                    .to_owned(),
            ),
        };
        if let Some(t) = token {
            b = b.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        b.body(Bytes::new())
            .map_err(|e| KubeError::Other(format!("bad API request: {e}")))
    }

    async fn call(&self, path_query: &str) -> Result<UpstreamBody, KubeError> {
        let resp = self
            .client
            .send(self.request(path_query)?, CALL_TIMEOUT)
            .await
            .map_err(|e| KubeError::Other(format!("API server: {e}")))?;
        match resp.status().as_u16() {
            200 => Ok(resp.into_body()),
            410 => Err(KubeError::Gone),
            s => Err(KubeError::Other(format!(
                "API server answered {s} to {path_query}"
            ))),
        }
    }

    /// The pods of `path_query` (a LIST) and the list's `resourceVersion`.
    pub async fn list(&self, path_query: &str) -> Result<(Vec<Value>, String), KubeError> {
        let body = self.call(path_query).await?;
        let bytes =
            tokio::time::timeout(CALL_TIMEOUT, Limited::new(body, MAX_LIST_BYTES).collect())
                .await
                .map_err(|_| KubeError::Other("the pod list did not arrive in time".into()))?
                .map_err(|e| KubeError::Other(format!("reading the pod list: {e}")))?
                .to_bytes();
        let mut v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| KubeError::Other(format!("the pod list is not JSON: {e}")))?;
        let rv = v
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let items = match v.get_mut("items").map(Value::take) {
            Some(Value::Array(items)) => items,
            _ => Vec::new(),
        };
        Ok((items, rv))
    }

    /// The events of a WATCH at `path_query`.
    pub async fn watch(&self, path_query: &str) -> Result<Watch, KubeError> {
        Ok(Watch {
            body: self.call(path_query).await?,
            buf: BytesMut::new(),
        })
    }
}

/// One WATCH's events, as they arrive.
#[derive(Debug)]
pub struct Watch {
    body: UpstreamBody,
    buf: BytesMut,
}

impl Watch {
    /// The next event (`{"type", "object"}`), `None` when the server ended the watch. An
    /// ERROR event with code 410 is [`KubeError::Gone`].
    pub async fn next(&mut self) -> Option<Result<Value, KubeError>> {
        loop {
            if let Some(end) = self.buf.iter().position(|b| *b == b'\n') {
                let line = self.buf.split_to(end + 1);
                let line = line.trim_ascii();
                if line.is_empty() {
                    continue;
                }
                return Some(match serde_json::from_slice::<Value>(line) {
                    Ok(e)
                        if e["type"] == "ERROR"
                            && e.pointer("/object/code") == Some(&410.into()) =>
                    {
                        Err(KubeError::Gone)
                    }
                    Ok(e) if e["type"] == "ERROR" => Err(KubeError::Other(format!(
                        "watch error: {}",
                        e.pointer("/object/message").unwrap_or(&Value::Null)
                    ))),
                    Ok(e) => Ok(e),
                    Err(e) => Err(KubeError::Other(format!("a watch event is not JSON: {e}"))),
                });
            }
            if self.buf.len() > MAX_EVENT_BYTES {
                return Some(Err(KubeError::Other("a watch event is too large".into())));
            }
            match self.body.frame().await? {
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                Err(e) => return Some(Err(KubeError::Other(format!("watch stream: {e}")))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path, user: &str, cluster: &str) -> PathBuf {
        let path = dir.join("config");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
                 contexts:\n- name: c\n  context: {{cluster: k, user: u}}\n\
                 clusters:\n- name: k\n  cluster: {{server: 'http://127.0.0.1:1/', {cluster}}}\n\
                 users:\n- name: u\n  user: {{{user}}}\n"
            ),
        )
        .unwrap();
        path
    }

    #[test]
    fn a_kubeconfig_gives_the_server_and_credentials_or_says_what_it_cannot_use() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tok"), "abc\n").unwrap();
        let api = KubeApi::new(&KubeSource::File(config(
            dir.path(),
            "tokenFile: tok",
            "x: 1",
        )))
        .unwrap();
        assert_eq!(api.base, "http://127.0.0.1:1");
        let req = api.request("/api/v1/pods").unwrap();
        assert_eq!(req.headers()["authorization"], "Bearer abc");
        assert_eq!(req.uri(), "http://127.0.0.1:1/api/v1/pods");
        for (user, cluster, says) in [
            ("exec: {command: aws}", "x: 1", "exec"),
            (
                "token: t",
                "insecure-skip-tls-verify: true",
                "insecure-skip-tls-verify",
            ),
            ("client-certificate-data: QUJD", "x: 1", "without its key"),
            ("token: t", "certificate-authority-data: '%%%'", "base64"),
        ] {
            let e = KubeApi::new(&KubeSource::File(config(dir.path(), user, cluster))).unwrap_err();
            assert!(e.contains(says), "{user} {cluster}: {e}");
        }
        let e = KubeApi::new(&KubeSource::File(dir.path().join("missing"))).unwrap_err();
        assert!(e.contains("cannot read"), "{e}");
        std::fs::write(dir.path().join("bad"), "current-context: nowhere\n").unwrap();
        let e = KubeApi::new(&KubeSource::File(dir.path().join("bad"))).unwrap_err();
        assert!(e.contains("no context named 'nowhere'"), "{e}");
    }
}
