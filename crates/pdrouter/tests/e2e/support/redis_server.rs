//! A private `redis-server` for admission-store tests: a free loopback port, no persistence,
//! its own temporary directory; killed when dropped. Needs the `redis-server` binary (Debian:
//! `apt-get install redis-server`); `.ci/run` installs it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::{Instant, sleep};

pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts one on a free port and waits until it answers `PING`.
    pub async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let dir = tempfile::tempdir().expect("temp dir");
        let mut s = RedisServer {
            child: None,
            port,
            dir,
        };
        s.restart().await;
        s
    }

    /// (Re)starts the server on its port (after [`RedisServer::kill`]), empty.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run redis-server ({e}): admission-store tests need it \
                     (Debian: apt-get install redis-server)"
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.command(&["PING"]).as_deref() == Some("PONG") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer PING"
            );
            sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills the server (SIGKILL): everything it held is lost.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops (SIGSTOP) or resumes (SIGCONT) the server: connections stay open, nothing answers.
    pub fn pause(&self, paused: bool) {
        let pid = self.child.as_ref().expect("running").id();
        let sig = if paused { "-STOP" } else { "-CONT" };
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Waits (bounded) until the server has been up for `d`, so leases of that TTL are no
    /// longer held back by the store's restart rule.
    pub async fn wait_uptime(&self, d: Duration) {
        let deadline = Instant::now() + d + Duration::from_secs(30);
        loop {
            let info = self.command(&["INFO", "server"]).unwrap_or_default();
            let up = info
                .lines()
                .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
                .and_then(|v| v.trim().parse::<u64>().ok());
            if up.is_some_and(|s| Duration::from_secs(s) >= d) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server uptime never reached {d:?}"
            );
            sleep(Duration::from_millis(100)).await;
        }
    }

    /// One command over a fresh connection; the simple-string, integer or bulk answer.
    pub fn command(&self, args: &[&str]) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        s.write_all(req.as_bytes()).ok()?;
        let mut r = BufReader::new(s);
        let mut line = String::new();
        r.read_line(&mut line).ok()?;
        let line = line.trim_end();
        match line.split_at_checked(1)? {
            ("+" | ":", rest) => Some(rest.to_string()),
            ("$", n) => {
                let n: usize = n.parse().ok()?;
                let mut buf = vec![0; n + 2];
                r.read_exact(&mut buf).ok()?;
                buf.truncate(n);
                String::from_utf8(buf).ok()
            }
            _ => None,
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            // A paused server must be resumed to die cleanly on every platform.
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
        }
        self.kill();
    }
}
