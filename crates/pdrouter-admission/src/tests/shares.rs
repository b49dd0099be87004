//! The sharer against a scripted store, on a paused clock: grants become slot limits, reports
//! carry what the replica holds and wants, and a store that fails or hangs is trusted exactly
//! until the lease could have expired.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::{Instant, sleep};

use super::{Fixture, Target, settle};
use crate::shares::{
    Exchange, Fallback, LeaseStore, ShareConfig, ShareGrant, ShareObserver, ShareReport,
    ShareSource, Sharer, StoreError,
};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// Grant `share` of 8, seen by `replicas` replicas.
    Grant {
        share: u32,
        replicas: u32,
    },
    Fail,
    Hang,
}

#[derive(Default)]
struct Script {
    mode: Option<Mode>,
    /// What grants say of the group's contention.
    contended: bool,
    calls: VecDeque<(u64, Vec<ShareReport>)>,
}

#[derive(Clone, Default)]
struct FakeStore(Arc<Mutex<Script>>);

impl FakeStore {
    fn set(&self, mode: Mode) {
        self.0.lock().mode = Some(mode);
    }
    fn last(&self) -> (u64, Vec<ShareReport>) {
        self.0.lock().calls.back().cloned().expect("a call")
    }
    fn calls(&self) -> usize {
        self.0.lock().calls.len()
    }
    fn contend(&self, contended: bool) {
        self.0.lock().contended = contended;
    }
}

impl LeaseStore for FakeStore {
    fn exchange<'a>(&'a self, seq: u64, reports: &'a [ShareReport]) -> Exchange<'a> {
        let (mode, contended) = {
            let mut s = self.0.lock();
            s.calls.push_back((seq, reports.to_vec()));
            (s.mode.expect("a scripted mode"), s.contended)
        };
        Box::pin(async move {
            match mode {
                Mode::Grant { share, replicas } => Ok(reports
                    .iter()
                    .map(|_| ShareGrant {
                        share,
                        limit: 8,
                        replicas,
                        contended,
                    })
                    .collect()),
                Mode::Fail => Err(StoreError("refused".into())),
                Mode::Hang => std::future::pending().await,
            }
        })
    }
}

#[derive(Default)]
struct Events(Mutex<Vec<String>>);

impl ShareObserver for Events {
    fn fallback_engaged(&self, f: Fallback) {
        self.0.lock().push(format!("fallback {}", f.as_str()));
    }
    fn recovered(&self) {
        self.0.lock().push("recovered".into());
    }
}

const TTL: Duration = Duration::from_secs(3);
const INTERVAL: Duration = Duration::from_millis(200);

fn sharer(
    f: &Fixture,
    store: &FakeStore,
    fallback: Fallback,
    tokens: Option<u32>,
) -> (Arc<Sharer>, Arc<Events>) {
    let world = f.world.clone();
    let events = Arc::new(Events::default());
    let s = Sharer::new(
        f.adm.clone(),
        Arc::new(store.clone()),
        ShareConfig {
            limit: 8,
            token_limit: tokens,
            interval: INTERVAL,
            lease_ttl: TTL,
            fallback,
        },
        Box::new(move || {
            world
                .lock()
                .workers
                .iter()
                .map(|w| w.slot.clone())
                .collect()
        }),
        events.clone(),
    );
    (s, events)
}

