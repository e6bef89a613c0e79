//! N sequential `try_lock` + `unlock` pairs on fresh names, for instruction counts.
//!
//! Wall-clock ratios on a shared 2-core VM move by ±0.1 from run to run; instruction counts
//! repeat exactly. Count a build's cost per pair with callgrind, twice, and take the
//! difference so that start-up cancels:
//!
//! ```sh
//! cargo build --release -p leasehold-bench --example pairs
//! for n in 500 2500; do
//!   valgrind --tool=callgrind --callgrind-out-file=/tmp/pairs.$n \
//!     target/release/examples/pairs redis://127.0.0.1:PORT $n
//! done
//! # (Ir of 2500 - Ir of 500) / 2000 = client instructions per pair
//! ```
//!
//! For redis-server's share, run the server itself under callgrind the same way (one fresh
//! server per N), after `pairs URL warm 2500` (run natively) has created the fencing counters
//! of the names both runs use: a long-running deployment has its per-slot counters already,
//! and creating one is a cost of the first grant in a slot, not of every pair. Both runs warm
//! the same 2500 names, so the warm-up cancels in the difference.

use fred::prelude::*;
use fred::types::SetOptions;
use leasehold::LockClient;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args.next().ok_or("usage: pairs REDIS_URL N")?;
    let n = args
        .next()
        .ok_or("usage: pairs REDIS_URL N | pairs REDIS_URL warm N")?;
    let client = LockClient::connect(&url).await?;
    if n == "warm" {
        let n: usize = args
            .next()
            .ok_or("usage: pairs REDIS_URL warm N")?
            .parse()?;
        for i in 0..n {
            let lock = client.lock(&format!("pairs:{i}"))?;
            let _: Option<String> = client
                .redis()
                .set(lock.keys().fence(), "1", None, Some(SetOptions::NX), false)
                .await?;
        }
        return Ok(());
    }
    let n: usize = n.parse()?;
    for i in 0..n {
        let lock = client.lock(&format!("pairs:{i}"))?;
        let guard = lock.try_lock().await?.ok_or("a fresh name was held")?;
        guard.unlock().await?;
    }
    Ok(())
}
