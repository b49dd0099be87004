//! Sharing each worker's limit between router replicas through a lease store.
//!
//! Several replicas of the router can admit Prefill requests to the same workers. With a
//! [`LeaseStore`] they share each worker's limit `N` instead of each applying it alone: every
//! replica holds, per worker, a *share* of `N` and admits against it locally, on the ordinary
//! fast path (the share is the slot's limit, set with [`Admission::set_limits`]). A [`Sharer`]
//! task exchanges one message with the store per interval, whatever the request rate: it
//! reports each worker's demand and what the replica may hold, renews its leases, and applies
//! the shares the store grants back.
//!
//! # Early exchanges
//!
//! A share moves only through exchanges: its holder reports that it gave it back, then the
//! replica that wants it is granted it at its own next exchange. Waiting a whole interval for
//! each of those steps would keep a waiter waiting for several intervals, so a replica also
//! exchanges *early*:
//!
//! - when a request starts waiting here ([`Admission::waiter_enqueued`]): it wants more;
//! - when the store pushes word ([`Sharer::pushed`]) that another replica of the group wants
//!   more (if this replica has waiters, its share may have shrunk; if it has units it does
//!   not use, it hands them back), or that one handed something back (if this replica has
//!   waiters: it may be granted it);
//! - every *poll* (a fortieth of the interval, at least 5 ms, [`ShareConfig::poll`]) while it
//!   has waiters or the last answer said that some replica wants more than it was granted on a
//!   worker: the push is a shortcut, these polls are what moves shares without it;
//! - when a request ends here while nobody waits, on a worker some other replica wants more
//!   of ([`Admission::released_idle`]; watched only while the last answer said contended,
//!   so a quiet group's requests end without waking the sharer): the unit it freed can go to
//!   that replica at once;
//! - on [`Sharer::nudge`] (a worker was registered).
//!
//! **Handing back.** In an exchange made while some other replica wants more of a worker (the
//! last answer said so, or a push came), a replica without waiters first lowers its limit on
//! that worker to what it has in flight, then reports that as held: the store can grant the
//! rest to the replica that waits in the same round, instead of learning only at the holder's
//! next exchange that the holder applied a smaller grant. What the store grants back (its
//! target for this replica) is applied as usual, so an idle replica keeps its part of any
//! spare.
//!
//! **Bound.** Early exchanges are paced: on average at most one per poll, in bursts of at most
//! [`BURST`]. Store traffic stays bounded by about replicas × 40 ÷ interval calls (each
//! carrying every worker), never grows with requests, and is one call per interval while nobody
//! waits.
//!
//! # Invariants
//!
//! - The controller's configured limits are 0 when a sharer drives it (the router builds it
//!   so), so a slot admits nothing until the store (or the fallback) gives it a share; the
//!   sharer is the only writer of slot limits.
//! - What the replica reports as held is `max(limit applied, in flight)`: the most it can have
//!   in flight until its next report. The store never grants beyond `N` minus what the other
//!   replicas hold or were granted (see the script's module for the store side).
//! - A lease is renewed only by a successful exchange. Once `lease_ttl − lease_ttl/4` has passed
//!   since the *send* instant of the last successful one (by this replica's clock), the store
//!   may be about to reassign the share (its expiry counts from when it ran the exchange, which
//!   is later), so the replica stops admitting on its shares: every slot gets the
//!   [`Fallback`] limit (0 for [`Fallback::Hold`]). Requests already admitted run to their end.
//! - A store failure is reported to the [`ShareObserver`] and logged by the caller; it never
//!   panics and never changes a share before the lease could have expired.
//!
//! # Demand
//!
//! A worker's demand is its in-flight count plus its part of the queue. Waiters bind to no
//! worker until admitted, so the queue is spread evenly over the replica's workers: each gets
//! `ceil(queued / workers)`. Every replica counts the same way, so the shares it yields are
//! comparable between replicas, which is all the store's division needs.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::controller::Admission;
use crate::ledger::Slot;

/// What a replica tells the store about one worker per exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareReport {
    /// The worker identity (URL, or URL@rank), the same in every replica.
    pub key: String,
    /// This replica's configured limit `N` for the worker (the store uses the smallest one
    /// reported by a live replica).
    pub limit: u32,
    /// The most this replica may have in flight on the worker until its next report:
    /// `max(limit applied now, in flight now)`.
    pub held: u32,
    /// In flight plus this worker's part of the queue.
    pub demand: u32,
}

