//! [`LockGuard`]: one hold of a lock, released by `unlock().await` or on drop.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{commands, FencingToken, LockError, LockKeys, Owner, Result};
use leasehold_watchdog::{Hold, LeaseState};
use tokio::time::Instant;

use crate::client::ClientInner;
use crate::lock::released;

/// How a hold's lease is kept.
pub(crate) enum GuardLease {
    /// Renewed by the client's watchdog while any guard of this owner on this lock lives.
    Watched(Hold),
    /// An explicit lease: the hold ends exactly at the lease.
    Fixed(Arc<LeaseState>),
}

impl GuardLease {
    fn state(&self) -> &LeaseState {
        match self {
            GuardLease::Watched(hold) => hold.lease(),
            GuardLease::Fixed(state) => state,
        }
    }
}

/// One hold of a distributed lock.
///
/// Release it with [`unlock`](LockGuard::unlock) to learn the outcome; dropping it releases in
/// the background (on the current tokio runtime, if any; otherwise the lease ends the hold).
/// Either way the watchdog stops renewing at once. A guard may be released from any task.
#[must_use = "if unused the lock is released at once"]
pub struct LockGuard {
    client: Arc<ClientInner>,
    keys: LockKeys,
    owner: Owner,
    fence: FencingToken,
    hold_count: u64,
    lease: Option<GuardLease>,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.keys.name())
            .field("owner", &self.owner)
            .field("fencing_token", &self.fence)
            .field("hold_count", &self.hold_count)
            .field("is_held", &self.is_held())
            .finish()
    }
}

impl LockGuard {
    pub(crate) fn new(
        client: Arc<ClientInner>,
        keys: LockKeys,
        owner: Owner,
        fence: FencingToken,
        hold_count: u64,
        lease: GuardLease,
    ) -> LockGuard {
        if let GuardLease::Fixed(_) = lease {
            client.add_local_hold(&keys, &owner);
        }
        LockGuard {
            client,
            keys,
            owner,
            fence,
            hold_count,
            lease: Some(lease),
        }
    }

    /// The lock name.
    pub fn name(&self) -> &str {
        self.keys.name()
    }

    /// The owner this hold is counted under.
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// The fencing token of this grant: strictly higher than any earlier grant of this lock,
    /// the same for re-entries of one grant. Send it with every write to the protected resource.
    pub fn fencing_token(&self) -> FencingToken {
        self.fence
    }

    /// The owner's hold count right after this acquire (1 for a first grant, more for
    /// re-entries).
    pub fn hold_count(&self) -> u64 {
        self.hold_count
    }

    /// Whether the lease is still certainly valid as far as this process knows: not found gone
    /// by a renewal, and before the local validity deadline (send time of the last confirmed
    /// acquire or renewal + lease - drift). `false` is final for this guard.
    pub fn is_held(&self) -> bool {
        self.lease.as_ref().is_some_and(|l| l.state().is_held())
    }

    /// The instant until which the lease is certainly valid, unless renewed further.
    pub fn valid_until(&self) -> Instant {
        self.lease
            .as_ref()
            .map_or_else(Instant::now, |l| l.state().valid_until())
    }

    /// Completes when the lease is lost: a renewal found the lock gone or taken, or the local
    /// validity deadline passed without a confirmed renewal (Redis unreachable or paused, or
    /// this process stalled).
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn lost(&self) {
        if let Some(lease) = &self.lease {
            lease.state().lost().await;
        }
    }

    /// Runs `work` while the lease holds: returns its output, or [`LockError::LeaseLost`] as
    /// soon as the lease is lost, dropping (cancelling) `work` at its next await point.
    ///
    /// This narrows the window in which a holder acts without a lease; it cannot close it (a
    /// pause can fall between the check and a write). Fencing tokens close it.
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let guard = client.lock("migration")?.lock().await?;
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

    /// Takes this guard's hold out of local bookkeeping (stopping renewal) and prepares its
    /// release: whatever the reply, this guard no longer keeps the lease alive.
    fn start_release(&mut self) -> Release {
        let ends_within = self.valid_until().saturating_duration_since(Instant::now())
            + self.client.command_timeout;
        self.forget_lease();
        Release {
            client: self.client.clone(),
            keys: self.keys.clone(),
            owner: self.owner.clone(),
            ends_within,
        }
    }

    /// Stops renewal (a watched hold) or the local count (a fixed one): this guard no longer
    /// keeps anything alive, whatever happens to its release.
    fn forget_lease(&mut self) {
        if let Some(GuardLease::Fixed(_)) = self.lease.take() {
            self.client.remove_local_hold(&self.keys, &self.owner);
        }
    }

    fn lease_lost(&self) -> LockError {
        LockError::LeaseLost {
            name: self.keys.name().to_string(),
        }
    }

    /// Releases this hold. The lock is free once every hold of the owner is released.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] when the owner no longer holds the lock (lease expired, force
    /// unlocked); nothing changed in Redis. [`LockError::Timeout`] / [`LockError::Connection`]
    /// when the outcome is unknown: the release is not resent (it could release twice), and the
    /// lease ends the hold if it did not run.
    pub async fn unlock(mut self) -> Result<()> {
        let release = self.start_release();
        release.send().await
    }
}

impl LockGuard {
    /// Lets this hold end by itself `after` from now instead of releasing it (ShedLock's
    /// "lock at least for": a job that finished early keeps other instances out until its slot
    /// is over). If this is the owner's last hold, the lock is handed to nobody, so not even
    /// this owner can re-enter, and ends `after` from now; a re-entered hold is simply
    /// released (the owner's outer holds keep the lock). Renewal stops at once either way.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] when the owner no longer holds the lock;
    /// [`LockError::InvalidArgument`] for a duration under 1 ms or over the maximum lease.
    pub async fn unlock_after(mut self, after: Duration) -> Result<()> {
        let after_ms = leasehold_core::lease_millis(after)?;
        self.forget_lease();
        self.client.ready().await;
        match commands::release_after(&self.client.redis, &self.keys, &self.owner, after_ms).await {
            Ok(reply) => released(&self.keys, &self.owner, reply),
            Err(error) => Err(self.client.map_err(error)),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.lease.is_none() {
            return; // released by unlock()
        }
        let release = self.start_release();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(lock = %self.keys.name(), "guard dropped outside a tokio runtime: the lease will end the hold");
            return;
        };
        runtime.spawn(async move {
            let name = release.keys.name().to_string();
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

/// One release on its way: everything it needs, detached from the guard so that a dropped
/// guard can send it from a spawned task.
struct Release {
    client: Arc<ClientInner>,
    keys: LockKeys,
    owner: Owner,
    /// How long until the hold ends by itself if the release does not run.
    ends_within: Duration,
}

impl Release {
    /// Sends the release once. If the reply never comes, a repair settles it in the
    /// background (see `ClientInner::spawn_repair`): the release is not resent blindly, which
    /// could release twice.
    async fn send(self) -> Result<()> {
        self.client.ready().await;
        match commands::release(&self.client.redis, &self.keys, &self.owner).await {
            Ok(reply) => released(&self.keys, &self.owner, reply),
            Err(error) => {
                let error = self.client.map_err(error);
                if error.is_transient() {
                    // What Redis counts if the release did not run: the owner's other live
                    // holds here plus this one (counted only now, on the rare path).
                    let holds_before = self.client.local_holds(&self.keys, &self.owner) + 1;
                    self.client.spawn_repair(
                        &self.keys,
                        &self.owner,
                        holds_before,
                        self.ends_within,
                    );
                }
                Err(error)
            }
        }
    }
}
