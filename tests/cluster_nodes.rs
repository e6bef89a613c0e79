//! The library on real multi-node deployments: a Redis Cluster of 3 primaries with a replica each
//! ([`RedisCluster`]) and a Sentinel-managed primary with two replicas ([`SentinelSet`]). Unlike
//! tests/cluster.rs (one node owning every slot), clients here are redirected: names land on all
//! three primaries, a slot moves while a lock in it is held and waited on (`ASK`, then `MOVED`), a
//! primary fails over (`CLUSTER FAILOVER`), and a Sentinel client follows a killed primary to the
//! promoted replica.
//!
//! Every test starts its own deployment: a cluster forms in about 2–2.5 s (6 processes, meet,
//! replicas synced and known everywhere), the Sentinel set in about 2.3 s, and the Sentinel
//! failover takes 2.3 s more (1 s to notice, then the election). Measured on the 2-core test
//! machine: every_kind_on_three_primaries ≈ 6 s, primary_failover_while_held_and_waited
//! ≈ 5 s, sentinel_failover_keeps_locks_usable ≈ 6 s; the file about 20 s in all.
//!
//! Clients connect as users do (RESP2, fred's default; scripts loaded by the library). Four tests
//! guard against multi-node failures coming back: NOSCRIPT on every primary but one; waiters
//! refused over RESP2; a command meeting `MOVED` failing; a command meeting `ASK` stopping fred's
//! clustered client for good (the last two under `max_command_attempts = 1`; see
//! `leasehold_core::scripts::resend_not_run`).

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::types::config::{Config, ServerConfig};
use fred::types::RespVersion;
use leasehold::{Lease, LockClient, LockKeys, Owner};
use leasehold_core::commands::{self, Acquire, AcquireMode, Release, ReleaseKind};
use leasehold_core::protocol::Protocol;
use leasehold_core::scripts::Scripts;
use leasehold_core::HoldId;
use leasehold_testkit::{RedisCluster, SentinelSet};

const LEASE: Duration = Duration::from_millis(600);

fn start_cluster() -> Arc<RedisCluster> {
    let started = Instant::now();
    let cluster = RedisCluster::start().unwrap_or_else(|e| panic!("cannot start a cluster: {e}"));
    eprintln!("cluster formed in {:?}", started.elapsed());
    Arc::new(cluster)
}

/// A cluster as users start one: the library loads its scripts on every primary itself.
fn start_cluster_with_scripts() -> Arc<RedisCluster> {
    start_cluster()
}

/// A client of the cluster over RESP2, fred's default.
async fn cluster_client(cluster: &RedisCluster) -> LockClient {
    cluster_client_over(cluster, RespVersion::RESP2).await
}

async fn cluster_client_with_lease(cluster: &RedisCluster, lease: Duration) -> LockClient {
    cluster_client_built(cluster, RespVersion::RESP2, lease).await
}

async fn cluster_client_over(cluster: &RedisCluster, version: RespVersion) -> LockClient {
    cluster_client_built(cluster, version, LEASE).await
}

async fn cluster_client_built(
    cluster: &RedisCluster,
    version: RespVersion,
    lease: Duration,
) -> LockClient {
    let config = Config {
        server: ServerConfig::new_clustered(cluster.seeds()),
        version,
        ..Config::default()
    };
    LockClient::builder_from_config(config)
        .lease(lease)
        .build()
        .await
        .expect("connect to the cluster")
}

async fn sentinel_client(set: &SentinelSet, lease: Duration) -> LockClient {
    let config = Config {
        server: ServerConfig::new_sentinel(
            set.sentinel_hosts(),
            leasehold_testkit::SENTINEL_SERVICE,
        ),
        ..Config::default()
    };
    LockClient::builder_from_config(config)
        .lease(lease)
        .build()
        .await
        .expect("connect through the Sentinels")
}

/// Runs a blocking testkit call off the runtime's workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

/// Polls `condition` every 10 ms until it holds or `within` passes.
async fn eventually(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if condition() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn within<T>(limit: Duration, what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, f)
        .await
        .unwrap_or_else(|_| panic!("{what} took over {limit:?}"))
}

/// One lock name per primary, in primary order (testkit), each checked: the library's slot of
/// the lock is the one `CLUSTER KEYSLOT` gives its hash key.
fn names_on_every_primary(
    cluster: &RedisCluster,
    client: &LockClient,
    prefix: &str,
) -> Vec<String> {
    let names = cluster
        .names_on_every_primary(prefix)
        .expect("a name on every primary");
    assert_eq!(names.len(), 3, "3 primaries");
    for name in &names {
        let lock = client.lock(name).unwrap();
        assert_eq!(
            cluster.key_slot(lock.keys().hash()).unwrap(),
            lock.keys().slot(),
            "CLUSTER KEYSLOT agrees with the library's slot"
        );
    }
    names
}

/// A lock's slot and another primary to move it to.
fn slot_and_target(cluster: &RedisCluster, client: &LockClient, name: &str) -> (u16, usize) {
    let slot = client.lock(name).unwrap().keys().slot();
    let from = cluster.owner_of_slot(slot).unwrap();
    let to = *cluster
        .primaries()
        .unwrap()
        .iter()
        .find(|&&p| p != from)
        .unwrap();
    (slot, to)
}

/// The fields of the hash `key` at `node`; `Err` with what the node answered when it has no
/// such key (while a slot migrates, the source answers `ASK` for a key it no longer has).
fn hash_fields(cluster: &RedisCluster, node: usize, key: &str) -> Result<Vec<String>, String> {
    let reply = cluster
        .node(node)
        .command(&["HKEYS", key])
        .map_err(|e| e.to_string())?;
    let mut fields: Vec<String> = reply
        .as_array()
        .unwrap_or_default()
        .iter()
        .filter_map(|f| f.as_str())
        .collect();
    fields.sort();
    if fields.is_empty() {
        return Err("no such key".into());
    }
    Ok(fields)
}

/// The members of the zset `key` at `node`: none when the node has no such key (or answers
/// `ASK` for it: gone from a migrating slot's source).
fn zset_members(cluster: &RedisCluster, node: usize, key: &str) -> Vec<String> {
    cluster
        .node(node)
        .command(&["ZRANGE", key, "0", "-1"])
        .ok()
        .and_then(|v| {
            v.as_array()
                .map(|members| members.iter().filter_map(|m| m.as_str()).collect())
        })
        .unwrap_or_default()
}

/// How many commands `node` has answered with an `ERR` reply: a script that Redis stopped
/// half-way counts one ("ERR Script attempted to access a non local key in a cluster node").
fn err_replies(cluster: &RedisCluster, node: usize) -> u64 {
    let stats = cluster.node(node).info("errorstats").unwrap_or_default();
    stats
        .lines()
        .find_map(|l| l.strip_prefix("errorstat_ERR:count="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// The scripts the cluster's clients run (sharded pub/sub where the servers have it), for a
/// test that drives a waiter itself and must be heard by the library's waiters.
fn cluster_scripts(cluster: &RedisCluster) -> Arc<Scripts> {
    Scripts::for_protocol(Protocol {
        sharded: cluster.node(0).has_command("SPUBLISH").unwrap(),
        ..Protocol::default()
    })
}

/// One try of a fair waiter that the test drives itself (`owner`, over `client`'s connection),
/// as the waiting engine sends it: it takes a grant the line made to it, or keeps (or takes)
/// its place in line with an entry that lives 30 s.
async fn fair_try(
    client: &LockClient,
    scripts: &Scripts,
    keys: &LockKeys,
    owner: &Owner,
) -> leasehold::Result<Acquire> {
    let life = Lease::new(Duration::from_secs(30)).unwrap();
    let mode = AcquireMode::Waiter {
        entry_life: life,
        non_reentrant: false,
        fixed_lease: false,
    };
    commands::acquire(client.redis(), scripts, keys, owner, life, mode).await
}

/// After a slot moved, the first command of a client to it meets `MOVED`: it should be
/// redirected. Here the holder's lease is long (no renewal in between), so its release is that
/// first command.
///
/// Guards against a regression: the library builds fred with `max_command_attempts: 1` (no
/// resend after a reconnect), and fred counts a redirection as an attempt, so left to fred the
/// release fails with `Connection("Too many failed write attempts.")`, and a renewal meeting
/// `MOVED` fails the same way (`watchdog_stats().errors` goes up by one after every migration
/// and failover). The library resends a redirected command itself (`resend_not_run`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_meeting_moved_is_redirected() {
    let cluster = start_cluster_with_scripts();
    let a = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let lock = a.lock("moved").unwrap();
    let (slot, to) = slot_and_target(&cluster, &a, "moved");
    let guard = lock.try_lock().await.unwrap().expect("free");
    let moved = {
        let cluster = cluster.clone();
        blocking(move || cluster.migrate_slot(slot, to)).await
    }
    .unwrap();
    assert!(moved >= 1);
    let released = guard.unlock().await;
    let after = lock.is_locked().await;
    eprintln!("release meeting MOVED: {released:?}; is_locked after: {after:?}");
    released.expect("the release follows MOVED");
    assert!(!after.unwrap());
}

/// While a slot migrates, a command for a key already moved meets `ASK` at the source. The
/// library does not follow `ASK` (see `leasehold_core::scripts::resend_not_run`: fred 10.1 sends
/// the command back to the old owner after `ASKING`, and a lock's multi-key scripts would meet
/// `TRYAGAIN` at the importing node anyway): the command waits for the migration to end and
/// then follows `MOVED`. The client survives.
///
/// Guards against a regression: left to fred's own redirection, the command fails with
/// `Connection(Routing: "Max attempts reached.")` and fred's clustered client stops for good (its
/// router task ends): the release after the migration, and any other lock of that client, fail
/// with `LockError::Timeout`, on every run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_meeting_ask_waits_for_the_migration_and_the_client_survives() {
    let cluster = start_cluster_with_scripts();
    let a = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let lock = a.lock("asked").unwrap();
    let (slot, to) = slot_and_target(&cluster, &a, "asked");
    let guard = lock.try_lock().await.unwrap().expect("free");
    let migration = cluster.begin_slot_migration(slot, to).unwrap();
    assert!(migration.move_keys().unwrap() >= 1);
    // Commands on the slot now meet ASK: a read, and a state change of another owner.
    let during = tokio::spawn({
        let lock = lock.clone();
        async move { lock.is_locked().await }
    });
    let contender = tokio::spawn({
        let lock = a.lock("asked").unwrap();
        async move { lock.try_lock().await.map(|g| g.is_some()) }
    });
    // Both met the migration at the source (ASK, or TRYAGAIN for a script whose keys are
    // split) and are still resending when it ends: they cannot finish before.
    let source = cluster.owner_of_slot(slot).unwrap();
    let redirected = || {
        let stats = cluster.node(source).info("errorstats").unwrap_or_default();
        ["errorstat_ASK:count=", "errorstat_TRYAGAIN:count="]
            .iter()
            .filter_map(|prefix| {
                stats
                    .lines()
                    .find_map(|l| l.strip_prefix(prefix))
                    .and_then(|n| n.trim().parse::<u64>().ok())
            })
            .sum::<u64>()
    };
    assert!(
        eventually(Duration::from_secs(10), || redirected() >= 2).await,
        "both commands met the migration: {}",
        redirected()
    );
    assert!(!during.is_finished() && !contender.is_finished());
    migration.finish().unwrap();
    let during = within(
        Duration::from_secs(5),
        "the read after the migration",
        during,
    )
    .await
    .unwrap();
    let contended = within(
        Duration::from_secs(5),
        "the try after the migration",
        contender,
    )
    .await
    .unwrap();
    let released = guard.unlock().await;
    let other = a.lock("elsewhere").unwrap();
    let alive = other.try_lock().await.map(|g| g.is_some());
    eprintln!(
        "is_locked meeting ASK: {during:?}; a try meeting ASK: {contended:?}; release after: \
         {released:?}; another lock: {alive:?}"
    );
    assert!(during.expect("is_locked waits out ASK"));
    assert!(
        !contended.expect("the try waits out ASK"),
        "the lock was held"
    );
    released.expect("release after the migration");
    assert!(alive.expect("the client still works"));
    assert!(!lock.is_locked().await.unwrap());
}

/// Every name works on a fresh cluster, wherever its slot is, with no script loaded by hand.
///
/// Guards against a regression: fred's `script_load` reaches one node only, so with it a lock
/// whose slot is on another primary fails with NOSCRIPT, at once and on every retry, whether the
/// preload or the reload after NOSCRIPT used it. Both load on every primary
/// (`script_load_cluster`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_run_on_every_primary_without_help() {
    let cluster = start_cluster();
    let a = cluster_client(&cluster).await;
    let names = names_on_every_primary(&cluster, &a, "bare");
    let mut failures = Vec::new();
    for name in &names {
        let lock = a.lock(name).unwrap();
        let owner = cluster.owner_of_slot(lock.keys().slot()).unwrap();
        match lock.try_lock().await {
            Ok(guard) => guard.expect("free").unlock().await.unwrap(),
            Err(e) => failures.push(format!(
                "{name} (slot {}, node {}): {e}",
                lock.keys().slot(),
                cluster.node(owner).port()
            )),
        };
    }
    let loaded: Vec<_> = cluster
        .nodes()
        .iter()
        .map(|n| (n.port(), n.command_calls("script|load").unwrap()))
        .collect();
    assert!(
        failures.is_empty(),
        "{failures:#?}\nSCRIPT LOAD calls per node: {loaded:?}"
    );
}

