//! [`Lock`]: a handle on one named lock, and every way to acquire it.

use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::commands::{self, AcquireMode, ReleaseKind};
use leasehold_core::telemetry::{LockMetrics, Outcome};
use leasehold_core::{
    DropGuard, FencingToken, HoldId, Lease, LockError, LockKeys, Owner, Result, Synced,
};
use leasehold_pubsub::Place;
use leasehold_watchdog::{AcquireTicket, HoldGuard, LeaseMode, Prepared, WaitingEntry};
use tokio::time::Instant;

use crate::client::{within, ClientInner};
use crate::guard::LockGuard;
use crate::release::{settle, Release};
use crate::wait::{self, Attempt, Line, Tried};

/// A handle on one reentrant distributed lock. Cheap to clone; nothing is sent until you
/// acquire.
///
/// Holds are counted per owner: by default the current tokio task, so nested acquires in one
/// task re-enter (the hold count rises) and the lock is free once each hold is released. Use
/// [`Lock::with_owner`] to share one hold across tasks. A guard stays with the task that
/// acquired it (it borrows this handle); to hand it to another task, [`LockGuard::detach`] it:
/// the task then waits for it like any other task instead of re-entering.
///
/// [`Lock::non_reentrant`] turns re-entry off: a second acquire by the same owner waits for
/// the first hold to end instead.
#[derive(Clone)]
pub struct Lock {
    client: Arc<ClientInner>,
    keys: LockKeys,
    owner: Option<Owner>,
    reentrant: bool,
    /// Permits one acquisition takes (a semaphore's; 1 for the locks).
    permits: u32,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.keys.name())
            .field("key", &self.keys.hash())
            .field("owner", &self.owner)
            .field("reentrant", &self.reentrant)
            .field("fair", &self.keys.is_fair())
            .finish()
    }
}

impl Lock {
    pub(crate) fn new(client: Arc<ClientInner>, keys: LockKeys) -> Lock {
        Lock {
            client,
            keys,
            owner: None,
            reentrant: true,
            permits: 1,
        }
    }

    /// This handle, taking `permits` per acquisition (a semaphore's handle).
    pub(crate) fn with_permits(mut self, permits: u32) -> Lock {
        self.permits = permits;
        self
    }

    /// The client this handle belongs to.
    pub(crate) fn client(&self) -> &Arc<ClientInner> {
        &self.client
    }

    /// This handle on other keys (another kind's, for the same name).
    pub(crate) fn with_keys(mut self, keys: LockKeys) -> Lock {
        self.keys = keys;
        self
    }

    /// The lock name. Example:
    /// [`LockClientBuilder::prefix`](crate::LockClientBuilder::prefix)'s.
    pub fn name(&self) -> &str {
        self.keys.name()
    }

    /// The lock's keys and channel, for looking at its state with other tools. Example:
    /// [`LockClientBuilder::prefix`](crate::LockClientBuilder::prefix)'s.
    pub fn keys(&self) -> &LockKeys {
        &self.keys
    }

    /// This handle, acquiring under `owner` instead of the current task. Tasks sharing an owner
    /// share (and re-enter) one hold; two futures joined in one task that must exclude each
    /// other use two owners.
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let job = client.new_owner(); // one hold for the whole job, whichever task runs a step
    /// let lock = client.lock("import")?.with_owner(job.clone());
    /// assert_eq!(lock.owner(), job);
    /// let guard = lock.lock().await?;
    /// let step = tokio::spawn({
    ///     let lock = lock.clone();
    ///     async move {
    ///         let inner = lock.lock().await?; // another task, the same owner: re-enters
    ///         let count = inner.hold_count();
    ///         inner.unlock().await.map(|()| count)
    ///     }
    /// });
    /// assert_eq!(step.await.unwrap()?, 2);
    /// guard.unlock().await?;
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    pub fn with_owner(mut self, owner: Owner) -> Lock {
        self.owner = Some(owner);
        self
    }

