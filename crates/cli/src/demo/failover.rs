//! `leasehold demo --failover`: one lock through a failover, with and without replica sync.
//!
//! Each part starts a throw-away primary and a replica of it (leasehold-testkit) replicating
//! through a testkit [`Proxy`] that can cut the link, so the demo decides what the replica has
//! when the primary dies. The failover is done by hand, as a Sentinel or Cluster failover would
//! do it without the election's seconds: the primary is killed and the replica promoted
//! (`REPLICAOF NO ONE`). "Pod A" and "pod B" are two lock clients of this process, A on the
//! primary and B on the promoted replica (the pod processes of the other scenarios are not
//! needed to show it).
//!
//! 1. Without replica sync, a grant the replica never received is granted again by the
//!    promoted replica: two owners. The fencing token still orders them (tokens are floored at
//!    server time), and the fenced store refuses the stale owner's write.
//! 2. With `ReplicaSync::Replicas { replicas: 1, timeout: 1s }` a grant is reported only
//!    once the replica acknowledged it, so it survives the failover; and a grant the cut-off
//!    replica missed fails with `LockError::NotReplicated` and is rolled back.
//! 3. What the sync costs a grant, measured in passing (`just bench --only replica_sync`
//!    measures it properly).
//!
//! The demo's own redis-servers are stopped at the end; the fenced store is the other
//! scenarios' (`store.rs`).

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use leasehold::{LockClient, LockError, ReplicaSync, Synced};
use leasehold_testkit::ReplicaPair;
use tokio::runtime::Runtime;

use super::say;
use super::store::Store;

/// The lock, and the product it guards, as in the inventory scenario.
const LOCK: &str = "inventory:42";
const PRODUCT: i64 = 42;
/// The policy of part 2.
const SYNC: ReplicaSync = ReplicaSync::Replicas {
    replicas: 1,
    timeout: Duration::from_secs(1),
};
/// How long a pod waits for any Redis reply (above the sync timeout, as the builder requires).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a rollback may take to show on the primary.
const ROLLBACK_DEADLINE: Duration = Duration::from_secs(10);
/// Grants timed with and without sync in part 3 (after a few untimed ones).
const TIMED_GRANTS: usize = 40;
const WARM_UP_GRANTS: usize = 5;

/// What every part needs.
struct Ctx {
    prefix: String,
    store: Store,
    runtime: Runtime,
}

impl Ctx {
    fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// A pod's lock client on `url` (pod A on the primary, pod B on the promoted replica).
    fn pod(&self, url: &str, sync: ReplicaSync) -> anyhow::Result<LockClient> {
        self.block_on(
            LockClient::builder(url)
                .prefix(&self.prefix)
                .command_timeout(COMMAND_TIMEOUT)
                .replica_sync(sync)
                .build(),
        )
        .with_context(|| format!("cannot connect a pod to {url}"))
    }

    /// A fresh primary and replica, in sync, and says so.
    fn pair(&self) -> anyhow::Result<ReplicaPair> {
        // The proxy's tasks run on the runtime's workers, between the demo's own calls.
        let pair = self
            .block_on(ReplicaPair::start())
            .context("cannot start a primary and a replica")?;
        say(&format!(
            "primary 127.0.0.1:{}, replica 127.0.0.1:{} (replicating through a proxy that can \
             cut the link): in sync",
            pair.primary().port(),
            pair.replica().port()
        ));
        Ok(pair)
    }
}

/// Cuts the pair's replication link: what the primary writes from now on never reaches the
/// replica (dropped, not buffered).
fn cut(pair: &ReplicaPair) -> anyhow::Result<()> {
    pair.cut()?;
    say("the replication link is cut: what the primary writes now never reaches the replica");
    Ok(())
}

/// Kills the primary and promotes the replica.
fn fail_over(pair: &ReplicaPair) -> anyhow::Result<()> {
    pair.fail_over()
        .context("cannot kill the primary and promote the replica")?;
    say("the primary is killed, the replica promoted (REPLICAOF NO ONE)");
    Ok(())
}

/// Whether the primary still has the lock's hash (`key`).
fn primary_has(pair: &ReplicaPair, key: &str) -> anyhow::Result<bool> {
    let exists = pair.primary().command(&["EXISTS", key])?;
    Ok(exists.as_int().context("EXISTS replied with no integer")? != 0)
}

type Part = fn(&Ctx) -> anyhow::Result<()>;

