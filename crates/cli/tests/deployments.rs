//! The `leasehold` binary on multi-node deployments started by leasehold-testkit (never the
//! Redis on 6379, never `REDIS_URL`): a Redis Cluster of 3 primaries with a replica each,
//! reached with a `redis-cluster://` URL, and a primary with two replicas under three
//! Sentinels, reached with a `redis-sentinel://` URL. The commands take the same URLs as the
//! library; `list` must scan every primary and `inspect` must read each lock's line of waiters
//! on the lock's own primary; a password in any URL form never shows in the binary's output.
//!
//! Waits use deadlines and events (a subscriber count reaching 1, a waiter in a lock's line, a
//! waiter's lock future completing, a line printed), never a bare sleep.

use std::collections::BTreeSet;
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::interfaces::SortedSetsInterface;
use leasehold::LockClient;
use leasehold_testkit::{ChildProcess, RedisCluster, RespValue, SentinelSet};
use serde_json::Value as Json;

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");
const RUN_TIMEOUT: Duration = Duration::from_secs(30);
const SECRET: &str = "s3cret-Pa55word";
const SENTINEL_SECRET: &str = "sentinel-0nly-Pa55";

/// Runs a blocking testkit call off the runtime's workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

async fn start_cluster() -> Arc<RedisCluster> {
    Arc::new(
        blocking(|| {
            RedisCluster::start().unwrap_or_else(|e| panic!("cannot start a cluster: {e}"))
        })
        .await,
    )
}

