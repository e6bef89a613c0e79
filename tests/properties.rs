//! Bad input and abuse, against a real redis-server.
//!
//! - Generated lock names (any string: braces, very long, empty, unicode, control characters)
//!   and durations never panic: each gets a typed error or correct behaviour, and nothing is
//!   ever written outside the key prefix.
//! - Every release path against keys of other types and against expired holds gets a typed
//!   answer and leaves foreign data alone. (Foreign and guessed owners: `tests/security.rs`.)

mod common;

use std::cell::Cell;
use std::time::Duration;

use common::{cmd, exists, pttl, server};
use leasehold::schedule::{run_once, RunOnce, RunOnceOptions};
use leasehold::{LockClient, LockError, MAX_LEASE, MAX_NAME_LEN};
use leasehold_core::commands::{self, ReleaseKind};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tokio::runtime::Runtime;

const PREFIX: &str = "prop";

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        // Failures are reported with the shrunk input; no regression files in the tree.
        failure_persistence: None,
        ..Config::default()
    })
}

/// The name rules of docs/guide.md, written independently of the library.
fn name_is_valid(name: &str) -> bool {
    if name.is_empty() || name.len() > MAX_NAME_LEN || name.chars().any(char::is_control) {
        return false;
    }
    if has_hash_tag(name) {
        // A tagged name is used as given, so it must not end like another lock's own key
        // (`:released`, `:queue`) nor in `:fence`, kept for per-slot fencing counters.
        ![":fence", ":released", ":queue"]
            .iter()
            .any(|suffix| name.ends_with(suffix))
    } else {
        !name.contains(['{', '}'])
    }
}

/// A `{` followed later by a `}`, with at least one byte between the first `{` and the first
/// `}` after it (Redis Cluster's hash tag rule).
fn has_hash_tag(name: &str) -> bool {
    name.find('{')
        .and_then(|open| name[open + 1..].find('}'))
        .is_some_and(|len| len > 0)
}

fn expected_hash(name: &str) -> String {
    if has_hash_tag(name) {
        format!("{PREFIX}:{name}")
    } else {
        format!("{PREFIX}:{{{name}}}")
    }
}

fn names() -> impl Strategy<Value = String> {
    prop_oneof![
        // Anything at all, control characters included.
        any::<String>(),
        // Brace soup: tags, half tags, empty tags, reserved suffixes.
        "[a-c{}:]{0,10}",
        "\\{[a-z]{0,2}\\}(:fence|:released|:queue|:x|)",
        "[a-z]{0,3}\\{[^}]{0,4}\\}[a-z{}]{0,3}",
        // Printable unicode, right-to-left marks and emoji included.
        "\\PC{1,12}",
        // Around the length limit.
        "[a-z]{1015,1030}",
        "é{505,520}",
        Just(String::new()),
        Just("{}".to_string()),
        Just("\u{0}".to_string()),
        Just("a\u{85}b".to_string()),
        Just("*".to_string()),
        Just("?[a]".to_string()),
    ]
}