/// Plays the three parts; `Ok(false)` when one did not behave as expected.
pub fn run(began: Instant) -> anyhow::Result<bool> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    println!(
        "leasehold demo --failover: one lock through a failover, with and without replica sync"
    );
    say(
        "redis: each part starts its own primary and replica of it on 127.0.0.1; the failover \
         is by hand: the primary killed, the replica promoted",
    );
    say("pod A and pod B: two lock clients of this process, A on the primary, B on the promoted replica");
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let (spec, store, _dir) = runtime.block_on(super::open_store(&run_id))?;
    say(&format!("store: {}", spec.describe()));
    let ctx = Ctx {
        prefix: format!("leasehold-demo-{run_id}"),
        store,
        runtime,
    };
    // Guards dropped outside the runtime's calls release in the background: on this runtime.
    let parts: [(&str, Part); 3] = [
        ("without sync", without_sync),
        ("with sync", with_sync),
        ("latency", latency),
    ];
    let mut failed = Vec::new();
    for (name, part) in parts {
        println!();
        let entered = ctx.runtime.enter();
        let outcome = part(&ctx);
        drop(entered);
        if let Err(error) = outcome {
            say(&format!("FAILED: {error:#}"));
            failed.push(name);
        }
    }
    if let Err(error) = ctx.block_on(ctx.store.drop_table()) {
        eprintln!("leasehold: warning: {error:#}");
    }
    let Ctx { store, runtime, .. } = ctx;
    drop(store);
    // A pod A whose primary is gone may still be reconnecting: do not wait for it.
    runtime.shutdown_timeout(Duration::from_secs(1));

    Ok(super::summarize(&failed, began))
}

/// Part 1: the grant the replica missed is granted again after the failover.
fn without_sync(ctx: &Ctx) -> anyhow::Result<()> {
    println!("1. Without replica sync: the primary dies before the replica has pod A's grant");
    let pair = ctx.pair()?;
    ctx.block_on(ctx.store.reset(PRODUCT, 1))?;
    let a = ctx.pod(&pair.primary().url(), ReplicaSync::None)?;
    let lock_a = a.lock(LOCK)?;
    cut(&pair)?;
    let first = ctx
        .block_on(lock_a.try_lock())?
        .context("pod A found the lock held on a fresh primary")?;
    ensure!(
        first.replica_sync().is_none(),
        "no policy, yet the grant reports {:?}",
        first.replica_sync()
    );
    say(&format!(
        "pod A took {LOCK:?} on the primary (token {}): granted at once, no replica asked",
        first.fencing_token()
    ));
    fail_over(&pair)?;
    let b = ctx.pod(&pair.replica().url(), ReplicaSync::None)?;
    let lock_b = b.lock(LOCK)?;
    let Some(second) = ctx.block_on(lock_b.try_lock())? else {
        bail!("the promoted replica had pod A's grant: the cut link let it through");
    };
    say(&format!(
        "pod B took {LOCK:?} on the promoted replica (token {}): it never saw pod A's grant",
        second.fencing_token()
    ));
    let (a_held, b_held) = (first.is_held(), second.is_held());
    say(&format!(
        "granted twice: pod A still believes it holds the lock (is_held: {a_held}), pod B holds \
         it (is_held: {b_held})"
    ));
    ensure!(
        a_held && b_held,
        "expected two owners, got pod A {a_held}, pod B {b_held}"
    );

    // Both sell the last unit with a fenced write: B first, then A's late write.
    let (token_a, token_b) = (first.fencing_token(), second.fencing_token());
    let rows_b = ctx.block_on(ctx.store.fenced_sell(PRODUCT, token_b))?;
    say(&format!(
        "pod B sold the last unit of product {PRODUCT} with token {token_b}: {rows_b} row updated"
    ));
    let rows_a = ctx.block_on(ctx.store.fenced_sell(PRODUCT, token_a))?;
    say(&format!(
        "pod A sold it too, with its token {token_a}: {rows_a} rows updated"
    ));
    ensure!(
        token_a < token_b,
        "pod B's token {token_b} is not above pod A's {token_a}"
    );
    ensure!(rows_b == 1, "pod B's fenced write updated {rows_b} rows");
    ensure!(
        rows_a == 0,
        "pod A's stale write went through ({rows_a} rows)"
    );
    let (stock, last_fence) = ctx.block_on(ctx.store.snapshot(PRODUCT))?;
    ensure!(
        stock == 0 && last_fence == i64::from(token_b),
        "the store holds stock {stock}, last_fence {last_fence}; expected 0 and {token_b}"
    );
    say(&format!(
        "stale write rejected by fencing token (A's token {token_a} < B's token {token_b}: \
         tokens are floored at server time, so the promoted replica's are higher)"
    ));
    ctx.block_on(second.unlock())?;
    say("ok: granted twice without sync, and the fencing token kept pod A's write out");
    Ok(())
}

