//! [`Semaphore`]: at most N at once across the fleet, with permits that are leased, owned and
//! fenced; and [`Permit`], one acquisition's permits.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use leasehold_core::commands::{self, SemaphoreChange};
use leasehold_core::{FencingToken, LockError, LockKeys, LockKind, Result};
use tokio::time::Instant;

use crate::{Lock, LockGuard};

/// A handle on one distributed semaphore: at most its number of permits are taken at once,
/// over every client.
///
/// Every acquisition is a [`Permit`]: it has an id, a fencing token and a lease measured by
/// Redis server time, like a lock's hold. A permit acquired without an explicit lease is
/// renewed by the client's watchdog (in the same batches as its locks) and has the lost-lease
/// signal; a permit whose holder crashed returns to the pool when its lease ends, so a crash
/// never leaks a permit. Dropping a permit gives it back.
///
/// Waiting is fair: waiters are served in arrival order over every client, each woken alone
/// when its permits are there, and a request is granted only when every waiter before it can
/// be served too (nobody jumps the line, not even a releaser asking again; a large request at
/// the head is not overtaken by small ones). See `docs/semaphore.md`.
///
/// ```
/// # leasehold_testkit::with_redis(|url| async move {
/// let client = leasehold::LockClient::connect(&url).await?;
/// let exports = client.semaphore("exports")?;
/// exports.try_set_permits(2).await?; // at most two exports at once, fleet-wide
/// assert_eq!(exports.permits().await?, 2);
/// let permit = exports.acquire(1).await?;
/// assert_eq!(exports.available_permits().await?, 1);
/// // ... run the export, passing its fencing token to the store ...
/// println!("exporting under token {}", permit.fencing_token());
/// permit.release().await?;
/// # Ok::<(), leasehold::LockError>(()) });
/// ```
#[derive(Clone)]
pub struct Semaphore {
    lock: Lock,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.lock.name())
            .field("key", &self.lock.keys().hash())
            .finish()
    }
}

impl Semaphore {
    pub(crate) fn new(lock: Lock, keys: &LockKeys) -> Semaphore {
        Semaphore {
            lock: lock.with_keys(keys.of_kind(LockKind::Semaphore)),
        }
    }

    /// The semaphore's name. Example: [`Semaphore::keys`]'s.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// The semaphore's keys: where its number of permits and the permits taken are kept, for
    /// looking at them with other tools.
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let exports = client.semaphore("exports")?;
    /// assert_eq!(exports.name(), "exports");
    /// assert_eq!(exports.keys().hash(), "leasehold:{exports}");
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    pub fn keys(&self) -> &LockKeys {
        self.lock.keys()
    }

    /// One change, boxed: a script call's future is large in a debug build, and these are not
    /// hot paths (the caller's stack stays small). Under a replica sync policy it returns once
    /// the replicas have it, like a grant; see [`Semaphore::set_permits`] for a shortfall.
    async fn change(&self, change: SemaphoreChange) -> Result<bool> {
        let client = self.lock.client();
        let changed = Box::pin(client.call(
            client.command_timeout,
            commands::semaphore_set(&client.redis, &client.scripts, self.keys(), change),
        ))
        .await?;
        client.sync_change(self.keys()).await?;
        Ok(changed)
    }

    /// Sets the number of permits if it was never set (Redisson's `trySetPermits`); returns
    /// whether it was set. The number is kept in Redis until [`Semaphore::delete`]. A semaphore
    /// has 0 to `u32::MAX` permits: every count stays exact in the scripts.
    ///
    /// # Errors
    /// As [`Semaphore::set_permits`]; calling it again after a shortfall is safe.
    pub async fn try_set_permits(&self, permits: u32) -> Result<bool> {
        self.change(SemaphoreChange::TrySet(permits)).await
    }

    /// Sets the number of permits, whatever it was. Lowering it below the permits taken now is
    /// allowed: new acquisitions wait until enough come back. Waiters whose permits are there
    /// now are woken.
    ///
    /// Under a replica sync policy
    /// ([`LockClientBuilder::replica_sync`](crate::LockClientBuilder::replica_sync)) this and
    /// every change of the number return once the replicas have it: a number a failover loses
    /// is the one before (or none: acquisitions then wait until it is set again).
    ///
    /// # Errors
    /// [`LockError::AppliedNotReplicated`] when the change ran on the primary but did not reach
    /// the replicas in time: it stands there (it is not rolled back). Setting the number again
    /// is safe; adding again ([`Semaphore::add_permits`]) would add twice.
    /// [`LockError::WrongKind`] when the name is in use by another kind (nothing changed).
    pub async fn set_permits(&self, permits: u32) -> Result<()> {
        self.change(SemaphoreChange::Set(permits)).await.map(|_| ())
    }

