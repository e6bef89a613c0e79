//! MultiLock: several locks taken all or none, in canonical order, against real redis-servers.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{client, client_with_lease, eventually, lock_keys, server};
use leasehold::{LockClient, LockError, MultiLock};
use leasehold_testkit::{Proxy, RedisServer};
use parking_lot::Mutex;
use tokio::time::Instant;

/// The test: two tasks on two clients lock {a, b} and {b, a} in a loop; they never
/// deadlock and never overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_never_deadlock_nor_overlap() {
    let redis = server();
    let url = redis.url();
    let (one, two) = (client(&url).await, client(&url).await);
    let intervals = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (client, names) in [(one, ["a", "b"]), (two, ["b", "a"])] {
        let intervals = intervals.clone();
        tasks.push(tokio::spawn(async move {
            let multi = client
                .multi_lock(names.map(|n| client.lock(n).unwrap()))
                .unwrap();
            for _ in 0..40 {
                let guard = multi.lock().await.unwrap();
                let start = Instant::now();
                tokio::task::yield_now().await;
                let end = Instant::now();
                guard.unlock().await.unwrap();
                intervals.lock().push((start, end));
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("no deadlock")
            .unwrap();
    }
    let mut intervals = intervals.lock().clone();
    intervals.sort();
    assert_eq!(intervals.len(), 80);
    for pair in intervals.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "two holders of {{a, b}} at once");
    }
    assert_eq!(lock_keys(&redis), Vec::<String>::new());
}

/// All or none: with one member busy, `try_lock` gets nothing and leaves nothing held, and a
/// bounded wait that ends leaves nothing held either.
#[tokio::test]
async fn all_or_none() {
    let redis = server();
    let url = redis.url();
    let (a, b) = (client(&url).await, client(&url).await);
    let held = b.lock("y").unwrap();
    let guard = held.lock().await.unwrap();
    let multi = MultiLock::new([
        a.lock("x").unwrap(),
        a.lock("y").unwrap(),
        a.lock("z").unwrap(),
    ])
    .unwrap();
    assert!(multi.try_lock().await.unwrap().is_none());
    assert_eq!(lock_keys(&redis), vec!["leasehold:{y}".to_string()]);
    assert!(multi
        .try_lock_for(Duration::from_millis(200))
        .await
        .unwrap()
        .is_none());
    assert!(
        eventually(Duration::from_secs(10), || lock_keys(&redis)
            == vec!["leasehold:{y}".to_string()])
        .await,
        "left behind: {:?}",
        lock_keys(&redis)
    );
    guard.unlock().await.unwrap();
    let all = multi.try_lock().await.unwrap().expect("all free now");
    assert_eq!(all.guards().len(), 3);
    let tokens = all.fencing_tokens();
    assert_eq!(
        tokens.iter().map(|(name, _)| *name).collect::<Vec<_>>(),
        vec!["x", "y", "z"]
    );
    all.unlock().await.unwrap();
    assert_eq!(lock_keys(&redis), Vec::<String>::new());
}

/// Cancelled in the middle (holding the first member, waiting for the second): nothing stays
/// held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_in_the_middle_leaves_nothing_held() {
    let redis = server();
    let url = redis.url();
    let (a, b) = (client(&url).await, client(&url).await);
    let held = b.lock("second").unwrap();
    let guard = held.lock().await.unwrap();
    let multi = a
        .multi_lock([a.lock("second").unwrap(), a.lock("first").unwrap()])
        .unwrap();
    let waiting = tokio::spawn(async move { multi.lock().await.map(|_| ()) });
    // It holds "first" and waits for "second".
    assert!(
        eventually(Duration::from_secs(10), || common::exists(
            &redis,
            "leasehold:{first}"
        ) && a.waiters() == 1)
        .await
    );
    waiting.abort();
    let _ = waiting.await;
    assert!(
        eventually(Duration::from_secs(10), || lock_keys(&redis)
            == vec!["leasehold:{second}".to_string()])
        .await,
        "left behind: {:?}",
        lock_keys(&redis)
    );
    guard.unlock().await.unwrap();
}

/// One member force-unlocked: the guard reports the set lost.
#[tokio::test]
async fn a_member_force_unlocked_makes_the_guard_lost() {
    let redis = server();
    let a = client_with_lease(&redis.url(), Duration::from_millis(600)).await;
    let multi = a
        .multi_lock([a.lock("p").unwrap(), a.lock("q").unwrap()])
        .unwrap();
    let guard = multi.lock().await.unwrap();
    assert!(guard.is_held());
    assert!(a.lock("q").unwrap().force_unlock().await.unwrap());
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the multi-lock guard learns a member was lost");
    assert!(!guard.is_held());
    assert!(matches!(
        guard.run_while_held(async {}).await,
        Err(LockError::LeaseLost { name }) if name == "q"
    ));
    assert!(matches!(
        guard.unlock().await,
        Err(LockError::NotHeld { .. })
    ));
    assert_eq!(lock_keys(&redis), Vec::<String>::new());
}

