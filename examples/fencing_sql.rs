//! Why a lock is not enough, and what fixes it: holder A stalls past its lease (a GC pause,
//! a slow network), B takes the lock and sells the last item, then A wakes up and writes.
//! The store refuses A's write because A's fencing token is older than the last one it saw.
//!
//! Run: `cargo run --example fencing_sql` (uses $REDIS_URL, or starts its own redis-server).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{FencingToken, LockClient};
use rusqlite::{named_params, Connection};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The seed's fenced write: applied only if no newer token has written this row.
fn sell(db: &Mutex<Connection>, who: &str, fence: FencingToken) -> Result<()> {
    let rows_lock = db.lock().unwrap();
    let rows = rows_lock.execute(
        "UPDATE inventory SET stock = stock - :qty, last_fence = :fence
          WHERE product_id = :id AND last_fence < :fence",
        named_params! { ":qty": 1, ":fence": i64::from(fence), ":id": 42 },
    )?;
    let verdict = if rows == 1 {
        "applied"
    } else {
        "rejected (a newer token wrote first)"
    };
    println!("{who}: UPDATE with token {fence} -> {rows} row(s): {verdict}");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    // `$REDIS_URL` if set, otherwise a throwaway redis-server (stopped when `redis` drops).
    let redis = leasehold_testkit::redis_for_tests()?;
    let db = Connection::open_in_memory()?;
    db.execute_batch(
        "CREATE TABLE inventory (product_id INTEGER PRIMARY KEY, stock INTEGER NOT NULL,
                                 last_fence INTEGER NOT NULL DEFAULT 0);
         INSERT INTO inventory (product_id, stock) VALUES (42, 1);", // the last item
    )?;
    let db = Arc::new(Mutex::new(db));
    let pod_a = LockClient::connect(&redis.url()).await?;
    let pod_b = LockClient::connect(&redis.url()).await?;

    // A: an explicit 300 ms lease (no watchdog renews it), then a 600 ms stall.
    let lock_a = pod_a.lock("inventory:42")?;
    let guard = lock_a
        .try_lock_with_lease(Duration::from_millis(300))
        .await?;
    let guard = guard.expect("free at start").detach(); // it moves to the task below
    println!("A: acquired, token {}, lease 300 ms", guard.fencing_token());
    let a = tokio::spawn({
        let db = db.clone();
        async move {
            // The "GC pause". A real handler may have checked guard.is_held() just before it:
            // nothing can check in the gap between that check and the write.
            tokio::time::sleep(Duration::from_millis(600)).await;
            println!("A: wakes up 600 ms later; lease held? {}", guard.is_held());
            sell(&db, "A", guard.fencing_token())
        }
    });

    // B waits; A's expired key publishes nothing, so B wakes at A's remaining lease.
    let lock_b = pod_b.lock("inventory:42")?;
    let guard = lock_b.try_lock_for(Duration::from_secs(5)).await?;
    let guard = guard.expect("A's lease ends within 5 s");
    println!(
        "B: acquired when A's lease ran out, token {}",
        guard.fencing_token()
    );
    sell(&db, "B", guard.fencing_token())?;
    guard.unlock().await?;

    a.await??;
    let (stock, fence): (i64, i64) = db.lock().unwrap().query_row(
        "SELECT stock, last_fence FROM inventory WHERE product_id = 42",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    println!(
        "final: stock {stock}, last_fence {fence} (without the fence check: stock -1, oversold)"
    );
    Ok(())
}
