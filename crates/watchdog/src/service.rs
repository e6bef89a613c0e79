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
use slab::Slab;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::lease::{valid_until, LeaseState};

/// The boxed future a [`Renewer`] returns.
pub type RenewFuture = Pin<Box<dyn Future<Output = Result<Vec<bool>, LockError>> + Send>>;

/// Sends one batch of renewals: `(lock, owner)` pairs with one lease; answers, in order,
/// whether each hold was still held. [`fred::clients::Client`] implements it with the renew
/// script; tests of timing may record calls instead.
pub trait Renewer: Send + Sync + 'static {
    /// Renews `holds` with a lease of `lease_ms` milliseconds.
    fn renew(&self, holds: Vec<(LockKeys, Owner)>, lease_ms: u64) -> RenewFuture;
}

/// Renewal through the renew script (`leasehold_core::scripts::RENEW`).
impl Renewer for fred::clients::Client {
    fn renew(&self, holds: Vec<(LockKeys, Owner)>, lease_ms: u64) -> RenewFuture {
        let client = self.clone();
        Box::pin(async move {
            let timeout = client.perf_config().default_command_timeout;
            commands::renew(&client, &holds, lease_ms)
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

type HoldKey = (LockKeys, Owner);

struct Entry {
    key: HoldKey,
    /// Unique for the watchdog's lifetime: slots are reused, ids never.
    id: u64,
    refs: usize,
    lease: Arc<LeaseState>,
    /// When the next renewal is due; `None` while a renewal is in flight.
    due: Option<Instant>,
}

/// Watched holds live in a slab (one slot each); the map finds a hold by lock and owner for
/// re-entry, the set orders slots by due time.
#[derive(Default)]
struct State {
    entries: Slab<Entry>,
    index: HashMap<HoldKey, usize>,
    due: BTreeSet<(Instant, usize)>,
    next_id: u64,
    /// When the renewal task will next look at the schedule. A new hold wakes it only when
    /// due earlier than that: acquiring a lock costs no task wake-up in the common case.
    planned: Option<Instant>,
}

impl State {
    /// The entry in `slot` if it is still the hold `id` (not released and replaced).
    fn live(&mut self, slot: usize, id: u64) -> Option<&mut Entry> {
        self.entries.get_mut(slot).filter(|e| e.id == id)
    }

    fn remove(&mut self, slot: usize) -> Entry {
        let entry = self.entries.remove(slot);
        self.index.remove(&entry.key);
        if let Some(due) = entry.due {
            self.due.remove(&(due, slot));
        }
        entry
    }

    fn schedule(&mut self, slot: usize, due: Instant) {
        self.entries[slot].due = Some(due);
        self.due.insert((due, slot));
    }
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
    slot: usize,
    id: u64,
    lease: Arc<LeaseState>,
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold")
            .field("id", &self.id)
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
        let last = match state.live(self.slot, self.id) {
            Some(entry) => {
                entry.refs -= 1;
                entry.refs == 0
            }
            None => false, // already dropped from the schedule as lost
        };
        if last {
            state.remove(self.slot);
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
            holds: self.shared.state.lock().entries.len(),
            renew_calls: self.shared.renew_calls.load(Ordering::Relaxed),
            renewed: self.shared.renewed.load(Ordering::Relaxed),
            lost: self.shared.lost.load(Ordering::Relaxed),
            errors: self.shared.errors.load(Ordering::Relaxed),
        }
    }

    /// Live watched guards of `owner` on `keys` (0 when not watched).
    pub fn holds_of(&self, keys: &LockKeys, owner: &Owner) -> u64 {
        let key: HoldKey = (keys.clone(), owner.clone());
        let state = self.shared.state.lock();
        state
            .index
            .get(&key)
            .map_or(0, |&slot| state.entries[slot].refs as u64)
    }

    /// Starts (or joins) watching the hold of `owner` on `keys`, granted by an acquire sent at
    /// `sent_at` with lease [`Watchdog::lease`] that answered `hold_count`. A re-entry
    /// (`hold_count` > 1) joins the existing hold and moves its deadline forward.
    ///
    /// A new grant (`hold_count` 1) while an entry exists means Redis no longer had the old
    /// hold (force-unlocked or expired before the next renewal could tell): the old guards'
    /// lease is marked lost rather than revived, and the new grant gets an entry of its own,
    /// so a renewal verdict still in flight for the old one cannot touch it.
    pub fn watch(&self, keys: &LockKeys, owner: &Owner, hold_count: u64, sent_at: Instant) -> Hold {
        let config = &self.shared.config;
        let valid_until = valid_until(sent_at, config.lease);
        let key: HoldKey = (keys.clone(), owner.clone());
        let mut state = self.shared.state.lock();
        if let Some(&slot) = state.index.get(&key) {
            let entry = &mut state.entries[slot];
            if hold_count == 1 {
                entry.lease.mark_lost();
            } else if entry.lease.extend(valid_until) {
                entry.refs += 1;
                return Hold {
                    shared: self.shared.clone(),
                    slot,
                    id: entry.id,
                    lease: entry.lease.clone(),
                };
            }
            // The old hold is gone; this grant starts a new one.
            state.remove(slot);
        }
        state.next_id += 1;
        let id = state.next_id;
        let due = sent_at + config.lease / 3;
        let lease = Arc::new(LeaseState::new(valid_until));
        let slot = state.entries.insert(Entry {
            key: key.clone(),
            id,
            refs: 1,
            lease: lease.clone(),
            due: None,
        });
        state.index.insert(key, slot);
        state.schedule(slot, due);
        let wake = state.planned.is_none_or(|planned| due < planned);
        drop(state);
        if wake {
            self.shared.changed.notify_one();
        }
        Hold {
            shared: self.shared.clone(),
            slot,
            id,
            lease,
        }
    }
}

struct BatchResult {
    /// (slot, id) of each hold in the batch, in order.
    ids: Vec<(usize, u64)>,
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
            let (ids, holds): (Vec<(usize, u64)>, Vec<HoldKey>) = ids_holds.into_iter().unzip();
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
        let sleep = tokio::time::sleep_until(next);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = shared.changed.notified() => {}
            _ = sleep => {}
            Some(done) = done_rx.recv() => settle(&shared, done),
        }
    }
}

/// Takes every hold due now (or within `window` after the first due one) out of the schedule,
/// in batches; returns them and when to look again (the first due time, or one idle period of
/// `window * 2` = lease/3 when nothing is scheduled).
#[allow(clippy::type_complexity)] // reason: batches of ((slot, id), hold), spelled out once here
fn take_due(shared: &Shared, window: Duration) -> (Vec<Vec<((usize, u64), HoldKey)>>, Instant) {
    let now = Instant::now();
    let mut state = shared.state.lock();
    let mut taken = Vec::new();
    if state.due.first().is_some_and(|(at, _)| *at <= now) {
        let horizon = now + window;
        while let Some(&(at, slot)) = state.due.first() {
            if at > horizon {
                break;
            }
            state.due.pop_first();
            let entry = &mut state.entries[slot];
            entry.due = None;
            if !entry.lease.is_held() {
                // The local deadline passed before we could renew: it is lost, stop here.
                let entry = state.remove(slot);
                shared.lost.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(lock = %entry.key.0.name(), "lease lost: validity deadline passed before renewal");
                continue;
            }
            taken.push(((slot, entry.id), entry.key.clone()));
        }
    }
    let next = state.due.first().map_or(now + window * 2, |(at, _)| *at);
    state.planned = Some(next);
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
    let valid_until = valid_until(done.sent_at, lease);
    let mut state = shared.state.lock();
    let outcomes: Vec<Option<bool>> = match &done.result {
        Ok(held) => held.iter().map(|h| Some(*h)).collect(),
        Err(error) => {
            shared.errors.fetch_add(1, Ordering::Relaxed);
            let names: Vec<&str> = done
                .ids
                .iter()
                .filter_map(|(slot, id)| state.entries.get(*slot).filter(|e| e.id == *id))
                .take(5)
                .map(|e| e.key.0.name())
                .collect();
            tracing::warn!(%error, holds = done.ids.len(), locks = ?names, "lease renewal failed; retrying");
            vec![None; done.ids.len()]
        }
    };
    let retry_at = Instant::now() + (lease / 10).min(Duration::from_secs(1));
    for (&(slot, id), outcome) in done.ids.iter().zip(outcomes) {
        let Some(entry) = state.live(slot, id) else {
            continue; // released meanwhile
        };
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
            Some(due) => state.schedule(slot, due),
            None => {
                let entry = state.remove(slot);
                entry.lease.mark_lost();
                shared.lost.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(lock = %entry.key.0.name(), "lease lost: the owner no longer holds the lock");
            }
        }
    }
}
