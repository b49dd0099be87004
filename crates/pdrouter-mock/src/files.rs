//! [`FileServer`]: a loopback HTTP/1.1 server answering every request with one body, as an
//! image host for tests and demos of image URLs.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Serves one body, with its content type, to every request until dropped.
#[derive(Debug)]
pub struct FileServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl FileServer {
    /// Starts serving `body` as `content_type` on a free loopback port.
    pub async fn start(body: Vec<u8>, content_type: &str) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n",
            body.len()
        );
        let reply: Arc<Vec<u8>> = Arc::new([head.into_bytes(), body].concat());
        let task = tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let reply = reply.clone();
                tokio::spawn(async move {
                    // One read takes a test client's whole request head.
                    let mut buf = [0u8; 4096];
                    let _ = sock.read(&mut buf).await;
                    let _ = sock.write_all(&reply).await;
                });
            }
        });
        Ok(FileServer { addr, task })
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
