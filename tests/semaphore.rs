//! The semaphore (`LockClient::semaphore`) with leased, owned, fenced permits, and the
//! count-down latch (`LockClient::latch`), against real redis-servers.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{client, client_with_lease, cmd, eventually, lock_keys, server, until_queued};
use leasehold::{LockClient, LockError};
use parking_lot::Mutex;
use tokio::time::Instant;

/// The semaphore's keys that may stay: its hash, which keeps the number of permits.
fn leftovers(redis: &leasehold_testkit::RedisServer, name: &str) -> Vec<String> {
    let hash = format!("leasehold:{{{name}}}");
    lock_keys(redis)
        .into_iter()
        .filter(|k| *k != hash)
        .collect()
}

/// The test: N permits, 5N contenders over several clients; never more than N hold
/// at once (the recorded intervals are checked), and everyone is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_n_at_once() {
    let redis = server();
    let url = redis.url();
    const N: usize = 3;
    let mut clients: Vec<LockClient> = Vec::new();
    for _ in 0..4 {
        clients.push(client(&url).await);
    }
    assert!(clients[0]
        .semaphore("exports")
        .unwrap()
        .try_set_permits(N as u32)
        .await
        .unwrap());
    let intervals = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 * N {
        let semaphore = clients[i % 4].semaphore("exports").unwrap();
        let intervals = intervals.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..3 {
                let permit = semaphore.acquire(1).await.unwrap();
                let start = Instant::now();
                tokio::time::sleep(Duration::from_millis(5)).await;
                let end = Instant::now();
                permit.release().await.unwrap();
                intervals.lock().push((start, end));
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("every contender is served")
            .unwrap();
    }
    let intervals = intervals.lock().clone();
    assert_eq!(intervals.len(), 5 * N * 3);
    // The most intervals overlapping at any start instant.
    let most = intervals
        .iter()
        .map(|(at, _)| intervals.iter().filter(|(s, e)| s <= at && at < e).count())
        .max()
        .unwrap();
    assert!(most <= N, "{most} holders at once with {N} permits");
    let semaphore = clients[0].semaphore("exports").unwrap();
    assert_eq!(semaphore.available_permits().await.unwrap(), N as i64);
    assert_eq!(leftovers(&redis, "exports"), Vec::<String>::new());
}

#[tokio::test]
async fn permits_have_ids_tokens_and_typed_errors() {
    let redis = server();
    let url = redis.url();
    let (a, b) = (client(&url).await, client(&url).await);
    let semaphore = a.semaphore("pool").unwrap();
    // Never set: nothing to take.
    assert!(semaphore.try_acquire(1).await.unwrap().is_none());
    assert!(semaphore.try_set_permits(3).await.unwrap());
    assert!(!semaphore.try_set_permits(5).await.unwrap(), "set once");
    assert_eq!(semaphore.permits().await.unwrap(), 3);
    let two = semaphore.try_acquire(2).await.unwrap().expect("two free");
    let one = semaphore.try_acquire(1).await.unwrap().expect("one free");
    assert!(semaphore.try_acquire(1).await.unwrap().is_none());
    assert_ne!(two.id(), one.id());
    assert!(one.fencing_token() > two.fencing_token());
    assert_eq!(
        (two.permits(), semaphore.available_permits().await.unwrap()),
        (2, 0)
    );
    // Released by id from another client.
    let other = b.semaphore("pool").unwrap();
    let id = two.id().to_string();
    std::mem::forget(two);
    other.release_permit(&id).await.unwrap();
    assert_eq!(semaphore.available_permits().await.unwrap(), 2);
    // Unknown and already released ids are typed errors.
    assert!(matches!(
        other.release_permit(&id).await,
        Err(LockError::NotHeld { .. })
    ));
    assert!(matches!(
        other.release_permit("nobody:o1").await,
        Err(LockError::NotHeld { .. })
    ));
    assert!(matches!(
        semaphore.try_acquire(0).await,
        Err(LockError::InvalidArgument(_))
    ));
    one.release().await.unwrap();
    assert_eq!(semaphore.available_permits().await.unwrap(), 3);
    assert!(semaphore.delete().await.unwrap());
    assert_eq!(lock_keys(&redis), Vec::<String>::new());
}

