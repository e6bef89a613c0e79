//! The `replica_sync` scenario: what `ReplicaSync::Replicas { replicas: 1, .. }` costs a
//! grant, against the same grant without it and against raw fred calls in the same run.
//!
//! A primary and one replica of its own (testkit's `ReplicaPair::start_direct`: no proxy on
//! the replication path; on loopback, so replication takes about one local round trip),
//! whatever `REDIS_URL` says. Medians of back-to-back runs, one task:
//! - `grant`: `try_lock` alone (its unlock is not timed), without and with sync; the synced
//!   grant is the acquire script, then `WAIT 1 100` on the same connection.
//! - `pair`: `try_lock` + `unlock`, without and with sync (the release waits too).
//! - `raw`: `SET NX PX` alone, and `SET NX PX` then `WAIT 1 100`: the floor any synced lock
//!   reduces to.

use std::time::Duration;

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};
use leasehold::{LockClient, ReplicaSync};
use leasehold_testkit::ReplicaPair;
use serde::Serialize;
use tokio::time::Instant;

/// What the scenario measured (medians, microseconds).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ReplicaSyncRun {
    pub(crate) grant_p50_us: f64,
    pub(crate) synced_grant_p50_us: f64,
    pub(crate) pair_p50_us: f64,
    pub(crate) synced_pair_p50_us: f64,
    pub(crate) raw_set_p50_us: f64,
    pub(crate) raw_set_wait_p50_us: f64,
    /// synced_grant / grant, and synced_grant / raw_set_wait.
    pub(crate) grant_ratio_to_unsynced: f64,
    pub(crate) grant_ratio_to_raw: f64,
}

const SYNC: ReplicaSync = ReplicaSync::Replicas {
    replicas: 1,
    timeout: Duration::from_millis(100),
};

pub(crate) async fn run(slice: Duration) -> anyhow::Result<ReplicaSyncRun> {
    // Direct replication: a proxy hop on the link would be measured as WAIT's cost.
    let pair = ReplicaPair::start_direct().await?;
    let url = pair.primary().url();
    let plain = LockClient::connect(&url).await?;
    let synced = LockClient::builder(&url).replica_sync(SYNC).build().await?;
    let (lock, synced_lock) = (plain.lock("bench:sync")?, synced.lock("bench:sync")?);

    let grant_p50 = median(slice, || timed_grant(&lock, 0)).await?;
    let synced_grant_p50 = median(slice, || timed_grant(&synced_lock, 1)).await?;
    let pair_p50 = median(slice, || timed_pair(&lock)).await?;
    let synced_pair_p50 = median(slice, || timed_pair(&synced_lock)).await?;

    let raw = Builder::from_config(Config::from_url(&url)?).build()?;
    raw.init().await?;
    let set = || async {
        let set: Option<String> = raw
            .set(
                "bench:raw",
                "owner",
                Some(Expiration::PX(10_000)),
                Some(SetOptions::NX),
                false,
            )
            .await?;
        anyhow::ensure!(set.is_some(), "uncontended");
        anyhow::Ok(())
    };
    let raw_set_p50 = median(slice, || async {
        let started = Instant::now();
        set().await?;
        let took = started.elapsed();
        raw.del::<(), _>("bench:raw").await?;
        anyhow::Ok(Some(took))
    })
    .await?;
    let raw_set_wait_p50 = median(slice, || async {
        let started = Instant::now();
        set().await?;
        let acked: i64 = raw
            .custom(
                CustomCommand::new_static("WAIT", ClusterHash::FirstKey, false),
                vec![1, 100],
            )
            .await?;
        let took = started.elapsed();
        raw.del::<(), _>("bench:raw").await?;
        // A replica later than WAIT's 100 ms: not counted, as a synced grant rolled back.
        anyhow::Ok((acked >= 1).then_some(took))
    })
    .await?;
    raw.quit().await?;

    Ok(ReplicaSyncRun {
        grant_p50_us: grant_p50,
        synced_grant_p50_us: synced_grant_p50,
        pair_p50_us: pair_p50,
        synced_pair_p50_us: synced_pair_p50,
        raw_set_p50_us: raw_set_p50,
        raw_set_wait_p50_us: raw_set_wait_p50,
        grant_ratio_to_unsynced: synced_grant_p50 / grant_p50,
        grant_ratio_to_raw: synced_grant_p50 / raw_set_wait_p50,
    })
}

/// The time of one uncontended `try_lock` (its unlock not timed); checks that the grant reached
/// `replicas` replicas.
async fn timed_grant(lock: &leasehold::Lock, replicas: u32) -> anyhow::Result<Option<Duration>> {
    let started = Instant::now();
    let guard = match lock.try_lock().await {
        Ok(guard) => guard.expect("uncontended"),
        // The replica did not answer within WAIT's 100 ms (a busy machine): the grant was
        // rolled back. A late replica is not a grant's cost; the sample is not counted.
        Err(leasehold::LockError::NotReplicated { .. }) => return Ok(None),
        Err(error) => return Err(error.into()),
    };
    let took = started.elapsed();
    let reached = guard.replica_sync().map_or(0, |s| s.replicas);
    anyhow::ensure!(reached >= replicas, "a grant reached {reached} replicas");
    guard.unlock().await?;
    Ok(Some(took))
}

/// The time of one uncontended `try_lock` + `unlock` (`None`: the grant was rolled back, see
/// [`timed_grant`]).
async fn timed_pair(lock: &leasehold::Lock) -> anyhow::Result<Option<Duration>> {
    let started = Instant::now();
    match lock.try_lock().await {
        Ok(guard) => guard.expect("uncontended").unlock().await?,
        Err(leasehold::LockError::NotReplicated { .. }) => return Ok(None),
        Err(error) => return Err(error.into()),
    }
    Ok(Some(started.elapsed()))
}

/// Runs `timed` back to back for `slice`; the median of the times it reports, in microseconds.
async fn median<F, Fut>(slice: Duration, mut timed: F) -> anyhow::Result<f64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<Duration>>>,
{
    for _ in 0..50 {
        counted(&mut timed).await?;
    }
    let until = Instant::now() + slice;
    let mut times = Vec::new();
    while Instant::now() < until {
        times.push(counted(&mut timed).await?.as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// One sample of `timed` that counts: one it does not count (`None`) is taken again; 100 of
/// them in a row fail the run.
async fn counted<F, Fut>(timed: &mut F) -> anyhow::Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<Duration>>>,
{
    for _ in 0..100 {
        if let Some(took) = timed().await? {
            return Ok(took);
        }
    }
    anyhow::bail!("100 grants in a row reached no replica in time")
}
