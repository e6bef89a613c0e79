//! Regression tests, one test per defect the library once had (or per case of one). Each test
//! reproduces its defect on code without the fix and passes with it; the comment at the top of each
//! test says how it failed without the fix. A guard handed to another task is also covered by a
//! `compile_fail` doctest on `LockGuard`: the pattern that ran two critical sections at once does
//! not compile.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{client, cmd, exists, hget, pttl, server, set_user};
use fred::interfaces::ClientLike;
use leasehold::{Lock, LockClient, LockError};
use leasehold_testkit::{Proxy, RedisServer};
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Instant;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Subscribers of `channel` in Redis.
fn numsub(redis: &RedisServer, channel: &str) -> i64 {
    let reply = cmd(redis, &["PUBSUB", "NUMSUB", channel]);
    reply.as_array().expect("numsub reply")[1]
        .as_int()
        .expect("count")
}

/// Members of the turn queue `queue` (0 when the key is absent).
fn zcard(redis: &RedisServer, queue: &str) -> i64 {
    cmd(redis, &["ZCARD", queue]).as_int().expect("ZCARD reply")
}

/// `CLIENT LIST` (optionally `TYPE kind`) as lines, without the testkit's own connection (the
/// short-lived one that runs the `CLIENT LIST`).
fn client_list(redis: &RedisServer, kind: Option<&str>) -> Vec<String> {
    redis.client_list(kind).expect("CLIENT LIST")
}

/// Connections of ACL user `user`.
fn connections_of_user(redis: &RedisServer, user: &str) -> usize {
    let needle = format!(" user={user} ");
    client_list(redis, None)
        .iter()
        .filter(|line| line.contains(&needle))
        .count()
}