#[tokio::test(start_paused = true)]
async fn grants_become_limits_and_reports_say_what_is_held_and_wanted() {
    // Slots start at 0: nothing is admitted before the store has granted a share.
    let f = Fixture::new(0, 8, 60, &["w0"]);
    let store = FakeStore::default();
    let (s, _) = sharer(&f, &store, Fallback::Hold, Some(1000));
    store.set(Mode::Grant {
        share: 2,
        replicas: 3,
    });
    s.tick().await;
    let w0 = f.slot(0);
    assert_eq!(
        (w0.limit(), w0.token_limit()),
        (2, Some(250)),
        "tokens follow 2/8"
    );
    let v = s.view("w0");
    assert_eq!(
        (v.share, v.global_limit, v.replicas, v.source),
        (2, 8, 3, ShareSource::Lease)
    );
    let a = f.get(Target::Any).await.unwrap();
    let b = f.get(Target::Any).await.unwrap();
    let waiting: Vec<_> = (0..3).map(|_| f.spawn(Target::Any)).collect();
    settle().await;
    assert_eq!(f.adm.queued(), 3);
    s.tick().await;
    let (seq, reports) = store.last();
    assert_eq!(seq, 2);
    assert_eq!(reports.len(), 1);
    // Held = max(limit applied, in flight); demand = in flight + the queue spread over workers.
    assert_eq!(
        (reports[0].limit, reports[0].held, reports[0].demand),
        (8, 2, 5)
    );
    // A larger share admits waiters at once.
    store.set(Mode::Grant {
        share: 5,
        replicas: 3,
    });
    s.tick().await;
    settle().await;
    assert_eq!(f.adm.queued(), 0);
    drop((a, b));
    for h in waiting {
        drop(h.await.unwrap().unwrap());
    }
    f.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn a_failing_store_is_trusted_until_the_lease_could_have_expired_then_holds() {
    let f = Fixture::new(0, 8, 60, &["w0"]);
    let store = FakeStore::default();
    let (s, events) = sharer(&f, &store, Fallback::Hold, None);
    store.set(Mode::Grant {
        share: 3,
        replicas: 2,
    });
    let task = s.spawn();
    settle().await;
    let ok_at = Instant::now();
    assert_eq!(f.slot(0).limit(), 3);
    store.set(Mode::Fail);
    // Stop point: last good send + TTL - TTL/4 = 2.25 s later.
    let stop = ok_at + TTL - TTL / 4;
    sleep(stop - Instant::now() - Duration::from_millis(10)).await;
    assert_eq!(f.slot(0).limit(), 3, "kept while the lease may still hold");
    assert!(!s.in_fallback());
    sleep(Duration::from_millis(20)).await;
    settle().await;
    assert_eq!(
        f.slot(0).limit(),
        0,
        "hold: nothing admitted on an expired lease"
    );
    assert_eq!(s.view("w0").source, ShareSource::Fallback);
    assert_eq!(*events.0.lock(), ["fallback hold"]);
    // The store answers again: the next exchange restores a share.
    store.set(Mode::Grant {
        share: 4,
        replicas: 2,
    });
    sleep(INTERVAL * 2).await;
    settle().await;
    assert_eq!(f.slot(0).limit(), 4);
    assert_eq!(*events.0.lock(), ["fallback hold", "recovered"]);
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_hanging_store_cannot_delay_the_stop() {
    let f = Fixture::new(0, 8, 60, &["w0"]);
    let store = FakeStore::default();
    let (s, _) = sharer(&f, &store, Fallback::Local, None);
    store.set(Mode::Grant {
        share: 6,
        replicas: 3,
    });
    let task = s.spawn();
    settle().await;
    let ok_at = Instant::now();
    store.set(Mode::Hang);
    sleep(TTL - TTL / 4 - Duration::from_millis(10)).await;
    assert_eq!(f.slot(0).limit(), 6);
    sleep(Duration::from_millis(20)).await;
    settle().await;
    assert!(Instant::now() - ok_at <= TTL - TTL / 4 + Duration::from_millis(20));
    // local: the even split over the 3 replicas last seen.
    assert_eq!(f.slot(0).limit(), 8 / 3);
    // Calls kept being made (each bounded), one per interval at most.
    let calls = store.calls();
    assert!((2..=16).contains(&calls), "{calls} calls");
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn without_any_lease_the_fallback_applies_at_once() {
    for (fallback, want) in [(Fallback::Hold, 0), (Fallback::Local, 8)] {
        let f = Fixture::new(0, 8, 60, &["w0", "w1"]);
        let store = FakeStore::default();
        let (s, _) = sharer(&f, &store, fallback, None);
        assert_eq!(s.view("w0").source, ShareSource::Pending);
        store.set(Mode::Fail);
        s.tick().await;
        // Never granted anything: no lease to wait for; `local` knows of no other replica.
        assert_eq!((f.slot(0).limit(), f.slot(1).limit()), (want, want));
        assert!(s.in_fallback());
    }
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_leaves_is_no_longer_reported() {
    let f = Fixture::new(0, 8, 60, &["w0", "w1"]);
    let store = FakeStore::default();
    let (s, _) = sharer(&f, &store, Fallback::Hold, None);
    store.set(Mode::Grant {
        share: 1,
        replicas: 1,
    });
    s.tick().await;
    assert_eq!(store.last().1.len(), 2);
    f.world.lock().workers.remove(1);
    s.tick().await;
    let keys: Vec<String> = store.last().1.into_iter().map(|r| r.key).collect();
    assert_eq!(keys, ["w0"]);
    assert_eq!(s.view("w1").source, ShareSource::Pending);
}

#[tokio::test(start_paused = true)]
async fn a_nudge_exchanges_before_the_interval_ends() {
    let f = Fixture::new(0, 8, 60, &["w0"]);
    let store = FakeStore::default();
    let (s, _) = sharer(&f, &store, Fallback::Hold, None);
    store.set(Mode::Grant {
        share: 2,
        replicas: 1,
    });
    let task = s.spawn();
    settle().await;
    assert_eq!(store.calls(), 1);
    sleep(INTERVAL / 4).await;
    assert_eq!(store.calls(), 1, "no exchange before the interval");
    s.nudge();
    settle().await;
    assert_eq!(store.calls(), 2, "a nudge exchanges at once");
    task.abort();
}

/// Calls the store receives during `d` from now.
async fn calls_during(store: &FakeStore, d: Duration) -> usize {
    let before = store.calls();
    sleep(d).await;
    settle().await;
    store.calls() - before
}

#[tokio::test(start_paused = true)]
async fn exchanges_come_every_poll_only_while_someone_waits() {
    let f = Fixture::new(0, 8, 60, &["w0"]);
    let store = FakeStore::default();
    let (s, _) = sharer(&f, &store, Fallback::Hold, None);
    store.set(Mode::Grant {
        share: 1,
        replicas: 2,
    });
    let task = s.spawn();
    settle().await;
    // Nobody waits, the group is not contended: one exchange per interval.
    let quiet = calls_during(&store, INTERVAL * 5).await;
    assert!((5..=6).contains(&quiet), "{quiet} calls while quiet");
    // A waiter here: one exchange per poll, a twentieth of the interval (never more).
    let held = f.get(Target::Any).await.unwrap();
    let waiter = f.spawn(Target::Any);
    settle().await;
    assert_eq!(f.adm.queued(), 1);
    let waiting = calls_during(&store, INTERVAL * 5).await;
    assert!(
        (99..=101).contains(&waiting),
        "{waiting} calls while waiting"
    );
    drop(held);
    let admitted = waiter.await.unwrap().unwrap();
    // No waiter here, but another replica wants more than it was granted: still every poll.
    store.contend(true);
    calls_during(&store, INTERVAL).await;
    let contended = calls_during(&store, INTERVAL * 5).await;
    assert!(
        (99..=101).contains(&contended),
        "{contended} calls while contended"
    );
    // Contention over: back to one per interval.
    store.contend(false);
    calls_during(&store, INTERVAL).await;
    let after = calls_during(&store, INTERVAL * 5).await;
    assert!((5..=6).contains(&after), "{after} calls after contention");
    // A failing store is not asked early, however many wait.
    store.contend(true);
    calls_during(&store, INTERVAL).await;
    store.set(Mode::Fail);
    calls_during(&store, INTERVAL).await;
    let failing = calls_during(&store, INTERVAL * 5).await;
    assert!((5..=6).contains(&failing), "{failing} calls while failing");
    drop(admitted);
    task.abort();
    f.assert_clean();
}