/// What the store grants a replica for one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareGrant {
    /// This replica's share of the worker's limit.
    pub share: u32,
    /// The worker's limit across the group (the smallest `N` a live replica reported).
    pub limit: u32,
    /// Live replicas holding a lease on the worker, this one included.
    pub replicas: u32,
    /// Whether some live replica (this one included) wants more of the worker than it was
    /// granted: the sharer then exchanges every poll until it no longer is.
    pub contended: bool,
}

/// What another replica's exchange announced through the store ([`Sharer::pushed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Push {
    /// It wants more of a worker than it was granted: a replica holding units it does not use
    /// should hand them back.
    Wanted,
    /// It handed back part of its share while some replica wants more: a replica with waiters
    /// may now be granted it.
    Freed,
    /// Either (a message this version cannot tell apart).
    Both,
}

/// A failed exchange, already safe to log (no credentials).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError(pub String);

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StoreError {}

/// The future of one exchange.
pub type Exchange<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<ShareGrant>, StoreError>> + Send + 'a>>;

/// The shared store: one atomic exchange per interval for all of a replica's workers.
pub trait LeaseStore: Send + Sync + 'static {
    /// Reports `reports` (sequence number `seq`, increasing per replica), renews this
    /// replica's leases for its lease TTL and returns one grant per report, in order. Must be
    /// atomic in the store: shares are recomputed from every live replica's last report
    /// without interleaving another exchange.
    fn exchange<'a>(&'a self, seq: u64, reports: &'a [ShareReport]) -> Exchange<'a>;
}

/// What a replica does once it can no longer count on its leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Admit nothing until the store answers again: requests wait, then get the usual queue
    /// rejections. The group's bound holds.
    Hold,
    /// Admit up to the even split `max(1, N / R)` per worker, `R` being the replicas the last
    /// successful exchange saw (1 if none did). The bound holds while every replica falls back
    /// with the same `R` and `R <= N`; otherwise it may be exceeded.
    Local,
}

impl Fallback {
    /// The flag value: `hold` or `local`.
    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::Hold => "hold",
            Fallback::Local => "local",
        }
    }
}

/// How a [`Sharer`] shares a worker's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareConfig {
    /// `N`: in-flight Prefill requests per worker across the group.
    pub limit: u32,
    /// Prompt tokens per worker across the group, if budgeted: each replica gets the part of
    /// it proportional to its share of `N`.
    pub token_limit: Option<u32>,
    /// Time between exchanges.
    pub interval: Duration,
    /// How long a lease lasts in the store without renewal.
    pub lease_ttl: Duration,
    /// What to do once the leases could have expired.
    pub fallback: Fallback,
}

impl ShareConfig {
    /// How long before its TTL ends (from the send instant of the last good exchange) a lease
    /// stops being used: a quarter of the TTL, for clock-rate differences and scheduling delay.
    pub fn margin(&self) -> Duration {
        self.lease_ttl / 4
    }

    /// Longest one exchange may take before it counts as failed.
    pub fn call_timeout(&self) -> Duration {
        self.lease_ttl / 4
    }

    /// How often the sharer checks whether an exchange is due early, and the least time
    /// between two exchanges that it starts by itself: a fortieth of the interval, at least
    /// [`MIN_POLL`] (and never more than the interval).
    pub fn poll(&self) -> Duration {
        (self.interval / POLLS_PER_INTERVAL)
            .max(MIN_POLL)
            .min(self.interval)
    }
}

/// Early-exchange checks per interval ([`ShareConfig::poll`]).
pub const POLLS_PER_INTERVAL: u32 = 40;
/// The shortest poll: a floor on store traffic however short the interval.
pub const MIN_POLL: Duration = Duration::from_millis(5);
/// Early exchanges that may follow one another without a poll between them (a waiter, then
/// the push that answers it), within the average of one per poll.
pub const BURST: u32 = 4;

/// Where a worker's share comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareSource {
    /// Nothing has been granted yet.
    Pending,
    /// A live lease.
    Lease,
    /// The [`Fallback`] limit (the leases could have expired).
    Fallback,
}