/// Waits (bounded) until the client answers again through `lock`, e.g. after its connection
/// was closed and it reconnects.
async fn until_answers(lock: &Lock) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match lock.is_locked().await {
            Ok(_) => return,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("the client did not come back: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 1. A waiter sleeps a whole lease on a free lock
// ---------------------------------------------------------------------------------------------

/// A lock reserved for another client's turn that never takes it: the waiter must try again
/// soon after the reservation lapses, not after its own lease.
///
/// Failed before the fix: the waiter's retry hits acquire.lua's reserved branch, which answers the
/// waiter's own 20 s lease, so it sleeps until its 8 s deadline and acquires only at its last
/// try (~8.0 s instead of ~1.5 s): "acquired after 8.0s".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect1_a_waiter_tries_again_soon_after_a_turn_reservation_lapses() {
    let redis = server();
    let waiter = LockClient::builder(&redis.url())
        .lease(Duration::from_secs(20))
        .build()
        .await
        .expect("connect");
    let lock = waiter.lock("x").unwrap();
    let key = lock.keys().hash().to_string();
    // A release reserved the lock for a client that will never take its turn (a real
    // reservation lives 25 ms; this one lives 1.5 s so the waiter's retry surely meets it).
    let reservation = Duration::from_millis(1500);
    cmd(&redis, &["HSET", &key, "~turn:deadbeef", "0"]);
    cmd(
        &redis,
        &["PEXPIRE", &key, &reservation.as_millis().to_string()],
    );
    let started = Instant::now();
    let got = lock.try_lock_for(Duration::from_secs(8)).await.unwrap();
    let took = started.elapsed();
    assert!(got.is_some(), "not acquired within 8 s (after {took:?})");
    assert!(
        took <= reservation + Duration::from_secs(2),
        "acquired after {took:?}: the reservation lapsed after {reservation:?}, so the waiter \
         slept on a free lock"
    );
    got.unwrap().unlock().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// 2. A releaser barges ahead of its own client's queued waiter
// ---------------------------------------------------------------------------------------------

/// Within one client, waiters are served in order: a task that releases and asks again at once
/// comes after the sibling task that was already waiting.
///
/// Failed before the fix (round 0): the release reserves the lock for this very client's turn, and
/// the releaser's own new lock() takes that turn before the queued sibling: order ["A again", "B"]
/// instead of ["B", "A again"].
#[tokio::test]
async fn defect2_a_releaser_does_not_barge_ahead_of_its_own_clients_waiter() {
    let redis = server();
    let client = client(&redis.url()).await;
    let queue = "leasehold:{barge}:waiters";
    let channel = &common::client_channel(&client, "barge");
    for round in 0..5 {
        let order: Arc<Mutex<Vec<&'static str>>> = Arc::default();
        let (held_tx, held_rx) = oneshot::channel::<()>();
        let (go_tx, go_rx) = oneshot::channel::<()>();
        let lock_a = client.lock("barge").unwrap();
        let order_a = order.clone();
        let a = tokio::spawn(async move {
            let guard = lock_a.lock().await.unwrap();
            held_tx.send(()).unwrap();
            go_rx.await.unwrap();
            guard.unlock().await.unwrap();
            let again = lock_a.lock().await.unwrap();
            order_a.lock().push("A again");
            again.unlock().await.unwrap();
        });
        held_rx.await.unwrap();
        let lock_b = client.lock("barge").unwrap();
        let order_b = order.clone();
        let b = tokio::spawn(async move {
            let guard = lock_b.lock().await.unwrap();
            order_b.lock().push("B");
            guard.unlock().await.unwrap();
        });
        // B waits for real: subscribed, and its client queued by its failed retry.
        assert!(
            common::eventually(Duration::from_secs(10), || zcard(&redis, queue) == 1
                && numsub(&redis, channel) == 1)
            .await,
            "round {round}: B never queued"
        );
        go_tx.send(()).unwrap();
        let both = async {
            a.await.unwrap();
            b.await.unwrap();
        };
        tokio::time::timeout(Duration::from_secs(20), both)
            .await
            .expect("both tasks got the lock");
        assert_eq!(
            *order.lock(),
            ["B", "A again"],
            "round {round}: order of acquisitions after A's release"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 3. A lost watched guard can be revived
// ---------------------------------------------------------------------------------------------

/// A watched guard whose hold was force-unlocked stays lost even when the same owner takes a
/// fresh grant, and the watchdog never extends that fresh grant's explicit lease.
///
/// Failed before the fix: g1's next renewal finds the owner in the hash (the new grant) and renews
/// it: `g1.is_held()` stays true and the 1500 ms explicit lease is pushed to the 3 s watched lease
/// (max PTTL seen ~3000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect3_a_lost_watched_guard_is_not_revived_by_a_new_grant() {
    let redis = server();
    let client = common::client_with_lease(&redis.url(), Duration::from_secs(3)).await;
    let other = common::client(&redis.url()).await;
    let lock = client.lock("revive").unwrap();
    let key = lock.keys().hash().to_string();
    let g1 = lock.lock().await.unwrap();
    // A second watched hold on the same schedule keeps the watchdog ticking (and counting
    // renew calls) whatever becomes of g1's hold.
    let keepalive_lock = client.lock("revive-keepalive").unwrap();
    let keepalive = keepalive_lock.lock().await.unwrap();
    // Start right after a confirmed renewal: the next one comes a whole period (1 s) later, so
    // the steps below all happen before it.
    let renewed = client.watchdog_stats().renewed;
    assert!(
        common::eventually(Duration::from_secs(10), || client.watchdog_stats().renewed
            > renewed)
        .await
    );
    assert!(lock.force_unlock().await.unwrap());
    other
        .lock("revive")
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .expect("free after the force unlock")
        .unlock()
        .await
        .unwrap();
    let explicit_lease = Duration::from_millis(1500);
    let explicit = lock
        .try_lock_with_lease(explicit_lease)
        .await
        .unwrap()
        .expect("free again");
    let granted_at = Instant::now();
    assert_eq!(explicit.hold_count(), 1, "a fresh grant");
    assert!(explicit.fencing_token() > g1.fencing_token());

    // Two renewal rounds after the grant: g1's hold, if still scheduled, was renewed by now.
    let calls = client.watchdog_stats().renew_calls;
    let mut max_pttl = pttl(&redis, &key);
    let ticked = common::eventually(Duration::from_secs(10), || {
        max_pttl = max_pttl.max(pttl(&redis, &key));
        client.watchdog_stats().renew_calls >= calls + 2
    })
    .await;
    assert!(
        ticked,
        "the watchdog stopped renewing: {:?}",
        client.watchdog_stats()
    );
    let g1_held = g1.is_held();
    assert!(
        !g1_held && max_pttl <= explicit_lease.as_millis() as i64,
        "after two renewals: g1.is_held() = {g1_held} (want false), max PTTL of the explicit \
         {explicit_lease:?} hold = {max_pttl} ms (want <= 1500)"
    );

    // The explicit hold ends by itself, at its lease.
    let expired = common::eventually(Duration::from_secs(5), || {
        max_pttl = max_pttl.max(pttl(&redis, &key));
        !exists(&redis, &key)
    })
    .await;
    assert!(
        expired && max_pttl <= explicit_lease.as_millis() as i64,
        "the explicit hold did not end at its lease: key exists = {}, max PTTL {max_pttl} ms, \
         {:?} after the grant",
        exists(&redis, &key),
        granted_at.elapsed()
    );
    assert!(!g1.is_held(), "g1 came back");
    assert!(keepalive.is_held());
    drop(explicit);
    drop(g1);
    keepalive.unlock().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// 4. Two critical sections at once under one lock
// ---------------------------------------------------------------------------------------------

/// The hand-off pattern: a task locks, hands the guard to a spawned worker, and locks again.
/// The guard must be detached to leave its task (the undetached pattern does not compile: see
/// the `compile_fail` example on `LockGuard`), and a detached guard is not re-entered by the
/// task that acquired it: the workers run one after another.
///
/// Before the fix the pattern compiled without `detach()`, and every `lock()` of the loop
/// re-entered at once (hold counts 1, 2, 3, ...): all workers ran at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect4_handed_off_guards_run_one_at_a_time() {
    let redis = server();
    let client = client(&redis.url()).await;
    let lock = client.lock("hand-off").unwrap();
    let sections: Arc<Mutex<Vec<(Instant, Instant, u64)>>> = Arc::default();
    let mut workers = Vec::new();
    for _ in 0..5 {
        let guard = lock.lock().await.unwrap().detach();
        assert_eq!(guard.hold_count(), 1, "a fresh grant, not a re-entry");
        let sections = sections.clone();
        workers.push(tokio::spawn(async move {
            let start = Instant::now();
            tokio::time::sleep(Duration::from_millis(50)).await;
            let token = guard.fencing_token().get();
            sections.lock().push((start, Instant::now(), token));
            guard.unlock().await.unwrap();
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    let mut sections = sections.lock().clone();
    assert_eq!(sections.len(), 5);
    sections.sort_by_key(|(start, _, _)| *start);
    for pair in sections.windows(2) {
        assert!(pair[1].0 >= pair[0].1, "two workers at once: {pair:?}");
        assert!(pair[1].2 > pair[0].2, "a new grant each time: {pair:?}");
    }
    assert!(!exists(&redis, "leasehold:{hand-off}"));
}

/// While a task's detached guard lives elsewhere, the task's own acquires treat the lock as
/// busy (`try_lock` refuses, `try_lock_for` waits), and get a fresh grant once it is released.
/// Nested re-entry inside one task and explicit owners shared by tasks are unchanged, and the
/// worker holding the detached guard re-enters through `reentrant()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect4_a_detached_guard_is_not_reentered_by_its_task() {
    let redis = server();
    let client = client(&redis.url()).await;
    let lock = client.lock("detached").unwrap();

    // Nested re-entry in one task.
    let outer = lock.lock().await.unwrap();
    let inner = lock.lock().await.unwrap();
    assert_eq!((outer.hold_count(), inner.hold_count()), (1, 2));
    inner.unlock().await.unwrap();
    let token = outer.fencing_token();

    // Detached: the task no longer re-enters it.
    let outer = outer.detach();
    let (release, released) = oneshot::channel::<()>();
    let worker = tokio::spawn(async move {
        // The worker re-enters its own hold through the guard's owner.
        let again_lock = outer.reentrant();
        let again = again_lock.try_lock().await.unwrap().expect("re-enters");
        assert_eq!(again.hold_count(), 2);
        again.unlock().await.unwrap();
        released.await.unwrap();
        outer.unlock().await.unwrap();
    });
    assert!(
        lock.try_lock().await.unwrap().is_none(),
        "busy for this task"
    );
    assert!(lock
        .try_lock_for(Duration::from_millis(200))
        .await
        .unwrap()
        .is_none());
    release.send(()).unwrap();
    let fresh = lock
        .try_lock_for(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("free once the worker released it");
    assert_eq!(fresh.hold_count(), 1);
    assert!(fresh.fencing_token() > token);
    fresh.unlock().await.unwrap();
    worker.await.unwrap();

    // An explicit owner shared by two tasks still shares one hold.
    let owner = client.new_owner();
    let shared = lock.clone().with_owner(owner);
    let first = shared.lock().await.unwrap().detach();
    let second = tokio::spawn({
        let shared = shared.clone();
        async move { shared.try_lock().await.unwrap().map(|g| g.detach()) }
    })
    .await
    .unwrap()
    .expect("the same explicit owner re-enters from another task");
    assert_eq!(second.hold_count(), 2);
    second.unlock().await.unwrap();
    first.unlock().await.unwrap();
    assert!(!exists(&redis, "leasehold:{detached}"));
}

/// Nor can a guard whose grant ended release a later grant of the same owner: the release of a
/// grant the hold table no longer has as current names its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect3_a_lost_guard_cannot_release_a_later_grant_of_its_owner() {
    let redis = server();
    let client = client(&redis.url()).await;
    let lock = client.lock("stale-release").unwrap();
    let key = lock.keys().hash().to_string();
    let g1 = lock.lock().await.unwrap();
    assert!(lock.force_unlock().await.unwrap());
    let g2 = lock
        .try_lock_with_lease(Duration::from_secs(30))
        .await
        .unwrap()
        .expect("free after the force unlock");
    assert_eq!(g2.hold_count(), 1, "a fresh grant");
    assert!(!g1.is_held(), "the later grant showed g1's is gone");
    assert!(matches!(g1.unlock().await, Err(LockError::NotHeld { .. })));
    assert_eq!(
        hget(&redis, &key, g2.owner().id()),
        Some(1),
        "g1's release left the later grant alone"
    );
    assert!(g2.is_held());
    g2.unlock().await.unwrap();
    assert!(!exists(&redis, &key));
}

// ---------------------------------------------------------------------------------------------
// 5. A cancelled (or failed) release leaves an orphan hold that its owner later re-enters
// ---------------------------------------------------------------------------------------------

/// A client through a proxy, holding `name` (watched, default 30 s lease) in the calling task.
async fn proxied_holder(
    redis: &RedisServer,
    name: &str,
    command_timeout: Duration,
) -> (Proxy, LockClient, Lock, leasehold::LockGuard<'static>) {
    let proxy = Proxy::start(redis.addr()).await.unwrap();
    let client = LockClient::builder(&proxy.url())
        .command_timeout(command_timeout)
        .build()
        .await
        .expect("connect");
    let lock = client.lock(name).unwrap();
    let guard = lock.lock().await.unwrap().detach();
    (proxy, client, lock, guard)
}

/// The connection lost bytes during the partition, so it is out of sync: as after a real
/// network fault, it is reset, and the client reconnects.
async fn heal_and_reconnect(proxy: &Proxy, lock: &Lock) {
    proxy.heal();
    proxy.close_all();
    until_answers(lock).await;
}

/// `guard.unlock()` cancelled while its release is on the wire (and never reaches Redis): the
/// owner's next acquire must not re-enter the orphaned hold.
///
/// Failed before the fix: nothing settles the cancelled release, so the same task's next acquire
/// re-enters the orphan at once: hold_count 2 (want 1); releasing it would leave the orphan held
/// until its 30 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect5_a_cancelled_unlock_leaves_no_hold_to_re_enter() {
    let redis = server();
    let (proxy, _client, lock, guard) =
        proxied_holder(&redis, "orphan", Duration::from_secs(5)).await;
    let key = lock.keys().hash().to_string();
    proxy.partition();
    let cancelled = tokio::time::timeout(Duration::from_millis(300), guard.unlock()).await;
    assert!(cancelled.is_err(), "the unlock was cut off: {cancelled:?}");
    heal_and_reconnect(&proxy, &lock).await;

    let again = lock
        .try_lock_for(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the lock is this task's to take");
    let count = again.hold_count();
    again.unlock().await.unwrap();
    assert_eq!(
        count,
        1,
        "the next acquire re-entered an orphaned hold (Redis PTTL now {} ms)",
        pttl(&redis, &key)
    );
    assert!(
        !exists(&redis, &key),
        "still held after its only hold was released: PTTL {} ms",
        pttl(&redis, &key)
    );
}

/// `guard.unlock_after(d)` cancelled while on the wire: the lock must end no later than the
/// tail (plus a bound), and the owner must not re-enter the orphaned hold meanwhile.
///
/// Failed before the fix: nothing settles the cancelled release_after: the orphan keeps the full
/// 30 s lease, and the same task's next acquire re-enters it at once: hold_count 2 (want 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect5_a_cancelled_unlock_after_ends_at_its_tail_and_is_not_re_entered() {
    let redis = server();
    let (proxy, _client, lock, guard) =
        proxied_holder(&redis, "orphan-after", Duration::from_secs(5)).await;
    let key = lock.keys().hash().to_string();
    let tail = Duration::from_secs(1);
    proxy.partition();
    let called = Instant::now();
    let cancelled =
        tokio::time::timeout(Duration::from_millis(300), guard.unlock_after(tail)).await;
    assert!(
        cancelled.is_err(),
        "the unlock_after was cut off: {cancelled:?}"
    );
    heal_and_reconnect(&proxy, &lock).await;

    ends_after_its_tail(&redis, &lock, &key, called, tail).await;
}

/// After an `unlock_after(tail)` called at `called` that did not get its answer: the lock ends
/// no later than the tail plus a bound (not at the full lease), and the owner's next acquire is
/// a new grant, not a re-entry of the orphan.
async fn ends_after_its_tail(
    redis: &RedisServer,
    lock: &Lock,
    key: &str,
    called: Instant,
    tail: Duration,
) {
    let bound = tail + Duration::from_secs(3);
    let again = lock
        .try_lock_for(bound + Duration::from_secs(2))
        .await
        .unwrap()
        .expect("the lock ends after its tail");
    let at = called.elapsed();
    let count = again.hold_count();
    again.unlock().await.unwrap();
    assert_eq!(
        count, 1,
        "the owner re-entered the orphaned hold {at:?} after unlock_after({tail:?})"
    );
    assert!(
        at <= bound,
        "acquired only {at:?} after unlock_after({tail:?})"
    );
    assert!(!exists(redis, key));
}

/// `guard.unlock_after(d)` failing with a transient error (the release_after never reached
/// Redis): the lock must still end no later than the tail (plus a bound), not at the full
/// lease, and the owner must not re-enter the orphan.
///
/// Failed before the fix: unlock_after returns `Timeout(500ms)` and nothing settles it: the orphan
/// keeps the full 30 s lease, and the same task's next acquire re-enters it at once: hold_count 2
/// (want 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect5_a_failed_unlock_after_ends_at_its_tail_and_is_not_re_entered() {
    let redis = server();
    let (proxy, _client, lock, guard) =
        proxied_holder(&redis, "orphan-failed", Duration::from_millis(500)).await;
    let key = lock.keys().hash().to_string();
    let tail = Duration::from_secs(1);
    proxy.partition();
    let called = Instant::now();
    let result = guard.unlock_after(tail).await;
    assert!(
        result.as_ref().is_err_and(LockError::is_transient),
        "the unlock_after failed with a transient error: {result:?}"
    );
    heal_and_reconnect(&proxy, &lock).await;

    ends_after_its_tail(&redis, &lock, &key, called, tail).await;
}

// ---------------------------------------------------------------------------------------------
// 6. A release does not wait for pending repairs of the same owner
// ---------------------------------------------------------------------------------------------

/// A nested try_lock cancelled mid-flight (its rollback pending) followed at once by the outer
/// release: the lock must end up free, whichever of the two reaches Redis first.
///
/// Failed before the fix: the release goes out before the rollback (current-thread runtime: the
/// rollback task has not run yet), so Redis runs acquire (2), release (1), rollback (expects 2:
/// no-op): one hold is orphaned until the 30 s lease: "still held 5 s after the last release: PTTL
/// ~24800 ms, hold count Some(1)".
#[tokio::test]
async fn defect6_a_release_waits_for_the_owners_pending_rollback() {
    let redis = server();
    let proxy = Proxy::start(redis.addr()).await.unwrap();
    let client = client(&proxy.url()).await;
    let lock = client.lock("repair-order").unwrap();
    let key = lock.keys().hash().to_string();
    let g1 = lock.lock().await.unwrap();
    let owner = g1.owner().id().to_string();
    proxy.set_latency(Duration::from_millis(100));
    let nested = tokio::time::timeout(Duration::from_millis(50), lock.try_lock()).await;
    assert!(
        nested.is_err(),
        "the nested try_lock was cut off mid-flight"
    );
    g1.unlock().await.unwrap();
    let freed = common::eventually(Duration::from_secs(5), || !exists(&redis, &key)).await;
    assert!(
        freed,
        "still held 5 s after the last release: PTTL {} ms, hold count {:?}",
        pttl(&redis, &key),
        hget(&redis, &key, &owner)
    );
}

// ---------------------------------------------------------------------------------------------
// 7. Connections leak
// ---------------------------------------------------------------------------------------------

/// A user that may connect but not SCRIPT LOAD: `build()` fails after connecting.
const NO_SCRIPT_LOAD_RULE: &str = "on >pw resetkeys ~leasehold:* resetchannels &leasehold:* \
    -@all +evalsha +exists +hget +zrem +subscribe +unsubscribe +type +set +incr +time +hset \
    +hexists +hincrby +hdel +hkeys +del +pexpire +pttl +zadd +zpopmin +publish +info +client|id";

/// Five failed builds leave no connection behind.
///
/// Failed before the fix: the builder returns PermissionDenied after SCRIPT LOAD is refused but
/// never closes the connection it opened: 5 connections of the user stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect7a_failed_builds_close_their_connections() {
    let redis = server();
    set_user(&redis, "leaky", NO_SCRIPT_LOAD_RULE);
    let url = format!("redis://leaky:pw@127.0.0.1:{}", redis.port());
    for _ in 0..5 {
        let result = LockClient::builder(&url).build().await;
        assert!(
            matches!(result, Err(LockError::PermissionDenied(_))),
            "{result:?}"
        );
    }
    let closed = common::eventually(Duration::from_secs(5), || {
        connections_of_user(&redis, "leaky") == 0
    })
    .await;
    assert!(
        closed,
        "{} connections of the failed builds are still open",
        connections_of_user(&redis, "leaky")
    );
}

/// A build that times out, and one that is cancelled, while the server is paused leave no
/// connection behind once it resumes.
///
/// Failed before the fix: the timed-out build closes its connection, but the cancelled one's
/// connection completes its handshake after the resume and stays open ("id=... cmd=info
/// user=default").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect7b_builds_timed_out_or_cancelled_on_a_paused_server_leave_no_connection() {
    let redis = server();
    redis.pause().unwrap();
    let timed_out = LockClient::builder(&redis.url())
        .command_timeout(Duration::from_millis(500))
        .build()
        .await;
    assert!(timed_out.is_err(), "a paused server cannot answer");
    drop(timed_out);
    let cancelled = tokio::time::timeout(
        Duration::from_millis(500),
        LockClient::builder(&redis.url()).build(),
    )
    .await;
    assert!(cancelled.is_err(), "a paused server cannot answer");
    redis.resume().unwrap();
    let closed = common::eventually(Duration::from_secs(5), || {
        client_list(&redis, None).is_empty()
    })
    .await;
    assert!(
        closed,
        "connections left by the builds: {:?}",
        client_list(&redis, None)
    );
}

/// First waits cancelled while the subscriber connection is being opened, six times on one
/// client: the client ends up with its command connection and at most one subscriber
/// connection. (`CLIENT LIST TYPE pubsub` alone would not see the leak: a subscriber client that
/// never subscribed is of type normal; so the client's connections are counted at the proxy.)
///
/// Failed before the fix: each cancelled wait drops the OnceCell's init while its spawned connect
/// task goes on and connects a subscriber nobody keeps or closes: 7 connections through the proxy
/// (1 command + 6 subscribers), 0 of them pubsub in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect7c_cancelled_first_waits_open_at_most_one_subscriber() {
    let redis = server();
    let holder = client(&redis.url()).await;
    let _held_lock = holder.lock("slow-sub").unwrap();
    let _held = _held_lock.lock().await.unwrap();
    let proxy = Proxy::start(redis.addr()).await.unwrap();
    let waiter = client(&proxy.url()).await;
    let lock = waiter.lock("slow-sub").unwrap();
    assert_eq!(proxy.connections(), 1, "the command connection");
    proxy.set_latency(Duration::from_millis(100));
    for i in 0..6u64 {
        // The first try takes two latencies (~200 ms); the subscriber connection opens after.
        let wait = Duration::from_millis(250 + 40 * i);
        let result = tokio::time::timeout(wait, lock.lock()).await;
        assert!(result.is_err(), "the lock is held");
    }
    let at_most_one = common::eventually(Duration::from_secs(5), || {
        proxy.connections() <= 2 && client_list(&redis, Some("pubsub")).len() <= 1
    })
    .await;
    assert!(
        at_most_one,
        "{} connections of the waiter's client (1 command + subscribers), {} pubsub in Redis",
        proxy.connections(),
        client_list(&redis, Some("pubsub")).len()
    );
}

/// Dropping a client that waited (so it opened both connections) closes both.
///
/// Not reproduced: the test passes on code without the fix too (the client's drop sends QUIT on
/// both connections and the proxy sees both close). Kept as a guard of the property.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect7d_dropping_a_client_closes_its_connections() {
    let redis = server();
    let holder = client(&redis.url()).await;
    let _held_lock = holder.lock("drop-me").unwrap();
    let _held = _held_lock.lock().await.unwrap();
    let proxy = Proxy::start(redis.addr()).await.unwrap();
    let waiter = client(&proxy.url()).await;
    let waited_lock = waiter.lock("drop-me").unwrap();
    let waited = waited_lock
        .try_lock_for(Duration::from_millis(300))
        .await
        .unwrap();
    assert!(waited.is_none(), "the lock is held");
    assert_eq!(proxy.connections(), 2, "command and subscriber connections");
    drop(waited);
    drop(waited_lock); // a lock handle keeps its client alive
    drop(waiter);
    let closed = common::eventually(Duration::from_secs(5), || proxy.connections() == 0).await;
    assert!(
        closed,
        "{} connections of the dropped client are still open",
        proxy.connections()
    );
}

// ---------------------------------------------------------------------------------------------
// 8. LeaveQueue may take the client out of the queue while a sibling still waits
// ---------------------------------------------------------------------------------------------

/// A waiter cancelled (before it registered interest of its own, or later) must not take its
/// client out of the turn queue while a sibling waiter of that client still waits there.
///
/// Not reproduced: the test passes on code without the fix too; it guards the property. The
/// suspected path needs the cancelled waiter A to have no interest of its own while sibling B is
/// already queued. A starts without interest only if B's subscription is not yet flagged active,
/// and that gap is sub-millisecond (fred 10's `subscribe()` resolves as soon as the SUBSCRIBE is
/// written, before Redis ran it); A then holds no interest only until its first try's reply, and
/// B's queued retry cannot reach Redis before that try: both go over the one command connection, in
/// order (fred never pipelines EVALSHA). Cancellation points covered: two waiters of a fresh client
/// racing their way in, and a waiter cancelled at points of its wait while its sibling is parked.
#[tokio::test]
async fn defect8_a_cancelled_waiter_leaves_the_queue_to_its_waiting_sibling() {
    let redis = server();
    let holder = client(&redis.url()).await;
    let held_lock = holder.lock("sibling").unwrap();
    let held = held_lock.lock().await.unwrap();
    let queue = "leasehold:{sibling}:waiters";

    // Whether the client is still queued while B waits, once anything A's cancellation sent
    // reached Redis: on this current-thread runtime, a yield lets a spawned ZREM task queue its
    // command, and a round trip on the same connection comes back after it ran.
    async fn check(redis: &RedisServer, lock: &Lock, b: &tokio::task::JoinHandle<()>, what: &str) {
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        lock.is_locked().await.unwrap();
        assert!(!b.is_finished(), "{what}: B still waits (the lock is held)");
        // A's entry (if it had one) left with A; B, head now, has one of its own.
        assert!(
            common::eventually(Duration::from_secs(10), || zcard(
                redis,
                "leasehold:{sibling}:waiters"
            ) == 1)
            .await,
            "{what}: B still waits, but has no entry in the line"
        );
    }

    // A and B start together on a fresh client: A is cancelled on its way in (before or while
    // it registers interest), B goes on to wait.
    for step in 0..8u32 {
        let client = client(&redis.url()).await;
        let lock = client.lock("sibling").unwrap();
        let b_lock = lock.clone();
        let b = tokio::spawn(async move {
            let _ = b_lock.lock().await;
        });
        let a_lock = lock.clone();
        let a = tokio::spawn(async move { a_lock.lock().await.map(|g| g.detach()) });
        for _ in 0..step {
            tokio::task::yield_now().await;
        }
        a.abort();
        let _ = a.await;
        assert!(
            common::eventually(Duration::from_secs(10), || zcard(&redis, queue) == 1
                && client.waiters() == 1)
            .await,
            "step {step}: B queued"
        );
        check(&redis, &lock, &b, &format!("racing in, step {step}")).await;
        b.abort();
        let _ = b.await;
        assert!(
            common::eventually(Duration::from_secs(10), || zcard(&redis, queue) == 0
                && numsub(&redis, &common::client_channel(&client, "sibling")) == 0)
            .await,
            "step {step}: B left the line when B stopped waiting"
        );
    }

    // B parked in the queue; A cancelled at points of its own wait.
    let client = client(&redis.url()).await;
    let lock = client.lock("sibling").unwrap();
    let b_lock = lock.clone();
    let b = tokio::spawn(async move {
        let _ = b_lock.lock().await;
    });
    assert!(
        common::eventually(Duration::from_secs(10), || zcard(&redis, queue) == 1
            && numsub(&redis, &common::client_channel(&client, "sibling")) == 1)
        .await,
        "B queued"
    );
    for step in 0..8u32 {
        let a_lock = lock.clone();
        let a = tokio::spawn(async move { a_lock.lock().await.map(|g| g.detach()) });
        for _ in 0..step {
            tokio::task::yield_now().await;
        }
        if step % 2 == 1 {
            // Parked, or mid-try: the lock is held, so A is somewhere in its wait.
            tokio::time::sleep(Duration::from_millis(u64::from(step))).await;
        }
        a.abort();
        let _ = a.await;
        check(&redis, &lock, &b, &format!("parked sibling, step {step}")).await;
    }
    held.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), b)
        .await
        .expect("B acquired once the lock was released")
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// 9. The fencing counter
// ---------------------------------------------------------------------------------------------