/// `leasehold --url URL ARGS...` with stdin from /dev/null, no `REDIS_URL` or `DATABASE_URL`.
async fn leasehold(url: &str, args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.env_remove("REDIS_URL")
        .env_remove("DATABASE_URL")
        .arg("--url")
        .arg(url)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(RUN_TIMEOUT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("leasehold {args:?} did not finish within {RUN_TIMEOUT:?}"))
        .expect("run the leasehold binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn ok(url: &str, args: &[&str]) -> String {
    let output = leasehold(url, args).await;
    assert!(
        output.status.success(),
        "leasehold {args:?} failed ({}): {}",
        output.status,
        text(&output.stderr)
    );
    text(&output.stdout)
}

async fn ok_json(url: &str, args: &[&str]) -> Json {
    let out = ok(url, args).await;
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// Exit code 1, one line on stderr, no panic, and no secret anywhere in the output.
fn assert_clean_failure_without_secrets(output: &Output, what: &str) -> String {
    let err = text(&output.stderr);
    let out = text(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{what}: stderr: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{what}: not one line: {err}"
    );
    assert!(!err.contains("panicked"), "{what}: {err}");
    for secret in [SECRET, SENTINEL_SECRET] {
        assert!(!err.contains(secret), "{what}: a password in stderr: {err}");
        assert!(!out.contains(secret), "{what}: a password in stdout: {out}");
    }
    err
}

/// Subscribers of `channel` summed over every primary (a client subscribes on one of them).
fn subscribers(cluster: &RedisCluster, channel: &str) -> i64 {
    let primaries = cluster.primaries().expect("the primaries");
    primaries
        .into_iter()
        .map(|i| {
            // Plain and shard subscribers: on Redis Cluster 7+ the library's waiters
            // subscribe to their lock's shard (SSUBSCRIBE). Redis 6.2 has no sharded pub/sub
            // (and no PUBSUB SHARDNUMSUB): its waiters SUBSCRIBE.
            let sharded = cluster
                .node(i)
                .has_command("SPUBLISH")
                .expect("COMMAND INFO");
            ["NUMSUB", "SHARDNUMSUB"][..if sharded { 2 } else { 1 }]
                .iter()
                .map(|sub| {
                    let reply = cluster
                        .node(i)
                        .command(&["PUBSUB", sub, channel])
                        .expect("PUBSUB NUMSUB");
                    reply
                        .as_array()
                        .and_then(|parts| parts.get(1))
                        .and_then(RespValue::as_int)
                        .unwrap_or(0)
                })
                .sum::<i64>()
        })
        .sum()
}

/// Waits (up to 10 s) until `channel` has `n` subscribers over the cluster's primaries.
async fn wait_for_subscribers(cluster: &Arc<RedisCluster>, channel: &str, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = blocking({
            let (cluster, channel) = (cluster.clone(), channel.to_string());
            move || subscribers(&cluster, &channel)
        })
        .await;
        if seen == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{channel} never reached {n} subscribers (has {seen})"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `list`, `inspect`, `watch --once` and `unlock --force` through a `redis-cluster://` URL,
/// with locks on all three primaries: `list` sees every one (SCAN on every primary), `inspect`
/// shows the holder, token and the waiter in the lock's line, and the force unlock grants the
/// lock to that waiter (told on its client's channel, on the lock's primary).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_work_through_a_cluster_url() {
    let cluster = start_cluster().await;
    let url = cluster.url();
    assert!(url.starts_with("redis-cluster://127.0.0.1:"), "{url}");
    let names = blocking({
        let cluster = cluster.clone();
        move || {
            cluster
                .names_on_every_primary("job")
                .expect("a name on every primary")
        }
    })
    .await;
    let holder = LockClient::connect(&url)
        .await
        .expect("the library connects");
    let waiter = LockClient::connect(&url)
        .await
        .expect("the library connects");
    let locks: Vec<_> = names.iter().map(|n| holder.lock(n).unwrap()).collect();
    let mut guards = Vec::new();
    for lock in &locks {
        guards.push(lock.lock().await.unwrap());
    }
    let waiting = {
        let lock = waiter.lock(&names[0]).unwrap();
        tokio::spawn(async move { lock.lock().await.map(|g| g.detach()) })
    };
    // A plain lock's waiter hears its grant on its client's channel, and is in the line.
    let channel = format!("leasehold:{{{}}}:released:{}", names[0], waiter.id());
    wait_for_subscribers(&cluster, &channel, 1).await;
    let line = locks[0].keys().waiters();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let queued: u64 = holder.redis().zcard(line.as_str()).await.unwrap();
        if queued == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "{line} never had the waiter");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Every primary's locks are listed.
    let listing = ok_json(&url, &["list", "--json"]).await;
    let listed: BTreeSet<&str> = listing["locks"]
        .as_array()
        .expect("a list of locks")
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    let expected: BTreeSet<&str> = names.iter().map(String::as_str).collect();
    assert_eq!(listed, expected, "{listing}");
    let text = ok(&url, &["list"]).await;
    for name in &names {
        assert!(text.contains(name.as_str()), "{name} not listed: {text}");
    }
    let some = ok_json(&url, &["list", &names[1], "--json"]).await;
    assert_eq!(some["locks"].as_array().unwrap().len(), 1, "{some}");

    // Each lock reads the same as on one server, the waiter included.
    for (name, guard) in names.iter().zip(&guards) {
        let state = ok_json(&url, &["inspect", name, "--json"]).await;
        assert_eq!(state["kind"], "reentrant", "{state}");
        assert_eq!(state["holders"][0]["owner"], guard.owner().id(), "{state}");
        assert_eq!(state["fence"], guard.fencing_token().get(), "{state}");
        let expected_waiters = u64::from(name == &names[0]);
        assert_eq!(state["waiters"], expected_waiters, "{name}: {state}");
        let expected_clients = if name == &names[0] {
            vec![waiter.id()]
        } else {
            Vec::new()
        };
        assert_eq!(
            state["queued_clients"],
            serde_json::json!(expected_clients),
            "{name}: {state}"
        );
    }
    let frame = ok(&url, &["watch", "--once"]).await;
    for name in &names {
        assert!(frame.contains(name.as_str()), "{name} not watched: {frame}");
    }

    // A force unlock on the first primary's lock grants it to the waiter.
    let released = ok_json(&url, &["unlock", "--force", "--yes", "--json", &names[0]]).await;
    assert_eq!(released["released"], true, "{released}");
    let next = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter was granted the lock by the force unlock")
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > guards[0].fencing_token());
    assert_eq!(
        released["holders_now"][0]["owner"],
        next.owner().id(),
        "{released}"
    );
    next.unlock().await.unwrap();
    let mut guards = guards.into_iter();
    drop(guards.next());
    for guard in guards {
        guard.unlock().await.unwrap();
    }
    let listing = ok_json(&url, &["list", "--json"]).await;
    assert_eq!(listing["locks"], Json::Array(vec![]), "{listing}");
}

