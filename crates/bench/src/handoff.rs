//! Contended handoff: W workers take one lock in turn, hold it ~1 ms, release, and ask again at
//! once, with the plain lock and with the fair lock, each woken by release messages and by a
//! timer (`Waking::timer()`: no pub/sub). Compared with two polling locks written
//! here: SET NX PX + a fixed sleep of 100 ms
//! (redis-py's Lock default) and of 10 ms (npm redis-semaphore).
//!
//! Two layouts ([`Layout`]): `handoff` spreads the workers over 4 clients (several waiters per
//! client), `handoff_per_process` gives each worker a client of its own, as when every pod or
//! worker process runs one `LockClient` and one waiter: the common deployment.
//!
//! Pollers look good on the gap median because the releaser grabs the lock straight back while
//! the others sleep; that is why workers served and the longest wait are reported.

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;
use fred::types::Expiration;
use fred::types::SetOptions;
use hdrhistogram::Histogram;
use leasehold::LockClient;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::time::Instant;

use crate::redis_stats::{Admin, LEASEHOLD_COMMANDS, POLLING_COMMANDS};

const HOLD: Duration = Duration::from_millis(1);
const NAME: &str = "bench:handoff";

/// Round trips are counted over the steady part of the run, leaving out this long at both
/// ends: the one-time work at the start (each client's SUBSCRIBE, each worker's first try
/// before it subscribed) and at the end (the last waits timing out, with one last try each and
/// a ZREM leaving the queue) is not a per-acquisition cost.
fn warm_up(duration: Duration) -> Duration {
    (duration / 10).min(Duration::from_secs(1))
}

/// How the workers are spread over clients, and how they hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// 4 clients, workers round-robin over them; the hold is a tokio sleep.
    Shared,
    /// One client per worker; the hold is a 1 ms sleep on the blocking pool (tokio's timer
    /// rounds a 1 ms sleep up to about 2 ms, which would hide the handoff's own cost).
    PerProcess,
}

impl Layout {
    fn clients(self, waiters: usize) -> usize {
        match self {
            Layout::Shared => 4,
            Layout::PerProcess => waiters,
        }
    }
}

async fn hold(layout: Layout) -> anyhow::Result<()> {
    match layout {
        Layout::Shared => tokio::time::sleep(HOLD).await,
        Layout::PerProcess => tokio::task::spawn_blocking(|| std::thread::sleep(HOLD)).await?,
    }
    Ok(())
}

/// [`hold`], returning how long it took.
async fn timed_hold(layout: Layout) -> anyhow::Result<Duration> {
    let start = Instant::now();
    hold(layout).await?;
    Ok(start.elapsed())
}

/// Which lock the workers use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Leasehold,
    /// leasehold's fair lock (`client.fair_lock`): strict arrival order, each waiter woken
    /// alone on its own channel.
    Fair,
    /// The plain lock on clients that wait without pub/sub (`Waking::timer()`).
    Timer,
    /// The fair lock on clients that wait without pub/sub.
    FairTimer,
    /// SET NX PX, and on failure sleep this long before retrying.
    Polling(Duration),
}

