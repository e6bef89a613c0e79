//! The fair lock: a flash sale with 3 items left. Six customers order one after another, their
//! requests landing on three pods; a stock count holds the lock meanwhile. Through
//! `client.fair_lock` they are served in the order they asked, across every pod, so the first
//! three to ask get the items. One customer closes the tab while waiting: her place in line
//! goes at once. Then the same arrivals through the plain lock, whose turns go by pod.
//!
//! Run: `cargo run --example fair_lock` (uses $REDIS_URL, or starts its own redis-server).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::interfaces::SortedSetsInterface;
use leasehold::{Lock, LockClient};
use tokio::task::JoinHandle;
use tokio::time::Instant;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Who asks, in this order, and on which pod their request lands (an index into the pods).
const ORDERS: [(&str, usize); 6] = [
    ("alice", 0),
    ("bob", 0),
    ("carol", 1),
    ("dave", 0),
    ("eve", 1),
    ("frank", 2),
];
const PODS: [&str; 3] = ["pod-a", "pod-b", "pod-c"];
/// Eve closes the tab while she waits: her acquire future is dropped.
const GIVES_UP: &str = "eve";

/// One sale: the stock left, and who got into the critical section, in order.
struct Sale {
    stock: AtomicU32,
    served: Mutex<Vec<&'static str>>,
}

/// A customer's order: wait for the stock lock, then sell one item if any is left.
fn order(lock: Lock, customer: &'static str, pod: &'static str, sale: Arc<Sale>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let guard = lock.lock().await.expect("the stock lock");
        sale.served.lock().unwrap().push(customer);
        let left = sale.stock.load(Ordering::SeqCst);
        let outcome = if left > 0 {
            tokio::time::sleep(Duration::from_millis(30)).await; // the payment call
            sale.stock.store(left - 1, Ordering::SeqCst);
            format!("bought one ({} left)", left - 1)
        } else {
            "sold out".to_string()
        };
        println!(
            "  {customer:<5} on {pod}: token {}, {outcome}",
            guard.fencing_token()
        );
        guard.unlock().await.expect("released");
    })
}

/// Asks `ready` every 5 ms until it says yes (10 s at most). Used to let each customer get in
/// line before the next one asks, so that the arrival order is the order of `ORDERS`.
async fn until<F: std::future::Future<Output = Result<bool>>>(
    what: &str,
    mut ready: impl FnMut() -> F,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready().await? {
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// Plays the sale through `make` (a fair or a plain lock on each pod); returns who was served,
/// in order. `queued(n)` tells whether exactly `n` customers are in line.
async fn sale<F: std::future::Future<Output = Result<bool>>>(
    pods: &[LockClient],
    make: impl Fn(&LockClient) -> leasehold::Result<Lock>,
    queued: impl Fn(usize) -> F,
) -> Result<Vec<&'static str>> {
    let sale = Arc::new(Sale {
        stock: AtomicU32::new(3),
        served: Mutex::new(Vec::new()),
    });
    // The stock count on pod-a holds the lock while the orders come in.
    let counting = make(&pods[0])?;
    let stock_count = counting.lock().await?;
    let mut customers = Vec::new();
    for (n, (customer, pod)) in ORDERS.into_iter().enumerate() {
        let lock = make(&pods[pod])?;
        customers.push((customer, order(lock, customer, PODS[pod], sale.clone())));
        until(&format!("{customer} in line"), || queued(n + 1)).await?;
    }
    let (_, eve) = customers.remove(ORDERS.iter().position(|(c, _)| *c == GIVES_UP).unwrap());
    eve.abort();
    assert!(eve.await.unwrap_err().is_cancelled());
    until("eve's place to go", || queued(ORDERS.len() - 1)).await?;
    stock_count.unlock().await?;
    // No barging: a try right after the release does not take the lock past the line (the
    // release granted it to the next in line).
    let barged = counting.try_lock().await?;
    println!(
        "  stock count released; a try_lock on {} right after -> {:?}",
        PODS[0],
        barged.as_ref().map(|g| g.fencing_token())
    );
    assert!(barged.is_none(), "try_lock took the lock past the line");
    for (_, customer) in customers {
        tokio::time::timeout(Duration::from_secs(10), customer).await??;
    }
    let served = sale.served.lock().unwrap().clone();
    Ok(served)
}

#[tokio::main]
async fn main() -> Result<()> {
    // `$REDIS_URL` if set, otherwise a throwaway redis-server (stopped when `redis` drops).
    let redis = leasehold_testkit::redis_for_tests()?;
    // One client per pod.
    let mut pods = Vec::new();
    for _ in PODS {
        pods.push(LockClient::connect(&redis.url()).await?);
    }
    let arrivals: Vec<&str> = ORDERS
        .iter()
        .map(|(c, _)| *c)
        .filter(|c| *c != GIVES_UP)
        .collect();

    // The fair lock: every waiter has its own entry in `leasehold:{stock:sku-42}:waiters`,
    // in arrival order (Redis server time). A customer is in line once their entry is there.
    let fair = pods[0].fair_lock("stock:sku-42")?;
    let waiters = fair.keys().waiters();
    println!(
        "fair lock {} (is_fair: {})",
        fair.keys().hash(),
        fair.is_fair()
    );
    for (customer, pod) in ORDERS {
        println!("  {customer:<5} asks on {}", PODS[pod]);
    }
    println!("  ({GIVES_UP} closes the tab while waiting; then the stock count ends)");
    let queued_fair = |n: usize| {
        let (redis, waiters) = (pods[0].redis().clone(), waiters.clone());
        async move {
            let queued: usize = redis.zcard(waiters.as_str()).await?;
            Ok(queued == n)
        }
    };
    let served = sale(&pods, |pod| pod.fair_lock("stock:sku-42"), queued_fair).await?;
    println!("fair lock: served {served:?}");
    assert_eq!(served, arrivals, "served in arrival order");
    let left: usize = pods[0].redis().zcard(waiters.as_str()).await?;
    assert_eq!(left, 0, "no entry left behind");

    // The plain lock: FIFO within a pod, turns between pods (docs/guide.md, "Waiting and
    // timeouts"). A customer is in line once their pod has a local waiter for them. pod-a's
    // second customer waits for pod-b's and pod-c's turns, so bob, who asked second, can lose
    // the last items to frank, who asked last.
    println!(
        "plain lock {}, same arrivals",
        pods[0].lock("stock:sku-43")?.keys().hash()
    );
    let queued_plain = |n: usize| {
        let counts: Vec<usize> = pods.iter().map(LockClient::waiters).collect();
        async move {
            let ready = counts.iter().sum::<usize>() == n;
            // The local waiter has joined; give its first try and subscription time to land.
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok(ready)
        }
    };
    let plain = sale(&pods, |pod| pod.lock("stock:sku-43"), queued_plain).await?;
    println!("plain lock: served {plain:?}");
    Ok(())
}
