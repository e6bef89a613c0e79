//! The hold table: one entry per [`HoldId`], holding the grant the client knows, its guards,
//! settles in flight and detached guards.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared as SharedFuture};
use leasehold_core::{FencingToken, HoldId, Lease};
use slab::Slab;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::lease::LeaseState;
use crate::service::{Shared, Watchdog};

/// A repair in flight, awaitable by every later command of the same hold.
pub type Settle = SharedFuture<BoxFuture<'static, ()>>;

/// How a guard's lease is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseMode {
    /// The client's lease, renewed by the watchdog while a watched guard of the grant lives.
    Watched,
    /// Exactly this long from the acquire; never renewed.
    Fixed(Lease),
}

/// The grant the client holds for one [`HoldId`], as [`Watchdog::grant_of`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldGrant {
    /// Its fencing token.
    pub token: FencingToken,
    /// Its live guards (the owner's hold count in Redis, as far as the client knows).
    pub guards: u64,
}

pub(crate) struct Grant {
    /// Unique for the watchdog's lifetime.
    pub(crate) id: u64,
    pub(crate) token: FencingToken,
    pub(crate) lease: Arc<LeaseState>,
    pub(crate) watched: usize,
    pub(crate) fixed: usize,
    /// When the next renewal is due; `None` while unwatched or while a renewal is in flight.
    pub(crate) due: Option<Instant>,
}

pub(crate) struct Entry {
    pub(crate) hold: HoldId,
    /// Unique for the watchdog's lifetime: slots are reused, ids never.
    pub(crate) id: u64,
    pub(crate) grant: Option<Grant>,
    pub(crate) settling: Option<(u64, Settle)>,
    pub(crate) detached: usize,
    pub(crate) reattached: Option<Arc<Notify>>,
    /// Releases of this hold in flight, and who waits for them to end.
    pub(crate) releasing: usize,
    pub(crate) released: Option<Arc<Notify>>,
}

impl Entry {
    fn is_empty(&self) -> bool {
        self.grant.is_none() && self.settling.is_none() && self.detached == 0 && self.releasing == 0
    }
}

/// Entries live in a slab (one slot each); the map finds an entry by hold, the set orders the
/// watched grants by due time.
#[derive(Default)]
pub(crate) struct State {
    pub(crate) entries: Slab<Entry>,
    pub(crate) index: HashMap<HoldId, usize>,
    pub(crate) due: BTreeSet<(Instant, usize)>,
    pub(crate) next_id: u64,
    /// When the renewal task will next look at the schedule. A new grant wakes it only when
    /// due earlier than that: acquiring a lock costs no task wake-up in the common case.
    pub(crate) planned: Option<Instant>,
    /// Grants alive (any mode).
    pub(crate) grants: usize,
}

impl State {
    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// The slot of `hold`'s entry, made when missing.
    fn entry(&mut self, hold: &HoldId) -> usize {
        if let Some(&slot) = self.index.get(hold) {
            return slot;
        }
        let id = self.next_id();
        let slot = self.entries.insert(Entry {
            hold: hold.clone(),
            id,
            grant: None,
            settling: None,
            detached: 0,
            reattached: None,
            releasing: 0,
            released: None,
        });
        self.index.insert(hold.clone(), slot);
        slot
    }

    /// Drops the entry in `slot` when nothing is left in it.
    pub(crate) fn tidy(&mut self, slot: usize) {
        if self.entries.get(slot).is_some_and(Entry::is_empty) {
            let entry = self.entries.remove(slot);
            self.index.remove(&entry.hold);
        }
    }

    /// Takes the grant out of `slot` (it ended), unscheduling it.
    pub(crate) fn end_grant(&mut self, slot: usize) -> Option<Grant> {
        let grant = self.entries.get_mut(slot)?.grant.take()?;
        if let Some(due) = grant.due {
            self.due.remove(&(due, slot));
        }
        self.grants -= 1;
        Some(grant)
    }

    pub(crate) fn schedule(&mut self, slot: usize, due: Instant) {
        if let Some(grant) = self.entries[slot].grant.as_mut() {
            grant.due = Some(due);
            self.due.insert((due, slot));
        }
    }

