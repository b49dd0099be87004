//! `https://` workers: the router speaks TLS to a worker whose certificate it trusts through
//! `SSL_CERT_FILE`, and refuses one it does not trust.

mod support;

use std::sync::Arc;

use support::*;
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
