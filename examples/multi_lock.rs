//! Moving money between two accounts: both account locks, all or none. Two pods transfer in
//! opposite directions at the same time (one locks {alice, bob}, the other {bob, alice}); the
//! multi-lock takes the locks in one canonical order, so they never wait for each other's.
//!
//! Run: `cargo run --example multi_lock` (uses $REDIS_URL, or starts its own redis-server).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold::{LockClient, MultiLock};
use parking_lot::Mutex;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

#[tokio::main]
async fn main() -> Result<()> {
    // `$REDIS_URL` if set, otherwise a throwaway redis-server (stopped when `redis` drops).
    let redis = leasehold_testkit::redis_for_tests()?;
    let pod_a = LockClient::connect(&redis.url()).await?;
    let pod_b = LockClient::connect(&redis.url()).await?;
    // The "database": balances, written only under both account locks.
    let balances = Arc::new(Mutex::new(HashMap::from([
        ("alice", 100_i64),
        ("bob", 100),
    ])));

    let transfer = |pod: LockClient, from: &'static str, to: &'static str, times: usize| {
        let balances = balances.clone();
        async move {
            let accounts = MultiLock::new([
                pod.lock(&format!("account:{from}"))?,
                pod.lock(&format!("account:{to}"))?,
            ])?;
            for _ in 0..times {
                let guard = accounts.lock().await?;
                {
                    // Read-modify-write of both balances: safe only with both locks held.
                    let mut b = balances.lock();
                    let (f, t) = (b[from], b[to]);
                    b.insert(from, f - 1);
                    b.insert(to, t + 1);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                guard.unlock().await?;
            }
            Ok::<_, leasehold::LockError>(())
        }
    };
    let started = tokio::time::Instant::now();
    let (a, b) = tokio::join!(
        transfer(pod_a.clone(), "alice", "bob", 50),
        transfer(pod_b.clone(), "bob", "alice", 30),
    );
    a?;
    b?;
    let final_balances = balances.lock().clone();
    println!(
        "80 transfers in opposite directions in {:?}: alice {}, bob {}",
        started.elapsed(),
        final_balances["alice"],
        final_balances["bob"]
    );
    assert_eq!(final_balances["alice"], 100 - 50 + 30);
    assert_eq!(final_balances["bob"], 100 + 50 - 30);

    // All or none: with bob's account held elsewhere, a try gets nothing and holds nothing.
    let bob = pod_b.lock("account:bob")?;
    let held = bob.lock().await?;
    let accounts = pod_a.multi_lock([pod_a.lock("account:alice")?, pod_a.lock("account:bob")?])?;
    assert!(accounts.try_lock().await?.is_none());
    assert!(!pod_a.lock("account:alice")?.is_locked().await?);
    println!("bob's account busy: try_lock of both -> None, alice's not held either");
    held.unlock().await?;

    // One guard for all: a fencing token per account (fence each write with its own).
    let guard = accounts.lock().await?;
    for (name, token) in guard.fencing_tokens() {
        println!("holding {name} with fencing token {token}");
    }
    guard.unlock().await?;
    Ok(())
}