    /// The grant in `slot` if it is still grant `grant_id`.
    pub(crate) fn live_grant(&mut self, slot: usize, grant_id: u64) -> Option<&mut Grant> {
        self.entries
            .get_mut(slot)?
            .grant
            .as_mut()
            .filter(|g| g.id == grant_id)
    }
}

/// One guard's share of a grant. Dropping it takes the guard out of the table at once (renewal
/// of the grant stops with its last watched guard).
pub struct HoldGuard {
    shared: Arc<Shared>,
    slot: usize,
    entry_id: u64,
    grant_id: u64,
    token: FencingToken,
    lease: Arc<LeaseState>,
    mode: LeaseMode,
    /// A fixed guard's own deadline (send time + its lease - drift).
    until: Option<Instant>,
    detached: bool,
}

impl fmt::Debug for HoldGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HoldGuard")
            .field("token", &self.token)
            .field("mode", &self.mode)
            .field("held", &self.is_held())
            .finish()
    }
}

impl HoldGuard {
    /// Whether the lease is still certainly valid for this guard: the grant is not lost and
    /// the guard's deadline has not passed. `false` is final.
    pub fn is_held(&self) -> bool {
        if !self.lease.is_held() {
            return false;
        }
        self.until.is_none_or(|until| Instant::now() < until)
    }

    /// The instant until which this guard's lease is certainly valid, unless renewed further.
    pub fn valid_until(&self) -> Instant {
        self.until.unwrap_or_else(|| self.lease.valid_until())
    }

    /// Completes when this guard's lease is lost.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn lost(&self) {
        self.lease.lost_by(self.until).await
    }

    /// The token of the grant this guard belongs to.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The guard's lease mode.
    pub fn mode(&self) -> LeaseMode {
        self.mode
    }

    /// Whether the guard was detached from its task.
    pub fn is_detached(&self) -> bool {
        self.detached
    }
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        let mut state = self.shared.state.lock();
        let state = &mut *state;
        let Some(entry) = state
            .entries
            .get_mut(self.slot)
            .filter(|e| e.id == self.entry_id)
        else {
            return;
        };
        if self.detached {
            entry.detached -= 1;
            if entry.detached == 0 {
                if let Some(notify) = entry.reattached.take() {
                    notify.notify_waiters();
                }
            }
        }
        let mut unwatched = false;
        let mut ended = false;
        if let Some(grant) = entry.grant.as_mut().filter(|g| g.id == self.grant_id) {
            match self.mode {
                LeaseMode::Watched => {
                    grant.watched -= 1;
                    unwatched = grant.watched == 0;
                }
                LeaseMode::Fixed(_) => grant.fixed -= 1,
            }
            ended = grant.watched == 0 && grant.fixed == 0;
            if unwatched {
                if let Some(due) = grant.due.take() {
                    state.due.remove(&(due, self.slot));
                }
            }
        }
        if ended {
            state.end_grant(self.slot);
        }
        state.tidy(self.slot);
    }
}

/// A release of one hold in flight: the owner's next acquire or release of the same hold waits
/// until it is dropped (answered, or handed to a settle), so it can never overtake it.
pub struct ReleaseTicket {
    shared: Arc<Shared>,
    hold: HoldId,
    entry_id: u64,
}

impl fmt::Debug for ReleaseTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseTicket")
            .field("lock", &self.hold.keys.name())
            .finish()
    }
}

impl Drop for ReleaseTicket {
    fn drop(&mut self) {
        let mut state = self.shared.state.lock();
        let Some(&slot) = state.index.get(&self.hold) else {
            return;
        };
        let entry = &mut state.entries[slot];
        if entry.id != self.entry_id {
            return;
        }
        entry.releasing -= 1;
        if entry.releasing == 0 {
            if let Some(notify) = entry.released.take() {
                notify.notify_waiters();
            }
        }
        state.tidy(slot);
    }
}

impl Watchdog {
    /// Registers a release of `hold` about to be sent; see [`ReleaseTicket`].
    pub fn begin_release(&self, hold: &HoldId) -> ReleaseTicket {
        let mut state = self.shared.state.lock();
        let slot = state.entry(hold);
        let entry = &mut state.entries[slot];
        entry.releasing += 1;
        ReleaseTicket {
            shared: self.shared.clone(),
            hold: hold.clone(),
            entry_id: entry.id,
        }
    }