/// A password in a cluster URL, in a Sentinel URL (the data nodes' and the Sentinels' own
/// `sentinelPassword`), refused or unreachable, never shows in what the binary prints: neither
/// in its one error line, nor in the demo's account of the Redis it uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_in_cluster_and_sentinel_urls_are_never_shown() {
    let cluster = start_cluster().await;
    let seeds = cluster.seeds();
    let nodes: Vec<String> = seeds[1..]
        .iter()
        .map(|(h, p)| format!("node={h}:{p}"))
        .collect();
    // The cluster has no password: AUTH with one is refused.
    let refused = format!(
        "redis-cluster://admin:{SECRET}@127.0.0.1:{}?{}",
        seeds[0].1,
        nodes.join("&")
    );
    // Ports that were free a moment ago: nothing listens there.
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (a, b, c) = (free(), free(), free());
    let unreachable_cluster =
        format!("redis-cluster://admin:{SECRET}@127.0.0.1:{a}?node=127.0.0.1:{b}");
    let comma_form = format!("redis-cluster://admin:{SECRET}@127.0.0.1:{a},127.0.0.1:{b}");
    let unreachable_sentinel = format!(
        "redis-sentinel://admin:{SECRET}@127.0.0.1:{a}/0?sentinelServiceName=mymaster\
         &sentinelUsername=watcher&sentinelPassword={SENTINEL_SECRET}&node=127.0.0.1:{c}"
    );
    let no_service = format!("redis-sentinel://:{SECRET}@127.0.0.1:{a}");
    for (url, expected) in [
        (&refused, "Redis at"),
        (&unreachable_cluster, "cannot connect"),
        (&comma_form, "?node=host:port"),
        (&unreachable_sentinel, "cannot connect"),
        (&no_service, "sentinel service name"),
    ] {
        for args in [
            &["list"][..],
            &["inspect", "x", "--json"],
            &["unlock", "--force", "--yes", "x"],
            &["watch", "--once"],
            &["demo"],
        ] {
            let output = leasehold(url, args).await;
            let err = assert_clean_failure_without_secrets(&output, &format!("{url} {args:?}"));
            assert!(
                err.contains(expected),
                "{args:?}: {expected:?} not in: {err}"
            );
        }
    }
    // `demo --cluster` refuses a URL as well, naming it without its password.
    let output = leasehold(&refused, &["demo", "--cluster"]).await;
    let err = assert_clean_failure_without_secrets(&output, "demo --cluster --url");
    assert!(err.contains("admin:***@"), "{err}");
}

/// Runs `leasehold demo ARGS` with only the given `REDIS_URL`; asserts it passes and returns
/// its output.
fn run_demo(args: &[&str], redis_url: Option<&str>) -> String {
    let mut cmd = std::process::Command::new(BIN);
    cmd.arg("demo")
        .args(args)
        .env_remove("REDIS_URL")
        .env_remove("DATABASE_URL");
    if let Some(url) = redis_url {
        cmd.env("REDIS_URL", url);
    }
    let demo = ChildProcess::spawn(cmd).expect("spawn the demo");
    let summary = demo.wait_for_line(
        |line| line.starts_with("all scenarios") || line.contains("did not behave"),
        Duration::from_secs(120),
    );
    let status = demo.wait_timeout(Duration::from_secs(30));
    let output = demo.recent_output();
    let summary = summary.unwrap_or_else(|e| panic!("the demo did not finish: {e}"));
    assert_eq!(
        summary.split(" (").next(),
        Some("all scenarios behaved as expected"),
        "{output}"
    );
    assert!(status.expect("the demo exits").success(), "{output}");
    output
}

