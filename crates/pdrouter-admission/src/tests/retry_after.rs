//! `Retry-After` through the public API, on a paused clock: from service times (observed
//! Prefill durations against the age of what is in flight), from the drain rate where it is
//! measured, the cap with no observation, and never the queue timeout.

use std::time::Duration;

use tokio::time::advance;

use super::{Fixture, Target, done, settle};
use crate::{RETRY_AFTER_CAP, Rejection, WINDOW};

const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

const fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// What a rejection tells the client now.
async fn rejected_now(f: &Fixture) -> Option<Duration> {
    let full = f.get(Target::Any).await.unwrap_err();
    assert_eq!(full, Rejection::QueueFull);
    full.retry_after
}

#[tokio::test(start_paused = true)]
async fn rejections_carry_retry_after_from_the_drain_rate_never_the_timeout() {
    let f = Fixture::new(21, 2, 600, &["w0"]);
    // Nothing admitted yet: the cap.
    assert_eq!(f.adm.retry_after(), RETRY_AFTER_CAP);
    // 21 admissions in the window: 2.1 per second. All still in flight, so no Prefill has ended
    // and only the drain rate speaks.
    let mut held = Vec::new();
    for _ in 0..21 {
        held.push(f.get(Target::Any).await.unwrap());
    }
    let waiters = [f.spawn(Target::Any), f.spawn(Target::Any)];
    settle().await;
    assert_eq!(f.adm.queued(), 2);
    // Two ahead plus itself at 2.1 per second: 1.43 s, rounded up.
    assert_eq!(rejected_now(&f).await, Some(secs(2)));
    // The admissions leave the window: nothing drains, so the cap.
    advance(WINDOW).await;
    assert_eq!(rejected_now(&f).await, Some(RETRY_AFTER_CAP));
    // A queue timeout of 600 s is not what the waiters are told.
    advance(secs(600)).await;
    settle().await;
    for w in waiters {
        let timed_out = done(w).await.unwrap_err();
        assert_eq!(timed_out, Rejection::QueueTimeout);
        assert_eq!(timed_out.retry_after, Some(RETRY_AFTER_CAP));
    }
    drop(held);
    // No worker at all: nothing says when one comes back.
    let none = Fixture::new(1, 2, 600, &[]);
    let unavailable = none.get(Target::Any).await.unwrap_err();
    assert_eq!(unavailable, Rejection::Unavailable);
    assert_eq!(unavailable.retry_after, None);
    f.assert_clean();
}