/// A fencing counter that someone overwrote with something that is not a token (not a
/// decimal integer below 2^63 - 1) does not wedge the locks of its slot: it counts as lost, like
/// after a restart without persistence, and tokens continue from the server time (the floor
/// that already protects them across data loss). Decided instead of a typed error: an error
/// would stop every lock of the slot until an operator acted.
///
/// Failed before the fix: every grant failed with the untyped
/// `Redis("ERR value is not an integer or out of range script: ...")`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect9_a_non_integer_fencing_counter_does_not_wedge_the_locks_of_its_slot() {
    let redis = server();
    let client = client(&redis.url()).await;
    let lock = client.lock("fence-nan").unwrap();
    let fence = lock.keys().fence().to_string();
    let first = lock.try_lock().await.unwrap().expect("free");
    let mut last = first.fencing_token().get();
    first.unlock().await.unwrap();
    for garbage in [
        "99999999999999999999",
        "9223372036854775807",
        "abc",
        "zzzzzzzzzzzzzzzzzzzzzz",
        "-5",
        "0001",
        "",
    ] {
        cmd(&redis, &["SET", &fence, garbage]);
        let guard = lock
            .try_lock()
            .await
            .unwrap_or_else(|e| panic!("counter {garbage:?}: {e:?}"))
            .expect("free");
        let token = guard.fencing_token().get();
        assert!(
            token > last,
            "counter {garbage:?}: token {token} after {last}"
        );
        last = token;
        let stored = cmd(&redis, &["GET", &fence]).as_str().unwrap();
        assert_eq!(
            stored,
            token.to_string(),
            "the counter holds the token again"
        );
        guard.unlock().await.unwrap();
    }
}

