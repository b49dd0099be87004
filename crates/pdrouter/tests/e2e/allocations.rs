//! Heap allocations per tiny request, counted on the router's own thread.
//!
//! The router runs alone on a current-thread runtime on a thread of its own; the mocks and
//! the client run on another runtime. A current-thread runtime runs its tasks only inside
//! `block_on`, so the measured requests are served inside one `block_on` wrapped in
//! `allocation_counter::measure` (which counts the calling thread's allocations): what is
//! counted is the router's work for them, accepting, parsing, choosing workers, both legs,
//! the answer, and nothing of the mocks' or the client's. Each budget is the count when it was set plus a little; a change that allocates
//! more per request on these paths fails here with the figure.

use crate::support::*;
use pdrouter::config::Config;

/// Requests measured after the warm-up.
const REQUESTS: u64 = 400;

/// Serves `cfg` on a counted current-thread runtime of its own, sends `body` to `path`
/// through it (warm-up first, then [`REQUESTS`] one after the other, each answered 200), and
/// returns the router thread's allocations per request.
fn allocations_per_request(
    cfg: impl FnOnce() -> Config + Send + 'static,
    path: &str,
    body: &str,
) -> u64 {
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (warm_tx, warm_rx) = tokio::sync::oneshot::channel::<()>();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let (count_tx, count_rx) = std::sync::mpsc::channel();
    let router = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let r = rt.block_on(async {
            let r = router(cfg()).await;
            addr_tx.send(r.addr()).unwrap();
            // Serves the warm-up until the client says it is over.
            let _ = warm_rx.await;
            r
        });
        let counted = allocation_counter::measure(|| {
            rt.block_on(async {
                let _ = done_rx.await;
            })
        });
        count_tx.send(counted.count_total).unwrap();
        rt.block_on(async move { drop(r) });
    });
    let addr = addr_rx.recv().unwrap();
    client_rt.block_on(async {
        for _ in 0..50 {
            let reply = post(addr, path, body).await;
            assert_eq!(reply.status, 200, "{}", reply.text());
        }
        warm_tx.send(()).unwrap();
        for _ in 0..REQUESTS {
            let reply = post(addr, path, body).await;
            assert_eq!(reply.status, 200, "{}", reply.text());
        }
        done_tx.send(()).unwrap();
    });
    let total = count_rx.recv().unwrap();
    router.join().unwrap();
    total / REQUESTS
}

/// HTTP PD `/generate`, a two-word prompt: round_robin, and the defaults with admission.
#[test]
fn a_tiny_http_pd_request_allocates_within_its_budget() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (p, d) = rt.block_on(async { (mock(Role::Prefill, 0).await, mock(Role::Decode, 0).await) });
    let (pu, du) = (p.url(), d.url());
    let body = r#"{"text":"hello world","sampling_params":{"max_new_tokens":1}}"#;
    let workers = move |pu: &str, du: &str| {
        let mut cfg = Config::with_workers(
            pdrouter::config::Mode::PdHttp,
            vec![
                spec(pu, pdrouter::config::WorkerType::Prefill),
                spec(du, pdrouter::config::WorkerType::Decode),
            ],
        );
        cfg.health.enabled = false;
        cfg.retry.max_attempts = 1;
        cfg
    };
    let (a, b) = (pu.clone(), du.clone());
    let rr = allocations_per_request(
        move || {
            let mut cfg = workers(&a, &b);
            cfg.policy = pdrouter_policy::PolicyKind::RoundRobin;
            cfg.prefill_policy = cfg.policy;
            cfg.decode_policy = cfg.policy;
            cfg
        },
        "/generate",
        body,
    );
    let default = allocations_per_request(
        move || {
            let mut cfg = workers(&pu, &du);
            cfg.admission = admission(1024, 100, 60);
            cfg
        },
        "/generate",
        body,
    );
    eprintln!(
        "HTTP PD /generate: {rr} allocations per request (round_robin), {default} (defaults with admission)"
    );
    assert!(
        rr <= HTTP_RR_BUDGET,
        "round_robin: {rr} allocations per request"
    );
    assert!(
        default <= HTTP_DEFAULT_BUDGET,
        "defaults: {default} allocations per request"
    );
    drop((p, d));
}

/// 66 (the defaults: 67) since a body's top level is read as a list of fields, not built
/// into a map; 69 and 70 since the per-request PD outcome counter is a kept handle (no
/// label string); 70 and 71 since inference requests skip axum's router (its matched-path and
/// parameter extensions and boxed route futures); 79 and 80 since an idle worker connection
/// keeps its read buffer, a Prefill
/// answer's head is read without a header map, a worker's origin and key are parsed once and
/// a relayed head moves its headers instead of copying them; 99 and 100 before (100 when set;
/// 109 before cache_aware kept its per-rank scratch inline; 106 and 115 before upstream
/// requests were built without `http`'s builder and handed to the client as bytes, 114 and
/// 123 before plain workers were spoken to on the request's own task, 127 and 141 before
/// metric labels stopped copying their strings and selection its candidate lists), plus a
/// tenth.
const HTTP_RR_BUDGET: u64 = 73;
const HTTP_DEFAULT_BUDGET: u64 = 74;

/// gRPC PD chat, one short message: the router renders, tokenizes, sends both legs and
/// detokenizes; and `/generate` with a two-word text (round_robin).
#[test]
fn a_tiny_grpc_pd_request_allocates_within_its_budget() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (p, d, cfg) = rt.block_on(pair(1));
    let rr = move || {
        let mut cfg = cfg.clone();
        cfg.policy = pdrouter_policy::PolicyKind::RoundRobin;
        cfg.prefill_policy = cfg.policy;
        cfg.decode_policy = cfg.policy;
        cfg
    };
    let (chat_cfg, generate_cfg) = (rr.clone(), rr);
    let chat = allocations_per_request(
        chat_cfg,
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"hello world"}],"max_tokens":1}"#,
    );
    let generate = allocations_per_request(
        generate_cfg,
        "/generate",
        r#"{"text":"hello world","sampling_params":{"max_new_tokens":1}}"#,
    );
    eprintln!(
        "gRPC PD: {chat} allocations per chat request, {generate} per /generate (round_robin)"
    );
    assert!(
        chat <= GRPC_CHAT_BUDGET,
        "chat: {chat} allocations per request"
    );
    assert!(
        generate <= GRPC_GENERATE_BUDGET,
        "/generate: {generate} allocations per request"
    );
    drop((p, d));
}

/// 174 since inference requests skip axum's router, 189 when set (184 since the chat template's variables are one object answering by name
/// instead of a map built per rendering, 187 before; 187 since model names are matched to
/// parsers without lowercased copies and request ids written by hand, the PD legs of a short
/// prompt sharing one framed message; 366 before the fast route kept the ids of words it had encoded, the chat
/// template's context was named without allocating and `usage` was typed; 436 before the
/// non-streaming chat body was written without a JSON tree, 379 before metric labels stopped
/// copying their strings and selection its candidate lists), plus a tenth.
const GRPC_CHAT_BUDGET: u64 = 191;
/// 134 since inference requests skip axum's router (144 when set), plus a tenth.
const GRPC_GENERATE_BUDGET: u64 = 147;
