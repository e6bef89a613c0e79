//! The seed's 2 a.m. report: three instances fire the same job, exactly one runs it.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{exists, server};
use leasehold::schedule::{run_once, RunOnce, RunOnceOptions};
use leasehold::LockError;
use tokio::sync::Barrier;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_pods_fire_the_daily_report_and_exactly_one_runs_it() {
    let redis = server();
    let runs = Arc::new(AtomicUsize::new(0));
    let skipped = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(3));
    let mut pods = Vec::new();
    for pod in 1..=3 {
        let url = redis.url();
        let runs = runs.clone();
        let skipped = skipped.clone();
        let barrier = barrier.clone();
        pods.push(tokio::spawn(async move {
            let client = common::client(&url).await;
            let lock = client.lock("lock:daily-report").unwrap();
            barrier.wait().await;
            let options = RunOnceOptions::at_most(Duration::from_secs(60));
            let outcome = run_once(&lock, options, async {
                runs.fetch_add(1, Ordering::SeqCst);
                // The job runs until the other two pods have fired (and been skipped), however
                // late the scheduler lets them run.
                common::eventually(Duration::from_secs(30), || {
                    skipped.load(Ordering::SeqCst) == 2
                })
                .await;
                format!("[pod-{pod}] report generated")
            })
            .await
            .unwrap();
            if let RunOnce::Skipped = outcome {
                skipped.fetch_add(1, Ordering::SeqCst);
            }
            (pod, outcome)
        }));
    }
    let mut ran = 0;
    for pod in pods {
        match pod.await.unwrap() {
            (_, RunOnce::Ran(_)) => ran += 1,
            (_, RunOnce::Skipped) => {}
        }
    }
    assert_eq!(ran, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(
        !exists(&redis, "leasehold:{lock:daily-report}"),
        "released after the run"
    );
}

#[tokio::test]
async fn hold_at_least_keeps_late_instances_out() {
    let redis = server();
    let early = common::client(&redis.url()).await;
    let late = common::client(&redis.url()).await;
    let options = RunOnceOptions::at_most(Duration::from_secs(60)).at_least(Duration::from_secs(5));
    let lock = early.lock("report").unwrap();
    assert_eq!(
        run_once(&lock, options, async { 1 }).await.unwrap(),
        RunOnce::Ran(1)
    );
    // The job was instant, but the lock stays for the rest of the 5 s (long enough that a busy
    // machine cannot stall past it between these lines).
    let pttl = common::cmd(&redis, &["PTTL", "leasehold:{report}"])
        .as_int()
        .unwrap();
    assert!(pttl > 0 && pttl <= 5_000, "{pttl}");
    let late_lock = late.lock("report").unwrap();
    assert_eq!(
        run_once(&late_lock, options, async { 2 }).await.unwrap(),
        RunOnce::Skipped
    );
    assert!(
        common::eventually(Duration::from_secs(15), || !exists(
            &redis,
            "leasehold:{report}"
        ))
        .await
    );
    assert_eq!(
        run_once(&late_lock, options, async { 3 }).await.unwrap(),
        RunOnce::Ran(3)
    );
}

#[tokio::test]
async fn inconsistent_options_are_refused() {
    let redis = server();
    let client = common::client(&redis.url()).await;
    let lock = client.lock("report").unwrap();
    let options = RunOnceOptions::at_most(Duration::from_secs(1)).at_least(Duration::from_secs(2));
    assert!(matches!(
        run_once(&lock, options, async {}).await,
        Err(LockError::InvalidArgument(_))
    ));
}