/// A release that grants the lock to the waiter in line, with a foreign-typed fencing counter,
/// fails with WRONGTYPE naming the counter, and leaves the hold as it was: the grant's token is
/// taken before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect9_a_wrong_type_fencing_counter_does_not_delete_a_hold() {
    let redis = server();
    let holder = client(&redis.url()).await;
    let waiter = common::client(&redis.url()).await;
    let lock = holder.lock("fence-list").unwrap();
    let key = lock.keys().hash().to_string();
    let fence = lock.keys().fence().to_string();
    let guard = lock.lock().await.unwrap();
    let waiting = {
        let lock = waiter.lock("fence-list").unwrap();
        tokio::spawn(async move {
            lock.try_lock_for(Duration::from_secs(5))
                .await
                .map(|g| g.map(|g| g.detach()))
        })
    };
    assert!(
        common::eventually(Duration::from_secs(10), || cmd(
            &redis,
            &["ZCARD", "leasehold:{fence-list}:waiters"]
        )
        .as_int()
            == Some(1))
        .await,
        "the waiter is in line"
    );
    cmd(&redis, &["DEL", &fence]);
    cmd(&redis, &["LPUSH", &fence, "not a counter"]);
    let owner = guard.owner().id().to_string();
    match guard.unlock().await {
        Err(LockError::WrongType { key: named }) => assert_eq!(named, fence),
        other => panic!("want WrongType naming {fence:?}, got {other:?}"),
    }
    assert_eq!(
        common::hget(&redis, &key, &owner),
        Some(1),
        "the failed grant left the hold as it was"
    );
    cmd(&redis, &["DEL", &fence]);
    drop(waiting);
}

