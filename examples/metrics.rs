//! Lock metrics in Prometheus: three "pods" (clients) sell the last 5 units of a product under
//! one lock, then the scrape is printed as Prometheus would read it.
//!
//! leasehold measures through the `metrics` facade and forces no exporter; here the
//! `metrics-exporter-prometheus` recorder renders the text format (a service would serve it
//! over HTTP with the exporter's `http-listener` feature). Install the recorder *before*
//! building clients: a client registers its metric handles when it is built.
//!
//! Run: `cargo run --example metrics` (uses $REDIS_URL, or starts its own redis-server).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold::LockClient;
use metrics_exporter_prometheus::PrometheusBuilder;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[tokio::main]
async fn main() -> Result<()> {
    let prometheus = PrometheusBuilder::new().install_recorder()?;

    // `$REDIS_URL` if set, otherwise a throwaway redis-server (stopped when `redis` drops).
    let redis = leasehold_testkit::redis_for_tests()?;
    let stock = Arc::new(AtomicI64::new(5)); // the shop's database, for this example
    let mut pods = Vec::new();
    for pod in 0..3 {
        let client = LockClient::connect(&redis.url()).await?;
        let stock = stock.clone();
        pods.push(tokio::spawn(async move {
            let lock = client.lock("inventory:42")?;
            let mut sold = 0;
            for _customer in 0..4 {
                let Some(guard) = lock.try_lock_for(Duration::from_secs(5)).await? else {
                    continue;
                };
                // Read, process the order, write: one pod at a time.
                let left = stock.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                if left > 0 {
                    stock.store(left - 1, Ordering::SeqCst);
                    sold += 1;
                }
                guard.unlock().await?;
            }
            Ok::<_, leasehold::LockError>((pod, sold))
        }));
    }
    for pod in pods {
        let (pod, sold) = pod.await??;
        println!("pod {pod} sold {sold}");
    }
    println!("stock left: {}\n", stock.load(Ordering::SeqCst));

    // The scrape: leasehold's series only.
    let scrape = prometheus.render();
    for line in scrape.lines().filter(|l| l.contains("leasehold_")) {
        println!("{line}");
    }
    assert!(scrape.contains("leasehold_acquisitions_total"));
    Ok(())
}