/// Waiters subscribe on a multi-node cluster over RESP2 (fred's default): every wait below
/// times out with `Ok(None)`.
///
/// Guards against a regression: the library confirms each SUBSCRIBE with a PING on the
/// subscriber client, and fred's clustered subscriber can send the PING to another node than the
/// SUBSCRIBE, whose connection has no subscription, so the reply is bare (not an array). Read as
/// a refused SUBSCRIBE, that reply refuses a waiter's subscription as
/// `PermissionDenied("NOPERM SUBSCRIBE was refused ...")` although no ACL is set, so on a cluster
/// the shape is not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_subscribe_on_a_multi_node_cluster_over_resp2() {
    let cluster = start_cluster_with_scripts();
    let a = cluster_client(&cluster).await;
    let mut outcomes = Vec::new();
    // A few fresh waiting clients, each with waiters on names on all three primaries at once.
    for round in 0..3 {
        let b = cluster_client_over(&cluster, RespVersion::RESP2).await;
        let names = names_on_every_primary(&cluster, &a, &format!("sub{round}"));
        let mut guards = Vec::new();
        let mut waits = Vec::new();
        for name in &names {
            guards.push(
                a.lock(name)
                    .unwrap()
                    .try_lock()
                    .await
                    .unwrap()
                    .expect("free")
                    .detach(),
            );
            let lock = b.lock(name).unwrap();
            waits.push(tokio::spawn(async move {
                lock.try_lock_for(Duration::from_millis(300))
                    .await
                    .map(|g| g.is_some())
            }));
        }
        for (name, wait) in names.into_iter().zip(waits) {
            outcomes.push((name, wait.await.unwrap()));
        }
        for guard in guards {
            guard.unlock().await.unwrap();
        }
    }
    let refused: Vec<_> = outcomes.iter().filter(|(_, w)| w.is_err()).collect();
    assert!(
        refused.is_empty(),
        "{} of {} waits failed: {refused:#?}",
        refused.len(),
        outcomes.len()
    );
}

/// Lock, wait (woken by the release), watchdog renewal past several leases and release, for
/// names on all three primaries; then every other kind once on the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_on_three_primaries() {
    let started = Instant::now();
    let cluster = start_cluster_with_scripts();
    let a = cluster_client(&cluster).await;
    let b = cluster_client(&cluster).await;
    let names = names_on_every_primary(&cluster, &a, "spread");
    let owners: BTreeSet<usize> = names
        .iter()
        .map(|n| {
            cluster
                .owner_of_slot(a.lock(n).unwrap().keys().slot())
                .unwrap()
        })
        .collect();
    assert_eq!(owners.len(), 3, "the names land on three primaries");

    let locks: Vec<_> = names.iter().map(|n| a.lock(n).unwrap()).collect();
    let mut guards = Vec::new();
    for lock in &locks {
        guards.push(lock.try_lock().await.unwrap().expect("free"));
    }
    let mut waits = Vec::new();
    for name in &names {
        let lock = b.lock(name).unwrap();
        waits.push(tokio::spawn(async move {
            let asked = Instant::now();
            let guard = lock.try_lock_for(Duration::from_secs(20)).await;
            guard.map(|g| g.map(|g| (g.detach(), asked.elapsed())))
        }));
    }
    assert!(
        eventually(Duration::from_secs(10), || b.waiters() == names.len()).await,
        "the waiters queued"
    );
    // Held past several leases: renewed by the watchdog on every primary.
    let renewed = a.watchdog_stats().renewed;
    tokio::time::sleep(LEASE * 4).await;
    let stats = a.watchdog_stats();
    assert!(
        stats.renewed >= renewed + 3 * names.len() as u64,
        "renewals: {stats:?}"
    );
    assert_eq!(stats.lost, 0, "{stats:?}");
    assert!(guards.iter().all(|g| g.is_held()));
    for lock in &locks {
        assert!(lock.is_locked().await.unwrap());
    }
    let released = Instant::now();
    for guard in guards.drain(..) {
        guard.unlock().await.unwrap();
    }
    for wait in waits {
        let (guard, _) = wait.await.unwrap().unwrap().expect("woken by the release");
        // Woken by the release message, not by a lease running out (600 ms).
        assert!(
            released.elapsed() < LEASE,
            "handed over in {:?}",
            released.elapsed()
        );
        guard.unlock().await.unwrap();
    }
    for lock in &locks {
        assert!(!lock.is_locked().await.unwrap());
    }

    // Every kind once, each on another primary.
    let kinds = names_on_every_primary(&cluster, &a, "kind");
    let fair = a.fair_lock(&kinds[0]).unwrap();
    let held = fair.try_lock().await.unwrap().expect("free");
    let fair_waiter = {
        let fair = b.fair_lock(&kinds[0]).unwrap();
        tokio::spawn(async move {
            fair.try_lock_for(Duration::from_secs(20))
                .await
                .map(|g| g.map(|g| g.detach()))
        })
    };
    assert!(eventually(Duration::from_secs(10), || b.waiters() == 1).await);
    held.unlock().await.unwrap();
    let handed = fair_waiter.await.unwrap().unwrap().expect("fair hand-over");
    handed.unlock().await.unwrap();

    let rw = a.rw_lock(&kinds[1]).unwrap();
    let read = rw.read().try_lock().await.unwrap().expect("free");
    let writer = {
        let rw = b.rw_lock(&kinds[1]).unwrap();
        tokio::spawn(async move {
            rw.write()
                .try_lock_for(Duration::from_secs(20))
                .await
                .map(|g| g.map(|g| g.detach()))
        })
    };
    assert!(eventually(Duration::from_secs(10), || b.waiters() == 1).await);
    tokio::time::sleep(LEASE * 2).await;
    assert!(read.is_held(), "the read side is renewed");
    read.unlock().await.unwrap();
    writer
        .await
        .unwrap()
        .unwrap()
        .expect("the writer gets it")
        .unlock()
        .await
        .unwrap();

    let semaphore = a.semaphore(&kinds[2]).unwrap();
    assert!(semaphore.try_set_permits(1).await.unwrap());
    let permit = semaphore.acquire(1).await.unwrap();
    let permit_waiter = {
        let semaphore = b.semaphore(&kinds[2]).unwrap();
        tokio::spawn(async move { semaphore.try_acquire_for(1, Duration::from_secs(20)).await })
    };
    assert!(eventually(Duration::from_secs(10), || b.waiters() == 1).await);
    permit.release().await.unwrap();
    permit_waiter
        .await
        .unwrap()
        .unwrap()
        .expect("a permit")
        .release()
        .await
        .unwrap();
    assert!(semaphore.delete().await.unwrap());

    let latch = a.latch(&kinds[0]).unwrap();
    assert!(latch.try_set_count(2).await.unwrap());
    let latch_waiter = {
        let latch = b.latch(&kinds[0]).unwrap();
        tokio::spawn(async move { latch.wait_for(Duration::from_secs(20)).await })
    };
    assert_eq!(latch.count_down().await.unwrap(), 1);
    assert_eq!(latch.count_down().await.unwrap(), 0);
    assert!(latch_waiter.await.unwrap().unwrap(), "the latch opened");
    eprintln!("every_kind_on_three_primaries: {:?}", started.elapsed());
}