// ---------------------------------------------------------------------------------------------
// 10. A WRONGTYPE error names the wrong key
// ---------------------------------------------------------------------------------------------

/// A foreign-typed line of waiters: the error names the line's key.
///
/// Failed before the fix (on the queue key a plain lock's waiters used then): `WrongType { key:
/// "Operation" }` (the first word of Redis's own WRONGTYPE message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect10_a_foreign_typed_line_is_named_in_wrong_type() {
    let redis = server();
    let holder = client(&redis.url()).await;
    let waiter = common::client(&redis.url()).await;
    let _held_lock = holder.lock("wq").unwrap();
    let _held = _held_lock.lock().await.unwrap();
    let lock = waiter.lock("wq").unwrap();
    let queue = lock.keys().waiters();
    cmd(&redis, &["SET", &queue, "foo"]);
    let result = lock.try_lock_for(Duration::from_secs(1)).await;
    match &result {
        Err(LockError::WrongType { key }) => assert_eq!(key, &queue),
        other => panic!("want WrongType naming {queue:?}, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// 11. A bounded wait is not bounded when Redis is unreachable
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Fault {
    Killed,
    Paused,
}

/// Runs `call` on a client (command timeout `command_timeout`) whose Redis became unreachable
/// by `fault` after the client connected; returns how long it took and what it returned. A
/// killed server is one the client has noticed is gone (its connection is down and being
/// retried: the usual state when Redis has been down a while).
async fn call_when_unreachable<F, Fut>(
    fault: Fault,
    command_timeout: Duration,
    call: F,
) -> (Duration, String, bool)
where
    F: FnOnce(Lock) -> Fut,
    Fut: std::future::Future<Output = leasehold::Result<Option<leasehold::LockGuard<'static>>>>,
{
    let redis = server();
    let client = LockClient::builder(&redis.url())
        .command_timeout(command_timeout)
        .build()
        .await
        .expect("connect");
    let lock = client.lock("unreachable").unwrap();
    // The connection is up before the fault.
    assert!(!lock.is_locked().await.unwrap());
    match fault {
        Fault::Killed => {
            redis.kill().unwrap();
            assert!(
                common::eventually(Duration::from_secs(10), || !client.redis().is_connected())
                    .await,
                "the client noticed the server is gone"
            );
        }
        Fault::Paused => redis.pause().unwrap(),
    }
    let started = Instant::now();
    // This cap only bounds the test's run time; callers check the real bound.
    let result = tokio::time::timeout(Duration::from_secs(6), call(lock)).await;
    let took = started.elapsed();
    if let Fault::Paused = fault {
        redis.resume().unwrap();
    }
    match result {
        Ok(result) => (
            took,
            format!("{result:?}"),
            result.as_ref().is_err_and(LockError::is_transient),
        ),
        Err(_) => (took, "still running".to_string(), false),
    }
}

/// `try_lock_for(1 s)` with Redis killed, then paused: a transient error within 2.5 s (the
/// caller must be able to tell "Redis unreachable" from "busy").
///
/// Failed before the fix: killed: still running at the test's 6 s cap (uncapped it returns
/// `Ok(None)` after ~10 s: a full command timeout waiting for the connection in `ready()`, then
/// another for the acquire); paused: `Ok(None)` after 5.0 s (the acquire's 5 s command timeout,
/// then the deadline has passed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect11_try_lock_for_is_bounded_when_redis_is_unreachable() {
    let bound = Duration::from_millis(2500);
    let mut failures = Vec::new();
    for fault in [Fault::Killed, Fault::Paused] {
        // Default command timeout (5 s): the wait's own bound must hold whatever it is.
        let (took, outcome, transient) =
            call_when_unreachable(fault, Duration::from_secs(5), |lock| async move {
                lock.try_lock_for(Duration::from_secs(1))
                    .await
                    .map(|g| g.map(|g| g.detach()))
            })
            .await;
        if !transient || took > bound {
            failures.push(format!("{fault:?}: {outcome} after {took:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "want a transient error within {bound:?}: {failures:?}"
    );
}

/// `try_lock()` with Redis killed, then paused: a transient error within the command timeout
/// (1.5 s) plus a margin (bound 2.5 s).
///
/// Failed before the fix: killed: `Err(Timeout(1.5s))` after 3.0 s (a full command timeout
/// waiting for
/// the connection in `ready()`, then another for the acquire). The paused case already
/// held then (`Err(Timeout(1.5s))` after ~1.5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect11_try_lock_is_bounded_when_redis_is_unreachable() {
    let bound = Duration::from_millis(2500);
    let mut failures = Vec::new();
    for fault in [Fault::Killed, Fault::Paused] {
        let (took, outcome, transient) =
            call_when_unreachable(fault, Duration::from_millis(1500), |lock| async move {
                lock.try_lock().await.map(|g| g.map(|g| g.detach()))
            })
            .await;
        if !transient || took > bound {
            failures.push(format!("{fault:?}: {outcome} after {took:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "want a transient error within {bound:?}: {failures:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 12. Futures joined in one task replace each other's grant
// ---------------------------------------------------------------------------------------------

/// Holds `guard` for 50 ms and releases it: (hold count, token), whether it was still held at
/// the end, and the unlock's outcome.
async fn hold_a_while(guard: leasehold::LockGuard<'_>) -> Held {
    let seen = (guard.hold_count(), guard.fencing_token());
    tokio::time::sleep(Duration::from_millis(50)).await;
    let held = guard.is_held();
    (seen, held, guard.unlock().await)
}

/// What a future saw of its hold: (hold count, token), still held at the end, the unlock.
type Held = ((u64, leasehold::FencingToken), bool, leasehold::Result<()>);

/// Two futures of one task saw one grant, re-entered (one token, hold counts 1 and 2), neither
/// replaced under its guard, and both unlocks answered.
fn assert_one_grant_re_entered((a, a_held, a_unlock): Held, (b, b_held, b_unlock): Held) {
    assert_eq!(a.1, b.1, "one grant, re-entered: the same fencing token");
    let mut counts = [a.0, b.0];
    counts.sort();
    assert_eq!(counts, [1, 2]);
    assert!(
        a_held && b_held,
        "neither grant was replaced under its guard"
    );
    a_unlock.unwrap();
    b_unlock.unwrap();
}

/// Two futures joined in one task are one owner, and the guide says they re-enter each other.
/// They did not: the second waited in the client's line, and when the first got the lock its
/// try went out as a plain try, which found the owner's hold in Redis, took it for an orphan of
/// a lost reply and replaced it with a new grant.
///
/// Failed before the fix: the second future got hold count 1 and a new fencing token, the
/// first's guard was marked lost while it still ran, and its `unlock()` returned `NotHeld`.
#[tokio::test]
async fn defect12_futures_joined_in_one_task_re_enter_instead_of_replacing() {
    let redis = server();
    let client = client(&redis.url()).await;
    let lock = client.lock("stock:joined").unwrap();
    let sell = || async { hold_a_while(lock.lock().await.unwrap()).await };
    let (a, b) = tokio::join!(sell(), sell());
    assert_one_grant_re_entered(a, b);
    assert!(!exists(&redis, lock.keys().hash()));
}

/// The same class with both tries in flight at once: a `try_lock` and a waiting acquire of one
/// task, sent together on a free lock. Neither knew of the other's grant, so both went out as
/// plain tries, and the second found the first's fresh hold in Redis and replaced it as an
/// orphan. (Found by the chaos checker once its tasks ran joined ops: a `run_once` job lost
/// its lock to its own task's other op, which then released it while the job ran.)
///
/// Failed before the fix: two fencing tokens, hold counts 1 and 1, and the first guard lost.
#[tokio::test]
async fn defect12_two_tries_of_one_task_in_flight_together_do_not_replace_each_other() {
    let redis = server();
    let client = client(&redis.url()).await;
    let lock = client.lock("stock:together").unwrap();
    let (a, b) = tokio::join!(
        async { hold_a_while(lock.try_lock().await.unwrap().expect("free")).await },
        async {
            let guard = lock.try_lock_for(Duration::from_secs(5)).await.unwrap();
            hold_a_while(guard.expect("re-enters")).await
        },
    );
    assert_one_grant_re_entered(a, b);
    assert!(!exists(&redis, lock.keys().hash()));
}

// ---------------------------------------------------------------------------------------------
// 13. A waiter sleeps on a previous holder's lease after a shorter one took the lock
// ---------------------------------------------------------------------------------------------

/// W waits behind A's 3 s lease, queued after B. A releases early; B takes its turn with a
/// 300 ms lease and keeps its guard past it (a crashed or paused holder publishes nothing).
/// The lock is free 300 ms after B's grant; W must notice within the free-lock bound, not at
/// the end of A's lease. (Found by a 180 s chaos run: four waiters of three clients slept
/// 335 ms on a free lock.)
///
/// Failed before the fix: W got the lock about 3 s after A's grant, when A's original lease
/// would have ended. B's "taken" message carried its 300 ms lease, but W only used it while
/// waiting out a reserved turn, not while sleeping on an older, longer bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect13_a_waiter_does_not_sleep_on_a_previous_holders_longer_lease() {
    let redis = server();
    let (a, b, w) = (
        client(&redis.url()).await,
        client(&redis.url()).await,
        client(&redis.url()).await,
    );
    let name = "stale";
    let queue = "leasehold:{stale}:waiters";
    let held = a.lock(name).unwrap();
    let guard = held.lock_with_lease(Duration::from_secs(3)).await.unwrap();
    let granted_at = Instant::now();

    // B queues first, W second.
    let (b_granted, b_granted_rx) = oneshot::channel();
    let b_task = {
        let lock = b.lock(name).unwrap();
        tokio::spawn(async move {
            let guard = lock
                .try_lock_for_with_lease(Duration::from_secs(10), Duration::from_millis(300))
                .await
                .unwrap()
                .expect("B's turn")
                .detach();
            let _ = b_granted.send(Instant::now());
            // Past its lease without releasing, as a paused holder would.
            tokio::time::sleep(Duration::from_secs(4)).await;
            drop(guard);
        })
    };
    assert!(
        common::eventually(Duration::from_secs(10), || zcard(&redis, queue) == 1).await,
        "B queued"
    );
    let w_task = {
        let lock = w.lock(name).unwrap();
        tokio::spawn(async move {
            let guard = lock.try_lock_for(Duration::from_secs(10)).await.unwrap();
            let at = Instant::now();
            guard.expect("W gets the lock").unlock().await.unwrap();
            at
        })
    };
    assert!(
        common::eventually(Duration::from_secs(10), || zcard(&redis, queue) == 2).await,
        "W queued behind B"
    );

    guard.unlock().await.unwrap();
    let b_at = tokio::time::timeout(Duration::from_secs(10), b_granted_rx)
        .await
        .expect("B takes its turn")
        .unwrap();
    let w_at = w_task.await.unwrap();
    let after_b = w_at - b_at;
    // B's 300 ms lease, then the free-lock bound (generous here); the defect waited until A's
    // lease end, 3 s after A's grant.
    assert!(
        after_b < Duration::from_millis(1300),
        "W got the lock {after_b:?} after B's grant (A's lease would end {:?} after that)",
        (granted_at + Duration::from_secs(3)).saturating_duration_since(b_at)
    );
    b_task.abort();
}

/// A waiter sleeps on the holder's lease; the holder lets its last hold end early with
/// `unlock_after` (a short tail). The lock is free when the tail ends; the waiter must notice
/// within the free-lock bound, not at the end of the old lease.
///
/// Failed before the fix: the waiter got the lock only when the holder's 30 s lease would have
/// ended (`try_lock_for(10 s)` returned `None`): the release-after script told nobody. Found
/// while documenting the fair lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect14_a_waiter_does_not_sleep_past_an_unlock_after_tail() {
    let redis = server();
    let (a, w) = (client(&redis.url()).await, client(&redis.url()).await);
    let held = a.lock("tail").unwrap();
    let guard = held.lock().await.unwrap(); // watched: a 30 s lease
    let waiter = {
        let lock = w.lock("tail").unwrap();
        tokio::spawn(async move {
            let guard = lock.try_lock_for(Duration::from_secs(10)).await.unwrap();
            guard.map(|g| g.fencing_token())
        })
    };
    assert!(
        common::eventually(Duration::from_secs(10), || w.waiters() == 1
            && zcard(&redis, "leasehold:{tail}:waiters") == 1)
        .await,
        "the waiter queued"
    );
    let tail_from = Instant::now();
    guard
        .unlock_after(Duration::from_millis(300))
        .await
        .unwrap();
    let token = waiter.await.unwrap();
    let waited = tail_from.elapsed();
    assert!(token.is_some());
    // The tail, then the free-lock bound (generous here); the defect waited for the end of the
    // old 30 s lease, or here the waiter's own 10 s deadline (its last try).
    assert!(
        waited < Duration::from_secs(5),
        "the waiter slept past the tail: got the lock {waited:?} after unlock_after"
    );
}

/// A fair lock's waiter behind a waiter that died: the holder (an explicit 20 s lease)
/// releases early and the turn is reserved for the dead head. The waiter behind must get the
/// lock once the dead head's entry lapses (one watchdog lease after its last renewal), not at
/// the end of the holder's old lease.
///
/// Failed before the fix: the waiter got the lock 20 s after the grant, when the holder's
/// lease would have ended: its busy bound was that lease, and nobody told it when the dead
/// head's reservation ran out. Found while documenting the fair lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect15_a_fair_waiter_behind_a_dead_one_does_not_sleep_on_the_old_lease() {
    let redis = server();
    let lease = Duration::from_millis(1500);
    let a = common::client_with_lease(&redis.url(), lease).await;
    let c = common::client_with_lease(&redis.url(), lease).await;
    let lock = a.fair_lock("dead-head").unwrap();
    let waiters = lock.keys().waiters();
    let guard = lock.lock_with_lease(Duration::from_secs(20)).await.unwrap();
    let child = common::spawn_fair_waiter(&redis, "dead-head", lease);
    assert!(common::eventually(Duration::from_secs(20), || zcard(&redis, &waiters) == 1).await);
    let behind = {
        let lock = c.fair_lock("dead-head").unwrap();
        tokio::spawn(async move {
            lock.try_lock_for(Duration::from_secs(10))
                .await
                .unwrap()
                .map(|g| g.fencing_token())
        })
    };
    assert!(common::eventually(Duration::from_secs(20), || zcard(&redis, &waiters) == 2).await);
    child.kill().unwrap();
    let released = Instant::now();
    guard.unlock().await.unwrap();
    let token = behind.await.unwrap();
    let waited = released.elapsed();
    assert!(token.is_some());
    // The dead head's entry lapses within one lease (1.5 s) of its last renewal; generous
    // slack. The defect slept until the waiter's own 10 s deadline (the holder's lease: 20 s).
    assert!(
        waited < lease + Duration::from_secs(3),
        "the waiter behind the dead head got the lock {waited:?} after the release"
    );
}

/// Two fair-lock clients with different watchdog leases: the one with the short lease gives up
/// its wait. The one with the long lease must keep its place (its entry must not expire with
/// the queue's key, whose TTL the short-lease client set).
///
/// Failed before the fix: every write of the queue set its TTL to the writer's lease + 1 s,
/// also shortening it; the queue keys expired 2 s after B left, taking A's entry with them, and
/// a later waiter C was served before A. Found while documenting the fair lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect16_a_short_lease_client_does_not_expire_a_long_lease_clients_place() {
    let redis = server();
    let url = redis.url();
    let holder = client(&url).await;
    let a = common::client_with_lease(&url, Duration::from_secs(30)).await;
    let b = common::client_with_lease(&url, Duration::from_secs(1)).await;
    let c = client(&url).await;
    let lock = holder.fair_lock("mixed").unwrap();
    let waiters = lock.keys().waiters();
    let guard = lock.lock_with_lease(Duration::from_secs(60)).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let spawn = |client: &LockClient, who: &'static str| {
        let lock = client.fair_lock("mixed").unwrap();
        let order = order.clone();
        tokio::spawn(async move {
            let guard = lock.try_lock_for(Duration::from_secs(20)).await.unwrap();
            if let Some(guard) = guard {
                order.lock().push(who);
                guard.unlock().await.unwrap();
            }
        })
    };
    let first = spawn(&a, "a");
    assert!(common::eventually(Duration::from_secs(10), || zcard(&redis, &waiters) == 1).await);
    // B queues behind A with its short lease, and gives up.
    assert!(b
        .fair_lock("mixed")
        .unwrap()
        .try_lock_for(Duration::from_millis(300))
        .await
        .unwrap()
        .is_none());
    assert!(common::eventually(Duration::from_secs(10), || zcard(&redis, &waiters) == 1).await);
    // Past the short lease's TTL on the queue keys.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let later = spawn(&c, "c");
    assert!(common::eventually(Duration::from_secs(10), || zcard(&redis, &waiters) == 2).await);
    guard.unlock().await.unwrap();
    first.await.unwrap();
    later.await.unwrap();
    assert_eq!(*order.lock(), vec!["a", "c"]);
}

#[test]
fn child_holder_entry_point() {
    common::run_child_holder_if_asked();
}

/// A task takes a read/write lock's write side and hands the guard to a worker (detach); the
/// task itself then asks for the read side. The worker still writes: the task must wait.
///
/// Failed before the fix: the read was granted at once, as the writer's own downgrade (one
/// owner in Redis), while the worker's write guard was still held. Found while documenting
/// the read/write lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect17_a_detached_write_guard_excludes_its_own_tasks_reads() {
    let redis = server();
    let a = client(&redis.url()).await;
    let rw = a.rw_lock("doc").unwrap();
    let w = rw.write().lock().await.unwrap().detach();
    let writing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let worker = {
        let writing = writing.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            writing.store(false, std::sync::atomic::Ordering::SeqCst);
            w.unlock().await.unwrap();
        })
    };
    assert!(
        rw.read().try_lock().await.unwrap().is_none(),
        "read granted while another task holds the write guard"
    );
    let r = rw
        .read()
        .try_lock_for(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("granted once the worker released");
    assert!(!writing.load(std::sync::atomic::Ordering::SeqCst));
    r.unlock().await.unwrap();
    worker.await.unwrap();
}

/// A write release with more than 100 readers waiting lets every one of them in at once.
///
/// Failed before the fix: the release told the first 100; the others woke on their timers
/// (about the writer's 30 s lease later). Found while documenting the read/write lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect18_a_write_release_wakes_more_than_a_hundred_readers() {
    let redis = server();
    let url = redis.url();
    let writer = client(&url).await;
    let rw = writer.rw_lock("board").unwrap();
    let waiters = rw.read().keys().waiters();
    let w = rw.write().lock().await.unwrap();
    let mut clients = Vec::new();
    for _ in 0..13 {
        clients.push(client(&url).await);
    }
    // Every reader holds until all are in (or 20 s pass): the release must let all of them in
    // together, not only those a later read release would tell.
    let all_in = Arc::new(tokio::sync::Barrier::new(130));
    let mut readers = Vec::new();
    for i in 0..130 {
        let rw = clients[i % 13].rw_lock("board").unwrap();
        let all_in = all_in.clone();
        readers.push(tokio::spawn(async move {
            let guard = rw
                .read()
                .try_lock_for(Duration::from_secs(40))
                .await
                .unwrap();
            let at = Instant::now();
            let _ = tokio::time::timeout(Duration::from_secs(20), all_in.wait()).await;
            guard.expect("every reader gets in").unlock().await.unwrap();
            at
        }));
    }
    assert!(
        common::eventually(Duration::from_secs(20), || zcard(&redis, &waiters) == 130).await,
        "the readers queued: {}",
        zcard(&redis, &waiters)
    );
    let released = Instant::now();
    w.unlock().await.unwrap();
    let mut last = Duration::ZERO;
    for reader in readers {
        last = last.max(reader.await.unwrap() - released);
    }
    assert!(
        last < Duration::from_secs(10),
        "the last reader got in {last:?} after the write release"
    );
}

/// force_unlock on a read/write lock that is only reserved for a writer's turn (the hash holds
/// just the reservation) lets every reader waiting in.
///
/// Failed before the fix: the script could not tell the lock's kind from such a hash and
/// handed it on as a fair lock: reserved for the first reader alone; the second waited for the
/// first to release. Found while documenting the read/write lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect19_force_unlock_of_a_reserved_rw_lock_lets_all_readers_in() {
    let redis = server();
    let url = redis.url();
    let (a, b, c) = (client(&url).await, client(&url).await, client(&url).await);
    let rw = a.rw_lock("menu").unwrap();
    let keys = rw.write().keys().clone();
    let w = rw.write().lock().await.unwrap().detach();
    let both_in = Arc::new(tokio::sync::Barrier::new(2));
    let mut readers = Vec::new();
    for client in [&b, &c] {
        let rw = client.rw_lock("menu").unwrap();
        let both_in = both_in.clone();
        readers.push(tokio::spawn(async move {
            let guard = rw.read().lock().await.unwrap();
            let together = tokio::time::timeout(Duration::from_secs(5), both_in.wait()).await;
            guard.unlock().await.unwrap();
            together.is_ok()
        }));
    }
    assert!(
        common::eventually(Duration::from_secs(10), || zcard(&redis, &keys.waiters())
            == 2)
        .await
    );
    // The state a writer's turn leaves: the hash holds only the reservation and the kind (the
    // writer's entry has lapsed). Written in one step: a reader's try between a DEL and the
    // rewrite would find the lock free, or (before the kind is back) another kind's.
    cmd(
        &redis,
        &[
            "EVAL",
            "redis.call('DEL', KEYS[1], KEYS[2]) \
             redis.call('HSET', KEYS[1], '~turn:gone:t1', '0', '~kind', 'rw') \
             redis.call('PEXPIRE', KEYS[1], 60000)",
            "2",
            keys.hash(),
            &keys.leases(),
        ],
    );
    assert!(rw.write().force_unlock().await.unwrap());
    for reader in readers {
        assert!(
            reader.await.unwrap(),
            "the readers were not let in together"
        );
    }
    drop(w);
}