    /// This handle, without re-entry: an acquire by an owner that already holds the lock waits
    /// until that hold ends (and `try_lock` returns `None`), then competes like any other
    /// owner and gets a new grant with a new fencing token. The hold count is always 1.
    ///
    /// For code where re-entering by accident is the danger: two futures joined in one task
    /// are one owner, so with the reentrant lock both would enter the critical section at once.
    /// Here the second waits for the first:
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let lock = client.lock("stock:last-item")?.non_reentrant();
    /// let sell = || async {
    ///     let guard = lock.lock().await?;
    ///     let token = guard.fencing_token();
    ///     guard.unlock().await?;
    ///     Ok::<_, leasehold::LockError>(token)
    /// };
    /// let (a, b) = tokio::join!(sell(), sell()); // one task, one owner
    /// assert_ne!(a?, b?); // two grants, one after the other
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    ///
    /// A waiting acquire that waits on its own task's hold never ends if nothing else in that
    /// task releases it (as with a `tokio::sync::Mutex` locked twice): bound such waits with
    /// [`Lock::try_lock_for`].
    pub fn non_reentrant(mut self) -> Lock {
        self.reentrant = false;
        self
    }

    /// Whether this is a fair lock ([`LockClient::fair_lock`](crate::LockClient::fair_lock)):
    /// waiters are served in arrival order.
    pub fn is_fair(&self) -> bool {
        self.keys.is_fair()
    }

    /// Whether an owner's second acquire re-enters its hold (the default) or waits for it to
    /// end ([`Lock::non_reentrant`]).
    pub fn is_reentrant(&self) -> bool {
        self.reentrant
    }

    /// The owner an acquire from here would use right now: the handle's explicit owner, or
    /// the current task's. Example: [`Lock::with_owner`]'s.
    pub fn owner(&self) -> Owner {
        self.owner
            .clone()
            .unwrap_or_else(|| self.client.id.current_owner())
    }

