//! Replica sync: a primary with one replica (testkit's `ReplicaPair`), failed over by hand so that
//! the test decides what the replica has: the replication link is cut while the primary grants, the
//! primary is killed, the replica promoted (`REPLICAOF NO ONE`), and a second client connects to
//! it. This is what a Sentinel or Cluster failover does, without the election's seconds.
//!
//! - Without sync the grant the replica missed is granted twice (recorded), and the fencing
//!   token still rejects the stale holder's write.
//! - With `ReplicaSync::Replicas { replicas: 1, .. }` a grant is reported only once the replica
//!   has it (it survives the failover), and a grant the cut-off replica missed is rolled back
//!   with `LockError::NotReplicated`.
//! - A renewal the replica missed counts as failed: the hold is lost when its last synced
//!   deadline passes. A release is never failed for lack of replicas.
//! - A latch's count and count-downs, and a semaphore's number of permits, reach the replica
//!   before the call returns; one the cut-off replica missed fails with
//!   `LockError::AppliedNotReplicated` and stands on the primary.

use std::time::{Duration, Instant};

use leasehold::{FencingToken, LockClient, LockError, ReplicaSync, Synced};
use leasehold_testkit::{RedisServer, ReplicaPair};

const SYNC: ReplicaSync = ReplicaSync::Replicas {
    replicas: 1,
    timeout: Duration::from_secs(1),
};

/// A primary and a replica in sync, replicating through a link the test can cut.
async fn start_pair() -> ReplicaPair {
    ReplicaPair::start()
        .await
        .unwrap_or_else(|e| panic!("cannot start a primary and a replica: {e}"))
}

async fn client(url: &str, sync: ReplicaSync) -> LockClient {
    LockClient::builder(url)
        .command_timeout(Duration::from_secs(2))
        .replica_sync(sync)
        .build()
        .await
        .expect("connect")
}

/// A fenced store: accepts a write only with a token at least the highest it has seen.
#[derive(Default)]
struct Store {
    highest: Option<FencingToken>,
}