/// A slot moves to another primary while a lock in it is held and another client waits on it.
/// The migration dwells half-done for two leases, then the keys move and the slot is on the
/// target (`MOVED`): renewals and the release keep working, the waiter gets it.
///
/// No renewal fails: one landing between the `MIGRATE` and the `SETSLOT NODE` meets `ASK` and
/// is resent until the slot has moved; one after it meets `MOVED` and is resent to the new owner.
///
/// Guards against a regression that showed in about 1 run in 5: a renewal meeting `ASK` stopping
/// fred's client for good (see
/// `a_command_meeting_ask_waits_for_the_migration_and_the_client_survives`), and one meeting
/// `MOVED` failing (`errors: 1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_migration_while_held_and_waited() {
    let started = Instant::now();
    let cluster = start_cluster_with_scripts();
    let a = cluster_client(&cluster).await;
    let b = cluster_client(&cluster).await;
    let name = "moving";
    let slot = a.lock(name).unwrap().keys().slot();
    let from = cluster.owner_of_slot(slot).unwrap();
    let to = *cluster
        .primaries()
        .unwrap()
        .iter()
        .find(|&&p| p != from)
        .unwrap();

    let lock = a.lock(name).unwrap();
    let guard = lock.try_lock().await.unwrap().expect("free");
    let waiter = {
        let lock = b.lock(name).unwrap();
        tokio::spawn(async move {
            lock.try_lock_for(Duration::from_secs(30))
                .await
                .map(|g| g.map(|g| g.detach()))
        })
    };
    assert!(eventually(Duration::from_secs(10), || b.waiters() == 1).await);
    let before = a.watchdog_stats();
    let moved = {
        let cluster = cluster.clone();
        blocking(move || cluster.migrate_slot_with(slot, to, LEASE * 2)).await
    }
    .unwrap_or_else(|e| panic!("migrating slot {slot}: {e}"));
    eprintln!(
        "slot {slot} moved from node {} to {} with {moved} keys",
        cluster.node(from).port(),
        cluster.node(to).port()
    );
    assert!(moved >= 1, "the lock's keys moved with the slot");
    assert_eq!(cluster.owner_of_slot(slot).unwrap(), to);
    // Renewed past several leases after the move, against the new owner.
    let after_move = a.watchdog_stats();
    let hash = lock.keys().hash().to_string();
    for _ in 0..9 {
        tokio::time::sleep(LEASE / 3).await;
        eprintln!(
            "held {} valid for {:?}, PTTL at the target {:?}, watchdog {:?}",
            guard.is_held(),
            guard
                .valid_until()
                .saturating_duration_since(tokio::time::Instant::now()),
            cluster.node(to).command(&["PTTL", &hash]).unwrap(),
            a.watchdog_stats()
        );
    }
    let stats = a.watchdog_stats();
    eprintln!("watchdog before {before:?}, after the move {after_move:?}, now {stats:?}");
    assert!(
        guard.is_held(),
        "the hold survived the migration: {stats:?}"
    );
    assert_eq!(stats.lost, 0, "{stats:?}");
    assert_eq!(stats.errors, before.errors, "no renewal failed: {stats:?}");
    assert!(stats.renewed >= after_move.renewed + 2, "{stats:?}");
    assert_eq!(
        cluster
            .node(to)
            .command(&["EXISTS", &hash])
            .unwrap()
            .as_int(),
        Some(1),
        "the hold lives on the new owner"
    );
    guard.unlock().await.expect("release after the move");
    let handed = within(Duration::from_secs(5), "the hand-over", waiter)
        .await
        .unwrap()
        .unwrap()
        .expect("the waiter gets the lock");
    handed.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    eprintln!(
        "slot_migration_while_held_and_waited: {:?}",
        started.elapsed()
    );
}

/// A primary fails over (`CLUSTER FAILOVER` on its replica) while a lock on it is held and
/// waited on. Replication is asynchronous, so whether the hold survives is not guaranteed
/// (a coordinated failover waits for the replica to catch up, so it usually does): the test
/// prints what happened and asserts only progress: the waiter gets the lock (on the release
/// or once the lease runs out), and new locks on the promoted primary work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_failover_while_held_and_waited() {
    let started = Instant::now();
    let cluster = start_cluster_with_scripts();
    let a = cluster_client(&cluster).await;
    let b = cluster_client(&cluster).await;
    let name = "failing";
    let slot = a.lock(name).unwrap().keys().slot();
    let primary = cluster.owner_of_slot(slot).unwrap();

    let lock = a.lock(name).unwrap();
    let guard = lock.try_lock().await.unwrap().expect("free");
    let waiter = {
        let lock = b.lock(name).unwrap();
        tokio::spawn(async move {
            let guard = lock.try_lock_for(Duration::from_secs(30)).await;
            guard.map(|g| g.map(|g| g.detach()))
        })
    };
    assert!(eventually(Duration::from_secs(10), || b.waiters() == 1).await);
    let promoted = {
        let cluster = cluster.clone();
        blocking(move || cluster.failover(primary)).await
    }
    .unwrap_or_else(|e| panic!("failing over: {e}"));
    assert_eq!(cluster.owner_of_slot(slot).unwrap(), promoted);
    // Let the watchdog renew a few times against the new primary.
    tokio::time::sleep(LEASE * 3).await;
    let stats = a.watchdog_stats();
    let survived = guard.is_held();
    eprintln!(
        "failover {} -> {}: hold survived: {survived}, watchdog {stats:?}",
        cluster.node(primary).port(),
        cluster.node(promoted).port()
    );
    let released = guard.unlock().await;
    eprintln!("release after the failover: {released:?}");
    let handed = within(
        Duration::from_secs(10),
        "the waiter after the failover",
        waiter,
    )
    .await
    .unwrap()
    .unwrap()
    .expect("the waiter gets the lock");
    handed.unlock().await.unwrap();
    // New locks and waits on the promoted primary.
    let again = lock.try_lock().await.unwrap().expect("free again");
    let second = {
        let lock = b.lock(name).unwrap();
        tokio::spawn(async move {
            lock.try_lock_for(Duration::from_secs(10))
                .await
                .map(|g| g.map(|g| g.detach()))
        })
    };
    assert!(eventually(Duration::from_secs(10), || b.waiters() == 1).await);
    again.unlock().await.unwrap();
    within(Duration::from_secs(5), "the second hand-over", second)
        .await
        .unwrap()
        .unwrap()
        .expect("handed over")
        .unlock()
        .await
        .unwrap();
    eprintln!(
        "primary_failover_while_held_and_waited: {:?}",
        started.elapsed()
    );
}

/// Through Sentinel: lock and wait, kill the primary, and once the Sentinels name a new one a
/// new lock is acquired and a waiter makes progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_keeps_locks_usable() {
    let started = Instant::now();
    let set = Arc::new(blocking(|| SentinelSet::start().unwrap_or_else(|e| panic!("{e}"))).await);
    eprintln!("sentinel set up in {:?}", started.elapsed());
    // The holder's lease outlasts the failover (a few seconds), so its hold can survive if it
    // was replicated before the kill; the waiter's is short.
    let a = sentinel_client(&set, Duration::from_secs(6)).await;
    let b = sentinel_client(&set, LEASE).await;
    let lock = a.lock("watched").unwrap();
    let guard = lock.try_lock().await.unwrap().expect("free");
    let waiter = {
        let lock = b.lock("watched").unwrap();
        tokio::spawn(async move {
            lock.try_lock_for(Duration::from_secs(30))
                .await
                .map(|g| g.map(|g| g.detach()))
        })
    };
    assert!(eventually(Duration::from_secs(10), || b.waiters() == 1).await);
    let old = set.primary().unwrap();
    let killed = Instant::now();
    let new = {
        let set = set.clone();
        blocking(move || set.kill_primary_and_wait()).await
    }
    .unwrap_or_else(|e| panic!("sentinel failover: {e}"));
    eprintln!(
        "primary {} -> {} in {:?}",
        set.servers()[old].port(),
        set.servers()[new].port(),
        killed.elapsed()
    );
    assert_ne!(old, new);
    // The waiter makes progress: the old hold is either renewed on the new primary and released
    // below, or was lost with the primary (then the waiter takes the free lock).
    tokio::time::sleep(LEASE * 2).await;
    let survived = guard.is_held();
    let released = guard.unlock().await;
    eprintln!(
        "hold survived: {survived}, release: {released:?}, watchdog {:?}",
        a.watchdog_stats()
    );
    let handed = within(
        Duration::from_secs(15),
        "the waiter after the failover",
        waiter,
    )
    .await
    .unwrap()
    .unwrap()
    .expect("the waiter gets the lock");
    handed.unlock().await.unwrap();
    // A new lock on the new primary, and a waiter woken by its release.
    let fresh = a.lock("after-failover").unwrap();
    let held = within(Duration::from_secs(10), "a new lock", fresh.lock())
        .await
        .expect("a new lock after the failover");
    let second = {
        let lock = b.lock("after-failover").unwrap();
        tokio::spawn(async move {
            lock.try_lock_for(Duration::from_secs(10))
                .await
                .map(|g| g.map(|g| g.detach()))
        })
    };
    assert!(eventually(Duration::from_secs(10), || b.waiters() == 1).await);
    held.unlock().await.unwrap();
    within(Duration::from_secs(5), "the hand-over", second)
        .await
        .unwrap()
        .unwrap()
        .expect("handed over")
        .unlock()
        .await
        .unwrap();
    let key = fresh.keys().hash().to_string();
    assert!(
        set.servers()[new]
            .command(&["EXISTS", &key])
            .unwrap()
            .as_int()
            == Some(0),
        "released on the new primary"
    );
    eprintln!(
        "sentinel_failover_keeps_locks_usable: {:?}",
        started.elapsed()
    );
}

