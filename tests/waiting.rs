//! Waiting for a lock: pub/sub wake-ups, timeouts, crashed holders, cancellation and
//! connection loss, against real redis-servers.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{client, cmd, exists, server};
use leasehold::{LockClient, LockGuard};
use leasehold_testkit::RedisServer;
use parking_lot::Mutex;
use tokio::time::Instant;

fn numsub(redis: &RedisServer, channel: &str) -> i64 {
    let reply = cmd(redis, &["PUBSUB", "NUMSUB", channel]);
    reply.as_array().expect("numsub reply")[1]
        .as_int()
        .expect("count")
}

/// Waits (bounded) until the client has no waiter and no subscription left, and Redis agrees.
async fn assert_nothing_left(redis: &RedisServer, client: &LockClient, channel: &str) {
    assert!(
        common::eventually(Duration::from_secs(10), || client.waiters() == 0
            && client.subscribed_channels() == 0
            && numsub(redis, channel) == 0)
        .await,
        "left behind: waiters={} channels={} numsub={}",
        client.waiters(),
        client.subscribed_channels(),
        numsub(redis, channel)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_hands_off_to_a_waiter_without_polling() {
    let redis = server();
    let holder = client(&redis.url()).await;
    let waiter = common::client(&redis.url()).await;
    let guard_lock = holder.lock("handoff").unwrap();
    let guard = guard_lock.lock().await.unwrap();

    cmd(&redis, &["CONFIG", "RESETSTAT"]);
    let lock = waiter.lock("handoff").unwrap();
    let waiting = tokio::spawn(async move { lock.lock().await.unwrap().detach() });
    // Wait for the event "the waiter is subscribed and parked", not for a time.
    assert!(
        common::eventually(Duration::from_secs(10), || numsub(
            &redis,
            &common::client_channel(&waiter, "handoff")
        ) == 1)
        .await
    );
    assert_eq!(waiter.waiters(), 1);
    // Hold on a while: a poller would spin here.
    tokio::time::sleep(Duration::from_millis(500)).await;
    guard.unlock().await.unwrap();
    let acquired = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("woken by the release, long before the 30 s lease")
        .unwrap();
    let scripts = redis.command_calls("evalsha").unwrap() + redis.command_calls("eval").unwrap();
    // Waiter: failed try, retry after subscribing, winning try; holder: the release.
    assert!(scripts <= 4, "{scripts} script calls: the waiter polled");
    assert_eq!(redis.command_calls("subscribe").unwrap(), 1);
    acquired.unlock().await.unwrap();
    assert_nothing_left(&redis, &waiter, &common::client_channel(&waiter, "handoff")).await;
}

/// 64 waiters over 4 clients, each taking the lock 3 times: everyone is served, holds never
/// overlap, fencing tokens rise in hold order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_waiters_on_four_clients_never_overlap() {
    let redis = server();
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(common::client(&redis.url()).await);
    }
    let intervals: Arc<Mutex<Vec<(Instant, Instant, u64)>>> = Arc::default();
    let mut tasks = Vec::new();
    for i in 0..64 {
        let lock = clients[i % 4].lock("contended").unwrap();
        let intervals = intervals.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..3 {
                let guard = lock.lock().await.unwrap();
                let start = Instant::now();
                tokio::task::yield_now().await;
                let token = guard.fencing_token().get();
                let end = Instant::now();
                intervals.lock().push((start, end, token));
                guard.unlock().await.unwrap();
            }
        }));
    }
    let all = async {
        for task in tasks {
            task.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("every waiter is served");
    let mut intervals = intervals.lock().clone();
    assert_eq!(intervals.len(), 64 * 3);
    intervals.sort_by_key(|(start, _, _)| *start);
    for pair in intervals.windows(2) {
        assert!(pair[1].0 >= pair[0].1, "holds overlap: {pair:?}");
        assert!(pair[1].2 > pair[0].2, "tokens rise in hold order: {pair:?}");
    }
    for client in &clients {
        assert_nothing_left(&redis, client, &common::client_channel(client, "contended")).await;
    }
    assert!(!exists(&redis, "leasehold:{contended}"));
}

#[tokio::test]
async fn a_bounded_wait_times_out_and_leaves_nothing() {
    let redis = server();
    let holder = client(&redis.url()).await;
    let waiter = common::client(&redis.url()).await;
    let guard_lock = holder.lock("busy").unwrap();
    let guard = guard_lock.lock().await.unwrap();
    let started = Instant::now();
    let got_lock = waiter.lock("busy").unwrap();
    let got = got_lock
        .try_lock_for(Duration::from_millis(200))
        .await
        .unwrap();
    assert!(got.is_none(), "timed out");
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_nothing_left(&redis, &waiter, &common::client_channel(&waiter, "busy")).await;
    assert_eq!(
        common::hget(&redis, "leasehold:{busy}", guard.owner().id()),
        Some(1),
        "the holder's hash is untouched"
    );
    // Zero wait never waits and never subscribes.
    let got_lock = waiter.lock("busy").unwrap();
    let got = got_lock.try_lock_for(Duration::ZERO).await.unwrap();
    assert!(got.is_none());
    assert_eq!(waiter.subscribed_channels(), 0);
    guard.unlock().await.unwrap();
}

/// Entry point of the "holder" child process: run only when the parent test sets the
/// variables; as a plain test it returns at once.
#[test]
fn child_holder_entry_point() {
    common::run_child_holder_if_asked();
}

/// A holder process is SIGKILLed: nothing publishes, the key expires with its lease, and the
/// waiter wakes on its timer and acquires soon after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_acquires_soon_after_a_killed_holders_lease_ends() {
    let redis = server();
    let lease = Duration::from_millis(1500);
    let holder = common::spawn_holder(&redis, "crash", lease);
    let waiter = client(&redis.url()).await;
    let lock = waiter.lock("crash").unwrap();
    let waiting = tokio::spawn(async move {
        lock.try_lock_for(Duration::from_secs(60))
            .await
            .map(|g| g.map(|g| g.detach()))
    });
    assert!(
        common::eventually(Duration::from_secs(10), || numsub(
            &redis,
            &common::client_channel(&waiter, "crash")
        ) == 1)
        .await
    );
    holder.kill().unwrap();
    let killed_at = Instant::now();
    let guard = waiting
        .await
        .unwrap()
        .unwrap()
        .expect("acquired after the lease");
    let after = killed_at.elapsed();
    // The key lives at most one lease after the kill (the watchdog renewed it at most then).
    assert!(after <= lease + Duration::from_secs(3), "took {after:?}");
    guard.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waits_leave_nothing_behind() {
    let redis = server();
    let holder = client(&redis.url()).await;
    let waiter = common::client(&redis.url()).await;
    let guard_lock = holder.lock("cancel").unwrap();
    let guard = guard_lock.lock().await.unwrap();
    let channel = &common::client_channel(&waiter, "cancel");

    // Abort at many points of the waiting path: before the first try, mid-try, mid-subscribe,
    // while parked. Steps of yields make the points land differently on each round.
    for step in 0..40u32 {
        let lock = waiter.lock("cancel").unwrap();
        let task = tokio::spawn(async move { lock.lock().await.map(|g| g.detach()) });
        for _ in 0..step {
            tokio::task::yield_now().await;
        }
        if step % 4 == 0 {
            tokio::time::sleep(Duration::from_micros(200 * step as u64)).await;
        }
        task.abort();
        let _ = task.await;
    }
    // tokio::time::timeout and select! drop the future the same way.
    let lock = waiter.lock("cancel").unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(50), lock.lock())
        .await
        .is_err());
    tokio::select! {
        _ = lock.lock() => panic!("the lock is held"),
        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
    }
    assert_nothing_left(&redis, &waiter, channel).await;
    // Only the holder holds.
    let fields = cmd(&redis, &["HKEYS", "leasehold:{cancel}"]);
    let holders = fields
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f.as_str().is_some_and(|f| !f.starts_with('~')))
        .count();
    assert_eq!(holders, 1, "{fields:?}");
    // The cancelled waiters leave the line (a leave sent from a background task when a waiter
    // goes), so the release grants nothing to them.
    assert!(
        common::eventually(Duration::from_secs(10), || !exists(
            &redis,
            "leasehold:{cancel}:waiters"
        ))
        .await,
        "the waiters left the line"
    );
    guard.unlock().await.unwrap();
    assert!(!exists(&redis, "leasehold:{cancel}"));
    assert!(!exists(&redis, "leasehold:{cancel}:waiters"));
    assert!(!exists(&redis, "leasehold:{cancel}:waiters:until"));
}

