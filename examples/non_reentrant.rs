//! The non-reentrant lock: two futures joined in one task are one owner. Through the default
//! (reentrant) lock the second re-enters the first's hold and both run at once; through
//! `non_reentrant()` the second waits for the first, as two pods would.
//!
//! Run: `cargo run --example non_reentrant` (uses $REDIS_URL, or starts its own redis-server).

use std::time::Duration;

use leasehold::{Lock, LockClient};
use tokio::time::Instant;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Sells the last item: check the stock, wait on a payment provider, write the sale.
async fn sell(lock: &Lock, buyer: &str, started: Instant) -> Result<()> {
    let guard = lock.lock().await?;
    let at = started.elapsed().as_millis();
    println!(
        "  {buyer}: in at {at:>3} ms, hold count {}, token {}",
        guard.hold_count(),
        guard.fencing_token()
    );
    tokio::time::sleep(Duration::from_millis(100)).await; // the payment call
    guard.unlock().await?;
    Ok(())
}

/// Alice and Bob buy at once, as two futures joined in one task (one owner).
async fn two_buyers(lock: &Lock) -> Result<()> {
    let started = Instant::now();
    let (a, b) = tokio::join!(sell(lock, "alice", started), sell(lock, "bob", started));
    a.and(b)
}

#[tokio::main]
async fn main() -> Result<()> {
    // `$REDIS_URL` if set, otherwise a throwaway redis-server (stopped when `redis` drops).
    let redis = leasehold_testkit::redis_for_tests()?;
    let client = LockClient::connect(&redis.url()).await?;

    println!("reentrant (the default): both buyers are inside at once");
    two_buyers(&client.lock("stock:last-item")?).await?;

    println!("non_reentrant(): bob waits for alice's hold to end, and gets a grant of his own");
    let lock = client.lock("stock:last-item")?.non_reentrant();
    two_buyers(&lock).await?;

    // try_lock is refused while the owner holds it, instead of re-entering.
    let guard = lock.lock().await?;
    assert!(lock.try_lock().await?.is_none());
    println!("try_lock while this task holds it: None");
    guard.unlock().await?;
    Ok(())
}