/// On Redis Cluster 7 release messages go over sharded pub/sub: the scripts `SPUBLISH` (no
/// `PUBLISH` reaches any node, so no message crosses the whole cluster bus) and waiters
/// `SSUBSCRIBE` at the lock's shard. When the lock's slot moves while a waiter sleeps, Redis
/// drops the waiter's shard subscription at the old owner; the subscriber notices within
/// `SHARD_CHECK`, subscribes at the new owner, and the waiter hears the release: it gets the
/// lock at once, not when the holder's 30 s lease would have run out.
///
/// On a server without sharded pub/sub (Redis 6.2) the client publishes with `PUBLISH`, which
/// reaches every node: the waiter hears the release after the move as well, and no shard
/// subscription is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_release_messages_follow_a_moved_slot() {
    let cluster = start_cluster_with_scripts();
    let sharded = cluster.node(0).has_command("SPUBLISH").unwrap();
    eprintln!("SPUBLISH present: {sharded}");
    let a = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let b = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let name = "sharded";
    let lock = a.lock(name).unwrap();
    // The waiter's grant comes on its client's channel.
    let channel = format!("{}:{}", lock.keys().released(), b.id());
    let (slot, to) = slot_and_target(&cluster, &a, name);
    let from = cluster.owner_of_slot(slot).unwrap();
    // PUBSUB SHARDNUMSUB answers [channel, count].
    let shard_subscribers = |node: usize| {
        let reply = cluster
            .node(node)
            .command(&["PUBSUB", "SHARDNUMSUB", &channel])
            .unwrap();
        reply
            .as_array()
            .and_then(|parts| parts.get(1))
            .and_then(|count| count.as_int())
            .unwrap_or(0)
    };
    let guard = lock.try_lock().await.unwrap().expect("free");
    let waiter = {
        let lock = b.lock(name).unwrap();
        tokio::spawn(async move {
            let started = Instant::now();
            let got = lock.try_lock_for(Duration::from_secs(60)).await;
            (got.map(|g| g.map(|g| g.detach())), started.elapsed())
        })
    };
    assert!(eventually(Duration::from_secs(10), || b.waiters() == 1).await);
    assert!(
        !sharded || eventually(Duration::from_secs(10), || shard_subscribers(from) == 1).await,
        "the waiter subscribed at the lock's shard: {}",
        shard_subscribers(from)
    );
    let moved = {
        let cluster = cluster.clone();
        blocking(move || cluster.migrate_slot(slot, to)).await
    }
    .unwrap();
    assert!(moved >= 1);
    // The subscription follows the slot (within SHARD_CHECK, plus a resync).
    assert!(
        !sharded || eventually(Duration::from_secs(10), || shard_subscribers(to) == 1).await,
        "the waiter subscribed again at the new owner: {}",
        shard_subscribers(to)
    );
    let released_at = Instant::now();
    guard.unlock().await.unwrap();
    let (got, waited) = within(Duration::from_secs(20), "the waiter", waiter)
        .await
        .unwrap();
    let handed = got.unwrap().expect("the waiter gets the lock");
    let after_release = released_at.elapsed();
    eprintln!("waited {waited:?} in all, {after_release:?} after the release");
    assert!(
        after_release < Duration::from_secs(10),
        "woken by the release, not by the 30 s lease: {after_release:?}"
    );
    handed.unlock().await.unwrap();
    // Every message was sharded (or, without SPUBLISH, plain).
    let (mut publish, mut spublish) = (0, 0);
    for node in 0..cluster.nodes().len() {
        let server = cluster.node(node);
        if !server.is_running() {
            continue;
        }
        let plain = server.command_calls("publish").unwrap();
        assert!(!sharded || plain == 0, "node {node} PUBLISHed {plain}");
        publish += plain;
        spublish += server.command_calls("spublish").unwrap();
    }
    if sharded {
        assert!(spublish >= 1, "the releases used SPUBLISH");
    } else {
        assert!(publish >= 1 && spublish == 0, "the releases used PUBLISH");
    }
}

/// A release with a waiter in line while the lock's slot is migrating (its keys still at the
/// source): the release script runs whole. It grants the lock to the waiter.
///
/// Failed before (found by the chaos checker's cluster mode): the script deleted the lock's key
/// and wrote the turn into it again; in a migrating slot Redis stopped it half-way ("ERR Script
/// attempted to access a non local key in a cluster node"), the release reported as a
/// permanent `LockError::Redis`, the waiter's turn never reserved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_with_a_waiter_runs_whole_while_its_slot_migrates() {
    let cluster = start_cluster_with_scripts();
    let a = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let b = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let name = "migrating-release";
    let lock = a.lock(name).unwrap();
    let (slot, to) = slot_and_target(&cluster, &a, name);
    let from = cluster.owner_of_slot(slot).unwrap();
    let guard = lock.try_lock().await.unwrap().expect("free");
    let waiter = {
        let lock = b.lock(name).unwrap();
        tokio::spawn(async move {
            lock.try_lock_for(Duration::from_secs(60))
                .await
                .map(|g| g.map(|g| g.detach()))
        })
    };
    let line = lock.keys().waiters();
    assert!(
        eventually(Duration::from_secs(10), || cluster
            .node(from)
            .command(&["EXISTS", &line])
            .unwrap()
            .as_int()
            == Some(1))
        .await,
        "the waiter is in line"
    );
    // MIGRATING / IMPORTING, no key moved yet: every key of the release is local.
    let migration = cluster.begin_slot_migration(slot, to).unwrap();
    let released = guard.unlock().await;
    let hash = lock.keys().hash().to_string();
    let fields = cluster.node(from).command(&["HKEYS", &hash]).map_or_else(
        |e| e.to_string(),
        |v| {
            let names: Vec<String> = v
                .as_array()
                .unwrap_or_default()
                .iter()
                .filter_map(|f| f.as_str())
                .collect();
            names.join(",")
        },
    );
    eprintln!("release during the migration: {released:?}; the lock's fields now {fields:?}");
    released.expect("the release ran whole");
    assert!(
        fields.contains("~granted") || !fields.contains("~fence"),
        "the lock is granted to the waiter (or the waiter took it already): {fields:?}"
    );
    migration.finish().unwrap();
    let handed = within(Duration::from_secs(20), "the hand-over", waiter)
        .await
        .unwrap()
        .unwrap()
        .expect("the waiter gets the lock");
    handed.unlock().await.unwrap();
}

/// `unlock_after` with a waiter in line while the lock's slot is migrating (its keys still at
/// the source): the release-after script runs whole (the hash keeps its token field, so taking
/// the owner's field out never empties a key the script then writes). The lock runs out after
/// its tail and the waiter gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlock_after_with_a_waiter_runs_whole_while_its_slot_migrates() {
    let cluster = start_cluster_with_scripts();
    let a = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let b = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let name = "migrating-release-after";
    let lock = a.lock(name).unwrap();
    let (slot, to) = slot_and_target(&cluster, &a, name);
    let from = cluster.owner_of_slot(slot).unwrap();
    let guard = lock.try_lock().await.unwrap().expect("free");
    let waiter = {
        let lock = b.lock(name).unwrap();
        tokio::spawn(async move {
            lock.try_lock_for(Duration::from_secs(60))
                .await
                .map(|g| g.map(|g| g.detach()))
        })
    };
    let line = lock.keys().waiters();
    assert!(
        eventually(Duration::from_secs(10), || cluster
            .node(from)
            .command(&["EXISTS", &line])
            .unwrap()
            .as_int()
            == Some(1))
        .await,
        "the waiter is in line"
    );
    let migration = cluster.begin_slot_migration(slot, to).unwrap();
    let ended = guard.unlock_after(Duration::from_millis(500)).await;
    let hash = lock.keys().hash().to_string();
    let fields = cluster.node(from).command(&["HKEYS", &hash]).map_or_else(
        |e| e.to_string(),
        |v| {
            let names: Vec<String> = v
                .as_array()
                .unwrap_or_default()
                .iter()
                .filter_map(|f| f.as_str())
                .collect();
            names.join(",")
        },
    );
    eprintln!("unlock_after during the migration: {ended:?}; the lock's fields now {fields:?}");
    ended.expect("the release-after ran whole");
    assert!(
        fields.contains("~expiring") || !fields.contains("~fence"),
        "the lock runs out by itself (or has already, and the waiter took it): {fields:?}"
    );
    migration.finish().unwrap();
    let handed = within(Duration::from_secs(20), "the lock after its tail", waiter)
        .await
        .unwrap()
        .unwrap()
        .expect("the waiter gets the lock");
    handed.unlock().await.unwrap();
}