/// Changing the number of permits while permits are held: lowering it below what is taken
/// makes new acquisitions wait until enough come back; raising it wakes waiters.
#[tokio::test]
async fn changing_the_number_of_permits_while_they_are_held() {
    let redis = server();
    let url = redis.url();
    let (a, b) = (client(&url).await, client(&url).await);
    let semaphore = a.semaphore("workers").unwrap();
    semaphore.set_permits(2).await.unwrap();
    let p1 = semaphore.acquire(1).await.unwrap();
    let p2 = semaphore.acquire(1).await.unwrap();
    semaphore.set_permits(1).await.unwrap();
    assert_eq!(semaphore.available_permits().await.unwrap(), -1);
    let waiter = {
        let semaphore = b.semaphore("workers").unwrap();
        tokio::spawn(async move { semaphore.acquire(1).await.map(|p| p.id().to_string()) })
    };
    until_queued(&redis, &semaphore.keys().waiters(), 1).await;
    p1.release().await.unwrap();
    // Still none free (one permit, one taken).
    assert_eq!(semaphore.available_permits().await.unwrap(), 0);
    assert!(!waiter.is_finished());
    // Raising the number wakes the waiter at once.
    semaphore.add_permits(1).await.unwrap();
    let id = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken by the new permit")
        .unwrap()
        .unwrap();
    assert!(!id.is_empty());
    p2.release().await.unwrap();
}

/// Waiting is fair: a holder that releases and asks again at once lines up behind the waiter
/// that was already queued.
#[tokio::test]
async fn a_releaser_asking_again_does_not_jump_the_line() {
    let redis = server();
    let url = redis.url();
    let (a, b) = (client(&url).await, client(&url).await);
    let semaphore = a.semaphore("one").unwrap();
    semaphore.set_permits(1).await.unwrap();
    let permit = semaphore.acquire(1).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let waiter = {
        let semaphore = b.semaphore("one").unwrap();
        let order = order.clone();
        tokio::spawn(async move {
            let permit = semaphore.acquire(1).await.unwrap();
            order.lock().push("waiter");
            tokio::time::sleep(Duration::from_millis(20)).await;
            permit.release().await.unwrap();
        })
    };
    until_queued(&redis, &semaphore.keys().waiters(), 1).await;
    permit.release().await.unwrap();
    let again = semaphore.acquire(1).await.unwrap();
    order.lock().push("releaser");
    again.release().await.unwrap();
    waiter.await.unwrap();
    assert_eq!(*order.lock(), vec!["waiter", "releaser"]);
}

/// A large request at the head is not overtaken by small ones.
#[tokio::test]
async fn a_large_request_first_in_line_is_served_first() {
    let redis = server();
    let url = redis.url();
    let (a, b, c) = (client(&url).await, client(&url).await, client(&url).await);
    let semaphore = a.semaphore("big").unwrap();
    semaphore.set_permits(3).await.unwrap();
    let held = semaphore.acquire(2).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let big = {
        let semaphore = b.semaphore("big").unwrap();
        let order = order.clone();
        tokio::spawn(async move {
            let permit = semaphore.acquire(3).await.unwrap();
            order.lock().push("big");
            permit.release().await.unwrap();
        })
    };
    until_queued(&redis, &semaphore.keys().waiters(), 1).await;
    // One permit is free, but the big request is first: a small one waits behind it.
    let small = c.semaphore("big").unwrap();
    assert!(small.try_acquire(1).await.unwrap().is_none());
    let small_task = {
        let order = order.clone();
        tokio::spawn(async move {
            let permit = small.acquire(1).await.unwrap();
            order.lock().push("small");
            permit.release().await.unwrap();
        })
    };
    until_queued(&redis, &semaphore.keys().waiters(), 2).await;
    held.release().await.unwrap();
    big.await.unwrap();
    small_task.await.unwrap();
    assert_eq!(*order.lock(), vec!["big", "small"]);
}

/// A SIGKILLed holder's permit returns to the pool when its lease ends, and a waiter gets it
/// within a bound; meanwhile the watchdog keeps a live holder's permit past three leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_permit_returns_and_a_live_one_is_renewed() {
    let redis = server();
    let url = redis.url();
    let lease = Duration::from_millis(1500);
    let a = client_with_lease(&url, lease).await;
    let semaphore = a.semaphore("slots").unwrap();
    semaphore.set_permits(2).await.unwrap();
    let child = common::spawn_permit_holder(&redis, "slots", lease);
    let mine = semaphore.acquire(1).await.unwrap();
    let b = client_with_lease(&url, lease).await;
    let waiter = {
        let semaphore = b.semaphore("slots").unwrap();
        tokio::spawn(async move {
            let permit = semaphore.acquire(1).await.unwrap();
            let at = Instant::now();
            permit.release().await.unwrap();
            at
        })
    };
    until_queued(&redis, &semaphore.keys().waiters(), 1).await;
    child.kill().unwrap();
    let killed = Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the waiter gets the dead holder's permit")
        .unwrap();
    // The dead permit's lease ends at most one lease after its last renewal; generous slack.
    assert!(
        got - killed < lease + Duration::from_secs(2),
        "the waiter got the permit {:?} after the kill",
        got - killed
    );
    // Three leases of holding: renewed all along.
    tokio::time::sleep(lease * 3).await;
    assert!(mine.is_held());
    assert!(a.watchdog_stats().renewed >= 3, "{:?}", a.watchdog_stats());
    mine.release().await.unwrap();
    assert_eq!(semaphore.available_permits().await.unwrap(), 2);
    assert_eq!(leftovers(&redis, "slots"), Vec::<String>::new());
}

