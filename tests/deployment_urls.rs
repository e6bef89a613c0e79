//! `LockClient::connect` with every URL form of a deployment: `redis-cluster://` with the other
//! nodes as `?node=host:port` (fred's form) to a Redis Cluster of 3 primaries with a replica each,
//! and `redis-sentinel://...?sentinelServiceName=NAME&node=...` to a primary with two replicas
//! under three Sentinels, both started by leasehold-testkit. A lock is taken, waited for and handed
//! over through each. A password in any URL form never shows in the builder's `Debug` or in a
//! connection error.
//!
//! tests/cluster_nodes.rs covers the same deployments through `builder_from_config` (slot
//! moves, failovers); this file covers the URLs users write.

use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::ClientLike;
use leasehold::{LockClient, LockError};
use leasehold_testkit::{RedisCluster, SentinelSet};

const SECRET: &str = "s3cret-Pa55word";
const SENTINEL_SECRET: &str = "sentinel-0nly-Pa55";
const LIMIT: Duration = Duration::from_secs(10);

/// Runs a blocking testkit call off the runtime's workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, f)
        .await
        .unwrap_or_else(|_| panic!("{what} took over {LIMIT:?}"))
}

/// Takes `name` with `a`, has `b` wait for it, releases: `b` gets it with a larger token.
async fn lock_wait_and_hand_over(a: &LockClient, b: &LockClient, name: &str) {
    let lock = a.lock(name).unwrap();
    let guard = within("the first lock", lock.lock()).await.unwrap();
    let waiting = {
        let lock = b.lock(name).unwrap();
        tokio::spawn(async move { lock.lock().await.map(|g| g.detach()) })
    };
    // The waiter's first try is refused while the guard is held; then the release wakes it.
    assert!(lock.is_locked().await.unwrap());
    let first = guard.fencing_token();
    guard.unlock().await.unwrap();
    let next = within(&format!("the waiter on {name}"), waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > first, "{name}: tokens did not grow");
    next.unlock().await.unwrap();
}

/// Ports that were free a moment ago: nothing listens there.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn assert_no_secret(what: &str, text: &str) {
    for secret in [SECRET, SENTINEL_SECRET] {
        assert!(!text.contains(secret), "{what} shows a password: {text}");
    }
}

