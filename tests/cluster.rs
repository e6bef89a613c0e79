//! Every script on Redis Cluster: a one-node cluster (`cluster-enabled yes`, every slot on the
//! node) refuses a script whose keys span slots with CROSSSLOT, exactly as a real cluster does.
//! Lock names here are spread over many slots, and every path runs: plain tries, re-entry,
//! waiting with the turn queue, renewal in batches, releases, `unlock_after`, settling an
//! unanswered command and `force_unlock`. A key outside the lock's slot can never come back
//! unnoticed.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use fred::types::config::{Config, ServerConfig};
use leasehold::{LockClient, LockError};
use leasehold_testkit::RedisServer;

fn cluster_node() -> RedisServer {
    RedisServer::builder()
        .single_node_cluster()
        .start()
        .unwrap_or_else(|e| panic!("cannot start a cluster-enabled redis-server: {e}"))
}

async fn cluster_client(node: &RedisServer, lease: Duration) -> LockClient {
    let config = Config {
        server: ServerConfig::new_clustered(vec![("127.0.0.1".to_string(), node.port())]),
        ..Config::default()
    };
    LockClient::builder_from_config(config)
        .lease(lease)
        .build()
        .await
        .expect("connect to the cluster")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_script_runs_on_a_cluster_with_names_over_many_slots() {
    let node = cluster_node();
    let a = cluster_client(&node, Duration::from_millis(600)).await;
    let b = cluster_client(&node, Duration::from_millis(600)).await;
    let names: Vec<String> = (0..200).map(|i| format!("order:{i}")).collect();
    let slots: BTreeSet<u16> = names
        .iter()
        .map(|n| a.lock(n).unwrap().keys().slot())
        .collect();
    assert!(slots.len() > 150, "names spread over {} slots", slots.len());

    // Grants, re-entries and explicit leases over every name; held across several renewal
    // periods, so the watchdog renews them in batches (one slot per batch on Cluster).
    let locks: Vec<_> = names.iter().map(|n| a.lock(n).unwrap()).collect();
    let mut guards = Vec::new();
    for lock in &locks {
        let outer = lock.try_lock().await.unwrap().expect("free");
        let inner = lock
            .try_lock_with_lease(Duration::from_secs(5))
            .await
            .unwrap()
            .expect("re-entry");
        assert_eq!(inner.hold_count(), 2);
        inner.unlock().await.unwrap();
        guards.push(outer);
    }
    let renewed = a.watchdog_stats().renewed;
    assert!(
        common::eventually(Duration::from_secs(15), || a.watchdog_stats().renewed
            >= renewed + 2 * names.len() as u64)
        .await,
        "renewals: {:?}",
        a.watchdog_stats()
    );
    assert_eq!(a.watchdog_stats().lost, 0, "{:?}", a.watchdog_stats());
    assert!(guards.iter().all(|g| g.is_held()));

    // Waiting: the other client waits on a few of them (turn queue, messages), then gets them.
    let mut waits = Vec::new();
    for name in names.iter().take(10) {
        let lock = b.lock(name).unwrap();
        waits.push(tokio::spawn(async move {
            lock.try_lock_for(Duration::from_secs(20))
                .await
                .map(|g| g.map(|g| g.detach()))
        }));
    }
    assert!(
        common::eventually(Duration::from_secs(10), || b.waiters() == 10).await,
        "the waiters queued"
    );
    for guard in guards.drain(..) {
        guard.unlock().await.unwrap();
    }
    for wait in waits {
        let guard = wait.await.unwrap().unwrap().expect("handed over");
        // unlock_after on half of them, a plain release on the others.
        if guard.fencing_token().get() % 2 == 0 {
            guard.unlock_after(Duration::from_millis(50)).await.unwrap();
        } else {
            guard.unlock().await.unwrap();
        }
    }

    // force_unlock, and a release without a guard.
    let lock = a.lock(&names[20]).unwrap();
    let held = lock.try_lock().await.unwrap().expect("free").detach();
    assert!(b.lock(&names[20]).unwrap().force_unlock().await.unwrap());
    assert!(matches!(
        held.unlock().await,
        Err(LockError::NotHeld { .. })
    ));
    let again = lock.lock().await.unwrap();
    std::mem::forget(again);
    lock.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
}

/// Settling runs on Cluster too: an acquire cancelled while its script is in flight is taken
/// back by the settle (the release script with an expected count), on names over many slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settles_run_on_a_cluster() {
    let node = cluster_node();
    let client = cluster_client(&node, Duration::from_secs(30)).await;
    for i in 0..50 {
        let lock = client.lock(&format!("settle:{i}")).unwrap();
        // Cancelled at its first await: sometimes before the send, sometimes in flight.
        let attempt = lock.try_lock();
        let _ = tokio::time::timeout(Duration::from_micros(1), attempt).await;
        assert!(
            common::eventually(Duration::from_secs(10), || !common::exists(
                &node,
                lock.keys().hash()
            ))
            .await,
            "settle:{i} was left held"
        );
    }
}

