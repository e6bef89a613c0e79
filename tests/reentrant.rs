//! The reentrant lock core against a real redis-server: exclusion, ownership, reentrancy,
//! fencing, leases, release on drop, script reloading and bad input.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{client, cmd, exists, hget, server};
use leasehold::{LockClient, LockError, MAX_LEASE, MAX_NAME_LEN};
use tokio::sync::Barrier;

/// The seed's first test: 20 concurrent try_locks on one name, exactly one succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_try_locks_exactly_one_wins() {
    let redis = server();
    let client = client(&redis.url()).await;
    let barrier = Arc::new(Barrier::new(20));
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let lock = client.lock("lock:concurrent").unwrap();
        let barrier = barrier.clone();
        // Each spawned task is its own owner.
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            lock.try_lock().await.expect("try_lock").map(|g| g.detach())
        }));
    }
    let mut guards = Vec::new();
    for task in tasks {
        if let Some(guard) = task.await.unwrap() {
            guards.push(guard);
        }
    }
    assert_eq!(
        guards.len(),
        1,
        "exactly one of 20 concurrent try_locks wins"
    );
    assert_eq!(guards[0].hold_count(), 1);
}

/// The same across 20 separate clients (as 20 pods would be).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_clients_exactly_one_wins() {
    let redis = server();
    let barrier = Arc::new(Barrier::new(20));
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let url = redis.url();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let client = LockClient::connect(&url).await.unwrap();
            barrier.wait().await;
            let guard_lock = client.lock("lock:pods").unwrap();
            let guard = guard_lock.try_lock().await.unwrap();
            (client, guard.map(|g| g.detach()))
        }));
    }
    // Every result is kept until all tasks are done: a winner's guard dropped early would free
    // the lock for a task whose try had not run yet (a race in the test, not the lock).
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    let won = results.iter().filter(|(_, guard)| guard.is_some()).count();
    assert_eq!(won, 1);
}

/// The seed's second test: unlock with a wrong owner keeps the lock; the right owner frees it.
#[tokio::test]
async fn wrong_owner_cannot_unlock() {
    let redis = server();
    let owner_client = client(&redis.url()).await;
    let other_client = client(&redis.url()).await;
    let guard_lock = owner_client.lock("lock:owner").unwrap();
    let guard = guard_lock.try_lock().await.unwrap().unwrap();
    let key = "leasehold:{lock:owner}";

    // Another client's owner, and a made-up owner id on the owner's own client.
    let stranger = other_client.lock("lock:owner").unwrap();
    assert!(matches!(
        stranger.unlock().await,
        Err(LockError::NotHeld { .. })
    ));
    let guessed_lock = owner_client.lock("lock:owner").unwrap();
    let guessed = guessed_lock.with_owner(leasehold::Owner::from_id("not-my-token"));
    assert!(matches!(
        guessed.unlock().await,
        Err(LockError::NotHeld { .. })
    ));
    assert!(exists(&redis, key), "the lock is kept");
    assert_eq!(
        hget(&redis, key, guard.owner().id()),
        Some(1),
        "hold count untouched"
    );

    guard.unlock().await.unwrap();
    assert!(!exists(&redis, key), "the right owner frees it");
}

