//! The 2 a.m. report on three pods: every pod's scheduler fires, exactly one runs the job.
//! `hold_at_least` then keeps a pod whose clock fires late from running it a second time.
//!
//! Run: `cargo run --example scheduled_job` (uses $REDIS_URL, or starts its own redis-server).

use std::time::Duration;

use leasehold::schedule::{run_once, RunOnce, RunOnceOptions};
use leasehold::LockClient;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

// At most 10 min (if the pod dies mid-job the lock ends by itself), at least 1 s from the
// start (a real schedule would use minutes: longer than the clock skew between pods).
fn options() -> RunOnceOptions {
    RunOnceOptions::at_most(Duration::from_secs(600)).at_least(Duration::from_secs(1))
}

/// One pod's scheduled tick: its own client (its own process, in real life).
async fn tick(pod: usize, url: String) -> Result<bool> {
    let client = LockClient::connect(&url).await?;
    let lock = client.lock("lock:daily-report")?;
    let job = async {
        println!("[pod-{pod}] starting the daily report");
        tokio::time::sleep(Duration::from_millis(200)).await; // query, render, send mail...
        println!("[pod-{pod}] report sent");
    };
    Ok(match run_once(&lock, options(), job).await? {
        RunOnce::Ran(()) => true,
        RunOnce::Skipped => {
            println!("[pod-{pod}] another instance is running the report; skipping");
            false
        }
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    // `$REDIS_URL` if set, otherwise a throwaway redis-server (stopped when `redis` drops).
    let redis = leasehold_testkit::redis_for_tests()?;
    // 02:00:00: all three schedulers fire at once.
    let pods: Vec<_> = (1..=3)
        .map(|pod| tokio::spawn(tick(pod, redis.url())))
        .collect();
    let mut ran = 0;
    for pod in pods {
        ran += pod.await?? as usize;
    }
    println!("runs: {ran} of 3 pods");

    // 300 ms after the start a fourth pod, whose clock runs slow, fires. The job finished after
    // 200 ms, but hold_at_least keeps the lock until 1 s after the start, so it is skipped.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let late = tick(4, redis.url()).await?;
    println!("late pod ran the report again: {late}");

    // Once the 1 s slot is over the lock expires by itself, and the next day's run can go.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let next = tick(1, redis.url()).await?;
    println!("next slot: ran {next}");
    Ok(())
}
