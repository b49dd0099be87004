//! The load generator: closed loop (fixed concurrency) or open loop (Poisson
//! arrivals), measuring TTFT and latency per request.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{CONTENT_TYPE, HOST, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Map, Value, json};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::check::BodyCheck;
use crate::sample::{PoissonGaps, PromptDist, PromptSampler, derive_seed};
use crate::stats::{Record, RunShape, Summary, summarize};

/// How requests are offered.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Load {
    /// `n` tasks, each sending its next request as soon as the previous one
    /// finished, over its own keep-alive connection.
    Closed {
        /// Number of concurrent tasks (at least 1).
        concurrency: usize,
    },
    /// Poisson arrivals at `rate` per second; every arrival is sent at once,
    /// however many requests are outstanding (pooled keep-alive connections).
    Open {
        /// Mean arrivals per second (positive).
        rate: f64,
    },
}

/// Everything a run needs (the library form of the command line).
#[derive(Clone, Debug, PartialEq)]
pub struct LoadOptions {
    /// Base URL, `http://HOST:PORT`.
    pub url: String,
    /// Request path; also selects the body shape (`/generate`,
    /// `/v1/chat/completions`, `/v1/completions`, `/v1/responses`).
    pub path: String,
    /// Closed or open loop.
    pub load: Load,
    /// Requests are started during this long; outstanding ones then finish.
    pub duration: Duration,
    /// At most this many requests are started (`None`: no cap); the run
    /// ends early when they are.
    pub max_requests: Option<u64>,
    /// Ask for server-sent events.
    pub stream: bool,
    /// Seed of every random draw (arrivals, prompt lengths, prompt words).
    pub seed: u64,
    /// Prompt-length distribution.
    pub prompt_dist: PromptDist,
    /// Mean prompt length in words.
    pub prompt_mean_tokens: u32,
    /// Output tokens requested per request.
    pub max_tokens: u32,
    /// Model name sent in the body.
    pub model: String,
    /// Extra top-level JSON fields merged into every body (they override the
    /// generated ones), e.g. `bootstrap_room` for a request sent straight to
    /// a prefill/decode worker.
    pub extra: Map<String, Value>,
    /// Extra request headers sent with every request (e.g. a priority class).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Longest a single request may take before it counts as failed.
    pub timeout: Duration,
    /// Label written into the summary and the CSV rows.
    pub label: String,
    /// Print a progress line on stderr once a second.
    pub progress: bool,
}

impl LoadOptions {
    /// Defaults for `url`: chat completions, concurrency 1, 1 s, no request
    /// cap, no streaming, seed 1, fixed 16-word prompts, 8 output tokens, model
    /// `mock-model`, 60 s timeout, label `run`, no progress line.
    pub fn new(url: impl Into<String>) -> Self {
        LoadOptions {
            url: url.into(),
            path: "/v1/chat/completions".to_owned(),
            load: Load::Closed { concurrency: 1 },
            duration: Duration::from_secs(1),
            max_requests: None,
            stream: false,
            seed: 1,
            prompt_dist: PromptDist::Fixed,
            prompt_mean_tokens: 16,
            max_tokens: 8,
            model: "mock-model".to_owned(),
            extra: Map::new(),
            headers: Vec::new(),
            timeout: Duration::from_secs(60),
            label: "run".to_owned(),
            progress: false,
        }
    }
}

/// A run that could not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError(String);

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LoadError {}

/// The outcome of a run: the summary and every request's record (sorted by
/// start time).
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// Aggregates.
    pub summary: Summary,
    /// One record per request.
    pub records: Vec<Record>,
}