/// The fair lock's scripts on Cluster: queueing, entry renewals batched by slot, hand-on,
/// leaving the line, re-entry and force unlock, on names over many slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_lock_scripts_run_on_a_cluster() {
    let node = cluster_node();
    let lease = Duration::from_millis(600);
    let a = cluster_client(&node, lease).await;
    let b = cluster_client(&node, lease).await;
    let names: Vec<String> = (0..20).map(|i| format!("fair:{i}")).collect();
    let mut guards = Vec::new();
    for name in &names {
        let lock = a.fair_lock(name).unwrap();
        let guard = lock.try_lock().await.unwrap().expect("free");
        let inner = lock.try_lock().await.unwrap().expect("re-entry");
        inner.unlock().await.unwrap();
        guards.push(guard.detach());
    }
    // Waiters on every name, each also a timed-out wait that leaves the line.
    let mut waits = Vec::new();
    for name in &names {
        let lock = b.fair_lock(name).unwrap();
        assert!(lock
            .try_lock_for(Duration::from_millis(50))
            .await
            .unwrap()
            .is_none());
        waits.push(tokio::spawn(async move {
            lock.try_lock_for(Duration::from_secs(20))
                .await
                .map(|g| g.map(|g| g.detach()))
        }));
    }
    // Queue entries renewed over several renewal periods.
    assert!(
        common::eventually(Duration::from_secs(10), || b.waiters() == names.len()).await,
        "the waiters queued"
    );
    let renewed = b.watchdog_stats().renew_calls;
    assert!(
        common::eventually(Duration::from_secs(10), || b.watchdog_stats().renew_calls
            >= renewed + 6)
        .await
    );
    for guard in guards.drain(..) {
        guard.unlock().await.unwrap();
    }
    for wait in waits {
        let guard = wait.await.unwrap().unwrap().expect("handed over");
        guard.unlock().await.unwrap();
    }
    // force_unlock with a waiter queued hands the lock to it.
    let lock = a.fair_lock(&names[3]).unwrap();
    let held = lock.try_lock().await.unwrap().expect("free").detach();
    let waiter = {
        let lock = b.fair_lock(&names[3]).unwrap();
        tokio::spawn(async move {
            lock.try_lock_for(Duration::from_secs(20))
                .await
                .map(|g| g.is_some())
        })
    };
    assert!(common::eventually(Duration::from_secs(10), || b.waiters() == 1).await);
    assert!(a
        .fair_lock(&names[3])
        .unwrap()
        .force_unlock()
        .await
        .unwrap());
    assert!(waiter.await.unwrap().unwrap());
    drop(held);
}

