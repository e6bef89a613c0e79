//! Uncontended lock + unlock on fresh names, against the client stack's limit: the same tasks
//! calling EVALSHA of a trivial script through the same fred client. A lock + unlock pair is two
//! round trips, so `ratio_to_limit = 2 x pairs/s / baseline calls/s` (1.0 = at the limit).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::alloc::System;

use cpu_time::ProcessTime;
use fred::interfaces::LuaInterface;
use leasehold::LockClient;
use serde::Serialize;
use stats_alloc::{Region, StatsAlloc};

use crate::redis_stats::Admin;
use tokio::time::Instant;

#[derive(Clone, Debug, Serialize)]
pub(crate) struct Uncontended {
    pub(crate) tasks: usize,
    pub(crate) pairs_per_sec: f64,
    pub(crate) baseline_calls_per_sec: f64,
    pub(crate) ratio_to_limit: f64,
    /// Client-side cost of one lock + unlock pair (table only, not in the JSON contract).
    #[serde(skip)]
    pub(crate) client_cpu_us_per_pair: f64,
    /// Heap allocations per pair (table only).
    #[serde(skip)]
    pub(crate) allocs_per_pair: f64,
    /// Heap allocations per baseline call (table only).
    #[serde(skip)]
    pub(crate) allocs_per_call: f64,
    /// Client-side cost of one baseline EVALSHA (table only).
    #[serde(skip)]
    pub(crate) client_cpu_us_per_call: f64,
    /// Redis CPU per script call (INFO commandstats usec_per_call): leasehold's acquire and
    /// release scripts vs the trivial one (table only).
    #[serde(skip)]
    pub(crate) server_us_per_script: f64,
    #[serde(skip)]
    pub(crate) server_us_per_trivial: f64,
}

/// Runs `rounds` alternating slices of baseline and leasehold, so drift in machine load hits
/// both alike.
pub(crate) async fn run(
    url: &str,
    tasks: usize,
    duration: Duration,
    allocator: &'static StatsAlloc<System>,
    admin: &Admin,
) -> anyhow::Result<Uncontended> {
    let client = LockClient::connect(url).await?;
    let trivial = fred::types::scripts::Script::from_lua("return 1");
    let _: String = client
        .redis()
        .script_load(trivial.lua().unwrap().to_string())
        .await?;
    let rounds = 4u32;
    let slice = duration / rounds;
    let (mut pairs, mut calls) = (0u64, 0u64);
    let (mut pair_time, mut call_time) = (Duration::ZERO, Duration::ZERO);
    let (mut pair_cpu, mut call_cpu) = (Duration::ZERO, Duration::ZERO);
    let (mut pair_allocs, mut call_allocs) = (0usize, 0usize);
    let (mut script_usec, mut trivial_usec) = (0.0, 0.0);
    for round in 0..rounds {
        admin.reset_stats().await?;
        let started = Instant::now();
        let cpu = ProcessTime::now();
        let region = Region::new(allocator);
        calls += baseline(&client, &trivial, tasks, slice).await?;
        call_allocs += region.change().allocations;
        call_cpu += cpu.elapsed();
        call_time += started.elapsed();
        trivial_usec += admin.usec_per_call("evalsha").await? / rounds as f64;
        admin.reset_stats().await?;
        let started = Instant::now();
        let cpu = ProcessTime::now();
        let region = Region::new(allocator);
        pairs += lock_unlock(&client, tasks, slice, round).await?;
        pair_allocs += region.change().allocations;
        pair_cpu += cpu.elapsed();
        pair_time += started.elapsed();
        script_usec += admin.usec_per_call("evalsha").await? / rounds as f64;
    }
    let pairs_per_sec = pairs as f64 / pair_time.as_secs_f64();
    let baseline_calls_per_sec = calls as f64 / call_time.as_secs_f64();
    Ok(Uncontended {
        tasks,
        pairs_per_sec,
        baseline_calls_per_sec,
        ratio_to_limit: 2.0 * pairs_per_sec / baseline_calls_per_sec,
        client_cpu_us_per_pair: pair_cpu.as_secs_f64() * 1e6 / pairs.max(1) as f64,
        allocs_per_pair: pair_allocs as f64 / pairs.max(1) as f64,
        allocs_per_call: call_allocs as f64 / calls.max(1) as f64,
        client_cpu_us_per_call: call_cpu.as_secs_f64() * 1e6 / calls.max(1) as f64,
        server_us_per_script: script_usec,
        server_us_per_trivial: trivial_usec,
    })
}

async fn baseline(
    client: &LockClient,
    script: &fred::types::scripts::Script,
    tasks: usize,
    slice: Duration,
) -> anyhow::Result<u64> {
    let redis = client.redis().clone();
    let sha = script.sha1().to_string();
    run_for(tasks, slice, move |_task, _i| {
        let (redis, sha) = (redis.clone(), sha.clone());
        async move {
            let _: i64 = redis.evalsha(sha.as_str(), (), ()).await?;
            Ok(())
        }
    })
    .await
}

async fn lock_unlock(
    client: &LockClient,
    tasks: usize,
    slice: Duration,
    round: u32,
) -> anyhow::Result<u64> {
    let client = client.clone();
    run_for(tasks, slice, move |task, i| {
        let client = client.clone();
        async move {
            let lock = client.lock(&format!("u:{round}:{task}:{i}"))?;
            let guard = lock.try_lock().await?.expect("fresh name is free");
            guard.unlock().await?;
            Ok(())
        }
    })
    .await
}

/// Spawns `tasks` tasks, each calling `op(task, i)` for i = 0, 1, ... until `slice` is over;
/// returns how many calls completed.
async fn run_for<F, Fut>(tasks: usize, slice: Duration, op: F) -> anyhow::Result<u64>
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (count, stop, op) = (count.clone(), stop.clone(), op.clone());
        handles.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                op(task, i).await?;
                count.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            anyhow::Ok(())
        }));
    }
    tokio::time::sleep(slice).await;
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle.await??;
    }
    Ok(count.load(Ordering::Relaxed))
}
