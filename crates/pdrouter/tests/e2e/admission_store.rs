//! The Redis lease script against a real, private `redis-server`: the group bound holds
//! whatever replicas report, shares follow demand, expired leases return to the pool, a
//! restarted store holds growth back for one TTL, and a stale exchange changes nothing.

use std::time::Duration;

use tokio::time::Instant;

use crate::support::redis_server::RedisServer;
use pdrouter::admission_store::StoreUrl;
use pdrouter::admission_store::redis::RedisLeases;
use pdrouter_admission::{LeaseStore, ShareGrant, ShareReport};
use rand::RngExt;

const N: u32 = 8;
const WORKER: &str = "http://prefill-0:8000";

struct Replica {
    store: RedisLeases,
    id: String,
    seq: u64,
    applied: u32,
    inflight: u32,
}

/// Answers "1" when `ARGV[1]`'s lease in hash `KEYS[1]` is live by the store's own clock (the
/// clock the lease script expires leases by), else "0".
const LIVE: &str = "local t = redis.call('TIME') \
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
    local v = redis.call('HGET', KEYS[1], ARGV[1]) \
    if not v then return '0' end \
    local e = tonumber(string.match(v, '^%d+ (%d+) ')) \
    if e and e > now then return '1' end \
    return '0'";

impl Replica {
    fn new(redis: &RedisServer, id: &str, ttl: Duration) -> Self {
        let url = StoreUrl::parse(&redis.url()).unwrap();
        Replica {
            store: RedisLeases::new(&url, "test", id.into(), ttl, Duration::from_secs(10)).unwrap(),
            id: id.to_owned(),
            seq: 0,
            applied: 0,
            inflight: 0,
        }
    }

    /// Whether the store holds a live lease of this replica now, by the store's clock.
    fn live_in_store(&self, redis: &RedisServer) -> bool {
        let key = self.store.worker_key(WORKER);
        let live = redis.command(&["EVAL", LIVE, "1", &key, &self.id]);
        live.expect("the store answers the lease query") == "1"
    }

    fn held(&self) -> u32 {
        self.applied.max(self.inflight)
    }

