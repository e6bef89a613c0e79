//! The non-reentrant lock (`Lock::non_reentrant`): an owner's second acquire waits for its
//! first hold to end instead of re-entering it, against a real redis-server.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{client, hget, lock_keys, scripts, server};
use leasehold_core::commands::{self, Acquire, AcquireMode};
use leasehold_core::Lease;
use tokio::time::Instant;

/// The reason the kind exists: two futures joined in one task are one owner. Through the
/// reentrant lock both would be inside at once; here they take turns, each with its own grant.
#[tokio::test]
async fn joined_futures_in_one_task_take_turns() {
    let redis = server();
    let client = client(&redis.url()).await;
    let lock = client.lock("stock:last-item").unwrap().non_reentrant();
    let inside = AtomicUsize::new(0);
    let sell = || async {
        let guard = lock.lock().await.unwrap();
        assert_eq!(
            inside.fetch_add(1, Ordering::SeqCst),
            0,
            "two futures inside at once"
        );
        assert_eq!(guard.hold_count(), 1);
        let token = guard.fencing_token();
        let entered = Instant::now();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            guard.is_held(),
            "the other future must not have replaced this grant"
        );
        inside.fetch_sub(1, Ordering::SeqCst);
        guard.unlock().await.unwrap();
        (token, entered)
    };
    let (a, b) = tokio::join!(sell(), sell());
    let (first, second) = if a.1 < b.1 { (a, b) } else { (b, a) };
    assert!(
        second.0 > first.0,
        "the second future got a new grant with a higher token"
    );
    assert_eq!(lock_keys(&redis), Vec::<String>::new());
}

#[tokio::test]
async fn try_lock_is_refused_while_the_owner_holds_it() {
    let redis = server();
    let client = client(&redis.url()).await;
    let lock = client.lock("report").unwrap().non_reentrant();
    assert!(!lock.is_reentrant());
    let guard = lock.lock().await.unwrap();
    assert!(lock.try_lock().await.unwrap().is_none());
    assert_eq!(
        hget(&redis, lock.keys().hash(), &lock.owner().to_string()),
        Some(1)
    );
    let first = guard.fencing_token();
    guard.unlock().await.unwrap();
    let again = lock.try_lock().await.unwrap().expect("free again");
    assert!(again.fencing_token() > first);
    assert_eq!(again.hold_count(), 1);
}

/// A bounded wait on one's own hold ends at its deadline with `None`, and changes nothing.
#[tokio::test]
async fn a_bounded_wait_on_its_own_hold_times_out_and_changes_nothing() {
    let redis = server();
    let client = client(&redis.url()).await;
    let lock = client.lock("migration").unwrap().non_reentrant();
    let guard = lock.lock().await.unwrap();
    let waited = lock.try_lock_for(Duration::from_millis(300)).await.unwrap();
    assert!(waited.is_none());
    assert!(guard.is_held());
    assert_eq!(
        hget(&redis, lock.keys().hash(), &lock.owner().to_string()),
        Some(1)
    );
    guard.unlock().await.unwrap();
    assert_eq!(lock_keys(&redis), Vec::<String>::new());
}

/// A cancelled wait leaves nothing behind: no hold, no queue entry.
#[tokio::test]
async fn a_cancelled_wait_leaves_nothing_behind() {
    let redis = server();
    let client = client(&redis.url()).await;
    let lock = client.lock("cancelled").unwrap().non_reentrant();
    let guard = lock.lock().await.unwrap();
    let cancelled = tokio::time::timeout(Duration::from_millis(200), lock.lock()).await;
    assert!(cancelled.is_err(), "waits on its own hold");
    guard.unlock().await.unwrap();
    let clean = common::eventually(Duration::from_secs(5), || lock_keys(&redis).is_empty()).await;
    assert!(clean, "left behind: {:?}", lock_keys(&redis));
}

/// An explicit owner shared by two tasks: the second task waits for the first's hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_owner_waits_across_tasks() {
    let redis = server();
    let client = client(&redis.url()).await;
    let owner = client.new_owner();
    let lock = client
        .lock("ledger")
        .unwrap()
        .with_owner(owner)
        .non_reentrant();
    let guard = lock.lock().await.unwrap().detach();
    let second = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            let token = guard.fencing_token();
            guard.unlock().await.unwrap();
            token
        })
    };
    // The second task cannot get in while the first hold lives.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!second.is_finished());
    let first = guard.fencing_token();
    guard.unlock().await.unwrap();
    let token = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the second task gets the lock after the release")
        .unwrap();
    assert!(token > first);
}

/// Many futures of one task, some waiting and some trying, never overlap and never replace
/// each other's grant.
#[tokio::test]
async fn many_futures_of_one_task_never_overlap() {
    let redis = server();
    let client = client(&redis.url()).await;
    let lock = client.lock("counter").unwrap().non_reentrant();
    let inside = AtomicUsize::new(0);
    let entries = AtomicUsize::new(0);
    let worker = |n: usize| {
        let (lock, inside, entries) = (&lock, &inside, &entries);
        async move {
            for i in 0..20 {
                let guard = if (n + i).is_multiple_of(3) {
                    match lock.try_lock().await.unwrap() {
                        Some(guard) => guard,
                        None => continue,
                    }
                } else {
                    lock.lock().await.unwrap()
                };
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                entries.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
                assert!(guard.is_held());
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.unlock().await.unwrap();
            }
        }
    };
    futures::future::join_all((0..5).map(worker)).await;
    assert!(entries.load(Ordering::SeqCst) >= 5 * 20 * 2 / 3);
    assert_eq!(lock_keys(&redis), Vec::<String>::new());
}