    /// Records a grant answered by an acquire of `hold` sent at `sent_at`: `hold_count` 1 is a
    /// new grant, more a re-entry of the grant `token`. Returns the new guard's share.
    ///
    /// A new grant (or a re-entry with a token the table does not have) while the table has a
    /// grant for the hold means Redis no longer had that one (force-unlocked, expired, lost
    /// with Redis's data): its guards are marked lost for good, and the new grant gets an
    /// entry of its own, so a renewal verdict still in flight for the old one cannot touch it.
    pub fn grant(
        &self,
        hold: &HoldId,
        token: FencingToken,
        hold_count: u64,
        mode: LeaseMode,
        sent_at: Instant,
    ) -> HoldGuard {
        let watched_lease = self.shared.config.lease;
        let lease = match mode {
            LeaseMode::Watched => watched_lease,
            LeaseMode::Fixed(lease) => lease,
        };
        let valid_until = lease.valid_until(sent_at);
        let mut state = self.shared.state.lock();
        let slot = state.entry(hold);
        let joinable = state.entries[slot]
            .grant
            .as_ref()
            .is_some_and(|g| hold_count > 1 && g.token == token && g.lease.extend(valid_until));
        if !joinable {
            if let Some(old) = state.end_grant(slot) {
                old.lease.mark_lost();
            }
            let id = state.next_id();
            state.entries[slot].grant = Some(Grant {
                id,
                token,
                lease: Arc::new(LeaseState::new(valid_until)),
                watched: 0,
                fixed: 0,
                due: None,
            });
            state.grants += 1;
        }
        let entry_id = state.entries[slot].id;
        let grant = state.entries[slot].grant.as_mut().expect("just made");
        let (grant_id, grant_lease) = (grant.id, grant.lease.clone());
        let mut wake = false;
        match mode {
            LeaseMode::Watched => {
                grant.watched += 1;
                if grant.watched == 1 {
                    let due = sent_at + watched_lease.duration() / 3;
                    state.schedule(slot, due);
                    wake = state.planned.is_none_or(|planned| due < planned);
                }
            }
            LeaseMode::Fixed(_) => grant.fixed += 1,
        }
        drop(state);
        if wake {
            self.shared.changed.notify_one();
        }
        HoldGuard {
            shared: self.shared.clone(),
            slot,
            entry_id,
            grant_id,
            token,
            lease: grant_lease,
            mode,
            until: match mode {
                LeaseMode::Watched => None,
                LeaseMode::Fixed(_) => Some(valid_until),
            },
            detached: false,
        }
    }

    /// The grant the client holds for `hold`, if any (a lost grant counts as none).
    pub fn grant_of(&self, hold: &HoldId) -> Option<HeldGrant> {
        let state = self.shared.state.lock();
        let slot = *state.index.get(hold)?;
        let grant = state.entries[slot].grant.as_ref()?;
        if grant.lease.is_marked_lost() {
            return None;
        }
        Some(HeldGrant {
            token: grant.token,
            guards: (grant.watched + grant.fixed) as u64,
        })
    }

    /// Marks the grant `token` of `hold` lost: an acquire found it gone from Redis.
    pub fn lose(&self, hold: &HoldId, token: FencingToken) {
        let mut state = self.shared.state.lock();
        let Some(&slot) = state.index.get(hold) else {
            return;
        };
        if state.entries[slot]
            .grant
            .as_ref()
            .is_some_and(|g| g.token == token)
        {
            if let Some(grant) = state.end_grant(slot) {
                grant.lease.mark_lost();
            }
            state.tidy(slot);
        }
    }

    /// Marks `guard` as detached from the task that acquired it: until it is dropped, that task
    /// does not re-enter the hold (see [`Watchdog::until_attached`]).
    pub fn detach(&self, guard: &mut HoldGuard) {
        if guard.detached {
            return;
        }
        let mut state = self.shared.state.lock();
        if let Some(entry) = state
            .entries
            .get_mut(guard.slot)
            .filter(|e| e.id == guard.entry_id)
        {
            entry.detached += 1;
            guard.detached = true;
        }
    }