    /// Tries once, without waiting; the hold is renewed by the watchdog while the guard lives.
    /// `Ok(None)` when another owner holds the lock.
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let lock = client.lock("report:daily")?;
    /// match lock.try_lock().await? {
    ///     Some(guard) => {
    ///         // ... generate the report ...
    ///         guard.unlock().await?;
    ///     }
    ///     None => println!("another instance is running the report; skipping"),
    /// }
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped after the script was sent, the acquire is undone
    /// in the background (if it ran); the lease bounds the hold if even that fails.
    pub async fn try_lock(&self) -> Result<Option<LockGuard<'_>>> {
        self.acquire(Some(Duration::ZERO), None).await
    }

    /// Tries once, without waiting, with an explicit lease: no renewal, the hold ends exactly
    /// at `lease` unless released earlier.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for a lease under 1 ms or over
    /// [`MAX_LEASE`](crate::MAX_LEASE).
    ///
    /// # Cancel safety
    /// As [`Lock::try_lock`].
    pub async fn try_lock_with_lease(&self, lease: Duration) -> Result<Option<LockGuard<'_>>> {
        self.acquire(Some(Duration::ZERO), Some(lease)).await
    }

    /// Waits until the lock is acquired; watched lease. Woken by the release message, or when
    /// the holder's lease would end (a crashed holder publishes nothing). Transient Redis errors
    /// are retried with backoff while waiting; wrap in `tokio::time::timeout` or use
    /// [`Lock::try_lock_for`] to bound the wait.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future at any await point leaves no hold (an acquire in flight
    /// is undone), no subscription and no waiter entry behind.
    pub async fn lock(&self) -> Result<LockGuard<'_>> {
        let guard = self.acquire(None, None).await?;
        Ok(guard.expect("an unbounded wait returns only when acquired"))
    }

    /// Waits until acquired, with an explicit lease (no renewal).
    ///
    /// # Cancel safety
    /// As [`Lock::lock`].
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard<'_>> {
        let guard = self.acquire(None, Some(lease)).await?;
        Ok(guard.expect("an unbounded wait returns only when acquired"))
    }

    /// Waits at most `wait`; `Ok(None)` when it timed out. `Duration::ZERO` tries once and never
    /// waits (Redisson's `tryLock(0, SECONDS)`).
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// use std::time::Duration;
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let lock = client.lock("inventory:42")?;
    /// let Some(guard) = lock.try_lock_for(Duration::from_secs(2)).await? else {
    ///     return Ok(()); // still busy after 2 s
    /// };
    /// guard.unlock().await?;
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    ///
    /// # Cancel safety
    /// As [`Lock::lock`].
    pub async fn try_lock_for(&self, wait: Duration) -> Result<Option<LockGuard<'_>>> {
        self.acquire(Some(wait), None).await
    }

    /// Waits at most `wait`, with an explicit lease (no renewal).
    ///
    /// # Cancel safety
    /// As [`Lock::lock`].
    pub async fn try_lock_for_with_lease(
        &self,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<LockGuard<'_>>> {
        self.acquire(Some(wait), Some(lease)).await
    }

    /// Whether any owner holds the lock right now (a grant the line made to a waiter that has
    /// not taken it yet, and an `unlock_after` tail, count as held). A snapshot, for dashboards and checks: it may change as soon as it
    /// is read, so to act on a free lock, [`try_lock`](Lock::try_lock) it.
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let lock = client.lock("report:daily")?;
    /// assert!(!lock.is_locked().await?);
    /// let guard = lock.lock().await?;
    /// assert!(lock.is_locked().await?); // by any owner: this one too
    /// guard.unlock().await?;
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    pub async fn is_locked(&self) -> Result<bool> {
        let client = &self.client;
        client
            .call(
                client.command_timeout,
                commands::is_locked(&client.redis, &self.keys),
            )
            .await
    }

    /// The hold count of [`Lock::owner`] in Redis (0 if it holds nothing).
    pub async fn hold_count(&self) -> Result<u64> {
        let client = &self.client;
        client
            .call(
                client.command_timeout,
                commands::hold_count(&client.redis, &self.keys, &self.owner()),
            )
            .await
    }

    /// Releases one hold of [`Lock::owner`] without its guard (Redisson's `lock.unlock()`):
    /// for holds whose guard was forgotten or lives elsewhere. Prefer [`LockGuard::unlock`]: a
    /// guard still alive for this owner will release one more hold when it goes.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] when the owner holds nothing here (wrong owner, expired, double
    /// unlock); nothing changed in Redis.
    ///
    /// # Cancel safety
    /// Cancel safe: a release in flight when the future is dropped is settled in the background.
    pub async fn unlock(&self) -> Result<()> {
        let hold = HoldId::new(self.keys.clone(), self.owner());
        let grant = self.client.holds.prepare(&hold).grant;
        Release {
            _ticket: self.client.holds.begin_release(&hold),
            client: self.client.clone(),
            token: grant.map(|g| g.token),
            checked: false,
            hold,
            kind: ReleaseKind::Now,
            ends_within: self.client.holds.lease().duration(),
        }
        .send()
        .await
    }

    /// Releases the lock whoever holds it, and wakes its waiters. For operators: the holder is
    /// not told until its next renewal finds the lock gone. Returns whether a lock was removed.
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let lock = client.lock("import")?;
    /// let stuck = lock.lock().await?; // a holder that hangs
    /// assert!(lock.force_unlock().await?); // the operator frees the lock
    /// assert!(!lock.is_locked().await?);
    /// assert!(!lock.force_unlock().await?); // nothing left to remove
    /// drop(stuck); // its release finds the grant gone
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    pub async fn force_unlock(&self) -> Result<bool> {
        let client = &self.client;
        // Boxed: an operator's call, and a script call's future is large in a debug build.
        Box::pin(client.call(
            client.command_timeout,
            commands::force_unlock(&client.redis, &client.scripts, &self.keys),
        ))
        .await
    }

    /// Acquires with a wait of `wait` (`None`: no limit; zero: one try) and an explicit
    /// `lease` (`None`: watched).
    ///
    /// Re-entry never waits: when the owner already holds the lock, one try re-enters it (a
    /// non-reentrant handle waits here until that hold ends, without sending anything).
    /// Otherwise the waiting engine ([`crate::wait`]) drives [`LockAttempt`].
    ///
    /// Counted in the metrics (`leasehold_acquisitions_total`, `leasehold_wait_seconds`).
    pub(crate) async fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Option<LockGuard<'_>>> {
        Ok(match self.acquire_tried(wait, lease).await? {
            Tried::Granted(guard) => Some(guard),
            Tried::Busy(_) => None,
        })
    }

    /// As [`Lock::acquire`], and a one-try acquire that found the lock busy says for how long
    /// at most (the holder's remaining lease, or a dead waiter's entry ahead): a caller that waits its own
    /// way (a [`RedLock`](crate::RedLock)) sleeps on it.
    pub(crate) async fn acquire_tried(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Tried<LockGuard<'_>>> {
        let started = Instant::now();
        // A span only when its level is on: when off, the hot path builds none and stays
        // unboxed.
        let span = tracing::info_span!(
            "leasehold.acquire",
            lock = %self.keys.name(),
            owner = tracing::field::Empty,
            token = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let result = if span.is_disabled() {
            self.acquire_uncounted(wait, lease).await
        } else {
            span.record("owner", tracing::field::display(self.owner()));
            let acquire = self.acquire_uncounted(wait, lease);
            Box::pin(tracing::Instrument::instrument(acquire, span.clone())).await
        };
        let (outcome, waited) = match &result {
            Ok(Tried::Granted(_)) => (Outcome::Granted, Some(started.elapsed())),
            Ok(Tried::Busy(_)) if wait == Some(Duration::ZERO) => (Outcome::Busy, None),
            Ok(Tried::Busy(_)) => (Outcome::TimedOut, None),
            Err(_) => (Outcome::Error, None),
        };
        if !span.is_disabled() {
            span.record("outcome", outcome.as_str());
            if let Ok(Tried::Granted(guard)) = &result {
                span.record("token", guard.fencing_token().get());
            }
        }
        self.client
            .metrics
            .of(self.keys.kind())
            .acquisition(outcome, waited);
        result
    }

    async fn acquire_uncounted(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Tried<LockGuard<'_>>> {
        let (mode, lease) = match lease {
            None => (LeaseMode::Watched, self.client.holds.lease()),
            Some(lease) => {
                let lease = Lease::new(lease)?;
                (LeaseMode::Fixed(lease), lease)
            }
        };
        let client = &self.client;
        let deadline = wait.map(|w| Instant::now() + w.min(leasehold_core::MAX_LEASE));
        let mut attempt = LockAttempt {
            client,
            hold: HoldId::new(self.keys.clone(), self.owner()),
            mode,
            lease,
            reentrant: self.reentrant,
            task_owned: self.owner.is_none(),
            entry: None,
            permits: self.permits,
            place: AtomicI64::new(NO_PLACE),
            ahead: AtomicU64::new(NO_RANK),
            heard: parking_lot::Mutex::new(None),
        };
        // The first try's ticket is taken in the same look at the table that reads what the
        // acquire must know (one look on the hot path). It is let go before any local wait,
        // and when another acquire of the owner is in flight the try waits for its own.
        let mut taken = client.holds.begin_acquire(&attempt.hold);
        let mut prepared = match &taken {
            Some((_, prepared)) => *prepared,
            None => client.holds.prepare(&attempt.hold),
        };
        // A read/write lock's other side, held by the same owner. A detached guard of it lives
        // in another task: this task waits for it like any other task (otherwise a read would
        // pass for that writer's downgrade). A read hold it keeps would make a write wait for
        // itself: refused at once.
        if let Some(side) = self.keys.kind().other_side() {
            let other = HoldId::new(self.keys.of_kind(side), attempt.hold.owner.clone());
            let mut seen = client.holds.prepare(&other);
            if seen.detached && self.owner.is_none() {
                taken = None;
                if !Box::pin(client.holds.until_attached(&other, deadline)).await {
                    return Ok(Tried::Busy(None));
                }
                seen = client.holds.prepare(&other);
                prepared = client.holds.prepare(&attempt.hold);
            }
            if self.keys.traits().exclusive && prepared.grant.is_none() && seen.grant.is_some() {
                return Err(LockError::UpgradeRefused {
                    name: self.keys.name().to_string(),
                });
            }
        }
        // A detached guard of this task's hold lives in another task: this task waits for it
        // like any other task instead of re-entering it. (A handle with an explicit owner
        // re-enters on purpose: see LockGuard::reentrant.)
        if prepared.detached && self.owner.is_none() {
            taken = None;
            if !Box::pin(client.holds.until_attached(&attempt.hold, deadline)).await {
                return Ok(Tried::Busy(None));
            }
            prepared = client.holds.prepare(&attempt.hold);
        }
        // Non-reentrant: the owner's own hold is waited for locally. Nothing may reach Redis
        // while it lives: the acquire script takes a hold of the same owner that the client does
        // not re-enter on purpose for an orphan, and would replace it.
        if !self.reentrant && prepared.grant.is_some() {
            taken = None;
            if wait == Some(Duration::ZERO)
                || !Box::pin(client.holds.until_released(&attempt.hold, deadline)).await
            {
                return Ok(Tried::Busy(None));
            }
            prepared = client.holds.prepare(&attempt.hold);
        }
        if self.reentrant && prepared.grant.is_some() {
            match attempt
                .try_once(false, client.budget(deadline), taken.take())
                .await?
            {
                Tried::Granted(granted) => return Ok(Tried::Granted(self.guard(granted))),
                // The grant is gone (expired, force-unlocked): wait like anyone else.
                Tried::Busy(_) => {}
            }
        }
        if wait == Some(Duration::ZERO) {
            // try_lock: one try and nothing to wait for, so no place in line and no turn.
            return Ok(
                match attempt
                    .try_once(false, client.command_timeout, taken.take())
                    .await?
                {
                    Tried::Granted(granted) => Tried::Granted(self.guard(granted)),
                    Tried::Busy(busy_for) => Tried::Busy(busy_for),
                },
            );
        }
        // The engine's tries take their own tickets. Boxed: the waiting engine's state is
        // large, and a try that is granted at once (the common case) should not carry it.
        drop(taken);
        let granted = Box::pin(wait::acquire(client, &self.keys, &mut attempt, deadline)).await?;
        Ok(granted.map_or(Tried::Busy(None), |granted| {
            Tried::Granted(self.guard(granted))
        }))
    }

    fn guard(&self, granted: Granted) -> LockGuard<'_> {
        LockGuard::new(
            self.client.clone(),
            HoldId::new(self.keys.clone(), granted.owner),
            granted.fence,
            granted.hold_count,
            granted.share,
            self.owner.is_none(),
            granted.synced,
        )
    }
}