/// An explicit lease is never renewed: the permit returns when it ends, and its guard knows.
#[tokio::test]
async fn an_explicit_lease_ends_and_the_permit_is_lost() {
    let redis = server();
    let a = client(&redis.url()).await;
    let semaphore = a.semaphore("short").unwrap();
    semaphore.set_permits(1).await.unwrap();
    let permit = semaphore
        .acquire_with_lease(1, Duration::from_millis(300))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), permit.lost())
        .await
        .expect("the permit's lease ends");
    let next = semaphore
        .try_acquire_for(1, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the permit came back");
    assert!(matches!(
        permit.release().await,
        Err(LockError::NotHeld { .. })
    ));
    next.release().await.unwrap();
}

/// Cancel safety: acquisitions dropped at their first await (before the send, or in flight)
/// and waits cancelled in line leave no permit taken and no entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquisitions_leave_nothing_behind() {
    let redis = server();
    let url = redis.url();
    let (a, b) = (client(&url).await, client(&url).await);
    let semaphore = a.semaphore("cancel").unwrap();
    semaphore.set_permits(2).await.unwrap();
    for _ in 0..30 {
        let attempt = semaphore.try_acquire(1);
        let _ = tokio::time::timeout(Duration::from_micros(1), attempt).await;
    }
    assert!(
        eventually(Duration::from_secs(10), || cmd(
            &redis,
            &["HGET", semaphore.keys().hash(), "~used"]
        )
        .as_str()
        .is_none_or(|used| used == "0"))
        .await,
        "permits left taken"
    );
    let held = semaphore.acquire(2).await.unwrap();
    let other = b.semaphore("cancel").unwrap();
    let waiting = tokio::spawn(async move { other.acquire(1).await.map(|_| ()) });
    until_queued(&redis, &semaphore.keys().waiters(), 1).await;
    waiting.abort();
    let _ = waiting.await;
    until_queued(&redis, &semaphore.keys().waiters(), 0).await;
    held.release().await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || leftovers(&redis, "cancel")
            .is_empty())
        .await,
        "left behind: {:?}",
        leftovers(&redis, "cancel")
    );
    assert_eq!(semaphore.available_permits().await.unwrap(), 2);
}

/// A live waiter keeps the permits the line granted it for as long as it cannot take them (its
/// link slow past the command timeout, its entry's renewals still reaching Redis): the waiter
/// behind does not get them first. As the fair lock's
/// `a_live_waiter_keeps_a_grant_it_cannot_take_yet`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_waiter_keeps_permits_it_cannot_take_yet() {
    let redis = server();
    let name = "sem:kept-grant";
    let lease = Duration::from_millis(1500);
    let holder = client(&redis.url()).await;
    let semaphore = holder.semaphore(name).unwrap();
    assert!(semaphore.try_set_permits(1).await.unwrap());
    let permit = semaphore.acquire(1).await.unwrap();
    let (proxy, slow) = common::slow_client_with_lease(&redis, lease).await;
    let order = common::Order::default();
    let head = order.spawn("head", {
        let semaphore = slow.semaphore(name).unwrap();
        async move { semaphore.acquire(1).await }
    });
    let waiters = semaphore.keys().waiters();
    until_queued(&redis, &waiters, 1).await;
    let fast = client_with_lease(&redis.url(), lease).await;
    let behind = order.spawn("behind", {
        let semaphore = fast.semaphore(name).unwrap();
        async move { semaphore.acquire(1).await }
    });
    until_queued(&redis, &waiters, 2).await;
    common::until_head_renewed_twice(&redis, semaphore.keys()).await;
    proxy.set_latency(Duration::from_millis(400));
    permit.release().await.unwrap();
    common::served_in_turn_after_a_slow_spell(&order, &proxy, lease, head, behind).await;
}

/// The latch: several clients count down; waiters on every client go when it reaches zero.
#[tokio::test]
async fn a_latch_opens_for_every_waiter() {
    let redis = server();
    let url = redis.url();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(client(&url).await);
    }
    let latch = clients[0].latch("ready").unwrap();
    assert!(latch.try_set_count(3).await.unwrap());
    assert!(!latch.try_set_count(5).await.unwrap());
    let opened = Arc::new(AtomicUsize::new(0));
    let mut waiters = Vec::new();
    for i in 0..6 {
        let latch = clients[i % 3].latch("ready").unwrap();
        let opened = opened.clone();
        waiters.push(tokio::spawn(async move {
            latch.wait().await.unwrap();
            opened.fetch_add(1, Ordering::SeqCst);
        }));
    }
    assert!(!latch.wait_for(Duration::from_millis(100)).await.unwrap());
    for (i, client) in clients.iter().enumerate() {
        let left = client.latch("ready").unwrap().count_down().await.unwrap();
        assert_eq!(left, 2 - i as u64);
    }
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("every waiter goes")
            .unwrap();
    }
    assert_eq!(opened.load(Ordering::SeqCst), 6);
    assert_eq!(latch.count().await.unwrap(), 0);
    assert_eq!(
        latch.count_down().await.unwrap(),
        0,
        "an open latch stays open"
    );
    assert!(latch.wait_for(Duration::ZERO).await.unwrap());
    assert_eq!(lock_keys(&redis), Vec::<String>::new());
}