/// A fair lock's release with a waiter in line while the lock's slot is migrating (its keys
/// still at the source): the release script runs whole and grants the lock to the waiter.
///
/// Failed before: the script deleted the lock's key and then wrote the waiter's turn into it;
/// Redis stopped it half-way ("non local key"): the release failed, the lock deleted and the
/// waiter never told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_release_with_a_waiter_runs_whole_while_its_slot_migrates() {
    let cluster = start_cluster_with_scripts();
    let a = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let b = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let name = "migrating-fair-release";
    let lock = a.fair_lock(name).unwrap();
    let (slot, to) = slot_and_target(&cluster, &a, name);
    let from = cluster.owner_of_slot(slot).unwrap();
    let guard = lock.try_lock().await.unwrap().expect("free");
    let waiter = {
        let lock = b.fair_lock(name).unwrap();
        tokio::spawn(async move {
            lock.try_lock_for(Duration::from_secs(60))
                .await
                .map(|g| g.map(|g| g.detach()))
        })
    };
    let line = lock.keys().waiters();
    assert!(
        eventually(Duration::from_secs(10), || zset_members(
            &cluster, from, &line
        )
        .len()
            == 1)
        .await,
        "the waiter is in line"
    );
    let errors = err_replies(&cluster, from);
    // MIGRATING / IMPORTING, no key moved yet: every key of the release is local.
    let migration = cluster.begin_slot_migration(slot, to).unwrap();
    let released = guard.unlock().await;
    let fields = hash_fields(&cluster, from, lock.keys().hash());
    eprintln!(
        "fair release during the migration: {released:?}; the lock's fields now {fields:?}; \
         {} script(s) stopped",
        err_replies(&cluster, from) - errors
    );
    released.expect("the release ran whole");
    // Granted to the waiter (taken by it already, or not yet).
    let fields = fields.expect("the lock is handed on, not deleted");
    assert!(fields.iter().any(|f| f == "~fence"), "{fields:?}");
    migration.finish().unwrap();
    let handed = within(Duration::from_secs(20), "the hand-over", waiter)
        .await
        .unwrap()
        .unwrap()
        .expect("the waiter gets the lock");
    handed.unlock().await.unwrap();
    assert_eq!(
        err_replies(&cluster, from),
        errors,
        "no script stopped half-way at the source"
    );
}

/// A fair waiter takes the grant a release made to it while the lock's slot is migrating (its
/// message was lost: its try takes the grant): the try runs whole and is granted, the line's
/// grant replaced by its own.
///
/// The waiter is driven by the test (core's typed acquire, as the waiting engine sends it), so
/// that the line's grant is made before the migration begins and taken by a try during it: a
/// waiter of the library takes a grant the moment it hears of it.
///
/// Failed before (when a release reserved the lock for the waiter's turn): the grant deleted
/// the lock's key and then wrote the hold into it; Redis stopped the script half-way ("non
/// local key"): the try failed, with the waiter's entry already out of the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_takes_its_grant_by_a_try_while_its_slot_migrates() {
    let cluster = start_cluster_with_scripts();
    let a = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let b = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let scripts = cluster_scripts(&cluster);
    let name = "migrating-fair-turn";
    let lock = a.fair_lock(name).unwrap();
    let keys = lock.keys().clone();
    let (slot, to) = slot_and_target(&cluster, &a, name);
    let from = cluster.owner_of_slot(slot).unwrap();
    let guard = lock.try_lock().await.unwrap().expect("free");
    let waiter = b.new_owner();
    let queued = fair_try(&b, &scripts, &keys, &waiter).await.unwrap();
    assert!(matches!(queued, Acquire::Held { .. }), "{queued:?}");
    // A second waiter behind it keeps the line's keys at the source: a script naming a key
    // that is absent there while the slot migrates is refused with TRYAGAIN before it runs
    // (and sent again after the migration), which is not what this test is about.
    let second = b.new_owner();
    let behind = fair_try(&b, &scripts, &keys, &second).await.unwrap();
    assert!(matches!(behind, Acquire::Held { .. }), "{behind:?}");
    guard.unlock().await.unwrap();
    let mut granted = vec![
        waiter.id().to_string(),
        "~fence".to_string(),
        "~granted".to_string(),
    ];
    granted.sort();
    assert_eq!(
        hash_fields(&cluster, from, keys.hash()),
        Ok(granted),
        "the release granted the lock to the waiter"
    );
    let errors = err_replies(&cluster, from);
    let migration = cluster.begin_slot_migration(slot, to).unwrap();
    let taken = fair_try(&b, &scripts, &keys, &waiter).await;
    let fields = hash_fields(&cluster, from, keys.hash());
    let stopped = err_replies(&cluster, from) - errors;
    eprintln!(
        "the turn taken during the migration: {taken:?}; the lock's fields now {fields:?}; \
         {stopped} script(s) stopped"
    );
    assert!(
        matches!(taken, Ok(Acquire::Granted { hold_count: 1, .. })),
        "the try ran whole and was granted: {taken:?}"
    );
    // The waiter's grant keeps its mark (a settle of this try would leave it).
    let mut held_by = vec![
        waiter.id().to_string(),
        "~fence".to_string(),
        "~granted".to_string(),
    ];
    held_by.sort();
    assert_eq!(
        fields,
        Ok(held_by),
        "the waiter's own grant replaced the line's"
    );
    assert_eq!(
        zset_members(&cluster, from, &keys.waiters()),
        vec![second.id().to_string()]
    );
    assert_eq!(stopped, 0);
    migration.finish().unwrap();
    let hold = HoldId::new(keys.clone(), waiter.clone());
    let released = commands::release(b.redis(), &scripts, &hold, None, ReleaseKind::Now, None)
        .await
        .unwrap();
    assert_eq!(released, Release::Released);
}

/// A fair waiter gives up after a release granted it the lock, before it heard of the grant,
/// while the lock's slot is migrating: the leave script runs whole, the waiter's entry goes and
/// the grant passes to the next waiter in line, who gets the lock.
///
/// The first waiter is driven by the test (core's typed calls, as the waiting engine sends
/// them): a waiter of the library takes a grant the moment it hears of it, so only such a
/// waiter holds a grant made before the migration and gives it up during it.
///
/// Failed before (with the reservation a release then made): the leave deleted the lock's key
/// and then wrote the next waiter's turn into it; Redis stopped the script half-way ("non local
/// key"): the lock was left free and the next waiter never told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_leaving_its_untaken_grant_hands_it_on_while_its_slot_migrates() {
    let cluster = start_cluster_with_scripts();
    let a = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let b = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let c = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let scripts = cluster_scripts(&cluster);
    let name = "migrating-fair-leave";
    let lock = a.fair_lock(name).unwrap();
    let keys = lock.keys().clone();
    let (slot, to) = slot_and_target(&cluster, &a, name);
    let from = cluster.owner_of_slot(slot).unwrap();
    let guard = lock.try_lock().await.unwrap().expect("free");
    let first = b.new_owner();
    let queued = fair_try(&b, &scripts, &keys, &first).await.unwrap();
    assert!(matches!(queued, Acquire::Held { .. }), "{queued:?}");
    let second = {
        let lock = c.fair_lock(name).unwrap();
        tokio::spawn(async move {
            lock.try_lock_for(Duration::from_secs(60))
                .await
                .map(|g| g.map(|g| g.detach()))
        })
    };
    let line = keys.waiters();
    assert!(
        eventually(Duration::from_secs(10), || zset_members(
            &cluster, from, &line
        )
        .len()
            == 2)
        .await,
        "both waiters are in line"
    );
    guard.unlock().await.unwrap();
    let granted = hash_fields(&cluster, from, keys.hash()).unwrap();
    assert!(
        granted.iter().any(|f| f == first.id()) && granted.iter().any(|f| f == "~granted"),
        "the release granted the lock to the first waiter: {granted:?}"
    );
    let errors = err_replies(&cluster, from);
    let migration = cluster.begin_slot_migration(slot, to).unwrap();
    let left = commands::leave_line(b.redis(), &scripts, &keys, &first, None, None).await;
    let fields = hash_fields(&cluster, from, keys.hash());
    let waiting = zset_members(&cluster, from, &line);
    eprintln!(
        "the leave during the migration: {left:?}; the lock's fields now {fields:?}; in line \
         {waiting:?}; {} script(s) stopped",
        err_replies(&cluster, from) - errors
    );
    left.expect("the leave ran whole");
    assert!(
        !waiting.iter().any(|w| w == first.id()),
        "the first waiter's entry is gone: {waiting:?}"
    );
    // Granted to the second waiter (taken by it already, or not yet).
    let fields = fields.expect("the lock is handed on, not left free");
    assert!(
        fields.iter().any(|f| f == "~fence") && !fields.iter().any(|f| f == first.id()),
        "{fields:?}"
    );
    migration.finish().unwrap();
    let handed = within(Duration::from_secs(20), "the second waiter", second)
        .await
        .unwrap()
        .unwrap()
        .expect("the second waiter gets the lock");
    handed.unlock().await.unwrap();
    assert_eq!(
        err_replies(&cluster, from),
        errors,
        "no script stopped half-way at the source"
    );
}

/// `force_unlock` of a fair lock, held and with a waiter in line, while its slot is migrating:
/// the script runs whole and hands the lock on to the waiter, who gets it.
///
/// Failed before: the script deleted the lock's key and then wrote the waiter's turn into it;
/// Redis stopped it half-way ("non local key"): the lock was removed and the waiter never told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_force_unlock_with_a_waiter_runs_whole_while_its_slot_migrates() {
    let cluster = start_cluster_with_scripts();
    let a = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let b = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let name = "migrating-fair-force";
    let fair = a.fair_lock(name).unwrap();
    let (slot, to) = slot_and_target(&cluster, &a, name);
    let from = cluster.owner_of_slot(slot).unwrap();
    let held = fair.try_lock().await.unwrap().expect("free").detach();
    let waiter = {
        let lock = b.fair_lock(name).unwrap();
        tokio::spawn(async move {
            lock.try_lock_for(Duration::from_secs(60))
                .await
                .map(|g| g.map(|g| g.detach()))
        })
    };
    let line = fair.keys().waiters();
    assert!(
        eventually(Duration::from_secs(10), || zset_members(
            &cluster, from, &line
        )
        .len()
            == 1)
        .await,
        "the waiter is in line"
    );
    let errors = err_replies(&cluster, from);
    let migration = cluster.begin_slot_migration(slot, to).unwrap();
    let forced = fair.force_unlock().await;
    let fields = hash_fields(&cluster, from, fair.keys().hash());
    eprintln!(
        "fair force unlock during the migration: {forced:?}; fields now {fields:?}; {} \
         script(s) stopped",
        err_replies(&cluster, from) - errors
    );
    assert!(forced.expect("the force unlock ran whole"));
    // Granted to the waiter (taken by it already, or not yet).
    let fields = fields.expect("the lock is handed on, not deleted");
    assert!(fields.iter().any(|f| f == "~fence"), "{fields:?}");
    migration.finish().unwrap();
    within(Duration::from_secs(20), "the waiter", waiter)
        .await
        .unwrap()
        .unwrap()
        .expect("the waiter gets the lock")
        .unlock()
        .await
        .unwrap();
    drop(held);
    assert_eq!(
        err_replies(&cluster, from),
        errors,
        "no script stopped half-way at the source"
    );
}

