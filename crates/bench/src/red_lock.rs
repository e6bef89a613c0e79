//! The `red_lock` scenario: what a quorum over five independent servers costs against the plain
//! lock on one, and against the minimal Redlock written with raw fred calls in the same run.
//!
//! - **uncontended**: one task, try_lock + unlock pairs, for each of
//!   - `plain`: the plain lock on one server (two round trips);
//!   - `red_lock`: `RedLock` over five servers (a round to all five at once, then the releases
//!     at once: two round trips of the slowest server);
//!   - `raw`: the baseline every Redlock library reduces to: `SET key id NX PX` on the five at
//!     once, then a compare-and-delete script on the five at once (no reentrancy, no fencing,
//!     no watchdog, no waiting).
//! - **contended**: two contenders (each with its own clients) lock and unlock in a loop;
//!   acquisitions per second, for the plain lock (two clients of one server) and for RedLock
//!   (two sets of five clients). RedLock's contenders can split the votes and pay a random
//!   pause; this shows what that costs.
//!
//! Its five servers are its own (testkit), started here whatever `REDIS_URL` says.

use std::time::Duration;

use fred::prelude::*;
use leasehold::{LockClient, RedLock};
use leasehold_testkit::RedisServer;
use serde::Serialize;
use tokio::time::Instant;

/// What the scenario measured.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RedLockRun {
    pub(crate) servers: usize,
    /// Median microseconds per pair.
    pub(crate) plain_pair_p50_us: f64,
    pub(crate) red_lock_pair_p50_us: f64,
    pub(crate) raw_pair_p50_us: f64,
    /// red_lock / raw and red_lock / plain, of the medians.
    pub(crate) ratio_to_raw: f64,
    pub(crate) ratio_to_plain: f64,
    /// Acquisitions per second with two contenders.
    pub(crate) plain_contended_per_sec: f64,
    pub(crate) red_lock_contended_per_sec: f64,
}

pub(crate) async fn run(slice: Duration) -> anyhow::Result<RedLockRun> {
    let servers: Vec<RedisServer> = (0..5)
        .map(|_| RedisServer::start())
        .collect::<Result<_, _>>()?;
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let connect_all = || async {
        let mut clients = Vec::new();
        for url in &urls {
            clients.push(LockClient::connect(url).await?);
        }
        anyhow::Ok(clients)
    };

    let plain_client = LockClient::connect(&urls[0]).await?;
    let plain = plain_client.lock("bench:plain")?;
    let plain_p50 = median_pair(slice, || async {
        let guard = plain.try_lock().await?.expect("uncontended");
        guard.unlock().await?;
        anyhow::Ok(())
    })
    .await?;

    let red = RedLock::new(connect_all().await?)?;
    let quorum_lock = red.lock("bench:red")?;
    let red_p50 = median_pair(slice, || async {
        let guard = quorum_lock.try_lock().await?.expect("uncontended");
        guard.unlock().await?;
        anyhow::Ok(())
    })
    .await?;

    let raw_clients = {
        let mut clients = Vec::new();
        for url in &urls {
            let client = Builder::from_config(Config::from_url(url)?).build()?;
            client.init().await?;
            clients.push(client);
        }
        clients
    };
    let release = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                   return redis.call('DEL', KEYS[1]) else return 0 end";
    let raw_p50 = median_pair(slice, || async {
        let id = "bench-owner";
        let sets = raw_clients.iter().map(|c| async move {
            c.set::<Option<String>, _, _>(
                "bench:raw",
                id,
                Some(Expiration::PX(10_000)),
                Some(SetOptions::NX),
                false,
            )
            .await
        });
        let granted = futures::future::join_all(sets)
            .await
            .into_iter()
            .filter(|r| matches!(r, Ok(Some(_))))
            .count();
        assert!(granted >= 3, "uncontended");
        let dels = raw_clients
            .iter()
            .map(|c| c.eval::<i64, _, _, _>(release, "bench:raw", id));
        for result in futures::future::join_all(dels).await {
            result?;
        }
        anyhow::Ok(())
    })
    .await?;

    let plain_contended = {
        let (a, b) = (
            LockClient::connect(&urls[0]).await?,
            LockClient::connect(&urls[0]).await?,
        );
        let (la, lb) = (a.lock("bench:plain:c")?, b.lock("bench:plain:c")?);
        let loop_on = |lock: leasehold::Lock| async move {
            let until = Instant::now() + slice;
            let mut n = 0u64;
            while Instant::now() < until {
                lock.lock().await?.unlock().await?;
                n += 1;
            }
            anyhow::Ok(n)
        };
        let (x, y) = tokio::join!(loop_on(la), loop_on(lb));
        (x? + y?) as f64 / slice.as_secs_f64()
    };
    let red_contended = {
        let (a, b) = (
            RedLock::new(connect_all().await?)?,
            RedLock::new(connect_all().await?)?,
        );
        let loop_on = |red: RedLock| async move {
            let lock = red.lock("bench:red:c")?;
            let until = Instant::now() + slice;
            let mut n = 0u64;
            while Instant::now() < until {
                lock.lock().await?.unlock().await?;
                n += 1;
            }
            anyhow::Ok(n)
        };
        let (x, y) = tokio::join!(loop_on(a), loop_on(b));
        (x? + y?) as f64 / slice.as_secs_f64()
    };

    Ok(RedLockRun {
        servers: servers.len(),
        plain_pair_p50_us: plain_p50,
        red_lock_pair_p50_us: red_p50,
        raw_pair_p50_us: raw_p50,
        ratio_to_raw: red_p50 / raw_p50,
        ratio_to_plain: red_p50 / plain_p50,
        plain_contended_per_sec: plain_contended,
        red_lock_contended_per_sec: red_contended,
    })
}

/// Runs `pair` back to back for `slice`; the median time of one, in microseconds.
async fn median_pair<F, Fut>(slice: Duration, mut pair: F) -> anyhow::Result<f64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    // Warm-up: connections, scripts loaded.
    for _ in 0..50 {
        pair().await?;
    }
    let until = Instant::now() + slice;
    let mut times = Vec::new();
    while Instant::now() < until {
        let started = Instant::now();
        pair().await?;
        times.push(started.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}
