//! The renewal service: one task per client renews all watched grants in batches.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::commands::{self, Renewal};
use leasehold_core::scripts::Scripts;
use leasehold_core::telemetry::{self, WatchdogMetrics};
use leasehold_core::{Lease, LockError, ReplicaSync};
use parking_lot::Mutex;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::table::State;

/// The boxed future a [`Renewer`] returns.
pub type RenewFuture = Pin<Box<dyn Future<Output = Result<Vec<bool>, LockError>> + Send>>;

/// Sends one batch of renewals with one lease; answers, in order, whether each grant was still
/// held. [`ScriptRenewer`] does it with the renew script; tests of timing may record calls
/// instead.
pub trait Renewer: Send + Sync + 'static {
    /// Renews `holds` with `lease`.
    fn renew(&self, holds: Vec<Renewal>, lease: Lease) -> RenewFuture;
}

/// Renewal through the renew script, bounded by a timeout.
#[derive(Clone, Debug)]
pub struct ScriptRenewer {
    /// The command connection.
    pub client: leasehold_core::Redis,
    /// The client's scripts.
    pub scripts: Arc<Scripts>,
    /// How long to wait for a batch's reply.
    pub timeout: Duration,
    /// The client's replica sync policy: a batch counts as renewed only once the replicas it
    /// asks for have it (`WAIT` after the script); otherwise it failed, and each grant keeps
    /// the deadline its last synced renewal gave it.
    pub sync: ReplicaSync,
}

impl Renewer for ScriptRenewer {
    fn renew(&self, holds: Vec<Renewal>, lease: Lease) -> RenewFuture {
        let this = self.clone();
        Box::pin(async move {
            let call = async {
                let renewed = commands::renew(&this.client, &this.scripts, &holds, lease).await?;
                // A batch shares one slot (on Cluster), so one primary: one WAIT covers it.
                if let Some(first) = holds.first() {
                    this.sync.require(&this.client, &first.hold.keys).await?;
                }
                Ok(renewed)
            };
            tokio::time::timeout(this.timeout, call)
                .await
                .unwrap_or(Err(LockError::Timeout))
        })
    }
}

/// Settings of a [`Watchdog`].
#[derive(Clone, Debug)]
pub struct WatchdogConfig {
    /// The lease of watched holds, `L`; renewals come every `L/3`. Default 30 s.
    pub lease: Lease,
    /// The most holds renewed by one script call. Default 1,000.
    pub batch_size: usize,
    /// Never mix Cluster slots in one batch (required on Redis Cluster, where a script's keys
    /// must share a slot; on a single server it would only cost round trips).
    pub group_by_slot: bool,
    /// How long the watchdog keeps a grant alive, from its acquire's send time: a grant that
    /// comes due for renewal after that is renewed no more, and lapses when its last lease
    /// ends (then its guards are lost, as [`LostReason::MaxHold`](crate::LostReason)). `None`
    /// (the default): renewed for as long as a watched guard lives.
    pub max_hold: Option<Duration>,
}

impl Default for WatchdogConfig {
    fn default() -> Self {
        WatchdogConfig {
            lease: Lease::new(Duration::from_secs(30)).expect("a valid lease"),
            batch_size: 1000,
            group_by_slot: false,
            max_hold: None,
        }
    }
}

/// Counters of the hold table and its renewal service, for benchmarks and monitoring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchdogStats {
    /// Grants renewed by the watchdog right now (with a watched guard).
    pub holds: usize,
    /// Grants held right now with explicit leases only (never renewed).
    pub fixed: usize,
    /// Renew script calls sent (round trips).
    pub renew_calls: u64,
    /// Grants renewed successfully.
    pub renewed: u64,
    /// Grants found gone by a renewal, or whose deadline passed, and marked lost.
    pub lost: u64,
    /// Renew calls that failed (timeout, connection) and were retried later.
    pub errors: u64,
}

pub(crate) struct Shared {
    pub(crate) config: WatchdogConfig,
    pub(crate) state: Mutex<State>,
    pub(crate) metrics: WatchdogMetrics,
    pub(crate) changed: Notify,
    /// Releases in flight, over every hold: 0 lets the common acquire skip the table look.
    pub(crate) releases: AtomicUsize,
    /// Settles in flight, over every hold: 0 lets the common release skip the table look.
    pub(crate) settles: AtomicUsize,
    /// Detached guards alive, over every hold.
    pub(crate) detached: AtomicUsize,
    renew_calls: AtomicU64,
    renewed: AtomicU64,
    lost: AtomicU64,
    errors: AtomicU64,
}

/// The client's hold table and its renewal service. Cheap to clone; the renewal task stops when
/// the last clone is dropped.
#[derive(Clone)]
pub struct Watchdog {
    pub(crate) shared: Arc<Shared>,
    _stop: Arc<DropGuard>,
}

