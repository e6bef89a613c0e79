//! The fair lock (`LockClient::fair_lock`): strict arrival order over every waiter of every
//! client, queue entries kept alive by the watchdog, dead and cancelled waiters skipped,
//! against real redis-servers.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{client, client_with_lease, cmd, eventually, lock_keys, server, until_queued, zcard};
use leasehold::LockClient;
use parking_lot::Mutex;
use tokio::time::Instant;

/// The order test: 20 waiters over 4 clients, queued one after another while the lock
/// is held, get it in exactly that order.
#[tokio::test]
async fn twenty_waiters_over_four_clients_acquire_in_arrival_order() {
    let redis = server();
    let url = redis.url();
    let holder = client(&url).await;
    let lock = holder.fair_lock("payouts").unwrap();
    let waiters_key = lock.keys().waiters();
    let guard = lock.lock().await.unwrap();
    let mut clients: Vec<LockClient> = Vec::new();
    for _ in 0..4 {
        clients.push(client(&url).await);
    }
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..20 {
        let lock = clients[i % 4].fair_lock("payouts").unwrap();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            order.lock().push(i);
            tokio::time::sleep(Duration::from_millis(5)).await;
            guard.unlock().await.unwrap();
        }));
        until_queued(&redis, &waiters_key, i as i64 + 1).await;
    }
    guard.unlock().await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("every waiter gets the lock")
            .unwrap();
    }
    assert_eq!(*order.lock(), (0..20).collect::<Vec<_>>());
    assert_eq!(lock_keys(&redis), Vec::<String>::new());
}

/// Each waiter is woken alone on its turn: a release with eight waiters queued costs the
/// release and the head's acquire, not a try by everyone.
#[tokio::test]
async fn a_release_wakes_only_the_head() {
    let redis = server();
    let url = redis.url();
    let holder = client(&url).await;
    let lock = holder.fair_lock("herd").unwrap();
    let waiters_key = lock.keys().waiters();
    let guard = lock.lock().await.unwrap();
    let (got_tx, mut got_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut clients = Vec::new();
    for i in 0..8 {
        let c = client(&url).await;
        let lock = c.fair_lock("herd").unwrap();
        let got_tx = got_tx.clone();
        clients.push(c);
        tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            got_tx.send(i).unwrap();
            std::future::pending::<()>().await;
            drop(guard);
        });
        until_queued(&redis, &waiters_key, i + 1).await;
    }
    let scripts_before = evalsha_calls(&redis);
    guard.unlock().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), got_rx.recv())
        .await
        .expect("the head gets the lock");
    assert_eq!(first, Some(0));
    // Give stray tries time to show up: a herd would be seven more script calls at once.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let calls = evalsha_calls(&redis) - scripts_before;
    // The release and the head's acquire; a watchdog renewal may fall in the window too.
    assert!(
        calls <= 4,
        "{calls} script calls for one handoff: the others woke too"
    );
    assert!(got_rx.try_recv().is_err(), "only the head got the lock");
}