    /// Waits until no detached guard of `hold` is alive, or until `deadline`; false on the
    /// deadline.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn until_attached(&self, hold: &HoldId, deadline: Option<Instant>) -> bool {
        loop {
            let notify = {
                let mut state = self.shared.state.lock();
                let Some(&slot) = state.index.get(hold) else {
                    return true;
                };
                let entry = &mut state.entries[slot];
                if entry.detached == 0 {
                    return true;
                }
                entry
                    .reattached
                    .get_or_insert_with(Default::default)
                    .clone()
            };
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.detached_guards(hold) == 0 {
                return true;
            }
            match deadline {
                Some(deadline) => {
                    if tokio::time::timeout_at(deadline, notified).await.is_err() {
                        return false;
                    }
                }
                None => notified.await,
            }
        }
    }

    fn detached_guards(&self, hold: &HoldId) -> usize {
        let state = self.shared.state.lock();
        state
            .index
            .get(hold)
            .map_or(0, |&slot| state.entries[slot].detached)
    }

    /// Runs `work` (a repair of an unanswered command of `hold`) in the background, after the
    /// hold's earlier repairs: repairs of one hold run in order, and [`Watchdog::settled`]
    /// waits for all of them.
    pub fn settle(&self, hold: &HoldId, work: BoxFuture<'static, ()>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime to run it on: the lease ends the hold
        };
        let mut state = self.shared.state.lock();
        let slot = state.entry(hold);
        let generation = state.next_id();
        let previous = state.entries[slot].settling.take().map(|(_, s)| s);
        let shared = Arc::downgrade(&self.shared);
        let (entry_id, hold_key) = (state.entries[slot].id, hold.clone());
        let settle: Settle = async move {
            if let Some(previous) = previous {
                previous.await;
            }
            work.await;
            if let Some(shared) = shared.upgrade() {
                let mut state = shared.state.lock();
                if let Some(&slot) = state.index.get(&hold_key) {
                    let entry = &mut state.entries[slot];
                    if entry.id == entry_id
                        && entry
                            .settling
                            .as_ref()
                            .is_some_and(|(g, _)| *g == generation)
                    {
                        entry.settling = None;
                        state.tidy(slot);
                    }
                }
            }
        }
        .boxed()
        .shared();
        state.entries[slot].settling = Some((generation, settle.clone()));
        drop(state);
        runtime.spawn(settle);
    }

    /// Waits up to `within` for the releases and repairs of `hold` in flight (an acquire must
    /// not overtake either); false if one is still running (Redis is not answering: the caller
    /// should not send a new command for the hold yet).
    pub async fn settled(&self, hold: &HoldId, within: Duration) -> bool {
        self.quiet(hold, within, true).await
    }

    /// Waits up to `within` for the repairs of `hold` in flight (what a release must not
    /// overtake); false if one is still running.
    pub async fn repaired(&self, hold: &HoldId, within: Duration) -> bool {
        self.quiet(hold, within, false).await
    }

    async fn quiet(&self, hold: &HoldId, within: Duration, releases_too: bool) -> bool {
        let deadline = Instant::now() + within;
        loop {
            let (settle, released) = {
                let mut state = self.shared.state.lock();
                let Some(&slot) = state.index.get(hold) else {
                    return true;
                };
                let entry = &mut state.entries[slot];
                let settle = entry.settling.as_ref().map(|(_, s)| s.clone());
                let released = (releases_too && entry.releasing > 0)
                    .then(|| entry.released.get_or_insert_with(Default::default).clone());
                (settle, released)
            };
            match (settle, released) {
                (None, None) => return true,
                (Some(settle), _) => {
                    if tokio::time::timeout_at(deadline, settle).await.is_err() {
                        return false;
                    }
                }
                (None, Some(released)) => {
                    let notified = released.notified();
                    tokio::pin!(notified);
                    notified.as_mut().enable();
                    if self.releases_in_flight(hold) == 0 {
                        continue;
                    }
                    if tokio::time::timeout_at(deadline, notified).await.is_err() {
                        return false;
                    }
                }
            }
        }
    }

    fn releases_in_flight(&self, hold: &HoldId) -> usize {
        let state = self.shared.state.lock();
        state
            .index
            .get(hold)
            .map_or(0, |&slot| state.entries[slot].releasing)
    }
}