/// A read/write lock's last read hold is released with a writer in line while the lock's slot
/// is migrating: the release script runs whole and grants the lock to the writer (its grant
/// written before the released hold's lease goes, so the leases zset is never emptied and
/// written again); the writer has it.
///
/// Failed before: the release removed the last lease (its zset then gone) and read the leases
/// again; Redis stopped the script half-way ("non local key"): the release failed with the read
/// hold's fields gone but the hash left behind, and the writer was never told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_release_with_a_writer_waiting_runs_whole_while_its_slot_migrates() {
    let cluster = start_cluster_with_scripts();
    let a = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let b = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let name = "migrating-read-release";
    let rw = a.rw_lock(name).unwrap();
    let keys = rw.read().keys().clone();
    let (slot, to) = slot_and_target(&cluster, &a, name);
    let from = cluster.owner_of_slot(slot).unwrap();
    let read = rw.read().try_lock().await.unwrap().expect("free");
    let writer = {
        let rw = b.rw_lock(name).unwrap();
        tokio::spawn(async move {
            rw.write()
                .try_lock_for(Duration::from_secs(60))
                .await
                .map(|g| g.map(|g| g.detach()))
        })
    };
    let line = keys.waiters();
    assert!(
        eventually(Duration::from_secs(10), || zset_members(
            &cluster, from, &line
        )
        .len()
            == 1)
        .await,
        "the writer is in line"
    );
    let errors = err_replies(&cluster, from);
    let migration = cluster.begin_slot_migration(slot, to).unwrap();
    let released = read.unlock().await;
    let fields = hash_fields(&cluster, from, keys.hash());
    let leases = zset_members(&cluster, from, &keys.leases());
    eprintln!(
        "read release during the migration: {released:?}; fields now {fields:?}; leases \
         {leases:?}; {} script(s) stopped",
        err_replies(&cluster, from) - errors
    );
    released.expect("the release ran whole");
    let fields = fields.expect("the lock is granted, not deleted");
    assert!(
        fields.iter().any(|f| f == "~granted") && fields.iter().any(|f| f == "~writer"),
        "granted to the writer: {fields:?}"
    );
    assert_eq!(leases.len(), 1, "the writer's hold alone: {leases:?}");
    migration.finish().unwrap();
    within(Duration::from_secs(20), "the writer", writer)
        .await
        .unwrap()
        .unwrap()
        .expect("the writer gets the lock")
        .unlock()
        .await
        .unwrap();
    assert_eq!(
        err_replies(&cluster, from),
        errors,
        "no script stopped half-way"
    );
}

/// A read/write lock's write hold is released with readers in line while the lock's slot is
/// migrating: the release script runs whole and grants every reader its read hold; both have
/// it.
///
/// Failed before: as the read release (see
/// `a_read_release_with_a_writer_waiting_runs_whole_while_its_slot_migrates`): the script
/// stopped half-way after removing the last lease, leaving the hash behind with the writer's
/// mode, and no reader was told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_release_with_readers_waiting_runs_whole_while_its_slot_migrates() {
    let cluster = start_cluster_with_scripts();
    let a = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let b = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let name = "migrating-write-release";
    let rw = a.rw_lock(name).unwrap();
    let keys = rw.write().keys().clone();
    let (slot, to) = slot_and_target(&cluster, &a, name);
    let from = cluster.owner_of_slot(slot).unwrap();
    let write = rw.write().try_lock().await.unwrap().expect("free");
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let rw = b.rw_lock(name).unwrap().with_owner(b.new_owner());
            tokio::spawn(async move {
                rw.read()
                    .try_lock_for(Duration::from_secs(60))
                    .await
                    .map(|g| g.map(|g| g.detach()))
            })
        })
        .collect();
    let line = keys.waiters();
    assert!(
        eventually(Duration::from_secs(10), || zset_members(
            &cluster, from, &line
        )
        .len()
            == 2)
        .await,
        "the readers are in line"
    );
    let errors = err_replies(&cluster, from);
    let migration = cluster.begin_slot_migration(slot, to).unwrap();
    let released = write.unlock().await;
    let fields = hash_fields(&cluster, from, keys.hash());
    eprintln!(
        "write release during the migration: {released:?}; fields now {fields:?}; {} \
         script(s) stopped",
        err_replies(&cluster, from) - errors
    );
    released.expect("the release ran whole");
    let fields = fields.expect("the lock is granted, not deleted");
    assert_eq!(
        fields
            .iter()
            .filter(|f| f.starts_with("~granted:~r:"))
            .count(),
        2,
        "granted to both readers: {fields:?}"
    );
    migration.finish().unwrap();
    for reader in readers {
        within(Duration::from_secs(20), "a reader", reader)
            .await
            .unwrap()
            .unwrap()
            .expect("the reader gets the lock")
            .unlock()
            .await
            .unwrap();
    }
    assert_eq!(
        err_replies(&cluster, from),
        errors,
        "no script stopped half-way"
    );
}

/// `force_unlock` of a read/write lock, held by a reader and with a writer in line, while its
/// slot is migrating: the script runs whole and grants the lock to the writer, as a release
/// would; the writer has it.
///
/// Failed before: the script deleted the lock's key and its leases and then read them again to
/// hand the lock on; Redis stopped it half-way ("non local key"): the lock was removed and the
/// writer never told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_write_force_unlock_with_a_writer_waiting_runs_whole_while_its_slot_migrates() {
    let cluster = start_cluster_with_scripts();
    let a = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let b = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let name = "migrating-rw-force";
    let rw = a.rw_lock(name).unwrap();
    let keys = rw.read().keys().clone();
    let (slot, to) = slot_and_target(&cluster, &a, name);
    let from = cluster.owner_of_slot(slot).unwrap();
    let held = rw.read().try_lock().await.unwrap().expect("free").detach();
    let writer = {
        let rw = b.rw_lock(name).unwrap();
        tokio::spawn(async move {
            rw.write()
                .try_lock_for(Duration::from_secs(60))
                .await
                .map(|g| g.map(|g| g.detach()))
        })
    };
    let line = keys.waiters();
    assert!(
        eventually(Duration::from_secs(10), || zset_members(
            &cluster, from, &line
        )
        .len()
            == 1)
        .await,
        "the writer is in line"
    );
    let errors = err_replies(&cluster, from);
    let migration = cluster.begin_slot_migration(slot, to).unwrap();
    let forced = rw.write().force_unlock().await;
    let fields = hash_fields(&cluster, from, keys.hash());
    let leases = zset_members(&cluster, from, &keys.leases());
    eprintln!(
        "read/write force unlock during the migration: {forced:?}; fields now {fields:?}; \
         leases {leases:?}; {} script(s) stopped",
        err_replies(&cluster, from) - errors
    );
    assert!(forced.expect("the force unlock ran whole"));
    let fields = fields.expect("the lock is granted to the writer, not deleted");
    assert!(
        fields.iter().any(|f| f == "~granted") && fields.iter().any(|f| f == "~writer"),
        "granted to the writer: {fields:?}"
    );
    assert!(
        !fields.iter().any(|f| f.starts_with("~r:")),
        "the reader's hold is gone: {fields:?}"
    );
    assert_eq!(leases.len(), 1, "the writer's hold alone: {leases:?}");
    migration.finish().unwrap();
    within(Duration::from_secs(20), "the writer", writer)
        .await
        .unwrap()
        .unwrap()
        .expect("the writer gets the lock")
        .unlock()
        .await
        .unwrap();
    drop(held);
    assert_eq!(
        err_replies(&cluster, from),
        errors,
        "no script stopped half-way at the source"
    );
}

/// A writer waiting behind a reader gives up (its `try_lock_for` times out) while the lock's
/// slot is migrating: the leave script runs whole and its entry is gone.
///
/// Failed before: the leave took the writer's entry out (the line's zsets then gone, it was the
/// only waiter) and read them again to drop dead entries; Redis stopped it half-way ("non local
/// key").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_write_waiter_giving_up_leaves_whole_while_its_slot_migrates() {
    let cluster = start_cluster_with_scripts();
    let a = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let b = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let name = "migrating-rw-leave";
    let rw = a.rw_lock(name).unwrap();
    let keys = rw.write().keys().clone();
    let (slot, to) = slot_and_target(&cluster, &a, name);
    let from = cluster.owner_of_slot(slot).unwrap();
    let read = rw.read().try_lock().await.unwrap().expect("free");
    let writer = {
        let rw = b.rw_lock(name).unwrap();
        tokio::spawn(async move {
            rw.write()
                .try_lock_for(Duration::from_secs(3))
                .await
                .map(|g| g.is_some())
        })
    };
    let line = keys.waiters();
    assert!(
        eventually(Duration::from_secs(2), || zset_members(
            &cluster, from, &line
        )
        .len()
            == 1)
        .await,
        "the writer is in line"
    );
    let errors = err_replies(&cluster, from);
    let migration = cluster.begin_slot_migration(slot, to).unwrap();
    assert!(
        !writer.is_finished(),
        "the writer gives up during the migration"
    );
    let got = within(Duration::from_secs(10), "the writer's time-out", writer)
        .await
        .unwrap();
    assert!(!got.expect("a time-out, not an error"), "the lock was held");
    // The leave runs in the background once the wait is over.
    let gone = eventually(Duration::from_secs(10), || {
        zset_members(&cluster, from, &line).is_empty()
    })
    .await;
    let stopped = err_replies(&cluster, from) - errors;
    eprintln!("the writer's entry gone: {gone}; {stopped} script(s) stopped");
    assert!(gone, "the writer's entry is gone");
    assert_eq!(stopped, 0, "the leave ran whole");
    migration.finish().unwrap();
    read.unlock().await.unwrap();
}