    /// One exchange reporting `demand`; applies the grant like a sharer does.
    async fn exchange(&mut self, demand: u32) -> ShareGrant {
        self.seq += 1;
        let reports = [ShareReport {
            key: WORKER.into(),
            limit: N,
            held: self.held(),
            demand,
        }];
        // After a store restart the first call finds its connection broken and reconnects on
        // the next one, as the sharer's next tick would.
        let mut grants = self.store.exchange(self.seq, &reports).await;
        for _ in 0..3 {
            if grants.is_ok() {
                break;
            }
            self.seq += 1;
            grants = self.store.exchange(self.seq, &reports).await;
        }
        let grants = grants.expect("exchange");
        assert_eq!(grants.len(), 1);
        self.applied = grants[0].share;
        grants[0]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_never_let_the_group_exceed_the_limit() {
    let redis = RedisServer::start().await;
    let ttl = Duration::from_secs(3);
    redis.wait_uptime(ttl).await;
    let mut rs: Vec<Replica> = (0..3)
        .map(|i| Replica::new(&redis, &format!("r{i}"), ttl))
        .collect();
    let mut rng = rand::rng();
    let mut granted = 0;
    for _ in 0..400 {
        let i = rng.random_range(0..rs.len());
        // Between exchanges a replica admits up to its limit, or drains if above it.
        let r = &mut rs[i];
        r.inflight = rng.random_range(0..=r.held());
        let demand = r.inflight + rng.random_range(0..12);
        let g = r.exchange(demand).await;
        assert_eq!(g.limit, N);
        granted += g.share;
        // A replica whose lease has expired by the store's clock has stopped admitting and,
        // in this model, drained (a real replica stops earlier, by its own clock): the store no
        // longer counts it. Checked after the exchange, so a lease the script saw expired is
        // expired here too (the model never keeps what the script forgot); one the script
        // still counted and that expired since only lowers the total. Whether a loaded machine
        // stalls the test long enough for leases to expire changes nothing but which case runs.
        for r in &mut rs {
            if !r.live_in_store(&redis) {
                r.applied = 0;
                r.inflight = 0;
            }
        }
        let total: u32 = rs.iter().map(Replica::held).sum();
        assert!(total <= N, "replicas may hold {total} > {N}");
    }
    assert!(granted > 0, "something was granted");
}

/// A private store up for one lease TTL (3 s) and two replicas of it, "idle" and "busy".
async fn idle_and_busy() -> (RedisServer, Replica, Replica) {
    let redis = RedisServer::start().await;
    redis.wait_uptime(TTL).await;
    let idle = Replica::new(&redis, "idle", TTL);
    let busy = Replica::new(&redis, "busy", TTL);
    (redis, idle, busy)
}

const TTL: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_replicas_share_flows_to_a_busy_one_and_shares_follow_demand() {
    let (_redis, mut idle, mut busy) = idle_and_busy().await;
    // Alone, a replica gets the spare capacity.
    assert_eq!(idle.exchange(0).await.share, N);
    // Demand appears on the other replica; one round later the idle one has given its share
    // back, the round after the busy one has it.
    let first = busy.exchange(40).await;
    assert_eq!(first.replicas, 2);
    idle.exchange(0).await;
    busy.exchange(40).await;
    idle.exchange(0).await;
    let g = busy.exchange(40).await;
    assert_eq!(g.share, N, "the busy replica has the whole limit");
    assert_eq!(idle.applied, 0);
    // Uneven demand: shares follow it once the holder has acknowledged giving some back
    // (its next report), and never add up to more than N.
    for _ in 0..3 {
        idle.exchange(2).await;
        busy.exchange(40).await;
        assert!(idle.held() + busy.held() <= N);
    }
    assert_eq!(
        (idle.applied, busy.applied),
        (0, N),
        "shares follow demand 2/40 in proportion (1.6 rounds to 0)"
    );
}

/// Whether the grant says contended (checked on every exchange of the test below).
async fn contended(r: &mut Replica, demand: u32) -> bool {
    r.exchange(demand).await.contended
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_is_reported_to_every_replica_until_the_waiter_is_granted() {
    let (_redis, mut idle, mut busy) = idle_and_busy().await;
    // Everyone's demand granted: not contended.
    assert!(!contended(&mut idle, 0).await);
    assert!(!contended(&mut busy, 0).await);
    assert!(!contended(&mut idle, 0).await);
    // The busy replica wants more than it can be granted (the idle one holds the rest): both
    // hear of it, the idle one at its next exchange, so it hands its share back early.
    assert!(contended(&mut busy, 6).await);
    assert!(busy.applied < 6);
    assert!(
        contended(&mut idle, 0).await,
        "the holder hears of the waiter"
    );
    assert!(
        contended(&mut idle, 0).await,
        "until the waiter has exchanged"
    );
    // The waiter is granted what was handed back: contention over, for both.
    assert!(!contended(&mut busy, 6).await);
    assert!(busy.applied >= 6);
    assert!(!contended(&mut idle, 0).await);
    assert!(idle.held() + busy.held() <= N);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_returns_to_the_pool() {
    let redis = RedisServer::start().await;
    let ttl = Duration::from_millis(1000);
    redis.wait_uptime(ttl).await;
    let mut gone = Replica::new(&redis, "gone", ttl);
    let mut live = Replica::new(&redis, "live", ttl);
    gone.inflight = 0;
    assert_eq!(gone.exchange(50).await.share, N);
    gone.inflight = N;
    gone.exchange(50).await;
    assert_eq!(live.exchange(50).await.share, 0, "all of N is held");
    // `gone` never reports again. While its lease is live by the store's clock, its share is
    // held; once the store's clock has passed the lease's expiry, the next exchange grants it
    // again. Waiting is for that event (the store's clock), with no margin on either side.
    let expired = async {
        while gone.live_in_store(&redis) {
            let g = live.exchange(50).await;
            if g.share == N {
                assert!(
                    !gone.live_in_store(&redis),
                    "granted while the other lease was live"
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    // A bound only against a lease that never expires (a 1 s lease): not a timing margin.
    tokio::time::timeout(Duration::from_secs(120), expired)
        .await
        .expect("the lease never expired");
    let g = live.exchange(50).await;
    assert_eq!((g.share, g.replicas), (N, 1), "the expired lease returned");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_store_lets_nobody_grow_for_one_ttl() {
    let mut redis = RedisServer::start().await;
    let ttl = Duration::from_secs(2);
    redis.wait_uptime(ttl).await;
    let mut old = Replica::new(&redis, "old", ttl);
    old.exchange(3).await;
    old.inflight = 3;
    assert!(old.exchange(3).await.share >= 3);
    redis.kill();
    redis.restart().await;
    // The store lost every lease. A newcomer must not be granted what `old` may still use,
    // and `old` keeps what it holds but gets no more, until one TTL of uptime has passed.
    let mut new = Replica::new(&redis, "new", ttl);
    assert_eq!(new.exchange(20).await.share, 0);
    let held = old.held();
    assert!(old.exchange(20).await.share <= held);
    redis.wait_uptime(ttl).await;
    // Shares move over a few exchanges; on a loaded machine an exchange may be late, so keep
    // exchanging (bounded) until both have grown, checking the bound at every step.
    let patience = tokio::time::Instant::now() + Duration::from_secs(30);
    let (mut a, mut b) = (0, 0);
    while (a == 0 || b == 0) && tokio::time::Instant::now() < patience {
        a = a.max(old.exchange(20).await.share);
        b = b.max(new.exchange(20).await.share);
        assert!(old.held() + new.held() <= N);
    }
    assert!(a > 0 && b > 0, "both grow again: {a}/{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_exchange_changes_nothing() {
    let redis = RedisServer::start().await;
    let ttl = Duration::from_secs(1);
    redis.wait_uptime(ttl).await;
    let mut a = Replica::new(&redis, "a", ttl);
    let mut b = Replica::new(&redis, "b", ttl);
    a.exchange(8).await;
    a.inflight = a.applied;
    a.exchange(8).await;
    let held = a.held();
    // An old exchange of `a` (lower sequence number) arriving late claims nothing back.
    let reports = [ShareReport {
        key: WORKER.into(),
        limit: N,
        held: 0,
        demand: 0,
    }];
    let g = a.store.exchange(1, &reports).await.unwrap();
    assert_eq!(g[0].share, a.applied);
    assert_eq!(
        b.exchange(8).await.share,
        N - held,
        "a's hold is still counted"
    );
}

#[tokio::test]
async fn an_unreachable_store_is_an_error_naming_it_without_credentials() {
    let dead = crate::support::dead_url();
    let raw = format!("redis://user:s3cret@127.0.0.1:{}/0", dead.port());
    let url = StoreUrl::parse(&raw).unwrap();
    let store = RedisLeases::new(
        &url,
        "g",
        "r".into(),
        Duration::from_secs(3),
        Duration::from_secs(2),
    )
    .unwrap();
    let reports = [ShareReport {
        key: WORKER.into(),
        limit: N,
        held: 0,
        demand: 1,
    }];
    let err = store.exchange(1, &reports).await.unwrap_err().to_string();
    assert!(err.contains(&format!("127.0.0.1:{}", dead.port())), "{err}");
    assert!(!err.contains("s3cret") && !err.contains("user"), "{err}");
    assert!(!format!("{store:?}").contains("s3cret"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exchanges_push_wishes_and_hand_backs_to_the_other_replicas() {
    use pdrouter_admission::Push;
    use std::sync::Arc;
    let (redis, mut idle, mut busy) = idle_and_busy().await;
    assert_eq!(idle.exchange(0).await.share, N);
    busy.exchange(0).await;
    // A third replica listens (its own messages would be ignored).
    let url = StoreUrl::parse(&redis.url()).unwrap();
    let ear = Arc::new(
        RedisLeases::new(&url, "test", "ear".into(), TTL, Duration::from_secs(10)).unwrap(),
    );
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let listener = ear.listen(
        Duration::from_millis(50),
        Duration::from_secs(600),
        move |p| {
            let _ = tx.send(p);
        },
    );
    let next = |rx: &mut tokio::sync::mpsc::UnboundedReceiver<Push>| rx.try_recv().ok();
    // The busy replica wants more than it is granted: 'want'. (Repeated until the
    // subscription is up: a message published before it is lost, by design.)
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(busy.exchange(6).await.contended);
        if let Ok(Some(p)) = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
            assert_eq!(p, Push::Wanted);
            break;
        }
        assert!(Instant::now() < deadline, "no push within 20 s");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    while next(&mut rx).is_some() {}
    // The holder learns its smaller share (no message: it has not handed anything back yet),
    // then reports holding less while the other still wants more: 'free'.
    idle.exchange(0).await;
    assert!(idle.applied < N);
    idle.exchange(0).await;
    let got = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await;
    assert_eq!(got.ok().flatten(), Some(Push::Freed));
    // The busy replica is granted it: nothing to announce. A later wish is the next message.
    assert!(!busy.exchange(6).await.contended);
    assert!(busy.applied >= 6);
    assert!(busy.exchange(N + 4).await.contended);
    let got = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await;
    assert_eq!(got.ok().flatten(), Some(Push::Wanted));
    assert_eq!(next(&mut rx), None, "one message per announcing exchange");
    assert!(idle.held() + busy.held() <= N);
    listener.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spare_goes_where_requests_run_and_an_idle_replica_keeps_a_part() {
    let (redis, mut a, mut b) = idle_and_busy().await;
    let mut c = Replica::new(&redis, "quiet", TTL);
    // Demand 3, 1 and 0 of N = 8: the spare 4 in proportion to demand + 1 (4 : 2 : 1), the
    // leftover unit to the largest remainder.
    for _ in 0..4 {
        a.exchange(3).await;
        b.exchange(1).await;
        c.exchange(0).await;
    }
    assert_eq!((a.applied, b.applied, c.applied), (5, 2, 1));
    // Equal demand: an even split.
    for _ in 0..4 {
        a.exchange(0).await;
        b.exchange(0).await;
        c.exchange(0).await;
    }
    let shares = [a.applied, b.applied, c.applied];
    assert_eq!(shares.iter().sum::<u32>(), N);
    assert!(shares.iter().all(|s| (2..=3).contains(s)), "{shares:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_user_that_may_not_publish_still_exchanges() {
    let redis = RedisServer::start().await;
    redis.wait_uptime(TTL).await;
    let admin = redis::Client::open(redis.url()).unwrap();
    let mut conn = admin.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("ACL")
        .arg(&[
            "SETUSER", "nopub", "on", ">pw", "~*", "&*", "+@all", "-publish",
        ])
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let url = StoreUrl::parse(&redis.url().replace("redis://", "redis://nopub:pw@")).unwrap();
    let store = RedisLeases::new(&url, "test", "r".into(), TTL, Duration::from_secs(10)).unwrap();
    // Wanting more than the limit would publish: refused by the ACL, the exchange still
    // answers.
    let reports = [ShareReport {
        key: WORKER.into(),
        limit: N,
        held: 0,
        demand: N + 4,
    }];
    let grants = store.exchange(1, &reports).await.expect("exchange");
    assert_eq!(grants[0].share, N);
    assert!(grants[0].contended);
}
