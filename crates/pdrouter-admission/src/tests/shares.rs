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
    BURST, Exchange, Fallback, LeaseStore, POLLS_PER_INTERVAL, Push, ShareConfig, ShareGrant,
    ShareObserver, ShareReport, ShareSource, Sharer, StoreError,
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

/// A sharer over one worker `w0` (queue of `queue`, hold fallback) whose store grants `share`
/// of 8 seen by `replicas`; nothing exchanged yet.
fn granting(queue: usize, share: u32, replicas: u32) -> (Fixture, FakeStore, Arc<Sharer>) {
    let f = Fixture::new(0, queue, 60, &["w0"]);
    let store = FakeStore::default();
    let (s, _) = sharer(&f, &store, Fallback::Hold, None);
    store.set(Mode::Grant { share, replicas });
    (f, store, s)
}

/// [`granting`], running, after its first exchange.
async fn running(
    queue: usize,
    share: u32,
    replicas: u32,
) -> (Fixture, FakeStore, Arc<Sharer>, tokio::task::JoinHandle<()>) {
    let (f, store, s) = granting(queue, share, replicas);
    let task = s.spawn();
    settle().await;
    (f, store, s, task)
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
    let (_f, store, s, task) = running(8, 2, 1).await;
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
    let (f, store, _s, task) = running(8, 1, 2).await;
    // Nobody waits, the group is not contended: one exchange per interval.
    let quiet = calls_during(&store, INTERVAL * 5).await;
    assert!((5..=6).contains(&quiet), "{quiet} calls while quiet");
    // A waiter here: one exchange per poll, a fortieth of the interval (never more).
    let held = f.get(Target::Any).await.unwrap();
    let waiter = f.spawn(Target::Any);
    settle().await;
    assert_eq!(f.adm.queued(), 1);
    let waiting = calls_during(&store, INTERVAL * 5).await;
    assert!(
        (199..=201).contains(&waiting),
        "{waiting} calls while waiting"
    );
    drop(held);
    let admitted = waiter.await.unwrap().unwrap();
    // No waiter here, but another replica wants more than it was granted: still every poll.
    store.contend(true);
    calls_during(&store, INTERVAL).await;
    let contended = calls_during(&store, INTERVAL * 5).await;
    assert!(
        (199..=201).contains(&contended),
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

#[tokio::test(start_paused = true)]
async fn a_new_waiter_exchanges_at_once_and_early_exchanges_are_paced() {
    let (f, store, s, task) = running(1000, 1, 2).await;
    let held = f.get(Target::Any).await.unwrap();
    sleep(INTERVAL / 2).await;
    let before = store.calls();
    // A request that has to wait makes the replica ask for more without waiting for a poll.
    let first = f.spawn(Target::Any);
    settle().await;
    assert_eq!(
        store.calls(),
        before + 1,
        "exchanged as soon as someone waited"
    );
    assert_eq!(store.last().1[0].demand, 2);
    // A stream of new waiters: at most a burst at once, then one per poll on average.
    let mut waiters = vec![first];
    for _ in 0..10 {
        waiters.push(f.spawn(Target::Any));
        settle().await;
    }
    let burst = store.calls() - before;
    assert!(burst <= BURST as usize, "{burst} exchanges in one instant");
    let poll = s.config().poll();
    let mut arrivals = 0;
    let start = Instant::now();
    while Instant::now() - start < INTERVAL * 5 {
        waiters.push(f.spawn(Target::Any));
        arrivals += 1;
        sleep(poll / 4).await;
    }
    settle().await;
    let total = store.calls() - before;
    assert!(arrivals > 300, "{arrivals}");
    assert!(
        total <= BURST as usize + 5 * POLLS_PER_INTERVAL as usize + 1,
        "{total} exchanges for {arrivals} waiters over five intervals"
    );
    drop(held);
    task.abort();
    drop(waiters);
    settle().await;
    f.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn a_push_makes_a_replica_hand_back_the_share_it_does_not_use() {
    let (f, store, s, task) = running(8, 4, 2).await;
    let busy = f.get(Target::Any).await.unwrap();
    sleep(INTERVAL / 2).await;
    let before = store.calls();
    // Another replica has handed something back: nothing for a replica without waiters.
    s.pushed(Push::Freed);
    settle().await;
    assert_eq!(
        store.calls(),
        before,
        "a freed share is for replicas that wait"
    );
    // Another replica wants more: the exchange reports only what is in flight as held.
    s.pushed(Push::Wanted);
    settle().await;
    assert_eq!(store.calls(), before + 1, "a push exchanges at once");
    let r = &store.last().1[0];
    assert_eq!((r.held, r.demand), (1, 1), "idle share handed back");
    // The store still grants 4: applied again.
    assert_eq!(f.slot(0).limit(), 4);
    assert_eq!(s.view("w0").share, 4);
    // Nothing idle and nobody waiting here: a push is ignored.
    let others: Vec<_> = (0..3).map(|_| f.get(Target::Any)).collect();
    let mut permits = Vec::new();
    for p in others {
        permits.push(p.await.unwrap());
    }
    let before = store.calls();
    s.pushed(Push::Wanted);
    settle().await;
    assert_eq!(
        store.calls(),
        before,
        "nothing to hand back, nothing wanted"
    );
    // A waiter here: a freed share is worth an exchange, another's wish is not.
    let waiter = f.spawn(Target::Any);
    settle().await;
    // Between two polls (every 5 ms while someone waits).
    sleep(INTERVAL / 2 + Duration::from_millis(3)).await;
    let before = store.calls();
    s.pushed(Push::Wanted);
    settle().await;
    assert_eq!(
        store.calls(),
        before + 1,
        "a waiter's share may have shrunk"
    );
    sleep(Duration::from_millis(1)).await;
    s.pushed(Push::Freed);
    settle().await;
    assert_eq!(
        store.calls(),
        before + 2,
        "a waiter asks for what was freed"
    );
    drop(permits.pop());
    drop(waiter.await.unwrap().unwrap());
    drop((busy, permits));
    task.abort();
    f.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn on_a_contended_worker_a_replica_without_waiters_reports_only_what_it_uses() {
    let (f, store, s) = granting(8, 3, 2);
    s.tick().await;
    let a = f.get(Target::Any).await.unwrap();
    // Not contended: the whole share is held.
    s.tick().await;
    assert_eq!(store.last().1[0].held, 3);
    store.contend(true);
    s.tick().await;
    assert_eq!(
        store.last().1[0].held,
        3,
        "contention learnt from this answer"
    );
    s.tick().await;
    assert_eq!(store.last().1[0].held, 1, "handed back before reporting");
    assert_eq!(f.slot(0).limit(), 3, "what the store grants is applied");
    // With a waiter of its own a replica hands nothing back.
    let b = f.get(Target::Any).await.unwrap();
    let c = f.get(Target::Any).await.unwrap();
    let waiter = f.spawn(Target::Any);
    settle().await;
    assert_eq!(f.adm.queued(), 1);
    s.tick().await;
    let r = &store.last().1[0];
    assert_eq!((r.held, r.demand), (3, 4));
    drop((a, b, c));
    drop(waiter.await.unwrap().unwrap());
    f.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn a_request_ending_on_a_contended_worker_hands_its_unit_back_at_once() {
    let (f, store, _s, task) = running(8, 2, 2).await;
    let a = f.get(Target::Any).await.unwrap();
    let b = f.get(Target::Any).await.unwrap();
    // Nobody else wants more: an ending request asks nothing of the store.
    sleep(INTERVAL / 2).await;
    let before = store.calls();
    drop(a);
    settle().await;
    assert_eq!(store.calls(), before, "quiet group: no exchange on release");
    let a = f.get(Target::Any).await.unwrap();
    // Another replica wants more: learnt at the next interval's exchange.
    store.contend(true);
    sleep(INTERVAL).await;
    settle().await;
    // In flight = share: polls hand nothing back. A request ends: handed back at once.
    let before = store.calls();
    drop(b);
    settle().await;
    assert_eq!(store.calls(), before + 1, "exchanged as the unit was freed");
    let r = &store.last().1[0];
    assert_eq!((r.held, r.demand), (1, 1));
    drop(a);
    task.abort();
    f.assert_clean();
}