/// Members re-enter per owner as their plain locks do; and the locks may live on different
/// Redis servers.
#[tokio::test]
async fn members_re_enter_and_may_be_on_different_servers() {
    let (one, two) = (server(), server());
    let (a, b) = (client(&one.url()).await, client(&two.url()).await);
    let account = a.lock("account:1").unwrap();
    let outer = account.lock().await.unwrap();
    let multi =
        MultiLock::new([b.lock("account:2").unwrap(), a.lock("account:1").unwrap()]).unwrap();
    let guard = multi.lock().await.unwrap();
    let counts: Vec<u64> = guard.guards().iter().map(|g| g.hold_count()).collect();
    assert_eq!(
        counts,
        vec![2, 1],
        "account:1 re-entered, account:2 granted"
    );
    guard.unlock().await.unwrap();
    assert_eq!(account.hold_count().await.unwrap(), 1);
    outer.unlock().await.unwrap();
    assert!(matches!(
        MultiLock::new([a.lock("x").unwrap(), a.lock("x").unwrap()]),
        Err(LockError::InvalidArgument(_))
    ));
    assert!(matches!(
        MultiLock::new([]),
        Err(LockError::InvalidArgument(_))
    ));
    assert_eq!(lock_keys(&one), Vec::<String>::new());
    assert_eq!(lock_keys(&two), Vec::<String>::new());
}