/// Waits until a semaphore's waiter is subscribed on `node` (`PUBSUB SHARDCHANNELS` under the
/// name's waiter channels) and has sent its try after subscribing (the engine tries again once
/// its channel is subscribed): `calls` script calls on `node` since `before`. From then on a
/// release's grant reaches it by message. (A waiter whose message was lost takes its grant by
/// a try, which a migrating slot refuses with TRYAGAIN while the line's keys are gone, until the
/// migration ends: not what these tests are about.)
async fn until_subscribed_after_tries(
    cluster: &RedisCluster,
    node: usize,
    keys: &LockKeys,
    before: u64,
    calls: u64,
) {
    let pattern = format!("{}:*", keys.released());
    // Without sharded pub/sub (Redis 6.2) the subscription may be on any node.
    let sharded = cluster.node(node).has_command("spublish").unwrap();
    let listed = |at: usize, subcommand: &str| {
        cluster
            .node(at)
            .command(&["PUBSUB", subcommand, &pattern])
            .unwrap()
            .as_array()
            .is_some_and(|c| !c.is_empty())
    };
    assert!(
        eventually(Duration::from_secs(10), || {
            let subscribed = if sharded {
                listed(node, "SHARDCHANNELS")
            } else {
                (0..cluster.nodes().len())
                    .filter(|&at| cluster.node(at).is_running())
                    .any(|at| listed(at, "CHANNELS"))
            };
            let tried = cluster.node(node).command_calls("evalsha").unwrap() >= before + calls;
            subscribed && tried
        })
        .await,
        "the waiter is subscribed and tried again"
    );
}

/// A semaphore's waiter is granted its permit while the semaphore's slot is migrating, with
/// permits left over after its grant: the acquire script runs whole (it tells the next in line,
/// of whom there is none) and the waiter has its permit before the migration ends.
///
/// Failed before: the grant took the waiter's entry out (the line's zsets then gone, it was the
/// only waiter) and then read the line to tell the next waiters; Redis stopped it half-way
/// ("non local key"): the waiter's try failed after its permit had been written, and it waited
/// for the migration's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_waiter_granted_with_permits_left_runs_whole_while_its_slot_migrates() {
    let cluster = start_cluster_with_scripts();
    let a = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let b = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let name = "migrating-semaphore-grant";
    let semaphore = a.semaphore(name).unwrap();
    let keys = semaphore.keys().clone();
    let (slot, to) = slot_and_target(&cluster, &a, name);
    let from = cluster.owner_of_slot(slot).unwrap();
    assert!(semaphore.try_set_permits(3).await.unwrap());
    let one = semaphore.acquire(1).await.unwrap();
    let two = semaphore.acquire(2).await.unwrap();
    let before = cluster.node(from).command_calls("evalsha").unwrap();
    let waiter = {
        let semaphore = b.semaphore(name).unwrap();
        tokio::spawn(async move { semaphore.try_acquire_for(1, Duration::from_secs(60)).await })
    };
    let line = keys.waiters();
    assert!(
        eventually(Duration::from_secs(10), || zset_members(
            &cluster, from, &line
        )
        .len()
            == 1)
        .await,
        "the waiter is in line"
    );
    until_subscribed_after_tries(&cluster, from, &keys, before, 2).await;
    let errors = err_replies(&cluster, from);
    let migration = cluster.begin_slot_migration(slot, to).unwrap();
    two.release().await.expect("the release ran whole");
    let granted = tokio::time::timeout(Duration::from_secs(10), waiter).await;
    let stopped = err_replies(&cluster, from) - errors;
    eprintln!("the waiter during the migration: {granted:?}; {stopped} script(s) stopped");
    let permit = granted
        .expect("granted during the migration")
        .unwrap()
        .unwrap()
        .expect("a permit");
    assert_eq!(stopped, 0, "the grant ran whole");
    migration.finish().unwrap();
    permit.release().await.unwrap();
    one.release().await.unwrap();
}

/// The release of a semaphore's only permit taken, with a waiter in line, while the slot is
/// migrating: the release grants the waiter in the same script, and runs whole (the grant's
/// lease is written before the released permit's goes, so the leases zset is never emptied and
/// written again), and the waiter has its permit before the migration ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_release_granting_its_last_permit_runs_whole_while_its_slot_migrates() {
    let cluster = start_cluster_with_scripts();
    let a = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let b = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let name = "migrating-semaphore-release";
    let semaphore = a.semaphore(name).unwrap();
    let keys = semaphore.keys().clone();
    let (slot, to) = slot_and_target(&cluster, &a, name);
    let from = cluster.owner_of_slot(slot).unwrap();
    assert!(semaphore.try_set_permits(1).await.unwrap());
    let only = semaphore.acquire(1).await.unwrap();
    let before = cluster.node(from).command_calls("evalsha").unwrap();
    let waiter = {
        let semaphore = b.semaphore(name).unwrap();
        tokio::spawn(async move { semaphore.try_acquire_for(1, Duration::from_secs(60)).await })
    };
    let line = keys.waiters();
    assert!(
        eventually(Duration::from_secs(10), || zset_members(
            &cluster, from, &line
        )
        .len()
            == 1)
        .await,
        "the waiter is in line"
    );
    until_subscribed_after_tries(&cluster, from, &keys, before, 2).await;
    let errors = err_replies(&cluster, from);
    let migration = cluster.begin_slot_migration(slot, to).unwrap();
    only.release().await.expect("the release ran whole");
    let granted = tokio::time::timeout(Duration::from_secs(10), waiter).await;
    let stopped = err_replies(&cluster, from) - errors;
    eprintln!("the waiter during the migration: {granted:?}; {stopped} script(s) stopped");
    let permit = granted
        .expect("granted during the migration")
        .unwrap()
        .unwrap()
        .expect("a permit");
    assert_eq!(stopped, 0, "the release and its grant ran whole");
    migration.finish().unwrap();
    permit.release().await.unwrap();
}

/// A semaphore's only waiter gives up (its `try_acquire_for` times out) while the semaphore's
/// slot is migrating: the leave script runs whole and its entry is gone.
///
/// Failed before: as the read/write lock's leave (see
/// `a_read_write_waiter_giving_up_leaves_whole_while_its_slot_migrates`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_waiter_giving_up_leaves_whole_while_its_slot_migrates() {
    let cluster = start_cluster_with_scripts();
    let a = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let b = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let name = "migrating-semaphore-leave";
    let semaphore = a.semaphore(name).unwrap();
    let keys = semaphore.keys().clone();
    let (slot, to) = slot_and_target(&cluster, &a, name);
    let from = cluster.owner_of_slot(slot).unwrap();
    assert!(semaphore.try_set_permits(1).await.unwrap());
    let permit = semaphore.acquire(1).await.unwrap();
    let waiter = {
        let semaphore = b.semaphore(name).unwrap();
        tokio::spawn(async move {
            semaphore
                .try_acquire_for(1, Duration::from_secs(3))
                .await
                .map(|p| p.is_some())
        })
    };
    let line = keys.waiters();
    assert!(
        eventually(Duration::from_secs(2), || zset_members(
            &cluster, from, &line
        )
        .len()
            == 1)
        .await,
        "the waiter is in line"
    );
    let errors = err_replies(&cluster, from);
    let migration = cluster.begin_slot_migration(slot, to).unwrap();
    assert!(
        !waiter.is_finished(),
        "the waiter gives up during the migration"
    );
    let got = within(Duration::from_secs(10), "the waiter's time-out", waiter)
        .await
        .unwrap();
    assert!(
        !got.expect("a time-out, not an error"),
        "no permit was free"
    );
    let gone = eventually(Duration::from_secs(10), || {
        zset_members(&cluster, from, &line).is_empty()
    })
    .await;
    let stopped = err_replies(&cluster, from) - errors;
    eprintln!("the waiter's entry gone: {gone}; {stopped} script(s) stopped");
    assert!(gone, "the waiter's entry is gone");
    assert_eq!(stopped, 0, "the leave ran whole");
    migration.finish().unwrap();
    permit.release().await.unwrap();
}

/// Permits added for a semaphore's waiter while the semaphore's slot is migrating: the set
/// script grants the waiter in the same call and runs whole, and the waiter has its permit
/// before the migration ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_added_for_a_waiter_run_whole_while_the_slot_migrates() {
    let cluster = start_cluster_with_scripts();
    let a = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let b = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let name = "migrating-semaphore-set";
    let semaphore = a.semaphore(name).unwrap();
    let keys = semaphore.keys().clone();
    let (slot, to) = slot_and_target(&cluster, &a, name);
    let from = cluster.owner_of_slot(slot).unwrap();
    assert!(semaphore.try_set_permits(1).await.unwrap());
    // A permit held keeps the leases zset there: the grant writes into it.
    let held = semaphore.acquire(1).await.unwrap();
    let before = cluster.node(from).command_calls("evalsha").unwrap();
    let waiter = {
        let semaphore = b.semaphore(name).unwrap();
        tokio::spawn(async move { semaphore.try_acquire_for(1, Duration::from_secs(60)).await })
    };
    let line = keys.waiters();
    assert!(
        eventually(Duration::from_secs(10), || zset_members(
            &cluster, from, &line
        )
        .len()
            == 1)
        .await,
        "the waiter is in line"
    );
    until_subscribed_after_tries(&cluster, from, &keys, before, 2).await;
    let errors = err_replies(&cluster, from);
    let migration = cluster.begin_slot_migration(slot, to).unwrap();
    semaphore.add_permits(1).await.expect("the set ran whole");
    let granted = tokio::time::timeout(Duration::from_secs(10), waiter).await;
    let stopped = err_replies(&cluster, from) - errors;
    eprintln!("the waiter during the migration: {granted:?}; {stopped} script(s) stopped");
    let permit = granted
        .expect("granted during the migration")
        .unwrap()
        .unwrap()
        .expect("a permit");
    assert_eq!(stopped, 0, "the set and its grant ran whole");
    migration.finish().unwrap();
    permit.release().await.unwrap();
    held.release().await.unwrap();
}