/// Cancelling an acquire of a FREE lock at every point: either it never ran, or it was undone,
/// or the guard it produced was dropped. The lock ends up free every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquires_of_a_free_lock_leave_no_hold() {
    let redis = server();
    let client = client(&redis.url()).await;
    for step in 0..40u32 {
        let lock = client.lock("free").unwrap();
        let task = tokio::spawn(async move {
            lock.lock()
                .await
                .map(|g| Box::new(g.detach()) as Box<LockGuard>)
        });
        for _ in 0..step {
            tokio::task::yield_now().await;
        }
        task.abort();
        let _ = task.await;
        assert!(
            common::eventually(Duration::from_secs(10), || !exists(
                &redis,
                "leasehold:{free}"
            ))
            .await,
            "step {step}: a hold was left behind"
        );
    }
    assert_eq!(client.watchdog_stats().holds, 0);
}

/// The subscriber connection is killed while tasks wait: they resubscribe, are woken, and all
/// acquire once the lock is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_survive_a_killed_subscriber_connection() {
    let redis = server();
    let holder = client(&redis.url()).await;
    let waiter = common::client(&redis.url()).await;
    let guard_lock = holder.lock("pubsub-kill").unwrap();
    let guard = guard_lock.lock().await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let lock = waiter.lock("pubsub-kill").unwrap();
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            guard.unlock().await.unwrap();
        }));
    }
    // Waiting for real: subscribed in Redis (waiters() counts from before the SUBSCRIBE) and
    // queued, so the kill below hits a live subscriber.
    assert!(
        common::eventually(Duration::from_secs(10), || waiter.waiters() == 4
            && numsub(&redis, &common::client_channel(&waiter, "pubsub-kill")) == 1
            && cmd(&redis, &["ZCARD", "leasehold:{pubsub-kill}:waiters"]).as_int()
                == Some(1))
        .await
    );
    cmd(&redis, &["CLIENT", "KILL", "TYPE", "pubsub"]);
    guard.unlock().await.unwrap();
    let all = async {
        for task in tasks {
            task.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("every waiter acquired after the subscriber was killed");
    assert_nothing_left(
        &redis,
        &waiter,
        &common::client_channel(&waiter, "pubsub-kill"),
    )
    .await;
}

/// The server restarts (all data lost) while tasks wait: nothing hangs, everyone acquires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_survive_a_server_restart() {
    let redis = server();
    let holder = client(&redis.url()).await;
    let waiter = common::client(&redis.url()).await;
    let _guard_lock = holder.lock("restart").unwrap();
    let _guard = _guard_lock.lock().await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let lock = waiter.lock("restart").unwrap();
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            guard.unlock().await.unwrap();
        }));
    }
    assert!(common::eventually(Duration::from_secs(10), || waiter.waiters() == 4).await);
    redis.restart().unwrap();
    let all = async {
        for task in tasks {
            task.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("every waiter acquired after the restart");
    assert_nothing_left(&redis, &waiter, &common::client_channel(&waiter, "restart")).await;
}

/// The line: a release grants the lock to the waiter in line, even though the releaser asks
/// again at once (it would win a plain race, being first to hear its own reply).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_grants_the_waiter_in_line_not_the_releaser() {
    let redis = server();
    let releaser = client(&redis.url()).await;
    let waiter = client(&redis.url()).await;
    let lock = releaser.lock("turns").unwrap();
    let guard = lock.lock().await.unwrap();
    let waiting_lock = waiter.lock("turns").unwrap();
    let waiting = tokio::spawn(async move { waiting_lock.lock().await.unwrap().detach() });
    // The waiter is in line once its try in line was answered.
    assert!(
        common::eventually(Duration::from_secs(10), || cmd(
            &redis,
            &["ZCARD", "leasehold:{turns}:waiters"]
        )
        .as_int()
            == Some(1))
        .await
    );
    // The release granted the lock to the waiter in line: asking again at once fails.
    guard.unlock().await.unwrap();
    assert!(
        lock.try_lock().await.unwrap().is_none(),
        "the releaser barged in"
    );
    let handed = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter in line got the lock")
        .unwrap();
    assert_eq!(handed.hold_count(), 1);
    handed.unlock().await.unwrap();
    assert!(
        !exists(&redis, "leasehold:{turns}:waiters"),
        "the line emptied"
    );
    // Nobody in line now: the releaser's lock is free to take at once.
    lock.try_lock()
        .await
        .unwrap()
        .expect("free")
        .unlock()
        .await
        .unwrap();
}

