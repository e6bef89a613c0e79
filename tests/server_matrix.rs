//! What a server lacks or refuses, detected at build and handled. Every test runs on whichever
//! server the testkit starts (`$LEASEHOLD_REDIS_SERVER`; `just test-on redis6`, `just test-on
//! valkey`), and checks what that server calls for:
//!
//! - Release messages on a cluster: sharded (`SPUBLISH`, waiters `SSUBSCRIBE`) where the server
//!   has it (Redis 7+, Valkey), plain `PUBLISH`/`SUBSCRIBE` on Redis 6.2, which has no sharded
//!   pub/sub. Either way a waiter is woken by the release, not by the holder's lease.
//! - Replica sync whose command the deployment refuses fails at build with a typed error that
//!   says what to do, not at the first grant: `WAIT` renamed away (`rename-command WAIT ""`, as
//!   serverless offerings answer "unknown command"), `WAIT` outside the user's ACL, and
//!   `WAITAOF` where the server lacks it (before Redis 7.2) or the ACL refuses it.
//! - A server that refuses `SUBSCRIBE` serves locks that need no wait; a wait fails at once.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::set_user;
use leasehold::{LockClient, LockError, ReplicaSync};
use leasehold_testkit::{RedisCluster, RedisServer};

const WAIT_SYNC: ReplicaSync = ReplicaSync::Replicas {
    replicas: 1,
    timeout: Duration::from_millis(100),
};

const AOF_SYNC: ReplicaSync = ReplicaSync::Aof {
    local: false,
    replicas: 1,
    timeout: Duration::from_millis(100),
};

fn version_line(server: &RedisServer) -> String {
    let info = server.info("server").expect("INFO server");
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    match field("valkey_version:") {
        Some(valkey) => format!("valkey {valkey}"),
        None => format!("redis {}", field("redis_version:").unwrap_or_default()),
    }
}

async fn build(url: &str, sync: ReplicaSync) -> leasehold::Result<LockClient> {
    LockClient::builder(url)
        .command_timeout(Duration::from_secs(2))
        .replica_sync(sync)
        .build()
        .await
}