fn evalsha_calls(redis: &leasehold_testkit::RedisServer) -> i64 {
    let info = cmd(redis, &["INFO", "commandstats"]).as_str().unwrap();
    info.lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// try_lock on a fair lock does not jump the line: it succeeds only when nobody waits.
#[tokio::test]
async fn try_lock_does_not_jump_the_line() {
    let redis = server();
    let url = redis.url();
    let (a, b) = (client(&url).await, client(&url).await);
    let lock_a = a.fair_lock("line").unwrap();
    let lock_b = b.fair_lock("line").unwrap();
    let guard = lock_a.lock().await.unwrap();
    // The waiter keeps the lock until the barger has tried: reserved for the waiter or held by
    // it, the lock is not the barger's (once the waiter released it, it would be).
    let (tried, barger_tried) = tokio::sync::oneshot::channel::<()>();
    let waiter = tokio::spawn({
        let lock_b = lock_b.clone();
        async move {
            let guard = lock_b.lock().await.unwrap();
            let token = guard.fencing_token();
            let _ = barger_tried.await;
            guard.unlock().await.unwrap();
            token
        }
    });
    until_queued(&redis, &lock_a.keys().waiters(), 1).await;
    guard.unlock().await.unwrap();
    // Released with a waiter queued: the lock is reserved for it; a try by anyone else fails.
    let barger = tokio::spawn(async move { lock_a.try_lock().await.unwrap().is_some() });
    let barged = barger.await.unwrap();
    let _ = tried.send(());
    let token = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(token.get() > 0);
    assert!(!barged, "try_lock took the lock past a queued waiter");
}

/// Cancelled and timed-out waits leave the line at once: no entry stays, and a turn reserved
/// for a waiter that left passes on without waiting for its entry to lapse.
#[tokio::test]
async fn cancelled_and_timed_out_waits_leave_no_entry() {
    let redis = server();
    let url = redis.url();
    let (a, b, c) = (client(&url).await, client(&url).await, client(&url).await);
    let lock = a.fair_lock("cancel").unwrap();
    let waiters_key = lock.keys().waiters();
    let guard = lock.lock().await.unwrap();
    // Timed out.
    let lock_b = b.fair_lock("cancel").unwrap();
    assert!(lock_b
        .try_lock_for(Duration::from_millis(200))
        .await
        .unwrap()
        .is_none());
    until_queued(&redis, &waiters_key, 0).await;
    // Cancelled (the task aborted while waiting), ahead of another waiter.
    let cancelled = tokio::spawn(async move { lock_b.lock().await.map(|_| ()) });
    until_queued(&redis, &waiters_key, 1).await;
    let lock_c = c.fair_lock("cancel").unwrap();
    let behind = tokio::spawn(async move {
        // The default lease is 30 s: this only succeeds in time if the cancelled waiter's
        // entry left at once.
        let guard = lock_c.try_lock_for(Duration::from_secs(10)).await.unwrap();
        guard.map(|g| g.fencing_token())
    });
    until_queued(&redis, &waiters_key, 2).await;
    cancelled.abort();
    let _ = cancelled.await;
    until_queued(&redis, &waiters_key, 1).await;
    guard.unlock().await.unwrap();
    assert!(behind.await.unwrap().is_some());
    assert!(
        eventually(Duration::from_secs(10), || lock_keys(&redis).is_empty()).await,
        "left behind: {:?}",
        lock_keys(&redis)
    );
    assert_eq!(a.watchdog_stats().holds, 0);
}

/// A live waiter is never evicted: one that waits three entry lifetimes (nine renewal periods)
/// keeps its place ahead of a later one. The holder's explicit lease is long, so the waiters
/// sleep on it without trying: only the watchdog's renewals keep their entries.
#[tokio::test]
async fn a_long_waiter_keeps_its_place() {
    let redis = server();
    let url = redis.url();
    let lease = Duration::from_millis(900); // renewals every 300 ms
    let (a, b, c) = (
        client_with_lease(&url, lease).await,
        client_with_lease(&url, lease).await,
        client_with_lease(&url, lease).await,
    );
    let lock = a.fair_lock("long").unwrap();
    let waiters_key = lock.keys().waiters();
    let guard = lock.lock_with_lease(lease * 20).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let spawn = |c: &LockClient, who: &'static str| {
        let lock = c.fair_lock("long").unwrap();
        let order = order.clone();
        tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            order.lock().push(who);
            guard.unlock().await.unwrap();
        })
    };
    let first = spawn(&b, "first");
    until_queued(&redis, &waiters_key, 1).await;
    let second = spawn(&c, "second");
    until_queued(&redis, &waiters_key, 2).await;
    // Three full entry lifetimes (nine renewal periods) of waiting.
    tokio::time::sleep(lease * 3).await;
    assert_eq!(zcard(&redis, &waiters_key), 2, "a live waiter was evicted");
    assert!(guard.is_held());
    guard.unlock().await.unwrap();
    first.await.unwrap();
    second.await.unwrap();
    assert_eq!(*order.lock(), vec!["first", "second"]);
}