impl LockGuard<'_> {
    /// A handle on this lock that acquires under this guard's owner, so its acquires re-enter
    /// this hold. For a worker that received a [detached](LockGuard::detach) guard and calls
    /// code that locks the same lock again: through the plain handle it would wait for its own
    /// guard, as a `tokio::sync::Mutex` locked twice does.
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let lock = client.lock("ledger")?;
    /// let guard = lock.lock().await?.detach();
    /// tokio::spawn(async move {
    ///     let again = guard.reentrant();
    ///     let inner = again.try_lock().await?.expect("re-enters its own hold");
    ///     assert_eq!(inner.hold_count(), 2);
    ///     inner.unlock().await?;
    ///     guard.unlock().await
    /// })
    /// .await
    /// .unwrap()?;
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    pub fn reentrant(&self) -> Lock {
        Lock::new(self.client().clone(), self.hold().keys.clone())
            .with_owner(self.hold().owner.clone())
    }
}

/// A grant of the plain lock, before it becomes a guard.
pub(crate) struct Granted {
    owner: Owner,
    fence: FencingToken,
    hold_count: u64,
    share: HoldGuard,
    /// What the grant reached under the client's replica sync policy (`None`: no policy).
    synced: Option<Synced>,
}

/// One acquire of the plain lock: the acquire script for one hold and lease.
struct LockAttempt<'c> {
    client: &'c Arc<ClientInner>,
    hold: HoldId,
    mode: LeaseMode,
    lease: Lease,
    reentrant: bool,
    /// Acquiring under the task's own owner: a detached guard of the hold is not re-entered.
    task_owned: bool,
    /// A fair lock's waiter: its queue entry in Redis, renewed by the watchdog from the first
    /// busy try until this acquire ends.
    entry: Option<WaitingEntry>,
    /// Permits a semaphore's acquisition takes.
    permits: u32,
    /// A waiter of a kind with a line of its own: its place in line (its score, as the last
    /// busy reply said; [`NO_PLACE`] until then). A settle of its try puts it back there.
    place: AtomicI64,
    /// Such a waiter's rank in its line as the last busy reply said ([`NO_RANK`]: none).
    ahead: AtomicU64,
    /// A lock waiter in line: what a grant message must show to be for this wait, as its last
    /// busy try said.
    heard: parking_lot::Mutex<Option<InLine>>,
}

