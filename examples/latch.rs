//! The count-down latch: a schema migration starts when all three workers have drained their
//! queues. The coordinator sets the count to 3 and waits; each worker, on its own pod, counts
//! down when it is ready; a dashboard on another pod waits too. Both go the moment the third
//! worker counts down.
//!
//! Run: `cargo run --example latch` (uses $REDIS_URL, or starts its own redis-server).

use std::time::Duration;

use leasehold::LockClient;
use tokio::time::Instant;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const WORKERS: [(&str, u64); 3] = [("worker-1", 100), ("worker-2", 250), ("worker-3", 400)];
const NAME: &str = "migration:v42:workers-ready";

#[tokio::main]
async fn main() -> Result<()> {
    // `$REDIS_URL` if set, otherwise a throwaway redis-server (stopped when `redis` drops).
    let redis = leasehold_testkit::redis_for_tests()?;
    let coordinator = LockClient::connect(&redis.url()).await?;
    let dashboard = LockClient::connect(&redis.url()).await?;

    // Set the count before anyone waits: a wait on a latch that was never set returns at once.
    let ready = coordinator.latch(NAME)?;
    assert!(
        ready.try_set_count(WORKERS.len() as u32).await?,
        "the latch is counting down already (a run that stopped half-way?)"
    );
    println!(
        "latch {NAME:?}: count {} (set once: a second try_set_count -> {})",
        ready.count().await?,
        ready.try_set_count(5).await?
    );
    let start = Instant::now();

    // Three workers, each on a pod of its own, count down when their queue is drained.
    let mut workers = Vec::new();
    for (name, drain_ms) in WORKERS {
        let pod = LockClient::connect(&redis.url()).await?;
        workers.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(drain_ms)).await; // drains its queue
            let left = pod.latch(NAME)?.count_down().await?;
            println!(
                "{:>6} ms  {name} ready, counts down: {left} left",
                start.elapsed().as_millis()
            );
            Ok::<_, leasehold::LockError>(())
        }));
    }

    // A dashboard on another pod waits for the same moment.
    let watching = tokio::spawn({
        let latch = dashboard.latch(NAME)?;
        async move {
            latch.wait().await?;
            println!(
                "{:>6} ms  dashboard: workers ready, showing \"migrating\"",
                start.elapsed().as_millis()
            );
            Ok::<_, leasehold::LockError>(())
        }
    });

    // A bounded wait says false while workers are still draining.
    let early = ready.wait_for(Duration::from_millis(50)).await?;
    println!(
        "{:>6} ms  coordinator: wait_for(50 ms) -> {early} (count {})",
        start.elapsed().as_millis(),
        ready.count().await?
    );
    assert!(!early);

    // The coordinator waits (bounded, so a worker that never reports does not hang it).
    let opened = ready.wait_for(Duration::from_secs(10)).await?;
    let at = start.elapsed();
    assert!(opened, "every worker counted down");
    println!(
        "{:>6} ms  coordinator: all {} workers ready, the migration starts",
        at.as_millis(),
        WORKERS.len()
    );
    assert!(at >= Duration::from_millis(WORKERS[2].1));
    for worker in workers {
        worker.await.expect("the worker")?;
    }
    watching.await.expect("the dashboard")?;

    // At zero the latch is gone from Redis: waits return at once, counting down does nothing,
    // and try_set_count may start a new round.
    assert_eq!(ready.count().await?, 0);
    assert!(ready.wait_for(Duration::ZERO).await?);
    assert_eq!(ready.count_down().await?, 0);
    println!("open: count 0, wait returns at once, count_down -> 0");
    Ok(())
}
