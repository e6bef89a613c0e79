//! A lock client over an application's own fred client (`LockClient::builder_from_client`):
//! lock commands share its connections yet go out with the options a lock needs (one write
//! attempt, no redirection followed by fred), whatever the application configured; and every
//! kind of lock over RESP3 as over RESP2.

mod common;

use std::time::Duration;

use common::{exists, hget, server};
use fred::clients::Client;
use fred::interfaces::{ClientLike, KeysInterface};
use fred::types::config::{Config, ReconnectPolicy};
use fred::types::RespVersion;
use leasehold::{LockClient, LockError};
use leasehold_testkit::RedisServer;

/// An application's client with fred's defaults (three write attempts, redirections followed),
/// connected.
async fn app_client(url: &str, version: RespVersion) -> Client {
    let mut config = Config::from_url(url).unwrap();
    config.version = version;
    let app = Client::new(
        config,
        None,
        None,
        Some(ReconnectPolicy::new_constant(0, 20)),
    );
    app.init().await.expect("the application's client connects");
    app
}

/// Connections the server has open (`CLIENT LIST`, the testkit's own included).
fn connections(redis: &RedisServer) -> usize {
    let list = redis.command(&["CLIENT", "LIST"]).unwrap();
    list.as_str().unwrap_or_default().lines().count()
}

/// Lock commands go through the application's connection: building adds none for commands,
/// the locks work (a wait handed over by a release message, on the subscriber leasehold opens
/// beside it), and dropping the lock client leaves the application's client open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_client_over_the_applications_client_shares_its_connections() {
    let redis = server();
    let app = app_client(&redis.url(), RespVersion::RESP2).await;
    let before = connections(&redis);
    let locks = LockClient::builder_from_client(&app).build().await.unwrap();
    assert_eq!(
        connections(&redis),
        before,
        "no command connection of its own (the subscriber opens when a wait needs it)"
    );
    let lock = locks.lock("shared:report").unwrap();
    let guard = lock.lock().await.unwrap();
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock().await.map(|g| g.detach()) })
    };
    assert!(
        common::eventually(Duration::from_secs(10), || locks.subscribed_channels() == 1).await,
        "the waiter subscribed"
    );
    let first = guard.fencing_token();
    guard.unlock().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > first);
    next.unlock().await.unwrap();
    assert!(!exists(&redis, "leasehold:{shared:report}"));
    drop(locks);
    let _: () = app.set("after", 1, None, None, false).await.unwrap();
    assert!(app.is_connected(), "the application's client stays open");
    app.quit().await.unwrap();
}

/// The application's client would resend a command in flight after a reconnect (fred's
/// default: three attempts); a release sent through it is still sent once, or a resent release
/// would take a second hold away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_over_the_applications_client_is_not_resent_after_a_lost_reply() {
    let redis = server();
    let proxy = leasehold_testkit::Proxy::start(redis.addr()).await.unwrap();
    let app = app_client(&proxy.url(), RespVersion::RESP2).await;
    assert!(app.connection_config().max_command_attempts > 1);
    let locks = LockClient::builder_from_client(&app).build().await.unwrap();
    let lock = locks.lock("shared:lost-reply").unwrap();
    let outer = lock.try_lock().await.unwrap().unwrap();
    let inner = lock.try_lock().await.unwrap().unwrap();
    let key = "leasehold:{shared:lost-reply}";
    assert_eq!(hget(&redis, key, outer.owner().id()), Some(2));
    proxy.drop_replies(1);
    let result = inner.unlock().await;
    assert!(
        matches!(result, Err(LockError::Connection(_) | LockError::Timeout)),
        "the caller learns the outcome is unknown: {result:?}"
    );
    // Give a (wrong) resend every chance: wait until the client reconnected and answers.
    assert!(common::locked_once_answering(&lock).await);
    assert_eq!(
        hget(&redis, key, outer.owner().id()),
        Some(1),
        "the release ran exactly once"
    );
    outer.unlock().await.unwrap();
    assert!(!exists(&redis, key));
}

