//! `https://` workers: the router speaks TLS to a worker whose certificate it trusts through
//! `SSL_CERT_FILE`, and refuses one it does not trust.

use std::sync::Arc;

use crate::support::*;
use tokio::net::{TcpListener, TcpStream};

/// A TLS front for `backend` (a plain mock worker) with a fresh self-signed certificate for
/// 127.0.0.1; returns its https URL and the certificate PEM.
async fn tls_front(backend: std::net::SocketAddr) -> (String, String) {
    // A throwaway CA and a leaf for 127.0.0.1 signed by it; the CA is what clients trust.
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap())
        .unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let cert_pem = ca.pem();
    let cert_der = leaf.der().clone();
    let key_der = rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert_der], key_der)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut plain) = TcpStream::connect(backend).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    (url, cert_pem)
}

/// Runs the router binary with `args`, trusting the certificates in `ca_pem`, sends one
/// POST and returns its reply; the router and the CA file are cleaned up.
async fn one_request_via_router(
    args: Vec<String>,
    ca_pem: String,
    path: &str,
    body: &str,
) -> Reply {
    let ca = std::env::temp_dir().join(format!(
        "pdrouter-tls-{}-{}.pem",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::write(&ca, ca_pem).unwrap();
    // Blocking read of the router's first line: keep the TLS fronts (this runtime) running.
    let ca2 = ca.clone();
    let (mut child, addr) =
        tokio::task::spawn_blocking(move || launch_binary(&args, &[("SSL_CERT_FILE", &ca2)]))
            .await
            .unwrap();
    let reply = post(addr.parse().unwrap(), path, body).await;
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&ca);
    reply
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_workers_are_reached_over_tls() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let (p_url, p_pem) = tls_front(p.addr()).await;
    let (d_url, d_pem) = tls_front(d.addr()).await;
    let args = [
        "--pd-disaggregation",
        "--prefill",
        &p_url,
        "--decode",
        &d_url,
        "--retry-max-retries",
        "1",
    ];
    let args = args.iter().map(|a| a.to_string()).collect();
    let reply = one_request_via_router(
        args,
        format!("{p_pem}{d_pem}"),
        "/v1/chat/completions",
        CHAT,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        p.stats().last_request.unwrap()["bootstrap_host"],
        "127.0.0.1"
    );
    assert_eq!(d.stats().requests_total, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_worker_certificate_is_refused() {
    let w = mock(Role::Regular, 0).await;
    let (url, _pem) = tls_front(w.addr()).await;
    let args = [
        "--worker-urls",
        &url,
        "--disable-health-check",
        "--retry-max-retries",
        "1",
    ];
    let args = args.iter().map(|a| a.to_string()).collect();
    // An empty trust file: the worker's certificate is not trusted.
    let reply = one_request_via_router(args, String::new(), "/v1/completions", COMPLETION).await;
    assert_eq!(reply.status, 502, "{}", reply.text());
    assert_eq!(w.stats().requests_total, 0);
}

/// A self-signed certificate for 127.0.0.1 and its key, written to PEM files in `dir`.
fn server_cert(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, Vec<u8>) {
    let generated = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let cert = dir.join("server.crt");
    let key = dir.join("server.key");
    std::fs::write(&cert, generated.cert.pem()).unwrap();
    std::fs::write(&key, generated.signing_key.serialize_pem()).unwrap();
    (cert, key, generated.cert.der().to_vec())
}

/// Sends `request` (a whole HTTP/1.1 request with `connection: close`) over TLS to `addr`,
/// trusting only `cert_der`, and returns the raw response.
async fn over_tls(addr: &str, cert_der: &[u8], request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(cert_der.to_vec()))
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = connector.connect(name, tcp).await.expect("TLS handshake");
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_serves_https_with_its_certificate() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let w = mock(Role::Regular, 0).await;
    let tmp = tempfile::tempdir().unwrap();
    let (cert, key, der) = server_cert(tmp.path());
    let args: Vec<String> = vec![
        "--worker-urls".into(),
        w.url(),
        "--disable-health-check".into(),
        "--tls-cert-path".into(),
        cert.display().to_string(),
        "--tls-key-path".into(),
        key.display().to_string(),
        "--client-header-timeout-secs".into(),
        "1".into(),
    ];
    let (child, addr) = tokio::task::spawn_blocking(move || launch_binary(&args, &[]))
        .await
        .unwrap();

    let health = over_tls(
        &addr,
        &der,
        "GET /health HTTP/1.1\r\nhost: r\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let chat = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{CHAT}",
        CHAT.len()
    );
    let answer = over_tls(&addr, &der, &chat).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"choices\""), "{answer}");
    assert_eq!(w.stats().requests_total, 1);

    // A client that connects and never starts a handshake is dropped (the handshake is bounded
    // by the head timeout), however long it would wait.
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    let mut buf = [0u8; 16];
    let closed =
        tokio::time::timeout(std::time::Duration::from_secs(30), idle.read(&mut buf)).await;
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");

    // Plain HTTP on the TLS port gets no HTTP answer.
    let mut plain = TcpStream::connect(&addr).await.unwrap();
    plain
        .write_all(b"GET /health HTTP/1.1\r\nhost: r\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        plain.read_to_end(&mut out),
    )
    .await;
    assert!(
        !out.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&out)
    );

    let (status, _) = stop_binary(child).await;
    assert!(status.success(), "{status:?}");
}

/// `pdrouter launch` with the TLS flags: its exit code and stderr.
fn launch_with_tls(flags: &[&std::ffi::OsStr]) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pdrouter"))
        .args(["launch", "--worker-urls", "http://127.0.0.1:1"])
        .args(flags)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_bad_certificate_or_key_is_exit_2_with_one_line_naming_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let (cert, key, _) = server_cert(tmp.path());
    let other = tempfile::tempdir().unwrap();
    let (_, other_key, _) = server_cert(other.path());
    let garbage = tmp.path().join("garbage.pem");
    std::fs::write(&garbage, b"not a pem file").unwrap();
    let missing = tmp.path().join("missing.pem");
    let c = |p: &std::path::Path| p.as_os_str().to_owned();
    let cert_flag = std::ffi::OsString::from("--tls-cert-path");
    let key_flag = std::ffi::OsString::from("--tls-key-path");
    let cases: Vec<(Vec<std::ffi::OsString>, &str)> = vec![
        (
            vec![cert_flag.clone(), c(&missing), key_flag.clone(), c(&key)],
            "--tls-cert-path: cannot read",
        ),
        (
            vec![cert_flag.clone(), c(&cert), key_flag.clone(), c(&missing)],
            "--tls-key-path: cannot read",
        ),
        (
            vec![cert_flag.clone(), c(&garbage), key_flag.clone(), c(&key)],
            "holds no PEM certificate",
        ),
        (
            vec![cert_flag.clone(), c(&cert), key_flag.clone(), c(&garbage)],
            "holds no PEM private key",
        ),
        (
            vec![cert_flag.clone(), c(&cert), key_flag.clone(), c(&other_key)],
            "do not make a usable pair",
        ),
        (
            vec![cert_flag.clone(), c(&cert)],
            "--tls-cert-path needs --tls-key-path",
        ),
        (
            vec![key_flag.clone(), c(&key)],
            "--tls-key-path needs --tls-cert-path",
        ),
    ];
    for (flags, needle) in cases {
        let flags: Vec<&std::ffi::OsStr> = flags.iter().map(|f| f.as_os_str()).collect();
        let (code, err) = launch_with_tls(&flags);
        assert_eq!(code, Some(2), "{needle}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(needle),
            "{needle}: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
}
