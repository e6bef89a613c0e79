//! The `leasehold` binary against real Redis servers spawned by leasehold-testkit (never the
//! one on 6379, never `REDIS_URL`): inspect, list, unlock --force, error handling, and the
//! demo end to end.
//!
//! Waits use deadlines and events (a subscriber count reaching 1, a waiter's entry in the
//! line, a waiter's lock future completing, a line printed), never a bare sleep.
//!
//! A lock's waiters are in the line `P:{N}:waiters` (a plain lock's one entry per waiting
//! client, a fair lock's one per waiting owner) and hear on channels of their own: a plain
//! lock's on `P:{N}:released:<client uuid>`, a fair lock's on `P:{N}:released:<owner id>`.

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use fred::interfaces::{HashesInterface, KeysInterface, PubsubInterface, SortedSetsInterface};
use fred::prelude::Value;
use leasehold::LockClient;
use leasehold_testkit::{ChildProcess, RedisServer};
use serde_json::Value as Json;

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");
const RUN_TIMEOUT: Duration = Duration::from_secs(30);

fn start_redis() -> RedisServer {
    RedisServer::start().expect("start a redis-server for the test")
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

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs and expects success; returns stdout.
async fn ok(url: &str, args: &[&str]) -> String {
    let output = leasehold(url, args).await;
    assert!(
        output.status.success(),
        "leasehold {args:?} failed ({}): {}",
        output.status,
        stderr(&output)
    );
    stdout(&output)
}

async fn ok_json(url: &str, args: &[&str]) -> Json {
    let text = ok(url, args).await;
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Asserts a clean failure: exit code 1, one line on stderr containing `needle`, no panic.
fn assert_clean_failure(output: &Output, needle: &str) {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(1), "stderr: {err}");
    assert!(err.contains(needle), "{needle:?} not in stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Waits (up to 10 s) until `channel` has `n` subscribers: a waiter has registered.
async fn wait_for_subscribers(client: &LockClient, channel: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply: Vec<Value> = client.redis().pubsub_numsub(channel).await.unwrap();
        if reply.get(1).and_then(Value::as_u64) == Some(n) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{channel} never reached {n} subscribers"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits (up to 10 s) until the zset `key` has `n` members: waiters have queued.
async fn wait_for_zcard(client: &LockClient, key: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let count: u64 = client.redis().zcard(key).await.unwrap();
        if count == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{key} never reached {n} members (has {count})"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The channel a plain lock's waiters of `client` hear their grant on.
fn client_channel(name: &str, client: &LockClient) -> String {
    format!("leasehold:{{{name}}}:released:{}", client.id())
}

/// Waits until `client` waits for the plain lock `name`: subscribed to its own channel and in
/// the line (its first try answered busy, a later one queued it).
async fn wait_for_plain_waiter(observer: &LockClient, name: &str, client: &LockClient) {
    wait_for_subscribers(observer, &client_channel(name, client), 1).await;
    wait_for_zcard(observer, &format!("leasehold:{{{name}}}:waiters"), 1).await;
}

/// The row of `name` in a table (`list`, `watch --once`), split on whitespace.
fn row<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row for {name}: {text}"))
        .split_whitespace()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_holder_lease_fence_and_waiters() {
    let redis = start_redis();
    let url = redis.url();
    let holder = LockClient::connect(&url).await.unwrap();
    let waiter = LockClient::connect(&url).await.unwrap();
    let lock = holder.lock("inventory:42").unwrap();
    let guard = lock.lock().await.unwrap();
    let waiting = {
        let lock = waiter.lock("inventory:42").unwrap();
        tokio::spawn(async move { lock.lock().await.map(|g| g.detach()) })
    };
    wait_for_plain_waiter(&holder, "inventory:42", &waiter).await;

    let state = ok_json(&url, &["inspect", "inventory:42", "--json"]).await;
    assert_eq!(state["name"], "inventory:42");
    assert_eq!(state["key"], "leasehold:{inventory:42}");
    assert_eq!(state["kind"], "reentrant");
    assert_eq!(state["lock_kind"], "lock");
    assert_eq!(state["mode"], Json::Null);
    assert_eq!(state["holders"][0]["owner"], guard.owner().id());
    assert_eq!(state["holders"][0]["hold_count"], 1);
    assert_eq!(state["holders"][0]["role"], Json::Null);
    assert_eq!(state["holders"][0]["token"], guard.fencing_token().get());
    assert_eq!(state["holders"][0]["lease_ms"], Json::Null);
    assert_eq!(state["holders"].as_array().unwrap().len(), 1);
    assert_eq!(state["fence"], guard.fencing_token().get());
    let ttl = state["ttl_ms"].as_u64().expect("a TTL");
    assert!(ttl > 0 && ttl <= 30_000, "ttl {ttl}");
    assert_eq!(state["no_expiry"], false);
    // One entry in the line, the waiting client's (its first waiting task's owner); nobody
    // subscribes to the release channel itself (a lock's waiters hear on their own).
    assert_eq!(state["waiters"], 1);
    let queue = state["queue"].as_array().unwrap();
    assert_eq!(queue.len(), 1, "{state}");
    let entry = queue[0]["owner"].as_str().unwrap();
    assert!(
        entry.starts_with(&format!("{}:", waiter.id())),
        "{entry} is not a task of the waiting client"
    );
    assert_eq!(queue[0]["wants"], Json::Null);
    let life = queue[0]["entry_ms"].as_i64().expect("an entry deadline");
    assert!(life > 0 && life <= 30_000, "entry {life}");
    assert_eq!(state["queued_clients"], serde_json::json!([waiter.id()]));

    let text = ok(&url, &["inspect", "inventory:42"]).await;
    assert!(text.contains("lock (reentrant; plain or fair"), "{text}");
    assert!(
        text.contains(&format!("{}  hold count 1\n", guard.owner().id())),
        "{text}"
    );
    assert!(text.contains(&guard.fencing_token().to_string()), "{text}");
    assert!(
        text.contains(&format!("queue    1. {entry}  waiting ")),
        "{text}"
    );
    assert!(text.contains("waiters  1 in line\n"), "{text}");
    assert!(!text.contains("mode"), "{text}");

    // The release grants the lock to the waiter in place, with the `~granted` mark (kept while
    // a waiter that heard its grant holds it; a try of its own would drop it): not a holder.
    guard.unlock().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter gets the lock")
        .unwrap()
        .unwrap();
    let fields: std::collections::HashMap<String, String> =
        holder.redis().hgetall(lock.keys().hash()).await.unwrap();
    let owners: Vec<&str> = fields
        .keys()
        .map(String::as_str)
        .filter(|f| !["~fence", "~granted"].contains(f))
        .collect();
    assert_eq!(owners, [next.owner().id()], "{fields:?}");
    let state = ok_json(&url, &["inspect", "inventory:42", "--json"]).await;
    let holders = state["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 1, "{state}");
    assert_eq!(holders[0]["owner"], next.owner().id());
    assert_eq!(holders[0]["token"], next.fencing_token().get());
    assert_eq!(state["fence"], next.fencing_token().get());
    assert_eq!(state["waiters"], 0);
    assert_eq!(state["queue"], Json::Array(vec![]));
    assert_eq!(state["queued_clients"], Json::Array(vec![]));
    next.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_reports_absent_and_foreign_keys() {
    let redis = start_redis();
    let url = redis.url();
    redis.command(&["SET", "leasehold:{str}", "x"]).unwrap();
    redis
        .command(&["HSET", "leasehold:{odd}", "field", "not-a-count"])
        .unwrap();

    let absent = ok_json(&url, &["inspect", "nothing", "--json"]).await;
    assert_eq!(absent["kind"], "none");
    assert_eq!(absent["holders"], Json::Array(vec![]));
    assert_eq!(absent["ttl_ms"], Json::Null);
    assert_eq!(absent["fence"], Json::Null);
    assert!(ok(&url, &["inspect", "nothing"])
        .await
        .contains("not locked"));

    let string = ok_json(&url, &["inspect", "str", "--json"]).await;
    assert_eq!(string["kind"], "foreign:string");
    assert_eq!(string["no_expiry"], true);
    let hash = ok_json(&url, &["inspect", "odd", "--json"]).await;
    assert_eq!(hash["kind"], "foreign:hash");

    let bad = leasehold(&url, &["inspect", "a}b"]).await;
    assert_clean_failure(&bad, "hash tag");
}

/// A grant the line made (a release or a force unlock granted the lock to the first live
/// waiter, in place): the hash has the owner, `~fence` and `~granted`, and the commands show
/// only the owner as the holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_of_the_line_shows_only_its_owner() {
    let redis = start_redis();
    let url = redis.url();
    let owner = "3f0c2a9e-0000-4000-8000-000000000001:t7";
    redis
        .command(&[
            "HSET",
            "leasehold:{handed}",
            owner,
            "1",
            "~fence",
            "21",
            "~granted",
            "1",
        ])
        .unwrap();
    redis
        .command(&["PEXPIRE", "leasehold:{handed}", "60000"])
        .unwrap();

    let state = ok_json(&url, &["inspect", "handed", "--json"]).await;
    assert_eq!(state["kind"], "reentrant", "{state}");
    assert_eq!(state["lock_kind"], "lock");
    assert_eq!(
        state["holders"],
        serde_json::json!([{
            "owner": owner,
            "hold_count": 1,
            "role": null,
            "token": 21,
            "lease_ms": null,
            "permits": null,
        }])
    );
    assert_eq!(state["fence"], 21);
    let text = ok(&url, &["inspect", "handed"]).await;
    assert!(
        text.contains(&format!("holder   {owner}  hold count 1\n")),
        "{text}"
    );
    assert!(!text.contains("~granted"), "{text}");

    let listed = ok_json(&url, &["list", "--json"]).await;
    assert_eq!(listed["locks"][0]["holders"].as_array().unwrap().len(), 1);
    assert_eq!(listed["locks"][0]["holders"][0]["owner"], owner);
    let frame = ok(&url, &["watch", "--once"]).await;
    assert_eq!(
        row(&frame, "handed")[1..5],
        ["lock", "-", owner, "1"],
        "{frame}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_locks_under_the_prefix_only() {
    let redis = start_redis();
    let url = redis.url();
    for (key, owner, count) in [
        ("leasehold:{inventory:42}", "owner-a:t1", "2"),
        ("leasehold:{inventory:7}", "owner-b:t3", "1"),
        ("leasehold:{report}", "owner-c:t9", "1"),
        ("leasehold:order:{42}:pay", "owner-d:o1", "1"),
        ("other:{x}", "owner-e:t1", "1"),
    ] {
        redis.command(&["HSET", key, owner, count]).unwrap();
        redis.command(&["PEXPIRE", key, "60000"]).unwrap();
    }
    // Not locks: a fencing counter, a string, a hash that is not a hold count map.
    redis
        .command(&["SET", "leasehold:{5}:fence", "12"])
        .unwrap();
    redis.command(&["SET", "leasehold:{str}", "x"]).unwrap();
    redis
        .command(&["HSET", "leasehold:{odd}", "field", "text"])
        .unwrap();

    let all = ok_json(&url, &["list", "--json"]).await;
    let names: Vec<&str> = all["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["inventory:42", "inventory:7", "order:{42}:pay", "report"]
    );
    assert_eq!(all["prefix"], "leasehold");
    let first = &all["locks"][0];
    assert_eq!(first["key"], "leasehold:{inventory:42}");
    assert_eq!(first["holders"][0]["owner"], "owner-a:t1");
    assert_eq!(first["holders"][0]["hold_count"], 2);
    assert_eq!(first["lock_kind"], "lock");
    assert_eq!(first["mode"], Json::Null);
    assert_eq!(first["fence"], Json::Null);
    assert_eq!(first["queued"], 0);
    let ttl = first["ttl_ms"].as_u64().unwrap();
    assert!(ttl > 0 && ttl <= 60_000);

    let inventory = ok_json(&url, &["list", "inventory:*", "--json"]).await;
    assert_eq!(inventory["locks"].as_array().unwrap().len(), 2);
    let seven = ok_json(&url, &["list", "inventory:[0-9]", "--json"]).await;
    assert_eq!(seven["locks"][0]["name"], "inventory:7");
    assert_eq!(seven["locks"].as_array().unwrap().len(), 1);

    let text = ok(&url, &["list"]).await;
    assert!(text.starts_with("NAME"), "{text}");
    assert!(text.contains("owner-a:t1 x2"), "{text}");
    assert_eq!(
        row(&text, "NAME"),
        ["NAME", "KIND", "MODE", "HOLDERS", "QUEUED", "TTL"]
    );
    assert_eq!(
        row(&text, "inventory:42")[..5],
        ["inventory:42", "lock", "-", "owner-a:t1", "x2"]
    );
    assert!(text.contains("4 locks"), "{text}");
    assert!(!text.contains("str") && !text.contains("odd") && !text.contains("fence"));

    let other = ok_json(&url, &["--prefix", "other", "list", "--json"]).await;
    assert_eq!(other["locks"][0]["name"], "x");
    let none = ok_json(&url, &["list", "nomatch*", "--json"]).await;
    assert_eq!(none["locks"], Json::Array(vec![]));
    assert!(ok(&url, &["list", "nomatch*"]).await.contains("no locks"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_through_many_locks() {
    let redis = start_redis();
    let url = redis.url();
    let client = LockClient::connect(&url).await.unwrap();
    let pipeline = client.redis().pipeline();
    for i in 0..1_234 {
        let key = format!("leasehold:{{job:{i}}}");
        let _: () = pipeline.hset(&key, ("owner:t1", 1)).await.unwrap();
        let _: () = pipeline.pexpire(&key, 60_000, None).await.unwrap();
    }
    let _: Vec<Value> = pipeline.all().await.unwrap();

    let all = ok_json(&url, &["list", "--json"]).await;
    assert_eq!(all["locks"].as_array().unwrap().len(), 1_234);
    let some = ok_json(&url, &["list", "job:12?", "--json"]).await;
    assert_eq!(some["locks"].as_array().unwrap().len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_force_yes_releases_and_wakes_the_waiter() {
    let redis = start_redis();
    let url = redis.url();
    let holder = LockClient::connect(&url).await.unwrap();
    let waiter = LockClient::connect(&url).await.unwrap();
    let lock = holder.lock("stuck").unwrap();
    let guard = lock.lock().await.unwrap();
    let waiting = {
        let lock = waiter.lock("stuck").unwrap();
        tokio::spawn(async move { lock.lock().await.map(|g| g.detach()) })
    };
    wait_for_plain_waiter(&holder, "stuck", &waiter).await;
    let entry: Vec<String> = holder
        .redis()
        .zrange("leasehold:{stuck}:waiters", 0, -1, None, false, None, false)
        .await
        .unwrap();

    let text = ok(&url, &["unlock", "--force", "--yes", "stuck"]).await;
    assert!(text.contains("force-unlocked"), "{text}");
    assert!(text.contains(guard.owner().id()), "{text}");
    // As a release does, the force unlock granted the lock to the waiter in line, in place
    // (the command read it once more to say so).
    assert!(
        text.contains(&format!(
            "it is now held by {} (hold count 1): a force unlock grants the lock to the first \
             live waiter in line",
            entry[0]
        )),
        "{text}"
    );
    // Told on its client's channel, the waiter holds the lock long before its 30 s lease
    // bound would have let it try again.
    let next = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter was granted the lock by the force unlock")
        .unwrap()
        .unwrap();
    assert_eq!(next.owner().id(), entry[0]);
    assert!(next.fencing_token() > guard.fencing_token());
    next.unlock().await.unwrap();
    drop(guard);

    let absent = ok_json(&url, &["unlock", "--force", "--yes", "--json", "stuck"]).await;
    assert_eq!(absent["released"], false);
    assert!(ok(&url, &["unlock", "--force", "-y", "stuck"])
        .await
        .contains("not locked"));

    assert_eq!(absent["holders_now"], Json::Array(vec![]));

    // Nobody waits: the lock is gone.
    let held = lock.lock().await.unwrap();
    let json = ok_json(&url, &["unlock", "--force", "--yes", "--json", "stuck"]).await;
    assert_eq!(json["released"], true);
    assert_eq!(json["holders"][0]["owner"], held.owner().id());
    assert_eq!(json["holders_now"], Json::Array(vec![]));
    let exists: i64 = holder.redis().exists(lock.keys().hash()).await.unwrap();
    assert_eq!(exists, 0);
    drop(held);
    let other = waiter.lock("stuck").unwrap();
    let again = other.lock().await.unwrap();
    let text = ok(&url, &["unlock", "--force", "--yes", "stuck"]).await;
    assert!(
        text.starts_with(&format!(
            "force-unlocked \"stuck\": it was held by {} (hold count 1); it is free now\n",
            again.owner().id()
        )),
        "{text}"
    );
    drop(again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_force_refuses_without_yes_when_stdin_is_not_a_terminal() {
    let redis = start_redis();
    let url = redis.url();
    let client = LockClient::connect(&url).await.unwrap();
    let lock = client.lock("precious").unwrap();
    let guard = lock.lock().await.unwrap();

    // stdin is /dev/null.
    let output = leasehold(&url, &["unlock", "--force", "precious"]).await;
    assert_clean_failure(&output, "--yes");
    assert!(stderr(&output).contains("not a terminal"));

    // A pipe cannot confirm either, even one that types the right name.
    let mut child = tokio::process::Command::new(BIN)
        .env_remove("REDIS_URL")
        .args(["--url", &url, "unlock", "--force", "precious"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        // The child may have refused and exited already: a broken pipe is fine.
        let _ = stdin.write_all(b"precious\n").await;
    }
    let output = tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_clean_failure(&output, "--yes");

    assert!(lock.is_locked().await.unwrap(), "the lock was left alone");
    assert!(guard.is_held());
    guard.unlock().await.unwrap();

    // Without --force it is a usage error (exit 2), before anything is sent.
    let usage = leasehold(&url, &["unlock", "--yes", "precious"]).await;
    assert_eq!(usage.status.code(), Some(2), "{}", stderr(&usage));
}

/// `unlock --force NAME` on a terminal shows the holder and asks for the name: the wrong name
/// aborts, the right one releases.
#[test]
fn unlock_force_asks_for_the_name_on_a_terminal() {
    use std::io::Write;

    let redis = start_redis();
    redis
        .command(&["HSET", "leasehold:{job}", "owner-x:t1", "1"])
        .unwrap();
    let confirm = |answer: &str| -> Output {
        let pty = nix::pty::openpty(None, None).expect("a pseudo-terminal");
        let mut child = std::process::Command::new(BIN)
            .env_remove("REDIS_URL")
            .args(["--url", &redis.url(), "unlock", "--force", "job"])
            .stdin(Stdio::from(pty.slave))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Typed ahead: the terminal keeps the line until the prompt reads it.
        let mut terminal = std::fs::File::from(pty.master);
        terminal
            .write_all(format!("{answer}\n").as_bytes())
            .unwrap();
        let deadline = Instant::now() + RUN_TIMEOUT;
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("unlock --force did not finish within {RUN_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(terminal);
        child.wait_with_output().unwrap()
    };

    let wrong = confirm("jbo");
    assert!(stderr(&wrong).contains("owner-x:t1"), "{}", stderr(&wrong));
    assert!(stderr(&wrong).contains("Type the lock name to confirm"));
    assert!(stderr(&wrong).contains("aborted"), "{}", stderr(&wrong));
    assert_eq!(wrong.status.code(), Some(1));
    assert!(!redis
        .command(&["HGETALL", "leasehold:{job}"])
        .unwrap()
        .as_array()
        .unwrap()
        .is_empty());

    let right = confirm("job");
    assert!(right.status.success(), "{}", stderr(&right));
    assert!(
        stdout(&right).contains("force-unlocked"),
        "{}",
        stdout(&right)
    );
    assert_eq!(
        redis
            .command(&["EXISTS", "leasehold:{job}"])
            .unwrap()
            .as_int(),
        Some(0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_force_leaves_foreign_keys_alone() {
    let redis = start_redis();
    let url = redis.url();
    redis.command(&["SET", "leasehold:{str}", "x"]).unwrap();
    let output = leasehold(&url, &["unlock", "--force", "--yes", "str"]).await;
    assert_clean_failure(&output, "not a leasehold lock");
    assert!(!redis.command(&["GET", "leasehold:{str}"]).unwrap().is_nil());
}

#[tokio::test]
async fn bad_urls_fail_with_one_clear_line() {
    for url in ["not a url", "http://127.0.0.1:6379", "redis://"] {
        for args in [
            &["list"][..],
            &["inspect", "x"],
            &["unlock", "--force", "--yes", "x"],
        ] {
            let output = leasehold(url, args).await;
            assert_clean_failure(&output, "bad Redis URL");
        }
    }
}

#[tokio::test]
async fn unreachable_server_fails_with_one_clear_line() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let expected = format!("cannot connect to Redis at 127.0.0.1:{port}");
    for args in [&["list"][..], &["inspect", "x", "--json"], &["demo"]] {
        let output = leasehold(&url, args).await;
        assert_clean_failure(&output, &expected);
    }
}

/// Runs `leasehold demo` with only the given `REDIS_URL` / `DATABASE_URL` and asserts it
/// passes; returns its output.
fn run_demo(redis_url: Option<&str>, database_url: Option<&str>) -> String {
    let mut cmd = std::process::Command::new(BIN);
    cmd.arg("demo")
        .env_remove("REDIS_URL")
        .env_remove("DATABASE_URL");
    if let Some(url) = redis_url {
        cmd.env("REDIS_URL", url);
    }
    if let Some(url) = database_url {
        cmd.env("DATABASE_URL", url);
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

#[test]
fn demo_plays_every_scenario_on_its_own_redis() {
    let output = run_demo(None, None);
    for expected in [
        "started redis-server",
        "oversold by",
        "no oversell",
        "stale write rejected by fencing token",
        "starting the daily report",
        "another instance is running the report; skipping",
        "ok: the report ran exactly once",
        "the watchdog renewed the lease",
        "handoff:",
    ] {
        assert!(output.contains(expected), "{expected:?} missing:\n{output}");
    }
}

#[test]
fn demo_on_a_given_redis_leaves_no_keys_behind() {
    let redis = start_redis();
    redis.command(&["SET", "unrelated", "kept"]).unwrap();
    let output = run_demo(Some(&redis.url()), None);
    assert!(output.contains("from REDIS_URL"), "{output}");
    let keys = redis.command(&["KEYS", "*"]).unwrap();
    let keys: Vec<String> = keys
        .as_array()
        .expect("KEYS replies with an array")
        .iter()
        .filter_map(|k| k.as_str())
        .collect();
    assert_eq!(keys, ["unrelated"], "the demo left keys behind");
}

/// The PostgreSQL store, when a server is at hand (`DATABASE_URL`, e.g.
/// `postgres://postgres@127.0.0.1:5432/test`); without one there is nothing to run it on.
#[test]
fn demo_uses_postgres_when_database_url_is_set() {
    let database_url = match std::env::var("DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => url,
        _ => {
            eprintln!("DATABASE_URL is not set: the PostgreSQL path of the demo is not exercised");
            return;
        }
    };
    let output = run_demo(None, Some(&database_url));
    assert!(output.contains("PostgreSQL from DATABASE_URL"), "{output}");
    assert!(
        output.contains("stale write rejected by fencing token"),
        "{output}"
    );
}

/// `watch --once`: one frame with the holder, its hold count, the lease left, the entries in
/// the line of waiters (a plain lock's: one per waiting client) and the grant's fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_once_shows_holder_queue_and_token() {
    let redis = start_redis();
    let url = redis.url();
    let holder = LockClient::connect(&url).await.unwrap();
    let waiter = LockClient::connect(&url).await.unwrap();
    let lock = holder.lock("job:nightly").unwrap();
    let guard = lock.lock().await.unwrap();
    let inner = lock.try_lock().await.unwrap().expect("re-enters");
    let queued_lock = waiter.lock("job:nightly").unwrap();
    let waiting = tokio::spawn(async move {
        let guard = queued_lock
            .try_lock_for(Duration::from_secs(30))
            .await
            .unwrap();
        guard.map(|g| g.detach())
    });
    // The waiter's client is in the line once its first waiter's try was answered.
    wait_for_plain_waiter(&holder, "job:nightly", &waiter).await;

    let text = ok(&url, &["watch", "--once"]).await;
    let row = text
        .lines()
        .find(|l| l.starts_with("job:nightly"))
        .unwrap_or_else(|| panic!("no row for the lock: {text}"));
    let fields: Vec<&str> = row.split_whitespace().collect();
    let token = guard.fencing_token().to_string();
    assert_eq!(fields[1], "lock", "{row}");
    assert_eq!(fields[2], "-", "mode: {row}");
    assert_eq!(fields[3], guard.owner().to_string(), "{row}");
    assert_eq!(fields[4], "2", "hold count: {row}");
    let n = fields.len();
    assert_eq!(
        &fields[n - 3..],
        ["1", token.as_str(), "1"],
        "queued, token, grants seen: {row}"
    );
    assert!(
        text.starts_with("leasehold watch: prefix \"leasehold\""),
        "{text}"
    );

    inner.unlock().await.unwrap();
    guard.unlock().await.unwrap();
    let granted = waiting.await.unwrap().expect("the waiter gets its turn");
    granted.unlock().await.unwrap();
    let empty = ok(&url, &["watch", "--once"]).await;
    assert!(empty.contains("no locks held"), "{empty}");
    let bad = leasehold(&url, &["watch", "--interval", "0"]).await;
    assert_clean_failure(&bad, "--interval must be a positive number of seconds");
}

/// A fair lock with two waiters, built through the library: a fair lock and a plain lock share
/// one layout, so `inspect` shows kind `lock`, with the line in arrival order (one entry per
/// waiting owner) and each entry's life left; `list` and `watch` show the kind and the line's
/// length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_list_show_a_fair_lock_queue() {
    let redis = start_redis();
    let url = redis.url();
    let holder = LockClient::connect(&url).await.unwrap();
    let lock = holder.fair_lock("payouts").unwrap();
    let waiters_key = lock.keys().waiters();
    let guard = lock.lock().await.unwrap();

    let mut clients = Vec::new();
    let mut owners = Vec::new();
    let mut tasks = Vec::new();
    for n in 1..=2 {
        let client = LockClient::connect(&url).await.unwrap();
        let owner = client.new_owner();
        let lock = client
            .fair_lock("payouts")
            .unwrap()
            .with_owner(owner.clone());
        owners.push(owner.id().to_string());
        clients.push(client);
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            guard.unlock().await.unwrap();
        }));
        // One after the other, so the arrival order is known; each hears its grant on its
        // owner's channel.
        wait_for_zcard(&holder, &waiters_key, n).await;
        wait_for_subscribers(
            &holder,
            &format!("leasehold:{{payouts}}:released:{}", owners[n as usize - 1]),
            1,
        )
        .await;
    }

    let state = ok_json(&url, &["inspect", "payouts", "--json"]).await;
    assert_eq!(state["kind"], "reentrant");
    assert_eq!(state["lock_kind"], "lock");
    assert_eq!(state["mode"], Json::Null);
    assert_eq!(state["holders"][0]["owner"], guard.owner().id());
    assert_eq!(state["holders"][0]["token"], guard.fencing_token().get());
    assert_eq!(state["fence"], guard.fencing_token().get());
    let queue = state["queue"].as_array().unwrap();
    let queued: Vec<&str> = queue.iter().map(|w| w["owner"].as_str().unwrap()).collect();
    assert_eq!(queued, owners);
    for waiter in queue {
        assert_eq!(waiter["wants"], Json::Null);
        let entry = waiter["entry_ms"].as_i64().expect("an entry deadline");
        assert!(entry > 0 && entry <= 30_000, "entry {entry}");
        assert!(waiter["waiting_ms"].as_u64().unwrap() < 30_000);
    }
    // The line's clients, in line order (each waiting owner here has a client of its own).
    let clients: Vec<&str> = clients.iter().map(LockClient::id).collect();
    assert_eq!(state["queued_clients"], serde_json::json!(clients));
    assert_eq!(state["waiters"], 2, "the line's entries: {state}");

    let text = ok(&url, &["inspect", "payouts"]).await;
    assert!(
        text.contains("kind     lock (reentrant; plain or fair"),
        "{text}"
    );
    assert!(
        text.contains(&format!("{}  hold count 1\n", guard.owner().id())),
        "{text}"
    );
    for (i, owner) in owners.iter().enumerate() {
        assert!(
            text.contains(&format!("{}. {owner}  waiting ", i + 1)),
            "{text}"
        );
    }
    assert!(text.contains(" s left"), "{text}");
    assert!(text.contains("waiters  2 in line\n"), "{text}");

    let listed = ok_json(&url, &["list", "--json"]).await;
    let locks = listed["locks"].as_array().unwrap();
    assert_eq!(locks.len(), 1, "the waiters' zsets are not locks: {listed}");
    assert_eq!(locks[0]["name"], "payouts");
    assert_eq!(locks[0]["lock_kind"], "lock");
    assert_eq!(locks[0]["mode"], Json::Null);
    assert_eq!(locks[0]["queued"], 2);
    assert_eq!(locks[0]["fence"], guard.fencing_token().get());
    let text = ok(&url, &["list"]).await;
    let fields = row(&text, "payouts");
    assert_eq!(fields[1..4], ["lock", "-", guard.owner().id()], "{text}");
    assert_eq!(fields[5], "2", "queued: {text}");
    let frame = ok(&url, &["watch", "--once"]).await;
    let fields = row(&frame, "payouts");
    assert_eq!(
        fields[1..5],
        ["lock", "-", guard.owner().id(), "1"],
        "{frame}"
    );
    let n = fields.len();
    assert_eq!(fields[n - 3], "2", "queued: {frame}");

    guard.unlock().await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("every waiter gets the lock in turn")
            .unwrap();
    }
    // Nobody waits: the line is gone.
    let alone = lock.lock().await.unwrap();
    let state = ok_json(&url, &["inspect", "payouts", "--json"]).await;
    assert_eq!(state["lock_kind"], "lock");
    assert_eq!(state["queue"], Json::Array(vec![]));
    assert_eq!(state["waiters"], 0);
    alone.unlock().await.unwrap();
}

/// The server's clock in microseconds.
fn server_time_us(redis: &leasehold_testkit::RedisServer) -> u64 {
    let time = redis.command(&["TIME"]).unwrap();
    let parts = time.as_array().unwrap();
    let part = |i: usize| -> u64 { parts[i].as_str().unwrap().parse().unwrap() };
    part(0) * 1_000_000 + part(1)
}

/// Read/write locks, written in Redis as the library lays them out (raw, for states that are
/// hard to reach through it at a chosen moment: a lapsed waiter entry, a writer that also
/// reads, a grant the waiter has not taken yet): write-held with the writer also reading,
/// read-held by two readers, and granted by a release to the writer that waited first (its
/// `~granted` mark still there). `inspect` shows the mode, the writer and readers with their
/// tokens and leases, and the queue with R/W per waiter; `list` and `watch` show the kind and
/// mode and do not list the auxiliary keys; `unlock --force` removes every hold and grants the
/// lock to the head writer, as a release would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_list_show_read_write_locks() {
    let redis = start_redis();
    let url = redis.url();
    let uuid = |c: char| c.to_string().repeat(32);
    let writer = format!("{}:t12", uuid('a'));
    let reader_a = format!("{}:t3", uuid('b'));
    let reader_b = format!("{}:o1", uuid('c'));
    let waiting_writer = format!("{}:t7", uuid('d'));
    let waiting_reader = format!("{}:t8", uuid('e'));
    let now_us = server_time_us(&redis);
    let ms = |offset: i64| ((now_us / 1_000) as i64 + offset).to_string();
    let score =
        |ago_us: u64, writing: bool| (2 * (now_us - ago_us) + u64::from(writing)).to_string();
    let run = |args: &[&str]| {
        redis.command(args).unwrap();
    };

    // Write-held: the writer holds twice and took a read hold too (a downgrade in the
    // making); a writer and a reader wait, the reader's entry has lapsed.
    let (rw, rf) = (format!("~r:{writer}"), format!("~rf:{writer}"));
    run(&[
        "HSET",
        "leasehold:{doc}",
        "~mode",
        "w",
        "~writer",
        &writer,
        &writer,
        "2",
        "~fence",
        "1001",
        &rw,
        "1",
        &rf,
        "1002",
    ]);
    run(&[
        "ZADD",
        "leasehold:{doc}:leases",
        &ms(20_000),
        &writer,
        &ms(15_000),
        &rw,
    ]);
    let (w_score, r_score) = (score(3_000_000, true), score(2_000_000, false));
    run(&[
        "ZADD",
        "leasehold:{doc}:waiters",
        &w_score,
        &waiting_writer,
        &r_score,
        &waiting_reader,
    ]);
    run(&[
        "ZADD",
        "leasehold:{doc}:waiters:until",
        &ms(25_000),
        &waiting_writer,
        &ms(-500),
        &waiting_reader,
    ]);
    // Read-held by two readers, a writer waiting.
    let (ra, rb) = (format!("~r:{reader_a}"), format!("~r:{reader_b}"));
    run(&[
        "HSET",
        "leasehold:{report}",
        "~mode",
        "r",
        &ra,
        "2",
        &format!("~rf:{reader_a}"),
        "1003",
        &rb,
        "1",
        &format!("~rf:{reader_b}"),
        "1004",
    ]);
    run(&[
        "ZADD",
        "leasehold:{report}:leases",
        &ms(10_000),
        &ra,
        &ms(5_000),
        &rb,
    ]);
    run(&[
        "ZADD",
        "leasehold:{report}:waiters",
        &w_score,
        &waiting_writer,
    ]);
    run(&[
        "ZADD",
        "leasehold:{report}:waiters:until",
        &ms(25_000),
        &waiting_writer,
    ]);
    // Granted by a release to the writer that waited first, not taken yet; a reader waits.
    run(&[
        "HSET",
        "leasehold:{handoff}",
        "~kind",
        "rw",
        "~mode",
        "w",
        "~writer",
        &waiting_writer,
        &waiting_writer,
        "1",
        "~fence",
        "1005",
        "~granted",
        "1",
    ]);
    run(&[
        "ZADD",
        "leasehold:{handoff}:leases",
        &ms(20_000),
        &waiting_writer,
    ]);
    run(&[
        "ZADD",
        "leasehold:{handoff}:waiters",
        &r_score,
        &waiting_reader,
    ]);
    run(&[
        "ZADD",
        "leasehold:{handoff}:waiters:until",
        &ms(25_000),
        &waiting_reader,
    ]);
    for key in [
        "{doc}",
        "{doc}:leases",
        "{report}",
        "{report}:leases",
        "{handoff}",
        "{handoff}:leases",
    ] {
        run(&["PEXPIRE", &format!("leasehold:{key}"), "20000"]);
    }

    // Write-held.
    let doc = ok_json(&url, &["inspect", "doc", "--json"]).await;
    assert_eq!(doc["kind"], "reentrant");
    assert_eq!(doc["lock_kind"], "rwlock");
    assert_eq!(doc["mode"], "write");
    assert_eq!(doc["fence"], 1001);
    let holders = doc["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 2, "{doc}");
    let hold = |h: &Json| {
        (
            h["owner"].as_str().unwrap().to_string(),
            h["hold_count"].as_u64().unwrap(),
            h["role"].as_str().unwrap().to_string(),
            h["token"].as_u64().unwrap(),
        )
    };
    assert_eq!(hold(&holders[0]), (writer.clone(), 2, "write".into(), 1001));
    assert_eq!(hold(&holders[1]), (writer.clone(), 1, "read".into(), 1002));
    let lease = |h: &Json| h["lease_ms"].as_i64().expect("a lease");
    assert!((1..=20_000).contains(&lease(&holders[0])), "{doc}");
    assert!((1..=15_000).contains(&lease(&holders[1])), "{doc}");
    let queue = doc["queue"].as_array().unwrap();
    assert_eq!(queue.len(), 2, "{doc}");
    assert_eq!(queue[0]["owner"], waiting_writer.as_str());
    assert_eq!(queue[0]["wants"], "write");
    assert!((3_000..60_000).contains(&queue[0]["waiting_ms"].as_u64().unwrap()));
    assert!((1..=25_000).contains(&queue[0]["entry_ms"].as_i64().unwrap()));
    assert_eq!(queue[1]["owner"], waiting_reader.as_str());
    assert_eq!(queue[1]["wants"], "read");
    assert!(queue[1]["entry_ms"].as_i64().unwrap() < 0, "a lapsed entry");

    let text = ok(&url, &["inspect", "doc"]).await;
    assert!(text.contains("kind     rwlock"), "{text}");
    assert!(text.contains("mode     write\n"), "{text}");
    assert!(
        text.contains(&format!(
            "writer   {writer}  hold count 2  token 1001  lease "
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "reader   {writer}  hold count 1  token 1002  lease "
        )),
        "{text}"
    );
    assert!(text.contains("fence    1001 (the writer's token"), "{text}");
    assert!(
        text.contains(&format!("queue    1. W {waiting_writer}  waiting ")),
        "{text}"
    );
    assert!(
        text.contains(&format!("         2. R {waiting_reader}  waiting ")),
        "{text}"
    );
    assert!(text.contains("entry ran out"), "{text}");

    // Read-held.
    let report = ok_json(&url, &["inspect", "report", "--json"]).await;
    assert_eq!(report["lock_kind"], "rwlock");
    assert_eq!(report["mode"], "read");
    assert_eq!(report["fence"], Json::Null);
    let holders = report["holders"].as_array().unwrap();
    assert_eq!(
        hold(&holders[0]),
        (reader_a.clone(), 2, "read".into(), 1003)
    );
    assert_eq!(
        hold(&holders[1]),
        (reader_b.clone(), 1, "read".into(), 1004)
    );
    assert!((1..=10_000).contains(&lease(&holders[0])), "{report}");
    assert!(lease(&holders[1]) <= 5_000, "{report}");
    assert!(lease(&holders[1]) < lease(&holders[0]), "{report}");
    assert_eq!(report["queue"][0]["wants"], "write");
    let text = ok(&url, &["inspect", "report"]).await;
    assert!(text.contains("mode     read (2 readers)"), "{text}");
    assert!(
        text.contains(&format!(
            "reader   {reader_a}  hold count 2  token 1003  lease "
        )),
        "{text}"
    );
    assert!(text.contains("fence    none (read-held"), "{text}");
    assert!(!text.contains("writer "), "{text}");

    // Granted to the writer by the line: its mark is not a holder.
    let handoff = ok_json(&url, &["inspect", "handoff", "--json"]).await;
    assert_eq!(handoff["lock_kind"], "rwlock");
    assert_eq!(handoff["mode"], "write");
    let holders = handoff["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 1, "{handoff}");
    assert_eq!(holders[0]["owner"], waiting_writer.as_str());
    assert_eq!(holders[0]["role"], "write");
    assert_eq!(handoff["queue"][0]["wants"], "read");
    let text = ok(&url, &["inspect", "handoff"]).await;
    assert!(!text.contains("~granted"), "{text}");

    // The listing: three locks, none of their zsets.
    let listed = ok_json(&url, &["list", "--json"]).await;
    let summary: Vec<(&str, &str, &Json, u64)> = listed["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap(),
                l["lock_kind"].as_str().unwrap(),
                &l["mode"],
                l["queued"].as_u64().unwrap(),
            )
        })
        .collect();
    let (read, write) = (Json::from("read"), Json::from("write"));
    assert_eq!(
        summary,
        [
            ("doc", "rwlock", &write, 2),
            ("handoff", "rwlock", &write, 1),
            ("report", "rwlock", &read, 1),
        ]
    );
    assert_eq!(listed["locks"][0]["holders"][1]["role"], "read");
    let text = ok(&url, &["list"]).await;
    let doc_row = row(&text, "doc");
    assert_eq!(doc_row[1..3], ["rwlock", "write"], "{text}");
    assert!(
        text.contains(&format!("{writer} x2 (write), {writer} x1 (read)  2")),
        "{text}"
    );
    assert_eq!(row(&text, "report")[1..3], ["rwlock", "read"], "{text}");
    assert_eq!(row(&text, "handoff")[1..3], ["rwlock", "write"], "{text}");
    assert!(text.contains("3 locks"), "{text}");

    // watch: a read-held lock's token is its newest reader's.
    let frame = ok(&url, &["watch", "--once"]).await;
    let fields = row(&frame, "report");
    assert_eq!(
        fields[1..6],
        ["rwlock", "read", "2", "holds", "3"],
        "{frame}"
    );
    let n = fields.len();
    assert_eq!(fields[n - 3..], ["1", "1004", "1"], "{frame}");
    let fields = row(&frame, "doc");
    assert_eq!(fields[1..3], ["rwlock", "write"], "{frame}");
    assert_eq!(fields[fields.len() - 2], "1001", "{frame}");

    // unlock --force removes a read/write lock with its leases.
    let text = ok(&url, &["unlock", "--force", "--yes", "doc"]).await;
    assert!(
        text.contains(&format!(
            "held by {writer} (write hold count 2), {writer} (read hold count 1)"
        )),
        "{text}"
    );
    // Every hold went, and the writer first in line was granted the lock.
    assert_eq!(
        redis
            .command(&["ZRANGE", "leasehold:{doc}:leases", "0", "-1"])
            .unwrap()
            .as_array()
            .map(<[_]>::len),
        Some(1)
    );
    let doc = ok_json(&url, &["inspect", "doc", "--json"]).await;
    assert_eq!(doc["lock_kind"], "rwlock");
    assert_eq!(doc["mode"], "write");
    let holders = doc["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 1, "{doc}");
    assert_eq!(holders[0]["owner"], waiting_writer.as_str());
}

/// A read/write lock built through the library: a writer holds, a reader, a writer and a
/// reader queue behind it; then the first reader holds while the others wait. `inspect` and
/// `list` show what its scripts wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_list_follow_a_read_write_lock_of_the_library() {
    let redis = start_redis();
    let url = redis.url();
    let holder = LockClient::connect(&url).await.unwrap();
    let rw = holder.rw_lock("catalog").unwrap();
    let waiters_key = rw.write().keys().waiters();
    let writing = rw.write().lock().await.unwrap();

    let (read_tx, mut read_rx) = tokio::sync::mpsc::unbounded_channel();
    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let mut clients = Vec::new();
    let mut owners = Vec::new();
    let mut tasks = Vec::new();
    for (n, reading) in [(1, true), (2, false), (3, true)] {
        let client = LockClient::connect(&url).await.unwrap();
        let owner = client.new_owner();
        let rw = client.rw_lock("catalog").unwrap().with_owner(owner.clone());
        owners.push(owner.id().to_string());
        clients.push(client);
        let (read_tx, mut done_rx) = (read_tx.clone(), done_rx.clone());
        tasks.push(tokio::spawn(async move {
            let side = if reading { rw.read() } else { rw.write() };
            let guard = side.lock().await.unwrap();
            read_tx.send(n).unwrap();
            // The first reader holds until the test has looked.
            if n == 1 {
                done_rx.wait_for(|done| *done).await.unwrap();
            }
            guard.unlock().await.unwrap();
        }));
        wait_for_zcard(&holder, &waiters_key, n).await;
    }

    let state = ok_json(&url, &["inspect", "catalog", "--json"]).await;
    assert_eq!(state["kind"], "reentrant");
    assert_eq!(state["lock_kind"], "rwlock");
    assert_eq!(state["mode"], "write");
    assert_eq!(state["fence"], writing.fencing_token().get());
    let holders = state["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 1, "{state}");
    assert_eq!(holders[0]["owner"], writing.owner().id());
    assert_eq!(holders[0]["role"], "write");
    assert_eq!(holders[0]["hold_count"], 1);
    assert_eq!(holders[0]["token"], writing.fencing_token().get());
    let lease = holders[0]["lease_ms"]
        .as_i64()
        .expect("the write hold's lease");
    assert!(lease > 0 && lease <= 30_000, "lease {lease}");
    let queue: Vec<(&str, &str)> = state["queue"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["owner"].as_str().unwrap(), w["wants"].as_str().unwrap()))
        .collect();
    assert_eq!(
        queue,
        [
            (owners[0].as_str(), "read"),
            (owners[1].as_str(), "write"),
            (owners[2].as_str(), "read"),
        ]
    );
    let text = ok(&url, &["inspect", "catalog"]).await;
    assert!(text.contains("mode     write\n"), "{text}");
    assert!(
        text.contains(&format!(
            "writer   {}  hold count 1  token ",
            writing.owner().id()
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("         2. W {}  waiting ", owners[1])),
        "{text}"
    );
    let listed = ok_json(&url, &["list", "--json"]).await;
    assert_eq!(listed["locks"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed["locks"][0]["lock_kind"], "rwlock");
    assert_eq!(listed["locks"][0]["mode"], "write");
    assert_eq!(listed["locks"][0]["queued"], 3);

    // The writer leaves: the reader before the waiting writer enters, the others wait.
    writing.unlock().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), read_rx.recv())
        .await
        .expect("the first reader gets in");
    assert_eq!(first, Some(1));
    wait_for_zcard(&holder, &waiters_key, 2).await;
    let state = ok_json(&url, &["inspect", "catalog", "--json"]).await;
    assert_eq!(state["lock_kind"], "rwlock");
    assert_eq!(state["mode"], "read");
    assert_eq!(state["fence"], Json::Null);
    assert_eq!(state["holders"][0]["owner"], owners[0].as_str());
    assert_eq!(state["holders"][0]["role"], "read");
    assert!(state["holders"][0]["token"].as_u64().is_some(), "{state}");
    assert!(state["holders"][0]["lease_ms"].as_i64().unwrap() > 0);
    assert_eq!(state["queue"][0]["wants"], "write");
    assert_eq!(state["queue"][1]["wants"], "read");
    let text = ok(&url, &["list"]).await;
    assert_eq!(row(&text, "catalog")[1..3], ["rwlock", "read"], "{text}");
    assert!(text.contains(&format!("{} x1 (read)", owners[0])), "{text}");

    done_tx.send(true).unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("every waiter gets the lock in turn")
            .unwrap();
    }
}

/// A semaphore and a count-down latch built through the library, and a semaphore written raw
/// with an expired permit (a state the library gives back at its next call, so it cannot be
/// held still through it): `inspect`, `list` and `watch` show the permits, each holder's
/// permits, token and lease, the waiters in line with what each wants, and the latch's count;
/// the semaphore's `:wants` hash is not listed as a lock, and neither a semaphore (which has
/// `~r:` fields and leases like a read/write lock) is taken for a read/write lock.
/// `unlock --force` refuses both and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_list_and_watch_show_semaphores_and_latches() {
    let redis = start_redis();
    let url = redis.url();
    let holder = LockClient::connect(&url).await.unwrap();
    let pool = holder.semaphore("pool").unwrap();
    assert!(pool.try_set_permits(3).await.unwrap());
    let permit = pool.acquire(2).await.unwrap();
    let token = permit.fencing_token().get();

    // Two waiters in line: the first wants 2 (only 1 is there), the second 1 (there, but it
    // may not pass the first).
    let waiters_key = pool.keys().waiters();
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    for (n, wanted) in [(1, 2), (2, 1)] {
        let client = LockClient::connect(&url).await.unwrap();
        let semaphore = client.semaphore("pool").unwrap();
        clients.push(client);
        tasks.push(tokio::spawn(async move {
            let permit = semaphore.acquire(wanted).await.unwrap();
            permit.release().await.unwrap();
        }));
        wait_for_zcard(&holder, &waiters_key, n).await;
    }

    let gate = holder.latch("gate").unwrap();
    assert!(gate.try_set_count(3).await.unwrap());
    assert_eq!(gate.count_down().await.unwrap(), 2);
    let latch_waiter = {
        let client = LockClient::connect(&url).await.unwrap();
        let gate = client.latch("gate").unwrap();
        clients.push(client);
        tokio::spawn(async move { gate.wait().await.unwrap() })
    };
    let gate_keys = holder.lock("gate").unwrap().keys().clone();
    wait_for_subscribers(&holder, gate_keys.released(), 1).await;

    // A semaphore as its scripts lay it out, one permit's lease run out a moment ago.
    let stale = format!("{}:o9", "f".repeat(32));
    let now_ms = (server_time_us(&redis) / 1_000) as i64;
    redis
        .command(&[
            "HSET",
            "leasehold:{raw}",
            "~permits",
            "2",
            "~used",
            "1",
            &format!("~r:{stale}"),
            "1",
            &format!("~rf:{stale}"),
            "77",
        ])
        .unwrap();
    redis
        .command(&[
            "ZADD",
            "leasehold:{raw}:leases",
            &(now_ms - 500).to_string(),
            &format!("~r:{stale}"),
        ])
        .unwrap();

    // inspect: the semaphore.
    let state = ok_json(&url, &["inspect", "pool", "--json"]).await;
    assert_eq!(state["kind"], "semaphore", "{state}");
    assert_eq!(state["lock_kind"], "semaphore");
    assert_eq!(state["mode"], Json::Null);
    assert_eq!(state["fence"], Json::Null);
    assert_eq!(state["ttl_ms"], Json::Null);
    assert_eq!(state["no_expiry"], true);
    assert_eq!(
        (
            &state["permits"],
            &state["permits_taken"],
            &state["permits_available"],
            &state["count"]
        ),
        (&Json::from(3), &Json::from(2), &Json::from(1), &Json::Null)
    );
    let holders = state["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 1, "{state}");
    assert_eq!(holders[0]["owner"], permit.id());
    assert_eq!(holders[0]["permits"], 2);
    assert_eq!(holders[0]["hold_count"], 1);
    assert_eq!(holders[0]["role"], Json::Null);
    assert_eq!(holders[0]["token"], token);
    let lease = holders[0]["lease_ms"].as_i64().expect("the permit's lease");
    assert!(lease > 0 && lease <= 30_000, "lease {lease}");
    let queue = state["queue"].as_array().unwrap();
    assert_eq!(queue.len(), 2, "{state}");
    let queued: Vec<(&str, u64)> = queue
        .iter()
        .map(|w| (w["owner"].as_str().unwrap(), w["permits"].as_u64().unwrap()))
        .collect();
    assert!(queued[0].0.starts_with(clients[0].id()), "{state}");
    assert!(queued[1].0.starts_with(clients[1].id()), "{state}");
    assert_eq!((queued[0].1, queued[1].1), (2, 1));
    for waiter in queue {
        assert_eq!(waiter["wants"], Json::Null);
        let entry = waiter["entry_ms"].as_i64().expect("an entry deadline");
        assert!(entry > 0 && entry <= 30_000, "entry {entry}");
    }
    assert_eq!(state["queued_clients"], Json::Array(vec![]));

    let text = ok(&url, &["inspect", "pool"]).await;
    assert!(text.starts_with("semaphore  pool\n"), "{text}");
    assert!(text.contains("kind       semaphore ("), "{text}");
    assert!(
        text.contains("permits    3 total, 2 taken, 1 available\n"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "holder     {}  permits 2  token {token}  lease ",
            permit.id()
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "queue      1. {}  wants 2 permits  waiting ",
            queued[0].0
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "           2. {}  wants 1 permit  waiting ",
            queued[1].0
        )),
        "{text}"
    );
    assert!(
        !text.contains("rwlock") && !text.contains("reader"),
        "{text}"
    );

    // The raw one: an expired permit is still taken until the semaphore's next call.
    let raw = ok_json(&url, &["inspect", "raw", "--json"]).await;
    assert_eq!(raw["lock_kind"], "semaphore", "{raw}");
    assert_eq!(raw["holders"][0]["owner"], stale.as_str());
    assert_eq!(raw["holders"][0]["token"], 77);
    assert!(raw["holders"][0]["lease_ms"].as_i64().unwrap() < 0, "{raw}");
    let text = ok(&url, &["inspect", "raw"]).await;
    assert!(
        text.contains("lease ran out ")
            && text.contains("its permits return at the semaphore's next call"),
        "{text}"
    );

    // inspect: the latch.
    let latch = ok_json(&url, &["inspect", "gate", "--json"]).await;
    assert_eq!(latch["kind"], "latch", "{latch}");
    assert_eq!(latch["lock_kind"], "latch");
    assert_eq!(latch["count"], 2);
    assert_eq!(latch["waiters"], 1);
    assert_eq!(latch["holders"], Json::Array(vec![]));
    assert_eq!(latch["permits"], Json::Null);
    let text = ok(&url, &["inspect", "gate"]).await;
    assert!(text.starts_with("latch    gate\n"), "{text}");
    assert!(
        text.contains("kind     latch (count-down latch)\n"),
        "{text}"
    );
    assert!(text.contains("count    2 ("), "{text}");
    assert!(text.contains("1 client subscribed"), "{text}");

    // list: the three, and not the semaphore's `:wants` hash (nor its zsets).
    assert_eq!(
        redis
            .command(&["TYPE", "leasehold:{pool}:wants"])
            .unwrap()
            .as_str(),
        Some("hash".to_string())
    );
    let listed = ok_json(&url, &["list", "--json"]).await;
    let locks = listed["locks"].as_array().unwrap();
    let names: Vec<&str> = locks.iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["gate", "pool", "raw"], "{listed}");
    let (gate_row, pool_row) = (&locks[0], &locks[1]);
    assert_eq!(pool_row["lock_kind"], "semaphore");
    assert_eq!(pool_row["mode"], Json::Null);
    assert_eq!(pool_row["permits"], 3);
    assert_eq!(pool_row["permits_taken"], 2);
    assert_eq!(pool_row["permits_available"], 1);
    assert_eq!(pool_row["queued"], 2);
    assert_eq!(pool_row["ttl_ms"], Json::Null);
    assert_eq!(pool_row["holders"][0]["owner"], permit.id());
    assert_eq!(pool_row["holders"][0]["permits"], 2);
    assert_eq!(pool_row["holders"][0]["token"], token);
    assert_eq!(gate_row["lock_kind"], "latch");
    assert_eq!(gate_row["count"], 2);
    assert_eq!(gate_row["queued"], 0);
    assert_eq!(gate_row["holders"], Json::Array(vec![]));
    let text = ok(&url, &["list"]).await;
    assert_eq!(
        row(&text, "pool"),
        [
            "pool",
            "semaphore",
            "2/3",
            "taken",
            permit.id(),
            "(2",
            "permits)",
            "2",
            "-"
        ],
        "{text}"
    );
    assert_eq!(
        row(&text, "gate"),
        ["gate", "latch", "count", "2", "-", "-", "-"],
        "{text}"
    );
    assert_eq!(
        row(&text, "raw")[1..4],
        ["semaphore", "1/2", "taken"],
        "{text}"
    );
    assert!(text.ends_with("2 semaphores, 1 latch\n"), "{text}");

    // watch: a semaphore's holds are its permits taken, its token its newest acquisition's.
    let frame = ok(&url, &["watch", "--once"]).await;
    let token_text = token.to_string();
    assert_eq!(
        row(&frame, "pool"),
        [
            "pool",
            "semaphore",
            "2/3",
            "taken",
            permit.id(),
            "2",
            "-",
            "2",
            token_text.as_str(),
            "1"
        ],
        "{frame}"
    );
    assert_eq!(
        row(&frame, "gate"),
        ["gate", "latch", "count", "2", "-", "-", "-", "-", "-", "0"],
        "{frame}"
    );

    // unlock --force refuses both, and changes nothing.
    for json in [false, true] {
        let mut args = vec!["unlock", "--force", "--yes", "pool"];
        if json {
            args.push("--json");
        }
        let output = leasehold(&url, &args).await;
        assert_clean_failure(
            &output,
            "\"pool\" is a semaphore (2/3 permits taken), not a lock",
        );
        assert!(
            stderr(&output).contains("Semaphore::delete"),
            "{}",
            stderr(&output)
        );
    }
    let output = leasehold(&url, &["unlock", "--force", "--yes", "gate"]).await;
    assert_clean_failure(
        &output,
        "\"gate\" is a count-down latch (count 2), not a lock",
    );
    assert!(
        stderr(&output).contains("Latch::count_down"),
        "{}",
        stderr(&output)
    );
    let output = leasehold(&url, &["unlock", "--force", "--yes", "raw"]).await;
    assert_clean_failure(&output, "is a semaphore (1/2 permits taken)");
    assert!(permit.is_held());
    assert_eq!(pool.available_permits().await.unwrap(), 1);
    assert_eq!(gate.count().await.unwrap(), 2);
    assert!(!latch_waiter.is_finished());
    assert_eq!(
        redis
            .command(&["HGET", "leasehold:{raw}", "~used"])
            .unwrap()
            .as_str(),
        Some("1".to_string())
    );

    // The waiters are served in turn; the latch opens.
    permit.release().await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("every waiter gets its permits in turn")
            .unwrap();
    }
    gate.count_down().await.unwrap();
    gate.count_down().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), latch_waiter)
        .await
        .expect("the latch opened")
        .unwrap();

    // A semaphore with nothing taken is still listed (it keeps its number); an open latch is
    // gone.
    let listed = ok_json(&url, &["list", "--json"]).await;
    let names: Vec<&str> = listed["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["pool", "raw"], "{listed}");
    assert_eq!(listed["locks"][0]["permits_taken"], 0);
    assert_eq!(listed["locks"][0]["holders"], Json::Array(vec![]));
    let text = ok(&url, &["inspect", "pool"]).await;
    assert!(text.contains("holders    none"), "{text}");
    assert!(text.contains("queue      empty"), "{text}");
    let absent = ok_json(&url, &["inspect", "gate", "--json"]).await;
    assert_eq!(absent["kind"], "none");
}