/// The watchdog's renewals run whole while the slot migrates: a semaphore's permit (its hash
/// and its lease in the leases zset) and a waiter's entry (the line, its deadline and what it
/// wants) outlive three leases of a migration, and the waiter is granted the permit after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_run_whole_while_the_slot_migrates() {
    let cluster = start_cluster_with_scripts();
    let lease = Duration::from_millis(1500);
    let a = cluster_client_with_lease(&cluster, lease).await;
    let b = cluster_client_with_lease(&cluster, lease).await;
    let name = "migrating-renewals";
    let semaphore = a.semaphore(name).unwrap();
    let keys = semaphore.keys().clone();
    let (slot, to) = slot_and_target(&cluster, &a, name);
    let from = cluster.owner_of_slot(slot).unwrap();
    assert!(semaphore.try_set_permits(1).await.unwrap());
    let held = semaphore.acquire(1).await.unwrap();
    let waiter = {
        let semaphore = b.semaphore(name).unwrap();
        tokio::spawn(async move { semaphore.try_acquire_for(1, Duration::from_secs(60)).await })
    };
    let line = keys.waiters();
    assert!(
        eventually(Duration::from_secs(10), || zset_members(
            &cluster, from, &line
        )
        .len()
            == 1)
        .await,
        "the waiter is in line"
    );
    let errors = err_replies(&cluster, from);
    let migration = cluster.begin_slot_migration(slot, to).unwrap();
    // Three leases: without a renewal the permit and the entry would both have lapsed.
    tokio::time::sleep(3 * lease).await;
    let stopped = err_replies(&cluster, from) - errors;
    assert!(held.is_held(), "the permit's lease was kept");
    assert_eq!(
        zset_members(&cluster, from, &line).len(),
        1,
        "the waiter kept its place"
    );
    assert!(!waiter.is_finished(), "the waiter still waits");
    assert_eq!(stopped, 0, "every renewal ran whole");
    migration.finish().unwrap();
    held.release().await.unwrap();
    let permit = within(Duration::from_secs(10), "the waiter's grant", waiter)
        .await
        .unwrap()
        .unwrap()
        .expect("the permit, once released");
    permit.release().await.unwrap();
}

/// The count-down that opens a latch, with a waiter waiting, while the latch's slot is
/// migrating: the script runs whole (the hash goes as its last command on the key) and the
/// waiter is told before the migration ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_down_opening_a_latch_runs_whole_while_its_slot_migrates() {
    let cluster = start_cluster_with_scripts();
    let a = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let b = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let name = "migrating-latch";
    let latch = a.latch(name).unwrap();
    let released = a.lock(name).unwrap().keys().released().to_string();
    let (slot, to) = slot_and_target(&cluster, &a, name);
    let from = cluster.owner_of_slot(slot).unwrap();
    assert!(latch.try_set_count(1).await.unwrap());
    let waiter = {
        let latch = b.latch(name).unwrap();
        tokio::spawn(async move { latch.wait_for(Duration::from_secs(60)).await })
    };
    // Without sharded pub/sub (Redis 6.2) the subscription may be on any node.
    let sharded = cluster.node(from).has_command("spublish").unwrap();
    let subscribed = |at: usize| {
        let subcommand = if sharded { "SHARDNUMSUB" } else { "NUMSUB" };
        cluster
            .node(at)
            .command(&["PUBSUB", subcommand, &released])
            .unwrap()
            .as_array()
            .and_then(|reply| reply.get(1).and_then(|n| n.as_int()))
            .is_some_and(|n| n > 0)
    };
    assert!(
        eventually(Duration::from_secs(10), || if sharded {
            subscribed(from)
        } else {
            (0..cluster.nodes().len())
                .filter(|&at| cluster.node(at).is_running())
                .any(subscribed)
        })
        .await,
        "the waiter is subscribed"
    );
    let errors = err_replies(&cluster, from);
    let migration = cluster.begin_slot_migration(slot, to).unwrap();
    assert_eq!(
        latch.count_down().await.expect("the count-down ran whole"),
        0
    );
    let opened = tokio::time::timeout(Duration::from_secs(10), waiter).await;
    let stopped = err_replies(&cluster, from) - errors;
    eprintln!("the waiter during the migration: {opened:?}; {stopped} script(s) stopped");
    assert!(
        opened
            .expect("told during the migration")
            .unwrap()
            .expect("no error"),
        "the latch opened"
    );
    assert_eq!(stopped, 0, "the count-down ran whole");
    migration.finish().unwrap();
}

/// A waiter's shard subscription made just as its slot moves: `SSUBSCRIBE` reaches the old
/// owner, the slot then moves (the old owner drops the subscription) and the subscriber's slot
/// map is resynced before the client notes where the subscription was made. The slot follower
/// must still subscribe again at the new owner, and the waiter be woken by the release, not by
/// the holder's 30 s lease.
///
/// The move is made in that window by a test hook of the subscriber
/// (`leasehold_pubsub::set_subscribed_hook`), which runs after the `SSUBSCRIBE` reply:
/// without it the window is as short as a task's wake-up, and no fault from outside the client
/// lands there on purpose.
///
/// On a server without sharded pub/sub (Redis 6.2) the hook runs after the plain `SUBSCRIBE`:
/// a plain subscription hears every node's messages, so there is nothing to follow, and the
/// waiter must still be woken by the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_subscription_made_as_its_slot_moves_follows_the_slot() {
    use std::sync::atomic::{AtomicBool, Ordering};

    use futures::FutureExt;

    let cluster = start_cluster_with_scripts();
    let sharded = cluster.node(0).has_command("SPUBLISH").unwrap();
    eprintln!("SPUBLISH present: {sharded}");
    let a = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let b = cluster_client_with_lease(&cluster, Duration::from_secs(30)).await;
    let name = "subscribed-as-it-moves";
    let lock = a.lock(name).unwrap();
    // The waiter's grant comes on its client's channel.
    let channel = format!("{}:{}", lock.keys().released(), b.id());
    let (slot, to) = slot_and_target(&cluster, &a, name);
    let from = cluster.owner_of_slot(slot).unwrap();
    let shard_subscribers = |node: usize| {
        let reply = cluster
            .node(node)
            .command(&["PUBSUB", "SHARDNUMSUB", &channel])
            .unwrap();
        reply
            .as_array()
            .and_then(|parts| parts.get(1))
            .and_then(|count| count.as_int())
            .unwrap_or(0)
    };
    let guard = lock.try_lock().await.unwrap().expect("free");
    let (moved_tx, moved_rx) = tokio::sync::oneshot::channel::<()>();
    let moved_tx = Arc::new(parking_lot::Mutex::new(Some(moved_tx)));
    let once = Arc::new(AtomicBool::new(false));
    leasehold_pubsub::set_subscribed_hook(Some(Arc::new({
        let (cluster, channel) = (cluster.clone(), channel.clone());
        move |subscriber: &fred::clients::SubscriberClient, subscribed: &str| {
            if subscribed != channel || once.swap(true, Ordering::SeqCst) {
                return futures::future::ready(()).boxed();
            }
            let (cluster, subscriber, moved_tx) =
                (cluster.clone(), subscriber.clone(), moved_tx.clone());
            async move {
                use fred::interfaces::ClusterInterface;
                blocking(move || cluster.migrate_slot(slot, to))
                    .await
                    .expect("the slot moves");
                subscriber
                    .sync_cluster()
                    .await
                    .expect("the slot map resyncs");
                if let Some(tx) = moved_tx.lock().take() {
                    let _ = tx.send(());
                }
            }
            .boxed()
        }
    })));
    let waiter = {
        let lock = b.lock(name).unwrap();
        tokio::spawn(async move {
            lock.try_lock_for(Duration::from_secs(60))
                .await
                .map(|g| g.map(|g| g.detach()))
        })
    };
    within(
        Duration::from_secs(20),
        "the move between the subscription and its record",
        moved_rx,
    )
    .await
    .expect("the hook ran");
    leasehold_pubsub::set_subscribed_hook(None);
    assert!(eventually(Duration::from_secs(10), || b.waiters() == 1).await);
    // The follower sees the owner changed (within SHARD_CHECK) and subscribes there.
    let followed =
        !sharded || eventually(Duration::from_secs(10), || shard_subscribers(to) == 1).await;
    assert!(
        followed,
        "the waiter's channel was not subscribed again at the slot's new owner: {} subscriber(s) \
         there, {} at the old one",
        shard_subscribers(to),
        shard_subscribers(from)
    );
    let released_at = Instant::now();
    guard.unlock().await.unwrap();
    let handed = within(Duration::from_secs(40), "the waiter", waiter)
        .await
        .unwrap()
        .unwrap()
        .expect("the waiter gets the lock");
    let after_release = released_at.elapsed();
    assert!(
        after_release < Duration::from_secs(10),
        "woken by the release, not by the 30 s lease: {after_release:?}"
    );
    handed.unlock().await.unwrap();
}

/// On a cluster a lock's server identity, which a multi-lock orders by, is the node serving its
/// slot (as the client's slot map says), and two clients of one cluster listing one name in a
/// multi-lock list one lock twice: refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_lock_is_identified_by_the_node_serving_its_slot() {
    let cluster = start_cluster();
    let a = cluster_client(&cluster).await;
    let b = cluster_client(&cluster).await;
    for name in names_on_every_primary(&cluster, &a, "identity") {
        let lock = a.lock(&name).unwrap();
        let owner = cluster.owner_of_slot(lock.keys().slot()).unwrap();
        assert_eq!(
            lock.server_identity(),
            format!("node:{}", cluster.node_id(owner)),
            "{name}"
        );
        assert_eq!(
            b.lock(&name).unwrap().server_identity(),
            lock.server_identity()
        );
        assert!(matches!(
            leasehold::MultiLock::new([lock, b.lock(&name).unwrap()]),
            Err(leasehold::LockError::InvalidArgument(_))
        ));
    }
}