/// The count-down that opens a latch names the round it opened: every waiter of that round,
/// on every client, goes on the message alone, without reading the latch again. A herd would
/// cost one read per waiter (each local line's head looks, then each next one when it becomes
/// head); the bound leaves room for a head's once-a-second look (kept in case a message is
/// lost) falling in the moment the latch opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latch_opening_costs_its_waiters_no_read() {
    let redis = server();
    let url = redis.url();
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(&url).await);
    }
    let latch = clients[0].latch("opened").unwrap();
    assert!(latch.try_set_count(1).await.unwrap());
    let waiters_per_client = 2;
    let mut waiters = Vec::new();
    for client in &clients {
        for _ in 0..waiters_per_client {
            let latch = client.latch("opened").unwrap();
            waiters.push(tokio::spawn(async move { latch.wait().await }));
        }
    }
    let subscribed = || {
        cmd(&redis, &["PUBSUB", "NUMSUB", "leasehold:{opened}:released"])
            .as_array()
            .unwrap()[1]
            .as_int()
    };
    assert!(
        eventually(Duration::from_secs(10), || clients
            .iter()
            .all(|c| c.waiters() == waiters_per_client)
            && subscribed() == Some(clients.len() as i64))
        .await,
        "every waiter waits, every client subscribed"
    );
    let reads = || redis.command_calls("hmget").unwrap();
    let before = reads();
    assert_eq!(latch.count_down().await.unwrap(), 0);
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("every waiter goes")
            .unwrap()
            .unwrap();
    }
    let after = reads() - before;
    let herd = (clients.len() * waiters_per_client) as u64;
    assert!(
        after < herd / 2,
        "{after} reads of the latch after it opened (a herd costs {herd})"
    );
}

/// A waiter whose opening message is lost (its subscriber connection killed just before the
/// count reaches zero) still goes: the reconnect wakes it, and the timer looks again anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latch_waiter_that_missed_the_message_still_goes() {
    let redis = server();
    let url = redis.url();
    let (a, b) = (client(&url).await, client(&url).await);
    let latch = a.latch("lost").unwrap();
    latch.try_set_count(1).await.unwrap();
    let waiter = {
        let latch = b.latch("lost").unwrap();
        tokio::spawn(async move { latch.wait().await })
    };
    assert!(
        eventually(Duration::from_secs(10), || b.waiters() == 1
            && common::cmd(
                &redis,
                &["PUBSUB", "NUMSUB", "leasehold:{lost}:released"]
            )
            .as_array()
            .unwrap()[1]
                .as_int()
                == Some(1))
        .await
    );
    cmd(&redis, &["CLIENT", "KILL", "TYPE", "pubsub"]);
    let opened_at = Instant::now();
    assert_eq!(latch.count_down().await.unwrap(), 0);
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter goes without the message")
        .unwrap()
        .unwrap();
    assert!(opened_at.elapsed() < Duration::from_secs(5));
}

#[test]
fn child_holder_entry_point() {
    common::run_child_holder_if_asked();
}

/// force_unlock through a lock handle on a semaphore's or a latch's name refuses to delete
/// it (it would drop the number of permits, or open the latch).
#[tokio::test]
async fn force_unlock_leaves_semaphores_and_latches_alone() {
    let redis = server();
    let a = client(&redis.url()).await;
    let semaphore = a.semaphore("pool").unwrap();
    semaphore.set_permits(2).await.unwrap();
    let permit = semaphore.acquire(1).await.unwrap();
    assert!(matches!(
        a.lock("pool").unwrap().force_unlock().await,
        Err(LockError::WrongKind { held_as, .. }) if held_as == "semaphore"
    ));
    let latch = a.latch("gate").unwrap();
    latch.try_set_count(1).await.unwrap();
    assert!(matches!(
        a.lock("gate").unwrap().force_unlock().await,
        Err(LockError::WrongKind { held_as, .. }) if held_as == "count-down latch"
    ));
    assert_eq!(latch.count().await.unwrap(), 1);
    assert_eq!(semaphore.available_permits().await.unwrap(), 1);
    permit.release().await.unwrap();
}

