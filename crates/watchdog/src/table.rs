//! The hold table: one entry per [`HoldId`], holding the grant the client knows, its guards,
//! settles in flight and detached guards.

use std::collections::BTreeSet;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared as SharedFuture};
use hashbrown::{DefaultHashBuilder, HashTable};
use leasehold_core::telemetry::WatchdogMetrics;
use leasehold_core::{FencingToken, HoldId, Lease};
use parking_lot::Mutex;
use slab::Slab;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::lease::{LeaseState, LostReason};
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

/// What an acquire must know before it is sent ([`Watchdog::prepare`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Prepared {
    /// The grant the client holds: the acquire is a re-entry of it.
    pub grant: Option<HeldGrant>,
    /// A detached guard of the hold is alive (a task-owned acquire waits for it).
    pub detached: bool,
}

/// The grant the client holds for one [`HoldId`], as [`Watchdog::prepare`] reports it.
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
    pub(crate) watched: u32,
    pub(crate) fixed: u32,
    /// When the next renewal is due; `None` while unwatched or while a renewal is in flight.
    pub(crate) due: Option<Instant>,
    /// The watchdog renews this grant only before this instant (the grant's send time plus the
    /// client's `max_hold`); `None` without a cap.
    pub(crate) renew_until: Option<Instant>,
}

pub(crate) struct Entry {
    pub(crate) hold: HoldId,
    /// Unique for the watchdog's lifetime: slots are reused, ids never.
    pub(crate) id: u64,
    pub(crate) grant: Option<Grant>,
    /// Detached guards alive.
    pub(crate) detached: u32,
    /// Releases of this hold in flight.
    pub(crate) releasing: u32,
    /// An acquire of this hold is in flight ([`AcquireTicket`]).
    pub(crate) acquiring: bool,
    /// What only the rare paths need, kept out of line: a client may hold 10,000 entries.
    pub(crate) extra: Option<Box<Extra>>,
}

/// The rarely used part of an entry.
#[derive(Default)]
pub(crate) struct Extra {
    pub(crate) settling: Option<(u64, Settle)>,
    /// Woken when the last detached guard goes.
    pub(crate) reattached: Option<Arc<Notify>>,
    /// Woken when the last release in flight ends.
    pub(crate) released: Option<Arc<Notify>>,
    /// Woken when the grant ends (released, lost or replaced).
    pub(crate) ended: Option<Arc<Notify>>,
    /// Woken when the acquire in flight is answered.
    pub(crate) acquired: Option<Arc<Notify>>,
}

impl Entry {
    fn is_empty(&self) -> bool {
        self.grant.is_none()
            && self.detached == 0
            && self.releasing == 0
            && !self.acquiring
            && self.extra.as_ref().is_none_or(|x| x.settling.is_none())
    }

    /// The grant, unless it is known lost.
    fn held(&self) -> Option<HeldGrant> {
        self.grant
            .as_ref()
            .filter(|g| !g.lease.is_marked_lost())
            .map(|g| HeldGrant {
                token: g.token,
                guards: u64::from(g.watched + g.fixed),
            })
    }

    fn settling(&self) -> Option<&Settle> {
        self.extra.as_ref()?.settling.as_ref().map(|(_, s)| s)
    }

    fn extra(&mut self) -> &mut Extra {
        self.extra.get_or_insert_with(Default::default)
    }
}

/// Entries live in a slab (one slot each); the index finds an entry by hold, the set orders
/// the watched grants by due time.
pub(crate) struct State {
    pub(crate) entries: Slab<Entry>,
    /// Slots, found by hashing the hold stored in the entry: the index keeps no second copy of
    /// the key (a client may hold 10,000 entries), and hashes with foldhash, not SipHash.
    index: HashTable<usize>,
    hasher: DefaultHashBuilder,
    pub(crate) due: BTreeSet<(Instant, usize)>,
    /// Fair-lock queue entries to renew ([`crate::waiting`]), and their schedule.
    pub(crate) waiting: Slab<crate::waiting::Waiting>,
    pub(crate) waiting_due: BTreeSet<(Instant, usize)>,
    pub(crate) next_id: u64,
    /// When the renewal task will next look at the schedule. A new grant wakes it only when
    /// due earlier than that: acquiring a lock costs no task wake-up in the common case.
    pub(crate) planned: Option<Instant>,
    /// Grants alive (any mode).
    pub(crate) grants: usize,
    /// The `leasehold_holds` gauge, moved with `grants`.
    pub(crate) holds_gauge: WatchdogMetrics,
}

