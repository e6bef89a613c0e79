//! The metrics (`leasehold_core::telemetry`) against what happened: a contended run, refused
//! tries, a timed-out wait, renewals, a lost lease and a subscriber reconnect, counted by a
//! recording `metrics` recorder. One test: the recorder is process-global.
#![cfg(feature = "metrics")]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{client, client_with_lease, cmd, eventually, server};
use leasehold_core::telemetry::names;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::time::Instant;

/// A metric's name and its labels, sorted.
type Series = (String, Vec<(String, String)>);

/// Everything recorded so far. A snapshot drains the recorder (counters and gauges are swapped
/// to zero, histograms emptied), so snapshots are merged: counters and gauges add up, and
/// histogram values are kept.
#[derive(Default)]
struct Seen {
    counters: HashMap<Series, u64>,
    gauges: HashMap<String, f64>,
    histograms: HashMap<Series, Vec<f64>>,
}

impl Seen {
    fn take(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            labels.sort();
            let name = key.name().to_string();
            match value {
                DebugValue::Counter(n) => *self.counters.entry((name, labels)).or_default() += n,
                DebugValue::Gauge(v) => *self.gauges.entry(name).or_default() += v.into_inner(),
                DebugValue::Histogram(values) => self
                    .histograms
                    .entry((name, labels))
                    .or_default()
                    .extend(values.into_iter().map(|v| v.into_inner())),
            }
        }
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.counters.get(&key(name, labels)).copied().unwrap_or(0)
    }

    fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> &[f64] {
        self.histograms
            .get(&key(name, labels))
            .map_or(&[], Vec::as_slice)
    }

    fn gauge(&self, name: &str) -> f64 {
        self.gauges.get(name).copied().unwrap_or(0.0)
    }
}

fn key(name: &str, labels: &[(&str, &str)]) -> Series {
    let mut labels: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.sort();
    (name.to_string(), labels)
}

const LOCK: &[(&str, &str)] = &[("kind", "lock")];