/// Contention from another client works as for the plain lock.
#[tokio::test]
async fn waits_for_another_clients_hold() {
    let redis = server();
    let holder = client(&redis.url()).await;
    let waiter = client(&redis.url()).await;
    let held = holder.lock("shared").unwrap();
    let guard = held.lock().await.unwrap();
    let lock = waiter.lock("shared").unwrap().non_reentrant();
    let wait = tokio::spawn(async move {
        lock.try_lock_for(Duration::from_secs(10))
            .await
            .unwrap()
            .map(|g| g.detach())
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    guard.unlock().await.unwrap();
    let got = wait.await.unwrap().expect("acquired after the release");
    got.unlock().await.unwrap();
}

/// The script itself refuses a second grant to one owner in non-reentrant mode, where a plain
/// try replaces the hold as an orphan: the guarantee does not rest on the client's checks.
#[tokio::test]
async fn the_script_never_grants_one_owner_twice() {
    let redis = server();
    let client = client(&redis.url()).await;
    let keys = client.lock("raw").unwrap().keys().clone();
    let owner = client.new_owner();
    let scripts = scripts();
    let lease = Lease::new(Duration::from_secs(10)).unwrap();
    let acquire = |mode| commands::acquire(client.redis(), &scripts, &keys, &owner, lease, mode);
    let first = acquire(AcquireMode::Try).await.unwrap();
    assert!(matches!(first, Acquire::Granted { hold_count: 1, .. }));
    for mode in [
        AcquireMode::NonReentrant,
        AcquireMode::Waiter {
            entry_life: lease,
            non_reentrant: true,
            fixed_lease: false,
        },
    ] {
        let refused = acquire(mode).await.unwrap();
        assert!(
            matches!(refused, Acquire::Held { ttl: Some(_), .. }),
            "{mode:?}: {refused:?}"
        );
    }
    // The plain try treats the same hold as an orphan of a lost reply and replaces it.
    let replaced = acquire(AcquireMode::Try).await.unwrap();
    assert!(matches!(replaced, Acquire::Granted { hold_count: 1, .. }));
}

/// Every kind with a non-reentrant handle keeps the script's promise: an owner's hold (one the
/// client no longer knows of, or another future's) is never replaced by a non-reentrant try or
/// wait of the same owner; the answer is busy until that hold ends. The read/write lock's
/// scripts used to ignore the flag and replace the hold as an orphan.
#[tokio::test]
async fn no_kinds_script_grants_a_non_reentrant_owner_twice() {
    let redis = server();
    let client = client(&redis.url()).await;
    let scripts = scripts();
    let lease = Lease::new(Duration::from_secs(10)).unwrap();
    let reads = client.rw_lock("raw:rw-read").unwrap();
    let writes = client.rw_lock("raw:rw-write").unwrap();
    let fair = client.fair_lock("raw:fair").unwrap();
    for keys in [reads.read().keys(), writes.write().keys(), fair.keys()] {
        let owner = client.new_owner();
        let acquire = |mode| commands::acquire(client.redis(), &scripts, keys, &owner, lease, mode);
        let first = acquire(AcquireMode::Try).await.unwrap();
        let Acquire::Granted { fence, .. } = first else {
            panic!("{keys:?}: {first:?}");
        };
        for mode in [
            AcquireMode::NonReentrant,
            AcquireMode::Waiter {
                entry_life: lease,
                non_reentrant: true,
                fixed_lease: false,
            },
        ] {
            let refused = acquire(mode).await.unwrap();
            assert!(
                matches!(refused, Acquire::Held { .. }),
                "{:?} {mode:?}: {refused:?}",
                keys.kind()
            );
        }
        // The first grant is intact: its re-entry still works.
        let again = acquire(AcquireMode::Reenter(fence)).await.unwrap();
        assert!(
            matches!(again, Acquire::Granted { hold_count: 2, fence: f } if f == fence),
            "{:?}: {again:?}",
            keys.kind()
        );
    }
}

/// A read/write lock's non-reentrant handles: two futures of one task take turns on each side,
/// each with a grant of its own.
#[tokio::test]
async fn joined_futures_take_turns_on_both_sides_of_a_read_write_lock() {
    let redis = server();
    let client = client(&redis.url()).await;
    let rw = client.rw_lock("rw:non-reentrant").unwrap();
    for side in [
        rw.read().clone().non_reentrant(),
        rw.write().clone().non_reentrant(),
    ] {
        let inside = AtomicUsize::new(0);
        let take = || async {
            let guard = side.lock().await.unwrap();
            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "one at a time");
            assert_eq!(guard.hold_count(), 1);
            tokio::time::sleep(Duration::from_millis(20)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            let token = guard.fencing_token();
            guard.unlock().await.unwrap();
            token
        };
        let (a, b) = tokio::join!(take(), take());
        assert_ne!(a, b, "two grants");
    }
    assert!(lock_keys(&redis).is_empty(), "{:?}", lock_keys(&redis));
}

/// A non-reentrant hold extends like a reentrant one: its expiry in Redis and its deadline
/// move, and the owner's second acquire still waits for it.
#[tokio::test]
async fn a_non_reentrant_hold_extends_and_still_excludes_its_owner() {
    let redis = server();
    let client = client(&redis.url()).await;
    let lock = client.lock("nr-extended").unwrap().non_reentrant();
    let guard = lock.lock_with_lease(Duration::from_secs(5)).await.unwrap();
    guard.extend(Duration::from_secs(600)).await.unwrap();
    let ttl = common::pttl(&redis, "leasehold:{nr-extended}");
    assert!(ttl > 500_000, "PTTL {ttl} ms");
    assert!(guard.valid_until() > Instant::now() + Duration::from_secs(500));
    assert!(lock.try_lock().await.unwrap().is_none(), "no re-entry");
    guard.unlock().await.unwrap();
    assert!(lock.try_lock().await.unwrap().is_some());
}