impl State {
    /// An empty table whose grant count moves `holds_gauge`.
    pub(crate) fn new(holds_gauge: WatchdogMetrics) -> State {
        State {
            entries: Slab::new(),
            index: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
            due: BTreeSet::new(),
            waiting: Slab::new(),
            waiting_due: BTreeSet::new(),
            next_id: 0,
            planned: None,
            grants: 0,
            holds_gauge,
        }
    }

    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// The slot of `hold`'s entry, if there is one.
    pub(crate) fn find(&self, hold: &HoldId) -> Option<usize> {
        let hash = self.hasher.hash_one(hold);
        self.index
            .find(hash, |&slot| self.entries[slot].hold == *hold)
            .copied()
    }

    /// The slot of `hold`'s entry, made when missing.
    fn entry(&mut self, hold: &HoldId) -> usize {
        if let Some(slot) = self.find(hold) {
            return slot;
        }
        let id = self.next_id();
        let slot = self.entries.insert(Entry {
            hold: hold.clone(),
            id,
            grant: None,
            detached: 0,
            releasing: 0,
            acquiring: false,
            extra: None,
        });
        let hash = self.hasher.hash_one(hold);
        let (entries, hasher) = (&self.entries, &self.hasher);
        self.index
            .insert_unique(hash, slot, |&other| hasher.hash_one(&entries[other].hold));
        slot
    }

    /// Drops the entry in `slot` when nothing is left in it.
    pub(crate) fn tidy(&mut self, slot: usize) {
        if self.entries.get(slot).is_some_and(Entry::is_empty) {
            let hash = self.hasher.hash_one(&self.entries[slot].hold);
            if let Ok(found) = self.index.find_entry(hash, |&other| other == slot) {
                found.remove();
            }
            self.entries.remove(slot);
        }
    }