/// A waiter SIGKILLed in the middle of the line delays those behind it by at most the
/// documented bound: its entry's lifetime, one watchdog lease.
#[tokio::test]
async fn a_killed_waiter_in_the_line_is_skipped_within_one_lease() {
    let redis = server();
    let url = redis.url();
    let lease = Duration::from_millis(1500);
    let (a, b, c) = (
        client_with_lease(&url, lease).await,
        client_with_lease(&url, lease).await,
        client_with_lease(&url, lease).await,
    );
    let lock = a.fair_lock("killed").unwrap();
    let waiters_key = lock.keys().waiters();
    let guard = lock.lock().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let spawn = |c: &LockClient, who: &'static str| {
        let lock = c.fair_lock("killed").unwrap();
        let order = order.clone();
        tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            order.lock().push((who, Instant::now()));
            guard.unlock().await.unwrap();
        })
    };
    let first = spawn(&b, "first");
    until_queued(&redis, &waiters_key, 1).await;
    let child = common::spawn_fair_waiter(&redis, "killed", lease);
    until_queued(&redis, &waiters_key, 2).await;
    let last = spawn(&c, "last");
    until_queued(&redis, &waiters_key, 3).await;
    child.kill().unwrap();
    let released = Instant::now();
    guard.unlock().await.unwrap();
    first.await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), last)
        .await
        .expect("the waiter behind a dead one gets the lock")
        .unwrap();
    let order = order.lock().clone();
    assert_eq!(
        order.iter().map(|(w, _)| *w).collect::<Vec<_>>(),
        vec!["first", "last"]
    );
    // The bound: the dead entry lapses at most one lease after its last renewal (before the
    // kill); 2 s of slack for a slow machine.
    let delay = order[1].1 - released;
    assert!(
        delay < lease + Duration::from_secs(2),
        "the dead waiter held the line for {delay:?}"
    );
    assert!(
        eventually(Duration::from_secs(10), || lock_keys(&redis).is_empty()).await,
        "left behind: {:?}",
        lock_keys(&redis)
    );
}

#[test]
fn child_holder_entry_point() {
    common::run_child_holder_if_asked();
}

/// A fair waiter whose grant reply is lost keeps its place: the settle that takes the grant
/// back puts it first in line again (the lock is reserved for it), and the waiter behind it
/// does not get in first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_grant_reply_is_lost_keeps_its_place() {
    let redis = server();
    let name = "fair:lost-reply";
    let holder = client(&redis.url()).await;
    let lock = holder.fair_lock(name).unwrap();
    let guard = lock.lock().await.unwrap();
    let (proxy, slow) = common::slow_client(&redis).await;
    let owner = slow.new_owner();
    let order = common::Order::default();
    let head = order.spawn("head", {
        let lock = slow.fair_lock(name).unwrap().with_owner(owner.clone());
        async move { lock.lock().await.map(|g| g.detach()) }
    });
    let waiters = format!("{}:waiters", lock.keys().hash());
    until_queued(&redis, &waiters, 1).await;
    let fast = client(&redis.url()).await;
    let behind = order.spawn("behind", {
        let lock = fast.fair_lock(name).unwrap();
        async move { lock.lock().await.map(|g| g.detach()) }
    });
    until_queued(&redis, &waiters, 2).await;
    proxy.set_latency(common::LATE_REPLY);
    guard.unlock().await.unwrap();
    let hash = lock.keys().hash().to_string();
    common::came_and_went(|| cmd(&redis, &["HEXISTS", &hash, owner.id()]).as_int() == Some(1))
        .await;
    order.settle_a_while().await;
    proxy.set_latency(Duration::ZERO);
    head.await.unwrap();
    behind.await.unwrap();
    assert_eq!(order.served(), ["head", "behind"]);
}

