//! [`LockGuard`]: one hold of a lock, released by `unlock().await` or on drop.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::commands::{self, ReleaseKind, Renewal};
use leasehold_core::{FencingToken, HoldId, Lease, LockError, Owner, Result, Synced};
use leasehold_watchdog::{HoldGuard, LostReason};
use tokio::time::Instant;

use crate::client::{within, ClientInner};
use crate::release::Release;

/// One hold of a distributed lock.
///
/// Release it with [`unlock`](LockGuard::unlock) to learn the outcome; dropping it releases in
/// the background (on the current tokio runtime, if any; otherwise the lease ends the hold).
/// Either way renewal stops at once.
///
/// A guard borrows the [`Lock`](crate::Lock) handle it came from (`'a`), which keeps it in the task that
/// acquired it: that task's nested `lock()` calls re-enter the hold, which is only right while
/// the hold is used by that task. To move it to another task (`tokio::spawn`), call
/// [`detach`](LockGuard::detach): the hold then belongs to the guard, and the acquiring task's
/// next `lock()` waits for it like any other task's.
///
/// The pattern below does not compile, because the worker would run under the lock while the
/// loop's next `lock()` re-entered it:
///
/// ```compile_fail
/// # async fn f(lock: leasehold::Lock) -> leasehold::Result<()> {
/// loop {
///     let guard = lock.lock().await?;
///     tokio::spawn(async move { drop(guard) }); // error: `lock` does not live long enough
/// }
/// # }
/// ```
///
/// Detached, the workers run one at a time:
///
/// ```
/// # leasehold_testkit::with_redis(|url| async move {
/// let client = leasehold::LockClient::connect(&url).await?;
/// let lock = client.lock("report")?;
/// for _ in 0..3 {
///     let guard = lock.lock().await?.detach(); // waits until the previous worker released
///     assert_eq!(guard.name(), "report");
///     tokio::spawn(async move {
///         // ... work under the lock ...
///         guard.unlock().await
///     });
/// }
/// # Ok::<(), leasehold::LockError>(()) });
/// ```
#[must_use = "if unused the lock is released at once"]
pub struct LockGuard<'a> {
    client: Arc<ClientInner>,
    hold: HoldId,
    fence: FencingToken,
    /// (u32: a hold re-entered four billion times is not a thing; the guard stays small.)
    hold_count: u32,
    /// This guard's share of the grant in the hold table; `None` once released.
    share: Option<HoldGuard>,
    /// Acquired under the task's own owner (not an explicit, shared one): detaching it keeps
    /// the task from re-entering.
    task_owned: bool,
    /// When the grant was answered: the hold time in the metrics is measured from here.
    acquired_at: Instant,
    /// What the grant reached under the client's replica sync policy.
    synced: Option<Synced>,
    /// Borrows the handle the guard came from (see the type's docs).
    _lock: PhantomData<&'a ()>,
}

impl fmt::Debug for LockGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.hold.keys.name())
            .field("owner", &self.hold.owner)
            .field("fencing_token", &self.fence)
            .field("hold_count", &self.hold_count)
            .field("is_held", &self.is_held())
            .finish()
    }
}

