//! The renewal service: one task per client renews all watched holds in batches.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::ClientLike;
use leasehold_core::{commands, LockError, LockKeys, Owner};
use parking_lot::Mutex;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::lease::{drift_for, LeaseState};

/// The boxed future a [`Renewer`] returns.
pub type RenewFuture = Pin<Box<dyn Future<Output = Result<Vec<bool>, LockError>> + Send>>;

/// Sends one batch of renewals: `(lock hash, owner)` pairs with one lease; answers, in order,
/// whether each hold was still held. [`fred::clients::Client`] implements it with the renew
/// script; tests of timing may record calls instead.
pub trait Renewer: Send + Sync + 'static {
    /// Renews `holds` with a lease of `lease_ms` milliseconds.
    fn renew(&self, holds: Vec<(Arc<str>, Owner)>, lease_ms: u64) -> RenewFuture;
}

/// Renewal through the renew script (`leasehold_core::scripts::RENEW`).
impl Renewer for fred::clients::Client {
    fn renew(&self, holds: Vec<(Arc<str>, Owner)>, lease_ms: u64) -> RenewFuture {
        let client = self.clone();
        Box::pin(async move {
            let pairs: Vec<(&str, &str)> = holds.iter().map(|(k, o)| (&**k, o.id())).collect();
            let timeout = client.perf_config().default_command_timeout;
            commands::renew(&client, &pairs, lease_ms)
                .await
                .map_err(|e| LockError::from_redis(e, timeout))
        })
    }
}

/// Settings of a [`Watchdog`].
#[derive(Clone, Debug)]
pub struct WatchdogConfig {
    /// The lease of watched holds, `L`; renewals come every `L/3`. Default 30 s.
    pub lease: Duration,
    /// The most holds renewed by one script call. Default 1,000.
    pub batch_size: usize,
}

impl Default for WatchdogConfig {
    fn default() -> Self {
        WatchdogConfig {
            lease: Duration::from_secs(30),
            batch_size: 1000,
        }
    }
}

/// Counters of the renewal service, for benchmarks and monitoring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchdogStats {
    /// Watched holds right now.
    pub holds: usize,
    /// Renew script calls sent (round trips).
    pub renew_calls: u64,
    /// Holds renewed successfully.
    pub renewed: u64,
    /// Holds found gone by a renewal, or whose deadline passed, and marked lost.
    pub lost: u64,
    /// Renew calls that failed (timeout, connection) and were retried later.
    pub errors: u64,
}

type HoldKey = (Arc<str>, Owner);

struct Entry {
    id: u64,
    refs: usize,
    name: Arc<str>,
    lease: Arc<LeaseState>,
    /// When the next renewal is due; `None` while a renewal is in flight.
    due: Option<Instant>,
}

#[derive(Default)]
struct State {
    holds: HashMap<HoldKey, Entry>,
    due: BTreeSet<(Instant, u64)>,
    by_id: HashMap<u64, HoldKey>,
    next_id: u64,
}

struct Shared {
    config: WatchdogConfig,
    state: Mutex<State>,
    changed: Notify,
    renew_calls: AtomicU64,
    renewed: AtomicU64,
    lost: AtomicU64,
    errors: AtomicU64,
}

/// One renewal service per client. Cheap to clone; the task stops when the last clone is dropped.
#[derive(Clone)]
pub struct Watchdog {
    shared: Arc<Shared>,
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

/// One watched hold of one owner on one lock, shared by that owner's re-entrant guards.
/// Dropping the last `Hold` of a lock and owner stops its renewal at once.
pub struct Hold {
    shared: Arc<Shared>,
    key: HoldKey,
    id: u64,
    lease: Arc<LeaseState>,
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold")
            .field("key", &self.key.0)
            .field("owner", &self.key.1)
            .field("held", &self.lease.is_held())
            .finish()
    }
}