impl ShareSource {
    /// `pending`, `lease` or `fallback`.
    pub fn as_str(self) -> &'static str {
        match self {
            ShareSource::Pending => "pending",
            ShareSource::Lease => "lease",
            ShareSource::Fallback => "fallback",
        }
    }
}

/// One worker's share as this replica last applied it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareView {
    /// The limit this replica admits against.
    pub share: u32,
    /// The worker's limit across the group.
    pub global_limit: u32,
    /// Live replicas holding a lease on the worker (as of the last good exchange).
    pub replicas: u32,
    /// Where the share comes from.
    pub source: ShareSource,
}

/// Metrics hooks of a [`Sharer`]; every method has a no-op default. Called from the sharer's
/// task, outside its lock.
pub trait ShareObserver: Send + Sync + 'static {
    /// The share applied to worker `key` is now `share` of `global_limit`.
    fn share_changed(&self, _key: &str, _share: u32, _global_limit: u32) {}
    /// Worker `key` is no longer shared (it left the registry).
    fn share_removed(&self, _key: &str) {}
    /// An exchange succeeded after `rtt`.
    fn exchanged(&self, _rtt: Duration) {}
    /// An exchange failed (error or timeout).
    fn exchange_failed(&self, _error: &StoreError) {}
    /// Time since the send instant of the last good exchange (`None`: none yet).
    fn lease_age(&self, _age: Option<Duration>) {}
    /// The leases could have expired and the fallback is now in force.
    fn fallback_engaged(&self, _fallback: Fallback) {}
    /// An exchange succeeded after the fallback was in force.
    fn recovered(&self) {}
}

/// The workers to share, as the router's registry has them now.
pub type SlotSource = Box<dyn Fn() -> Vec<Arc<Slot>> + Send + Sync>;

/// Drives one replica's shares: one exchange with the store per interval.
pub struct Sharer {
    admission: Admission,
    store: Arc<dyn LeaseStore>,
    cfg: ShareConfig,
    slots: SlotSource,
    observer: Arc<dyn ShareObserver>,
    state: Mutex<State>,
    wake: tokio::sync::Notify,
    push: tokio::sync::Notify,
}

struct State {
    seq: u64,
    /// Send instant of the last good exchange.
    last_ok: Option<Instant>,
    /// The last exchange failed (no early exchange until one succeeds).
    failing: bool,
    /// The slots of the workers on which the last good exchange said some replica wants more
    /// than it was granted (replaced at every exchange, so a worker that left is let go of
    /// within one).
    contended: Vec<Arc<Slot>>,
    /// A store push asked this replica to hand back what it does not use, at its next
    /// exchange.
    release: bool,
    /// A [`Push::Wanted`] came and was not yet looked at.
    pushed_want: bool,
    /// A [`Push::Freed`] came and was not yet looked at.
    pushed_free: bool,
    in_fallback: bool,
    /// Replicas the last good exchange saw (the most over its workers).
    replicas: u32,
    views: HashMap<Box<str>, ShareView>,
}

impl fmt::Debug for Sharer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.state.lock();
        f.debug_struct("Sharer")
            .field("cfg", &self.cfg)
            .field("seq", &s.seq)
            .field("in_fallback", &s.in_fallback)
            .field("workers", &s.views.len())
            .finish_non_exhaustive()
    }
}