/// A holder with a 30 s lease releases; the waiter on another client must have the lock well
/// before that lease would have run out: it was woken by the release message. On a server
/// without `SPUBLISH` (Redis 6.2) the client falls back to `PUBLISH`/`SUBSCRIBE`.
///
/// Before the testkit formed clusters with `CLUSTER ADDSLOTS`, a 6.2 cluster could not be
/// started at all (`ADDSLOTSRANGE` is Redis 7.0+), so this path was never run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_a_cluster_is_woken_by_the_release_with_or_without_sharded_pubsub() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start_with(3, 0))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("cannot start a cluster: {e}"));
    let cluster = Arc::new(cluster);
    let sharded = cluster.node(0).has_command("SPUBLISH").unwrap();
    eprintln!(
        "{} cluster, SPUBLISH {}",
        version_line(cluster.node(0)),
        if sharded { "present" } else { "absent" }
    );
    let client = || async {
        LockClient::builder(&cluster.url())
            .lease(Duration::from_secs(30))
            .build()
            .await
            .expect("connect to the cluster")
    };
    let (a, b) = (client().await, client().await);
    for node in cluster.nodes() {
        node.command(&["CONFIG", "RESETSTAT"]).unwrap();
    }
    let name = "matrix";
    let held = a.lock(name).unwrap();
    let guard = held.try_lock().await.unwrap().expect("free");
    let waiter = {
        let lock = b.lock(name).unwrap();
        tokio::spawn(async move {
            lock.try_lock_for(Duration::from_secs(20))
                .await
                .map(|g| g.map(|g| g.detach()))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.waiters() == 0 {
        assert!(Instant::now() < deadline, "the waiter never registered");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let released = Instant::now();
    guard.unlock().await.unwrap();
    let handed = tokio::time::timeout(Duration::from_secs(25), waiter)
        .await
        .expect("the waiter returns within its wait")
        .unwrap()
        .unwrap()
        .expect("the waiter gets the lock");
    let after = released.elapsed();
    eprintln!("handed over {after:?} after the release");
    assert!(
        after < Duration::from_secs(5),
        "woken by the release, not by the 30 s lease: {after:?}"
    );
    handed.unlock().await.unwrap();
    let (mut publish, mut spublish) = (0, 0);
    for node in cluster.nodes() {
        publish += node.command_calls("publish").unwrap();
        spublish += node.command_calls("spublish").unwrap();
    }
    if sharded {
        assert!(spublish >= 1, "the releases used SPUBLISH");
        assert_eq!(publish, 0, "and never PUBLISH");
    } else {
        assert!(publish >= 1, "without SPUBLISH the releases used PUBLISH");
        assert_eq!(spublish, 0);
    }
}

/// `WAIT` renamed away, as a managed service without it answers: `ReplicaSync::Replicas` is
/// refused at build (`InvalidArgument`, naming WAIT and what to do instead); without replica
/// sync the same server serves locks.
///
/// Failed before: the build succeeded, and every grant then failed on the refused `WAIT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_sync_is_refused_at_build_where_wait_is_unknown() {
    let server = RedisServer::builder()
        .args(["--rename-command", "WAIT", ""])
        .start()
        .unwrap_or_else(|e| panic!("cannot start a server without WAIT: {e}"));
    assert!(
        !server.has_command("WAIT").unwrap(),
        "{}: WAIT is renamed away",
        version_line(&server)
    );
    match build(&server.url(), WAIT_SYNC).await {
        Err(LockError::InvalidArgument(message)) => {
            assert!(
                message.contains("WAIT") && message.contains("ReplicaSync::None"),
                "{message}"
            );
            eprintln!("refused at build: {message}");
        }
        other => panic!("expected InvalidArgument at build, got {other:?}"),
    }
    let client = build(&server.url(), ReplicaSync::None).await.unwrap();
    let lock = client.lock("no-wait").unwrap();
    let guard = lock.try_lock().await.unwrap().expect("free");
    guard.unlock().await.unwrap();
}

/// A user whose ACL leaves out `WAIT` (or `WAITAOF`): replica sync is refused at build with
/// `PermissionDenied`, saying which permission to add. The same user with the permission
/// builds. `WAITAOF` on a server that lacks it (Redis 6.2) is `InvalidArgument` even for a
/// user who may run every command.
///
/// Failed before: the build succeeded, and every grant then failed with `PermissionDenied`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_sync_is_refused_at_build_for_a_user_without_the_permission() {
    let server = RedisServer::start().unwrap_or_else(|e| panic!("cannot start a server: {e}"));
    let has_waitaof = server.has_command("WAITAOF").unwrap();
    eprintln!(
        "{}: WAITAOF {}",
        version_line(&server),
        if has_waitaof { "present" } else { "absent" }
    );
    // 6.2 refuses a rule that names a command it does not know.
    let refused = if has_waitaof {
        "-wait -waitaof"
    } else {
        "-wait"
    };
    set_user(&server, "nowait", &format!("on >pw ~* &* +@all {refused}"));
    set_user(&server, "all", "on >pw ~* &* +@all");
    let url = |user: &str| format!("redis://{user}:pw@127.0.0.1:{}", server.port());

    match build(&url("nowait"), WAIT_SYNC).await {
        Err(LockError::PermissionDenied(error)) => {
            let message = error.to_string();
            assert!(message.contains("+wait"), "{message}");
            eprintln!("refused at build: {message}");
        }
        other => panic!("expected PermissionDenied at build, got {other:?}"),
    }
    build(&url("all"), WAIT_SYNC)
        .await
        .expect("with +wait the build succeeds");

    match (has_waitaof, build(&url("nowait"), AOF_SYNC).await) {
        (true, Err(LockError::PermissionDenied(error))) => {
            assert!(error.to_string().contains("+waitaof"), "{error}");
        }
        (false, Err(LockError::InvalidArgument(message))) => {
            assert!(message.contains("WAITAOF"), "{message}");
        }
        (_, other) => panic!("WAITAOF present {has_waitaof}: {other:?}"),
    }
    match (has_waitaof, build(&url("all"), AOF_SYNC).await) {
        (true, Ok(_)) => {}
        (false, Err(LockError::InvalidArgument(message))) => {
            assert!(message.contains("Redis 7.2"), "{message}");
        }
        (_, other) => panic!("WAITAOF present {has_waitaof}: {other:?}"),
    }
}

/// A server that refuses `SUBSCRIBE` (renamed away here; some proxies and managed services
/// answer "unknown command"): the build succeeds and locks that need no wait work. With waking
/// by messages only (`Waking::PubSub`) a wait on a held lock fails at once with the server's
/// refusal instead of sleeping until the holder's 30 s lease runs out; by default
/// (`Waking::Auto`) the client turns to waking by timer, and the waiter gets the lock soon
/// after its release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_subscribe_waits_fail_at_once_or_turn_to_the_timer() {
    let server = RedisServer::builder()
        .args(["--rename-command", "SUBSCRIBE", ""])
        .start()
        .unwrap_or_else(|e| panic!("cannot start a server without SUBSCRIBE: {e}"));
    let lease = Duration::from_secs(30);
    let url = server.url();
    let client = |waking| {
        let url = url.clone();
        async move {
            LockClient::builder(&url)
                .lease(lease)
                .waking(waking)
                .build()
                .await
                .expect("the build needs no SUBSCRIBE")
        }
    };
    let a = client(leasehold::Waking::PubSub).await;
    let b = client(leasehold::Waking::PubSub).await;
    let held = a.lock("no-subscribe").unwrap();
    let guard = held.try_lock().await.unwrap().expect("free");
    let lock = b.lock("no-subscribe").unwrap();
    for bounded in [true, false] {
        let started = Instant::now();
        let waited = if bounded {
            lock.try_lock_for(Duration::from_secs(20)).await.map(drop)
        } else {
            tokio::time::timeout(Duration::from_secs(20), lock.lock())
                .await
                .expect("lock() returns before the holder's lease ends")
                .map(drop)
        };
        let took = started.elapsed();
        // The refusal comes back as the server's error, or, when fred hands it to no command,
        // as the confirming PING's finding that the connection is not subscribed.
        match waited {
            Err(LockError::Redis(error)) => {
                assert!(error.to_string().contains("SUBSCRIBE"), "{error}")
            }
            Err(LockError::PermissionDenied(error)) => {
                assert!(error.to_string().contains("SUBSCRIBE"), "{error}")
            }
            other => panic!("bounded {bounded}: expected the refusal, got {other:?}"),
        }
        assert!(
            took < Duration::from_secs(2),
            "failed at once, not after {took:?}"
        );
    }
    // By default the refusal turns the waiting client to the timer.
    let c = client(leasehold::Waking::Auto).await;
    let waiting = {
        let lock = c.lock("no-subscribe").unwrap();
        tokio::spawn(async move {
            lock.try_lock_for(Duration::from_secs(20))
                .await
                .map(|g| g.map(|g| g.detach()))
        })
    };
    assert!(
        common::eventually(Duration::from_secs(10), || c.wakes_by_timer()).await,
        "the refused SUBSCRIBE turned nothing"
    );
    let released = Instant::now();
    guard.unlock().await.unwrap();
    let got = waiting
        .await
        .unwrap()
        .unwrap()
        .expect("granted after the release");
    assert!(
        released.elapsed() < Duration::from_secs(10),
        "woken by the timer, not by the 30 s lease: {:?}",
        released.elapsed()
    );
    got.unlock().await.unwrap();
    let free = lock.try_lock_for(Duration::from_secs(2)).await.unwrap();
    free.expect("a free lock is granted without waiting")
        .unlock()
        .await
        .unwrap();
}