/// A bounded wait that ends with a later member still busy gives back the members it took
/// within what is left of the wait (at least `LAST_TRY_BUDGET`), all at once: a member whose
/// server stopped answering does not keep the caller for a whole command timeout (5 s). The
/// member on the healthy server is free when the call returns; the cut-off one is released in
/// the background once its server answers again, well before its 30 s lease would end it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_wait_gives_back_its_members_in_time_with_a_server_cut_off() {
    let (healthy, cut) = (server(), Arc::new(server()));
    let proxy = Arc::new(Proxy::start(cut.addr()).await.unwrap());
    let (direct, proxied) = (client(&healthy.url()).await, client(&proxy.url()).await);
    let other = client(&healthy.url()).await;
    let busy = other.lock("c").unwrap();
    let busy_guard = busy.lock().await.unwrap();
    // Taken in the order a, b, c: "a" (healthy) and "b" (behind the proxy), then a wait for
    // "c", held by `other` until the wait ends.
    let multi = MultiLock::new([
        direct.lock("c").unwrap(),
        proxied.lock("b").unwrap(),
        direct.lock("a").unwrap(),
    ])
    .unwrap();
    let b_key = proxied.lock("b").unwrap().keys().hash().to_string();
    // Once "b" is held, the link to its server is cut: its release will get no answer.
    let cutter = {
        let (proxy, cut) = (proxy.clone(), cut.clone());
        tokio::spawn(async move {
            assert!(
                eventually(Duration::from_secs(10), || common::exists(&cut, &b_key)).await,
                "the multi-lock took b"
            );
            proxy.partition();
        })
    };
    let wait = Duration::from_secs(1);
    let started = Instant::now();
    let got = multi.try_lock_for(wait).await;
    let took = started.elapsed();
    cutter.await.unwrap();
    eprintln!("try_lock_for({wait:?}) returned {got:?} after {took:?}");
    assert!(matches!(got, Ok(None)), "c stayed busy: {got:?}");
    assert!(
        took < wait + Duration::from_millis(1500),
        "returned {took:?} after a {wait:?} wait: the releases were not bounded by it"
    );
    assert_eq!(
        lock_keys(&healthy),
        vec!["leasehold:{c}".to_string()],
        "the member on the healthy server was given back before the call returned"
    );
    // The link heals (the connection lost bytes: it is reset, and the client reconnects); the
    // release of "b" that got no answer is settled.
    proxy.heal();
    proxy.close_all();
    assert!(
        eventually(Duration::from_secs(15), || lock_keys(&cut).is_empty()).await,
        "b was not released once its server answered: {:?}",
        lock_keys(&cut)
    );
    busy_guard.unlock().await.unwrap();
    assert_eq!(lock_keys(&healthy), Vec::<String>::new());
}
/// Two processes reach the same two servers under different addresses: the first reaches A as
/// `127.0.0.1` and B as `localhost`, the second the other way round. Both take {a@A, a@B}
/// (one lock name on two servers) in the same order, so neither holds one member while waiting
/// for the other's. Both queue for their first member while a third client holds both, which
/// is then released: taken in different orders, each would get one member and wait for the
/// other until its timeout. One lock listed twice under two addresses is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_is_the_same_whatever_address_reaches_a_server() {
    let (a, b) = (server(), server());
    let by_ip = |s: &RedisServer| format!("redis://127.0.0.1:{}", s.port());
    let by_name = |s: &RedisServer| format!("redis://localhost:{}", s.port());
    let first = [client(&by_ip(&a)).await, client(&by_name(&b)).await];
    let second = [client(&by_name(&a)).await, client(&by_ip(&b)).await];
    let everyone: Vec<LockClient> = first.iter().chain(&second).cloned().collect();
    let (holder_a, holder_b) = (client(&a.url()).await, client(&b.url()).await);
    let (held_a, held_b) = (holder_a.lock("a").unwrap(), holder_b.lock("a").unwrap());
    let (guard_a, guard_b) = (held_a.lock().await.unwrap(), held_b.lock().await.unwrap());
    let (first_a, second_a) = (first[0].clone(), second[0].clone());
    let take = |clients: [LockClient; 2]| {
        tokio::spawn(async move {
            let multi = MultiLock::new(clients.iter().map(|c| c.lock("a").unwrap())).unwrap();
            let started = Instant::now();
            let got = multi.try_lock_for(Duration::from_secs(15)).await.unwrap();
            let took = started.elapsed();
            let got = got.is_some();
            // Dropped here: released (in the background) for the other process.
            (got, took)
        })
    };
    let (one, two) = (take(first), take(second));
    assert!(
        eventually(Duration::from_secs(10), || everyone
            .iter()
            .map(LockClient::waiters)
            .sum::<usize>()
            == 2)
        .await,
        "both processes queue for their first member"
    );
    let (released_a, released_b) = tokio::join!(guard_a.unlock(), guard_b.unlock());
    released_a.unwrap();
    released_b.unwrap();
    let (one, two) = (one.await.unwrap(), two.await.unwrap());
    eprintln!("first process: {one:?}, second: {two:?}");
    assert!(
        one.0 && two.0,
        "both took {{a@A, a@B}} (first {one:?}, second {two:?}): taken in different orders, \
         each held one member and waited for the other"
    );
    assert!(
        eventually(Duration::from_secs(10), || lock_keys(&a).is_empty()
            && lock_keys(&b).is_empty())
        .await
    );
    // One lock listed twice, reached under two addresses, is still refused: it would wait for
    // itself.
    assert!(matches!(
        MultiLock::new([first_a.lock("a").unwrap(), second_a.lock("a").unwrap()]),
        Err(LockError::InvalidArgument(_))
    ));
}

/// A server's identity is its `run_id`, read again after a reconnect: a restarted server has
/// another, and a client connected before the restart and one connected after agree on it.
/// A server named by the caller keeps its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_identity_is_read_again_after_a_restart() {
    let redis = server();
    let run_id = |redis: &RedisServer| {
        let info = redis.info("server").unwrap();
        let id = info
            .lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .expect("INFO server has a run_id")
            .trim()
            .to_string();
        format!("run_id:{id}")
    };
    let before = client(&redis.url()).await;
    let named = LockClient::builder(&redis.url())
        .server_name("locks-a")
        .build()
        .await
        .unwrap();
    let lock = before.lock("x").unwrap();
    let first = run_id(&redis);
    assert_eq!(lock.server_identity(), first);
    assert_eq!(named.lock("x").unwrap().server_identity(), "name:locks-a");
    redis.restart().unwrap();
    let second = run_id(&redis);
    assert_ne!(first, second, "a restarted server has another run_id");
    // The client notices the restart when its connection breaks, reconnects, reads again.
    assert!(
        eventually(Duration::from_secs(20), || lock.server_identity() == second).await,
        "still {} after the restart (now {second})",
        lock.server_identity()
    );
    let after = client(&redis.url()).await;
    assert_eq!(after.lock("x").unwrap().server_identity(), second);
    assert_eq!(named.lock("x").unwrap().server_identity(), "name:locks-a");
    assert!(matches!(
        LockClient::builder(&redis.url())
            .server_name("")
            .build()
            .await,
        Err(LockError::InvalidArgument(_))
    ));
}