/// A semaphore's number of permits is exact over its whole range (0 to `u32::MAX`), and a
/// change that would leave it is refused with `InvalidArgument` before anything changes (the
/// number is not rounded, nor stored as a double that later reads cannot parse).
#[tokio::test]
async fn permit_counts_are_exact_over_their_range_or_refused() {
    let redis = server();
    let client = client(&redis.url()).await;
    let semaphore = client.semaphore("sem:range").unwrap();
    semaphore.set_permits(u32::MAX).await.unwrap();
    assert_eq!(semaphore.permits().await.unwrap(), u64::from(u32::MAX));
    assert_eq!(
        semaphore.available_permits().await.unwrap(),
        i64::from(u32::MAX)
    );
    let permit = semaphore
        .try_acquire(3)
        .await
        .unwrap()
        .expect("there are plenty");
    assert_eq!(
        semaphore.available_permits().await.unwrap(),
        i64::from(u32::MAX) - 3
    );
    permit.release().await.unwrap();
    for refused in [1, i64::MAX, i64::MIN, i64::from(u32::MAX) + 1] {
        assert!(
            matches!(
                semaphore.add_permits(refused).await,
                Err(LockError::InvalidArgument(_))
            ),
            "adding {refused} to {} permits",
            u32::MAX
        );
        assert_eq!(semaphore.permits().await.unwrap(), u64::from(u32::MAX));
    }
    semaphore.set_permits(1).await.unwrap();
    assert!(matches!(
        semaphore.add_permits(-2).await,
        Err(LockError::InvalidArgument(_))
    ));
    assert!(matches!(
        semaphore.add_permits(i64::MAX).await,
        Err(LockError::InvalidArgument(_))
    ));
    assert_eq!(semaphore.permits().await.unwrap(), 1);
    semaphore.add_permits(-1).await.unwrap();
    assert_eq!(semaphore.permits().await.unwrap(), 0);
    semaphore.add_permits(i64::from(u32::MAX)).await.unwrap();
    assert_eq!(semaphore.permits().await.unwrap(), u64::from(u32::MAX));
    // The stored number is the decimal integer itself.
    assert_eq!(
        cmd(&redis, &["HGET", semaphore.keys().hash(), "~permits"]).as_str(),
        Some(u32::MAX.to_string())
    );
}

/// A read/write or fair acquire on a semaphore's name is refused with `WrongKind` and changes
/// nothing: before, a read try was granted, its prune dropped an expired permit's fields
/// without giving the permit back (it leaked for good) and put a TTL on the semaphore's hash,
/// and a fair waiter put an entry into the semaphore's line that its watchdog kept alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_kinds_acquire_on_a_semaphores_name_is_refused_and_changes_nothing() {
    let redis = server();
    let client = client(&redis.url()).await;
    let name = "sem:shared-name";
    let semaphore = client.semaphore(name).unwrap();
    semaphore.set_permits(2).await.unwrap();
    // An expired permit not given back yet, and a live one.
    let expired = semaphore
        .acquire_with_lease(1, Duration::from_millis(50))
        .await
        .unwrap();
    let live = semaphore.acquire(1).await.unwrap();
    expired.lost().await;
    let hash = semaphore.keys().hash().to_string();
    let before = common::snapshot(&redis, name);

    let rw = client.rw_lock(name).unwrap();
    let fair = client.fair_lock(name).unwrap();
    let plain = client.lock(name).unwrap();
    for refused in [
        rw.read().try_lock().await.map(|g| g.is_some()),
        rw.write().try_lock().await.map(|g| g.is_some()),
        rw.read()
            .try_lock_for(Duration::from_millis(200))
            .await
            .map(|g| g.is_some()),
        fair.try_lock_for(Duration::from_millis(200))
            .await
            .map(|g| g.is_some()),
        plain
            .try_lock_for(Duration::from_millis(200))
            .await
            .map(|g| g.is_some()),
        plain.try_lock().await.map(|g| g.is_some()),
    ] {
        assert!(
            matches!(
                &refused,
                Err(LockError::WrongKind { name: n, held_as, .. })
                    if n == name && held_as == "semaphore"
            ),
            "{refused:?}"
        );
    }
    assert_eq!(common::snapshot(&redis, name), before, "nothing changed");
    assert_eq!(
        common::pttl(&redis, &hash),
        -1,
        "the semaphore's hash has no TTL"
    );
    assert_eq!(
        client.watchdog_stats().holds,
        1,
        "only the live permit is renewed"
    );
    drop(live);
    // The expired permit comes back: both can be taken.
    let both = semaphore
        .try_acquire_for(2, Duration::from_secs(10))
        .await
        .unwrap()
        .expect("both permits are free");
    both.release().await.unwrap();
}