/// The request body for `path`, with a prompt of `prompt` and the options'
/// output length, stream flag, model and extra fields.
pub fn request_body(opts: &LoadOptions, prompt: &str) -> Value {
    let k = opts.max_tokens;
    let mut body = if opts.path.ends_with("/generate") {
        json!({
            "text": prompt,
            "sampling_params": { "max_new_tokens": k, "temperature": 0 },
        })
    } else if opts.path.ends_with("/chat/completions") {
        json!({
            "model": opts.model,
            "messages": [{ "role": "user", "content": prompt }],
            "max_tokens": k,
        })
    } else if opts.path.ends_with("/completions") {
        json!({ "model": opts.model, "prompt": prompt, "max_tokens": k })
    } else if opts.path.ends_with("/responses") {
        json!({ "model": opts.model, "input": prompt, "max_output_tokens": k })
    } else {
        json!({
            "model": opts.model,
            "messages": [{ "role": "user", "content": prompt }],
            "max_tokens": k,
        })
    };
    if let Value::Object(map) = &mut body {
        map.insert("stream".to_owned(), Value::Bool(opts.stream));
        for (key, v) in &opts.extra {
            map.insert(key.clone(), v.clone());
        }
    }
    body
}

/// Where requests go, parsed once.
#[derive(Debug)]
struct Target {
    uri: Uri,
    authority: String,
}

fn target(opts: &LoadOptions) -> Result<Target, LoadError> {
    let base = opts.url.trim_end_matches('/');
    let path = if opts.path.starts_with('/') {
        opts.path.clone()
    } else {
        format!("/{}", opts.path)
    };
    let uri: Uri = format!("{base}{path}")
        .parse()
        .map_err(|e| LoadError(format!("bad URL {:?}: {e}", opts.url)))?;
    if uri.scheme_str() != Some("http") {
        return Err(LoadError(format!(
            "only http:// URLs are supported, got {:?}",
            opts.url
        )));
    }
    let authority = uri
        .authority()
        .map(|a| a.as_str().to_owned())
        .ok_or_else(|| LoadError(format!("URL {:?} has no host", opts.url)))?;
    let authority = if authority.contains(':') && !authority.ends_with(']') {
        authority
    } else {
        format!("{authority}:80")
    };
    Ok(Target { uri, authority })
}

fn validate(opts: &LoadOptions) -> Result<(), LoadError> {
    match opts.load {
        Load::Closed { concurrency: 0 } => Err(LoadError("concurrency must be at least 1".into())),
        Load::Open { rate } if !(rate.is_finite() && rate > 0.0) => {
            Err(LoadError(format!("rate must be positive, got {rate}")))
        }
        _ if opts.max_requests == Some(0) => {
            Err(LoadError("the request cap must be at least 1".into()))
        }
        _ => Ok(()),
    }
}

/// Live counters for the progress line.
#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    done: AtomicU64,
    ok: AtomicU64,
    n429: AtomicU64,
    failed: AtomicU64,
}