/// A semaphore's waiter keeps what it wants (`P:{N}:wants`) for as long as its place in line:
/// the watchdog's renewal of its entry also renews that.
///
/// Failed before the fix: the renewal extended the waiter's entry but not `:wants`, which only
/// the waiter's own tries kept (for its lease + 1 s); a waiter whose tries were delayed (2 s
/// of latency with a 6 s lease) lost it, and a small request was served ahead of its large one.
/// Found while documenting the semaphore.
#[tokio::test]
async fn defect20_a_semaphore_waiters_wants_live_as_long_as_its_entry() {
    let redis = server();
    let a = client(&redis.url()).await;
    let semaphore = a.semaphore("wants").unwrap();
    let keys = semaphore.keys().clone();
    let id = "0123456789abcdef0123456789abcdef:o1";
    cmd(&redis, &["ZADD", &keys.waiters(), "1", id]);
    cmd(
        &redis,
        &["ZADD", &keys.waiters_until(), "99999999999999", id],
    );
    cmd(&redis, &["HSET", &keys.wants(), id, "3"]);
    for key in [keys.waiters(), keys.waiters_until(), keys.wants()] {
        cmd(&redis, &["PEXPIRE", &key, "500"]);
    }
    let renewal = leasehold_core::commands::Renewal {
        hold: leasehold_core::HoldId::new(keys.clone(), leasehold::Owner::from_id(id)),
        token: None,
    };
    let lease = leasehold::Lease::new(Duration::from_secs(30)).unwrap();
    let renewed = leasehold_core::commands::renew(a.redis(), &common::scripts(), &[renewal], lease)
        .await
        .unwrap();
    assert_eq!(renewed, vec![true]);
    for key in [keys.waiters(), keys.waiters_until(), keys.wants()] {
        assert!(
            pttl(&redis, &key) > 20_000,
            "{key} was not renewed: {}",
            pttl(&redis, &key)
        );
    }
}