/// A lock name either is refused with `InvalidArgument` before anything is sent, or locks
/// exactly the keys the guide names, excludes a second client, hands over to a waiter through
/// its release channel, and leaves nothing behind but the prefix's fencing counter.
#[test]
fn any_lock_name_gets_a_typed_error_or_a_working_lock() {
    let redis = server();
    let rt = runtime();
    let (client, rival) = rt.block_on(async {
        let build = || LockClient::builder(&redis.url()).prefix(PREFIX).build();
        (build().await.unwrap(), build().await.unwrap())
    });
    let strategy = (names(), any::<u8>());
    let cases = Cell::new(0);
    runner(200)
        .run(&strategy, |(name, dice)| {
            cases.set(cases.get() + 1);
            let valid = name_is_valid(&name);
            let lock = match client.lock(&name) {
                Err(LockError::InvalidArgument(_)) if !valid => return Ok(()),
                Err(error) => {
                    return Err(TestCaseError::fail(format!(
                        "{name:?} (valid: {valid}) refused with {error:?}"
                    )))
                }
                Ok(_) if !valid => {
                    return Err(TestCaseError::fail(format!(
                        "{name:?} breaks the name rules but was accepted"
                    )))
                }
                Ok(lock) => lock,
            };
            let hash = expected_hash(&name);
            prop_assert_eq!(lock.keys().hash(), hash.as_str());
            let slot = lock.keys().slot();
            prop_assert_eq!(
                lock.keys().fence(),
                format!(
                    "{PREFIX}:{{{}}}:fence",
                    leasehold_core::slot::tag_of_slot(slot)
                )
            );
            prop_assert_eq!(leasehold_core::slot::key_slot(hash.as_bytes()), slot);
            prop_assert_eq!(lock.keys().released(), format!("{hash}:released"));
            rt.block_on(async {
                let guard = lock
                    .try_lock_with_lease(Duration::from_secs(30))
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{name:?}: {e:?}")))?
                    .ok_or_else(|| TestCaseError::fail(format!("{name:?} was busy")))?;
                prop_assert_eq!(
                    common::hget(&redis, &hash, guard.owner().id()),
                    Some(1),
                    "{:?}",
                    name
                );
                let other = rival.lock(&name).unwrap();
                prop_assert!(other.try_lock().await.unwrap().is_none(), "{:?}", name);
                if dice % 4 == 0 {
                    // Contended: the rival waits, is woken through the release channel.
                    let waiting = tokio::spawn(async move {
                        other
                            .try_lock_for(Duration::from_secs(10))
                            .await
                            .map(|g| g.map(|g| g.detach()))
                    });
                    let subscribed =
                        common::eventually(Duration::from_secs(10), || rival.waiters() == 1).await;
                    prop_assert!(subscribed, "{:?}: the rival never waited", name);
                    guard.unlock().await.unwrap();
                    let handed = waiting.await.unwrap().unwrap();
                    prop_assert!(handed.is_some(), "{:?}: no handoff", name);
                    handed.unwrap().unlock().await.unwrap();
                } else {
                    guard.unlock().await.unwrap();
                }
                prop_assert!(!exists(&redis, &hash), "{:?} still locked", name);
                Ok(())
            })
        })
        .unwrap();
    assert_eq!(cases.get(), 200);
    // Nothing outside the prefix, and nothing but the slots' fencing counters (and queues on
    // their way out).
    let keys = common::keys(&redis, "*");
    assert!(!keys.is_empty());
    for key in &keys {
        assert!(
            key.starts_with(&format!("{PREFIX}:")),
            "key {key:?} outside the prefix"
        );
        assert!(
            (key.starts_with(&format!("{PREFIX}:{{")) && key.ends_with("}:fence"))
                || key.ends_with(":queue"),
            "left behind: {key:?}"
        );
    }
}

fn durations() -> impl Strategy<Value = Duration> {
    prop_oneof![
        // Around the 1 ms floor.
        (0u64..3_000_000).prop_map(Duration::from_nanos),
        any::<u64>().prop_map(Duration::from_nanos),
        any::<u64>().prop_map(Duration::from_millis),
        any::<u64>().prop_map(Duration::from_secs),
        (0u64..=MAX_LEASE.as_secs()).prop_map(Duration::from_secs),
        Just(Duration::MAX),
        Just(MAX_LEASE),
        Just(MAX_LEASE + Duration::from_nanos(1)),
    ]
}

fn lease_is_valid(lease: Duration) -> bool {
    lease >= Duration::from_millis(1) && lease <= MAX_LEASE
}