/// A fair waiter's try whose reply is lost queues the waiter; a release then grants it the lock
/// before the settle of that try reaches Redis. The grant is the line's, not the try's: the
/// settle leaves it, the waiter takes it, and the waiter behind does not get in first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_the_line_made_outlives_the_settle_of_the_waiters_unanswered_try() {
    let redis = server();
    let name = "fair:line-grant-settled";
    let holder = client(&redis.url()).await;
    let lock = holder.fair_lock(name).unwrap();
    let guard = lock.lock().await.unwrap();
    let (proxy, slow) = common::slow_client(&redis).await;
    let owner = slow.new_owner();
    // Far past the slow client's command timeout: the try reaches Redis after it timed out,
    // and its settle (sent on the same connection) only this long after the try.
    proxy.set_latency(Duration::from_millis(1500));
    let order = common::Order::default();
    let head = order.spawn("head", {
        let lock = slow.fair_lock(name).unwrap().with_owner(owner.clone());
        async move { lock.lock().await.map(|g| g.detach()) }
    });
    let waiters = lock.keys().waiters();
    until_queued(&redis, &waiters, 1).await;
    let fast = client(&redis.url()).await;
    let behind = order.spawn("behind", {
        let lock = fast.fair_lock(name).unwrap();
        async move { lock.lock().await.map(|g| g.detach()) }
    });
    until_queued(&redis, &waiters, 2).await;
    guard.unlock().await.unwrap();
    let hash = lock.keys().hash().to_string();
    let granted = cmd(
        &redis,
        &[
            "HMGET",
            &hash,
            owner.id(),
            leasehold_core::protocol::GRANTED_FIELD,
        ],
    );
    let one = leasehold_testkit::RespValue::Bulk(b"1".to_vec());
    assert_eq!(
        granted,
        leasehold_testkit::RespValue::Array(vec![one.clone(), one]),
        "the release granted the waiter in line"
    );
    proxy.set_latency(Duration::ZERO);
    head.await.unwrap();
    behind.await.unwrap();
    assert_eq!(order.served(), ["head", "behind"]);
}

/// A live waiter keeps a grant the line made to it for as long as it cannot take it: its
/// client's replies come too late for a while (a slow link past the command timeout), so it
/// hears its grant too late to take it from the message and its tries go unanswered, but its
/// entry's renewals still reach Redis, and they keep the grant alive. The waiter behind it does
/// not get in first, however long the slow spell lasts.
///
/// Failed before: the grant lasted only as long as the waiter's entry would have (one lease
/// after its last renewal), and nothing renewed it; it lapsed during the slow spell and the
/// waiter behind took the lock (order ["behind", "head"]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_waiter_keeps_a_grant_it_cannot_take_yet() {
    let redis = server();
    let name = "fair:kept-grant";
    let lease = Duration::from_millis(1500);
    let holder = client(&redis.url()).await;
    let lock = holder.fair_lock(name).unwrap();
    let guard = lock.lock().await.unwrap();
    let (proxy, slow) = common::slow_client_with_lease(&redis, lease).await;
    let order = common::Order::default();
    let head = order.spawn("head", {
        let lock = slow.fair_lock(name).unwrap();
        async move { lock.lock().await.map(|g| g.detach()) }
    });
    let waiters = lock.keys().waiters();
    until_queued(&redis, &waiters, 1).await;
    let fast = client_with_lease(&redis.url(), lease).await;
    let behind = order.spawn("behind", {
        let lock = fast.fair_lock(name).unwrap();
        async move { lock.lock().await.map(|g| g.detach()) }
    });
    until_queued(&redis, &waiters, 2).await;
    common::until_head_renewed_twice(&redis, lock.keys()).await;
    // Replies (and the grant's message) now come after the slow client's command timeout; its
    // commands still reach Redis, late.
    proxy.set_latency(Duration::from_millis(400));
    guard.unlock().await.unwrap();
    common::served_in_turn_after_a_slow_spell(&order, &proxy, lease, head, behind).await;
}