/// Waiting works over RESP3 too (the subscriber confirms its subscriptions by the PING reply's
/// shape only over RESP2, where a subscribed connection answers differently).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_works_over_resp3() {
    let redis = server();
    let mut config = fred::types::config::Config::from_url(&redis.url()).unwrap();
    config.version = fred::types::RespVersion::RESP3;
    let a = leasehold::LockClient::builder_from_config(config.clone())
        .build()
        .await
        .unwrap();
    let b = leasehold::LockClient::builder_from_config(config)
        .build()
        .await
        .unwrap();
    let held = a.lock("resp3").unwrap();
    let guard = held.lock().await.unwrap();
    let waiter = {
        let lock = b.lock("resp3").unwrap();
        tokio::spawn(async move {
            lock.try_lock_for(Duration::from_secs(10))
                .await
                .map(|g| g.is_some())
        })
    };
    assert!(common::eventually(Duration::from_secs(10), || b.waiters() == 1).await);
    guard.unlock().await.unwrap();
    assert!(waiter.await.unwrap().unwrap());
}

/// A bounded wait over a slow but healthy link (100 ms each way) on a lock another client
/// holds says "busy" (`Ok(None)`): its first try was answered busy, and the time it then spent
/// opening the subscriber connection does not make Redis look unreachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_wait_on_a_slow_link_says_busy() {
    let redis = server();
    let holder = client(&redis.url()).await;
    let lock = holder.lock("slow:busy").unwrap();
    let _held = lock.lock().await.unwrap();
    let proxy = leasehold_testkit::Proxy::start(redis.addr()).await.unwrap();
    proxy.set_latency(Duration::from_millis(100));
    let far = client(&proxy.url()).await;
    let far_lock = far.lock("slow:busy").unwrap();
    let started = Instant::now();
    let waited = far_lock.try_lock_for(Duration::from_millis(300)).await;
    assert!(
        matches!(waited, Ok(None)),
        "a busy lock over a slow link: {waited:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3), "bounded");
}

