//! Lease renewal and lost-lease detection against real redis-servers.

mod common;

use std::time::Duration;

use common::{client_with_lease, exists, pttl, server};
use leasehold::{LockClient, LockError};
use tokio::time::Instant;

const LEASE: Duration = Duration::from_millis(1500);

/// A job holding the lock for 3x the lease keeps it: nobody else gets in, and the key's TTL
/// never drops under lease/3 while held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_longer_than_the_lease_keeps_the_lock() {
    // A longer lease than the other tests: the PTTL floor below (lease/3) then leaves a whole
    // second of slack for a renewal delayed by a busy machine.
    const LEASE: Duration = Duration::from_secs(3);
    let redis = server();
    let holder = client_with_lease(&redis.url(), LEASE).await;
    let other = common::client(&redis.url()).await;
    let guard_lock = holder.lock("long-job").unwrap();
    let guard = guard_lock.lock().await.unwrap();
    let until = Instant::now() + LEASE * 3;
    let mut samples = 0;
    let mut min_pttl = i64::MAX;
    while Instant::now() < until {
        let ttl = pttl(&redis, "leasehold:{long-job}");
        min_pttl = min_pttl.min(ttl);
        samples += 1;
        assert!(
            other
                .lock("long-job")
                .unwrap()
                .try_lock()
                .await
                .unwrap()
                .is_none(),
            "another client got in while the job ran"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(samples > 20);
    assert!(
        min_pttl > (LEASE / 3).as_millis() as i64,
        "PTTL fell to {min_pttl} ms (lease/3 = {} ms)",
        (LEASE / 3).as_millis()
    );
    assert!(guard.is_held());
    assert!(
        holder.watchdog_stats().renewed >= 6,
        "{:?}",
        holder.watchdog_stats()
    );
    guard.unlock().await.unwrap();
    let calls = holder.watchdog_stats().renew_calls;
    tokio::time::sleep(LEASE).await; // a whole lease without a renewal tick firing
    assert_eq!(
        holder.watchdog_stats().renew_calls,
        calls,
        "no zombie renewal after unlock"
    );
    assert_eq!(holder.watchdog_stats().holds, 0);
}

/// A watched hold re-entered with a longer explicit lease keeps that lease: renewals of the
/// watched hold never shorten the key's TTL below what the explicit guard was promised.
#[tokio::test]
async fn renewals_never_shorten_a_longer_explicit_reentry() {
    let redis = server();
    let client = client_with_lease(&redis.url(), LEASE).await;
    let lock = client.lock("mixed").unwrap();
    let watched = lock.lock().await.unwrap();
    let explicit = lock
        .lock_with_lease(Duration::from_secs(600))
        .await
        .unwrap();
    assert_eq!(explicit.hold_count(), 2);
    let renewed = client.watchdog_stats().renewed;
    assert!(
        common::eventually(Duration::from_secs(30), || client.watchdog_stats().renewed
            > renewed)
        .await,
        "the watched hold was renewed"
    );
    let ttl = pttl(&redis, "leasehold:{mixed}");
    assert!(
        ttl > 60_000,
        "a renewal cut the 10 min explicit lease to {ttl} ms"
    );
    explicit.unlock().await.unwrap();
    watched.unlock().await.unwrap();
}

#[tokio::test]
async fn an_explicit_lease_is_never_renewed() {
    let redis = server();
    let client = client_with_lease(&redis.url(), Duration::from_millis(300)).await;
    let guard_lock = client.lock("fixed").unwrap();
    let guard = guard_lock
        .try_lock_with_lease(Duration::from_millis(400))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(client.watchdog_stats().holds, 0);
    guard.lost().await; // the local deadline passes
    assert!(!guard.is_held());
    assert!(
        common::eventually(Duration::from_secs(5), || !exists(
            &redis,
            "leasehold:{fixed}"
        ))
        .await
    );
    assert_eq!(client.watchdog_stats().renew_calls, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_is_noticed_within_one_renewal_period() {
    let redis = server();
    let holder = client_with_lease(&redis.url(), LEASE).await;
    let operator = common::client(&redis.url()).await;
    let guard_lock = holder.lock("forced").unwrap();
    let guard = guard_lock.lock().await.unwrap();
    assert!(operator
        .lock("forced")
        .unwrap()
        .force_unlock()
        .await
        .unwrap());
    // One renewal period, with slack for a busy machine.
    tokio::time::timeout(LEASE / 3 + Duration::from_secs(2), guard.lost())
        .await
        .expect("the next renewal found the lock gone");
    assert!(!guard.is_held());
    assert!(matches!(
        guard.unlock().await,
        Err(LockError::NotHeld { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_under_the_lease_is_cancelled_when_it_is_lost() {
    let redis = server();
    let holder = client_with_lease(&redis.url(), LEASE).await;
    let guard_lock = holder.lock("cancel-work").unwrap();
    let guard = guard_lock.lock().await.unwrap();
    let lock = holder.lock("cancel-work").unwrap();
    let forcer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        lock.force_unlock().await.unwrap();
    });
    let result = guard.run_while_held(std::future::pending::<()>()).await;
    assert!(
        matches!(result, Err(LockError::LeaseLost { .. })),
        "{result:?}"
    );
    forcer.await.unwrap();
    // Finished work returns its value while the lease holds.
    let guard_lock = holder.lock("cancel-work").unwrap();
    let guard = guard_lock.lock().await.unwrap();
    assert_eq!(guard.run_while_held(async { 7 }).await.unwrap(), 7);
    guard.unlock().await.unwrap();
}

/// Redis stops answering (SIGSTOP) for longer than the lease: the holder cannot know whether
/// its lease survived, so `is_held()` turns false at the local deadline without any reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_makes_the_hold_lost_by_the_local_deadline() {
    let redis = server();
    let holder = LockClient::builder(&redis.url())
        .lease(LEASE)
        .command_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let guard_lock = holder.lock("paused").unwrap();
    let guard = guard_lock.lock().await.unwrap();
    let deadline = guard.valid_until();
    redis.pause().unwrap();
    tokio::time::timeout(LEASE + Duration::from_secs(3), guard.lost())
        .await
        .expect("lost by the local deadline");
    assert!(
        Instant::now() >= deadline,
        "not declared lost before the deadline"
    );
    assert!(!guard.is_held());
    redis.resume().unwrap();
    drop(guard);
}

/// Renewal errors (connection killed) are retried; the hold survives a short outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_errors_are_retried() {
    let redis = server();
    let proxy = leasehold_testkit::Proxy::start(redis.addr()).await.unwrap();
    let holder = LockClient::builder(&proxy.url())
        .lease(Duration::from_secs(3))
        .command_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let guard_lock = holder.lock("outage").unwrap();
    let guard = guard_lock.lock().await.unwrap();
    // Slow the link past the command timeout for a while: renewals in that window time out.
    proxy.set_latency(Duration::from_millis(600));
    assert!(
        common::eventually(Duration::from_secs(10), || holder.watchdog_stats().errors
            >= 1)
        .await,
        "a renewal failed"
    );
    proxy.set_latency(Duration::ZERO);
    let renewed = holder.watchdog_stats().renewed;
    assert!(
        common::eventually(Duration::from_secs(10), || holder.watchdog_stats().renewed
            > renewed)
        .await,
        "renewal resumed: {:?}",
        holder.watchdog_stats()
    );
    assert!(guard.is_held(), "a short outage does not lose the hold");
    guard.unlock().await.unwrap();
}

/// Entry point of the holder child process (see waiting.rs); a no-op as a plain test.
#[test]
fn child_holder_entry_point() {
    common::run_child_holder_if_asked();
}

/// A SIGKILLed holder stops renewing: its key expires within one lease. No immortal locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_lock_expires_within_the_lease() {
    let redis = server();
    let child = common::spawn_holder(&redis, "mortal", LEASE);
    // Wait for the child's first renewal (its second script call after the acquire), so the
    // test shows that renewal stops with the process.
    assert!(
        common::eventually(Duration::from_secs(10), || redis
            .command_calls("evalsha")
            .unwrap()
            >= 2)
        .await,
        "the holder renewed"
    );
    child.kill().unwrap();
    // Within one lease of the kill, with slack for a busy machine (one bound, in one place).
    assert!(
        common::eventually(LEASE + Duration::from_secs(3), || !exists(
            &redis,
            "leasehold:{mortal}"
        ))
        .await,
        "the key outlived its lease"
    );
}

/// With `max_hold`, the watchdog stops renewing a hold once it was held that long: the lease
/// runs out in Redis, `lost()` fires, and the guard says why. Permits are capped alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_stops_renewals_and_lost_fires() {
    const MAX_HOLD: Duration = Duration::from_secs(2);
    let redis = server();
    let client = LockClient::builder(&redis.url())
        .lease(LEASE)
        .max_hold(MAX_HOLD)
        .build()
        .await
        .unwrap();
    let semaphore = client.semaphore("capped-pool").unwrap();
    semaphore.try_set_permits(1).await.unwrap();
    let lock = client.lock("capped").unwrap();
    let started = Instant::now();
    let guard = lock.lock().await.unwrap();
    let permit = semaphore.acquire(1).await.unwrap();
    tokio::time::timeout(MAX_HOLD + LEASE + Duration::from_secs(20), async {
        guard.lost().await;
        permit.lost().await;
    })
    .await
    .expect("both lapse after max_hold");
    assert!(
        started.elapsed() >= MAX_HOLD,
        "renewed for at least max_hold"
    );
    assert!(
        client.watchdog_stats().renewed > 0,
        "renewed before the cap"
    );
    assert_eq!(guard.lost_reason(), Some(leasehold::LostReason::MaxHold));
    assert_eq!(permit.lost_reason(), Some(leasehold::LostReason::MaxHold));
    assert!(
        common::eventually(Duration::from_secs(10), || !exists(
            &redis,
            "leasehold:{capped}"
        ))
        .await,
        "the hold lapsed in Redis"
    );
    assert!(matches!(
        guard.run_while_held(async {}).await,
        Err(LockError::LeaseLost { .. })
    ));
    let calls = client.watchdog_stats().renew_calls;
    tokio::time::sleep(LEASE).await; // a whole lease: no renewal tick for either
    assert_eq!(client.watchdog_stats().renew_calls, calls);
    // The next hold gets a clock of its own.
    let other = common::client(&redis.url()).await;
    let next_lock = other.lock("capped").unwrap();
    let next = next_lock.try_lock().await.unwrap().expect("free again");
    next.unlock().await.unwrap();
}

/// A `max_hold` out of range is refused at build.
#[tokio::test]
async fn an_out_of_range_max_hold_is_refused() {
    let redis = server();
    for max_hold in [
        Duration::ZERO,
        leasehold::MAX_LEASE + Duration::from_millis(1),
    ] {
        let built = LockClient::builder(&redis.url())
            .max_hold(max_hold)
            .build()
            .await;
        assert!(
            matches!(&built, Err(LockError::InvalidArgument(m)) if m.contains("max_hold")),
            "{max_hold:?}: {built:?}"
        );
    }
}