impl<'a> LockGuard<'a> {
    pub(crate) fn new(
        client: Arc<ClientInner>,
        hold: HoldId,
        fence: FencingToken,
        hold_count: u64,
        share: HoldGuard,
        task_owned: bool,
        synced: Option<Synced>,
    ) -> LockGuard<'a> {
        LockGuard {
            client,
            hold,
            fence,
            hold_count: u32::try_from(hold_count).unwrap_or(u32::MAX),
            share: Some(share),
            task_owned,
            acquired_at: Instant::now(),
            synced,
            _lock: PhantomData,
        }
    }

    /// The lock name. Example: [`LockGuard`]'s.
    pub fn name(&self) -> &str {
        self.hold.keys.name()
    }

    /// The owner this hold is counted under. Example:
    /// [`LockClient::current_owner`](crate::LockClient::current_owner)'s.
    pub fn owner(&self) -> &Owner {
        &self.hold.owner
    }

    /// The fencing token of this grant: strictly higher than any earlier grant of this lock,
    /// the same for re-entries of one grant. Send it with every write to the protected resource.
    /// Example: [`LockClient`](crate::LockClient)'s.
    pub fn fencing_token(&self) -> FencingToken {
        self.fence
    }

    /// What this acquire reached under the client's replica sync policy
    /// ([`LockClientBuilder::replica_sync`](crate::LockClientBuilder::replica_sync)): the
    /// replicas that acknowledged it (at least the policy's number: a grant that reached fewer
    /// was rolled back and never became a guard). `None` without a policy.
    pub fn replica_sync(&self) -> Option<Synced> {
        self.synced
    }

    /// The owner's hold count right after this acquire (1 for a first grant, more for
    /// re-entries). Example: [`reentrant`](LockGuard::reentrant)'s.
    pub fn hold_count(&self) -> u64 {
        u64::from(self.hold_count)
    }

    /// Whether the lease is still certainly valid as far as this process knows: the grant was
    /// not found gone (by a renewal, or by a later acquire), and the local validity deadline
    /// (send time of the last confirmed acquire or renewal + lease - drift) has not passed.
    /// `false` is final for this guard. Example: [`lost_reason`](LockGuard::lost_reason)'s.
    pub fn is_held(&self) -> bool {
        self.share.as_ref().is_some_and(HoldGuard::is_held)
    }

    /// The instant until which the lease is certainly valid, unless renewed further. Example:
    /// [`extend`](LockGuard::extend)'s.
    pub fn valid_until(&self) -> Instant {
        self.share
            .as_ref()
            .map_or_else(Instant::now, HoldGuard::valid_until)
    }

    /// Completes when the lease is lost: a renewal found the grant gone, or the local validity
    /// deadline passed without a confirmed renewal (Redis unreachable or paused, or this
    /// process stalled). Example: [`lost_reason`](LockGuard::lost_reason)'s.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn lost(&self) {
        if let Some(share) = &self.share {
            share.lost().await;
        }
    }

    /// Why the lease was lost, once it is; `None` while [`is_held`](LockGuard::is_held).
    ///
    /// - [`LostReason::Gone`]: Redis no longer had the grant (a renewal, an
    ///   [`extend`](LockGuard::extend) or a later acquire found it expired, force-unlocked,
    ///   taken over, or lost with Redis's data);
    /// - [`LostReason::Expired`]: the local deadline passed (an explicit lease that was not
    ///   extended, or no renewal confirmed in time);
    /// - [`LostReason::MaxHold`]: the watchdog stopped renewing at the client's
    ///   [`max_hold`](crate::LockClientBuilder::max_hold), and the last lease ran out.
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// use std::time::Duration;
    /// use leasehold::LostReason;
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let lock = client.lock("short")?;
    /// let guard = lock.lock_with_lease(Duration::from_millis(50)).await?;
    /// assert_eq!(guard.lost_reason(), None);
    /// guard.lost().await;
    /// assert!(!guard.is_held()); // final for this guard
    /// assert_eq!(guard.lost_reason(), Some(LostReason::Expired));
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.share.as_ref().and_then(HoldGuard::lost_reason)
    }

    /// Extends an explicit lease by hand: the hold then lasts at least `lease` from now, on
    /// the Redis server's clock, and [`valid_until`](LockGuard::valid_until) moves to the
    /// send time of this call + `lease` - drift. For a job that took an explicit lease and
    /// needs longer than it thought (redsync's and node-redlock's `extend`).
    ///
    /// - **Never shortens.** A hold already good for longer in Redis (a re-entry of the same
    ///   grant with a longer lease, or an earlier, longer extension) keeps its expiry, and this
    ///   guard its deadline: the owner's other guards count on their own leases. To end a hold
    ///   early, release it, or [`unlock_after`](LockGuard::unlock_after).
    /// - **Fenced.** It extends only this grant, checked in Redis by owner and fencing token in
    ///   one script (the watchdog's renewal): a grant that was lost cannot be extended, even
    ///   when the same owner was granted the lock again since (that is another grant, with
    ///   another token).
    /// - **Explicit leases only.** A guard renewed by the watchdog (taken without a lease) is
    ///   refused with [`LockError::InvalidArgument`]: its lease is the watchdog's to keep, and
    ///   a hand-set one beside it would either be overtaken by the next renewal or have to
    ///   stop renewals that the owner's other guards of the grant rely on. To cap such a hold,
    ///   use [`max_hold`](crate::LockClientBuilder::max_hold) or
    ///   [`unlock_after`](LockGuard::unlock_after).
    ///
    /// Every kind's guard extends alike: the reentrant and the non-reentrant lock, the fair
    /// lock, and a read/write lock's read and write holds (each hold its own lease). Under a
    /// [replica sync](crate::LockClientBuilder::replica_sync) policy it returns once the
    /// replicas have it.
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// use std::time::Duration;
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let lock = client.lock("import")?;
    /// let guard = lock.lock_with_lease(Duration::from_secs(10)).await?;
    /// // ... the import turns out to need more time ...
    /// guard.extend(Duration::from_secs(60)).await?;
    /// assert!(guard.valid_until() > tokio::time::Instant::now() + Duration::from_secs(50));
    /// guard.unlock().await?;
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for a lease under 1 ms or over
    /// [`MAX_LEASE`](crate::MAX_LEASE), or a guard renewed by the watchdog: nothing was sent.
    /// [`LockError::LeaseLost`] when the lease is lost: already known to this guard (nothing
    /// was sent), or found gone in Redis by this call (the guard then reports it lost, as
    /// [`LostReason::Gone`]). [`LockError::Timeout`] / [`LockError::Connection`] when the
    /// outcome is unknown: the guard keeps its earlier deadline, and calling again is safe.
    /// [`LockError::AppliedNotReplicated`] under a replica sync policy when the extension ran
    /// on the primary but did not reach the replicas in time: the guard keeps its earlier
    /// deadline (a failover may lose the extension); calling again is safe.
    ///
    /// # Cancel safety
    /// Cancel safe. Dropped before the reply, the script may or may not have run: if it did,
    /// the hold lasts longer in Redis than this guard knows, and the guard keeps its earlier
    /// deadline (it never claims more than Redis granted); the release works either way.
    /// Nothing is settled in the background, since an extension that ran only ever makes the
    /// same grant last longer.
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        let lease = Lease::new(lease)?;
        let Some(share) = self.share.as_ref() else {
            return Err(self.lease_lost());
        };
        if share.is_watched() {
            return Err(LockError::InvalidArgument(format!(
                "the hold on {:?} is renewed by the watchdog: only a hold taken with an \
                 explicit lease can be extended by hand",
                self.hold.keys.name()
            )));
        }
        if !share.is_held() {
            return Err(self.lease_lost());
        }
        // Boxed: a script call's future is large in a debug build, and this is not a hot path.
        Box::pin(self.send_extend(share, lease)).await
    }

    async fn send_extend(&self, share: &HoldGuard, lease: Lease) -> Result<()> {
        let client = &self.client;
        let renewal = [Renewal {
            hold: self.hold.clone(),
            token: Some(self.fence),
        }];
        let budget = client.start(client.command_timeout).await;
        let sent_at = budget.sent_at;
        let renewed = within!(
            budget,
            commands::renew(&client.redis, &client.scripts, &renewal, lease)
        )?;
        if renewed.first() != Some(&true) {
            share.lose();
            return Err(self.lease_lost());
        }
        client.sync_change(&self.hold.keys).await?;
        if share.extended(lease.valid_until(sent_at)) {
            Ok(())
        } else {
            Err(self.lease_lost()) // lost meanwhile (its own deadline passed in flight)
        }
    }

    /// Runs `work` while the lease holds: returns its output, or [`LockError::LeaseLost`] as
    /// soon as the lease is lost, dropping (cancelling) `work` at its next await point.
    ///
    /// This narrows the window in which a holder acts without a lease; it cannot close it (a
    /// pause can fall between the check and a write). Fencing tokens close it.
    /// [`lost_reason`](LockGuard::lost_reason) then says why the lease was lost.
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let lock = client.lock("migration")?;
    /// let guard = lock.lock().await?;
    /// let rows = guard.run_while_held(async { 42 }).await?;
    /// assert_eq!(rows, 42);
    /// guard.unlock().await?;
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    ///
    /// # Cancel safety
    /// Dropping the returned future drops `work`.
    pub async fn run_while_held<F: Future>(&self, work: F) -> Result<F::Output> {
        if !self.is_held() {
            return Err(self.lease_lost());
        }
        tokio::select! {
            biased;
            _ = self.lost() => Err(self.lease_lost()),
            output = work => Ok(output),
        }
    }

    /// Detaches this guard from the task that acquired it, so it can move to another task
    /// (`tokio::spawn`). The hold no longer belongs to the task: until this guard is released,
    /// the task's own `lock()` calls on this lock wait for it (or are refused by `try_lock`)
    /// like any other task's, instead of re-entering it. Everything else is unchanged: the same
    /// grant, token, lease and renewal.
    ///
    /// Detach the task's outermost hold: a task that still holds another guard of the same lock
    /// and calls `lock()` again would wait for the detached one.
    ///
    /// For a guard of an explicit owner ([`Lock::with_owner`](crate::Lock::with_owner)), which
    /// is shared on purpose,
    /// this only frees the guard from the handle's borrow.
    pub fn detach(mut self) -> LockGuard<'static> {
        let mut share = self.share.take();
        if self.task_owned {
            if let Some(share) = share.as_mut() {
                self.client.holds.detach(share);
            }
        }
        LockGuard {
            client: self.client.clone(),
            hold: self.hold.clone(),
            fence: self.fence,
            hold_count: self.hold_count,
            share,
            task_owned: self.task_owned,
            acquired_at: self.acquired_at,
            synced: self.synced,
            _lock: PhantomData,
        }
    }

    /// The hold (lock and owner) this guard counts in.
    pub(crate) fn hold(&self) -> &HoldId {
        &self.hold
    }

    pub(crate) fn client(&self) -> &Arc<ClientInner> {
        &self.client
    }

    /// Takes this guard's hold out of the hold table (stopping renewal) and prepares its
    /// release: whatever the reply, this guard no longer keeps the lease alive.
    fn start_release(&mut self, kind: ReleaseKind) -> Release {
        self.client
            .metrics
            .of(self.hold.keys.kind())
            .hold(self.acquired_at.elapsed());
        let ends_within = self.valid_until().saturating_duration_since(Instant::now())
            + self.client.command_timeout;
        // The share leaves the table and the release is registered in one step: from here the
        // owner's next acquire waits for this release.
        let (ticket, current) = match self.share.take() {
            Some(share) => share.release(&self.hold),
            None => (self.client.holds.begin_release(&self.hold), false),
        };
        Release {
            _ticket: ticket,
            checked: !current,
            client: self.client.clone(),
            hold: self.hold.clone(),
            token: Some(self.fence),
            kind,
            ends_within,
        }
    }

    fn lease_lost(&self) -> LockError {
        LockError::LeaseLost {
            name: self.hold.keys.name().to_string(),
        }
    }

    /// Releases this hold. The lock is free once every hold of the owner is released.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] when the owner no longer holds this grant (lease expired, force
    /// unlocked); nothing changed in Redis. [`LockError::Timeout`] / [`LockError::Connection`]
    /// when the outcome is unknown: the release is settled in the background (released if it
    /// did not run), and the lease ends the hold if even that fails.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves no hold behind; a release in flight (or not yet
    /// sent) is settled in the background.
    pub async fn unlock(mut self) -> Result<()> {
        self.start_release(ReleaseKind::Now).send().await
    }

    /// Lets this hold end by itself `after` from now instead of releasing it (ShedLock's
    /// "lock at least for": a job that finished early keeps other instances out until its slot
    /// is over). If this is the owner's last hold, the lock is handed to nobody, so not even
    /// this owner can re-enter, and ends `after` from now; a re-entered hold is simply
    /// released (the owner's outer holds keep the lock). Renewal stops at once either way.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] when the owner no longer holds this grant;
    /// [`LockError::InvalidArgument`] for a duration under 1 ms or over the maximum lease;
    /// [`LockError::Timeout`] / [`LockError::Connection`] when the outcome is unknown: it is
    /// settled in the background.
    ///
    /// # Cancel safety
    /// As [`LockGuard::unlock`].
    pub async fn unlock_after(mut self, after: Duration) -> Result<()> {
        let after = Lease::new(after)?;
        if !self.hold.keys.traits().unlock_after {
            // Dropped here: released now.
            return Err(leasehold_core::commands::unlock_after_refused(
                &self.hold.keys,
            ));
        }
        self.start_release(ReleaseKind::After(after.millis()))
            .send()
            .await
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        if self.share.is_none() {
            return; // released, or detached into another guard
        }
        let release = self.start_release(ReleaseKind::Now);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(lock = %self.hold.keys.name(), "guard dropped outside a tokio runtime: the lease will end the hold");
            return;
        };
        runtime.spawn(async move {
            let name = release.hold.keys.name().to_string();
            match release.send().await {
                Ok(()) => {}
                Err(LockError::NotHeld { .. }) => {
                    tracing::debug!(lock = %name, "dropped guard was no longer held");
                }
                Err(error) => {
                    tracing::warn!(lock = %name, %error, "background release failed; settling it in the background");
                }
            }
        });
    }
}

/// Releases `guards` all at once, each within `within`, and returns each outcome in order.
///
/// For a caller that must not wait longer than it has (a bounded acquire giving back what it
/// took, a RedLock round): a release that does not answer in time counts as
/// [`LockError::Timeout`] and its future is dropped, which hands it to the background as
/// [`LockGuard::unlock`]'s cancel safety says (settled once Redis answers, or ended by its
/// lease). Concurrently, so that one dead server costs `within` once, not once per member.
pub(crate) async fn unlock_all_within<'a>(
    guards: impl IntoIterator<Item = LockGuard<'a>>,
    within: Duration,
) -> Vec<Result<()>> {
    let releases = guards.into_iter().map(|guard| async move {
        // Boxed: a release future is large, and join_all keeps them side by side.
        tokio::time::timeout(within, Box::pin(guard.unlock()))
            .await
            .unwrap_or(Err(LockError::Timeout))
    });
    futures::future::join_all(releases).await
}
