//! Shared set-up for the integration tests: every test gets its own redis-server (testkit).
#![allow(dead_code)] // reason: each test binary uses a different subset of these helpers

use std::time::Duration;

use leasehold::LockClient;
use leasehold_testkit::{ChildProcess, RedisServer, RespValue};

/// A fresh redis-server on a free port; fails loudly when redis-server is missing.
pub fn server() -> RedisServer {
    RedisServer::start().unwrap_or_else(|e| panic!("cannot start redis-server for tests: {e}"))
}

/// A client with defaults against `url`.
pub async fn client(url: &str) -> LockClient {
    LockClient::connect(url).await.expect("connect")
}

/// A client with a short watchdog lease, for tests that watch renewals.
pub async fn client_with_lease(url: &str, lease: Duration) -> LockClient {
    LockClient::builder(url)
        .lease(lease)
        .build()
        .await
        .expect("connect")
}

/// Runs a raw command through the testkit's own connection (not through leasehold).
pub fn cmd(server: &RedisServer, args: &[&str]) -> RespValue {
    server.command(args).expect("redis command")
}

/// HGET as an integer (None when absent).
pub fn hget(server: &RedisServer, key: &str, field: &str) -> Option<i64> {
    cmd(server, &["HGET", key, field])
        .as_str()
        .map(|s| s.parse().expect("integer"))
}

/// PTTL of `key` in milliseconds (-2: no key, -1: no TTL).
pub fn pttl(server: &RedisServer, key: &str) -> i64 {
    cmd(server, &["PTTL", key]).as_int().expect("PTTL reply")
}

/// Whether `key` exists.
pub fn exists(server: &RedisServer, key: &str) -> bool {
    cmd(server, &["EXISTS", key]).as_int() == Some(1)
}