impl fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watchdog")
            .field("config", &self.shared.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Watchdog {
    /// Starts the renewal task on the current tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime (it spawns its task).
    pub fn start(renewer: impl Renewer, config: WatchdogConfig) -> Watchdog {
        let metrics = WatchdogMetrics::register();
        let shared = Arc::new(Shared {
            config,
            state: Mutex::new(State::new(metrics.clone())),
            metrics,
            changed: Notify::new(),
            releases: AtomicUsize::new(0),
            settles: AtomicUsize::new(0),
            detached: AtomicUsize::new(0),
            renew_calls: AtomicU64::new(0),
            renewed: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        });
        let stop = CancellationToken::new();
        tokio::spawn(run(shared.clone(), Arc::new(renewer), stop.clone()));
        Watchdog {
            shared,
            _stop: Arc::new(stop.drop_guard()),
        }
    }

    /// The lease of watched holds.
    pub fn lease(&self) -> Lease {
        self.shared.config.lease
    }

    /// Counters so far.
    pub fn stats(&self) -> WatchdogStats {
        let (holds, fixed) = {
            let state = self.shared.state.lock();
            let watched = state
                .entries
                .iter()
                .filter(|(_, e)| e.grant.as_ref().is_some_and(|g| g.watched > 0))
                .count();
            (watched, state.grants - watched)
        };
        WatchdogStats {
            holds,
            fixed,
            renew_calls: self.shared.renew_calls.load(Ordering::Relaxed),
            renewed: self.shared.renewed.load(Ordering::Relaxed),
            lost: self.shared.lost.load(Ordering::Relaxed),
            errors: self.shared.errors.load(Ordering::Relaxed),
        }
    }
}

/// What one renewal in a batch is for: a grant or a fair-lock queue entry, by (slot, id).
#[derive(Clone, Copy)]
enum Item {
    Grant(usize, u64),
    Waiting(usize, u64),
}

/// One batch in flight: each item, in order.
struct BatchResult {
    ids: Vec<Item>,
    sent_at: Instant,
    result: Result<Vec<bool>, LockError>,
}

async fn run(shared: Arc<Shared>, renewer: Arc<dyn Renewer>, stop: CancellationToken) {
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<BatchResult>();
    let lease = shared.config.lease;
    // Grants due within this window of the first due one ride along in its batch.
    let window = lease.duration() / 6;
    loop {
        let (batches, next) = take_due(&shared, window);
        for batch in batches {
            let (ids, holds): (Vec<Item>, Vec<Renewal>) = batch.into_iter().unzip();
            let renewer = renewer.clone();
            let done_tx = done_tx.clone();
            shared.renew_calls.fetch_add(1, Ordering::Relaxed);
            // Spawned so that a renewal stuck on a paused server never delays the others'
            // bookkeeping; each grant's own deadline keeps running meanwhile.
            tokio::spawn(async move {
                let sent_at = Instant::now();
                let result = renewer.renew(holds, lease).await;
                let _ = done_tx.send(BatchResult {
                    ids,
                    sent_at,
                    result,
                });
            });
        }
        let sleep = tokio::time::sleep_until(next);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = shared.changed.notified() => {}
            _ = sleep => {}
            Some(done) = done_rx.recv() => settle_batch(&shared, done),
        }
    }
}

/// One grant or entry to renew, with its place in the table.
type Due = (Item, Renewal);