impl Counters {
    fn finish(&self, record: &Record) {
        self.done.fetch_add(1, Ordering::Relaxed);
        if record.is_ok() {
            self.ok.fetch_add(1, Ordering::Relaxed);
        }
        match record.status {
            429 => self.n429.fetch_add(1, Ordering::Relaxed),
            0 => self.failed.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
    }
}

/// Per-run shared state of the request tasks.
#[derive(Debug)]
struct Shared {
    target: Target,
    timeout: Duration,
    stream: bool,
    label: String,
    start: Instant,
    counters: Counters,
    /// The request cap, and how many requests have claimed a place under it.
    max_requests: Option<u64>,
    claimed: AtomicU64,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl Shared {
    /// Claims a place for one more request under the cap; `false` once the
    /// cap is reached.
    fn claim(&self) -> bool {
        match self.max_requests {
            None => true,
            Some(cap) => self.claimed.fetch_add(1, Ordering::Relaxed) < cap,
        }
    }

    /// Whether the cap ended the run (rather than the duration).
    fn cap_reached(&self) -> bool {
        self.max_requests
            .is_some_and(|cap| self.claimed.load(Ordering::Relaxed) >= cap)
    }

    fn request(&self, body: Bytes) -> Request<Full<Bytes>> {
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = Method::POST;
        *req.uri_mut() = self.target.uri.clone();
        let h = req.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Ok(v) = HeaderValue::from_str(&self.target.authority) {
            h.insert(HOST, v);
        }
        for (name, value) in &self.headers {
            h.append(name.clone(), value.clone());
        }
        req
    }
}

/// The result of one exchange before it becomes a [`Record`].
#[derive(Debug)]
struct Outcome {
    status: u16,
    ttft: Option<Duration>,
    complete: bool,
}

impl Outcome {
    /// No answer: connection error, broken body or timeout.
    fn failed(ttft: Option<Duration>) -> Self {
        Outcome {
            status: 0,
            ttft,
            complete: false,
        }
    }
}

/// Reads the response body, noting the first byte (streaming: the first
/// `data:` line) and judging whether it is a complete answer. A broken body
/// turns the outcome into a failure.
async fn consume(resp: Response<Incoming>, stream: bool, t0: Instant) -> Outcome {
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    let mut ttft = None;
    let mut head: Vec<u8> = Vec::new();
    // Only a 2xx stream is judged event by event; other bodies just have to arrive.
    let mut check = BodyCheck::new(stream && (200..300).contains(&status));
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Outcome::failed(ttft);
        };
        let Some(data) = frame.data_ref() else {
            continue;
        };
        check.feed(data);
        if ttft.is_some() || data.is_empty() {
            continue;
        }
        if stream && status < 300 {
            // The first `data:` may straddle two frames; keep what came so far.
            head.extend_from_slice(data);
            if head.windows(5).any(|w| w == b"data:") {
                ttft = Some(t0.elapsed());
                head = Vec::new();
            }
        } else {
            ttft = Some(t0.elapsed());
        }
    }
    Outcome {
        status,
        ttft,
        complete: check.complete(),
    }
}

