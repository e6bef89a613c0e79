//! Waiting without pub/sub: every kind of lock woken by a timer, chosen in the builder
//! (`Waking::Timer`) or taken by `Waking::Auto` when the server refuses leasehold's channels
//! (an ACL) or its `SUBSCRIBE` (as a proxy without pub/sub does), against real redis-servers.

mod common;

use std::time::Duration;

use common::{cmd, lock_keys, server, set_user, until_queued, Order, ACL_RULE};
use leasehold::{LockClient, Waking};
use leasehold_testkit::RedisServer;

/// The documented ACL rule (`common::ACL_RULE`) without any channel: no PUBLISH and no
/// SUBSCRIBE of leasehold's channels; password `pw`.
fn no_channels() -> String {
    ACL_RULE
        .replace(">s3cr3t-Pa55", ">pw")
        .replace(" &leasehold:*", "")
}

fn acl_denials(redis: &RedisServer) -> usize {
    cmd(redis, &["ACL", "LOG"])
        .as_array()
        .map_or(0, |e| e.len())
}

async fn build(url: &str, waking: Waking) -> LockClient {
    LockClient::builder(url)
        .waking(waking)
        .build()
        .await
        .expect("connect")
}

/// Runs `acquire` while `holder` holds, releases with `release`, and checks the waiter got in
/// long before the holder's 30 s lease would have freed it: woken by its timer.
async fn waits_and_gets_in<G: Send + 'static>(
    what: &str,
    acquire: impl std::future::Future<Output = leasehold::Result<G>> + Send + 'static,
    until_waiting: impl std::future::Future<Output = ()>,
    release: impl std::future::Future<Output = ()>,
) -> G {
    let waiter = tokio::spawn(acquire);
    until_waiting.await;
    assert!(
        !waiter.is_finished(),
        "{what}: the waiter got in while held"
    );
    release.await;
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap_or_else(|_| panic!("{what}: not woken within 10 s of the release"))
        .unwrap()
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Until `waiter`'s first try was answered busy: it is in its client's local line (`waiters`)
/// and the server ran a script since `scripts_before` (the holder only holds meanwhile).
async fn until_tried(redis: &RedisServer, waiter: &LockClient, scripts_before: u64) {
    assert!(
        common::eventually(Duration::from_secs(10), || waiter.waiters() == 1
            && common::script_calls(redis) > scripts_before)
        .await,
        "the waiter never tried"
    );
}

/// Every kind waits and is served with `holder` and `waiter` (both woken by timer, or one of
/// them), and nothing is left in Redis.
async fn every_kind(redis: &RedisServer, holder: &LockClient, waiter: &LockClient) {
    // Plain lock.
    let held = holder.lock("plain").unwrap();
    let guard = held.lock().await.unwrap();
    let lock = waiter.lock("plain").unwrap();
    let before = common::script_calls(redis);
    let got = waits_and_gets_in(
        "plain lock",
        async move { lock.lock().await.map(|g| g.detach()) },
        until_tried(redis, waiter, before),
        async { guard.unlock().await.unwrap() },
    )
    .await;
    got.unlock().await.unwrap();

    // Fair lock: the waiter's entry is in the line even though it hears no message.
    let fair = holder.fair_lock("fair").unwrap();
    let waiters_key = fair.keys().waiters();
    let guard = fair.lock().await.unwrap();
    let lock = waiter.fair_lock("fair").unwrap();
    let got = waits_and_gets_in(
        "fair lock",
        async move { lock.lock().await.map(|g| g.detach()) },
        until_queued(redis, &waiters_key, 1),
        async { guard.unlock().await.unwrap() },
    )
    .await;
    got.unlock().await.unwrap();

    // Read/write lock: a reader waits for a writer, then a writer for the reader.
    let rw = holder.rw_lock("rw").unwrap();
    let write = rw.write().lock().await.unwrap();
    let reader = waiter.rw_lock("rw").unwrap();
    let line = reader.read().keys().waiters();
    let read = waits_and_gets_in(
        "read side",
        async move { reader.read().lock().await.map(|g| g.detach()) },
        until_queued(redis, &line, 1),
        async { write.unlock().await.unwrap() },
    )
    .await;
    let writer = waiter.rw_lock("rw").unwrap();
    let write = waits_and_gets_in(
        "write side",
        async move { writer.write().lock().await.map(|g| g.detach()) },
        until_queued(redis, &line, 1),
        async { read.unlock().await.unwrap() },
    )
    .await;
    write.unlock().await.unwrap();

    // Semaphore: two permits, both held; the waiter asks for two.
    let sem = holder.semaphore("sem").unwrap();
    assert!(sem.try_set_permits(2).await.unwrap());
    let held = sem.acquire(2).await.unwrap();
    let wanted = waiter.semaphore("sem").unwrap();
    let line = wanted.keys().waiters();
    let permit = waits_and_gets_in(
        "semaphore",
        async move { wanted.acquire(2).await },
        until_queued(redis, &line, 1),
        async { held.release().await.unwrap() },
    )
    .await;
    permit.release().await.unwrap();
    cmd(redis, &["DEL", "leasehold:{sem}"]);

    // Latch: the waiter goes once the count reaches zero.
    let latch = holder.latch("latch").unwrap();
    assert!(latch.try_set_count(1).await.unwrap());
    let waiting = waiter.latch("latch").unwrap();
    let opened = waits_and_gets_in(
        "latch",
        async move { waiting.wait_for(Duration::from_secs(60)).await },
        // (A latch wait looks at the count before it lines up.)
        async {
            assert!(common::eventually(Duration::from_secs(10), || waiter.waiters() == 1).await)
        },
        async { assert_eq!(latch.count_down().await.unwrap(), 0) },
    )
    .await;
    assert!(opened, "the latch opened");

    assert!(
        common::eventually(Duration::from_secs(10), || lock_keys(redis).is_empty()).await,
        "left behind: {:?}",
        lock_keys(redis)
    );
}

/// Chosen in the builder: no subscriber is opened, every kind works, and the releases still
/// publish (for clients of the same names that wait by messages).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_waits_by_timer_without_a_subscription() {
    let redis = server();
    let holder = build(&redis.url(), Waking::timer()).await;
    let waiter = build(&redis.url(), Waking::timer()).await;
    assert!(holder.wakes_by_timer() && waiter.wakes_by_timer());
    cmd(&redis, &["CONFIG", "RESETSTAT"]);
    every_kind(&redis, &holder, &waiter).await;
    assert_eq!(redis.command_calls("subscribe").unwrap(), 0, "no SUBSCRIBE");
    assert_eq!(waiter.subscribed_channels(), 0);
    assert_eq!(waiter.waiters(), 0);
}