    /// Adds permits (a negative number takes them away, as [`Semaphore::set_permits`] lowers).
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] when the number would leave 0 to `u32::MAX` (nothing
    /// changed); otherwise as [`Semaphore::set_permits`]: after
    /// [`LockError::AppliedNotReplicated`] the permits were added on the primary; do not add
    /// them again.
    pub async fn add_permits(&self, permits: i64) -> Result<()> {
        self.change(SemaphoreChange::Add(permits)).await.map(|_| ())
    }

    /// Deletes the semaphore: its number of permits and every permit taken (their holders learn
    /// at their next renewal that they lost them). Returns whether there was one.
    ///
    /// # Errors
    /// As [`Semaphore::set_permits`]; deleting again after a shortfall is safe.
    pub async fn delete(&self) -> Result<bool> {
        self.change(SemaphoreChange::Delete).await
    }

    /// The number of permits (0 when never set). Example: [`Semaphore`]'s.
    pub async fn permits(&self) -> Result<u64> {
        Ok(self.state().await?.0.max(0) as u64)
    }

    /// Permits not taken now (negative after the number was lowered below what is taken).
    /// Expired permits that no call has given back yet still count as taken. Example:
    /// [`Semaphore`]'s.
    pub async fn available_permits(&self) -> Result<i64> {
        let (permits, used) = self.state().await?;
        Ok(permits - used)
    }

    async fn state(&self) -> Result<(i64, i64)> {
        let client = self.lock.client();
        let state = Box::pin(client.call(
            client.command_timeout,
            commands::semaphore_state(&client.redis, self.keys()),
        ))
        .await?;
        Ok(state.unwrap_or((0, 0)))
    }

    /// A handle for one acquisition of `permits`: a fresh owner, which is the permit's id.
    fn acquisition(&self, permits: u32) -> Result<Lock> {
        if permits == 0 {
            return Err(LockError::InvalidArgument(
                "a semaphore acquisition takes at least one permit".into(),
            ));
        }
        let id = self.lock.client().id.new_owner();
        Ok(self.lock.clone().with_owner(id).with_permits(permits))
    }

    async fn acquire_with(
        &self,
        permits: u32,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Option<Permit>> {
        let lock = self.acquisition(permits)?;
        // Boxed: the lock's acquire future is large, and a permit's wrapper around it would
        // otherwise double it on the caller's stack (a debug build's test thread overflowed).
        let guard = Box::pin(lock.acquire(wait, lease)).await?;
        Ok(guard.map(|guard| Permit {
            guard: guard.detach(),
            permits,
        }))
    }

    /// Waits until `permits` are there and takes them, renewed by the watchdog while the
    /// [`Permit`] lives.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped wait leaves the line at once; permits granted to a request whose
    /// reply never came are given back in the background (their lease bounds them if even
    /// that fails).
    pub async fn acquire(&self, permits: u32) -> Result<Permit> {
        self.acquire_with(permits, None, None)
            .await?
            .ok_or(LockError::Timeout)
    }

    /// As [`Semaphore::acquire`], with an explicit lease (never renewed): the permits return
    /// to the pool when it ends, whatever the holder does.
    ///
    /// # Cancel safety
    /// As [`Semaphore::acquire`].
    pub async fn acquire_with_lease(&self, permits: u32, lease: Duration) -> Result<Permit> {
        self.acquire_with(permits, None, Some(lease))
            .await?
            .ok_or(LockError::Timeout)
    }

    /// Takes `permits` if they are there now and nobody waits before (one try, never
    /// queues); `None` otherwise.
    ///
    /// # Cancel safety
    /// As [`Semaphore::acquire`].
    pub async fn try_acquire(&self, permits: u32) -> Result<Option<Permit>> {
        self.acquire_with(permits, Some(Duration::ZERO), None).await
    }

    /// Waits at most `wait` for `permits`; `None` when they did not come in time.
    ///
    /// # Cancel safety
    /// As [`Semaphore::acquire`].
    pub async fn try_acquire_for(&self, permits: u32, wait: Duration) -> Result<Option<Permit>> {
        self.acquire_with(permits, Some(wait), None).await
    }

    /// As [`Semaphore::try_acquire_for`], with an explicit lease.
    ///
    /// # Cancel safety
    /// As [`Semaphore::acquire`].
    pub async fn try_acquire_for_with_lease(
        &self,
        permits: u32,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<Permit>> {
        self.acquire_with(permits, Some(wait), Some(lease)).await
    }

    /// Gives back the permits of the acquisition `id` ([`Permit::id`]), from any client: for
    /// a permit handed to another process by its id (Redisson's `release(permitId)`).
    ///
    /// # Errors
    /// [`LockError::NotHeld`] when no permits are held under that id (unknown, already given
    /// back, or expired).
    pub async fn release_permit(&self, id: &str) -> Result<()> {
        let lock = self
            .lock
            .clone()
            .with_owner(leasehold_core::Owner::from_id(id));
        Box::pin(lock.unlock()).await
    }
}

/// One acquisition's permits: an id, a fencing token and a lease. Renewed by the watchdog
/// when acquired without an explicit lease; given back by [`Permit::release`] or when dropped
/// (in the background). `Send` and `'static`: a permit may go to the task that does the work.
pub struct Permit {
    guard: LockGuard<'static>,
    permits: u32,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("semaphore", &self.guard.name())
            .field("id", &self.id())
            .field("permits", &self.permits)
            .field("token", &self.fencing_token())
            .finish()
    }
}

impl Permit {
    /// The acquisition's id: give it to [`Semaphore::release_permit`] to release it from
    /// elsewhere.
    pub fn id(&self) -> &str {
        self.guard.owner().id()
    }

    /// How many permits it holds. Example: [`Permit::extend`]'s.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Its fencing token: larger than every token granted before on this name. Example:
    /// [`Semaphore`]'s.
    pub fn fencing_token(&self) -> FencingToken {
        self.guard.fencing_token()
    }

    /// What the acquire reached under the client's replica sync policy (see
    /// [`LockGuard::replica_sync`]).
    pub fn replica_sync(&self) -> Option<crate::Synced> {
        self.guard.replica_sync()
    }

    /// Whether its lease is still certainly valid (see [`LockGuard::is_held`]).
    pub fn is_held(&self) -> bool {
        self.guard.is_held()
    }

    /// The instant until which its lease is certainly valid. Example: [`Permit::extend`]'s.
    pub fn valid_until(&self) -> Instant {
        self.guard.valid_until()
    }

    /// Completes when the permits are lost (lease ended, semaphore deleted). Example:
    /// [`Permit::lost_reason`]'s.
    pub async fn lost(&self) {
        self.guard.lost().await
    }

    /// Why the permits were lost, once they are; `None` while held (see
    /// [`LockGuard::lost_reason`]).
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// use std::time::Duration;
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let pool = client.semaphore("pool")?;
    /// pool.try_set_permits(1).await?;
    /// let permit = pool.acquire_with_lease(1, Duration::from_millis(50)).await?;
    /// permit.lost().await;
    /// assert_eq!(permit.lost_reason(), Some(leasehold::LostReason::Expired));
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    pub fn lost_reason(&self) -> Option<crate::LostReason> {
        self.guard.lost_reason()
    }

    /// Extends the explicit lease of permits taken with one
    /// ([`Semaphore::acquire_with_lease`]): they are then held at least `lease` from now, as
    /// [`LockGuard::extend`] says (never shortened, fenced by the permit's token, refused for
    /// permits renewed by the watchdog).
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// use std::time::Duration;
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let exports = client.semaphore("exports")?;
    /// exports.try_set_permits(2).await?;
    /// let permit = exports.acquire_with_lease(1, Duration::from_secs(5)).await?;
    /// assert_eq!(permit.permits(), 1);
    /// permit.extend(Duration::from_secs(30)).await?;
    /// assert!(permit.valid_until() > tokio::time::Instant::now() + Duration::from_secs(20));
    /// permit.release().await?;
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    ///
    /// # Errors
    /// As [`LockGuard::extend`]: [`LockError::InvalidArgument`] (nothing sent),
    /// [`LockError::LeaseLost`] (the permits are lost: they expired, or the semaphore was
    /// deleted), [`LockError::Timeout`] / [`LockError::Connection`] (unknown; safe to call
    /// again).
    ///
    /// # Cancel safety
    /// As [`LockGuard::extend`]: dropped mid-flight, the permits may last longer in Redis than
    /// the permit knows, never shorter.
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        self.guard.extend(lease).await
    }

    /// Runs `work` while the permits are held; [`LockError::LeaseLost`] if they are lost
    /// first (see [`LockGuard::run_while_held`]).
    pub async fn run_while_held<F: Future>(&self, work: F) -> Result<F::Output> {
        self.guard.run_while_held(work).await
    }

    /// Gives the permits back; waiters whose permits are there now are woken.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] when they were no longer held (the lease ended first, or the
    /// semaphore was deleted).
    ///
    /// # Cancel safety
    /// Cancel safe: if the reply never comes the release is settled in the background.
    pub async fn release(self) -> Result<()> {
        self.guard.unlock().await
    }
}
