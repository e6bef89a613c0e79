//! N sequential RedLock `try_lock` + `unlock` pairs on fresh names over the given servers, or
//! the same with the minimal raw-fred Redlock, for instruction counts (as `pairs.rs`):
//!
//! ```sh
//! cargo build --release -p leasehold-bench --example red_pairs
//! for n in 200 1000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/tmp/red.$n \
//!     target/release/examples/red_pairs red $n URL1 URL2 URL3 URL4 URL5
//! done
//! # (Ir of 1000 - Ir of 200) / 800 = client instructions per pair; `raw` for the baseline
//! ```

use fred::prelude::*;
use leasehold::{LockClient, RedLock};

const RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                       return redis.call('DEL', KEYS[1]) else return 0 end";

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let usage = "usage: red_pairs red|raw N URL...";
    let mut args = std::env::args().skip(1);
    let mode = args.next().ok_or(usage)?;
    let n: usize = args.next().ok_or(usage)?.parse()?;
    let urls: Vec<String> = args.collect();
    match mode.as_str() {
        "red" => {
            let mut clients = Vec::new();
            for url in &urls {
                clients.push(LockClient::connect(url).await?);
            }
            // Generous: under valgrind every answer is slow.
            let red = RedLock::new(clients)?.server_timeout(std::time::Duration::from_secs(5))?;
            for i in 0..n {
                let lock = red.lock(&format!("red:{i}"))?;
                let guard = lock.try_lock().await?.ok_or("a fresh name was held")?;
                guard.unlock().await?;
            }
        }
        "raw" => {
            let mut clients = Vec::new();
            for url in &urls {
                let client = Builder::from_config(Config::from_url(url)?).build()?;
                client.init().await?;
                clients.push(client);
            }
            let quorum = clients.len() / 2 + 1;
            for i in 0..n {
                let key = format!("raw:{i}");
                let id = "owner-1";
                let sets = clients.iter().map(|c| {
                    c.set::<Option<String>, _, _>(
                        &key,
                        id,
                        Some(Expiration::PX(30_000)),
                        Some(SetOptions::NX),
                        false,
                    )
                });
                let granted = futures::future::join_all(sets)
                    .await
                    .into_iter()
                    .filter(|r| matches!(r, Ok(Some(_))))
                    .count();
                if granted < quorum {
                    return Err("a fresh name was held".into());
                }
                let dels = clients
                    .iter()
                    .map(|c| c.eval::<i64, _, _, _>(RELEASE, key.as_str(), id));
                for result in futures::future::join_all(dels).await {
                    result?;
                }
            }
        }
        _ => return Err(usage.into()),
    }
    Ok(())
}