/// Two acquires of one owner joined in one task on a fair lock: the first takes the lock,
/// holds it briefly and releases; the second must not sleep on the first's lease.
///
/// Failed before the fix: the second was granted when the first's lease would have ended (30 s
/// with the default lease; `try_lock_for(10 s)` got it only at its own deadline): it slept on
/// the busy hint its sibling's grant left, on the owner's own channel, which a fair release
/// never messages. Found by the chaos checker's fair-lock mode (a free `fair-0` with nobody in
/// line while two joined waiters slept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defect21_joined_acquires_of_one_owner_on_a_fair_lock_do_not_sleep_on_each_other() {
    let redis = server();
    let a = client(&redis.url()).await;
    for lock in [
        a.fair_lock("joined").unwrap(),
        a.fair_lock("joined-nr").unwrap().non_reentrant(),
    ] {
        // Another task holds the lock first, so both joined acquires wait in the engine.
        let held = {
            let lock = lock.clone();
            let (tx, rx) = tokio::sync::oneshot::channel();
            tokio::spawn(async move {
                let guard = lock.lock().await.unwrap();
                tx.send(()).unwrap();
                tokio::time::sleep(Duration::from_millis(200)).await;
                guard.unlock().await.unwrap();
            });
            rx
        };
        held.await.unwrap();
        // Two joined acquires of this task, both waiting; whichever gets the lock first holds
        // it 50 ms and releases it: the other must follow within the free-lock bound.
        let take = || async {
            let guard = lock.try_lock_for(Duration::from_secs(10)).await.unwrap();
            let granted = Instant::now();
            let guard = guard.expect("each acquire gets the lock");
            tokio::time::sleep(Duration::from_millis(50)).await;
            guard.unlock().await.unwrap();
            (granted, Instant::now())
        };
        let (a, b) = tokio::join!(take(), take());
        let (first, second) = if a.0 <= b.0 { (a, b) } else { (b, a) };
        let late = second.0.saturating_duration_since(first.1);
        assert!(
            late < Duration::from_secs(3),
            "{}: the second acquire got the lock {late:?} after the first released",
            lock.name()
        );
    }
}