/// The outcomes every run of the demo must show, whatever Redis it plays on.
const OUTCOMES: [&str; 6] = [
    "no oversell",
    "stale write rejected by fencing token",
    "ok: no oversell with the lock, and the stale write was refused",
    "ok: the report ran exactly once",
    "the watchdog renewed the lease",
    "ok: pod-2 did not get the lock while pod-1's job ran",
];

/// `leasehold demo --cluster`: its own cluster, pods on a redis-cluster:// URL, the slot's
/// primary named, every outcome as on one Redis.
#[test]
fn demo_plays_on_its_own_cluster() {
    let output = run_demo(&["--cluster"], None);
    for expected in [
        "started a Redis Cluster",
        "pods connect with redis-cluster://127.0.0.1:",
        "lock \"inventory:42\": its keys are in hash slot 3081, served by primary 127.0.0.1:",
    ]
    .into_iter()
    .chain(OUTCOMES)
    {
        assert!(output.contains(expected), "{expected:?} missing:\n{output}");
    }
}

/// `leasehold demo --sentinel`: its own Sentinel set, pods on a redis-sentinel:// URL.
#[test]
fn demo_plays_behind_its_own_sentinels() {
    let output = run_demo(&["--sentinel"], None);
    for expected in [
        "watched by Sentinels on",
        "pods connect with redis-sentinel://127.0.0.1:",
        "lock \"inventory:42\": served by primary 127.0.0.1:",
    ]
    .into_iter()
    .chain(OUTCOMES)
    {
        assert!(output.contains(expected), "{expected:?} missing:\n{output}");
    }
}

/// The demo on a cluster named by `REDIS_URL` leaves no key behind on any primary: its
/// cleanup scans every primary and deletes keys of many slots.
#[test]
fn demo_on_a_given_cluster_leaves_no_keys_behind() {
    let cluster = RedisCluster::start().unwrap_or_else(|e| panic!("cannot start a cluster: {e}"));
    // A key of the user's on some primary, which the demo must leave alone.
    let slot = cluster.key_slot("unrelated").unwrap();
    let owner = cluster.owner_of_slot(slot).unwrap();
    cluster
        .node(owner)
        .command(&["SET", "unrelated", "kept"])
        .unwrap();
    let output = run_demo(&[], Some(&cluster.url()));
    assert!(output.contains("from REDIS_URL"), "{output}");
    assert!(
        output.contains("its keys are in hash slot 3081, served by primary 127.0.0.1:"),
        "{output}"
    );
    for expected in OUTCOMES {
        assert!(output.contains(expected), "{expected:?} missing:\n{output}");
    }
    let mut left = Vec::new();
    for i in cluster.primaries().unwrap() {
        let keys = cluster.node(i).command(&["KEYS", "*"]).unwrap();
        left.extend(
            keys.as_array()
                .expect("KEYS replies with an array")
                .iter()
                .filter_map(|k| k.as_str()),
        );
    }
    assert_eq!(left, ["unrelated"], "the demo left keys behind");
}

/// The library and the binary read one Sentinel URL alike: a lock taken through
/// `SentinelSet::url()` is seen by `inspect` through the same URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_through_a_sentinel_url() {
    let set = blocking(|| SentinelSet::start().unwrap_or_else(|e| panic!("{e}"))).await;
    let url = set.url();
    let client = LockClient::connect(&url)
        .await
        .expect("the library connects");
    let lock = client.lock("inventory:42").unwrap();
    let guard = lock.lock().await.unwrap();
    let state = ok_json(&url, &["inspect", "inventory:42", "--json"]).await;
    assert_eq!(state["holders"][0]["owner"], guard.owner().id(), "{state}");
    assert_eq!(state["fence"], guard.fencing_token().get(), "{state}");
    let listing = ok_json(&url, &["list", "--json"]).await;
    assert_eq!(listing["locks"][0]["name"], "inventory:42", "{listing}");
    let released = ok_json(
        &url,
        &["unlock", "--force", "--yes", "--json", "inventory:42"],
    )
    .await;
    assert_eq!(released["released"], true, "{released}");
    drop(guard);
}