/// A client that waits by messages is still woken by a timer client's release: the timer
/// client's scripts publish when the server allows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_clients_release_wakes_a_waiter_that_listens() {
    let redis = server();
    let holder = build(&redis.url(), Waking::timer()).await;
    let waiter = build(&redis.url(), Waking::PubSub).await;
    let held = holder.lock("mixed").unwrap();
    let guard = held.lock().await.unwrap();
    let lock = waiter.lock("mixed").unwrap();
    let got = waits_and_gets_in(
        "a listening waiter",
        async move { lock.lock().await.map(|g| g.detach()) },
        async {
            assert!(
                common::eventually(Duration::from_secs(10), || waiter.subscribed_channels()
                    == 1)
                .await
            );
        },
        async { guard.unlock().await.unwrap() },
    )
    .await;
    got.unlock().await.unwrap();
    assert!(!waiter.wakes_by_timer());
}

/// A user without channel rights: `Waking::Auto` finds PUBLISH refused at build, its scripts
/// publish nothing and its waiters wake by timer; every kind works, and nothing is refused
/// after the build's probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_channel_rights_every_kind_waits_by_timer() {
    let redis = server();
    set_user(&redis, "nochannels", &no_channels());
    let url = format!("redis://nochannels:pw@127.0.0.1:{}", redis.port());
    let holder = build(&url, Waking::Auto).await;
    let waiter = build(&url, Waking::Auto).await;
    assert!(holder.wakes_by_timer() && waiter.wakes_by_timer());
    let denials = acl_denials(&redis);
    every_kind(&redis, &holder, &waiter).await;
    // A force unlock publishes too (nothing here).
    let held = holder.lock("forced").unwrap();
    let guard = held.lock().await.unwrap();
    assert!(waiter.lock("forced").unwrap().force_unlock().await.unwrap());
    drop(guard);
    assert_eq!(
        acl_denials(&redis),
        denials,
        "refused after the build's probe: {:?}",
        cmd(&redis, &["ACL", "LOG"])
    );
    // With waking by messages only, the same user is refused.
    let strict = LockClient::builder(&url)
        .waking(Waking::PubSub)
        .build()
        .await
        .unwrap();
    let held = strict.lock("strict").unwrap();
    let guard = held.lock().await.unwrap();
    assert!(matches!(
        guard.unlock().await,
        Err(leasehold::LockError::PermissionDenied(_))
    ));
}