impl Store {
    fn write(&mut self, token: FencingToken) -> bool {
        if self.highest.is_some_and(|h| token < h) {
            return false;
        }
        self.highest = Some(token);
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_sync_a_failover_before_replication_grants_twice() {
    let pair = start_pair().await;
    let a = client(&pair.primary().url(), ReplicaSync::None).await;
    pair.cut().unwrap();
    let lock_a = a.lock("last-item").unwrap();
    let first = lock_a.try_lock().await.unwrap().expect("free");
    assert_eq!(first.replica_sync(), None, "no policy, nothing reported");
    pair.fail_over().unwrap();
    let b = client(&pair.replica().url(), ReplicaSync::None).await;
    let lock_b = b.lock("last-item").unwrap();
    let second = lock_b
        .try_lock()
        .await
        .unwrap()
        .expect("the promoted replica never had the grant: it grants again");
    eprintln!(
        "granted twice without sync: A token {} (still believes it holds: {}), B token {}",
        first.fencing_token(),
        first.is_held(),
        second.fencing_token()
    );
    assert!(first.is_held() && second.is_held(), "two owners hold it");
    // The fence still orders them: the promoted replica's counter is floored at server time.
    assert!(second.fencing_token() > first.fencing_token());
    let mut store = Store::default();
    assert!(store.write(second.fencing_token()), "the new holder writes");
    assert!(
        !store.write(first.fencing_token()),
        "the stale holder's write is refused"
    );
    second.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_sync_a_reported_grant_survives_the_failover() {
    let pair = start_pair().await;
    let a = client(&pair.primary().url(), SYNC).await;
    let lock_a = a.lock("last-item").unwrap();
    let guard = lock_a.try_lock().await.unwrap().expect("free");
    assert_eq!(
        guard.replica_sync(),
        Some(Synced {
            replicas: 1,
            local_aof: false
        }),
        "reported once the replica has it"
    );
    pair.fail_over().unwrap();
    let b = client(&pair.replica().url(), SYNC).await;
    let lock_b = b.lock("last-item").unwrap();
    assert!(
        lock_b.try_lock().await.unwrap().is_none(),
        "the promoted replica has the grant: no second owner"
    );
    assert!(lock_b.is_locked().await.unwrap());
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_sync_a_grant_the_replica_missed_is_rolled_back() {
    let pair = start_pair().await;
    let a = client(&pair.primary().url(), SYNC).await;
    let lock = a.lock("last-item").unwrap();
    pair.cut().unwrap();
    match lock.try_lock().await {
        Err(LockError::NotReplicated {
            replicas: 0,
            required: 1,
            ..
        }) => {}
        other => panic!("expected NotReplicated, got {other:?}"),
    }
    // Rolled back on the primary (the settle runs in the background).
    let hash = lock.keys().hash().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    while pair.primary().command(&["EXISTS", &hash]).unwrap().as_int() != Some(0) {
        assert!(Instant::now() < deadline, "the grant was not rolled back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A bounded wait keeps trying until its deadline, then says why.
    match lock.try_lock_for(Duration::from_millis(700)).await {
        Err(LockError::NotReplicated { .. }) => {}
        other => panic!("expected NotReplicated at the deadline, got {other:?}"),
    }
    pair.restore().await.unwrap();
    let guard = lock
        .try_lock_for(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("granted once the replica is back");
    assert_eq!(guard.replica_sync().map(|s| s.replicas), Some(1));
    // Then the failover: the one owner is A, and B sees it held.
    pair.fail_over().unwrap();
    let b = client(&pair.replica().url(), SYNC).await;
    assert!(b
        .lock("last-item")
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .is_none());
    drop(guard);
}

/// Every kind takes its grants through the one engine, so every kind is synced alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_is_synced_and_rolled_back_alike() {
    let pair = start_pair().await;
    let a = client(&pair.primary().url(), SYNC).await;
    let one = Some(1);
    let fair = a.fair_lock("fair").unwrap();
    let rw = a.rw_lock("rw").unwrap();
    let sem = a.semaphore("sem").unwrap();
    sem.set_permits(2).await.unwrap();
    {
        let f = fair.try_lock().await.unwrap().expect("free");
        let r = rw.read().try_lock().await.unwrap().expect("free");
        let p = sem.try_acquire(1).await.unwrap().expect("free");
        assert_eq!(f.replica_sync().map(|s| s.replicas), one);
        assert_eq!(r.replica_sync().map(|s| s.replicas), one);
        assert_eq!(p.replica_sync().map(|s| s.replicas), one);
        f.unlock().await.unwrap();
        r.unlock().await.unwrap();
        p.release().await.unwrap();
    }
    pair.cut().unwrap();
    assert!(matches!(
        fair.try_lock().await,
        Err(LockError::NotReplicated { .. })
    ));
    assert!(matches!(
        rw.write().try_lock().await,
        Err(LockError::NotReplicated { .. })
    ));
    assert!(matches!(
        sem.try_acquire(2).await,
        Err(LockError::NotReplicated { .. })
    ));
    // Each rolled back: free again on the primary.
    let deadline = Instant::now() + Duration::from_secs(10);
    let b = client(&pair.primary().url(), ReplicaSync::None).await;
    loop {
        let free = !b.fair_lock("fair").unwrap().is_locked().await.unwrap()
            && !b.rw_lock("rw").unwrap().write().is_locked().await.unwrap()
            && b.semaphore("sem")
                .unwrap()
                .available_permits()
                .await
                .unwrap()
                == 2;
        if free {
            break;
        }
        assert!(Instant::now() < deadline, "a grant was not rolled back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    pair.restore().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_never_failed_for_lack_of_replicas() {
    let pair = start_pair().await;
    let a = client(&pair.primary().url(), SYNC).await;
    let lock = a.lock("last-item").unwrap();
    let guard = lock.try_lock().await.unwrap().expect("free");
    pair.cut().unwrap();
    guard
        .unlock()
        .await
        .expect("the release ran on the primary: Ok, though no replica acknowledged it");
    assert!(!lock.is_locked().await.unwrap());
    pair.restore().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_the_replica_missed_does_not_extend_the_hold() {
    let pair = start_pair().await;
    let a = LockClient::builder(&pair.primary().url())
        .command_timeout(Duration::from_secs(2))
        // Renewals every second, each waiting up to SYNC's 1 s for the cut-off replica.
        .lease(Duration::from_secs(3))
        .replica_sync(SYNC)
        .build()
        .await
        .unwrap();
    let lock = a.lock("long-job").unwrap();
    let guard = lock.try_lock().await.unwrap().expect("free");
    pair.cut().unwrap();
    // Renewals run on the primary but never reach the replica: the guard is lost once the
    // deadline of its grant passes.
    tokio::time::timeout(Duration::from_secs(15), guard.lost())
        .await
        .expect("the hold is lost when no renewal reaches the replica");
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.watchdog_stats().errors == 0 {
        let stats = a.watchdog_stats();
        assert!(
            Instant::now() < deadline,
            "renewals counted as failed: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pair.restore().await.unwrap();
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_policies_are_refused_and_waitaof_needs_redis_7_2() {
    let server = RedisServer::start().unwrap();
    for policy in [
        ReplicaSync::Replicas {
            replicas: 0,
            timeout: Duration::from_millis(100),
        },
        ReplicaSync::Replicas {
            replicas: 1,
            timeout: Duration::ZERO,
        },
        ReplicaSync::Replicas {
            replicas: 1,
            timeout: Duration::from_secs(5),
        },
    ] {
        let built = LockClient::builder(&server.url())
            .replica_sync(policy)
            .build()
            .await;
        assert!(
            matches!(built, Err(LockError::InvalidArgument(_))),
            "{policy:?}: {built:?}"
        );
    }
    // A server without WAITAOF (before 7.2) is refused at build; on 7.2+ with no replica a
    // grant gets NotReplicated.
    let version = server.info("server").unwrap();
    let aof = LockClient::builder(&server.url())
        .command_timeout(Duration::from_secs(2))
        .replica_sync(ReplicaSync::Aof {
            local: false,
            replicas: 1,
            timeout: Duration::from_millis(100),
        })
        .build()
        .await;
    let has_waitaof = version
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .and_then(|v| {
            let mut parts = v.trim().split('.').map(|p| p.parse::<u32>().unwrap_or(0));
            Some((parts.next()?, parts.next()?))
        })
        .is_some_and(|v| v >= (7, 2));
    match aof {
        Err(LockError::InvalidArgument(message)) if !has_waitaof => {
            assert!(message.contains("WAITAOF"), "{message}")
        }
        Ok(client) if has_waitaof => {
            let lock = client.lock("aof").unwrap();
            assert!(matches!(
                lock.try_lock().await,
                Err(LockError::NotReplicated { .. })
            ));
        }
        other => panic!("WAITAOF support {has_waitaof}: {other:?}"),
    }
}

/// `HGET key field` on `server`, as an integer.
fn hget(server: &RedisServer, key: &str, field: &str) -> Option<i64> {
    server
        .command(&["HGET", key, field])
        .unwrap()
        .as_str()
        .map(|v| v.parse().expect("an integer"))
}

/// Under the policy a latch's count and its count-downs wait for the replica like a grant: once
/// the call returns, the replica has them. With the replica cut off the call says so
/// (`AppliedNotReplicated`): the change ran on the primary and stays there, it is not rolled
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latch_count_and_its_count_downs_wait_for_the_replica() {
    let pair = start_pair().await;
    let a = client(&pair.primary().url(), SYNC).await;
    let latch = a.latch("workers-ready").unwrap();
    let hash = a.lock("workers-ready").unwrap().keys().hash().to_string();
    let field = leasehold_core::protocol::LATCH_FIELD;
    assert!(latch.try_set_count(3).await.unwrap());
    assert_eq!(
        hget(pair.replica(), &hash, field),
        Some(3),
        "the count is on the replica"
    );
    assert_eq!(latch.count_down().await.unwrap(), 2);
    assert_eq!(
        hget(pair.replica(), &hash, field),
        Some(2),
        "the count-down is on the replica"
    );
    pair.cut().unwrap();
    match latch.count_down().await {
        Err(LockError::AppliedNotReplicated {
            replicas: 0,
            required: 1,
            ..
        }) => {}
        other => panic!("expected AppliedNotReplicated, got {other:?}"),
    }
    assert_eq!(
        latch.count().await.unwrap(),
        1,
        "the count-down stands on the primary"
    );
    let other = a.latch("never-replicated").unwrap();
    match other.try_set_count(2).await {
        Err(LockError::AppliedNotReplicated { .. }) => {}
        other => panic!("expected AppliedNotReplicated, got {other:?}"),
    }
    assert_eq!(other.count().await.unwrap(), 2, "set on the primary");
    pair.restore().await.unwrap();
}

/// A semaphore's number of permits is waited for alike: set, try-set, add and delete reach the
/// replica under the policy, and each reports a replica that did not get it in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_number_of_permits_waits_for_the_replica() {
    let pair = start_pair().await;
    let a = client(&pair.primary().url(), SYNC).await;
    let sem = a.semaphore("exports").unwrap();
    let hash = sem.keys().hash().to_string();
    let field = leasehold_core::protocol::PERMITS_FIELD;
    assert!(sem.try_set_permits(2).await.unwrap());
    assert_eq!(hget(pair.replica(), &hash, field), Some(2));
    sem.add_permits(1).await.unwrap();
    assert_eq!(hget(pair.replica(), &hash, field), Some(3));
    sem.set_permits(5).await.unwrap();
    assert_eq!(hget(pair.replica(), &hash, field), Some(5));
    pair.cut().unwrap();
    let short = |result: &leasehold::Result<()>| {
        matches!(
            result,
            Err(LockError::AppliedNotReplicated {
                replicas: 0,
                required: 1,
                ..
            })
        )
    };
    let added = sem.add_permits(1).await;
    assert!(short(&added), "add_permits: {added:?}");
    let set = sem.set_permits(4).await;
    assert!(short(&set), "set_permits: {set:?}");
    assert_eq!(sem.permits().await.unwrap(), 4, "applied on the primary");
    let other = a.semaphore("other").unwrap();
    let tried = other.try_set_permits(1).await.map(|_| ());
    assert!(short(&tried), "try_set_permits: {tried:?}");
    let deleted = sem.delete().await.map(|_| ());
    assert!(short(&deleted), "delete: {deleted:?}");
    assert_eq!(sem.permits().await.unwrap(), 0, "deleted on the primary");
    pair.restore().await.unwrap();
}

/// Under the policy an extended lease waits for the replica: once `extend` returns, the
/// replica has the new expiry. With the replica cut off it fails with `AppliedNotReplicated`
/// and the guard keeps its earlier deadline (a failover may lose the extension).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extended_lease_waits_for_the_replica() {
    let pair = start_pair().await;
    let a = client(&pair.primary().url(), SYNC).await;
    let lock = a.lock("extended").unwrap();
    let guard = lock
        .try_lock_with_lease(Duration::from_secs(30))
        .await
        .unwrap()
        .expect("free");
    guard.extend(Duration::from_secs(600)).await.unwrap();
    let ttl = pair
        .replica()
        .command(&["PTTL", "leasehold:{extended}"])
        .unwrap()
        .as_int()
        .unwrap();
    assert!(ttl > 500_000, "the replica's PTTL: {ttl} ms");
    let deadline = guard.valid_until();
    pair.cut().unwrap();
    match guard.extend(Duration::from_secs(1200)).await {
        Err(LockError::AppliedNotReplicated {
            replicas: 0,
            required: 1,
            ..
        }) => {}
        other => panic!("expected AppliedNotReplicated, got {other:?}"),
    }
    assert_eq!(guard.valid_until(), deadline, "the deadline did not move");
    assert!(guard.is_held());
    pair.restore().await.unwrap();
    guard.unlock().await.unwrap();
}
