//! The last items in stock, guarded by a RedLock over five independent Redis servers: two pods
//! sell from one stock; the lock holds while a majority (three) of the servers grants it. Two
//! servers die mid-sale and selling goes on; a third dies and the pods are told plainly that
//! no quorum answers (`QuorumUnreachable`) instead of selling without the lock.
//!
//! Every write is fenced with the grant's `QuorumToken`: the stock keeps the latest token it
//! accepted (per server) and refuses a write from an older grant.
//!
//! Run: `cargo run --example red_lock` (starts five redis-servers of its own; set
//! `REDIS_URLS=redis://a:6379,redis://b:6379,...` to use your own independent servers, in
//! which case nothing is killed).

use std::sync::Arc;
use std::time::Duration;

use leasehold::{LockClient, LockError, QuorumToken, RedLock};
use leasehold_testkit::RedisServer;
use parking_lot::Mutex;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The store: items left, and the latest fencing token it accepted.
struct Stock {
    left: u32,
    latest: QuorumToken,
}

impl Stock {
    /// Takes one item if any is left and the token is not older than one already accepted.
    fn sell_one(&mut self, token: &QuorumToken) -> std::result::Result<bool, &'static str> {
        if token.is_older_than(&self.latest) {
            return Err("refused: a newer holder already wrote");
        }
        self.latest = self.latest.merged(token);
        if self.left == 0 {
            return Ok(false);
        }
        self.left -= 1;
        Ok(true)
    }
}

/// One pod's client per server.
async fn pod(urls: &[String]) -> Result<RedLock> {
    let mut clients = Vec::new();
    for url in urls {
        clients.push(LockClient::connect(url).await?);
    }
    Ok(RedLock::new(clients)?.server_timeout(Duration::from_millis(200))?)
}

/// A pod sells one item under the RedLock.
async fn buy(
    servers: &RedLock,
    pod: &str,
    stock: &Mutex<Stock>,
) -> std::result::Result<(), LockError> {
    let lock = servers.lock("stock:last-items")?;
    let guard = lock.lock_with_lease(Duration::from_secs(5)).await?;
    let members: Vec<usize> = guard.members().map(|(server, _)| server).collect();
    let sold = stock.lock().sell_one(&guard.fencing_token());
    println!("  {pod}: quorum on servers {members:?}: {sold:?}");
    guard.unlock().await
}

#[tokio::main]
async fn main() -> Result<()> {
    let (spawned, urls): (Vec<RedisServer>, Vec<String>) = match std::env::var("REDIS_URLS") {
        Ok(urls) => (Vec::new(), urls.split(',').map(str::to_string).collect()),
        Err(_) => {
            let spawned = (0..5)
                .map(|_| RedisServer::start())
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let urls = spawned.iter().map(RedisServer::url).collect();
            (spawned, urls)
        }
    };
    let (pod_a, pod_b) = (pod(&urls).await?, pod(&urls).await?);
    println!(
        "{} servers, quorum {}",
        pod_a.clients().len(),
        pod_a.quorum()
    );
    let stock = Arc::new(Mutex::new(Stock {
        left: 5,
        latest: QuorumToken::from_tokens([]),
    }));

    println!("all servers up:");
    for _ in 0..2 {
        let (a, b) = tokio::join!(buy(&pod_a, "pod-a", &stock), buy(&pod_b, "pod-b", &stock));
        a?;
        b?;
    }

    if spawned.len() == 5 {
        spawned[0].kill()?;
        spawned[3].kill()?;
        println!("two servers killed:");
        let (a, b) = tokio::join!(buy(&pod_a, "pod-a", &stock), buy(&pod_b, "pod-b", &stock));
        a?;
        b?;

        spawned[4].kill()?;
        println!("a third server killed:");
        let lock = pod_a.lock("stock:last-items")?;
        match lock.try_lock_for(Duration::from_millis(500)).await {
            Err(error @ LockError::QuorumUnreachable { .. }) => println!("  pod-a: {error}"),
            other => return Err(format!("expected QuorumUnreachable, got {other:?}").into()),
        };
    }
    let left = stock.lock().left;
    println!("items left: {left}");
    assert_eq!(left, if spawned.len() == 5 { 0 } else { 1 });
    Ok(())
}