/// One closed-loop task's connection, re-opened when it breaks.
#[derive(Debug)]
struct Conn {
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Conn {
    async fn send(&mut self, shared: &Shared, body: Bytes) -> Result<Response<Incoming>, String> {
        let sender = match self.sender.take() {
            Some(s) if !s.is_closed() => self.sender.insert(s),
            _ => {
                let tcp = TcpStream::connect(&shared.target.authority)
                    .await
                    .map_err(|e| e.to_string())?;
                let _ = tcp.set_nodelay(true);
                let (sender, conn) = http1::handshake(TokioIo::new(tcp))
                    .await
                    .map_err(|e| e.to_string())?;
                tokio::spawn(conn);
                self.sender.insert(sender)
            }
        };
        sender.ready().await.map_err(|e| e.to_string())?;
        let resp = sender
            .send_request(shared.request(body))
            .await
            .map_err(|e| e.to_string());
        if resp.is_err() {
            self.sender = None;
        }
        resp
    }
}

type Pool = Client<HttpConnector, Full<Bytes>>;

fn pool() -> Pool {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(usize::MAX)
        .pool_idle_timeout(Duration::from_secs(90))
        .build(connector)
}

/// Sends one request through `send`, with the per-request timeout, and
/// records the result.
async fn measure<F, Fut>(shared: &Shared, prompt_tokens: u32, body: Bytes, send: F) -> Record
where
    F: FnOnce(Bytes) -> Fut,
    Fut: Future<Output = Result<Response<Incoming>, String>>,
{
    shared.counters.sent.fetch_add(1, Ordering::Relaxed);
    let t0 = Instant::now();
    let start_offset = t0.duration_since(shared.start);
    let exchange = async {
        match send(body).await {
            Ok(resp) => consume(resp, shared.stream, t0).await,
            Err(_) => Outcome::failed(None),
        }
    };
    let outcome = tokio::time::timeout(shared.timeout, exchange)
        .await
        .unwrap_or(Outcome::failed(None));
    let latency = t0.elapsed();
    let record = Record {
        label: shared.label.clone(),
        start_offset_ms: ms(start_offset),
        status: outcome.status,
        ttft_ms: outcome.ttft.map(ms),
        latency_ms: ms(latency),
        prompt_tokens,
        complete: outcome.complete,
    };
    shared.counters.finish(&record);
    record
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn body_bytes(opts: &LoadOptions, prompt: &str) -> Bytes {
    Bytes::from(serde_json::to_vec(&request_body(opts, prompt)).unwrap_or_default())
}

async fn closed_task(
    shared: Arc<Shared>,
    opts: Arc<LoadOptions>,
    index: usize,
    deadline: Instant,
) -> Vec<Record> {
    let mut prompts = PromptSampler::new(
        opts.prompt_dist,
        opts.prompt_mean_tokens,
        derive_seed(opts.seed, 2 + index as u64),
    );
    let mut conn = Conn { sender: None };
    let mut records = Vec::new();
    while Instant::now() < deadline && shared.claim() {
        let len = prompts.next_len();
        let body = body_bytes(&opts, &prompts.words(len));
        let rec = measure(&shared, len, body, |b| conn.send(&shared, b)).await;
        if rec.status == 0 {
            conn.sender = None;
        }
        records.push(rec);
    }
    records
}

async fn open_loop(
    shared: Arc<Shared>,
    opts: Arc<LoadOptions>,
    rate: f64,
    deadline: Instant,
) -> Vec<Record> {
    let client = pool();
    let mut gaps = PoissonGaps::new(rate, derive_seed(opts.seed, 0));
    let mut prompts = PromptSampler::new(
        opts.prompt_dist,
        opts.prompt_mean_tokens,
        derive_seed(opts.seed, 1),
    );
    let mut tasks = JoinSet::new();
    let mut records = Vec::new();
    let mut next = shared.start;
    loop {
        next += gaps.next_gap();
        if next >= deadline || !shared.claim() {
            break;
        }
        let len = prompts.next_len();
        let body = body_bytes(&opts, &prompts.words(len));
        tokio::time::sleep_until(next).await;
        let (shared, client) = (Arc::clone(&shared), client.clone());
        tasks.spawn(async move {
            let send = |b| async {
                client
                    .request(shared.request(b))
                    .await
                    .map_err(|e| e.to_string())
            };
            measure(&shared, len, body, send).await
        });
        // Reap finished requests as we go so the set stays small.
        while let Some(done) = tasks.try_join_next() {
            records.extend(done.ok());
        }
    }
    while let Some(done) = tasks.join_next().await {
        records.extend(done.ok());
    }
    records
}

fn spawn_progress(shared: Arc<Shared>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        loop {
            tick.tick().await;
            let c = &shared.counters;
            let (sent, done) = (
                c.sent.load(Ordering::Relaxed),
                c.done.load(Ordering::Relaxed),
            );
            eprint!(
                "\r[{}] {:>4.0}s sent {sent} done {done} ok {} 429 {} failed {} inflight {}   ",
                shared.label,
                shared.start.elapsed().as_secs_f64(),
                c.ok.load(Ordering::Relaxed),
                c.n429.load(Ordering::Relaxed),
                c.failed.load(Ordering::Relaxed),
                sent.saturating_sub(done),
            );
        }
    })
}