/// What a lock waiter's last busy try in line said: a grant the line makes from then on has a
/// token above `counter`, made (and its lease started) no earlier than `sent_at`.
#[derive(Clone, Copy)]
struct InLine {
    counter: u64,
    sent_at: Instant,
}

/// [`LockAttempt::place`] before a busy reply gave one.
const NO_PLACE: i64 = i64::MIN;
/// [`LockAttempt::ahead`] when no busy reply gave one.
const NO_RANK: u64 = u64::MAX;

impl Attempt for LockAttempt<'_> {
    type Grant = Granted;

    async fn attempt(&mut self, in_line: bool, budget: Duration) -> Result<Tried<Granted>> {
        let in_line = in_line || self.hold.keys.has_own_lines();
        let tried = self.try_once(in_line, budget, None).await;
        if matches!(tried, Ok(Tried::Busy(None))) && !self.hold.keys.has_own_lines() {
            // Busy without asking Redis: the owner's own hold (another future of the task, or
            // a detached guard of it) keeps this acquire out. A plain lock's release tells
            // nobody in this client (its channel is shared with other owners' waiters), so the
            // end of that hold is waited for here, in the hold table, within the try's budget;
            // the engine then looks again at once.
            let prepared = self.client.holds.prepare(&self.hold);
            let until = Some(Instant::now() + budget);
            let ended = if prepared.detached && self.task_owned {
                Box::pin(self.client.holds.until_attached(&self.hold, until)).await
            } else if prepared.grant.is_some() {
                Box::pin(self.client.holds.until_released(&self.hold, until)).await
            } else {
                false
            };
            if ended {
                return Ok(Tried::Busy(Some(Duration::ZERO)));
            }
        }
        if in_line && self.entry.is_none() && matches!(tried, Ok(Tried::Busy(_)) | Err(_)) {
            // The try queued the owner, or may have (its reply never came): from now on its
            // entry must be renewed, and with it a grant the line makes to it before this
            // waiter can take it (renew.lua).
            self.entry = Some(self.client.holds.keep_waiting(&self.hold));
        }
        tried
    }

    fn heard(&mut self, place: &Place) -> Option<Granted> {
        let in_line = (*self.heard.lock())?;
        // A grant names the field its hold is counted in: the owner, or a reader's field (an
        // owner's read and write sides hear on one channel).
        let field = self.hold.keys.kind().hold_field(self.hold.owner.id());
        let (fence, lease_ms) = place.granted(&field, in_line.counter)?;
        self.take_heard(FencingToken::new(fence), lease_ms, in_line.sent_at)
    }

    fn line(&self) -> Line {
        let keys = &self.hold.keys;
        let mut channel = keys.waiter_channel_prefix();
        let owner = self.hold.owner.clone();
        if keys.has_own_lines() {
            channel.push_str(owner.id());
            Line::Own { channel, owner }
        } else {
            channel.push_str(self.client.id.as_str());
            Line::Client { channel, owner }
        }
    }

    fn metrics(&self) -> &LockMetrics {
        self.client.metrics.of(self.hold.keys.kind())
    }

    fn ahead(&self) -> Option<u64> {
        Some(self.ahead.load(Ordering::Relaxed)).filter(|&rank| rank != NO_RANK)
    }
}

