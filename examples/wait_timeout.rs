//! Bounded waits: a holder keeps the lock 500 ms. A patient waiter (2 s) gets it right after
//! the release, woken by the release message; an impatient one (100 ms) gives up with None.
//!
//! Run: `cargo run --example wait_timeout` (uses $REDIS_URL, or starts its own redis-server).

use std::time::Duration;

use leasehold::LockClient;
use tokio::time::Instant;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

#[tokio::main]
async fn main() -> Result<()> {
    // `$REDIS_URL` if set, otherwise a throwaway redis-server (stopped when `redis` drops).
    let redis = leasehold_testkit::redis_for_tests()?;
    let client = LockClient::connect(&redis.url()).await?;
    let lock = client.lock("report:daily")?;
    let start = Instant::now();

    // Each tokio task is its own owner, so the three tasks below exclude each other even
    // though they share one client.
    // detach(): the guard moves to another task, which releases it (a guard stays in its
    // task unless detached; see LockGuard::detach).
    let guard = lock.lock().await?.detach();
    println!("holder: acquired, releasing in 500 ms");
    let holder = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        // A guard may be released from any task, not only the one that acquired it.
        guard.unlock().await?;
        println!("holder: released at {:?}", start.elapsed());
        Ok::<_, leasehold::LockError>(())
    });

    let waiter = |name: &'static str, wait: Duration| {
        let lock = lock.clone();
        tokio::spawn(async move {
            let asked = Instant::now();
            // Try, subscribe to the release channel, try again, then sleep until a release
            // message or the holder's remaining lease or our own deadline.
            match lock.try_lock_for(wait).await? {
                Some(guard) => {
                    println!("{name}: acquired after waiting {:?}", asked.elapsed());
                    guard.unlock().await?;
                }
                None => println!("{name}: gave up after {:?} -> None", asked.elapsed()),
            }
            Ok::<_, leasehold::LockError>(())
        })
    };
    let patient = waiter("patient waiter (2 s)", Duration::from_secs(2));
    let impatient = waiter("impatient waiter (100 ms)", Duration::from_millis(100));

    holder.await??;
    patient.await??;
    impatient.await??;
    // Nothing is left behind: no waiter entry (and the last waiter out unsubscribes the
    // release channel in the background).
    println!("after: {} waiters registered", client.waiters());
    Ok(())
}