/// The read/write lock's scripts on Cluster: reads, writes, downgrade, renewals of both sides
/// batched by slot, waiting readers and writers, leaving the line and force unlock, on names
/// over many slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_lock_scripts_run_on_a_cluster() {
    let node = cluster_node();
    let lease = Duration::from_millis(600);
    let a = cluster_client(&node, lease).await;
    let b = cluster_client(&node, lease).await;
    let names: Vec<String> = (0..20).map(|i| format!("rw:{i}")).collect();
    let mut guards = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let rw = a.rw_lock(name).unwrap();
        if i % 2 == 0 {
            let w = rw.write().try_lock().await.unwrap().expect("free");
            let r = rw.read().try_lock().await.unwrap().expect("downgrade");
            guards.push(w.detach());
            guards.push(r.detach());
        } else {
            guards.push(rw.read().try_lock().await.unwrap().expect("free").detach());
        }
    }
    // Held across several renewal periods: both sides renewed in batches by slot.
    let renewed = a.watchdog_stats().renewed;
    assert!(
        common::eventually(Duration::from_secs(15), || a.watchdog_stats().renewed
            >= renewed + 3 * guards.len() as u64)
        .await,
        "{:?}",
        a.watchdog_stats()
    );
    assert_eq!(a.watchdog_stats().lost, 0);
    // Writers wait on every name (a timed-out wait leaves first); readers wait behind them.
    let mut waits = Vec::new();
    for name in &names {
        let rw = b.rw_lock(name).unwrap();
        assert!(rw
            .write()
            .try_lock_for(Duration::from_millis(50))
            .await
            .unwrap()
            .is_none());
        waits.push(tokio::spawn(async move {
            rw.write()
                .try_lock_for(Duration::from_secs(20))
                .await
                .map(|g| g.map(|g| g.detach()))
        }));
    }
    assert!(
        common::eventually(Duration::from_secs(10), || b.waiters() == names.len()).await,
        "the writers queued"
    );
    for guard in guards.drain(..) {
        guard.unlock().await.unwrap();
    }
    for wait in waits {
        let guard = wait.await.unwrap().unwrap().expect("handed over");
        guard.unlock().await.unwrap();
    }
    let rw = a.rw_lock(&names[5]).unwrap();
    let held = rw.read().try_lock().await.unwrap().expect("free").detach();
    assert!(b
        .rw_lock(&names[5])
        .unwrap()
        .write()
        .force_unlock()
        .await
        .unwrap());
    assert!(!held.is_held() || held.unlock().await.is_err());
}

/// The semaphore's and the latch's scripts on Cluster: setting permits, acquiring several,
/// waiting in line, renewals of permits batched by slot, release by id, deleting; a latch set,
/// waited on and counted down; on names over many slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_and_latch_scripts_run_on_a_cluster() {
    let node = cluster_node();
    let lease = Duration::from_millis(600);
    let a = cluster_client(&node, lease).await;
    let b = cluster_client(&node, lease).await;
    let names: Vec<String> = (0..20).map(|i| format!("sem:{i}")).collect();
    let mut permits = Vec::new();
    for name in &names {
        let semaphore = a.semaphore(name).unwrap();
        assert!(semaphore.try_set_permits(2).await.unwrap());
        permits.push(semaphore.acquire(2).await.unwrap());
    }
    let renewed = a.watchdog_stats().renewed;
    assert!(
        common::eventually(Duration::from_secs(15), || a.watchdog_stats().renewed
            >= renewed + 3 * names.len() as u64)
        .await,
        "{:?}",
        a.watchdog_stats()
    );
    let mut waits = Vec::new();
    for name in &names {
        let semaphore = b.semaphore(name).unwrap();
        assert!(semaphore
            .try_acquire_for(1, Duration::from_millis(50))
            .await
            .unwrap()
            .is_none());
        waits.push(tokio::spawn(async move {
            semaphore.try_acquire_for(1, Duration::from_secs(20)).await
        }));
    }
    assert!(
        common::eventually(Duration::from_secs(10), || b.waiters() == names.len()).await,
        "the waiters queued"
    );
    for (i, permit) in permits.drain(..).enumerate() {
        if i % 2 == 0 {
            permit.release().await.unwrap();
        } else {
            let id = permit.id().to_string();
            std::mem::forget(permit);
            b.semaphore(&names[i])
                .unwrap()
                .release_permit(&id)
                .await
                .unwrap();
        }
    }
    for wait in waits {
        wait.await
            .unwrap()
            .unwrap()
            .expect("a permit")
            .release()
            .await
            .unwrap();
    }
    for name in &names {
        assert!(a.semaphore(name).unwrap().delete().await.unwrap());
    }
    for name in names.iter().take(5) {
        let latch = a.latch(&format!("latch:{name}")).unwrap();
        assert!(latch.try_set_count(1).await.unwrap());
        let waiting = {
            let latch = b.latch(&format!("latch:{name}")).unwrap();
            tokio::spawn(async move { latch.wait_for(Duration::from_secs(20)).await })
        };
        assert_eq!(latch.count_down().await.unwrap(), 0);
        assert!(waiting.await.unwrap().unwrap());
    }
}