    /// Takes the grant out of `slot` (it ended), unscheduling it.
    pub(crate) fn end_grant(&mut self, slot: usize) -> Option<Grant> {
        let entry = self.entries.get_mut(slot)?;
        let grant = entry.grant.take()?;
        if let Some(notify) = entry.extra.as_mut().and_then(|x| x.ended.take()) {
            notify.notify_waiters();
        }
        if let Some(due) = grant.due {
            self.due.remove(&(due, slot));
        }
        self.grants -= 1;
        self.holds_gauge.holds(-1.0);
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
    lease: Arc<LeaseState>,
    entry_id: u64,
    grant_id: u64,
    /// A fixed guard's own deadline (send time + its lease - drift, moved on by
    /// [`HoldGuard::extended`]); `None` for a watched one.
    until: Option<Mutex<Instant>>,
    slot: u32,
    detached: bool,
    /// Cleared by [`HoldGuard::release`], which did the drop's work already.
    live: bool,
}

impl fmt::Debug for HoldGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HoldGuard")
            .field("watched", &self.is_watched())
            .field("detached", &self.detached)
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
        self.own_until().is_none_or(|until| Instant::now() < until)
    }

    /// A fixed guard's own deadline.
    fn own_until(&self) -> Option<Instant> {
        self.until.as_ref().map(|until| *until.lock())
    }

    /// Whether this guard is renewed by the watchdog (it has no explicit lease).
    pub fn is_watched(&self) -> bool {
        self.until.is_none()
    }

    /// The instant until which this guard's lease is certainly valid, unless renewed further.
    pub fn valid_until(&self) -> Instant {
        self.own_until().unwrap_or_else(|| self.lease.valid_until())
    }

    /// Completes when this guard's lease is lost.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn lost(&self) {
        self.lease.lost_by_any(|| self.own_until()).await
    }

    /// Why this guard's lease was lost; `None` while it is held. A fixed guard whose own
    /// deadline passed (its grant lives on for the owner's other guards) is
    /// [`LostReason::Expired`].
    pub fn lost_reason(&self) -> Option<LostReason> {
        if let Some(reason) = self.lease.lost_reason() {
            return Some(reason);
        }
        (!self.is_held()).then_some(LostReason::Expired)
    }

    /// Records that Redis confirmed this fixed guard's grant until at least `valid_until` (an
    /// extension sent at a time whose lease gives that deadline): the guard's own deadline and
    /// its grant's move on to it, never back. Returns false, and changes nothing, when the
    /// guard's lease was already lost (by its grant, or by its own deadline passing meanwhile):
    /// `false` from [`HoldGuard::is_held`] is final. A watched guard changes nothing (false).
    pub fn extended(&self, valid_until: Instant) -> bool {
        let Some(until) = &self.until else {
            return false;
        };
        let mut until = until.lock();
        if Instant::now() >= *until || !self.lease.extend(valid_until) {
            return false;
        }
        if valid_until > *until {
            *until = valid_until;
        }
        true
    }

    /// Marks this guard's grant lost ([`LostReason::Gone`]): an extension found it gone from
    /// Redis. The grant leaves the table if it is still the hold's current one, as when a
    /// renewal finds it gone.
    pub fn lose(&self) {
        self.lease.mark_lost();
        let mut state = self.shared.state.lock();
        let slot = self.slot as usize;
        let current = state
            .entries
            .get(slot)
            .filter(|e| e.id == self.entry_id)
            .and_then(|e| e.grant.as_ref())
            .is_some_and(|g| g.id == self.grant_id);
        if current {
            state.end_grant(slot);
            state.tidy(slot);
        }
    }

    /// Takes this guard out of the table as its release is about to be sent, and registers
    /// that release (see [`ReleaseTicket`]), in one step.
    ///
    /// Also says whether the guard's grant was still the hold's current one: when it is not, a
    /// later grant of the same owner exists, and the release must name its grant's token so
    /// that it cannot release that later grant.
    pub fn release(mut self, hold: &HoldId) -> (ReleaseTicket, bool) {
        let shared = self.shared.clone();
        let mut state = shared.state.lock();
        let current = state
            .entries
            .get(self.slot as usize)
            .filter(|e| e.id == self.entry_id)
            .and_then(|e| e.grant.as_ref())
            .is_some_and(|g| g.id == self.grant_id && !g.lease.is_marked_lost());
        let entry_id = self.leave(&mut state, false);
        let slot = match entry_id {
            Some(_) => self.slot as usize,
            None => state.entry(hold),
        };
        let entry = &mut state.entries[slot];
        entry.releasing += 1;
        let entry_id = entry.id;
        self.live = false;
        drop(state);
        shared.releases.fetch_add(1, Ordering::SeqCst);
        let ticket = ReleaseTicket {
            shared,
            hold: hold.clone(),
            slot,
            entry_id,
        };
        (ticket, current)
    }

    /// Takes this guard's share out of its entry; returns the entry's id if it is still there.
    /// `tidy`: drop the entry when nothing is left in it.
    fn leave(&mut self, state: &mut State, tidy: bool) -> Option<u64> {
        let slot = self.slot as usize;
        let entry = state
            .entries
            .get_mut(slot)
            .filter(|e| e.id == self.entry_id)?;
        if self.detached {
            entry.detached -= 1;
            self.shared.detached.fetch_sub(1, Ordering::SeqCst);
            if entry.detached == 0 {
                if let Some(notify) = entry.extra.as_mut().and_then(|x| x.reattached.take()) {
                    notify.notify_waiters();
                }
            }
        }
        let entry_id = entry.id;
        let mut ended = false;
        if let Some(grant) = entry.grant.as_mut().filter(|g| g.id == self.grant_id) {
            match self.until {
                None => {
                    grant.watched -= 1;
                    if grant.watched == 0 {
                        if let Some(due) = grant.due.take() {
                            state.due.remove(&(due, slot));
                        }
                    }
                }
                Some(_) => grant.fixed -= 1,
            }
            ended = state.entries[slot]
                .grant
                .as_ref()
                .is_some_and(|g| g.watched == 0 && g.fixed == 0);
        }
        if ended {
            state.end_grant(slot);
        }
        if tidy {
            state.tidy(slot);
        }
        Some(entry_id)
    }
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        if !self.live {
            return;
        }
        let shared = self.shared.clone();
        let mut state = shared.state.lock();
        self.leave(&mut state, true);
    }
}