/// Any lease or wait on every acquire path: a valid lease is set in Redis (PTTL within it),
/// an invalid one is `InvalidArgument` with nothing written; no wait panics.
#[test]
fn any_duration_gets_a_typed_error_or_the_lease_it_asked_for() {
    let redis = server();
    let rt = runtime();
    let client = rt.block_on(async {
        LockClient::builder(&redis.url())
            .prefix(PREFIX)
            .build()
            .await
            .unwrap()
    });
    let case = Cell::new(0u32);
    runner(150)
        .run(
            &(durations(), durations(), 0u8..5),
            |(lease, wait, path)| {
                case.set(case.get() + 1);
                let lock = client.lock(&format!("lease-{}", case.get())).unwrap();
                let hash = lock.keys().hash().to_string();
                rt.block_on(async {
                    let acquired = match path {
                        0 => lock.try_lock_with_lease(lease).await,
                        1 => lock.lock_with_lease(lease).await.map(Some),
                        2 => lock.try_lock_for_with_lease(wait, lease).await,
                        3 => {
                            let options = RunOnceOptions::at_most(lease).at_least(wait);
                            let ran = run_once(&lock, options, async { pttl(&redis, &hash) }).await;
                            match ran {
                                Ok(RunOnce::Ran(ttl)) => {
                                    prop_assert!(lease_is_valid(lease) && wait <= lease);
                                    let short = lease < Duration::from_secs(1);
                                    prop_assert!(
                                        (ttl > 0 || short) && ttl <= lease.as_millis() as i64
                                    );
                                    // hold_at_least may keep it for years: clear it.
                                    lock.force_unlock().await.unwrap();
                                }
                                Ok(RunOnce::Skipped) => prop_assert!(false, "skipped a free lock"),
                                Err(LockError::InvalidArgument(_)) => {
                                    prop_assert!(!lease_is_valid(lease) || wait > lease);
                                    prop_assert!(!exists(&redis, &hash));
                                }
                                Err(error) => prop_assert!(false, "{error:?}"),
                            }
                            return Ok(());
                        }
                        _ => {
                            // Watched lease; only the wait varies.
                            let guard = lock.try_lock_for(wait).await;
                            let guard = guard.unwrap().expect("free");
                            guard.unlock().await.unwrap();
                            return Ok(());
                        }
                    };
                    match acquired {
                        Ok(Some(guard)) => {
                            prop_assert!(lease_is_valid(lease), "{lease:?} accepted");
                            // A lease of a few ms may be over already (PTTL -2).
                            let short = lease < Duration::from_secs(1);
                            let ttl = pttl(&redis, &hash);
                            prop_assert!(
                                (ttl > 0 || short) && ttl <= lease.as_millis() as i64,
                                "PTTL {ttl} for a lease of {lease:?}"
                            );
                            prop_assert!(
                                guard.valid_until() <= tokio::time::Instant::now() + lease
                            );
                            // unlock_after takes any duration too.
                            match guard.unlock_after(wait).await {
                                Err(LockError::NotHeld { .. }) if short && lease_is_valid(wait) => {
                                }
                                Ok(()) => {
                                    prop_assert!(lease_is_valid(wait));
                                    let ttl = pttl(&redis, &hash);
                                    prop_assert!(ttl <= wait.as_millis() as i64, "{ttl}");
                                    lock.force_unlock().await.unwrap();
                                }
                                Err(LockError::InvalidArgument(_)) => {
                                    // The guard was consumed and released in the background.
                                    prop_assert!(!lease_is_valid(wait));
                                    let gone = common::eventually(Duration::from_secs(5), || {
                                        !exists(&redis, &hash)
                                    })
                                    .await;
                                    prop_assert!(gone, "invalid unlock_after left the lock held");
                                }
                                Err(error) => prop_assert!(false, "{error:?}"),
                            }
                        }
                        Ok(None) => prop_assert!(false, "a free lock was busy"),
                        Err(LockError::InvalidArgument(_)) => {
                            prop_assert!(!lease_is_valid(lease), "{lease:?} refused");
                            prop_assert!(!exists(&redis, &hash));
                        }
                        Err(error) => prop_assert!(false, "{error:?}"),
                    }
                    Ok(())
                })
            },
        )
        .unwrap();
    // Only fencing counters (one per Cluster slot) stay behind.
    let left = common::keys(&redis, "*");
    assert!(
        left.iter()
            .all(|k| k.starts_with("prop:{") && k.ends_with("}:fence")),
        "{left:?}"
    );
}