/// Polls `condition` every 5 ms until it holds or `within` passes; returns whether it held.
/// For conditions with no event to wait on (a key expiring in Redis).
pub async fn eventually(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if condition() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The keys under `prefix` (SCAN), sorted.
pub fn keys(server: &RedisServer, pattern: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cursor = "0".to_string();
    loop {
        let reply = cmd(
            server,
            &["SCAN", &cursor, "MATCH", pattern, "COUNT", "1000"],
        );
        let parts = reply.as_array().expect("scan reply");
        cursor = parts[0].as_str().expect("cursor");
        for key in parts[1].as_array().expect("keys") {
            out.push(key.as_str().expect("key"));
        }
        if cursor == "0" {
            break;
        }
    }
    out.sort();
    out
}

/// The keys under the default prefix except the per-slot fencing counters (which stay by
/// design): what "nothing left behind" is checked against.
pub fn lock_keys(server: &RedisServer) -> Vec<String> {
    keys(server, "leasehold:*")
        .into_iter()
        .filter(|k| !k.ends_with("}:fence"))
        .collect()
}

/// The body of each test binary's `child_holder_entry_point` test: when the parent test set
/// the variables, take the lock (watched, with the given lease), print `LOCKED token=...` and
/// wait to be killed; otherwise (a plain test run) return at once.
pub fn run_child_holder_if_asked() {
    let (Ok(url), Ok(name), Ok(lease_ms)) = (
        std::env::var("LEASEHOLD_CHILD_URL"),
        std::env::var("LEASEHOLD_CHILD_LOCK"),
        std::env::var("LEASEHOLD_CHILD_LEASE_MS"),
    ) else {
        return;
    };
    let lease = Duration::from_millis(lease_ms.parse().expect("lease in ms"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = client_with_lease(&url, lease).await;
        if std::env::var("LEASEHOLD_CHILD_FAIR_WAITER").is_ok() {
            // Queue on the fair lock (held by the parent) and wait to be killed.
            println!("WAITING");
            let lock = client.fair_lock(&name).unwrap();
            let _guard = lock.lock().await.unwrap();
            println!("LOCKED");
            std::future::pending::<()>().await;
        }
        if std::env::var("LEASEHOLD_CHILD_PERMIT").is_ok() {
            // Hold one permit of the semaphore until killed.
            let semaphore = client.semaphore(&name).unwrap();
            let permit = semaphore.acquire(1).await.unwrap();
            println!("LOCKED token={}", permit.fencing_token());
            std::future::pending::<()>().await;
        }
        if std::env::var("LEASEHOLD_CHILD_READER").is_ok() {
            // Hold the read side of the read/write lock until killed.
            let lock = client.rw_lock(&name).unwrap();
            let guard = lock.read().lock().await.unwrap();
            println!("LOCKED token={}", guard.fencing_token());
            std::future::pending::<()>().await;
        }
        let guard_lock = client.lock(&name).unwrap();
        let guard = guard_lock.lock().await.unwrap();
        println!("LOCKED token={}", guard.fencing_token());
        std::future::pending::<()>().await;
    });
}

/// Runs this test binary's `child_holder_entry_point` as a separate process against `redis`,
/// on `name` with a watched `lease`, in the `role` its environment variable names (none: hold
/// the plain lock), and returns once it printed `ready`.
fn spawn_child(
    redis: &RedisServer,
    name: &str,
    lease: Duration,
    role: Option<&str>,
    ready: &str,
) -> ChildProcess {
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            "child_holder_entry_point",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LEASEHOLD_CHILD_URL", redis.url())
        .env("LEASEHOLD_CHILD_LOCK", name)
        .env("LEASEHOLD_CHILD_LEASE_MS", lease.as_millis().to_string());
    if let Some(role) = role {
        command.env(role, "1");
    }
    let child = ChildProcess::spawn(command).unwrap();
    child
        .wait_for_line(|l| l.contains(ready), Duration::from_secs(30))
        .unwrap();
    child
}

/// A separate process that holds the plain lock `name`; returns once it holds it.
pub fn spawn_holder(redis: &RedisServer, name: &str, lease: Duration) -> ChildProcess {
    spawn_child(redis, name, lease, None, "LOCKED token=")
}

/// A separate process that waits for the fair lock `name` (held by the caller); returns once
/// it started. The caller sees its queue entry appear.
pub fn spawn_fair_waiter(redis: &RedisServer, name: &str, lease: Duration) -> ChildProcess {
    spawn_child(
        redis,
        name,
        lease,
        Some("LEASEHOLD_CHILD_FAIR_WAITER"),
        "WAITING",
    )
}

/// A separate process that holds the read side of the read/write lock `name`.
pub fn spawn_reader(redis: &RedisServer, name: &str, lease: Duration) -> ChildProcess {
    spawn_child(
        redis,
        name,
        lease,
        Some("LEASEHOLD_CHILD_READER"),
        "LOCKED token=",
    )
}

/// A separate process that holds one permit of the semaphore `name`.
pub fn spawn_permit_holder(redis: &RedisServer, name: &str, lease: Duration) -> ChildProcess {
    spawn_child(
        redis,
        name,
        lease,
        Some("LEASEHOLD_CHILD_PERMIT"),
        "LOCKED token=",
    )
}

/// Waits until the line of waiters `key` (a fair lock's, a read/write lock's, a semaphore's
/// `P:{N}:waiters`) has `n` entries; fails the test after 20 s.
pub async fn until_queued(server: &RedisServer, key: &str, n: i64) {
    assert!(
        eventually(Duration::from_secs(20), || zcard(server, key) == n).await,
        "expected {n} waiters queued in {key}, found {}",
        zcard(server, key)
    );
}

/// ZCARD of `key` (0 when absent).
pub fn zcard(server: &RedisServer, key: &str) -> i64 {
    cmd(server, &["ZCARD", key]).as_int().expect("ZCARD reply")
}

/// The scripts every client uses by default (for tests that call core's typed commands).
pub fn scripts() -> std::sync::Arc<leasehold_core::scripts::Scripts> {
    leasehold_core::scripts::Scripts::for_protocol(leasehold_core::protocol::Protocol::default())
}

/// The renew script for one hold of `owner` in the grant `token`, with a 1 s lease.
pub async fn renew_as(
    redis: &fred::clients::Client,
    keys: &leasehold::LockKeys,
    owner: &leasehold::Owner,
    token: u64,
) -> Vec<bool> {
    let hold = leasehold_core::HoldId::new(keys.clone(), owner.clone());
    let renewal = leasehold_core::commands::Renewal {
        hold,
        token: Some(leasehold::FencingToken::new(token)),
    };
    let lease = leasehold::Lease::new(Duration::from_secs(1)).unwrap();
    leasehold_core::commands::renew(redis, &scripts(), &[renewal], lease)
        .await
        .unwrap()
}

/// The release script for `owner` (any grant): `kind` now or after, `expected` to settle.
pub async fn release_as(
    redis: &fred::clients::Client,
    keys: &leasehold::LockKeys,
    owner: &leasehold::Owner,
    kind: leasehold_core::commands::ReleaseKind,
    expected: Option<u64>,
) -> leasehold::Result<leasehold_core::commands::Release> {
    let hold = leasehold_core::HoldId::new(keys.clone(), owner.clone());
    leasehold_core::commands::release(redis, &scripts(), &hold, None, kind, expected).await
}

/// Every key of the name `name` (default prefix; the per-slot fencing counters excluded) with
/// its DUMP and whether it has a TTL: what "nothing changed" is checked against.
pub fn snapshot(server: &RedisServer, name: &str) -> Vec<(String, Option<String>, bool)> {
    keys(server, &format!("leasehold:{{{name}}}*"))
        .into_iter()
        .map(|key| {
            let dump = match cmd(server, &["DUMP", &key]) {
                RespValue::Bulk(bytes) => Some(format!("{bytes:?}")),
                _ => None,
            };
            let ttl = pttl(server, &key) >= 0;
            (key, dump, ttl)
        })
        .collect()
}

/// The proxy latency (each way) that makes every reply of a [`slow_client`] come after its
/// command timeout, while its commands still run in Redis.
pub const LATE_REPLY: Duration = Duration::from_millis(150);

/// A client behind a proxy with a 200 ms command timeout: with the proxy's latency at
/// [`LATE_REPLY`], its replies come too late (the command ran; the client settles it).
pub async fn slow_client(redis: &RedisServer) -> (leasehold_testkit::Proxy, LockClient) {
    let proxy = leasehold_testkit::Proxy::start(redis.addr()).await.unwrap();
    let client = LockClient::builder(&proxy.url())
        .command_timeout(Duration::from_millis(200))
        .build()
        .await
        .expect("connect");
    (proxy, client)
}

/// Waits until `condition` holds, then until it no longer does: a state Redis showed for a
/// moment (a grant that a settle took back). Fails after 20 s either way.
pub async fn came_and_went(mut condition: impl FnMut() -> bool) {
    assert!(
        eventually(Duration::from_secs(20), &mut condition).await,
        "the state never came"
    );
    assert!(
        eventually(Duration::from_secs(20), || !condition()).await,
        "the state never went"
    );
}

/// The order in which waiters got in: each spawned waiter writes its label when granted.
#[derive(Clone, Default)]
pub struct Order(std::sync::Arc<parking_lot::Mutex<Vec<&'static str>>>);

impl Order {
    /// Spawns `acquire` (it returns a detached guard), records `label` once it is granted, then
    /// releases. The task fails the test on an error, or when it is not granted within 30 s.
    pub fn spawn<G, F>(&self, label: &'static str, acquire: F) -> tokio::task::JoinHandle<()>
    where
        F: std::future::Future<Output = leasehold::Result<G>> + Send + 'static,
        G: Send + 'static,
    {
        let order = self.clone();
        tokio::spawn(async move {
            let guard = tokio::time::timeout(Duration::from_secs(30), acquire)
                .await
                .unwrap_or_else(|_| panic!("{label} was not granted within 30 s"))
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            order.0.lock().push(label);
            drop(guard);
        })
    }

    /// The labels, in the order they were granted.
    pub fn served(&self) -> Vec<&'static str> {
        self.0.lock().clone()
    }

    /// Gives a waiter that should not get in now the time to (a second), unless one got in
    /// already.
    pub async fn settle_a_while(&self) {
        eventually(Duration::from_secs(1), || !self.0.lock().is_empty()).await;
    }
}

/// How far the score of `member` in the zset `key` (a hold's or a permit's lease end, in
/// server milliseconds) lies ahead of the server's clock now (None when absent).
pub fn zscore_ahead_ms(server: &RedisServer, key: &str, member: &str) -> Option<i64> {
    let score: i64 = cmd(server, &["ZSCORE", key, member])
        .as_str()?
        .parse::<f64>()
        .expect("a score") as i64;
    let time = cmd(server, &["TIME"]);
    let parts = time.as_array().expect("TIME reply");
    let secs: i64 = parts[0].as_str().unwrap().parse().unwrap();
    let micros: i64 = parts[1].as_str().unwrap().parse().unwrap();
    Some(score - (secs * 1000 + micros / 1000))
}

/// Calls of scripts (EVALSHA and EVAL) the server has run so far: what "nothing was sent"
/// is checked against.
pub fn script_calls(server: &RedisServer) -> u64 {
    let info = cmd(server, &["INFO", "commandstats"])
        .as_str()
        .unwrap_or_default();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split([':', ','])
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

/// Waits (up to 20 s) until `lock`'s client reconnected and answers again, and returns whether
/// the lock is held then: after an unanswered command, so that a wrong resend had every
/// chance to happen before the test looks.
pub async fn locked_once_answering(lock: &leasehold::Lock) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match lock.is_locked().await {
            Ok(locked) => return locked,
            Err(e) if e.is_transient() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("the client did not come back: {e}"),
        }
    }
}

/// The least-privilege user for the default prefix (docs/guide.md, "Redis ACL"), with the
/// password `s3cr3t-Pa55`: every lock kind works and Redis logs no refusal
/// (tests/security.rs verifies it). `+info +client|id` are optional: fred asks for them after
/// connecting and carries on if refused (ACL LOG then shows it). Add `+select` when the URL
/// names a database and `+ping` for a user without a password (fred pings instead of AUTH).
pub const ACL_RULE: &str = "on >s3cr3t-Pa55 resetkeys ~leasehold:* resetchannels &leasehold:* \
    -@all +evalsha +script|load +exists +hget +zrem +subscribe +unsubscribe +ping \
    +type +set +incr +time +hset +hmget +hexists +hincrby +hdel +hkeys +del +pexpire +pttl \
    +zadd +publish +zrange +zrangebyscore +zscore +zcard +zrank \
    +info +client|id";

/// `ACL SETUSER name rule...` on `server`.
pub fn set_user(server: &RedisServer, name: &str, rule: &str) {
    let mut args = vec!["ACL", "SETUSER", name];
    args.extend(rule.split_whitespace());
    server.command(&args).expect("ACL SETUSER");
}

/// The channel a plain lock's waiters of `client` hear their grants on: the lock's release
/// channel, then `:` and the client's id.
pub fn client_channel(client: &leasehold::LockClient, name: &str) -> String {
    format!("leasehold:{{{name}}}:released:{}", client.id())
}

/// Every message published on the channels of the lock `name` (`P:{N}:released*`, default
/// prefix), as (channel, payload), seen by a pattern subscriber of the test's own: what a
/// handoff costs in messages, and to whom.
pub struct Messages {
    seen: std::sync::Arc<parking_lot::Mutex<Vec<(String, String)>>>,
    _watcher: fred::clients::SubscriberClient,
    collector: tokio::task::JoinHandle<()>,
}

impl Messages {
    /// Subscribed once this returns.
    pub async fn watch(server: &RedisServer, name: &str) -> Messages {
        use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};

        let watcher = fred::clients::SubscriberClient::new(
            fred::types::config::Config::from_url(&server.url()).unwrap(),
            None,
            None,
            None,
        );
        watcher.init().await.unwrap();
        let seen = std::sync::Arc::<parking_lot::Mutex<Vec<(String, String)>>>::default();
        let mut messages = watcher.message_rx();
        let collector = {
            let seen = seen.clone();
            tokio::spawn(async move {
                while let Ok(message) = messages.recv().await {
                    let payload = message.value.as_string().unwrap_or_default();
                    seen.lock().push((message.channel.to_string(), payload));
                }
            })
        };
        watcher
            .psubscribe(format!("leasehold:{{{name}}}:released*"))
            .await
            .unwrap();
        Messages {
            seen,
            _watcher: watcher,
            collector,
        }
    }

    /// The messages seen so far, in order.
    pub fn seen(&self) -> Vec<(String, String)> {
        self.seen.lock().clone()
    }
}

