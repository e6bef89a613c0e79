//! The semaphore: at most two report exports at once, fleet-wide. Three pods share six export
//! jobs; each pod's dispatcher takes a permit before it spawns a job and hands the permit to
//! the spawned task, which gives it back when the export is done. Never more than two run at
//! once, whichever pod they are on. Then a permit released by its id from another pod, and the
//! typed errors of ids that hold nothing.
//!
//! Run: `cargo run --example semaphore` (uses $REDIS_URL, or starts its own redis-server).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold::{LockClient, LockError, Permit};
use tokio::time::Instant;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const PODS: [&str; 3] = ["pod-a", "pod-b", "pod-c"];
const JOBS: usize = 6;
const PERMITS: u32 = 2;
const EXPORT_TIME: Duration = Duration::from_millis(200);

/// How many exports run now, and the most that ever ran at once.
#[derive(Default)]
struct Running {
    now: AtomicUsize,
    most: AtomicUsize,
}

/// One export, run by the task that received the permit (a `Permit` is `Send + 'static`).
async fn export(
    job: usize,
    pod: &'static str,
    permit: Permit,
    running: Arc<Running>,
    start: Instant,
) -> leasehold::Result<()> {
    let now = running.now.fetch_add(1, Ordering::SeqCst) + 1;
    running.most.fetch_max(now, Ordering::SeqCst);
    println!(
        "{:>6} ms  export-{job} on {pod} starts   (running: {now}; permit token {})",
        start.elapsed().as_millis(),
        permit.fencing_token()
    );
    // The export; run_while_held would cancel it if the permit's lease were lost meanwhile.
    permit
        .run_while_held(tokio::time::sleep(EXPORT_TIME))
        .await?;
    let now = running.now.fetch_sub(1, Ordering::SeqCst) - 1;
    println!(
        "{:>6} ms  export-{job} on {pod} finishes (running: {now})",
        start.elapsed().as_millis()
    );
    // Gives the permit back; the next in line (on any pod) is told on its own channel.
    permit.release().await
}

#[tokio::main]
async fn main() -> Result<()> {
    // `$REDIS_URL` if set, otherwise a throwaway redis-server (stopped when `redis` drops).
    let redis = leasehold_testkit::redis_for_tests()?;
    let mut pods = Vec::new();
    for _ in PODS {
        pods.push(LockClient::connect(&redis.url()).await?);
    }

    // The number of permits is configuration kept in Redis (no TTL) until `delete()`.
    // `try_set_permits` sets it only if nobody did; `set_permits` sets it whatever it was.
    let exports = pods[0].semaphore("reports:export")?;
    exports.set_permits(PERMITS).await?;
    println!(
        "semaphore {} ({} permits), {JOBS} export jobs over {} pods",
        exports.keys().hash(),
        exports.permits().await?,
        PODS.len()
    );

    // Each pod dispatches its jobs: a permit first (waiting in the fleet-wide line), then a
    // task that does the work and owns the permit.
    let start = Instant::now();
    let running = Arc::new(Running::default());
    let mut dispatchers = Vec::new();
    for (p, pod) in PODS.iter().enumerate() {
        let semaphore = pods[p].semaphore("reports:export")?;
        let running = running.clone();
        dispatchers.push(tokio::spawn(async move {
            let mut exports = Vec::new();
            for job in (1..=JOBS).filter(|job| (job - 1) % PODS.len() == p) {
                let permit = semaphore.acquire(1).await?;
                exports.push(tokio::spawn(export(
                    job,
                    pod,
                    permit,
                    running.clone(),
                    start,
                )));
            }
            for export in exports {
                export.await.expect("the export task")?;
            }
            Ok::<_, LockError>(())
        }));
    }
    for dispatcher in dispatchers {
        dispatcher.await.expect("the dispatcher")?;
    }
    let most = running.most.load(Ordering::SeqCst);
    println!(
        "all {JOBS} exports done in {} ms; at most {most} ran at once",
        start.elapsed().as_millis()
    );
    assert!(most as u64 <= u64::from(PERMITS), "{most} exports at once");
    assert_eq!(exports.available_permits().await?, PERMITS as i64);

    // A permit released by its id from another pod: pod A takes one and passes its id on (a
    // job message, say); pod C, where the job finishes, gives it back.
    println!("release by id");
    let permit = exports.acquire(1).await?;
    let id = permit.id().to_string();
    println!(
        "  pod-a holds permit {id} (available: {})",
        exports.available_permits().await?
    );
    pods[2]
        .semaphore("reports:export")?
        .release_permit(&id)
        .await?;
    println!(
        "  pod-c released it by id (available: {})",
        exports.available_permits().await?
    );
    // The permits are back already: pod A's own release is told that nothing is held.
    match permit.release().await {
        Err(LockError::NotHeld { .. }) => println!("  pod-a's own release -> NotHeld"),
        other => panic!("expected NotHeld, got {other:?}"),
    }
    match exports.release_permit("no-such-permit:o1").await {
        Err(LockError::NotHeld { .. }) => println!("  an unknown id -> NotHeld"),
        other => panic!("expected NotHeld, got {other:?}"),
    }

    // One try never queues: with both permits taken it says None at once.
    let first = exports.acquire(2).await?;
    assert!(exports.try_acquire(1).await?.is_none());
    println!("  both permits taken: try_acquire(1) -> None");
    first.release().await?;

    // The semaphore's number stays in Redis until it is deleted.
    exports.delete().await?;
    Ok(())
}
