//! Reentrancy: nested acquires in one task count holds under one grant (one fencing token),
//! and an explicit `Owner` lets two tasks share one hold.
//!
//! Run: `cargo run --example nested` (uses $REDIS_URL, or starts its own redis-server).

use leasehold::{Lock, LockClient, LockGuard};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn show(layer: &str, guard: &LockGuard) {
    let (hold, token) = (guard.hold_count(), guard.fencing_token());
    println!("{layer:<14} hold {hold}, token {token}");
}

/// Three layers of code that each take the same lock, as a service calling a helper might.
async fn place_order(lock: &Lock) -> Result<()> {
    let guard = lock.lock().await?;
    show("place_order", &guard);
    reserve_stock(lock).await?;
    guard.unlock().await?; // the last hold of this owner: the lock is free again
    Ok(())
}

async fn reserve_stock(lock: &Lock) -> Result<()> {
    let guard = lock.lock().await?; // same owner: re-enters instead of deadlocking
    show("reserve_stock", &guard);
    write_audit(lock).await?;
    guard.unlock().await?;
    Ok(())
}

async fn write_audit(lock: &Lock) -> Result<()> {
    let guard = lock.try_lock().await?.expect("re-entry never waits");
    show("write_audit", &guard);
    println!("  hold count in Redis: {}", lock.hold_count().await?);
    guard.unlock().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    // `$REDIS_URL` if set, otherwise a throwaway redis-server (stopped when `redis` drops).
    let redis = leasehold_testkit::redis_for_tests()?;
    let client = LockClient::connect(&redis.url()).await?;
    let lock = client.lock("order:1001")?;
    place_order(&lock).await?;
    println!("after place_order, locked: {}", lock.is_locked().await?);

    // The default owner is the current tokio task (or thread, outside a task), so another
    // task is another owner. To share one hold across tasks, pass an explicit owner.
    let owner = client.new_owner();
    let shared = client.lock("order:1001")?.with_owner(owner);
    let first = shared.lock().await?;
    let (second, stranger) = tokio::spawn({
        let shared = shared.clone();
        let lock = lock.clone();
        async move {
            // Guards borrow their handle; detach() lets them leave this task.
            let second = shared.try_lock().await?.map(|g| g.detach()); // same owner: re-enters
            let stranger = lock.try_lock().await?.map(|g| g.detach()); // its own owner: refused
            Ok::<_, leasehold::LockError>((second, stranger))
        }
    })
    .await??;
    let second = second.expect("shared owner re-enters from another task");
    show("shared task 1", &first);
    show("shared task 2", &second); // one grant: same token, count 2
    println!(
        "  a task with its own owner got: {:?}",
        stranger.map(|_| ())
    );
    first.unlock().await?;
    second.unlock().await?;
    println!("both released, locked: {}", lock.is_locked().await?);
    Ok(())
}
