//! The basics: connect, take a lock without waiting, read its fencing token, release it.
//! A second client (another pod, in real life) is refused while the lock is held.
//!
//! Run: `cargo run --example basic` (uses $REDIS_URL, or starts its own redis-server).

use leasehold::LockClient;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

#[tokio::main]
async fn main() -> Result<()> {
    // `$REDIS_URL` if set, otherwise a throwaway redis-server (stopped when `redis` drops).
    let redis = leasehold_testkit::redis_for_tests()?;
    // One client per process; here two, standing for two instances of a service.
    let pod_a = LockClient::connect(&redis.url()).await?;
    let pod_b = LockClient::connect(&redis.url()).await?;

    // A handle is cheap and sends nothing; the name becomes the key `leasehold:{inventory:42}`.
    let lock_a = pod_a.lock("inventory:42")?;
    let lock_b = pod_b.lock("inventory:42")?;
    println!(
        "lock {:?} lives in key {}",
        lock_a.name(),
        lock_a.keys().hash()
    );

    // try_lock tries once: Some(guard) when granted, None when another owner holds it.
    let guard = lock_a.try_lock().await?.expect("nobody holds it yet");
    println!(
        "pod A: acquired, fencing token {}, hold count {}",
        guard.fencing_token(),
        guard.hold_count()
    );

    // While A holds it, B is refused at once (no waiting).
    match lock_b.try_lock().await? {
        Some(_) => unreachable!("two owners can never hold the lock together"),
        None => println!(
            "pod B: try_lock -> None (held by A: {})",
            lock_b.is_locked().await?
        ),
    }

    // unlock().await reports the outcome; dropping the guard would release in the background.
    let token_a = guard.fencing_token();
    guard.unlock().await?;
    println!(
        "pod A: released (locked now: {})",
        lock_a.is_locked().await?
    );

    // Now B gets it, with a strictly higher token: a store that remembers the highest token
    // it saw can refuse a late write from A (see examples/fencing_sql.rs).
    let guard = lock_b.try_lock().await?.expect("A released it");
    assert!(guard.fencing_token() > token_a);
    println!(
        "pod B: acquired, fencing token {} (> {token_a})",
        guard.fencing_token()
    );
    guard.unlock().await?;
    Ok(())
}
