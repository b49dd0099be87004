//! EPD with images, end to end against TokenSpeed mocks of the three roles: each image item
//! goes to an Encode worker (chosen by content hash) with its pixels and its own room; the
//! Prefill gets the items without pixels and one encode ticket per item, and waits for every
//! item's embedding (the mock checks the room holds that item); the Decode gets the items and
//! the same KV ticket. Prefill admission governs EPD exactly as PD; Encode takes no slot and
//! no load that outlives its call; bad images are 400s naming their part that reach nobody,
//! and outside EPD an image is a 501 naming its part.

use std::collections::HashMap;
use std::io::Cursor;
use std::time::Duration;

use crate::support::*;
use base64::Engine as _;
use pdrouter::config::{Config, Mode, WorkerSpec, WorkerType};
use pdrouter_mock::GrpcRuntime;
use pdrouter_tokenizer::bytelevel;
use pdrouter_vision::image::{self, ImageFormat};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

/// A Qwen2-VL model directory over the mock's byte-level tokenizer (its `<image>` token).
fn model_dir() -> tempfile::TempDir {
    let dir = tokenizer_dir();
    let config = json!({"model_type": "qwen2_vl", "image_token_id": bytelevel::IMAGE,
                        "vision_start_token_id": 1, "vision_end_token_id": 2,
                        "vision_token_id": 3, "vocab_size": bytelevel::VOCAB_SIZE});
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    dir
}

/// A `width` x `height` PNG whose pixels depend on `seed` (different seeds, different items).
fn png(width: u32, height: u32, seed: u8) -> Vec<u8> {
    let img = image::RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([x as u8 ^ seed, y as u8, seed.wrapping_mul(37)])
    });
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, ImageFormat::Png).unwrap();
    out.into_inner()
}

/// PNG noise that compresses badly (a large file for few pixels).
fn noisy_png(side: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(side, side, |x, y| {
        let h =
            (x.wrapping_mul(2_654_435_761) ^ y.wrapping_mul(40_503)).wrapping_mul(2_246_822_519);
        image::Rgb([(h >> 8) as u8, (h >> 16) as u8, (h >> 24) as u8])
    });
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, ImageFormat::Png).unwrap();
    out.into_inner()
}