/// The builder's `Debug` of `url` and the error of connecting to it show no password.
async fn assert_connect_fails_without_secrets(url: &str) -> LockError {
    assert_no_secret(
        "the builder's Debug",
        &format!("{:?}", LockClient::builder(url)),
    );
    let error = within(&format!("connecting to {url}"), LockClient::connect(url))
        .await
        .err()
        .unwrap_or_else(|| panic!("{url} connected"));
    assert_no_secret("the error's Display", &error.to_string());
    assert_no_secret("the error's Debug", &format!("{error:?}"));
    error
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_url_takes_locks_on_every_primary() {
    let cluster = Arc::new(
        blocking(|| {
            RedisCluster::start().unwrap_or_else(|e| panic!("cannot start a cluster: {e}"))
        })
        .await,
    );
    let url = cluster.url();
    assert!(url.starts_with("redis-cluster://127.0.0.1:") && url.contains("?node=127.0.0.1:"));
    let a = within("connect", LockClient::connect(&url))
        .await
        .expect("connect with a redis-cluster:// URL");
    let b = within("connect", LockClient::connect(&url))
        .await
        .expect("connect with a redis-cluster:// URL");
    assert!(a.redis().is_clustered());

    // One name per primary, so every node serves a lock.
    let names = blocking({
        let cluster = cluster.clone();
        move || {
            cluster
                .names_on_every_primary("order")
                .expect("a name on every primary")
        }
    })
    .await;
    assert_eq!(names.len(), 3);
    for name in &names {
        lock_wait_and_hand_over(&a, &b, name).await;
    }

    // Only one node in the URL: fred finds the others from it.
    let one_seed = format!("redis-cluster://127.0.0.1:{}", cluster.node(0).port());
    let c = within("connect", LockClient::connect(&one_seed))
        .await
        .expect("connect with one seed");
    lock_wait_and_hand_over(&c, &a, &names[2]).await;

    // Over an application's own clustered client (fred's defaults: redirections followed, three
    // attempts): scripts are routed by their keys' slot on every primary, and reloaded on every
    // primary after a SCRIPT FLUSH.
    let app = fred::clients::Client::new(
        fred::types::config::Config::from_url(&url).unwrap(),
        None,
        None,
        Some(fred::types::config::ReconnectPolicy::default()),
    );
    within("the application's client", app.init())
        .await
        .unwrap();
    let shared = within(
        "a lock client over it",
        LockClient::builder_from_client(&app).build(),
    )
    .await
    .unwrap();
    for name in &names {
        lock_wait_and_hand_over(&shared, &a, name).await;
    }
    for node in cluster.nodes() {
        node.command(&["SCRIPT", "FLUSH"]).unwrap();
    }
    for name in &names {
        lock_wait_and_hand_over(&shared, &a, name).await;
    }
    drop(shared);
    app.quit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_url_takes_locks_on_the_named_primary() {
    let set = blocking(|| SentinelSet::start().unwrap_or_else(|e| panic!("{e}"))).await;
    let url = set.url();
    assert!(url.starts_with("redis-sentinel://127.0.0.1:") && url.contains("sentinelServiceName="));
    let a = within("connect", LockClient::connect(&url))
        .await
        .expect("connect with a redis-sentinel:// URL");
    let b = within("connect", LockClient::connect(&url))
        .await
        .expect("connect with a redis-sentinel:// URL");
    lock_wait_and_hand_over(&a, &b, "inventory:42").await;
    // The lock lives on the primary the Sentinels name.
    let lock = a.lock("inventory:42").unwrap();
    let guard = lock.lock().await.unwrap();
    let primary = blocking(move || {
        let index = set.primary().unwrap();
        let exists = set.servers()[index]
            .command(&["EXISTS", "leasehold:{inventory:42}"])
            .unwrap();
        (set, exists.as_int())
    })
    .await;
    assert_eq!(primary.1, Some(1), "the hold is not on the named primary");
    guard.unlock().await.unwrap();
}

/// Passwords in every URL form: shown neither by the builder's `Debug` nor by the error of a
/// refused or unreachable deployment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_in_deployment_urls_are_never_shown() {
    let (p1, p2, p3) = (free_port(), free_port(), free_port());
    for url in [
        format!("redis://admin:{SECRET}@127.0.0.1:{p1}/0"),
        format!("redis://:{SECRET}@127.0.0.1:{p1}"),
        format!("rediss://admin:{SECRET}@127.0.0.1:{p1}"),
        format!(
            "redis-cluster://admin:{SECRET}@127.0.0.1:{p1}?node=127.0.0.1:{p2}&node=127.0.0.1:{p3}"
        ),
        format!(
            "redis-sentinel://admin:{SECRET}@127.0.0.1:{p1}/0?sentinelServiceName=mymaster\
             &sentinelUsername=watcher&sentinelPassword={SENTINEL_SECRET}&node=127.0.0.1:{p2}"
        ),
    ] {
        let error = assert_connect_fails_without_secrets(&url).await;
        // Without the `tls` feature a rediss URL is refused before connecting.
        let refused_tls = url.starts_with("rediss") && !cfg!(feature = "tls");
        assert!(
            matches!(error, LockError::Connection(_))
                || (refused_tls && matches!(error, LockError::InvalidArgument(_))),
            "{url}: not a connection error: {error:?}"
        );
    }
    // Bad URLs: invalid arguments, still without the password.
    for url in [
        format!("redis-cluster://admin:{SECRET}@127.0.0.1:{p1},127.0.0.1:{p2}"),
        format!("redis-sentinel://admin:{SECRET}@127.0.0.1:{p1}"),
        format!("redis-cluster://admin:{SECRET}@127.0.0.1:{p1}?node=127.0.0.1"),
    ] {
        let error = assert_connect_fails_without_secrets(&url).await;
        assert!(
            matches!(error, LockError::InvalidArgument(_)),
            "{url}: not an invalid argument: {error:?}"
        );
    }

    // A cluster and a Sentinel set without passwords refuse the ones given.
    let cluster = blocking(|| RedisCluster::start().unwrap_or_else(|e| panic!("{e}"))).await;
    let url = cluster
        .url()
        .replacen("://", &format!("://admin:{SECRET}@"), 1);
    let error = assert_connect_fails_without_secrets(&url).await;
    assert!(
        matches!(error, LockError::PermissionDenied(_)),
        "refused cluster: {error:?}"
    );
    drop(cluster);
    let set = blocking(|| SentinelSet::start().unwrap_or_else(|e| panic!("{e}"))).await;
    let url = set.url().replacen("://", &format!("://admin:{SECRET}@"), 1);
    // The Sentinels' credentials are their own (fred's `sentinel-auth`): none are sent to
    // them, they name the primary, and the data node refuses the user. (Before that feature
    // was on, the data nodes' credentials went to the Sentinels, which refused them, and the
    // error was a misleading "failed to connect to all sentinel nodes".)
    let error = assert_connect_fails_without_secrets(&url).await;
    assert!(
        matches!(error, LockError::PermissionDenied(_)),
        "refused by the data node: {error:?}"
    );
    drop(set);
}