/// Takes every grant due now (or within `window` after the first due one) out of the
/// schedule, in batches (never mixing slots when the config says so); returns them and when to
/// look again (the first due time, or one idle period of `window * 2` = lease/3).
fn take_due(shared: &Shared, window: Duration) -> (Vec<Vec<Due>>, Instant) {
    let now = Instant::now();
    let mut state = shared.state.lock();
    let mut taken: Vec<Due> = Vec::new();
    let first_due = match (state.due.first(), state.waiting_due.first()) {
        (Some(a), Some(b)) => Some(a.0.min(b.0)),
        (a, b) => a.or(b).map(|(at, _)| *at),
    };
    if first_due.is_some_and(|at| at <= now) {
        let horizon = now + window;
        while let Some(&(at, slot)) = state.waiting_due.first() {
            if at > horizon {
                break;
            }
            state.waiting_due.pop_first();
            let waiting = &mut state.waiting[slot];
            waiting.due = None;
            taken.push((
                Item::Waiting(slot, waiting.id),
                Renewal {
                    hold: waiting.hold.clone(),
                    token: None,
                },
            ));
        }
    }
    if first_due.is_some_and(|at| at <= now) {
        let horizon = now + window;
        while let Some(&(at, slot)) = state.due.first() {
            if at > horizon {
                break;
            }
            state.due.pop_first();
            let entry = &mut state.entries[slot];
            let hold = entry.hold.clone();
            let Some(grant) = entry.grant.as_mut() else {
                continue;
            };
            grant.due = None;
            if !grant.lease.is_held() {
                // The local deadline passed before we could renew: it is lost, stop here.
                state.end_grant(slot);
                state.tidy(slot);
                shared.lost.fetch_add(1, Ordering::Relaxed);
                shared.metrics.lease_lost();
                tracing::warn!(lock = %hold.keys.name(), "lease lost: validity deadline passed before renewal");
                continue;
            }
            if grant.renew_until.is_some_and(|until| now >= until) {
                // Held for max_hold: no more renewals. The grant stays (its guards live on)
                // until its lease runs out, which the guards' deadline reports as MaxHold.
                grant.lease.cap();
                tracing::info!(lock = %hold.keys.name(), "max_hold reached: renewals stop, the hold lapses at the end of its lease");
                continue;
            }
            let token = grant.token;
            shared
                .metrics
                .renewal_lag(now.saturating_duration_since(at));
            taken.push((
                Item::Grant(slot, grant.id),
                Renewal {
                    hold,
                    token: Some(token),
                },
            ));
        }
    }
    let next = [state.due.first(), state.waiting_due.first()]
        .into_iter()
        .flatten()
        .map(|(at, _)| *at)
        .min()
        .unwrap_or(now + window * 2);
    state.planned = Some(next);
    drop(state);
    let size = shared.config.batch_size.max(1);
    let mut batches: Vec<Vec<Due>> = Vec::new();
    if shared.config.group_by_slot {
        let mut by_slot: HashMap<u16, Vec<Due>> = HashMap::new();
        for due in taken {
            by_slot.entry(due.1.hold.keys.slot()).or_default().push(due);
        }
        for (_, group) in by_slot {
            chunk(group, size, &mut batches);
        }
    } else {
        chunk(taken, size, &mut batches);
    }
    (batches, next)
}

fn chunk(items: Vec<Due>, size: usize, into: &mut Vec<Vec<Due>>) {
    let mut rest = items.into_iter().peekable();
    while rest.peek().is_some() {
        into.push(rest.by_ref().take(size).collect());
    }
}

/// Applies one batch's outcome: renewed grants get a new deadline and due time; grants found
/// gone are marked lost and leave the schedule; on error every grant is retried soon.
fn settle_batch(shared: &Shared, done: BatchResult) {
    let lease = shared.config.lease;
    let valid_until = lease.valid_until(done.sent_at);
    let mut state = shared.state.lock();
    let outcomes: Vec<Option<bool>> = match &done.result {
        Ok(held) => held.iter().map(|h| Some(*h)).collect(),
        Err(error) => {
            shared.errors.fetch_add(1, Ordering::Relaxed);
            for _ in &done.ids {
                shared.metrics.renewal(telemetry::Renewal::Error);
            }
            tracing::warn!(%error, holds = done.ids.len(), "lease renewal failed; retrying");
            vec![None; done.ids.len()]
        }
    };
    let retry_at = Instant::now() + (lease.duration() / 10).min(Duration::from_secs(1));
    for (&item, outcome) in done.ids.iter().zip(outcomes) {
        let (slot, id) = match item {
            Item::Grant(slot, id) => (slot, id),
            Item::Waiting(slot, id) => {
                // Renewed, or gone (the waiter got the lock or left: its entry leaves the
                // table at once; or it lapsed: the waiter's next try queues it again), the
                // entry is renewed again a third of a lease later while it is on the table.
                if let Some(waiting) = state.waiting.get_mut(slot).filter(|w| w.id == id) {
                    let due = match outcome {
                        Some(_) => done.sent_at + lease.duration() / 3,
                        None => retry_at,
                    };
                    waiting.due = Some(due);
                    state.waiting_due.insert((due, slot));
                }
                continue;
            }
        };
        let Some(grant) = state.live_grant(slot, id) else {
            continue; // released or replaced meanwhile
        };
        if grant.watched == 0 {
            continue; // its last watched guard went while the renewal was in flight
        }
        let keep = match outcome {
            Some(true) if grant.lease.extend(valid_until) => {
                shared.renewed.fetch_add(1, Ordering::Relaxed);
                shared.metrics.renewal(telemetry::Renewal::Renewed);
                Some(done.sent_at + lease.duration() / 3)
            }
            Some(_) => None,
            None if grant.lease.is_held() => Some(retry_at),
            None => None,
        };
        match keep {
            Some(due) => state.schedule(slot, due),
            None => {
                let name = state.entries[slot].hold.keys.name().to_string();
                if let Some(grant) = state.end_grant(slot) {
                    grant.lease.mark_lost();
                }
                state.tidy(slot);
                shared.lost.fetch_add(1, Ordering::Relaxed);
                shared.metrics.renewal(telemetry::Renewal::Lost);
                shared.metrics.lease_lost();
                tracing::warn!(lock = %name, "lease lost: the grant is gone");
            }
        }
    }
}