/// Client settings: any lease and command timeout build a client or give `InvalidArgument`.
#[test]
fn any_client_settings_build_or_get_a_typed_error() {
    let redis = server();
    let rt = runtime();
    let case = Cell::new(0);
    runner(24)
        .run(&(durations(), durations()), |(lease, timeout)| {
            case.set(case.get() + 1);
            // A name per case: a hold left by a timed-out case must not make the next one busy.
            let name = format!("settings-{}", case.get());
            rt.block_on(async {
                let built = LockClient::builder(&redis.url())
                    .lease(lease)
                    .command_timeout(timeout)
                    .build()
                    .await;
                let valid = lease >= Duration::from_millis(30)
                    && lease <= MAX_LEASE
                    && !timeout.is_zero()
                    && timeout <= MAX_LEASE;
                match built {
                    Ok(client) => {
                        prop_assert!(valid, "lease {lease:?}, timeout {timeout:?} accepted");
                        // Settings this short may time out, or see the lease end before the
                        // unlock, on a busy machine; any other outcome is a failure.
                        let short =
                            timeout < Duration::from_millis(100) || lease < Duration::from_secs(1);
                        let expected = |e: &LockError| {
                            short && (e.is_transient() || matches!(e, LockError::NotHeld { .. }))
                        };
                        match client.lock(&name).unwrap().try_lock().await {
                            Ok(Some(guard)) => match guard.unlock().await {
                                Ok(()) => {}
                                Err(e) => prop_assert!(expected(&e), "{e:?}"),
                            },
                            Ok(None) => prop_assert!(false, "{name} was busy"),
                            Err(e) => prop_assert!(expected(&e), "{e:?}"),
                        }
                    }
                    Err(LockError::InvalidArgument(_)) => prop_assert!(!valid),
                    // A valid but very short timeout: connecting takes longer than that.
                    Err(error) if error.is_transient() && timeout < Duration::from_millis(100) => {}
                    Err(error) => prop_assert!(false, "{error:?}"),
                }
                Ok(())
            })
        })
        .unwrap();
}

fn get(redis: &leasehold_testkit::RedisServer, key: &str) -> Option<String> {
    cmd(redis, &["GET", key]).as_str()
}

/// A string where the lock hash belongs: every path that touches it answers `WrongType` and
/// leaves the string (and its lack of TTL) alone. Renewal treats it as a lost hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_path_on_a_key_of_another_type_is_a_typed_error() {
    let redis = server();
    let client = LockClient::builder(&redis.url())
        .lease(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let lock = client.lock("foreign").unwrap();
    let key = lock.keys().hash().to_string();
    // The hold is taken first, then someone overwrites the key.
    let watched = lock.lock().await.unwrap();
    let fixed_lock = client.lock("foreign-fixed").unwrap();
    let fixed = fixed_lock
        .try_lock_with_lease(Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    cmd(&redis, &["SET", &key, "not a lock"]);
    cmd(
        &redis,
        &["SET", "leasehold:{foreign-fixed}", "not a lock either"],
    );

    tokio::time::timeout(Duration::from_secs(5), watched.lost())
        .await
        .expect("renewal marks a hold whose key changed type as lost");
    assert!(!watched.is_held());
    assert!(matches!(
        fixed.unlock_after(Duration::from_secs(1)).await,
        Err(LockError::WrongType { .. })
    ));
    assert!(matches!(
        watched.unlock().await,
        Err(LockError::WrongType { .. })
    ));
    assert!(matches!(
        lock.hold_count().await,
        Err(LockError::WrongType { .. })
    ));
    assert!(matches!(
        lock.try_lock_with_lease(Duration::from_secs(1)).await,
        Err(LockError::WrongType { .. })
    ));
    assert!(matches!(
        lock.lock().await,
        Err(LockError::WrongType { .. })
    ));
    let owner = client.new_owner();
    let renewed = common::renew_as(client.redis(), lock.keys(), &owner, 1).await;
    assert_eq!(renewed, [false]);
    // Settling an unanswered command there is refused the same way (and changes nothing).
    assert!(matches!(
        common::release_as(
            client.redis(),
            lock.keys(),
            &owner,
            ReleaseKind::Now,
            Some(1)
        )
        .await,
        Err(LockError::WrongType { .. })
    ));
    for (key, value) in [
        (key.as_str(), "not a lock"),
        ("leasehold:{foreign-fixed}", "not a lock either"),
    ] {
        assert_eq!(get(&redis, key).as_deref(), Some(value));
        assert_eq!(pttl(&redis, key), -1, "a TTL was put on {key}");
    }
}

/// A key of another type where the line of waiters belongs: the acquire that would use it is
/// refused with `WrongType`, and — the bug this test is about — it must not leave a hold
/// behind that nobody knows of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_queue_key_leaves_no_hidden_hold() {
    let redis = server();
    let holder = common::client(&redis.url()).await;
    let waiter = common::client(&redis.url()).await;
    let key = "leasehold:{queued}";
    let held_lock = holder.lock("queued").unwrap();
    let held = held_lock
        .try_lock_with_lease(Duration::from_secs(3))
        .await
        .unwrap()
        .expect("free");
    // The waiter lines up in a real line first...
    let lock = waiter.lock("queued").unwrap();
    let waiting = tokio::spawn(async move {
        lock.try_lock_for(Duration::from_secs(30))
            .await
            .map(|g| g.map(|g| g.detach()))
    });
    assert!(
        common::eventually(Duration::from_secs(10), || cmd(
            &redis,
            &["ZCARD", "leasehold:{queued}:waiters"]
        )
        .as_int()
            == Some(1))
        .await,
        "the waiter queued"
    );
    // ...then a foreign key takes the line's place. The release ignores it (it grants nobody),
    // and the waiter's next try, at its bound (the holder's 3 s lease), finds the lock FREE:
    // the path where the line is touched before the hold is written.
    cmd(&redis, &["DEL", "leasehold:{queued}:waiters"]);
    cmd(&redis, &["SET", "leasehold:{queued}:waiters", "not a line"]);
    held.unlock().await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the waiter tried again within its bound")
        .unwrap();
    assert!(
        matches!(result, Err(LockError::WrongType { .. })),
        "{result:?}"
    );
    assert!(
        !exists(&redis, key),
        "the failed acquire left a hold: {:?}",
        cmd(&redis, &["HGETALL", key])
    );
    assert_eq!(
        get(&redis, "leasehold:{queued}:waiters").as_deref(),
        Some("not a line")
    );
}