/// Part 2: a reported grant survives the failover; a grant the replica missed is rolled back.
fn with_sync(ctx: &Ctx) -> anyhow::Result<()> {
    println!(
        "2. With ReplicaSync::Replicas {{ replicas: 1, timeout: 1s }}: a grant is reported \
         only once a replica holds it"
    );
    let pair = ctx.pair()?;
    let a = ctx.pod(&pair.primary().url(), SYNC)?;
    let lock_a = a.lock(LOCK)?;
    let guard = ctx
        .block_on(lock_a.try_lock())?
        .context("pod A found the lock held on a fresh primary")?;
    let synced = guard.replica_sync();
    say(&format!(
        "pod A took {LOCK:?} (token {}), reported once the replica acknowledged it: \
         replica_sync() = {}",
        guard.fencing_token(),
        synced.map_or_else(|| "None".to_string(), |s| format!("{s:?}"))
    ));
    ensure!(
        matches!(synced, Some(Synced { replicas: 1, .. })),
        "expected Some(Synced {{ replicas: 1, .. }}), got {synced:?}"
    );
    fail_over(&pair)?;
    let b = ctx.pod(&pair.replica().url(), SYNC)?;
    let lock_b = b.lock(LOCK)?;
    if let Some(second) = ctx.block_on(lock_b.try_lock())? {
        bail!(
            "pod B took the lock too (token {}): pod A's synced grant was lost",
            second.fencing_token()
        );
    }
    ensure!(
        ctx.block_on(lock_b.is_locked())?,
        "the promoted replica shows the lock free"
    );
    say(&format!(
        "pod B: try_lock on the promoted replica finds {LOCK:?} held: pod A's grant survived, \
         no second owner"
    ));
    drop(guard);

    say("and when the replica does not get the grant in time (a fresh pair):");
    let pair = ctx.pair()?;
    let a = ctx.pod(&pair.primary().url(), SYNC)?;
    let lock_a = a.lock(LOCK)?;
    cut(&pair)?;
    match ctx.block_on(lock_a.try_lock()) {
        Err(LockError::NotReplicated {
            replicas, required, ..
        }) => {
            say(&format!(
                "pod A's try_lock failed with LockError::NotReplicated: the grant reached \
                 {replicas} of the {required} replica required within 1 s"
            ));
            ensure!(
                (replicas, required) == (0, 1),
                "expected 0 of 1 replicas, got {replicas} of {required}"
            );
        }
        Ok(Some(guard)) => bail!(
            "pod A's grant was reported (token {}, {:?}) though the replica never received it",
            guard.fencing_token(),
            guard.replica_sync()
        ),
        Ok(None) => bail!("pod A found the lock held on a fresh primary"),
        Err(error) => bail!("expected NotReplicated, got {error}"),
    }
    // The rollback runs in the background: the primary drops the grant soon after.
    let hash = lock_a.keys().hash().to_string();
    let deadline = Instant::now() + ROLLBACK_DEADLINE;
    while primary_has(&pair, &hash)? {
        ensure!(
            Instant::now() < deadline,
            "the grant the replica missed was not rolled back on the primary within \
             {ROLLBACK_DEADLINE:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    say(&format!(
        "the grant was rolled back: {LOCK:?} is free again on the primary"
    ));
    say(
        "ok: no grant reported before a replica held it: the failover left one owner, and the \
         grant the replica missed was never reported",
    );
    Ok(())
}

/// Part 3: grant latency with and without sync, measured in passing.
fn latency(ctx: &Ctx) -> anyhow::Result<()> {
    println!("3. What the sync costs a grant (median of {TIMED_GRANTS} grants each, on loopback)");
    let pair = ctx.pair()?;
    let url = pair.primary().url();
    let plain = ctx.pod(&url, ReplicaSync::None)?;
    let synced = ctx.pod(&url, SYNC)?;
    let without = ctx.block_on(median_grant(&plain, 0))?;
    let with = ctx.block_on(median_grant(&synced, 1))?;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    say(&format!("without sync: {:.2} ms", ms(without)));
    say(&format!(
        "with sync:    {:.2} ms ({:+.2} ms: the WAIT until the replica acknowledged)",
        ms(with),
        ms(with) - ms(without)
    ));
    say(
        "ok: every synced grant was acknowledged by the replica (measured in passing: `just \
         bench --only replica_sync` measures it properly)",
    );
    Ok(())
}

/// The median time of `try_lock` on `client` (its unlock not timed); checks that each grant
/// reached `replicas` replicas.
async fn median_grant(client: &LockClient, replicas: u32) -> anyhow::Result<Duration> {
    let lock = client.lock("failover-demo:latency")?;
    let mut times = Vec::with_capacity(TIMED_GRANTS);
    for i in 0..WARM_UP_GRANTS + TIMED_GRANTS {
        let started = Instant::now();
        let guard = lock
            .try_lock()
            .await?
            .context("the latency lock was held")?;
        let took = started.elapsed();
        let reached = guard.replica_sync().map_or(0, |s| s.replicas);
        ensure!(
            reached == replicas,
            "a grant reached {reached} replicas, expected {replicas}"
        );
        guard.unlock().await?;
        if i >= WARM_UP_GRANTS {
            times.push(took);
        }
    }
    times.sort();
    Ok(times[times.len() / 2])
}