fn data_url(bytes: &[u8]) -> String {
    format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

fn chat(urls: &[String], stream: bool) -> String {
    let mut parts = vec![json!({"type": "text", "text": "what is in these?"})];
    parts.extend(
        urls.iter()
            .map(|u| json!({"type": "image_url", "image_url": {"url": u}})),
    );
    json!({
        "model": "mock-model",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": parts}],
        "stream": stream,
    })
    .to_string()
}

/// Serves `body` as a PNG for every request on loopback, while the server lives.
async fn image_server(body: Vec<u8>) -> pdrouter_mock::FileServer {
    pdrouter_mock::FileServer::start(body, "image/png")
        .await
        .unwrap()
}

async fn ts(role: Role, tune: impl FnOnce(&mut MockConfig)) -> MockWorker {
    grpc_mock(role, |c| {
        c.grpc_runtime = GrpcRuntime::TokenSpeed;
        tune(c)
    })
    .await
}

/// The Encode mocks, the Prefill and Decode mocks, the router's config, and the model
/// directory it names (kept for the test's length).
pub(crate) struct Epd(
    pub(crate) Vec<MockWorker>,
    pub(crate) MockWorker,
    pub(crate) MockWorker,
    pub(crate) Config,
    pub(crate) tempfile::TempDir,
);

/// `encoders` Encode mocks, a Prefill mock tuned by `prefill`, a Decode mock, and an EPD
/// config over them for the Qwen2-VL test model (health checks off, retries off).
pub(crate) async fn epd(encoders: usize, prefill: impl FnOnce(&mut MockConfig)) -> Epd {
    let mut es = Vec::new();
    for _ in 0..encoders {
        es.push(ts(Role::Encode, |_| {}).await);
    }
    let p = ts(Role::Prefill, prefill).await;
    let d = ts(Role::Decode, |_| {}).await;
    let spec = |w: &MockWorker, t, port: Option<u16>| WorkerSpec {
        bootstrap_port: port,
        ..crate::support::spec(&w.url(), t)
    };
    let mut workers: Vec<WorkerSpec> = es
        .iter()
        .map(|e| spec(e, WorkerType::Encode, Some(e.addr().port())))
        .collect();
    workers.push(spec(&p, WorkerType::Prefill, Some(p.addr().port())));
    workers.push(spec(&d, WorkerType::Decode, None));
    let mut cfg = pd_config(&[], &[]);
    cfg.mode = Mode::EpdGrpc;
    cfg.workers = workers;
    cfg.grpc_runtime = Some(pdrouter::grpc::runtime::Runtime::TokenSpeed);
    let model = model_dir();
    cfg.tokenizer.model_path = Some(model.path().to_owned());
    Epd(es, p, d, cfg, model)
}

/// Nothing is left: no worker runs anything, the router holds no load (Encode workers'
/// included) and no Prefill slot.
async fn assert_released(r: &pdrouter::RouterHandle, workers: &[&MockWorker]) {
    assert!(eventually(WAIT, || workers.iter().all(|w| w.stats().inflight == 0)).await);
    assert!(eventually(WAIT, || total_load(r) == 0).await);
    assert!(
        eventually(WAIT, || metric(r, "smg_pd_prefill_admission_inflight{")
            .is_none_or(|v| v == 0.0))
        .await
    );
}

fn sum_metric(r: &pdrouter::RouterHandle, prefix: &str) -> f64 {
    r.metrics_text()
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn an_image_goes_to_its_encode_worker_and_prefill_waits_for_its_embedding() {
    let Epd(encoders, p, d, mut cfg, _model) = epd(1, |_| {}).await;
    cfg.admission = admission(1, 4, 30);
    cfg.images.allow_private_urls = true;
    let e = &encoders[0];
    let r = router(cfg).await;
    let server = image_server(png(200, 150, 9)).await;
    let remote = server.url("/picture.png");
    let cases = [
        (vec![data_url(&png(60, 40, 1))], false),
        (vec![data_url(&png(60, 40, 1))], true),
        (vec![remote.clone(), data_url(&png(90, 30, 2))], false),
        (vec![remote], true),
    ];
    let mut items_sent = 0;
    for (urls, stream) in cases {
        let reply = post(r.addr(), "/v1/chat/completions", &chat(&urls, stream)).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        if stream {
            assert!(
                reply.text().ends_with("data: [DONE]\n\n"),
                "{}",
                reply.text()
            );
        } else {
            assert!(reply.json()["choices"][0]["message"]["content"].is_string());
        }
        items_sent += urls.len() as u64;
        let pl = p.stats().last_request.unwrap();
        let dl = d.stats().last_request.unwrap();
        let el = e.stats().last_request.unwrap();
        let items = pl["mm_items"]
            .as_array()
            .expect("the Prefill gets the items");
        let tickets = pl["encode_bootstrap_info"].as_array().expect("tickets");
        assert_eq!(
            (items.len(), tickets.len()),
            (urls.len(), urls.len()),
            "{pl}"
        );
        // Both legs: the same items without pixels, the same KV ticket; only the Prefill
        // learns where the embeddings come from.
        assert_eq!(dl["mm_items"], pl["mm_items"]);
        assert_eq!(dl["encode_bootstrap_info"], Value::Null);
        assert_eq!(pl["kv_bootstrap_info"], dl["kv_bootstrap_info"]);
        let ids: Vec<u64> = pl["input_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        for (k, item) in items.iter().enumerate() {
            assert_eq!(
                item["encoder_input"]["payload_bytes"],
                Value::Null,
                "{item}"
            );
            let shape = &item["encoder_input"]["shape"];
            let grid = item["image_grid_thw"].as_array().unwrap();
            let patches = grid.iter().map(|g| g.as_u64().unwrap()).product::<u64>();
            assert_eq!(shape, &json!([patches, 1176]));
            // The placeholder run is where the item says, made of the image token.
            let (off, len) = (
                item["placeholders"][0][0].as_u64().unwrap() as usize,
                item["placeholders"][0][1].as_u64().unwrap() as usize,
            );
            assert_eq!(len as u64, patches / 4);
            assert!(
                ids[off..off + len]
                    .iter()
                    .all(|&t| t == u64::from(bytelevel::IMAGE))
            );
            assert_eq!(item["placeholder_token_id"], bytelevel::IMAGE);
            let t = tickets
                .iter()
                .find(|t| t["item_index"] == k)
                .expect("a ticket per item");
            assert_eq!(t["bootstrap_port"], e.addr().port());
            assert!(t["bootstrap_room"].as_i64().unwrap() >= 0);
        }
        let total_image_tokens = ids
            .iter()
            .filter(|&&t| t == u64::from(bytelevel::IMAGE))
            .count();
        let runs: u64 = items
            .iter()
            .map(|i| i["placeholders"][0][1].as_u64().unwrap())
            .sum();
        assert_eq!(total_image_tokens as u64, runs);
        // The last Encode call carried the last item, its pixels and its room.
        let last = items.len() - 1;
        let enc = &el["items"][0];
        if urls.len() == 1 {
            assert_eq!(enc["content_hash"], items[last]["content_hash"]);
            let rows = items[last]["encoder_input"]["shape"][0].as_u64().unwrap();
            assert_eq!(enc["shape"], json!([rows, 1176]));
            assert_eq!(enc["payload_bytes"], rows * 1176 * 2);
            assert_eq!(enc["dtype"], "bfloat16");
            assert_eq!(enc["bootstrap_room"], tickets[last]["bootstrap_room"]);
        }
        assert_eq!(e.stats().encode_items_total, items_sent);
    }
    // The same picture fetched or inline is the same item; different pictures differ.
    assert_eq!(
        sum_metric(&r, "smg_pd_encode_requests_total{"),
        items_sent as f64
    );
    assert_eq!(sum_metric(&r, "smg_pd_encode_failures_total{"), 0.0);
    // A text-only request in the same router is PD: no Encode.
    let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(p.stats().last_request.unwrap()["mm_items"], Value::Null);
    assert_eq!(e.stats().encode_items_total, items_sent);
    assert_released(&r, &[e, &p, &d]).await;
}

#[tokio::test]
async fn the_same_image_always_lands_on_the_same_encode_worker() {
    let Epd(encoders, p, d, cfg, _model) = epd(2, |_| {}).await;
    let r = router(cfg).await;
    let ports: Vec<u16> = encoders.iter().map(|e| e.addr().port()).collect();
    // Two sets of ten different pictures, each sent twice (the second time in reverse order).
    let sets: Vec<Vec<String>> = (0..2u8)
        .map(|s| {
            (0..10u8)
                .map(|i| data_url(&png(40 + u32::from(i), 30, s * 10 + i)))
                .collect()
        })
        .collect();
    let mut placed: HashMap<String, u64> = HashMap::new();
    for round in 0..2 {
        for set in &sets {
            let mut urls = set.clone();
            if round == 1 {
                urls.reverse();
            }
            let reply = post(r.addr(), "/v1/chat/completions", &chat(&urls, false)).await;
            assert_eq!(reply.status, 200, "{}", reply.text());
            let pl = p.stats().last_request.unwrap();
            for t in pl["encode_bootstrap_info"].as_array().unwrap() {
                let k = t["item_index"].as_u64().unwrap() as usize;
                let hash = pl["mm_items"][k]["content_hash"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                let port = t["bootstrap_port"].as_u64().unwrap();
                assert!(ports.contains(&(port as u16)));
                let first = *placed.entry(hash).or_insert(port);
                assert_eq!(first, port, "an image moved to another encode worker");
            }
        }
    }
    assert_eq!(placed.len(), 20, "twenty different pictures");
    // Twenty keys on a two-worker ring all on one worker: probability 2^-19.
    let used: std::collections::HashSet<u64> = placed.values().copied().collect();
    assert_eq!(used.len(), 2, "{placed:?}");
    let items: u64 = encoders.iter().map(|e| e.stats().encode_items_total).sum();
    assert_eq!(items, 40);
    let refs: Vec<&MockWorker> = encoders.iter().chain([&p, &d]).collect();
    assert_released(&r, &refs).await;
}

#[tokio::test]
async fn prefill_admission_governs_epd_and_encode_takes_no_slot() {
    let Epd(encoders, p, d, mut cfg, _model) = epd(1, |_| {}).await;
    cfg.admission = admission(1, 4, 30);
    let e = &encoders[0];
    let r = router(cfg).await;
    p.controls().set_hang(true);
    // Three images in the first request: three Encode calls under one Prefill slot.
    let three: Vec<String> = (0..3).map(|i| data_url(&png(50, 50, i))).collect();
    let first = {
        let (addr, body) = (r.addr(), chat(&three, false));
        tokio::spawn(async move { post(addr, "/v1/chat/completions", &body).await })
    };
    assert!(eventually(WAIT, || p.controls().hung() == 1).await);
    assert!(eventually(WAIT, || e.stats().encode_items_total == 3).await);
    let second = {
        let (addr, body) = (r.addr(), chat(&[data_url(&png(50, 50, 7))], true));
        tokio::spawn(async move { post(addr, "/v1/chat/completions", &body).await })
    };
    assert!(
        eventually(WAIT, || metric(&r, "smg_pd_prefill_admission_queued")
            == Some(1.0))
        .await
    );
    let prefill_slot = format!(
        "smg_pd_prefill_admission_inflight{{worker=\"{}\"}}",
        p.url()
    );
    assert_eq!(metric(&r, &prefill_slot), Some(1.0));
    // The queued request has sent no Encode yet; Encode workers hold no slot.
    assert_eq!(e.stats().encode_items_total, 3);
    let encode_slot = format!(
        "smg_pd_prefill_admission_inflight{{worker=\"{}\"}}",
        e.url()
    );
    assert_eq!(metric(&r, &encode_slot), None);
    // The slot goes with the first Prefill's end; the second is then admitted.
    assert_eq!(p.controls().release_hung(1), 1);
    assert_eq!(first.await.unwrap().status, 200);
    assert!(eventually(WAIT, || p.controls().hung() == 1).await);
    assert_eq!(p.controls().release_hung(1), 1);
    let reply = second.await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(e.stats().encode_items_total, 4);
    assert_released(&r, &[e, &p, &d]).await;

    // A client that goes away while its Prefill holds the slot aborts both legs; nothing
    // stays held.
    let gone = {
        let (addr, body) = (r.addr(), chat(&[data_url(&png(50, 50, 8))], true));
        tokio::spawn(async move { post(addr, "/v1/chat/completions", &body).await })
    };
    assert!(eventually(WAIT, || p.controls().hung() == 1).await);
    assert_eq!(metric(&r, &prefill_slot), Some(1.0));
    gone.abort();
    let _ = gone.await;
    assert!(eventually(WAIT, || p.controls().hung() == 0).await);
    assert_released(&r, &[e, &p, &d]).await;
    assert!(eventually(WAIT, || p.stats().aborts_total >= 1).await);
    p.controls().set_hang(false);
}

#[tokio::test]
async fn failing_encodes_fail_only_their_requests_and_leak_nothing() {
    let Epd(encoders, p, d, mut cfg, _model) =
        epd(1, |c| c.encode_wait = Duration::from_secs(10)).await;
    // A successful Encode must reach the Prefill well within its wait, however loaded the
    // machine; the slots let every failing request wait at the same time.
    cfg.admission = admission(16, 16, 60);
    // Every request must meet its Encode worker: an open breaker would refuse some with 503
    // before any Encode, and this test counts Encode failures against failed requests.
    cfg.breaker.enabled = false;
    let e = &encoders[0];
    e.controls().set_fail_rate(0.5);
    let r = router(cfg).await;
    let requests: Vec<_> = (0..16u8)
        .map(|i| {
            let (addr, body) = (r.addr(), chat(&[data_url(&png(40, 40, i))], i % 2 == 0));
            tokio::spawn(async move { post(addr, "/v1/chat/completions", &body).await })
        })
        .collect();
    let mut failed = 0;
    for t in requests {
        let reply = t.await.unwrap();
        match reply.status {
            200 => {}
            502..=504 => failed += 1,
            other => panic!("unexpected {other}: {}", reply.text()),
        }
    }
    let stats = e.stats();
    let encode_failures = stats.requests_total - stats.encode_items_total;
    assert_eq!(stats.requests_total, 16);
    // Sixteen draws at one half: none failing, or all, has probability 2^-16 each.
    assert!(encode_failures > 0, "the encode mock failed none of 16");
    // Each failed Encode failed exactly its own request, through the Prefill's bounded wait.
    assert_eq!(failed, encode_failures);
    assert!(
        eventually(WAIT, || sum_metric(&r, "smg_pd_encode_failures_total{")
            == encode_failures as f64)
        .await
    );
    assert_released(&r, &[e, &p, &d]).await;
}

#[tokio::test]
async fn bad_images_are_400s_naming_their_part_and_reach_no_worker() {
    let Epd(encoders, p, d, mut cfg, _model) = epd(1, |_| {}).await;
    cfg.admission = admission(1, 4, 30);
    cfg.images.max_bytes = 3000;
    cfg.images.max_pixels = 4096;
    let e = &encoders[0];
    let r = router(cfg).await;
    let server = image_server(png(20, 20, 1)).await;
    let private = server.url("/picture.png");
    let ok = data_url(&png(30, 30, 1));
    let big_file = noisy_png(40);
    assert!(big_file.len() > 3000);
    let not_image = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(b"hello, not a picture")
    );
    let cases = [
        (
            "data:image/png;base64,@@@not-base64@@@".to_owned(),
            "invalid_image_url",
        ),
        (not_image, "invalid_image"),
        (data_url(&big_file), "image_too_large"),
        (data_url(&png(100, 100, 3)), "image_too_large"),
        (private, "image_url_refused"),
    ];
    for (url, code) in cases {
        // The bad image is the third image part, content part 3 of message 1.
        let body = chat(&[ok.clone(), ok.clone(), url.clone()], false);
        let reply = post(r.addr(), "/v1/chat/completions", &body).await;
        assert_eq!(reply.status, 400, "{url:.60}: {}", reply.text());
        assert_eq!(reply.error_code(), code, "{}", reply.text());
        let msg = reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(msg.starts_with("messages[1].content[3]: "), "{msg}");
    }
    let eleven: Vec<String> = (0..11).map(|_| ok.clone()).collect();
    let reply = post(r.addr(), "/v1/chat/completions", &chat(&eleven, false)).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert_eq!(reply.error_code(), "too_many_images");
    for w in [e, &p, &d] {
        assert_eq!(w.stats().requests_total, 0);
    }
    assert_released(&r, &[e, &p, &d]).await;
}

#[tokio::test]
async fn a_model_that_is_not_a_vision_model_refuses_images_with_400() {
    let Epd(encoders, p, d, mut cfg, _model) = epd(1, |_| {}).await;
    let text_model = tokenizer_dir();
    std::fs::write(
        text_model.path().join("config.json"),
        r#"{"model_type": "qwen3"}"#,
    )
    .unwrap();
    cfg.tokenizer.model_path = Some(text_model.path().to_owned());
    let r = router(cfg).await;
    let body = chat(&[data_url(&png(30, 30, 1))], false);
    let reply = post(r.addr(), "/v1/chat/completions", &body).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(
        reply.text().contains("messages[1].content[1]"),
        "{}",
        reply.text()
    );
    for w in [&encoders[0], &p, &d] {
        assert_eq!(w.stats().requests_total, 0);
    }
    // Text still works.
    assert_eq!(
        post(r.addr(), "/v1/chat/completions", CHAT).await.status,
        200
    );
}

#[tokio::test]
async fn outside_epd_images_are_501_naming_their_part() {
    let (p, d, cfg) = pair(3).await;
    let r = router(cfg).await;
    let body = chat(&[data_url(&png(30, 30, 1))], false);
    let reply = post(r.addr(), "/v1/chat/completions", &body).await;
    assert_eq!(reply.status, 501, "{}", reply.text());
    assert_eq!(reply.error_code(), "not_implemented");
    assert!(
        reply.text().contains("messages[1].content[1]") && reply.text().contains("EPD"),
        "{}",
        reply.text()
    );
    for w in [&p, &d] {
        assert_eq!(w.stats().requests_total, 0);
    }
}

/// An Encode call ends with its request: a client that leaves while its image's Encode hangs
/// cancels the call, which frees the Encode worker's load at once (it used to run on for the
/// whole request timeout, holding the pixels).
#[tokio::test]
async fn a_client_that_leaves_cancels_its_encode_calls() {
    let Epd(encoders, p, d, mut cfg, _model) = epd(1, |_| {}).await;
    cfg.request_timeout = Duration::from_secs(1800);
    let e = &encoders[0];
    e.controls().set_hang(true);
    let r = router(cfg).await;
    let body = chat(&[data_url(&png(40, 40, 3))], false);
    let addr = r.addr();
    let client = tokio::spawn(async move { post(addr, "/v1/chat/completions", &body).await });
    assert!(
        eventually(WAIT, || e.controls().hung() == 1).await,
        "the Encode is held"
    );
    assert!(total_load(&r) >= 1);
    client.abort();
    let _ = client.await;
    assert!(
        eventually(WAIT, || e.stats().inflight == 0).await,
        "the Encode call was cancelled"
    );
    e.controls().set_hang(false);
    assert_released(&r, &[e, &p, &d]).await;
}