/// The same wait over a dead link says it could not reach Redis (a transient error), not
/// "busy".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_wait_on_a_dead_link_says_unreachable() {
    let redis = server();
    let proxy = leasehold_testkit::Proxy::start(redis.addr()).await.unwrap();
    let far = client(&proxy.url()).await;
    let lock = far.lock("dead:link").unwrap();
    proxy.partition();
    let waited = lock.try_lock_for(Duration::from_millis(300)).await;
    assert!(
        matches!(&waited, Err(error) if error.is_transient()),
        "an unreachable Redis: {waited:?}"
    );
}

/// A waiter's SUBSCRIBE is written, then the server stops answering before the confirming PING
/// comes back (a pause, a slow failover): the subscribe's outcome is unknown, and the
/// subscription may be in Redis. The waiter gives up; when its channel goes idle the client
/// must unsubscribe it all the same, not leave a subscription nobody wants on its connection.
///
/// The pause is made in that window by the subscriber's test hook
/// (`leasehold_pubsub::set_subscribed_hook`), which runs after the `SUBSCRIBE` reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_whose_confirmation_went_unanswered_is_undone_when_its_waiter_leaves() {
    use std::sync::atomic::{AtomicBool, Ordering};

    use futures::FutureExt;

    let redis = Arc::new(server());
    let holder = client(&redis.url()).await;
    let waiter = LockClient::builder(&redis.url())
        .command_timeout(Duration::from_millis(300))
        .subscription_linger(Duration::ZERO)
        .build()
        .await
        .expect("connect");
    let name = "unanswered-confirmation";
    let channel = common::client_channel(&waiter, name);
    let held = holder.lock(name).unwrap();
    let guard = held.lock().await.unwrap();
    let paused = Arc::new(AtomicBool::new(false));
    leasehold_pubsub::set_subscribed_hook(Some(Arc::new({
        let (redis, channel, paused) = (redis.clone(), channel.clone(), paused.clone());
        move |_: &fred::clients::SubscriberClient, subscribed: &str| {
            if subscribed != channel || paused.swap(true, Ordering::SeqCst) {
                return futures::future::ready(()).boxed();
            }
            // Every command after this one waits 1.5 s: the PING outlives its 300 ms timeout.
            let redis = redis.clone();
            async move {
                tokio::task::spawn_blocking(move || {
                    cmd(&redis, &["CLIENT", "PAUSE", "1500", "ALL"])
                })
                .await
                .expect("paused");
            }
            .boxed()
        }
    })));
    let lock = waiter.lock(name).unwrap();
    let got = lock
        .try_lock_for(Duration::from_millis(600))
        .await
        .map(|g| g.is_some());
    leasehold_pubsub::set_subscribed_hook(None);
    assert!(paused.load(Ordering::SeqCst), "the hook ran");
    assert!(
        !matches!(got, Ok(true)),
        "the lock is held by another client: {got:?}"
    );
    // Once the pause is over, Redis has run the SUBSCRIBE: the idle channel must be undone.
    assert_nothing_left(&redis, &waiter, &channel).await;
    guard.unlock().await.unwrap();
}