impl LockAttempt<'_> {
    /// One try, decided by what the hold table says once this acquire holds the hold's
    /// [`AcquireTicket`] (an owner's acquires go out one at a time; see the ticket). `taken`:
    /// a ticket the caller took already, with what the table said then.
    ///
    /// - The owner holds a grant: a reentrant lock re-enters it (another future of the task got
    ///   the lock while this one waited in line; a plain try would find the owner's hold in
    ///   Redis and replace it as an orphan, ending that future's grant under it), unless its
    ///   guard was detached meanwhile (the hold then belongs to the guard's task: wait for it
    ///   like any other task). A non-reentrant lock is busy until that hold ends. Either wait
    ///   is woken by the hold's release message.
    /// - Otherwise a plain try, or a waiter's try `in_line`. On a fair lock, every try of the
    ///   waiting engine is a waiter's try, subscribed or not: the owner's place in line is its
    ///   first try's arrival.
    async fn try_once(
        &self,
        in_line: bool,
        budget: Duration,
        taken: Option<(AcquireTicket, Prepared)>,
    ) -> Result<Tried<Granted>> {
        let client = self.client;
        let mut budget = budget;
        let mut taken = taken;
        let (ticket, prepared) = loop {
            if let Some(taken) = taken
                .take()
                .or_else(|| client.holds.begin_acquire(&self.hold))
            {
                break taken;
            }
            let started = Instant::now();
            if !Box::pin(client.holds.until_acquired(&self.hold, started + budget)).await {
                return Err(LockError::Timeout);
            }
            budget = budget
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(1));
        };
        let mode = match (prepared.grant, self.reentrant) {
            (Some(grant), true) if !(prepared.detached && self.task_owned) => {
                AcquireMode::Reenter(grant.token)
            }
            (Some(_), _) => return Ok(Tried::Busy(None)),
            (None, reentrant) if in_line => AcquireMode::Waiter {
                entry_life: client.holds.lease(),
                non_reentrant: !reentrant,
                fixed_lease: matches!(self.mode, LeaseMode::Fixed(_)),
            },
            (None, true) => AcquireMode::Try,
            (None, false) => AcquireMode::NonReentrant,
        };
        let tried = self.send(mode, budget, ticket).await?;
        if let (AcquireMode::Reenter(token), Tried::Busy(_)) = (mode, &tried) {
            // The grant is gone (expired, force-unlocked): the next try competes as anyone.
            // (A re-entry takes the owner out of its line in the script.)
            client.holds.lose(&self.hold, token);
        }
        Ok(tried)
    }

    /// One acquire script call, within `budget`. If the reply never comes (timeout, connection
    /// lost, or this future dropped while the call is in flight) the acquire is settled in the
    /// background.
    async fn send(
        &self,
        mode: AcquireMode,
        budget: Duration,
        ticket: AcquireTicket,
    ) -> Result<Tried<Granted>> {
        // Handed to the table with the grant, or dropped last, after the settle is registered
        // (locals drop in reverse order): the owner's next acquire then sees either.
        let ticket = ticket;
        let client = self.client;
        // An earlier unanswered command of this hold may have left a hold that this acquire
        // would re-enter; it is settled first, within the same budget. (Boxed: in the common
        // case, nothing in flight for this hold, this future is never built.)
        let mut budget = budget;
        if !client.holds.is_settled(&self.hold) {
            let started = Instant::now();
            if !Box::pin(client.holds.settled(&self.hold, budget)).await {
                return Err(LockError::Timeout);
            }
            budget = budget
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(1));
        }
        let budget = client.start(budget).await;
        // Armed only now: dropped while waiting for the connection, nothing was sent.
        let reentered = match mode {
            AcquireMode::Reenter(token) => Some(token),
            _ => None,
        };
        let waiter = matches!(mode, AcquireMode::Waiter { .. });
        let pending = DropGuard::new(|| self.settle_unanswered(reentered, waiter));
        let sent_at = budget.sent_at;
        let reply = within!(
            budget,
            commands::acquire_permits(
                &client.redis,
                &client.scripts,
                &self.hold.keys,
                &self.hold.owner,
                self.lease,
                mode,
                self.permits,
            )
        );
        match reply {
            Ok(commands::Acquire::Granted { hold_count, fence }) => {
                // Replica sync: the grant counts once the replicas have it. Until then
                // `pending` stays armed: a shortfall, an error or a drop here rolls the grant
                // back (the settle takes back exactly the hold this acquire produced).
                // (Boxed: without a policy, the common case, this future is never built.)
                let synced = if client.replica_sync.is_none() {
                    None
                } else {
                    Box::pin(client.replica_sync.require(&client.redis, &self.hold.keys)).await?
                };
                pending.disarm();
                let share = client
                    .holds
                    .grant(ticket, &self.hold, fence, hold_count, self.mode, sent_at);
                Ok(Tried::Granted(Granted {
                    owner: self.hold.owner.clone(),
                    fence,
                    hold_count,
                    share,
                    synced,
                }))
            }
            Ok(commands::Acquire::Held {
                ttl,
                place,
                ahead,
                counter,
            }) => {
                pending.disarm();
                if let Some(place) = place {
                    self.place.store(place, Ordering::Relaxed);
                }
                if let Some(counter) = counter {
                    *self.heard.lock() = Some(InLine { counter, sent_at });
                }
                self.ahead
                    .store(ahead.unwrap_or(NO_RANK), Ordering::Relaxed);
                Ok(Tried::Busy(ttl))
            }
            // No reply, or one we could not read: it may have granted a hold, which `pending`
            // settles when dropped here.
            Err(error) if error.is_transient() => Err(error),
            // Redis refused the script before it changed anything (type, ACL, argument).
            Err(error) => {
                pending.disarm();
                Err(error)
            }
        }
    }

    /// Takes the grant `fence` that the line made to this waiter (its channel heard it, with
    /// its lease `lease_ms`) as this acquire's, without a try. The release ran after this
    /// waiter's last try in line was sent (`sent_at`), so the client counts the grant's lease
    /// from then: the hold table records it as a grant answered to a try sent at that instant
    /// (for a watched lease, shifted so that it ends `lease_ms` after it: the line grants a
    /// watched waiter until its entry would have lapsed).
    ///
    /// `None` leaves it to the next try, which takes the grant in Redis: a fixed lease the line
    /// did not grant as asked (its ask was lost), a replica sync policy (the try's grant is the
    /// one that waits for the replicas), a try so old that the grant's lease as the client must
    /// count it would be half gone, or another acquire or settle of the hold in flight.
    fn take_heard(&self, fence: FencingToken, lease_ms: u64, sent_at: Instant) -> Option<Granted> {
        let client = self.client;
        let granted = Duration::from_millis(lease_ms);
        let anchor = sent_at;
        let sent_at = match self.mode {
            LeaseMode::Fixed(lease) if lease.duration() == granted => sent_at,
            LeaseMode::Fixed(_) => return None,
            LeaseMode::Watched => {
                let short = client.holds.lease().duration().saturating_sub(granted);
                sent_at.checked_sub(short)?
            }
        };
        if !client.replica_sync.is_none()
            || anchor.elapsed() > granted / 2
            || !client.holds.is_settled(&self.hold)
        {
            return None;
        }
        let (ticket, prepared) = client.holds.begin_acquire(&self.hold)?;
        if prepared.grant.is_some() {
            return None;
        }
        let share = client
            .holds
            .grant(ticket, &self.hold, fence, 1, self.mode, sent_at);
        Some(Granted {
            owner: self.hold.owner.clone(),
            fence,
            hold_count: 1,
            share,
            synced: None,
        })
    }

    /// Settles an acquire whose reply never came: "if the owner's count is what that acquire
    /// produced, take one hold back". For a re-entry that is the grant's guards plus one. A
    /// `waiter`'s try of a kind with a line of its own goes back to its place in line: it is
    /// still waiting (or leaves the line after this settle), and must not lose its turn.
    fn settle_unanswered(&self, reentered: Option<FencingToken>, waiter: bool) {
        // A fresh grant's count is 1; a re-entry's, the grant's guards plus one.
        let produced = self.client.holds.guards_in(&self.hold, reentered) + 1;
        let place = match self.place.load(Ordering::Relaxed) {
            NO_PLACE => None,
            _ if !waiter => None,
            score => Some(commands::Place {
                score,
                life: self.client.holds.lease(),
            }),
        };
        settle(
            self.client,
            &self.hold,
            reentered,
            ReleaseKind::Now,
            produced,
            self.lease.duration(),
            commands::Undo::Acquire(place),
        );
    }
}