impl Drop for Messages {
    fn drop(&mut self) {
        self.collector.abort();
    }
}

/// A client behind its own proxy with a 200 ms command timeout and `lease`: a waiter whose link
/// turns slow ([`Proxy::set_latency`](leasehold_testkit::Proxy::set_latency) past the timeout)
/// hears late and its tries go unanswered, while its commands (the renewals too) still reach
/// Redis.
pub async fn slow_client_with_lease(
    redis: &RedisServer,
    lease: Duration,
) -> (leasehold_testkit::Proxy, LockClient) {
    let proxy = leasehold_testkit::Proxy::start(redis.addr()).await.unwrap();
    let client = LockClient::builder(&proxy.url())
        .command_timeout(Duration::from_millis(200))
        .lease(lease)
        .build()
        .await
        .expect("connect");
    (proxy, client)
}

/// Waits until the entry of the head of the line `keys` has been renewed twice (its deadline
/// moved twice): it has waited long enough that a grant message coming late is too late to
/// take, and its grant is taken by a try.
pub async fn until_head_renewed_twice(redis: &RedisServer, keys: &leasehold::LockKeys) {
    let head = cmd(redis, &["ZRANGE", &keys.waiters(), "0", "0"])
        .as_array()
        .unwrap()[0]
        .as_str()
        .expect("a waiter in line");
    let deadline = || {
        cmd(redis, &["ZSCORE", &keys.waiters_until(), &head])
            .as_str()
            .and_then(|s| s.parse::<f64>().ok())
    };
    for _ in 0..2 {
        let before = deadline();
        assert!(
            eventually(Duration::from_secs(10), || deadline() > before).await,
            "the head's entry is renewed"
        );
    }
}

/// The end of a slow-spell test: for three leases (long past what a grant's own lease would
/// last) nobody is served, since the slow head can take nothing and the waiter behind must not
/// pass it; then the link heals, and `head` is served before `behind`.
pub async fn served_in_turn_after_a_slow_spell(
    order: &Order,
    proxy: &leasehold_testkit::Proxy,
    lease: Duration,
    head: tokio::task::JoinHandle<()>,
    behind: tokio::task::JoinHandle<()>,
) {
    // Time has to pass for a lapse to happen: no event marks "not yet".
    tokio::time::sleep(3 * lease).await;
    assert!(
        order.served().is_empty(),
        "served during the slow spell: {:?}",
        order.served()
    );
    proxy.set_latency(Duration::ZERO);
    head.await.unwrap();
    behind.await.unwrap();
    assert_eq!(order.served(), ["head", "behind"]);
}