/// A handoff costs one message to one client: eight clients wait (one waiter each), and each
/// release grants the first of them and tells only it, on its client's own channel. A herd
/// (a message every waiting client hears) fails here: every lock message is seen by a
/// pattern subscriber of the test, and each must go to a channel one waiter hears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_costs_one_message_to_one_client() {
    let redis = server();
    let name = "one-message";
    let messages = common::Messages::watch(&redis, name).await;
    let holder = client(&redis.url()).await;
    let held = holder.lock(name).unwrap();
    let guard = held.lock().await.unwrap();
    let mut waiters = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let waiter = client(&redis.url()).await;
        let lock = waiter.lock(name).unwrap();
        tasks.push(tokio::spawn(async move {
            lock.lock().await.unwrap().unlock().await.unwrap();
        }));
        waiters.push(waiter);
    }
    assert!(
        common::eventually(Duration::from_secs(20), || cmd(
            &redis,
            &["ZCARD", &format!("leasehold:{{{name}}}:waiters")]
        )
        .as_int()
            == Some(8))
        .await,
        "every client's waiter is in line"
    );
    guard.unlock().await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("every waiter is served")
            .unwrap();
    }
    assert!(!exists(&redis, &format!("leasehold:{{{name}}}")));
    // The last release found nobody in line: its "free" message goes to the lock's release
    // channel, which no lock waiter listens to.
    let free_channel = format!("leasehold:{{{name}}}:released");
    assert!(
        common::eventually(Duration::from_secs(10), || messages
            .seen()
            .iter()
            .any(|(channel, _)| *channel == free_channel))
        .await,
        "the last release was seen"
    );
    let seen = messages.seen();
    let grants: Vec<&(String, String)> = seen.iter().filter(|(c, _)| *c != free_channel).collect();
    assert_eq!(grants.len(), 8, "one message per handoff: {seen:#?}");
    for waiter in &waiters {
        let channel = common::client_channel(waiter, name);
        let to_it: Vec<_> = grants.iter().filter(|(c, _)| *c == channel).collect();
        assert_eq!(to_it.len(), 1, "one message to {channel}: {seen:#?}");
        assert!(to_it[0].1.starts_with('='), "a grant: {to_it:?}");
    }
    assert_eq!(
        seen.iter().filter(|(c, _)| *c == free_channel).count(),
        1,
        "{seen:#?}"
    );
}