/// A hold whose lease ran out: every release path says `NotHeld` (or "nothing removed"),
/// before and after another owner took the lock, and the new holder keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_path_on_an_expired_hold_is_not_held() {
    let redis = server();
    let client = common::client(&redis.url()).await;
    let rival = common::client(&redis.url()).await;
    let lock = client.lock("expired").unwrap();
    let key = lock.keys().hash().to_string();
    let take = || lock.try_lock_with_lease(Duration::from_millis(50));
    let a = take().await.unwrap().unwrap();
    let owner = a.owner().clone();
    assert!(common::eventually(Duration::from_secs(5), || !exists(&redis, &key)).await);
    assert!(!a.is_held());
    assert!(matches!(a.unlock().await, Err(LockError::NotHeld { .. })));

    let b = take().await.unwrap().unwrap();
    assert!(common::eventually(Duration::from_secs(5), || !exists(&redis, &key)).await);
    assert!(matches!(
        b.unlock_after(Duration::from_secs(5)).await,
        Err(LockError::NotHeld { .. })
    ));
    let by_owner_lock = client.lock("expired").unwrap();
    let by_owner = by_owner_lock.with_owner(owner.clone());
    assert!(matches!(
        by_owner.unlock().await,
        Err(LockError::NotHeld { .. })
    ));
    assert_eq!(by_owner.hold_count().await.unwrap(), 0);
    assert!(!lock.force_unlock().await.unwrap(), "nothing to remove");
    assert_eq!(
        common::renew_as(client.redis(), lock.keys(), &owner, 1).await,
        [false]
    );
    assert!(!exists(&redis, &key), "renewal did not resurrect the hold");

    // Someone else holds it now: the stale paths still cannot touch that hold.
    let c = take().await.unwrap().unwrap();
    let theirs_lock = rival.lock("expired").unwrap();
    let theirs = theirs_lock
        .try_lock_for(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("free once c's 50 ms lease ran out");
    assert!(matches!(c.unlock().await, Err(LockError::NotHeld { .. })));
    assert!(matches!(
        by_owner.unlock().await,
        Err(LockError::NotHeld { .. })
    ));
    assert_ne!(
        common::release_as(
            client.redis(),
            lock.keys(),
            &owner,
            ReleaseKind::Now,
            Some(1)
        )
        .await
        .unwrap(),
        commands::Release::Released
    );
    assert_eq!(
        common::hget(&redis, &key, theirs.owner().id()),
        Some(1),
        "the new holder keeps its hold"
    );
    assert!(theirs.is_held());
    theirs.unlock().await.unwrap();
}

/// What a name is in use as, for [`every_acquire_on_a_name_of_another_kind_is_refused`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A lock, plain or fair (they share the hash and exclude each other).
    Lock,
    ReadWrite,
    Semaphore,
    Latch,
}

