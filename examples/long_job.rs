//! A job longer than the lease: the watchdog keeps renewing it. Then the same job when an
//! operator force-unlocks the lock mid-way: `run_while_held` cancels it with LeaseLost.
//!
//! Run: `cargo run --example long_job` (uses $REDIS_URL, or starts its own redis-server).

use std::time::Duration;

use fred::interfaces::KeysInterface;
use leasehold::{LockClient, LockError};
use tokio::time::Instant;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

#[tokio::main]
async fn main() -> Result<()> {
    // `$REDIS_URL` if set, otherwise a throwaway redis-server (stopped when `redis` drops).
    let redis = leasehold_testkit::redis_for_tests()?;
    // A 1 s lease (default 30 s) so the demo is short: renewed every 1/3 s while held.
    let client = LockClient::builder(&redis.url())
        .lease(Duration::from_secs(1))
        .build()
        .await?;
    let lock = client.lock("migration:2024-06")?;
    let key = lock.keys().hash().to_string();

    // 1. A 3 s job under a 1 s lease. No explicit lease, so the watchdog renews it.
    let guard = lock.lock().await?;
    let job = async {
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let pttl: i64 = client.redis().pttl(&key).await?; // plain fred call
            println!("  job running, key TTL {pttl} ms");
        }
        Ok::<_, fred::error::Error>(())
    };
    guard.run_while_held(job).await??;
    let stats = client.watchdog_stats();
    println!(
        "job 1 done after 3 s, still held: {}; watchdog: {} renewals confirmed, {} renew calls sent",
        guard.is_held(),
        stats.renewed,
        stats.renew_calls
    );
    guard.unlock().await?;

    // 2. The same job, but an operator force-unlocks the lock after 800 ms (a stuck-looking
    // job, a bad deploy...). The holder learns it at its next renewal, within lease/3.
    let operator = LockClient::connect(&redis.url()).await?;
    let forced = operator.lock("migration:2024-06")?;
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(800)).await;
        let removed = forced.force_unlock().await;
        println!("  operator: force_unlock -> {removed:?}");
    });
    let guard = lock.lock().await?;
    let started = Instant::now();
    let job = async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        "migrated"
    };
    match guard.run_while_held(job).await {
        Ok(done) => println!("job 2 finished: {done}"),
        // The job future was dropped at its await point: no write after the loss.
        Err(LockError::LeaseLost { name }) => {
            println!(
                "job 2 cancelled after {:?}: lease on {name:?} lost",
                started.elapsed()
            )
        }
        Err(other) => return Err(other.into()),
    }
    // The hold is gone in Redis, so unlocking reports NotHeld and changes nothing.
    if let Err(error) = guard.unlock().await {
        println!("unlock after the loss: {error}");
    }
    Ok(())
}