impl Kind {
    fn fair(self) -> bool {
        matches!(self, Kind::Fair | Kind::FairTimer)
    }
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct Handoff {
    pub(crate) waiters: usize,
    pub(crate) acquisitions: u64,
    pub(crate) acq_per_sec: f64,
    pub(crate) gap_p50_us: u64,
    pub(crate) gap_p99_us: u64,
    /// From the moment a holder's critical section ended (its release began) to the next
    /// holder's acquisition, median: what a handoff costs in wall time, however the lock
    /// passes (a grant message, or a poller's release and new try).
    pub(crate) handoff_p50_us: u64,
    pub(crate) round_trips_per_acquisition: f64,
    pub(crate) workers_served: usize,
    pub(crate) max_wait_ms: f64,
    /// The benchmark process's CPU time (all clients, workers and fred's tasks) per
    /// acquisition, over the whole run: what one handoff costs the clients.
    pub(crate) client_cpu_us_per_acquisition: f64,
    /// The mean time a holder spent in its critical section (the 1 ms hold as this machine
    /// ran it), and the acquisitions per second if handoffs took no time at all: the ceiling
    /// no lock can pass in this scenario, against which `acq_per_sec` is read.
    pub(crate) hold_mean_us: f64,
    pub(crate) hold_limit_acq_per_sec: f64,
    /// Gap percentiles (p, µs) for the plot; not part of the JSON contract.
    #[serde(skip)]
    pub(crate) gap_curve: Vec<(f64, u64)>,
}

struct Hold {
    acquired: Instant,
    /// How long the critical section took: `acquired + held` is when its release began.
    held: Duration,
    released: Instant,
}

#[derive(Default)]
struct Record {
    holds: Vec<Hold>,
    /// The time spent in [`hold`], summed over the holds.
    held: Duration,
    max_wait: Duration,
    served: Vec<u64>,
}

pub(crate) async fn run(
    url: &str,
    admin: &Admin,
    kind: Kind,
    layout: Layout,
    waiters: usize,
    duration: Duration,
) -> anyhow::Result<Handoff> {
    let record = Arc::new(Mutex::new(Record {
        served: vec![0; waiters],
        ..Record::default()
    }));
    let mut clients = Vec::new();
    let waking = match kind {
        Kind::Timer | Kind::FairTimer => leasehold::Waking::timer(),
        _ => leasehold::Waking::PubSub,
    };
    for _ in 0..layout.clients(waiters) {
        clients.push(LockClient::builder(url).waking(waking).build().await?);
    }
    let release = Script::from_lua(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    );
    if let Kind::Polling(_) = kind {
        for client in &clients {
            let _: String = client
                .redis()
                .script_load(release.lua().unwrap().to_string())
                .await?;
        }
    }
    let started = Instant::now();
    let cpu = cpu_time::ProcessTime::now();
    let end = started + duration;
    let mut handles = Vec::new();
    for worker in 0..waiters {
        let client = clients[worker % clients.len()].clone();
        let record = record.clone();
        let release = release.clone();
        handles.push(tokio::spawn(async move {
            match kind {
                Kind::Leasehold | Kind::Fair | Kind::Timer | Kind::FairTimer => {
                    leasehold_worker(client, layout, kind, worker, end, record).await
                }
                Kind::Polling(sleep) => {
                    polling_worker(client, layout, worker, end, sleep, release, record).await
                }
            }
        }));
    }
    tokio::time::sleep_until(started + warm_up(duration)).await;
    admin.reset_stats().await?;
    let window_start = Instant::now();
    tokio::time::sleep_until(end - warm_up(duration)).await;
    let commands = match kind {
        Kind::Leasehold | Kind::Fair | Kind::Timer | Kind::FairTimer => LEASEHOLD_COMMANDS,
        Kind::Polling(_) => POLLING_COMMANDS,
    };
    let round_trips = admin.calls(commands).await?;
    let window_end = Instant::now();
    if std::env::var_os("LEASEHOLD_BENCH_DEBUG").is_some() {
        eprintln!("{kind:?}: {}", admin.commandstats().await?);
    }
    for handle in handles {
        handle.await??;
    }
    let elapsed = started.elapsed();
    let cpu_used = cpu.elapsed();
    let mut record = Arc::try_unwrap(record)
        .map_err(|_| anyhow::anyhow!("workers still hold the record"))?
        .into_inner();
    record.holds.sort_by_key(|h| h.acquired);
    let mut gaps = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut handoffs = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for pair in record.holds.windows(2) {
        let gap = pair[1].acquired.saturating_duration_since(pair[0].released);
        gaps.record((gap.as_micros() as u64).max(1))?;
        let handoff = pair[1]
            .acquired
            .saturating_duration_since(pair[0].acquired + pair[0].held);
        handoffs.record((handoff.as_micros() as u64).max(1))?;
    }
    let acquisitions = record.holds.len() as u64;
    let hold_mean = record.held / acquisitions.max(1) as u32;
    let in_window = record
        .holds
        .iter()
        .filter(|h| h.acquired >= window_start && h.acquired <= window_end)
        .count() as u64;
    let gap_curve = [50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 100.0]
        .iter()
        .map(|p| (*p, gaps.value_at_percentile(*p)))
        .collect();
    Ok(Handoff {
        waiters,
        acquisitions,
        acq_per_sec: acquisitions as f64 / elapsed.as_secs_f64(),
        gap_p50_us: gaps.value_at_quantile(0.50),
        gap_p99_us: gaps.value_at_quantile(0.99),
        handoff_p50_us: handoffs.value_at_quantile(0.50),
        round_trips_per_acquisition: round_trips as f64 / in_window.max(1) as f64,
        workers_served: record.served.iter().filter(|n| **n > 0).count(),
        max_wait_ms: record.max_wait.as_secs_f64() * 1000.0,
        client_cpu_us_per_acquisition: cpu_used.as_secs_f64() * 1e6 / acquisitions.max(1) as f64,
        hold_mean_us: hold_mean.as_secs_f64() * 1e6,
        hold_limit_acq_per_sec: 1.0 / hold_mean.as_secs_f64().max(1e-9),
        gap_curve,
    })
}

async fn leasehold_worker(
    client: LockClient,
    layout: Layout,
    kind: Kind,
    worker: usize,
    end: Instant,
    record: Arc<Mutex<Record>>,
) -> anyhow::Result<()> {
    let lock = if kind.fair() {
        client.fair_lock(NAME)?
    } else {
        client.lock(NAME)?
    };
    loop {
        let asked = Instant::now();
        if asked >= end {
            return Ok(());
        }
        let guard = match layout {
            Layout::Shared => lock.try_lock_for(end - asked).await?,
            // As a worker process would: an explicit lease, no watchdog.
            Layout::PerProcess => {
                lock.try_lock_for_with_lease(end - asked, Duration::from_secs(30))
                    .await?
            }
        };
        let acquired = Instant::now();
        note_wait(&record, acquired - asked);
        let Some(guard) = guard else { return Ok(()) };
        let held = timed_hold(layout).await?;
        guard.unlock().await?;
        note_hold(&record, worker, acquired, held, Instant::now());
    }
}

async fn polling_worker(
    client: LockClient,
    layout: Layout,
    worker: usize,
    end: Instant,
    sleep: Duration,
    release: Script,
    record: Arc<Mutex<Record>>,
) -> anyhow::Result<()> {
    let redis = client.redis().clone();
    let token = format!("worker-{worker}");
    loop {
        let asked = Instant::now();
        if asked >= end {
            return Ok(());
        }
        let acquired = loop {
            let set: Option<String> = redis
                .set(
                    NAME,
                    token.as_str(),
                    Some(Expiration::PX(30_000)),
                    Some(SetOptions::NX),
                    false,
                )
                .await?;
            if set.is_some() {
                break Some(Instant::now());
            }
            if Instant::now() + sleep >= end {
                break None;
            }
            tokio::time::sleep(sleep).await;
        };
        let Some(acquired) = acquired else {
            note_wait(&record, Instant::now() - asked);
            return Ok(());
        };
        note_wait(&record, acquired - asked);
        let held = timed_hold(layout).await?;
        let _: i64 = redis
            .evalsha(&**release.sha1(), NAME, token.as_str())
            .await?;
        note_hold(&record, worker, acquired, held, Instant::now());
    }
}

fn note_wait(record: &Mutex<Record>, wait: Duration) {
    let mut record = record.lock();
    record.max_wait = record.max_wait.max(wait);
}

fn note_hold(
    record: &Mutex<Record>,
    worker: usize,
    acquired: Instant,
    held: Duration,
    released: Instant,
) {
    let mut record = record.lock();
    record.holds.push(Hold {
        acquired,
        held,
        released,
    });
    record.held += held;
    record.served[worker] += 1;
}