/// A latch waiter of round k goes when round k opens, even when round k + 1 starts at once and
/// the count the woken waiter reads is the new round's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latch_waiter_opens_when_the_next_round_starts_at_once() {
    let redis = server();
    // The waiter's messages come late, so that the next round is set before it looks.
    let proxy = leasehold_testkit::Proxy::start(redis.addr()).await.unwrap();
    let waiting = client(&proxy.url()).await;
    let counting = client(&redis.url()).await;
    let latch = counting.latch("latch:rounds").unwrap();
    assert!(latch.try_set_count(1).await.unwrap());
    let waiter = {
        let latch = waiting.latch("latch:rounds").unwrap();
        tokio::spawn(async move { latch.wait_for(Duration::from_secs(4)).await })
    };
    assert!(
        eventually(Duration::from_secs(10), || waiting.subscribed_channels()
            == 1)
        .await,
        "the waiter subscribed"
    );
    proxy.set_latency(Duration::from_millis(50));
    assert_eq!(latch.count_down().await.unwrap(), 0);
    assert!(
        latch.try_set_count(1).await.unwrap(),
        "the next round starts"
    );
    assert!(
        waiter.await.unwrap().unwrap(),
        "the waiter of the first round went"
    );
    assert_eq!(
        latch.count().await.unwrap(),
        1,
        "the next round is counting"
    );
}

/// A latch waiter queued behind another waiter of its client goes when the round it began in
/// opens, though the next round is counting by the time its own first look reaches Redis (it
/// heads its client's line only after the waiter before it went).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latch_waiter_behind_another_remembers_the_round_it_began_in() {
    let redis = server();
    let proxy = leasehold_testkit::Proxy::start(redis.addr()).await.unwrap();
    let waiting = client(&proxy.url()).await;
    let counting = client(&redis.url()).await;
    let latch = counting.latch("latch:queued").unwrap();
    assert!(latch.try_set_count(1).await.unwrap());
    let wait = |timeout| {
        let latch = waiting.latch("latch:queued").unwrap();
        tokio::spawn(async move { latch.wait_for(timeout).await })
    };
    let first = wait(Duration::from_secs(30));
    assert!(
        eventually(Duration::from_secs(10), || waiting.subscribed_channels()
            == 1)
        .await,
        "the first waiter subscribed"
    );
    let second = wait(Duration::from_secs(4));
    assert!(
        eventually(Duration::from_secs(10), || waiting.waiters() == 2).await,
        "the second waiter is in line"
    );
    // The waiters' messages and looks come late, so the next round is set before they look.
    proxy.set_latency(Duration::from_millis(50));
    assert_eq!(latch.count_down().await.unwrap(), 0);
    assert!(
        latch.try_set_count(1).await.unwrap(),
        "the next round starts"
    );
    assert!(first.await.unwrap().unwrap(), "the first waiter went");
    assert!(
        second.await.unwrap().unwrap(),
        "the waiter behind it went too: its round opened while it waited"
    );
}

/// Latch counts are 1 to `u32::MAX`, exact; a latch call on another kind's name is refused.
#[tokio::test]
async fn latch_counts_are_exact_and_other_kinds_names_refused() {
    let redis = server();
    let client = client(&redis.url()).await;
    let latch = client.latch("latch:big").unwrap();
    assert!(latch.try_set_count(u32::MAX).await.unwrap());
    assert_eq!(latch.count().await.unwrap(), u64::from(u32::MAX));
    assert_eq!(latch.count_down().await.unwrap(), u64::from(u32::MAX) - 1);
    let semaphore = client.semaphore("latch:big").unwrap();
    assert!(matches!(
        semaphore.set_permits(1).await,
        Err(LockError::WrongKind { .. })
    ));
    let other = client.semaphore("sem:not-a-latch").unwrap();
    other.set_permits(1).await.unwrap();
    let wrong = client.latch("sem:not-a-latch").unwrap();
    for refused in [
        wrong.try_set_count(1).await.map(|_| 0),
        wrong.count_down().await,
        wrong.count().await,
    ] {
        assert!(
            matches!(&refused, Err(LockError::WrongKind { held_as, asked_as, .. })
                if held_as == "semaphore" && asked_as == "count-down latch"),
            "{refused:?}"
        );
    }
    assert!(matches!(
        wrong.wait_for(Duration::from_millis(100)).await,
        Err(LockError::WrongKind { .. })
    ));
}

