//! A Prefill leg that outlives Decode: the Prefill worker answers 200 and never ends its body.
//! Once Decode has delivered the whole answer the client's response completes at once (not at
//! the request timeout), the Prefill slot and load are released although the Prefill body is
//! still open, and the leg is drained (if it ends within the grace) or aborted after it —
//! counted in `smg_pd_prefill_after_decode_total`. Over gRPC the same holds for a Prefill
//! `Generate` stream that stays open after its last message (`NAME::grpc`).

use std::time::Duration;

use crate::support::*;
use pdrouter::RouterHandle;

/// How long any single step may take before the test gives up (never a pass condition).
const PATIENCE: Duration = Duration::from_secs(30);

struct Setup {
    prefill: MockWorker,
    _decode: MockWorker,
    router: RouterHandle,
}

/// A PD router with admission (limit 1) over a Prefill mock whose answers never end and an
/// ordinary Decode mock; the request timeout stays at its 1800 s default.
async fn setup(t: Transport, grace: Duration) -> Setup {
    let prefill = t.start(Role::Prefill, 0).await;
    prefill.controls().set_hold_body_open(true);
    let decode = t.start(Role::Decode, 0).await;
    let mut cfg = pd_config(&[&prefill], &[&decode]);
    cfg.admission = admission(1, 4, 60);
    cfg.prefill_grace_after_decode = grace;
    let router = router(cfg).await;
    Setup {
        prefill,
        _decode: decode,
        router,
    }
}

fn slot_gauge(s: &Setup) -> Option<f64> {
    metric(
        &s.router,
        &format!(
            "smg_pd_prefill_admission_inflight{{worker=\"{}\"}}",
            s.prefill.url()
        ),
    )
}

fn after_decode(s: &Setup, outcome: &str) -> f64 {
    metric(
        &s.router,
        &format!("smg_pd_prefill_after_decode_total{{outcome=\"{outcome}\"}}"),
    )
    .unwrap_or(0.0)
}

async fn complete_answer(s: &Setup, body: &str) -> Reply {
    let reply = tokio::time::timeout(
        PATIENCE,
        post(s.router.addr(), "/v1/chat/completions", body),
    )
    .await
    .expect("the answer completes although the Prefill body never ends");
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply
}

/// Slot, load and gauge are back to zero while the Prefill body is still open.
async fn released_while_prefill_open(s: &Setup) {
    let adm = s.router.admission().unwrap().clone();
    assert!(
        eventually(PATIENCE, || adm.inflight_total() == 0
            && slot_gauge(s) == Some(0.0)
            && total_load(&s.router) == 0)
        .await,
        "slot {} gauge {:?} load {}",
        adm.inflight_total(),
        slot_gauge(s),
        total_load(&s.router)
    );
}

async fn check_next_request_is_admitted(s: &Setup) {
    // With a limit of 1, a held slot would queue this one for the full queue timeout.
    s.prefill.controls().set_hold_body_open(false);
    let reply = complete_answer(s, CHAT).await;
    assert_eq!(reply.json()["object"], "chat.completion");
}

all_transports!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    non_streaming_answer_completes_and_frees_the_slot_while_prefill_is_still_open,
    after_the_grace_an_open_prefill_leg_is_aborted_and_counted,
    streaming_answer_completes_and_a_prefill_leg_ending_within_the_grace_is_drained,
    a_prefill_failure_while_decode_is_unfinished_is_answered_as_such,
);

async fn non_streaming_answer_completes_and_frees_the_slot_while_prefill_is_still_open(
    t: Transport,
) {
    // A grace so long the test would time out waiting for it: the slot must be free before.
    let s = setup(t, Duration::from_secs(3600)).await;
    let reply = complete_answer(&s, CHAT).await;
    let v = reply.json();
    assert_eq!(v["object"], "chat.completion");
    assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
    released_while_prefill_open(&s).await;
    assert_eq!(
        s.prefill.stats().inflight,
        1,
        "the Prefill body is still open"
    );
    assert_eq!(
        after_decode(&s, "aborted") + after_decode(&s, "drained"),
        0.0
    );
    s.router.shutdown(Duration::from_secs(1)).await;
}

