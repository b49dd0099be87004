//! Against real loopback servers that answer with hand-written HTTP. `AddressPolicy::Only`
//! stands a loopback address in for a public one where a test needs an allowed first hop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

/// What the test server does with a request.
enum Reply {
    /// Writes these bytes and closes.
    Raw(Vec<u8>),
    /// Never answers (the connection stays open).
    Hang,
    /// Writes these bytes (a head, part of a body) and then never sends more.
    Stall(Vec<u8>),
}

struct Server {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

async fn serve(ip: &str, answer: impl Fn(&str) -> Reply + Send + Sync + 'static) -> Server {
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head);
                let path = text.split_whitespace().nth(1).unwrap_or("/").to_owned();
                match answer(&path) {
                    Reply::Raw(bytes) => {
                        let _ = sock.write_all(&bytes).await;
                        let _ = sock.shutdown().await;
                    }
                    Reply::Hang => std::future::pending::<()>().await,
                    Reply::Stall(bytes) => {
                        let _ = sock.write_all(&bytes).await;
                        std::future::pending::<()>().await;
                    }
                }
            });
        }
    });
    Server { addr, connections }
}

fn ok(body: &[u8]) -> Reply {
    let mut r = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: image/png\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    Reply::Raw(r)
}

fn redirect(status: u16, location: Option<&str>) -> Reply {
    let loc = location.map_or(String::new(), |l| format!("location: {l}\r\n"));
    Reply::Raw(
        format!("HTTP/1.1 {status} Moved\r\n{loc}content-length: 0\r\nconnection: close\r\n\r\n")
            .into_bytes(),
    )
}

fn config(max_bytes: u64, allow_private: bool) -> ImageConfig {
    ImageConfig {
        max_bytes,
        allow_private_urls: allow_private,
        ..ImageConfig::default()
    }
}

fn loopback_only() -> AddressPolicy {
    AddressPolicy::Only(vec!["127.0.0.1".parse().unwrap()])
}

#[tokio::test]
async fn the_allow_private_flag_decides_whether_loopback_is_fetched() {
    let server = serve("127.0.0.1", |_| ok(b"png bytes")).await;
    let allowed = ImageFetcher::new(&config(1024, true));
    assert_eq!(
        allowed.fetch(&server.url("/a.png")).await.unwrap(),
        &b"png bytes"[..]
    );
    let before = server.connections();
    let default = ImageFetcher::new(&config(1024, false));
    let err = default.fetch(&server.url("/a.png")).await.unwrap_err();
    assert_eq!(
        err,
        FetchError::PrivateAddress {
            host: "127.0.0.1".into()
        }
    );
    assert!(
        err.to_string().contains("--allow-private-image-urls"),
        "{err}"
    );
    assert_eq!(
        server.connections(),
        before,
        "a refused address is never connected to"
    );
}

#[tokio::test]
async fn private_hosts_are_refused_in_every_spelling_without_connecting() {
    let server = serve("127.0.0.1", |_| ok(b"x")).await;
    let port = server.addr.port();
    let fetcher = ImageFetcher::new(&config(1024, false));
    for url in [
        format!("http://127.0.0.1:{port}/"),
        format!("http://[::ffff:127.0.0.1]:{port}/"),
        format!("http://[::1]:{port}/"),
        format!("https://10.0.0.1:{port}/"),
        "http://169.254.169.254/latest/meta-data".to_string(),
        format!("http://[fe80::1]:{port}/"),
        format!("http://[fd00::1]:{port}/"),
        format!("http://0.0.0.0:{port}/"),
        // Host names are judged by what they resolve to; so are numeric spellings the
        // system resolver accepts.
        format!("http://localhost:{port}/"),
        format!("http://127.1:{port}/"),
    ] {
        let err = fetcher.fetch(&url).await.unwrap_err();
        assert!(
            matches!(err, FetchError::PrivateAddress { .. }),
            "{url}: {err:?}"
        );
    }
    assert_eq!(server.connections(), 0);
}

#[tokio::test]
async fn redirects_are_followed_and_every_hop_is_checked_again() {
    let private = serve("127.0.0.2", |_| ok(b"secret")).await;
    let private_url = private.url("/internal");
    let server = serve("127.0.0.1", move |path| match path {
        "/dir/relative" => redirect(302, Some("img/b.png")),
        "/dir/img/b.png" => ok(b"found"),
        "/absolute" => redirect(301, Some("/dir/img/b.png")),
        "/to-private" => redirect(307, Some(&private_url)),
        "/to-ftp" => redirect(308, Some("ftp://example.com/a.png")),
        "/no-location" => redirect(302, None),
        "/loop" => redirect(302, Some("/loop")),
        _ => Reply::Raw(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_vec()),
    })
    .await;
    let fetcher = ImageFetcher::with_policy(&config(1024, false), loopback_only());
    // A relative Location resolves against the URL that answered it.
    assert_eq!(
        fetcher.fetch(&server.url("/dir/relative")).await.unwrap(),
        &b"found"[..]
    );
    assert_eq!(
        fetcher.fetch(&server.url("/absolute")).await.unwrap(),
        &b"found"[..]
    );
    assert_eq!(
        fetcher.fetch(&server.url("/to-private")).await,
        Err(FetchError::PrivateAddress {
            host: "127.0.0.2".into()
        })
    );
    assert_eq!(
        private.connections(),
        0,
        "the private hop was never connected to"
    );
    assert_eq!(
        fetcher.fetch(&server.url("/to-ftp")).await,
        Err(FetchError::Scheme("ftp".into()))
    );
    assert_eq!(
        fetcher.fetch(&server.url("/no-location")).await,
        Err(FetchError::BadRedirect)
    );
    let before = server.connections();
    assert_eq!(
        fetcher.fetch(&server.url("/loop")).await,
        Err(FetchError::TooManyRedirects { max: MAX_REDIRECTS })
    );
    assert_eq!(server.connections() - before, MAX_REDIRECTS + 1);
}