impl Hold {
    /// The lease state this hold shares with the watchdog.
    pub fn lease(&self) -> &Arc<LeaseState> {
        &self.lease
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut state = self.shared.state.lock();
        let remove = match state.holds.get_mut(&self.key) {
            Some(entry) if entry.id == self.id => {
                entry.refs -= 1;
                entry.refs == 0
            }
            _ => false,
        };
        if remove {
            if let Some(entry) = state.holds.remove(&self.key) {
                if let Some(due) = entry.due {
                    state.due.remove(&(due, entry.id));
                }
                state.by_id.remove(&entry.id);
            }
        }
    }
}

impl Watchdog {
    /// Starts the renewal task on the current tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime (it spawns its task).
    pub fn start(renewer: impl Renewer, config: WatchdogConfig) -> Watchdog {
        let shared = Arc::new(Shared {
            config,
            state: Mutex::new(State::default()),
            changed: Notify::new(),
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

    /// The watched lease `L`.
    pub fn lease(&self) -> Duration {
        self.shared.config.lease
    }

    /// Counters so far.
    pub fn stats(&self) -> WatchdogStats {
        WatchdogStats {
            holds: self.shared.state.lock().holds.len(),
            renew_calls: self.shared.renew_calls.load(Ordering::Relaxed),
            renewed: self.shared.renewed.load(Ordering::Relaxed),
            lost: self.shared.lost.load(Ordering::Relaxed),
            errors: self.shared.errors.load(Ordering::Relaxed),
        }
    }

    /// Starts (or joins) watching the hold of `owner` on `keys`, granted by an acquire sent at
    /// `sent_at` with lease [`Watchdog::lease`]. A re-entry joins the existing hold and moves
    /// its deadline forward.
    pub fn watch(&self, keys: &LockKeys, owner: &Owner, sent_at: Instant) -> Hold {
        let config = &self.shared.config;
        let valid_until = sent_at + config.lease - drift_for(config.lease);
        let key: HoldKey = (keys.hash().into(), owner.clone());
        let mut state = self.shared.state.lock();
        if let Some(entry) = state.holds.get_mut(&key) {
            if entry.lease.extend(valid_until) {
                entry.refs += 1;
                return Hold {
                    shared: self.shared.clone(),
                    key,
                    id: entry.id,
                    lease: entry.lease.clone(),
                };
            }
            // The old hold was lost; this grant starts a new one.
            let old = state.holds.remove(&key).expect("entry present");
            if let Some(due) = old.due {
                state.due.remove(&(due, old.id));
            }
            state.by_id.remove(&old.id);
        }
        state.next_id += 1;
        let id = state.next_id;
        let due = sent_at + config.lease / 3;
        let lease = Arc::new(LeaseState::new(valid_until));
        state.holds.insert(
            key.clone(),
            Entry {
                id,
                refs: 1,
                name: keys.name().into(),
                lease: lease.clone(),
                due: Some(due),
            },
        );
        state.by_id.insert(id, key.clone());
        let earliest = state.due.first().map(|(at, _)| *at);
        state.due.insert((due, id));
        drop(state);
        if earliest.is_none_or(|at| due < at) {
            self.shared.changed.notify_one();
        }
        Hold {
            shared: self.shared.clone(),
            key,
            id,
            lease,
        }
    }
}

struct BatchResult {
    ids: Vec<u64>,
    sent_at: Instant,
    result: Result<Vec<bool>, LockError>,
}

async fn run(shared: Arc<Shared>, renewer: Arc<dyn Renewer>, stop: CancellationToken) {
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<BatchResult>();
    let lease = shared.config.lease;
    let lease_ms = leasehold_core::lease_millis(lease).unwrap_or(1);
    // Holds due within this window of the first due one ride along in its batch.
    let window = lease / 6;
    loop {
        let (batches, next) = take_due(&shared, window);
        for ids_holds in batches {
            let (ids, holds): (Vec<u64>, Vec<HoldKey>) = ids_holds.into_iter().unzip();
            let renewer = renewer.clone();
            let done_tx = done_tx.clone();
            shared.renew_calls.fetch_add(1, Ordering::Relaxed);
            // Spawned so that a renewal stuck on a paused server never delays the others'
            // bookkeeping; each hold's own deadline keeps running meanwhile.
            tokio::spawn(async move {
                let sent_at = Instant::now();
                let result = renewer.renew(holds, lease_ms).await;
                let _ = done_tx.send(BatchResult {
                    ids,
                    sent_at,
                    result,
                });
            });
        }
        let sleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = shared.changed.notified() => {}
            _ = sleep => {}
            Some(done) = done_rx.recv() => settle(&shared, done),
        }
    }
}

/// Takes every hold due now (or within `window` after the first due one) out of the schedule,
/// in batches; returns them and when to look again.
fn take_due(shared: &Shared, window: Duration) -> (Vec<Vec<(u64, HoldKey)>>, Option<Instant>) {
    let now = Instant::now();
    let mut state = shared.state.lock();
    let mut taken = Vec::new();
    if state.due.first().is_some_and(|(at, _)| *at <= now) {
        let horizon = now + window;
        while let Some(&(at, id)) = state.due.first() {
            if at > horizon {
                break;
            }
            state.due.pop_first();
            let Some(key) = state.by_id.get(&id).cloned() else {
                continue;
            };
            let entry = state.holds.get_mut(&key).expect("indexed hold");
            entry.due = None;
            if !entry.lease.is_held() {
                // The local deadline passed before we could renew: it is lost, stop here.
                let entry = state.holds.remove(&key).expect("indexed hold");
                state.by_id.remove(&entry.id);
                shared.lost.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(lock = %entry.name, "lease lost: validity deadline passed before renewal");
                continue;
            }
            taken.push((id, key));
        }
    }
    let next = state.due.first().map(|(at, _)| *at);
    drop(state);
    let batch = shared.config.batch_size.max(1);
    let mut batches = Vec::with_capacity(taken.len().div_ceil(batch));
    let mut rest = taken.into_iter().peekable();
    while rest.peek().is_some() {
        batches.push(rest.by_ref().take(batch).collect());
    }
    (batches, next)
}

/// Applies one batch's outcome: renewed holds get a new deadline and due time; holds found gone
/// are marked lost and dropped from the schedule; on error every hold is retried soon.
fn settle(shared: &Shared, done: BatchResult) {
    let lease = shared.config.lease;
    let valid_until = done.sent_at + lease - drift_for(lease);
    let mut state = shared.state.lock();
    let outcomes: Vec<Option<bool>> = match &done.result {
        Ok(held) => held.iter().map(|h| Some(*h)).collect(),
        Err(error) => {
            shared.errors.fetch_add(1, Ordering::Relaxed);
            let names: Vec<&str> = done
                .ids
                .iter()
                .filter_map(|id| state.by_id.get(id))
                .filter_map(|key| state.holds.get(key))
                .take(5)
                .map(|e| &*e.name)
                .collect();
            tracing::warn!(%error, holds = done.ids.len(), locks = ?names, "lease renewal failed; retrying");
            vec![None; done.ids.len()]
        }
    };
    let retry_at = Instant::now() + (lease / 10).min(Duration::from_secs(1));
    for (id, outcome) in done.ids.iter().zip(outcomes) {
        let Some(key) = state.by_id.get(id).cloned() else {
            continue; // released meanwhile
        };
        let entry = state.holds.get_mut(&key).expect("indexed hold");
        let keep = match outcome {
            Some(true) if entry.lease.extend(valid_until) => {
                shared.renewed.fetch_add(1, Ordering::Relaxed);
                Some(done.sent_at + lease / 3)
            }
            Some(_) => None,
            None if entry.lease.is_held() => Some(retry_at),
            None => None,
        };
        match keep {
            Some(due) => {
                entry.due = Some(due);
                state.due.insert((due, *id));
            }
            None => {
                let entry = state.holds.remove(&key).expect("indexed hold");
                state.by_id.remove(id);
                entry.lease.mark_lost();
                shared.lost.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(lock = %entry.name, "lease lost: the owner no longer holds the lock");
            }
        }
    }
}