/// A server that refuses SUBSCRIBE but runs the scripts (as a proxy without pub/sub does):
/// `Waking::Auto` turns to the timer at the first refused SUBSCRIBE, and the wait goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_subscribe_turns_an_auto_client_to_the_timer() {
    let redis = server();
    set_user(
        &redis,
        "nosubscribe",
        &ACL_RULE
            .replace(">s3cr3t-Pa55", ">pw")
            .replace("+subscribe", "-subscribe"),
    );
    let url = format!("redis://nosubscribe:pw@127.0.0.1:{}", redis.port());
    let holder = build(&url, Waking::Auto).await;
    let waiter = build(&url, Waking::Auto).await;
    assert!(!waiter.wakes_by_timer(), "PUBLISH is allowed");
    let held = holder.lock("proxied").unwrap();
    let guard = held.lock().await.unwrap();
    let lock = waiter.lock("proxied").unwrap();
    let got = waits_and_gets_in(
        "a waiter whose SUBSCRIBE was refused",
        async move { lock.lock().await.map(|g| g.detach()) },
        async {
            assert!(common::eventually(Duration::from_secs(10), || waiter.wakes_by_timer()).await);
        },
        async { guard.unlock().await.unwrap() },
    )
    .await;
    got.unlock().await.unwrap();
    assert_eq!(waiter.subscribed_channels(), 0);
}

/// Waking by timer keeps a fair lock's arrival order: each waiter keeps its entry in the line,
/// and a release reserves the lock for the head, which takes it at its next look.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_lock_woken_by_timer_serves_in_arrival_order() {
    let redis = server();
    let holder = build(&redis.url(), Waking::timer()).await;
    let lock = holder.fair_lock("ordered").unwrap();
    let waiters_key = lock.keys().waiters();
    let guard = lock.lock().await.unwrap();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(build(&redis.url(), Waking::timer()).await);
    }
    let order = Order::default();
    let labels = ["0", "1", "2", "3", "4", "5"];
    let mut tasks = Vec::new();
    for (i, label) in labels.into_iter().enumerate() {
        let lock = clients[i % 3].fair_lock("ordered").unwrap();
        tasks.push(order.spawn(label, async move { lock.lock().await.map(|g| g.detach()) }));
        until_queued(&redis, &waiters_key, i as i64 + 1).await;
    }
    guard.unlock().await.unwrap();
    for task in tasks {
        task.await.expect("every waiter gets the lock");
    }
    assert_eq!(order.served(), labels);
    // The last waiter's guard was dropped: its release runs in the background.
    assert!(
        common::eventually(Duration::from_secs(10), || lock_keys(&redis).is_empty()).await,
        "left behind: {:?}",
        lock_keys(&redis)
    );
}

/// Bad timer delays are refused at build.
#[tokio::test]
async fn timer_delays_are_checked_at_build() {
    let redis = server();
    let built = LockClient::builder(&redis.url())
        .waking(Waking::Timer {
            first: Duration::from_millis(50),
            max: Duration::from_millis(10),
        })
        .build()
        .await;
    assert!(matches!(
        built,
        Err(leasehold::LockError::InvalidArgument(_))
    ));
}