#[test]
fn locations_resolve_like_a_browser() {
    let base: Uri = "http://h:1/a/b/c.png?q=1".parse().unwrap();
    assert_eq!(join(&base, "d.png").unwrap(), "http://h:1/a/b/d.png");
    assert_eq!(join(&base, "/d.png").unwrap(), "http://h:1/d.png");
    assert_eq!(join(&base, "//other/d.png").unwrap(), "http://other/d.png");
    assert_eq!(join(&base, "HTTPS://x/y").unwrap(), "HTTPS://x/y");
    assert_eq!(
        join(&base, "data:image/png;base64,AA").unwrap(),
        "data:image/png;base64,AA"
    );
    assert_eq!(join(&base, " "), Err(FetchError::BadRedirect));
    let root: Uri = "http://h".parse().unwrap();
    assert_eq!(join(&root, "x.png").unwrap(), "http://h/x.png");
}

#[tokio::test]
async fn bodies_over_the_byte_limit_are_refused() {
    let server = serve("127.0.0.1", |path| match path {
        "/exact" => ok(&[7u8; 100]),
        "/announced" => ok(&[7u8; 101]),
        // No Content-Length: the body runs until the connection closes.
        _ => {
            let mut r = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n".to_vec();
            r.extend([7u8; 5000]);
            Reply::Raw(r)
        }
    })
    .await;
    let fetcher = ImageFetcher::with_policy(&config(100, false), loopback_only());
    assert_eq!(
        fetcher.fetch(&server.url("/exact")).await.unwrap().len(),
        100
    );
    let too_large = Err(FetchError::TooLarge { limit: 100 });
    assert_eq!(fetcher.fetch(&server.url("/announced")).await, too_large);
    assert_eq!(fetcher.fetch(&server.url("/streamed")).await, too_large);
}

#[tokio::test(start_paused = true)]
async fn a_server_that_stalls_times_out_on_the_configured_deadline() {
    let server = serve("127.0.0.1", |path| match path {
        "/silent" => Reply::Hang,
        _ => Reply::Stall(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\nfirst bytes".to_vec()),
    })
    .await;
    let cfg = ImageConfig {
        fetch_timeout: Duration::from_secs(7),
        ..config(4096, false)
    };
    let fetcher = ImageFetcher::with_policy(&cfg, loopback_only());
    for path in ["/silent", "/trickle"] {
        let start = tokio::time::Instant::now();
        let err = fetcher.fetch(&server.url(path)).await.unwrap_err();
        assert_eq!(err, FetchError::Timeout { secs: 7 }, "{path}");
        assert_eq!(start.elapsed(), Duration::from_secs(7), "{path}");
        assert!(err.to_string().contains("--image-fetch-timeout-secs"));
    }
}

#[tokio::test]
async fn bad_urls_statuses_and_dead_servers_are_reported() {
    let fetcher = ImageFetcher::with_policy(&config(1024, false), loopback_only());
    assert_eq!(
        fetcher.fetch("http://user:pw@127.0.0.1:9/").await,
        Err(FetchError::Credentials)
    );
    assert!(matches!(
        fetcher.fetch("http://exa mple.com/").await,
        Err(FetchError::InvalidUrl(_))
    ));
    assert!(matches!(
        fetcher.fetch("http:///nohost").await,
        Err(FetchError::InvalidUrl(_))
    ));
    let server = serve("127.0.0.1", |_| {
        Reply::Raw(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n".to_vec())
    })
    .await;
    assert_eq!(
        fetcher.fetch(&server.url("/x")).await,
        Err(FetchError::Status(403))
    );
    // A port nobody listens on: bind one, note it, close it.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    assert_eq!(
        fetcher.fetch(&format!("http://127.0.0.1:{port}/")).await,
        Err(FetchError::Connect)
    );
    let garbage = serve("127.0.0.1", |_| {
        Reply::Raw(b"not http at all\r\n\r\n".to_vec())
    })
    .await;
    assert_eq!(
        fetcher.fetch(&garbage.url("/")).await,
        Err(FetchError::Broken)
    );
}