/// A large request at the head of a semaphore's line whose grant reply is lost keeps its place:
/// the settle that gives its permits back puts it first in line again, and the small request
/// behind it does not take a permit first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_request_whose_grant_reply_is_lost_keeps_its_place() {
    let redis = server();
    let name = "sem:lost-reply";
    let holder = client(&redis.url()).await;
    let semaphore = holder.semaphore(name).unwrap();
    semaphore.set_permits(2).await.unwrap();
    let all = semaphore.acquire(2).await.unwrap();
    let (proxy, slow) = common::slow_client(&redis).await;
    let order = common::Order::default();
    let head = order.spawn("head", {
        let semaphore = slow.semaphore(name).unwrap();
        async move { semaphore.acquire(2).await }
    });
    let waiters = format!("{}:waiters", semaphore.keys().hash());
    until_queued(&redis, &waiters, 1).await;
    let fast = client(&redis.url()).await;
    let behind = order.spawn("behind", {
        let semaphore = fast.semaphore(name).unwrap();
        async move { semaphore.acquire(1).await }
    });
    until_queued(&redis, &waiters, 2).await;
    proxy.set_latency(common::LATE_REPLY);
    all.release().await.unwrap();
    let hash = semaphore.keys().hash().to_string();
    let used = || cmd(&redis, &["HGET", &hash, "~used"]).as_str();
    common::came_and_went(|| used().as_deref() == Some("2")).await;
    order.settle_a_while().await;
    proxy.set_latency(Duration::ZERO);
    head.await.unwrap();
    behind.await.unwrap();
    assert_eq!(order.served(), ["head", "behind"]);
}

/// A permit with an explicit lease extends it (its score in the leases zset moves, the permit's
/// deadline with it); a watched permit is refused; permits of a deleted semaphore are lost.
#[tokio::test]
async fn extending_a_permits_lease_moves_its_expiry_in_redis_and_locally() {
    let redis = server();
    let client = client(&redis.url()).await;
    let semaphore = client.semaphore("sem-extended").unwrap();
    semaphore.try_set_permits(3).await.unwrap();
    let leases = semaphore.keys().leases();
    let permit = semaphore
        .acquire_with_lease(2, Duration::from_secs(5))
        .await
        .unwrap();
    permit.extend(Duration::from_secs(600)).await.unwrap();
    let member = format!(
        "{}{}",
        leasehold_core::protocol::READ_FIELD_PREFIX,
        permit.id()
    );
    let ahead = common::zscore_ahead_ms(&redis, &leases, &member).expect("the permit");
    assert!(ahead > 500_000, "the permit ends in {ahead} ms");
    assert!(permit.valid_until() > Instant::now() + Duration::from_secs(500));
    assert_eq!(semaphore.available_permits().await.unwrap(), 1);

    let watched = semaphore.acquire(1).await.unwrap();
    assert!(matches!(
        watched.extend(Duration::from_secs(60)).await,
        Err(LockError::InvalidArgument(_))
    ));
    watched.release().await.unwrap();

    assert!(semaphore.delete().await.unwrap());
    assert!(matches!(
        permit.extend(Duration::from_secs(600)).await,
        Err(LockError::LeaseLost { .. })
    ));
    assert!(!permit.is_held());
    assert_eq!(permit.lost_reason(), Some(leasehold::LostReason::Gone));
}

/// A release hands its permits to the waiters at the head and tells only them: eight clients
/// wait for the semaphore's one permit, and each release grants the first of them with one
/// message on that acquisition's own channel, which names it. A herd (a message every waiter
/// hears) or a "look again" followed by a try fails here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_handoff_costs_one_message_to_one_waiter() {
    let redis = server();
    let name = "sem:one-message";
    let messages = common::Messages::watch(&redis, name).await;
    let holder = client(&redis.url()).await;
    let semaphore = holder.semaphore(name).unwrap();
    semaphore.set_permits(1).await.unwrap();
    let held = semaphore.acquire(1).await.unwrap();
    let mut waiters = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let waiter = client(&redis.url()).await;
        let semaphore = waiter.semaphore(name).unwrap();
        tasks.push(tokio::spawn(async move {
            let permit = semaphore.acquire(1).await.unwrap();
            let id = permit.id().to_string();
            permit.release().await.unwrap();
            id
        }));
        waiters.push(waiter);
    }
    let line = format!("{}:waiters", semaphore.keys().hash());
    until_queued(&redis, &line, 8).await;
    held.release().await.unwrap();
    let mut ids = Vec::new();
    for task in tasks {
        let id = tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("every waiter is served")
            .unwrap();
        ids.push(id);
    }
    assert!(
        eventually(Duration::from_secs(10), || messages.seen().len() >= 8).await,
        "{:#?}",
        messages.seen()
    );
    let seen = messages.seen();
    assert_eq!(seen.len(), 8, "one message per handoff: {seen:#?}");
    let prefix = format!("leasehold:{{{name}}}:released:");
    for id in &ids {
        let channel = format!("{prefix}{id}");
        let to_it: Vec<_> = seen.iter().filter(|(c, _)| *c == channel).collect();
        assert_eq!(to_it.len(), 1, "one message to {channel}: {seen:#?}");
        assert!(
            to_it[0].1.starts_with('=') && to_it[0].1.ends_with(&format!(":{id}")),
            "a grant to it: {to_it:?}"
        );
    }
    assert_eq!(leftovers(&redis, name), Vec::<String>::new());
}