/// A release of one hold in flight: the owner's next acquire or release of the same hold waits
/// until it is dropped (answered, or handed to a settle), so it can never overtake it.
pub struct ReleaseTicket {
    shared: Arc<Shared>,
    hold: HoldId,
    slot: usize,
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
        self.shared.releases.fetch_sub(1, Ordering::SeqCst);
        let mut state = self.shared.state.lock();
        let slot = self.slot;
        let Some(entry) = state
            .entries
            .get_mut(slot)
            .filter(|e| e.id == self.entry_id)
        else {
            return;
        };
        entry.releasing -= 1;
        if entry.releasing == 0 {
            if let Some(notify) = entry.extra.as_mut().and_then(|x| x.released.take()) {
                notify.notify_waiters();
            }
        }
        state.tidy(slot);
    }
}

/// The one acquire of a hold in flight. An owner's acquires go out one at a time, each after
/// looking at the table: two in flight together would both be plain tries (neither knows of
/// the other's grant yet), and the second would find the first's hold in Redis and replace it
/// as the orphan of a lost reply. Dropping the ticket (answered, settled or cancelled) lets
/// the next one go.
pub struct AcquireTicket {
    shared: Arc<Shared>,
    slot: usize,
    entry_id: u64,
    /// Cleared when [`Watchdog::grant`] took the ticket back in its own look at the table.
    live: bool,
}

impl fmt::Debug for AcquireTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AcquireTicket").finish_non_exhaustive()
    }
}

impl AcquireTicket {
    /// Ends the acquire in flight: the owner's next acquire may go. `slot` is the ticket's.
    fn end(&mut self, state: &mut State) {
        self.live = false;
        let Some(entry) = state
            .entries
            .get_mut(self.slot)
            .filter(|e| e.id == self.entry_id)
        else {
            return;
        };
        entry.acquiring = false;
        if let Some(notify) = entry.extra.as_mut().and_then(|x| x.acquired.take()) {
            notify.notify_waiters();
        }
    }
}

impl Drop for AcquireTicket {
    fn drop(&mut self) {
        if !self.live {
            return;
        }
        let shared = self.shared.clone();
        let mut state = shared.state.lock();
        self.end(&mut state);
        state.tidy(self.slot);
    }
}

impl Watchdog {
    /// Takes the ticket for an acquire of `hold` and reads what it must know, in one look at
    /// the table; `None` while another acquire of the hold is in flight (a future of the same
    /// task, or a task sharing an explicit owner): wait with [`Watchdog::until_acquired`].
    pub fn begin_acquire(&self, hold: &HoldId) -> Option<(AcquireTicket, Prepared)> {
        let mut state = self.shared.state.lock();
        let slot = state.entry(hold);
        let entry = &mut state.entries[slot];
        if entry.acquiring {
            return None;
        }
        entry.acquiring = true;
        let prepared = Prepared {
            grant: entry.held(),
            detached: entry.detached > 0,
        };
        let ticket = AcquireTicket {
            shared: self.shared.clone(),
            slot,
            entry_id: entry.id,
            live: true,
        };
        Some((ticket, prepared))
    }