/// A waiter that gave up before it heard of the grant a release made to it hands the grant
/// on when it leaves: the next waiter gets the lock at once, not when the grant lapses. One
/// that crashed instead (no leave) keeps it no longer than its entry would have kept its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_to_a_waiter_that_gave_up_passes_on() {
    use leasehold_core::commands::{self, Acquire, AcquireMode};

    let redis = server();
    let holder = client(&redis.url()).await;
    let other = client(&redis.url()).await;
    let scripts = common::scripts();
    for (name, crash) in [("gave-up", false), ("crashed", true)] {
        let held = holder.lock(name).unwrap();
        let keys = held.keys().clone();
        let guard = held.lock().await.unwrap();
        // The first waiter is driven by hand (as the engine sends its tries), with an entry
        // that lives 2 s unless renewed.
        let gone = other.new_owner();
        let life = leasehold::Lease::new(Duration::from_secs(2)).unwrap();
        let mode = AcquireMode::Waiter {
            entry_life: life,
            non_reentrant: false,
            fixed_lease: false,
        };
        let tried = commands::acquire(other.redis(), &scripts, &keys, &gone, life, mode)
            .await
            .unwrap();
        assert!(matches!(tried, Acquire::Held { .. }), "{tried:?}");
        let waiter = client(&redis.url()).await;
        let behind = {
            let lock = waiter.lock(name).unwrap();
            tokio::spawn(async move {
                let guard = lock.try_lock_for(Duration::from_secs(20)).await.unwrap();
                guard.map(|g| g.detach())
            })
        };
        let line = format!("leasehold:{{{name}}}:waiters");
        assert!(
            common::eventually(Duration::from_secs(10), || cmd(&redis, &["ZCARD", &line])
                .as_int()
                == Some(2))
            .await,
            "both waiters are in line"
        );
        guard.unlock().await.unwrap();
        let hash = format!("leasehold:{{{name}}}");
        assert_eq!(common::hget(&redis, &hash, gone.id()), Some(1), "granted");
        let ttl = cmd(&redis, &["PTTL", &hash]).as_int().unwrap();
        assert!(
            ttl > 0 && ttl <= 2_000,
            "the grant lasts as long as the entry would have: {ttl} ms"
        );
        if !crash {
            commands::leave_line(other.redis(), &scripts, &keys, &gone, None, None)
                .await
                .unwrap();
            assert_eq!(
                common::hget(&redis, &hash, gone.id()),
                None,
                "the leave passed the grant on"
            );
        }
        let got = behind.await.unwrap();
        got.expect("the waiter behind gets the lock")
            .unlock()
            .await
            .unwrap();
    }
}