async fn after_the_grace_an_open_prefill_leg_is_aborted_and_counted(t: Transport) {
    let s = setup(t, Duration::from_millis(200)).await;
    for body in [CHAT, CHAT_STREAM] {
        complete_answer(&s, body).await;
    }
    released_while_prefill_open(&s).await;
    assert!(
        eventually(PATIENCE, || after_decode(&s, "aborted") == 2.0).await,
        "aborted = {}",
        after_decode(&s, "aborted")
    );
    // Aborting closed the Prefill connections.
    assert!(eventually(PATIENCE, || s.prefill.stats().inflight == 0).await);
    assert_eq!(after_decode(&s, "drained"), 0.0);
    check_next_request_is_admitted(&s).await;
    s.router.shutdown(Duration::from_secs(1)).await;
}

async fn streaming_answer_completes_and_a_prefill_leg_ending_within_the_grace_is_drained(
    t: Transport,
) {
    let s = setup(t, Duration::from_secs(3600)).await;
    let reply = complete_answer(&s, CHAT_STREAM).await;
    assert!(
        reply.text().trim_end().ends_with("data: [DONE]"),
        "{}",
        reply.text()
    );
    released_while_prefill_open(&s).await;
    assert_eq!(
        s.prefill.stats().inflight,
        1,
        "the Prefill body is still open"
    );
    // The Prefill body ends now, within the grace: drained, not aborted.
    s.prefill.controls().set_hold_body_open(false);
    assert!(
        eventually(PATIENCE, || after_decode(&s, "drained") == 1.0).await,
        "drained = {}",
        after_decode(&s, "drained")
    );
    assert_eq!(after_decode(&s, "aborted"), 0.0);
    assert!(eventually(PATIENCE, || s.prefill.stats().inflight == 0).await);
    check_next_request_is_admitted(&s).await;
    s.router.shutdown(Duration::from_secs(1)).await;
}

/// The rule that a non-streaming answer waits for the Prefill end still holds while Decode
/// has not finished: a Prefill failure then surfaces with its real status.
async fn a_prefill_failure_while_decode_is_unfinished_is_answered_as_such(t: Transport) {
    let prefill = t.start(Role::Prefill, 0).await;
    prefill.controls().set_fail_rate(1.0);
    let decode = t.start(Role::Decode, 0).await;
    // Decode sends its whole content but never ends its body, so it never finishes.
    decode.controls().set_hold_body_open(true);
    let mut cfg = pd_config(&[&prefill], &[&decode]);
    cfg.admission = admission(1, 4, 60);
    let r = router(cfg).await;
    let reply = tokio::time::timeout(PATIENCE, post(r.addr(), "/v1/chat/completions", CHAT))
        .await
        .expect("answered");
    assert_eq!(reply.status, 502, "{}", reply.text());
    assert_eq!(reply.error_code(), "prefill_worker_error");
    assert!(eventually(PATIENCE, || r.admission().unwrap().inflight_total() == 0).await);
    assert!(eventually(PATIENCE, || total_load(&r) == 0).await);
    r.shutdown(Duration::from_secs(1)).await;
}

/// A Prefill worker that has not answered at all may still be computing: Decode finishing
/// does not free its slot (a streaming client still gets its whole answer). HTTP only: a gRPC
/// Decode worker, like a real engine, cannot finish before its Prefill has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_worker_that_has_not_answered_keeps_its_slot() {
    let s = setup(Transport::Http, Duration::from_secs(3600)).await;
    s.prefill.controls().set_hold_body_open(false);
    s.prefill.controls().set_hang(true);
    let reply = complete_answer(&s, CHAT_STREAM).await;
    assert!(reply.text().trim_end().ends_with("data: [DONE]"));
    let adm = s.router.admission().unwrap().clone();
    assert_eq!(
        adm.inflight_total(),
        1,
        "held while the Prefill worker is silent"
    );
    s.prefill.controls().set_hang(false);
    assert!(
        eventually(PATIENCE, || adm.inflight_total() == 0
            && total_load(&s.router) == 0)
        .await
    );
    // It answered after Decode was done: released then, its body drained within the grace.
    assert!(eventually(PATIENCE, || after_decode(&s, "drained") == 1.0).await);
    s.router.shutdown(Duration::from_secs(1)).await;
}