/// Runs the load described by `opts` and returns every record and the
/// summary. Requests are started for `opts.duration` or until
/// `opts.max_requests` have been started, whichever comes first; the run ends
/// when the outstanding ones have finished (or timed out).
pub async fn run(opts: LoadOptions) -> Result<Report, LoadError> {
    validate(&opts)?;
    let target = target(&opts)?;
    let opts = Arc::new(opts);
    let start = Instant::now();
    let deadline = start
        .checked_add(opts.duration)
        .ok_or_else(|| LoadError("duration is too long".into()))?;
    let shared = Arc::new(Shared {
        target,
        timeout: opts.timeout,
        stream: opts.stream,
        label: opts.label.clone(),
        start,
        counters: Counters::default(),
        max_requests: opts.max_requests,
        claimed: AtomicU64::new(0),
        headers: opts.headers.clone(),
    });
    let progress = opts.progress.then(|| spawn_progress(Arc::clone(&shared)));
    let mut records = match opts.load {
        Load::Closed { concurrency } => {
            let mut tasks = JoinSet::new();
            for i in 0..concurrency {
                tasks.spawn(closed_task(
                    Arc::clone(&shared),
                    Arc::clone(&opts),
                    i,
                    deadline,
                ));
            }
            let mut all = Vec::new();
            while let Some(done) = tasks.join_next().await {
                all.extend(done.unwrap_or_default());
            }
            all
        }
        Load::Open { rate } => {
            open_loop(Arc::clone(&shared), Arc::clone(&opts), rate, deadline).await
        }
    };
    let elapsed = start.elapsed();
    if let Some(p) = progress {
        p.abort();
        eprint!("\r{:78}\r", "");
    }
    records.sort_by(|a, b| a.start_offset_ms.total_cmp(&b.start_offset_ms));
    let (concurrency, rate) = match opts.load {
        Load::Closed { concurrency } => (Some(concurrency), None),
        Load::Open { rate } => (None, Some(rate)),
    };
    // When the cap ended the run, requests were started during the whole run.
    let window = if shared.cap_reached() {
        elapsed.min(opts.duration)
    } else {
        opts.duration
    };
    let shape = RunShape {
        label: opts.label.clone(),
        concurrency,
        rate,
        duration_secs: window.as_secs_f64(),
        elapsed_secs: elapsed.as_secs_f64(),
    };
    Ok(Report {
        summary: summarize(&shape, &records),
        records,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_follow_the_path() {
        let mut o = LoadOptions::new("http://x");
        o.max_tokens = 3;
        o.path = "/generate".into();
        let b = request_body(&o, "w1 w2");
        assert_eq!(b["text"], "w1 w2");
        assert_eq!(b["sampling_params"]["max_new_tokens"], 3);
        assert_eq!(b["stream"], false);
        o.path = "/v1/chat/completions".into();
        o.stream = true;
        let b = request_body(&o, "hi");
        assert_eq!(b["messages"][0]["content"], "hi");
        assert_eq!(b["max_tokens"], 3);
        assert_eq!(b["stream"], true);
        o.path = "/v1/completions".into();
        assert_eq!(request_body(&o, "p")["prompt"], "p");
        o.path = "/v1/responses".into();
        assert_eq!(request_body(&o, "p")["input"], "p");
        o.extra.insert("bootstrap_room".into(), json!(7));
        o.extra.insert("stream".into(), json!(false));
        let b = request_body(&o, "p");
        assert_eq!(b["bootstrap_room"], 7);
        assert_eq!(b["stream"], false);
    }

    #[test]
    fn targets_need_an_http_url_with_a_host() {
        let mut o = LoadOptions::new("http://127.0.0.1:8080/");
        o.path = "generate".into();
        let t = target(&o).unwrap();
        assert_eq!(t.uri.to_string(), "http://127.0.0.1:8080/generate");
        assert_eq!(t.authority, "127.0.0.1:8080");
        assert_eq!(
            target(&LoadOptions::new("http://localhost"))
                .unwrap()
                .authority,
            "localhost:80"
        );
        assert!(target(&LoadOptions::new("https://x:1")).is_err());
        assert!(target(&LoadOptions::new("not a url")).is_err());
    }

    #[test]
    fn bad_load_shapes_are_refused() {
        let mut o = LoadOptions::new("http://x:1");
        o.load = Load::Closed { concurrency: 0 };
        assert!(validate(&o).is_err());
        o.load = Load::Open { rate: 0.0 };
        assert!(validate(&o).is_err());
        o.load = Load::Open { rate: f64::NAN };
        assert!(validate(&o).is_err());
        o.load = Load::Open { rate: 3.0 };
        assert!(validate(&o).is_ok());
        o.max_requests = Some(0);
        assert!(validate(&o).is_err());
        o.max_requests = Some(1);
        assert!(validate(&o).is_ok());
    }
}
