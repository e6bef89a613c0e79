//! The watchdog under load: H holds kept by one client over several renewal ticks.
//! Reported: renew round trips per tick, client CPU per second of holding, and heap bytes per
//! hold (live allocations while holding, counted by the instrumented global allocator).

use std::alloc::System;
use std::time::Duration;

use cpu_time::ProcessTime;
use futures::stream::{self, StreamExt, TryStreamExt};
use leasehold::LockClient;
use serde::Serialize;
use stats_alloc::{Region, StatsAlloc};
use tokio::time::Instant;

#[derive(Clone, Debug, Serialize)]
pub(crate) struct WatchdogRun {
    pub(crate) holds: usize,
    /// The lease used (table only; renewals every lease/3).
    #[serde(skip)]
    pub(crate) lease: Duration,
    pub(crate) round_trips_per_tick: f64,
    pub(crate) cpu_ms_per_sec: f64,
    pub(crate) bytes_per_hold: f64,
}

pub(crate) async fn run(
    url: &str,
    holds: usize,
    lease: Duration,
    ticks: u32,
    allocator: &'static StatsAlloc<System>,
) -> anyhow::Result<WatchdogRun> {
    let client = LockClient::builder(url).lease(lease).build().await?;
    let region = Region::new(allocator);
    let guards: Vec<_> = stream::iter(0..holds)
        .map(|i| {
            let client = client.clone();
            async move {
                let lock = client.lock(&format!("w:{i}"))?;
                let guard = lock.try_lock().await?.map(|guard| guard.detach());
                guard.ok_or_else(|| anyhow::anyhow!("w:{i} is busy"))
            }
        })
        .buffer_unordered(64)
        .try_collect()
        .await?;
    let change = region.change();
    let bytes = change.bytes_allocated as f64 - change.bytes_deallocated as f64;

    // Wait for the first renewal wave, then observe whole ticks.
    tokio::time::sleep(lease / 3).await;
    let before = client.watchdog_stats();
    let cpu = ProcessTime::now();
    let started = Instant::now();
    tokio::time::sleep(lease / 3 * ticks).await;
    let cpu_used = cpu.elapsed();
    let elapsed = started.elapsed();
    let after = client.watchdog_stats();
    anyhow::ensure!(after.lost == 0, "holds were lost: {after:?}");
    anyhow::ensure!(
        guards.iter().all(|g| g.is_held()),
        "a hold lost its lease during the run"
    );
    let observed_ticks = elapsed.as_secs_f64() / (lease / 3).as_secs_f64();
    drop(guards);
    Ok(WatchdogRun {
        holds,
        lease,
        round_trips_per_tick: (after.renew_calls - before.renew_calls) as f64 / observed_ticks,
        cpu_ms_per_sec: cpu_used.as_secs_f64() * 1000.0 / elapsed.as_secs_f64(),
        bytes_per_hold: bytes / holds as f64,
    })
}