impl Sharer {
    /// A sharer for `admission` (built with limits 0), over the slots `slots` lists.
    pub fn new(
        admission: Admission,
        store: Arc<dyn LeaseStore>,
        cfg: ShareConfig,
        slots: SlotSource,
        observer: Arc<dyn ShareObserver>,
    ) -> Arc<Self> {
        Arc::new(Sharer {
            admission,
            store,
            cfg,
            slots,
            observer,
            state: Mutex::new(State {
                seq: 0,
                last_ok: None,
                failing: false,
                contended: Vec::new(),
                release: false,
                pushed_want: false,
                pushed_free: false,
                in_fallback: false,
                replicas: 1,
                views: HashMap::new(),
            }),
            wake: tokio::sync::Notify::new(),
            push: tokio::sync::Notify::new(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &ShareConfig {
        &self.cfg
    }

    /// Worker `key`'s share as last applied ([`ShareSource::Pending`], share 0, before the
    /// first exchange or fallback that covered it).
    pub fn view(&self, key: &str) -> ShareView {
        let s = self.state.lock();
        s.views.get(key).copied().unwrap_or(ShareView {
            share: 0,
            global_limit: self.cfg.limit,
            replicas: 0,
            source: ShareSource::Pending,
        })
    }

    /// Whether the fallback is in force.
    pub fn in_fallback(&self) -> bool {
        self.state.lock().in_fallback
    }

    /// Runs exchanges every interval, and early ones when due (see the module docs), until the
    /// returned task is aborted (or the runtime ends).
    pub fn spawn(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let poll = me.cfg.poll();
            let mut pace = Pace::new(poll, Instant::now());
            loop {
                let started = Instant::now();
                pace.spend(started);
                me.tick().await;
                let next = crate::deadline_after(started, me.cfg.interval);
                let mut check = crate::deadline_after(started, poll);
                loop {
                    // The lease may run out before the next exchange: stop using it on time.
                    let stop = me.lease_stop().filter(|s| *s < next);
                    let early = tokio::select! {
                        () = sleep_until(next) => break,
                        () = me.wake.notified() => true,
                        () = me.push.notified() => me.push_due(),
                        () = me.admission.waiter_enqueued() => me.trusted(),
                        () = me.admission.released_idle() => me.release_due(),
                        () = sleep_until(stop.unwrap_or(next)), if stop.is_some() => {
                            me.expire_if_due();
                            false
                        }
                        () = sleep_until(check), if check < next => {
                            check = crate::deadline_after(check, poll);
                            me.early_due()
                        }
                    };
                    if early {
                        me.wait_until(pace.ready_at()).await;
                        break;
                    }
                }
            }
        })
    }

    /// Sleeps until `at`, applying the fallback on time if the lease runs out meanwhile.
    async fn wait_until(&self, at: Instant) {
        while Instant::now() < at {
            match self.lease_stop().filter(|s| *s < at) {
                Some(stop) => {
                    sleep_until(stop).await;
                    self.expire_if_due();
                }
                None => sleep_until(at).await,
            }
        }
    }

    /// The last exchange succeeded and the leases are in force: early exchanges are worth it.
    fn trusted(&self) -> bool {
        let s = self.state.lock();
        !s.failing && !s.in_fallback
    }

    /// Whether to exchange before the interval ends: the last exchange succeeded and either
    /// this replica has waiters or the group was contended. Local reads only.
    fn early_due(&self) -> bool {
        self.trusted() && (!self.state.lock().contended.is_empty() || self.admission.queued() > 0)
    }

    /// A request ended here while nobody waited: on a worker another replica wants more of,
    /// the unit it freed is worth handing back now rather than at the next poll.
    fn release_due(&self) -> bool {
        self.trusted()
            && self.admission.queued() == 0
            && self
                .state
                .lock()
                .contended
                .iter()
                .any(|s| s.limit() > s.inflight())
    }

    /// The store pushed word that another replica wants more or handed something back.
    /// Exchanging is worth it only for a replica that can act on it. A freed share is for
    /// replicas with waiters (they may be granted it). Another's wish concerns replicas with
    /// waiters too (the store may have lowered their share below what they hold: until they
    /// report, the other cannot grow) and those holding units they do not use (that exchange
    /// hands them back).
    fn push_due(&self) -> bool {
        let (wanted, freed) = {
            let mut s = self.state.lock();
            (
                std::mem::take(&mut s.pushed_want),
                std::mem::take(&mut s.pushed_free),
            )
        };
        if !self.trusted() {
            return false;
        }
        if self.admission.queued() > 0 {
            return wanted || freed;
        }
        let spare = wanted
            && self
                .current_slots()
                .iter()
                .any(|s| s.limit() > s.inflight());
        if spare {
            self.state.lock().release = true;
        }
        spare
    }

    /// A push from the store (see [`Push`]). Exchanges soon (paced) if this replica can act on
    /// it. Called by the store's listener, never per request.
    pub fn pushed(&self, push: Push) {
        {
            let mut s = self.state.lock();
            s.pushed_want |= matches!(push, Push::Wanted | Push::Both);
            s.pushed_free |= matches!(push, Push::Freed | Push::Both);
        }
        self.push.notify_one();
    }

    /// Asks for an exchange now rather than at the next interval (a worker was registered and
    /// its slot admits nothing until it has a share). Not meant for anything per request.
    pub fn nudge(&self) {
        self.wake.notify_one();
    }

    /// When the current lease stops being used (`None`: no lease, or already in fallback).
    fn lease_stop(&self) -> Option<Instant> {
        let s = self.state.lock();
        match (s.last_ok, s.in_fallback) {
            (Some(ok), false) => Some(self.stop_after(ok)),
            _ => None,
        }
    }

    fn stop_after(&self, ok: Instant) -> Instant {
        crate::deadline_after(ok, self.cfg.lease_ttl.saturating_sub(self.cfg.margin()))
    }

    /// One exchange: report, renew, apply the grants; on failure, fall back once the lease
    /// could have expired.
    pub async fn tick(&self) {
        let slots = self.current_slots();
        let reports = self.reports(&slots);
        let (seq, stop) = {
            let mut s = self.state.lock();
            s.seq += 1;
            (s.seq, s.last_ok.map(|ok| self.stop_after(ok)))
        };
        let sent = Instant::now();
        let mut until = crate::deadline_after(sent, self.cfg.call_timeout());
        if let Some(stop) = stop
            && stop > sent
        {
            until = until.min(stop);
        }
        let outcome = match timeout_at(until, self.store.exchange(seq, &reports)).await {
            Ok(Ok(grants)) if grants.len() == reports.len() => Ok(grants),
            Ok(Ok(grants)) => Err(StoreError(format!(
                "the store answered {} grants for {} workers",
                grants.len(),
                reports.len()
            ))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StoreError(format!(
                "no answer within {} ms",
                until.saturating_duration_since(sent).as_millis()
            ))),
        };
        match outcome {
            Ok(grants) => {
                self.observer.exchanged(sent.elapsed());
                self.apply(&slots, &grants, sent);
            }
            Err(e) => {
                {
                    let mut s = self.state.lock();
                    s.failing = true;
                    s.contended.clear();
                    self.admission.watch_releases(false);
                }
                self.observer.exchange_failed(&e);
                self.expire_if_due();
            }
        }
        let age = self.state.lock().last_ok.map(|ok| ok.elapsed());
        self.observer.lease_age(age);
    }

    /// The registry's slots, one per key, and the views of workers that left dropped.
    fn current_slots(&self) -> Vec<Arc<Slot>> {
        let mut slots = (self.slots)();
        slots.sort_by(|a, b| a.key().cmp(b.key()));
        slots.dedup_by(|a, b| a.key() == b.key());
        let gone: Vec<Box<str>> = {
            let mut s = self.state.lock();
            let gone: Vec<Box<str>> = s
                .views
                .keys()
                .filter(|k| slots.binary_search_by(|s| s.key().cmp(k)).is_err())
                .cloned()
                .collect();
            for k in &gone {
                s.views.remove(k);
            }
            gone
        };
        for k in gone {
            self.observer.share_removed(&k);
        }
        slots
    }

    fn reports(&self, slots: &[Arc<Slot>]) -> Vec<ShareReport> {
        self.hand_back(slots);
        let workers = slots.len().max(1);
        let per_worker =
            u32::try_from(self.admission.queued().div_ceil(workers)).unwrap_or(u32::MAX);
        slots
            .iter()
            .map(|s| {
                let inflight = s.inflight();
                ShareReport {
                    key: s.key().to_owned(),
                    limit: self.cfg.limit,
                    held: s.limit().max(inflight),
                    demand: inflight.saturating_add(per_worker),
                }
            })
            .collect()
    }

    /// Before a report: on each worker another replica wants more of (or on every worker after
    /// a push), a replica without waiters lowers its leased limit to what it has in flight, so
    /// the report frees the rest at once (see the module docs). Lowering is always safe; the
    /// grant that answers the report restores what the store still gives this replica.
    fn hand_back(&self, slots: &[Arc<Slot>]) {
        if self.admission.queued() > 0 {
            return;
        }
        let lowered: Vec<(Arc<Slot>, ShareView)> = {
            let mut s = self.state.lock();
            let all = std::mem::take(&mut s.release);
            if s.in_fallback {
                return;
            }
            let mut lowered = Vec::new();
            let State {
                contended, views, ..
            } = &mut *s;
            let targets = if all { slots } else { &contended[..] };
            for slot in targets {
                let Some(view) = views.get_mut(slot.key()) else {
                    continue;
                };
                let inflight = slot.inflight();
                if view.source != ShareSource::Lease || view.share <= inflight {
                    continue;
                }
                view.share = inflight;
                lowered.push((Arc::clone(slot), *view));
            }
            lowered
        };
        for (slot, v) in lowered {
            self.set(&slot, v);
        }
    }

    /// The token budget that goes with `count` of `limit` requests.
    fn tokens_for(&self, count: u32, limit: u32) -> Option<u32> {
        self.cfg.token_limit.map(|b| {
            let part = u64::from(b) * u64::from(count) / u64::from(limit.max(1));
            u32::try_from(part).unwrap_or(b)
        })
    }

    fn apply(&self, slots: &[Arc<Slot>], grants: &[ShareGrant], sent: Instant) {
        let mut changed = Vec::new();
        let recovered = {
            let mut s = self.state.lock();
            let recovered = s.in_fallback;
            s.in_fallback = false;
            s.failing = false;
            s.contended = slots
                .iter()
                .zip(grants)
                .filter(|(_, g)| g.contended)
                .map(|(slot, _)| Arc::clone(slot))
                .collect();
            // Releases matter only while some replica wants more: a quiet group's requests
            // end without waking the sharer.
            self.admission.watch_releases(!s.contended.is_empty());
            s.last_ok = Some(sent);
            s.replicas = grants.iter().map(|g| g.replicas).max().unwrap_or(1).max(1);
            for (slot, g) in slots.iter().zip(grants) {
                let view = ShareView {
                    share: g.share,
                    global_limit: g.limit,
                    replicas: g.replicas,
                    source: ShareSource::Lease,
                };
                if s.views.insert(slot.key().into(), view) != Some(view) {
                    changed.push((Arc::clone(slot), view));
                }
            }
            recovered
        };
        if recovered {
            self.observer.recovered();
        }
        for (slot, v) in changed {
            self.set(&slot, v);
        }
    }

    fn set(&self, slot: &Slot, v: ShareView) {
        // The token part follows the share of this replica's own configured limit.
        let tokens = self.tokens_for(v.share, self.cfg.limit);
        self.admission.set_limits(slot, v.share, tokens);
        self.observer
            .share_changed(slot.key(), v.share, v.global_limit);
    }

    /// Applies the fallback if the lease could have expired (or there never was one).
    fn expire_if_due(&self) {
        let now = Instant::now();
        let engage = {
            let s = self.state.lock();
            match s.last_ok {
                Some(ok) => now >= self.stop_after(ok),
                None => true,
            }
        };
        if engage {
            self.engage_fallback();
        }
    }

    /// Sets every slot to the fallback limit. Idempotent; re-run on every failed exchange so
    /// workers registered meanwhile get it too.
    fn engage_fallback(&self) {
        let slots = self.current_slots();
        let (first, updates) = {
            let mut s = self.state.lock();
            let first = !s.in_fallback;
            s.in_fallback = true;
            let limit = match self.cfg.fallback {
                Fallback::Hold => 0,
                Fallback::Local => (self.cfg.limit / s.replicas.max(1)).max(1),
            };
            let mut updates = Vec::new();
            for slot in &slots {
                let view = ShareView {
                    share: limit,
                    global_limit: self.cfg.limit,
                    replicas: s.replicas,
                    source: ShareSource::Fallback,
                };
                if s.views.insert(slot.key().into(), view) != Some(view) {
                    updates.push((Arc::clone(slot), view));
                }
            }
            (first, updates)
        };
        if first {
            self.observer.fallback_engaged(self.cfg.fallback);
        }
        for (slot, v) in updates {
            self.set(&slot, v);
        }
    }
}

/// Paces early exchanges (a generic cell rate algorithm): on average one per `poll`, with up
/// to [`BURST`] in a row.
struct Pace {
    poll: Duration,
    /// When the next exchange would be due at the average rate.
    due: Instant,
}

impl Pace {
    fn new(poll: Duration, now: Instant) -> Self {
        Pace { poll, due: now }
    }

    /// The earliest instant the next exchange may start.
    fn ready_at(&self) -> Instant {
        self.due
            .checked_sub(self.poll * (BURST - 1))
            .unwrap_or(self.due)
    }

    /// An exchange starts at `now`.
    fn spend(&mut self, now: Instant) {
        self.due = crate::deadline_after(self.due.max(now), self.poll);
    }
}