/// The drain-rate test's old set-up: twenty Prefills that took no time, then one held. The
/// drain rate alone said 2 s; the service time says the held one ends at once.
#[tokio::test(start_paused = true)]
async fn prefills_that_took_no_time_say_a_unit_frees_at_once_until_one_is_overdue() {
    let f = Fixture::new(1, 2, 600, &["w0"]);
    for _ in 0..20 {
        drop(f.get(Target::Any).await.unwrap());
    }
    let held = f.get(Target::Any).await.unwrap();
    let waiters = [f.spawn(Target::Any), f.spawn(Target::Any)];
    settle().await;
    assert_eq!(rejected_now(&f).await, Some(secs(1)));
    // Ten seconds past its expected end: overdue by that much, as long again. The cap.
    advance(WINDOW).await;
    assert_eq!(rejected_now(&f).await, Some(RETRY_AFTER_CAP));
    advance(secs(600)).await;
    settle().await;
    for w in waiters {
        let timed_out = done(w).await.unwrap_err();
        assert_eq!(timed_out.retry_after, Some(RETRY_AFTER_CAP));
    }
    drop(held);
    f.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn a_waiter_timing_out_just_before_a_sparse_prefill_ends_is_told_one_second() {
    let f = Fixture::new(1, 1, 3, &["w0"]);
    let first = f.get(Target::Any).await.unwrap();
    advance(secs(4)).await;
    drop(first);
    // Observed: Prefills take 4 s. The next one starts now.
    let held = f.get(Target::Any).await.unwrap();
    advance(ms(300)).await;
    let waiter = f.spawn(Target::Any);
    settle().await;
    assert_eq!(f.adm.queued(), 1);
    // Behind the waiter: the held Prefill ends in 3.7 s, the waiter's takes 4 s more: 7.7 s.
    // (The drain rate alone, 2 admissions in 10 s and 2 ahead: 10 s.)
    assert_eq!(rejected_now(&f).await, Some(secs(8)));
    // The waiter times out when the held one is 3.3 s old, 0.7 s before it is expected to end.
    advance(secs(3)).await;
    settle().await;
    let timed_out = done(waiter).await.unwrap_err();
    assert_eq!(timed_out, Rejection::QueueTimeout);
    // (The drain rate alone: 1 / (2 per 10 s) = 5 s.)
    assert_eq!(timed_out.retry_after, Some(secs(1)));
    assert_eq!(f.adm.retry_after(), secs(1));
    drop(held);
    f.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn a_busy_queue_waits_rounds_of_the_observed_duration_per_unit() {
    // Capacity 2: two workers of one unit each.
    let f = Fixture::new(1, 5, 60, &["w0", "w1"]);
    let a = f.get(Target::Any).await.unwrap();
    let b = f.get(Target::Any).await.unwrap();
    advance(secs(2)).await;
    drop((a, b));
    let held = [
        f.get(Target::Any).await.unwrap(),
        f.get(Target::Any).await.unwrap(),
    ];
    let waiters: Vec<_> = (0..5).map(|_| f.spawn(Target::Any)).collect();
    settle().await;
    assert_eq!(f.adm.queued(), 5);
    // Five waiting and itself, two units freeing every 2 s: (5 + 1) / 2 rounds of 2 s.
    // (The drain rate alone: 6 / (4 per 10 s) = 15 s, the cap.)
    assert_eq!(rejected_now(&f).await, Some(secs(6)));
    // A second later the units free at 1, 3 and 5 s.
    advance(secs(1)).await;
    assert_eq!(rejected_now(&f).await, Some(secs(5)));
    for w in waiters {
        w.abort();
    }
    settle().await;
    drop(held);
    f.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn without_a_released_permit_the_drain_rate_decides_and_without_either_the_cap() {
    let f = Fixture::new(2, 0, 60, &["w0"]);
    assert_eq!(f.adm.retry_after(), RETRY_AFTER_CAP);
    let held = [
        f.get(Target::Any).await.unwrap(),
        f.get(Target::Any).await.unwrap(),
    ];
    // Two admissions in the window, nothing released yet: 1 / (2 per 10 s), as before.
    assert_eq!(rejected_now(&f).await, Some(secs(5)));
    advance(WINDOW).await;
    assert_eq!(rejected_now(&f).await, Some(RETRY_AFTER_CAP));
    drop(held);
    f.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn the_estimate_is_clamped_to_a_second_and_the_cap() {
    let f = Fixture::new(1, 30, 60, &["w0"]);
    let quick = f.get(Target::Any).await.unwrap();
    advance(ms(10)).await;
    drop(quick);
    let held = f.get(Target::Any).await.unwrap();
    // Prefills of 10 ms: a second, never less.
    assert_eq!(f.adm.retry_after(), secs(1));
    // Thirty waiting, 10 ms each: still within the first second.
    let waiters: Vec<_> = (0..30).map(|_| f.spawn(Target::Any)).collect();
    settle().await;
    assert_eq!(rejected_now(&f).await, Some(secs(1)));
    // Overdue by 30 s: a stuck worker. The cap, not a second forever.
    advance(secs(30)).await;
    assert_eq!(rejected_now(&f).await, Some(RETRY_AFTER_CAP));
    for w in waiters {
        w.abort();
    }
    settle().await;
    drop(held);
    // Prefills of a second and thirty ahead: 31 s, the cap.
    let g = Fixture::new(1, 30, 60, &["w0"]);
    let slow = g.get(Target::Any).await.unwrap();
    advance(secs(1)).await;
    drop(slow);
    let held = g.get(Target::Any).await.unwrap();
    let waiters: Vec<_> = (0..30).map(|_| g.spawn(Target::Any)).collect();
    settle().await;
    assert_eq!(rejected_now(&g).await, Some(RETRY_AFTER_CAP));
    for w in waiters {
        w.abort();
    }
    settle().await;
    drop(held);
    f.assert_clean();
    g.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn every_permit_its_caller_held_is_a_service_time_a_grant_nobody_received_is_not() {
    let f = Fixture::new(1, 10, 60, &["w0"]);
    let expected = || f.slot(0).service.expected();
    let a = f.get(Target::Any).await.unwrap();
    advance(secs(4)).await;
    drop(a);
    assert_eq!(expected(), Some(secs(4)));
    // A Prefill that failed, or whose client went away, at once: its unit freed at once, and
    // that is when the next request got it.
    let b = f.get(Target::Any).await.unwrap();
    drop(b);
    assert_eq!(expected(), Some(ms(3500)));
    // A grant that raced with its waiter's cancellation was held for nobody.
    let c = f.get(Target::Any).await.unwrap();
    let cancelled = f.spawn(Target::Any);
    settle().await;
    advance(ms(3500)).await;
    drop(c);
    assert_eq!(f.slot(0).inflight(), 1, "granted to the waiter");
    cancelled.abort();
    settle().await;
    assert_eq!(f.slot(0).inflight(), 0);
    assert_eq!(expected(), Some(ms(3500)));
    // A permit granted after waiting counts from its grant.
    let d = f.get(Target::Any).await.unwrap();
    let waiter = f.spawn(Target::Any);
    settle().await;
    advance(secs(1)).await;
    drop(d);
    settle().await;
    let granted = done(waiter).await.unwrap();
    advance(secs(2)).await;
    drop(granted);
    // 3.5 s, then 1 s (an eighth of -2.5 s), then 2 s (an eighth of -1.1875 s).
    assert_eq!(expected(), Some(Duration::from_nanos(3_039_062_500)));
    f.assert_clean();
}