/// Found by the model checker (`crates/model`) when a client had a queue of its own in Redis: a
/// key a waiter's try creates must get a TTL, or a crash of that client leaves it in Redis until
/// the next release of the name, which may never come. A plain lock's waiter now lines up in
/// the lock's line: the line and the deadlines its try creates expire with the entry.
#[tokio::test]
async fn defect22_a_line_made_by_a_waiters_try_expires() {
    let redis = server();
    let client = client(&redis.url()).await;
    let lock = client.lock("stock:queue-ttl").unwrap();
    let keys = lock.keys();
    let lease = leasehold::Lease::new(Duration::from_secs(5)).unwrap();
    let _held = lock.try_lock().await.unwrap().expect("free");
    let owner = client.new_owner();
    let tried = leasehold_core::commands::acquire(
        client.redis(),
        &common::scripts(),
        keys,
        &owner,
        lease,
        leasehold_core::commands::AcquireMode::Waiter {
            entry_life: lease,
            non_reentrant: false,
            fixed_lease: false,
        },
    )
    .await
    .unwrap();
    assert!(
        matches!(tried, leasehold_core::commands::Acquire::Held { .. }),
        "{tried:?}"
    );
    for key in [keys.waiters(), keys.waiters_until()] {
        let ttl = pttl(&redis, &key);
        assert!(
            ttl > 0 && ttl <= 5_000 + 1_000,
            "{key} expires with the waiter's entry: PTTL {ttl}"
        );
    }
}