/// Every kind over a RESP3 connection, leasehold's own and an application's: replies of the
/// scripts and reads, and release messages (RESP3 pushes), are read as over RESP2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_works_over_resp3() {
    let redis = server();
    let mut config = Config::from_url(&redis.url()).unwrap();
    config.version = RespVersion::RESP3;
    let own = LockClient::builder_from_config(config)
        .build()
        .await
        .unwrap();
    let app = app_client(&redis.url(), RespVersion::RESP3).await;
    let shared = LockClient::builder_from_client(&app).build().await.unwrap();
    for (label, a, b) in [("own", &own, &shared), ("shared", &shared, &own)] {
        let name = |kind: &str| format!("resp3:{label}:{kind}");
        // A plain lock: re-entry, a waiter woken by the release.
        let lock = a.lock(&name("lock")).unwrap();
        let guard = lock.lock().await.unwrap();
        let again = lock.lock().await.unwrap();
        assert_eq!(again.hold_count(), 2);
        assert_eq!(lock.hold_count().await.unwrap(), 2);
        drop(again);
        let waiter = {
            let lock = b.lock(&name("lock")).unwrap();
            tokio::spawn(async move { lock.lock().await.map(|g| g.detach()) })
        };
        assert!(
            common::eventually(Duration::from_secs(10), || b.subscribed_channels() >= 1).await,
            "{label}: the waiter subscribed"
        );
        guard.unlock().await.unwrap();
        let handed = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("woken by the release")
            .unwrap()
            .unwrap();
        handed.unlock().await.unwrap();
        assert!(!lock.is_locked().await.unwrap());
        // A fair lock.
        let fair = a.fair_lock(&name("fair")).unwrap();
        fair.lock().await.unwrap().unlock().await.unwrap();
        // A read/write lock: two readers, then a writer.
        let rw = a.rw_lock(&name("rw")).unwrap();
        let r1 = rw.read().lock().await.unwrap();
        let rw_b = b.rw_lock(&name("rw")).unwrap();
        let r2 = rw_b.read().lock().await.unwrap();
        let writer = {
            let rw = rw.clone();
            tokio::spawn(async move { rw.write().try_lock().await.map(|g| g.is_some()) })
        };
        assert!(!writer.await.unwrap().unwrap(), "{label}: readers hold it");
        r1.unlock().await.unwrap();
        r2.unlock().await.unwrap();
        rw.write().lock().await.unwrap().unlock().await.unwrap();
        // A semaphore.
        let semaphore = a.semaphore(&name("sem")).unwrap();
        assert!(semaphore.try_set_permits(2).await.unwrap());
        let permit = semaphore.acquire(2).await.unwrap();
        assert_eq!(semaphore.available_permits().await.unwrap(), 0);
        permit.release().await.unwrap();
        assert_eq!(semaphore.available_permits().await.unwrap(), 2);
        // A latch: a waiter on the other client goes when it opens.
        let latch = a.latch(&name("latch")).unwrap();
        assert!(latch.try_set_count(1).await.unwrap());
        let waiting = {
            let latch = b.latch(&name("latch")).unwrap();
            tokio::spawn(async move { latch.wait_for(Duration::from_secs(10)).await })
        };
        assert_eq!(latch.count().await.unwrap(), 1);
        assert_eq!(latch.count_down().await.unwrap(), 0);
        assert!(waiting.await.unwrap().unwrap(), "{label}: the latch opened");
    }
}

/// An application's client that never reconnects is refused at build (every hold would be
/// lost for good at the first dropped connection), and so is one that was never initialized
/// (after the command timeout, not forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_client_that_cannot_serve_locks_is_refused() {
    let redis = server();
    let config = Config::from_url(&redis.url()).unwrap();
    let never_reconnects = Client::new(config.clone(), None, None, None);
    never_reconnects.init().await.unwrap();
    let refused = LockClient::builder_from_client(&never_reconnects)
        .build()
        .await
        .expect_err("no reconnect policy");
    assert!(
        matches!(&refused, LockError::InvalidArgument(m) if m.contains("reconnect policy")),
        "{refused:?}"
    );
    // With a policy set for it, the same client serves locks.
    let locks = LockClient::builder_from_client(&never_reconnects)
        .reconnect_policy(ReconnectPolicy::default())
        .build()
        .await;
    assert!(
        matches!(&locks, Err(LockError::InvalidArgument(_))),
        "the subscriber's policy does not make the client reconnect: {locks:?}"
    );
    let not_initialized = Client::new(config, None, None, Some(ReconnectPolicy::default()));
    let refused = LockClient::builder_from_client(&not_initialized)
        .command_timeout(Duration::from_millis(300))
        .build()
        .await
        .expect_err("never initialized");
    assert!(
        matches!(&refused, LockError::Connection(e) if e.to_string().contains("init()")),
        "{refused:?}"
    );
}