#[tokio::test]
async fn reentrancy_counts_holds() {
    let redis = server();
    let client = client(&redis.url()).await;
    let other = common::client(&redis.url()).await;
    let lock = client.lock("nested").unwrap();
    let key = "leasehold:{nested}";

    let outer = lock.lock().await.unwrap();
    let inner = lock.lock().await.unwrap();
    let innermost = lock.try_lock().await.unwrap().expect("same task re-enters");
    assert_eq!(
        (
            outer.hold_count(),
            inner.hold_count(),
            innermost.hold_count()
        ),
        (1, 2, 3)
    );
    assert_eq!(
        outer.fencing_token(),
        inner.fencing_token(),
        "re-entry keeps the token"
    );
    assert_eq!(outer.fencing_token(), innermost.fencing_token());
    assert_eq!(hget(&redis, key, outer.owner().id()), Some(3));
    assert_eq!(lock.hold_count().await.unwrap(), 3);

    innermost.unlock().await.unwrap();
    inner.unlock().await.unwrap();
    assert_eq!(hget(&redis, key, outer.owner().id()), Some(1));
    assert!(
        other
            .lock("nested")
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .is_none(),
        "still held after 2 of 3 releases"
    );
    outer.unlock().await.unwrap();
    assert!(!exists(&redis, key));
    assert!(other
        .lock("nested")
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_are_distinct_owners_by_default() {
    let redis = server();
    let client = client(&redis.url()).await;
    let guard_lock = client.lock("per-task").unwrap();
    let guard = guard_lock.try_lock().await.unwrap().unwrap();
    let lock = client.lock("per-task").unwrap();
    let other_task = tokio::spawn(async move { lock.try_lock().await.unwrap().is_some() });
    assert!(!other_task.await.unwrap(), "another task does not re-enter");
    guard.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_owner_is_shared_across_tasks_and_guards_release_anywhere() {
    let redis = server();
    let client = client(&redis.url()).await;
    let owner = client.new_owner();
    let lock_lock = client.lock("shared").unwrap();
    let lock = lock_lock.with_owner(owner.clone());
    let first = lock.try_lock().await.unwrap().unwrap().detach();
    let lock2 = lock.clone();
    let second = tokio::spawn(async move { lock2.try_lock().await.unwrap().map(|g| g.detach()) })
        .await
        .unwrap()
        .expect("same explicit owner re-enters from another task");
    assert_eq!(second.hold_count(), 2);
    assert_eq!(second.owner(), &owner);
    // Release both from tasks other than the ones that acquired.
    tokio::spawn(async move { first.unlock().await })
        .await
        .unwrap()
        .unwrap();
    tokio::spawn(async move { second.unlock().await })
        .await
        .unwrap()
        .unwrap();
    assert!(!exists(&redis, "leasehold:{shared}"));
    // Two explicit owners in one task exclude each other.
    let a_lock = client.lock("shared").unwrap();
    let a = a_lock.with_owner(client.new_owner());
    let b_lock = client.lock("shared").unwrap();
    let b = b_lock.with_owner(client.new_owner());
    let held = a.try_lock().await.unwrap().unwrap();
    assert!(b.try_lock().await.unwrap().is_none());
    held.unlock().await.unwrap();
}

#[tokio::test]
async fn double_unlock_and_expired_unlock_are_not_held() {
    let redis = server();
    let client = client(&redis.url()).await;
    let lock = client.lock("once").unwrap();
    let guard = lock.try_lock().await.unwrap().unwrap();
    guard.unlock().await.unwrap();
    assert!(
        matches!(lock.unlock().await, Err(LockError::NotHeld { .. })),
        "double unlock"
    );

    let short = lock
        .try_lock_with_lease(Duration::from_millis(50))
        .await
        .unwrap()
        .unwrap();
    assert!(
        common::eventually(Duration::from_secs(5), || !exists(
            &redis,
            "leasehold:{once}"
        ))
        .await
    );
    assert!(!short.is_held(), "the guard knows its fixed lease ended");
    assert!(matches!(
        short.unlock().await,
        Err(LockError::NotHeld { .. })
    ));
}

#[tokio::test]
async fn fencing_tokens_strictly_increase_even_after_data_loss() {
    let redis = server();
    let client = client(&redis.url()).await;
    let lock = client.lock("fenced").unwrap();
    let mut last = 0u64;
    for _ in 0..5 {
        let guard = lock.try_lock().await.unwrap().unwrap();
        let token = guard.fencing_token().get();
        assert!(token > last, "{token} > {last}");
        let again = lock.try_lock().await.unwrap().unwrap();
        assert_eq!(
            again.fencing_token().get(),
            token,
            "re-entry keeps the token"
        );
        again.unlock().await.unwrap();
        guard.unlock().await.unwrap();
        last = token;
    }
    // A counter far in the future must still be respected (stored + 1), digit for digit, and a
    // re-entry reads the same token back from the hash.
    let fence = lock.keys().fence().to_string();
    cmd(&redis, &["SET", &fence, "9000000000000000"]);
    let guard = lock.try_lock().await.unwrap().unwrap();
    assert_eq!(guard.fencing_token().get(), 9_000_000_000_000_001);
    let again = lock.try_lock().await.unwrap().unwrap();
    assert_eq!(again.fencing_token().get(), 9_000_000_000_000_001);
    again.unlock().await.unwrap();
    guard.unlock().await.unwrap();
    cmd(&redis, &["SET", &fence, &last.to_string()]);
    // The counter is one key for every lock of a Cluster slot: a name of the same slot (by its
    // hash tag) continues from it, and a released lock leaves no key of its own behind.
    let other = client.lock("{fenced}:too").unwrap();
    assert_eq!(other.keys().fence(), fence);
    let guard = other.try_lock().await.unwrap().unwrap();
    assert!(guard.fencing_token().get() > last);
    guard.unlock().await.unwrap();
    assert_eq!(
        common::keys(&redis, "leasehold:*"),
        vec![fence.clone()],
        "only the slot's fencing counter stays"
    );

    // Restart without persistence: every key is gone, the token still rises (server time floor).
    redis.restart().expect("restart");
    let fresh = common::client(&redis.url()).await;
    let guard_lock = fresh.lock("fenced").unwrap();
    let guard = guard_lock.try_lock().await.unwrap().unwrap();
    assert!(
        guard.fencing_token().get() > last,
        "token rose across data loss"
    );
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn fixed_lease_expiry_frees_the_lock() {
    let redis = server();
    let holder = client(&redis.url()).await;
    let other = common::client(&redis.url()).await;
    let guard_lock = holder.lock("lease").unwrap();
    let guard = guard_lock
        .try_lock_with_lease(Duration::from_secs(2))
        .await
        .unwrap()
        .unwrap();
    let pttl = cmd(&redis, &["PTTL", "leasehold:{lease}"])
        .as_int()
        .unwrap();
    assert!(
        pttl > 0 && pttl <= 2_000,
        "PEXPIRE set to the lease: {pttl}"
    );
    let waited_lock = other.lock("lease").unwrap();
    let waited = waited_lock
        .try_lock_for(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("acquired once the lease ended");
    assert!(!guard.is_held());
    waited.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_guard_releases_in_the_background() {
    let redis = server();
    let client = client(&redis.url()).await;
    let guard_lock = client.lock("dropped").unwrap();
    let guard = guard_lock.try_lock().await.unwrap().unwrap();
    assert!(exists(&redis, "leasehold:{dropped}"));
    drop(guard);
    assert!(
        common::eventually(Duration::from_secs(5), || !exists(
            &redis,
            "leasehold:{dropped}"
        ))
        .await,
        "drop released the lock"
    );
    assert_eq!(client.watchdog_stats().holds, 0, "and stopped its renewal");
}

#[tokio::test]
async fn scripts_are_reloaded_after_noscript() {
    let redis = server();
    let client = client(&redis.url()).await;
    let lock = client.lock("flushed").unwrap();
    let guard = lock.try_lock().await.unwrap().unwrap();
    assert_eq!(
        cmd(&redis, &["SCRIPT", "FLUSH"]).as_str().as_deref(),
        Some("OK")
    );
    guard.unlock().await.unwrap(); // release script: NOSCRIPT, loaded, sent again
    cmd(&redis, &["SCRIPT", "FLUSH"]);
    let guard = lock.try_lock().await.unwrap().expect("acquire after flush");
    assert_eq!(guard.hold_count(), 1, "the reloaded acquire ran once");
    guard.unlock().await.unwrap();
    assert!(!exists(&redis, "leasehold:{flushed}"));
}

#[tokio::test]
async fn bad_input_gets_typed_errors() {
    let redis = server();
    let client = client(&redis.url()).await;
    for name in ["", "a}b", "{}x", "line\nbreak"] {
        assert!(
            matches!(client.lock(name), Err(LockError::InvalidArgument(_))),
            "name {name:?}"
        );
    }
    assert!(matches!(
        client.lock(&"n".repeat(MAX_NAME_LEN + 1)),
        Err(LockError::InvalidArgument(_))
    ));
    let lock = client.lock("ok").unwrap();
    for lease in [
        Duration::ZERO,
        Duration::from_micros(10),
        MAX_LEASE + Duration::from_secs(1),
    ] {
        assert!(
            matches!(
                lock.try_lock_with_lease(lease).await,
                Err(LockError::InvalidArgument(_))
            ),
            "lease {lease:?}"
        );
    }
    assert!(matches!(
        LockClient::builder(&redis.url())
            .prefix("has{brace")
            .build()
            .await,
        Err(LockError::InvalidArgument(_))
    ));
    assert!(matches!(
        LockClient::builder(&redis.url())
            .lease(Duration::ZERO)
            .build()
            .await,
        Err(LockError::InvalidArgument(_))
    ));
    assert!(matches!(
        LockClient::connect("not a url").await,
        Err(LockError::InvalidArgument(_))
    ));
    assert!(common::keys(&redis, "*").is_empty(), "nothing was written");
}

#[tokio::test]
async fn wrong_type_keys_are_reported_not_clobbered() {
    let redis = server();
    let client = client(&redis.url()).await;
    cmd(
        &redis,
        &["SET", "leasehold:{taken}", "someone else's string"],
    );
    let lock = client.lock("taken").unwrap();
    assert!(matches!(
        lock.try_lock().await,
        Err(LockError::WrongType { .. })
    ));
    assert!(matches!(
        lock.unlock().await,
        Err(LockError::WrongType { .. })
    ));
    assert!(matches!(
        lock.force_unlock().await,
        Err(LockError::WrongType { .. })
    ));
    assert!(matches!(
        lock.try_lock_for(Duration::from_millis(100)).await,
        Err(LockError::WrongType { .. })
    ));
    assert_eq!(
        cmd(&redis, &["GET", "leasehold:{taken}"])
            .as_str()
            .as_deref(),
        Some("someone else's string")
    );
    // A fence key of the wrong type is refused too, and the lock is not granted.
    let lock = client.lock("fence-taken").unwrap();
    let fence = lock.keys().fence().to_string();
    cmd(&redis, &["DEL", &fence]);
    cmd(&redis, &["LPUSH", &fence, "x"]);
    assert!(matches!(
        lock.try_lock().await,
        Err(LockError::WrongType { .. })
    ));
    assert!(!exists(&redis, "leasehold:{fence-taken}"));
}

#[tokio::test]
async fn redis_down_at_connect_is_a_clear_connection_error() {
    // A port that was free a moment ago and has nothing listening.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = std::time::Instant::now();
    let error = LockClient::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .expect_err("nothing listens there");
    assert!(matches!(error, LockError::Connection(_)), "{error:?}");
    assert!(error.to_string().contains("cannot connect"), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "fails fast, does not hang"
    );
}

/// A release whose reply is lost on a dying connection must not be resent: a resent release
/// would take a second hold away. Commands go out once (fred max_command_attempts = 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_reply_was_lost_is_not_resent() {
    let redis = server();
    let proxy = leasehold_testkit::Proxy::start(redis.addr()).await.unwrap();
    let client = client(&proxy.url()).await;
    let lock = client.lock("lost-reply").unwrap();
    let outer = lock.try_lock().await.unwrap().unwrap();
    let inner = lock.try_lock().await.unwrap().unwrap();
    assert_eq!(
        hget(&redis, "leasehold:{lost-reply}", outer.owner().id()),
        Some(2)
    );

    proxy.drop_replies(1);
    let result = inner.unlock().await;
    assert!(
        matches!(
            result,
            Err(LockError::Connection(_)) | Err(LockError::Timeout)
        ),
        "the caller learns the outcome is unknown: {result:?}"
    );
    // Give a (wrong) resend every chance to happen: wait until the client reconnected and
    // answers again, then look.
    assert!(common::locked_once_answering(&lock).await);
    assert_eq!(
        hget(&redis, "leasehold:{lost-reply}", outer.owner().id()),
        Some(1),
        "the release ran exactly once"
    );
    outer.unlock().await.unwrap();
    assert!(!exists(&redis, "leasehold:{lost-reply}"));
}

/// An acquire whose reply is lost is undone: no hold is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_reply_was_lost_is_rolled_back() {
    let redis = server();
    let proxy = leasehold_testkit::Proxy::start(redis.addr()).await.unwrap();
    let client = client(&proxy.url()).await;
    let lock = client.lock("lost-acquire").unwrap();
    proxy.drop_replies(1);
    let result = lock.try_lock().await;
    assert!(
        result.as_ref().is_err_and(LockError::is_transient),
        "{result:?}"
    );
    assert!(
        common::eventually(Duration::from_secs(10), || !exists(
            &redis,
            "leasehold:{lost-acquire}"
        ))
        .await,
        "the unanswered acquire was rolled back"
    );
    let guard = lock.try_lock().await.unwrap().expect("free again");
    assert_eq!(guard.hold_count(), 1);
    guard.unlock().await.unwrap();
}

/// A waiter that took its grant from the release's message (no try: the grant's mark is still
/// in Redis) re-enters, and the re-entry's reply is lost. Its settle takes the re-entry back,
/// though the hold carries the mark of a grant the line made: the settle of a re-entry names
/// its grant, which the client holds. Before, the settle left it, the hold count stayed one
/// too high, and the lock stayed held after the last `unlock()` until its lease ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentry_of_a_grant_taken_from_its_message_is_settled_when_its_reply_is_lost() {
    let redis = server();
    let name = "reentry-of-a-heard-grant";
    let holder = client(&redis.url()).await;
    let held = holder.lock(name).unwrap();
    let guard = held.lock().await.unwrap();
    let (proxy, slow) = common::slow_client(&redis).await;
    let waiter = {
        let lock = slow.lock(name).unwrap();
        tokio::spawn(async move { lock.lock().await.map(|g| g.detach()) })
    };
    common::until_queued(&redis, &format!("leasehold:{{{name}}}:waiters"), 1).await;
    guard.unlock().await.unwrap();
    let outer = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the waiter is granted")
        .unwrap()
        .unwrap();
    let hash = format!("leasehold:{{{name}}}");
    assert_eq!(
        hget(&redis, &hash, leasehold_core::protocol::GRANTED_FIELD),
        Some(1),
        "taken from its message: the mark is still there"
    );
    {
        let again = outer.reentrant();
        proxy.set_latency(common::LATE_REPLY);
        let lost = again.try_lock().await;
        assert!(
            lost.as_ref().is_err_and(LockError::is_transient),
            "{lost:?}"
        );
        proxy.set_latency(Duration::ZERO);
    }
    outer.unlock().await.unwrap();
    assert!(
        common::eventually(Duration::from_secs(10), || !exists(&redis, &hash)).await,
        "the lock is free after the last unlock: {:?}",
        common::cmd(&redis, &["HGETALL", &hash])
    );
}

/// Tokens stay exact and distinct over the counter's whole range: a counter written past 2^53
/// (a server clock far ahead, or a value set from outside) keeps handing out consecutive
/// tokens, not doubles that repeat; at the ceiling (2^63 - 1) the counter counts as lost, as
/// after a restart, and tokens continue from the server time.
#[tokio::test]
async fn fencing_tokens_stay_exact_and_distinct_above_two_to_the_fifty_third() {
    let redis = server();
    let client = client(&redis.url()).await;
    let lock = client.lock("fence:high").unwrap();
    let counter = lock.keys().fence().to_string();
    let two_53: u64 = 1 << 53;
    cmd(&redis, &["SET", &counter, &two_53.to_string()]);
    let mut tokens = Vec::new();
    for _ in 0..6 {
        let guard = lock.try_lock().await.unwrap().expect("free");
        tokens.push(guard.fencing_token().get());
        guard.unlock().await.unwrap();
    }
    let expected: Vec<u64> = (1..=6).map(|i| two_53 + i).collect();
    assert_eq!(tokens, expected, "consecutive, exact tokens past 2^53");
    assert_eq!(
        cmd(&redis, &["GET", &counter]).as_str(),
        Some((two_53 + 6).to_string())
    );

    // Next to the ceiling: the last token below it is exact too.
    let below_max = (i64::MAX - 1).to_string();
    cmd(&redis, &["SET", &counter, &below_max]);
    let guard = lock.try_lock().await.unwrap().expect("free");
    assert_eq!(guard.fencing_token().get(), i64::MAX as u64);
    guard.unlock().await.unwrap();
    // At the ceiling the counter counts as lost: the next token is the server time in
    // microseconds, and the counter holds it.
    let guard = lock.try_lock().await.unwrap().expect("free");
    let token = guard.fencing_token().get();
    let now_us = {
        let time = cmd(&redis, &["TIME"]);
        let parts = time.as_array().unwrap();
        let secs: u64 = parts[0].as_str().unwrap().parse().unwrap();
        let micros: u64 = parts[1].as_str().unwrap().parse().unwrap();
        secs * 1_000_000 + micros
    };
    assert!(
        token <= now_us && now_us - token < 60_000_000,
        "after the ceiling, {token} should be the server time (about {now_us})"
    );
    guard.unlock().await.unwrap();
}

/// `extend` on an explicit lease sets the key's expiry to at least the new lease from now in
/// Redis, and moves the guard's deadline with it; a shorter extension changes neither.
#[tokio::test]
async fn extending_a_lease_moves_its_expiry_in_redis_and_locally() {
    let redis = server();
    let client = client(&redis.url()).await;
    let lock = client.lock("extended").unwrap();
    let guard = lock.lock_with_lease(Duration::from_secs(5)).await.unwrap();
    assert!(common::pttl(&redis, "leasehold:{extended}") <= 5_000);
    let before = tokio::time::Instant::now();
    guard.extend(Duration::from_secs(600)).await.unwrap();
    let ttl = common::pttl(&redis, "leasehold:{extended}");
    assert!(ttl > 500_000, "PTTL after extending to 10 min: {ttl} ms");
    assert!(guard.is_held());
    assert!(guard.valid_until() > before + Duration::from_secs(500));
    assert!(
        guard.valid_until() <= tokio::time::Instant::now() + Duration::from_secs(600),
        "the local deadline never claims more than the lease asked for"
    );
    assert_eq!(guard.lost_reason(), None);

    // Never shortens: a shorter extension leaves the expiry and the deadline.
    let deadline = guard.valid_until();
    guard.extend(Duration::from_secs(1)).await.unwrap();
    assert!(common::pttl(&redis, "leasehold:{extended}") > 500_000);
    assert_eq!(guard.valid_until(), deadline);

    // A re-entry with a short lease extends without cutting the outer hold's lease.
    let inner = lock
        .try_lock_with_lease(Duration::from_millis(200))
        .await
        .unwrap()
        .expect("re-enters");
    assert_eq!(inner.hold_count(), 2);
    inner.extend(Duration::from_secs(2)).await.unwrap();
    assert!(common::pttl(&redis, "leasehold:{extended}") > 500_000);
    assert!(inner.valid_until() > tokio::time::Instant::now() + Duration::from_secs(1));
    inner.unlock().await.unwrap();
    guard.unlock().await.unwrap();
    assert!(!exists(&redis, "leasehold:{extended}"));
}

/// A grant that ended cannot be extended, not even when its owner holds the lock again under
/// a new grant: the extension is fenced by the grant's token, and the guard reports the loss.
#[tokio::test]
async fn a_lost_grant_cannot_be_extended_even_by_its_owner_again() {
    let redis = server();
    let holder = client(&redis.url()).await;
    let elsewhere = client(&redis.url()).await;
    let owner = holder.new_owner();
    let lock = holder.lock("regranted").unwrap().with_owner(owner.clone());
    let guard = lock.lock_with_lease(Duration::from_secs(60)).await.unwrap();
    // An operator takes the lock away, and the same owner is granted it again through another
    // client (which knows nothing of the first grant).
    assert!(lock.force_unlock().await.unwrap());
    let again_lock = elsewhere.lock("regranted").unwrap().with_owner(owner);
    let again = again_lock
        .try_lock_with_lease(Duration::from_secs(20))
        .await
        .unwrap()
        .expect("free after the force unlock");
    assert!(again.fencing_token() > guard.fencing_token());
    assert!(guard.is_held(), "the first guard has not heard of it yet");

    let result = guard.extend(Duration::from_secs(600)).await;
    assert!(
        matches!(result, Err(LockError::LeaseLost { .. })),
        "{result:?}"
    );
    assert!(!guard.is_held());
    assert_eq!(guard.lost_reason(), Some(leasehold::LostReason::Gone));
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost() fires");
    let ttl = common::pttl(&redis, "leasehold:{regranted}");
    assert!(ttl <= 20_000, "the new grant's expiry was moved: {ttl} ms");
    // Once known lost, nothing is sent.
    let calls = common::script_calls(&redis);
    assert!(matches!(
        guard.extend(Duration::from_secs(600)).await,
        Err(LockError::LeaseLost { .. })
    ));
    assert_eq!(common::script_calls(&redis), calls);
    again.unlock().await.unwrap();
}

/// Leases out of range, and guards the watchdog renews, are refused before anything is sent.
#[tokio::test]
async fn invalid_leases_are_refused_before_anything_is_sent() {
    let redis = server();
    let client = client(&redis.url()).await;
    let fixed_lock = client.lock("fixed-knob").unwrap();
    let fixed = fixed_lock
        .lock_with_lease(Duration::from_secs(60))
        .await
        .unwrap();
    let watched_lock = client.lock("watched-knob").unwrap();
    let watched = watched_lock.lock().await.unwrap();
    let snapshot = (
        common::snapshot(&redis, "fixed-knob"),
        common::snapshot(&redis, "watched-knob"),
    );
    let calls = common::script_calls(&redis);
    assert!(calls >= 2, "the two grants were counted: {calls}");
    for lease in [
        Duration::ZERO,
        Duration::from_micros(999),
        MAX_LEASE + Duration::from_millis(1),
        Duration::MAX,
    ] {
        let result = fixed.extend(lease).await;
        assert!(
            matches!(result, Err(LockError::InvalidArgument(_))),
            "{lease:?}: {result:?}"
        );
    }
    let result = watched.extend(Duration::from_secs(60)).await;
    assert!(
        matches!(&result, Err(LockError::InvalidArgument(m)) if m.contains("watchdog")),
        "{result:?}"
    );
    assert_eq!(common::script_calls(&redis), calls, "nothing was sent");
    assert_eq!(
        (
            common::snapshot(&redis, "fixed-knob"),
            common::snapshot(&redis, "watched-knob"),
        ),
        snapshot
    );
    assert!(fixed.is_held() && watched.is_held());
    // The bounds themselves are leases.
    fixed.extend(Duration::from_millis(1)).await.unwrap();
    fixed.extend(MAX_LEASE).await.unwrap();
    fixed.unlock().await.unwrap();
    watched.unlock().await.unwrap();
}

/// A lease that ran out is lost for good: extending it afterwards is refused locally, and the
/// guard says it expired.
#[tokio::test]
async fn an_expired_lease_cannot_be_extended() {
    let redis = server();
    let client = client(&redis.url()).await;
    let lock = client.lock("ran-out").unwrap();
    let guard = lock
        .lock_with_lease(Duration::from_millis(100))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the lease ends");
    assert_eq!(guard.lost_reason(), Some(leasehold::LostReason::Expired));
    assert!(matches!(
        guard.extend(Duration::from_secs(60)).await,
        Err(LockError::LeaseLost { .. })
    ));
}