/// A RedLock over clients that wake by timer: the waiter gets the quorum soon after the
/// holder's release, not at the end of its 30 s lease, with no subscription on any server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_red_lock_over_timer_clients_is_woken_by_the_timer() {
    let servers: Vec<RedisServer> = (0..3).map(|_| server()).collect();
    let clients = || async {
        let mut clients = Vec::new();
        for redis in &servers {
            clients.push(build(&redis.url(), Waking::timer()).await);
        }
        leasehold::RedLock::new(clients).unwrap()
    };
    let (holder, waiter) = (clients().await, clients().await);
    let held = holder.lock("quorum").unwrap();
    let guard = held.lock().await.unwrap();
    let wanted = waiter.lock("quorum").unwrap();
    let waiting = async {
        let started = std::time::Instant::now();
        let got = wanted.lock().await;
        (got, started.elapsed())
    };
    let release = async {
        // Once the waiter is in line on every server.
        let in_line = || waiter.clients().iter().all(|c| c.waiters() == 1);
        assert!(common::eventually(Duration::from_secs(10), in_line).await);
        guard.unlock().await.unwrap();
    };
    let ((got, waited), ()) = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::join!(waiting, release)
    })
    .await
    .expect("the waiter was granted within 20 s");
    let got = got.expect("granted");
    assert!(
        waited < Duration::from_secs(10),
        "woken by the timer, not by the 30 s lease: {waited:?}"
    );
    got.unlock().await.unwrap();
    for redis in &servers {
        assert_eq!(redis.command_calls("subscribe").unwrap(), 0, "no SUBSCRIBE");
    }
}

/// A timer waiter that gives up (its bounded wait ends, or its future is dropped) leaves
/// nothing behind: no entry in a fair lock's or a semaphore's line, no turn-queue entry, no
/// subscription, and the holder's state untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_waiter_that_gives_up_leaves_nothing() {
    let redis = server();
    let holder = build(&redis.url(), Waking::timer()).await;
    let waiter = build(&redis.url(), Waking::timer()).await;
    let plain = holder.lock("given-up").unwrap();
    let fair = holder.fair_lock("given-up-fair").unwrap();
    let sem = holder.semaphore("given-up-sem").unwrap();
    assert!(sem.try_set_permits(1).await.unwrap());
    let (g1, g2) = (plain.lock().await.unwrap(), fair.lock().await.unwrap());
    let permit = sem.acquire(1).await.unwrap();
    let before = lock_keys(&redis);

    let wait = Duration::from_millis(300);
    let lock = waiter.lock("given-up").unwrap();
    assert!(lock.try_lock_for(wait).await.unwrap().is_none());
    let lock = waiter.fair_lock("given-up-fair").unwrap();
    assert!(lock.try_lock_for(wait).await.unwrap().is_none());
    let wanted = waiter.semaphore("given-up-sem").unwrap();
    assert!(wanted.try_acquire_for(1, wait).await.unwrap().is_none());
    // Dropped mid-wait: a fair waiter whose entry is in the line.
    let lock = waiter.fair_lock("given-up-fair").unwrap();
    let waiters_key = lock.keys().waiters();
    let dropped = tokio::spawn(async move { lock.lock().await.map(drop) });
    until_queued(&redis, &waiters_key, 1).await;
    dropped.abort();
    until_queued(&redis, &waiters_key, 0).await;

    assert!(
        common::eventually(Duration::from_secs(10), || lock_keys(&redis) == before).await,
        "left behind: {:?}, before the waits: {before:?}",
        lock_keys(&redis)
    );
    assert_eq!((waiter.waiters(), waiter.subscribed_channels()), (0, 0));
    assert!(g1.is_held() && g2.is_held() && permit.is_held());
    g1.unlock().await.unwrap();
    g2.unlock().await.unwrap();
    permit.release().await.unwrap();
    cmd(&redis, &["DEL", "leasehold:{given-up-sem}"]);
    assert!(common::eventually(Duration::from_secs(10), || lock_keys(&redis).is_empty()).await);
}