/// A waiter that gave up before it heard of the permits a release granted it hands them on
/// when it leaves: the waiter behind gets them at once. One that crashed instead (no leave)
/// keeps them no longer than its entry would have kept its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_granted_to_a_waiter_that_gave_up_pass_on() {
    use leasehold_core::commands::{self, Acquire, AcquireMode};

    let redis = server();
    let holder = client(&redis.url()).await;
    let other = client(&redis.url()).await;
    let scripts = common::scripts();
    for (name, crash) in [("sem:gave-up", false), ("sem:crashed", true)] {
        let semaphore = holder.semaphore(name).unwrap();
        semaphore.set_permits(2).await.unwrap();
        let keys = semaphore.keys().clone();
        let held = semaphore.acquire(2).await.unwrap();
        // The first waiter is driven by hand (as the engine sends its tries), with an entry
        // that lives 2 s unless renewed.
        let gone = other.new_owner();
        let life = leasehold::Lease::new(Duration::from_secs(2)).unwrap();
        let mode = AcquireMode::Waiter {
            entry_life: life,
            non_reentrant: false,
            fixed_lease: false,
        };
        let tried = commands::acquire_permits(other.redis(), &scripts, &keys, &gone, life, mode, 2)
            .await
            .unwrap();
        assert!(matches!(tried, Acquire::Held { .. }), "{tried:?}");
        let waiter = client(&redis.url()).await;
        let behind = {
            let semaphore = waiter.semaphore(name).unwrap();
            tokio::spawn(async move {
                semaphore
                    .try_acquire_for(1, Duration::from_secs(20))
                    .await
                    .unwrap()
            })
        };
        let line = format!("{}:waiters", keys.hash());
        until_queued(&redis, &line, 2).await;
        held.release().await.unwrap();
        let hash = keys.hash().to_string();
        let member = format!(
            "{}{}",
            leasehold_core::protocol::READ_FIELD_PREFIX,
            gone.id()
        );
        assert_eq!(common::hget(&redis, &hash, &member), Some(2), "granted");
        let ahead = common::zscore_ahead_ms(&redis, &keys.leases(), &member).expect("a lease");
        assert!(
            ahead > 0 && ahead <= 2_000,
            "the grant lasts as long as the entry would have: {ahead} ms"
        );
        if !crash {
            commands::leave_line(other.redis(), &scripts, &keys, &gone, None, None)
                .await
                .unwrap();
            assert_eq!(
                common::hget(&redis, &hash, &member),
                None,
                "the leave passed the grant on"
            );
        }
        let got = behind.await.unwrap();
        got.expect("the waiter behind gets a permit")
            .release()
            .await
            .unwrap();
        let mine = format!("leasehold:{{{name}}}");
        let left: Vec<String> = leftovers(&redis, name)
            .into_iter()
            .filter(|key| key.starts_with(&mine))
            .collect();
        assert_eq!(left, Vec::<String>::new());
    }
}

/// A semaphore waiter's try whose reply is lost queues it; a release then grants it its
/// permits before the settle of that try reaches Redis. The grant is the line's, not the try's:
/// the settle leaves it, the waiter takes it, and the waiter behind does not get in first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_grant_the_line_made_outlives_the_settle_of_the_waiters_unanswered_try() {
    let redis = server();
    let name = "sem:line-grant-settled";
    let holder = client(&redis.url()).await;
    let semaphore = holder.semaphore(name).unwrap();
    semaphore.set_permits(1).await.unwrap();
    let held = semaphore.acquire(1).await.unwrap();
    let (proxy, slow) = common::slow_client(&redis).await;
    // Far past the slow client's command timeout: the try reaches Redis after it timed out,
    // and its settle (sent on the same connection) only this long after the try.
    proxy.set_latency(Duration::from_millis(1500));
    let order = common::Order::default();
    let head = order.spawn("head", {
        let semaphore = slow.semaphore(name).unwrap();
        async move { semaphore.acquire(1).await }
    });
    let waiters = format!("{}:waiters", semaphore.keys().hash());
    until_queued(&redis, &waiters, 1).await;
    let fast = client(&redis.url()).await;
    let behind = order.spawn("behind", {
        let semaphore = fast.semaphore(name).unwrap();
        async move { semaphore.acquire(1).await }
    });
    until_queued(&redis, &waiters, 2).await;
    held.release().await.unwrap();
    let hash = semaphore.keys().hash().to_string();
    let marked = cmd(&redis, &["HKEYS", &hash])
        .as_array()
        .unwrap_or_default()
        .iter()
        .filter_map(|f| f.as_str())
        .any(|f| f.starts_with(leasehold_core::protocol::GRANTED_FIELD));
    assert!(marked, "the release granted the waiter in line");
    proxy.set_latency(Duration::ZERO);
    head.await.unwrap();
    behind.await.unwrap();
    assert_eq!(order.served(), ["head", "behind"]);
}