fn outcome(outcome: &'static str) -> [(&'static str, &'static str); 2] {
    [("kind", "lock"), ("outcome", outcome)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contended_run_is_counted_as_it_happened() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder in this test binary");
    let mut seen = Seen::default();
    let redis = server();
    let a = client(&redis.url()).await;
    let b = client(&redis.url()).await;

    // 1. Four workers over two clients take one lock 10 times each.
    let mut workers = Vec::new();
    for worker in 0..4 {
        let client = if worker % 2 == 0 {
            a.clone()
        } else {
            b.clone()
        };
        workers.push(tokio::spawn(async move {
            let lock = client.lock("stock").unwrap();
            for _ in 0..10 {
                let guard = lock
                    .try_lock_for(Duration::from_secs(20))
                    .await
                    .unwrap()
                    .expect("a 20 s wait for 5 ms holds");
                tokio::time::sleep(Duration::from_millis(5)).await;
                guard.unlock().await.unwrap();
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    let mut granted = 40;

    // 2. Three refused tries and one timed-out wait on a lock A holds for at least 300 ms.
    let report_a = a.lock("report").unwrap();
    let report_b = b.lock("report").unwrap();
    let held = report_a.lock().await.unwrap();
    granted += 1;
    let held_since = Instant::now();
    for _ in 0..3 {
        assert!(report_b.try_lock().await.unwrap().is_none());
    }
    assert!(report_b
        .try_lock_for(Duration::from_millis(100))
        .await
        .unwrap()
        .is_none());
    // 3. A wait of about 200 ms, ended by the release message.
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            let lock = b.lock("report").unwrap();
            let started = Instant::now();
            let guard = lock
                .try_lock_for(Duration::from_secs(20))
                .await
                .unwrap()
                .expect("granted after the release");
            let waited = started.elapsed();
            guard.unlock().await.unwrap();
            waited
        })
    };
    tokio::time::sleep_until(held_since + Duration::from_millis(300)).await;
    held.unlock().await.unwrap();
    let waited = waiter.await.unwrap();
    granted += 1;

    // 4. Renewals: a watched hold on a 900 ms lease (renewed every 300 ms), kept until the
    // watchdog renewed it twice.
    let short = client_with_lease(&redis.url(), Duration::from_millis(900)).await;
    let renewed = short.lock("renewed").unwrap();
    let guard = renewed.lock().await.unwrap();
    granted += 1;
    let twice = eventually(Duration::from_secs(20), || {
        short.watchdog_stats().renewed >= 2
    })
    .await;
    assert!(twice, "two renewals: {:?}", short.watchdog_stats());
    guard.unlock().await.unwrap();

    // 5. A lost lease: force-unlocked under a watched guard.
    let lost = short.lock("lost").unwrap();
    let guard = lost.lock().await.unwrap();
    granted += 1;
    assert!(a.lock("lost").unwrap().force_unlock().await.unwrap());
    tokio::time::timeout(Duration::from_secs(20), guard.lost())
        .await
        .expect("the watchdog finds the grant gone");
    drop(guard);

    // 6. A subscriber reconnect: B waits (subscribed) on a lock A holds while Redis kills
    // every subscriber connection.
    let kill = a.lock("kill").unwrap();
    let held = kill.lock().await.unwrap();
    granted += 1;
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            let lock = b.lock("kill").unwrap();
            let guard = lock.try_lock_for(Duration::from_secs(30)).await.unwrap();
            guard
                .expect("granted after the release")
                .unlock()
                .await
                .unwrap();
        })
    };
    let subscribed = eventually(Duration::from_secs(20), || {
        let channel = common::client_channel(&b, "kill");
        let reply = cmd(&redis, &["PUBSUB", "NUMSUB", channel.as_str()]);
        reply.as_array().and_then(|r| r[1].as_int()) == Some(1)
    })
    .await;
    assert!(subscribed, "the waiter subscribed");
    cmd(&redis, &["CLIENT", "KILL", "TYPE", "pubsub"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.counter(names::RECONNECTS, &[]) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        seen.take(&snapshotter);
    }
    held.unlock().await.unwrap();
    waiter.await.unwrap();
    granted += 1;
    // Every guard is gone; the background releases of dropped guards are settled by now.
    let settled = eventually(Duration::from_secs(20), || {
        a.watchdog_stats().holds == 0
            && b.watchdog_stats().holds == 0
            && short.watchdog_stats().holds == 0
    })
    .await;
    assert!(settled);
    seen.take(&snapshotter);

    assert_eq!(
        seen.counter(names::ACQUISITIONS, &outcome("granted")),
        granted
    );
    assert_eq!(seen.counter(names::ACQUISITIONS, &outcome("busy")), 3);
    assert_eq!(seen.counter(names::ACQUISITIONS, &outcome("timed_out")), 1);
    assert_eq!(seen.counter(names::ACQUISITIONS, &outcome("error")), 0);

    let waits = seen.histogram(names::WAIT, LOCK);
    assert_eq!(waits.len() as u64, granted, "one wait per grant");
    // The library measures inside the call the test timed.
    let waited = waited.as_secs_f64();
    assert!(
        waits.iter().any(|&w| w <= waited && waited - w < 0.05),
        "the wait on the held lock ({waited} s) is among {waits:?}"
    );

    let holds = seen.histogram(names::HOLD, LOCK);
    assert_eq!(
        holds.len() as u64,
        granted,
        "one hold time per released guard"
    );
    assert!(
        holds.iter().any(|&h| h >= 0.3),
        "the 300 ms hold: {holds:?}"
    );
    assert!(holds.iter().filter(|&&h| h >= 0.005).count() >= 40);

    let handoffs = seen.histogram(names::HANDOFF, LOCK);
    assert!(
        !handoffs.is_empty() && handoffs.len() as u64 <= granted,
        "contended grants after a release message: {handoffs:?}"
    );

    let renewed = seen.counter(names::RENEWALS, &[("outcome", "renewed")]);
    assert!(renewed >= 2, "renewals: {renewed}");
    assert_eq!(
        renewed,
        short.watchdog_stats().renewed,
        "one count per renewed grant"
    );
    assert_eq!(seen.counter(names::RENEWALS, &[("outcome", "lost")]), 1);
    assert_eq!(seen.counter(names::LEASES_LOST, &[]), 1);
    assert!(!seen.histogram(names::RENEWAL_LAG, &[]).is_empty());

    assert_eq!(seen.gauge(names::HOLDS), 0.0, "every grant ended");
    assert_eq!(seen.gauge(names::WAITERS), 0.0, "nobody waits");
    assert!(seen.counter(names::RECONNECTS, &[]) >= 1);

    // 6. Every other kind under its own label: a grant on A, a waiter on B woken by the release.
    let lock_granted = seen.counter(names::ACQUISITIONS, &outcome("granted"));
    let lock_handoffs = seen.histogram(names::HANDOFF, LOCK).len();
    // Each waiter is asleep in line (its entry queued by a subscribed try) before the release.
    let fair = (a.fair_lock("menu").unwrap(), b.fair_lock("menu").unwrap());
    let line = fair.0.keys().waiters();
    let held = fair.0.lock().await.unwrap();
    let waiter = tokio::spawn(async move {
        let guard = fair.1.try_lock_for(Duration::from_secs(20)).await;
        guard.unwrap().expect("granted").unlock().await.unwrap();
    });
    common::until_queued(&redis, &line, 1).await;
    held.unlock().await.unwrap();
    waiter.await.unwrap();
    let (rw_a, rw_b) = (a.rw_lock("board").unwrap(), b.rw_lock("board").unwrap());
    let line = rw_a.write().keys().waiters();
    let held = rw_a.write().lock().await.unwrap();
    let waiter = tokio::spawn(async move {
        let guard = rw_b.read().try_lock_for(Duration::from_secs(20)).await;
        guard.unwrap().expect("granted").unlock().await.unwrap();
    });
    common::until_queued(&redis, &line, 1).await;
    held.unlock().await.unwrap();
    waiter.await.unwrap();
    let (sem_a, sem_b) = (
        a.semaphore("exports").unwrap(),
        b.semaphore("exports").unwrap(),
    );
    let line = sem_a.keys().waiters();
    assert!(sem_a.try_set_permits(1).await.unwrap());
    let held = sem_a.acquire(1).await.unwrap();
    let waiter = tokio::spawn(async move {
        let permit = sem_b.try_acquire_for(1, Duration::from_secs(20)).await;
        permit.unwrap().expect("granted").release().await.unwrap();
    });
    common::until_queued(&redis, &line, 1).await;
    held.release().await.unwrap();
    waiter.await.unwrap();
    let latch = a.latch("ready").unwrap();
    assert!(latch.try_set_count(1).await.unwrap());
    let waiter = {
        let latch = b.latch("ready").unwrap();
        tokio::spawn(async move { latch.wait_for(Duration::from_secs(20)).await })
    };
    assert!(eventually(Duration::from_secs(10), || b.waiters() == 1).await);
    latch.count_down().await.unwrap();
    assert!(waiter.await.unwrap().unwrap());
    seen.take(&snapshotter);
    for (kind, grants) in [
        ("fair", 2),
        ("rwlock_write", 1),
        ("rwlock_read", 1),
        ("semaphore", 2),
    ] {
        let labels = [("kind", kind), ("outcome", "granted")];
        assert_eq!(
            seen.counter(names::ACQUISITIONS, &labels),
            grants,
            "{kind}: its grants under its own label"
        );
        assert_eq!(
            seen.histogram(names::HOLD, &[("kind", kind)]).len() as u64,
            grants,
            "{kind}: one hold time per released guard"
        );
    }
    // Whether a waiter's grant counts as a handoff depends on whether it was asleep when the
    // release came (a grant by the try right after subscribing is none): only that no
    // handoff of these kinds went to the plain lock's label is certain.
    assert_eq!(
        seen.histogram(names::HANDOFF, LOCK).len(),
        lock_handoffs,
        "no handoff of the other kinds counted as the plain lock's"
    );
    assert_eq!(
        seen.counter(names::ACQUISITIONS, &outcome("granted")),
        lock_granted,
        "nothing of the other kinds counted as the plain lock's"
    );
    assert_eq!(seen.gauge(names::HOLDS), 0.0, "every grant ended");
}