/// One acquire (or state change) of `kind` on `name`: the error it answered, if any.
async fn call_as(client: &LockClient, kind: Kind, name: &str, variant: usize) -> Option<LockError> {
    let wait = Duration::from_millis(150);
    let result = match (kind, variant) {
        (Kind::Lock, 0) => client.lock(name).unwrap().try_lock().await.map(|_| ()),
        (Kind::Lock, 1) => client
            .lock(name)
            .unwrap()
            .try_lock_for(wait)
            .await
            .map(|_| ()),
        (Kind::Lock, 2) => client.fair_lock(name).unwrap().try_lock().await.map(|_| ()),
        (Kind::Lock, _) => client
            .fair_lock(name)
            .unwrap()
            .try_lock_for(wait)
            .await
            .map(|_| ()),
        (Kind::ReadWrite, 0) => client
            .rw_lock(name)
            .unwrap()
            .read()
            .try_lock()
            .await
            .map(|_| ()),
        (Kind::ReadWrite, 1) => {
            let rw = client.rw_lock(name).unwrap();
            rw.read().try_lock_for(wait).await.map(|_| ())
        }
        (Kind::ReadWrite, 2) => client
            .rw_lock(name)
            .unwrap()
            .write()
            .try_lock()
            .await
            .map(|_| ()),
        (Kind::ReadWrite, _) => {
            let rw = client.rw_lock(name).unwrap();
            rw.write().try_lock_for(wait).await.map(|_| ())
        }
        (Kind::Semaphore, 0) => client
            .semaphore(name)
            .unwrap()
            .try_acquire(1)
            .await
            .map(|_| ()),
        (Kind::Semaphore, 1) => {
            let semaphore = client.semaphore(name).unwrap();
            semaphore.try_acquire_for(1, wait).await.map(|_| ())
        }
        (Kind::Semaphore, 2) => client.semaphore(name).unwrap().set_permits(3).await,
        (Kind::Semaphore, _) => client.semaphore(name).unwrap().add_permits(1).await,
        (Kind::Latch, 0) => client
            .latch(name)
            .unwrap()
            .try_set_count(2)
            .await
            .map(|_| ()),
        (Kind::Latch, 1) => client.latch(name).unwrap().count_down().await.map(|_| ()),
        (Kind::Latch, 2) => client.latch(name).unwrap().wait_for(wait).await.map(|_| ()),
        (Kind::Latch, _) => client.latch(name).unwrap().count().await.map(|_| ()),
    };
    result.err()
}

/// Every acquire (and every state change of a semaphore or latch) on a name in use by another
/// kind is refused with `WrongKind`, and writes nothing: one name is one resource. A lock and
/// a fair lock are one kind (the same hash; they exclude each other).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acquire_on_a_name_of_another_kind_is_refused_and_changes_nothing() {
    let redis = server();
    let client = LockClient::connect(&redis.url()).await.unwrap();
    // One name per kind, in use: held (or counting) by this client.
    let lock = client.lock("kinds:lock").unwrap();
    let _held = lock.lock().await.unwrap();
    let rw = client.rw_lock("kinds:rw").unwrap();
    let _read = rw.read().lock().await.unwrap();
    let semaphore = client.semaphore("kinds:semaphore").unwrap();
    semaphore.set_permits(2).await.unwrap();
    let _permit = semaphore.acquire(1).await.unwrap();
    let latch = client.latch("kinds:latch").unwrap();
    assert!(latch.try_set_count(3).await.unwrap());
    let names = [
        (Kind::Lock, "kinds:lock"),
        (Kind::ReadWrite, "kinds:rw"),
        (Kind::Semaphore, "kinds:semaphore"),
        (Kind::Latch, "kinds:latch"),
    ];
    let words = |kind: Kind| match kind {
        Kind::Lock => "lock",
        Kind::ReadWrite => "read/write lock",
        Kind::Semaphore => "semaphore",
        Kind::Latch => "count-down latch",
    };
    for (held, name) in names {
        let before = common::snapshot(&redis, name);
        for (asked, _) in names.iter().filter(|(kind, _)| *kind != held) {
            for variant in 0..4 {
                let error = call_as(&client, *asked, name, variant).await;
                assert!(
                    matches!(&error, Some(LockError::WrongKind { name: n, held_as, asked_as })
                        if n == name && held_as == words(held) && asked_as == words(*asked)),
                    "{asked:?} call {variant} on a {held:?}'s name: {error:?}"
                );
                assert_eq!(
                    common::snapshot(&redis, name),
                    before,
                    "{asked:?} call {variant} on a {held:?}'s name changed it"
                );
            }
        }
    }
}