/// A waiter none of whose replies ever came (its link slow past the command timeout from its
/// first try on, so its client never learned its place in line) keeps the grant the line made
/// to it: each of its tries takes the grant, and each settle of such a try (its reply lost
/// too) leaves it, since the grant stays marked as the line's. The waiter behind does not get
/// in first, however long the slow spell lasts.
///
/// Failed before: a try that took the grant unmarked it, and its settle, knowing no place to
/// put the waiter back in, took the grant back and handed the lock to the waiter behind
/// (served during the slow spell: ["behind"]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_never_answered_keeps_the_grant_its_tries_take() {
    let redis = server();
    let name = "fair:never-answered";
    let lease = Duration::from_millis(1500);
    let holder = client(&redis.url()).await;
    let lock = holder.fair_lock(name).unwrap();
    let guard = lock.lock().await.unwrap();
    let (proxy, slow) = common::slow_client_with_lease(&redis, lease).await;
    proxy.set_latency(Duration::from_millis(400));
    let order = common::Order::default();
    let head = order.spawn("head", {
        let lock = slow.fair_lock(name).unwrap();
        async move { lock.lock().await.map(|g| g.detach()) }
    });
    let waiters = lock.keys().waiters();
    until_queued(&redis, &waiters, 1).await;
    let fast = client_with_lease(&redis.url(), lease).await;
    let behind = order.spawn("behind", {
        let lock = fast.fair_lock(name).unwrap();
        async move { lock.lock().await.map(|g| g.detach()) }
    });
    until_queued(&redis, &waiters, 2).await;
    guard.unlock().await.unwrap();
    common::served_in_turn_after_a_slow_spell(&order, &proxy, lease, head, behind).await;
}

/// A waiter whose first try found the lock free and took it, but whose reply never came (its
/// link slow past the command timeout), keeps that grant: a waiter's grant is marked as the
/// line's, so the settle of its try leaves it, and the waiter, still waiting, takes it when a
/// reply finally comes. The waiter that lined up behind it meanwhile does not get in first.
///
/// Failed before: the settle took the grant back, and with no place in line to put the waiter
/// back in (its try had been granted at once), the lock went to the waiter behind (served
/// during the slow spell: ["behind"]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_unanswered_first_try_took_a_free_lock_keeps_it() {
    let redis = server();
    let name = "fair:first-try-unanswered";
    let lease = Duration::from_millis(1500);
    let fast = client_with_lease(&redis.url(), lease).await;
    let lock = fast.fair_lock(name).unwrap();
    let (proxy, slow) = common::slow_client_with_lease(&redis, lease).await;
    let owner = slow.new_owner();
    proxy.set_latency(Duration::from_millis(400));
    let order = common::Order::default();
    let head = order.spawn("head", {
        let lock = slow.fair_lock(name).unwrap().with_owner(owner.clone());
        async move { lock.lock().await.map(|g| g.detach()) }
    });
    let hash = lock.keys().hash().to_string();
    assert!(
        eventually(Duration::from_secs(10), || cmd(
            &redis,
            &["HEXISTS", &hash, owner.id()]
        )
        .as_int()
            == Some(1))
        .await,
        "the slow waiter's try took the free lock"
    );
    let behind = order.spawn("behind", {
        let lock = lock.clone();
        async move { lock.lock().await.map(|g| g.detach()) }
    });
    until_queued(&redis, &lock.keys().waiters(), 1).await;
    common::served_in_turn_after_a_slow_spell(&order, &proxy, lease, head, behind).await;
}

/// A fair lock's hold extends like the plain lock's: its expiry in Redis and its deadline
/// move, and another owner still finds it held.
#[tokio::test]
async fn extending_a_fair_lease_moves_its_expiry_and_keeps_others_out() {
    let redis = server();
    let holder = client(&redis.url()).await;
    let other = client(&redis.url()).await;
    let lock = holder.fair_lock("fair-extended").unwrap();
    let guard = lock.lock_with_lease(Duration::from_secs(5)).await.unwrap();
    guard.extend(Duration::from_secs(600)).await.unwrap();
    let ttl = common::pttl(&redis, "leasehold:{fair-extended}");
    assert!(ttl > 500_000, "PTTL {ttl} ms");
    assert!(guard.valid_until() > Instant::now() + Duration::from_secs(500));
    let other_lock = other.fair_lock("fair-extended").unwrap();
    assert!(other_lock.try_lock().await.unwrap().is_none());
    // Lost to a force unlock: the extension finds the grant gone.
    assert!(other_lock.force_unlock().await.unwrap());
    assert!(matches!(
        guard.extend(Duration::from_secs(600)).await,
        Err(leasehold::LockError::LeaseLost { .. })
    ));
    assert_eq!(guard.lost_reason(), Some(leasehold::LostReason::Gone));
}