    /// Waits until no acquire of `hold` is in flight, or until `deadline`; false on the
    /// deadline.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn until_acquired(&self, hold: &HoldId, deadline: Instant) -> bool {
        self.until_entry(hold, Some(deadline), |e| !e.acquiring, |x| &mut x.acquired)
            .await
    }

    /// Registers a release of `hold` about to be sent; see [`ReleaseTicket`].
    pub fn begin_release(&self, hold: &HoldId) -> ReleaseTicket {
        let mut state = self.shared.state.lock();
        let slot = state.entry(hold);
        let entry = &mut state.entries[slot];
        entry.releasing += 1;
        self.shared.releases.fetch_add(1, Ordering::SeqCst);
        ReleaseTicket {
            shared: self.shared.clone(),
            hold: hold.clone(),
            slot,
            entry_id: entry.id,
        }
    }

    /// Records a grant answered by the acquire of `hold` that holds `ticket`, sent at
    /// `sent_at`: `hold_count` 1 is a new grant, more a re-entry of the grant `token`. Returns
    /// the new guard's share; the ticket ends in the same look at the table.
    ///
    /// A new grant (or a re-entry with a token the table does not have) while the table has a
    /// grant for the hold means Redis no longer had that one (force-unlocked, expired, lost
    /// with Redis's data): its guards are marked lost for good, and the new grant gets an
    /// entry of its own, so a renewal verdict still in flight for the old one cannot touch it.
    pub fn grant(
        &self,
        mut ticket: AcquireTicket,
        hold: &HoldId,
        token: FencingToken,
        hold_count: u64,
        mode: LeaseMode,
        sent_at: Instant,
    ) -> HoldGuard {
        let watched_lease = self.shared.config.lease;
        let renew_until = self
            .shared
            .config
            .max_hold
            .and_then(|max_hold| sent_at.checked_add(max_hold));
        let lease = match mode {
            LeaseMode::Watched => watched_lease,
            LeaseMode::Fixed(lease) => lease,
        };
        let valid_until = lease.valid_until(sent_at);
        let mut state = self.shared.state.lock();
        // The ticket's entry is the hold's (an entry with an acquire in flight stays).
        let slot = if state
            .entries
            .get(ticket.slot)
            .is_some_and(|e| e.id == ticket.entry_id)
        {
            ticket.slot
        } else {
            state.entry(hold)
        };
        ticket.end(&mut state);
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
                renew_until,
            });
            state.grants += 1;
            state.holds_gauge.holds(1.0);
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
            lease: grant_lease,
            entry_id,
            grant_id,
            until: match mode {
                LeaseMode::Watched => None,
                LeaseMode::Fixed(_) => Some(Mutex::new(valid_until)),
            },
            slot: slot as u32,
            detached: false,
            live: true,
        }
    }

    /// What an acquire of `hold` must know first, in one look at the table: the grant the
    /// client holds (a re-entry; a lost grant counts as none), and whether a detached guard of
    /// it lives elsewhere.
    pub fn prepare(&self, hold: &HoldId) -> Prepared {
        let state = self.shared.state.lock();
        let Some(slot) = state.find(hold) else {
            return Prepared::default();
        };
        let entry = &state.entries[slot];
        Prepared {
            grant: entry.held(),
            detached: entry.detached > 0,
        }
    }

    /// The live guards of `hold`'s grant `token` (0 when `token` is `None`, or the client holds
    /// another grant or none): the owner's hold count in Redis for that grant, as far as the
    /// client knows. What a settle compares against.
    pub fn guards_in(&self, hold: &HoldId, token: Option<FencingToken>) -> u64 {
        let state = self.shared.state.lock();
        state
            .find(hold)
            .and_then(|slot| state.entries[slot].held())
            .filter(|grant| Some(grant.token) == token)
            .map_or(0, |grant| grant.guards)
    }

    /// Marks the grant `token` of `hold` lost: an acquire found it gone from Redis.
    pub fn lose(&self, hold: &HoldId, token: FencingToken) {
        let mut state = self.shared.state.lock();
        let Some(slot) = state.find(hold) else {
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
            .get_mut(guard.slot as usize)
            .filter(|e| e.id == guard.entry_id)
        {
            entry.detached += 1;
            guard.detached = true;
            self.shared.detached.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Waits until no detached guard of `hold` is alive, or until `deadline`; false on the
    /// deadline.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn until_attached(&self, hold: &HoldId, deadline: Option<Instant>) -> bool {
        self.until_entry(hold, deadline, |e| e.detached == 0, |x| &mut x.reattached)
            .await
    }

    /// Waits until the owner of `hold` holds no grant the client knows to be live (its guards
    /// are gone, or the grant was lost or ran out), or until `deadline`; false on the deadline.
    /// A non-reentrant acquire waits here instead of re-entering.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn until_released(&self, hold: &HoldId, deadline: Option<Instant>) -> bool {
        // `is_held` also ends a fixed-lease grant whose deadline passed: Redis has expired it,
        // and no renewal will ever say so; the lease's own timer wakes this wait for it.
        let released = |e: &Entry| e.grant.as_ref().is_none_or(|g| !g.lease.is_held());
        loop {
            let lease = {
                let state = self.shared.state.lock();
                let grant = state
                    .find(hold)
                    .and_then(|s| state.entries[s].grant.as_ref());
                match grant.filter(|g| g.lease.is_held()) {
                    Some(grant) => grant.lease.clone(),
                    None => return true,
                }
            };
            tokio::select! {
                done = self.until_entry(hold, deadline, released, |x| &mut x.ended) => {
                    return done;
                }
                () = lease.lost_by(None) => {}
            }
        }
    }

    /// Waits until `settled` holds for `hold`'s entry (or the hold has no entry), woken by the
    /// `Notify` that `notify` picks in the entry's rare part; false at `deadline`. Every wait
    /// on one hold's state (a detached guard, a release, an acquire, a grant) is this one.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    async fn until_entry(
        &self,
        hold: &HoldId,
        deadline: Option<Instant>,
        settled: impl Fn(&Entry) -> bool,
        notify: impl Fn(&mut Extra) -> &mut Option<Arc<Notify>>,
    ) -> bool {
        loop {
            let woken_by = {
                let mut state = self.shared.state.lock();
                let Some(slot) = state.find(hold) else {
                    return true;
                };
                let entry = &mut state.entries[slot];
                if settled(entry) {
                    return true;
                }
                notify(entry.extra())
                    .get_or_insert_with(Default::default)
                    .clone()
            };
            let done = || {
                let state = self.shared.state.lock();
                state
                    .find(hold)
                    .is_none_or(|slot| settled(&state.entries[slot]))
            };
            if !notified_unless(&woken_by, done, deadline).await {
                return false;
            }
        }
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
        let previous = state.entries[slot].extra().settling.take().map(|(_, s)| s);
        self.shared.settles.fetch_add(1, Ordering::SeqCst);
        let shared = Arc::downgrade(&self.shared);
        let (entry_id, hold_key) = (state.entries[slot].id, hold.clone());
        let settle: Settle = async move {
            if let Some(previous) = previous {
                previous.await;
            }
            work.await;
            if let Some(shared) = shared.upgrade() {
                shared.settles.fetch_sub(1, Ordering::SeqCst);
                let mut state = shared.state.lock();
                if let Some(slot) = state.find(&hold_key) {
                    let entry = &mut state.entries[slot];
                    let same_entry = entry.id == entry_id;
                    let extra = entry.extra();
                    if same_entry
                        && extra
                            .settling
                            .as_ref()
                            .is_some_and(|(g, _)| *g == generation)
                    {
                        extra.settling = None;
                        state.tidy(slot);
                    }
                }
            }
        }
        .boxed()
        .shared();
        state.entries[slot].extra().settling = Some((generation, settle.clone()));
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

    /// Whether nothing is in flight for any hold: then [`Watchdog::settled`] and
    /// [`Watchdog::repaired`] would return at once, and the caller need not build their
    /// futures (this is the hot path of every acquire and release).
    pub fn is_quiet(&self, releases_too: bool) -> bool {
        self.shared.settles.load(Ordering::SeqCst) == 0
            && (!releases_too || self.shared.releases.load(Ordering::SeqCst) == 0)
    }

    /// Whether nothing is in flight for `hold` (one table look, no waiting): the check before
    /// [`Watchdog::settled`] when other holds have something in flight.
    pub fn is_settled(&self, hold: &HoldId) -> bool {
        if self.is_quiet(true) {
            return true;
        }
        let state = self.shared.state.lock();
        state.find(hold).is_none_or(|slot| {
            let entry = &state.entries[slot];
            entry.releasing == 0 && entry.settling().is_none()
        })
    }

    async fn quiet(&self, hold: &HoldId, within: Duration, releases_too: bool) -> bool {
        if self.is_quiet(releases_too) {
            return true; // nothing in flight anywhere: no table look
        }
        let deadline = Instant::now() + within;
        loop {
            let (settle, releasing) = {
                let state = self.shared.state.lock();
                let Some(slot) = state.find(hold) else {
                    return true;
                };
                let entry = &state.entries[slot];
                (entry.settling().cloned(), entry.releasing > 0)
            };
            if let Some(settle) = settle {
                if tokio::time::timeout_at(deadline, settle).await.is_err() {
                    return false;
                }
            } else if !(releases_too && releasing) {
                return true;
            } else if !self
                .until_entry(
                    hold,
                    Some(deadline),
                    |e| e.releasing == 0,
                    |x| &mut x.released,
                )
                .await
            {
                return false;
            }
        }
    }
}

/// Waits for `notify` unless `done()` holds once the wait is armed: a notification between
/// the caller's look at the table and this call is not lost. False at the deadline.
async fn notified_unless(
    notify: &Notify,
    done: impl Fn() -> bool,
    deadline: Option<Instant>,
) -> bool {
    let notified = notify.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    if done() {
        return true;
    }
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, notified).await.is_ok(),
        None => {
            notified.await;
            true
        }
    }
}
