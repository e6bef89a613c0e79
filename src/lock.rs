//! [`Lock`]: a handle on one named lock, and every way to acquire it.

use std::fmt;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{commands, LockError, LockKeys, Owner, Result};
use leasehold_watchdog::{valid_until, LeaseState};
use tokio::time::Instant;

use crate::client::ClientInner;
use crate::guard::{GuardLease, LockGuard};

/// A handle on one reentrant distributed lock. Cheap to clone; nothing is sent until you
/// acquire.
///
/// Holds are counted per owner: by default the current tokio task, so nested acquires in one
/// task re-enter (the hold count rises) and the lock is free once each hold is released. Use
/// [`Lock::with_owner`] to share one hold across tasks.
#[derive(Clone)]
pub struct Lock {
    client: Arc<ClientInner>,
    keys: LockKeys,
    owner: Option<Owner>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.keys.name())
            .field("key", &self.keys.hash())
            .field("owner", &self.owner)
            .finish()
    }
}

/// How long a hold lasts.
#[derive(Clone, Copy, Debug)]
enum LeaseMode {
    /// The client's lease, renewed by the watchdog while the guard lives.
    Watched,
    /// Exactly this long; no renewal.
    Fixed(Duration),
}

/// One try's outcome.
enum Attempt {
    Granted(LockGuard),
    Held(Option<Duration>),
}

impl Attempt {
    fn into_guard(self) -> Option<LockGuard> {
        match self {
            Attempt::Granted(guard) => Some(guard),
            Attempt::Held(_) => None,
        }
    }
}

impl Lock {
    pub(crate) fn new(client: Arc<ClientInner>, keys: LockKeys) -> Lock {
        Lock {
            client,
            keys,
            owner: None,
        }
    }

    /// The lock name.
    pub fn name(&self) -> &str {
        self.keys.name()
    }

    /// The lock's keys and channel.
    pub fn keys(&self) -> &LockKeys {
        &self.keys
    }

    /// This handle, acquiring under `owner` instead of the current task. Tasks sharing an owner
    /// share (and re-enter) one hold; two futures joined in one task that must exclude each
    /// other use two owners.
    pub fn with_owner(mut self, owner: Owner) -> Lock {
        self.owner = Some(owner);
        self
    }

    /// The owner an acquire from here would use right now.
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
    pub async fn try_lock(&self) -> Result<Option<LockGuard>> {
        self.acquire(Some(Duration::ZERO), LeaseMode::Watched).await
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
    pub async fn try_lock_with_lease(&self, lease: Duration) -> Result<Option<LockGuard>> {
        self.acquire(Some(Duration::ZERO), LeaseMode::Fixed(lease))
            .await
    }

    /// Waits until the lock is acquired; watched lease. Woken by the release message, or when
    /// the holder's lease would end (a crashed holder publishes nothing). Transient Redis errors
    /// are retried with backoff while waiting; wrap in `tokio::time::timeout` or use
    /// [`Lock::try_lock_for`] to bound the wait.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future at any await point leaves no hold (an acquire in flight
    /// is undone), no subscription and no waiter entry behind.
    pub async fn lock(&self) -> Result<LockGuard> {
        let guard = self.acquire(None, LeaseMode::Watched).await?;
        Ok(guard.expect("an unbounded wait returns only when acquired"))
    }

    /// Waits until acquired, with an explicit lease (no renewal).
    ///
    /// # Cancel safety
    /// As [`Lock::lock`].
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard> {
        let guard = self.acquire(None, LeaseMode::Fixed(lease)).await?;
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
    pub async fn try_lock_for(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.acquire(Some(wait), LeaseMode::Watched).await
    }

    /// Waits at most `wait`, with an explicit lease (no renewal).
    ///
    /// # Cancel safety
    /// As [`Lock::lock`].
    pub async fn try_lock_for_with_lease(
        &self,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<LockGuard>> {
        self.acquire(Some(wait), LeaseMode::Fixed(lease)).await
    }

    /// Whether any owner holds the lock right now.
    pub async fn is_locked(&self) -> Result<bool> {
        use fred::interfaces::KeysInterface;
        self.client.ready().await;
        let n: i64 = self
            .client
            .redis
            .exists(self.keys.hash())
            .await
            .map_err(|e| self.client.map_err(e))?;
        Ok(n == 1)
    }

    /// The hold count of [`Lock::owner`] in Redis (0 if it holds nothing).
    pub async fn hold_count(&self) -> Result<u64> {
        use fred::interfaces::HashesInterface;
        self.client.ready().await;
        let count: Option<u64> = self
            .client
            .redis
            .hget(self.keys.hash(), self.owner().id())
            .await
            .map_err(|e| self.client.map_err(e))?;
        Ok(count.unwrap_or(0))
    }

    /// Releases one hold of [`Lock::owner`] without its guard (Redisson's `lock.unlock()`):
    /// for holds whose guard was forgotten or lives elsewhere. Prefer [`LockGuard::unlock`]: a
    /// guard still alive for this owner will release one more hold when it goes.
    ///
    /// # Errors
    /// [`LockError::NotHeld`](crate::LockError::NotHeld) when the owner holds nothing here
    /// (wrong owner, expired, double unlock); nothing changed in Redis.
    pub async fn unlock(&self) -> Result<()> {
        let owner = self.owner();
        self.client.ready().await;
        match commands::release(&self.client.redis, &self.keys, &owner).await {
            Ok(reply) => released(&self.keys, &owner, reply),
            Err(error) => Err(self.client.map_err(error)),
        }
    }

    /// Releases the lock whoever holds it, and wakes its waiters. For operators: the holder is
    /// not told until its next renewal finds the lock gone. Returns whether a lock was removed.
    pub async fn force_unlock(&self) -> Result<bool> {
        self.client.ready().await;
        commands::force_unlock(&self.client.redis, &self.keys)
            .await
            .map_err(|e| self.client.map_err(e))
    }

    /// The waiting protocol (docs/guide.md, "Waiting"):
    ///
    /// 1. Try. Granted: done. Otherwise the reply carries the holder's remaining lease.
    /// 2. Register interest in the release channel BEFORE the next try, so a release between a
    ///    failed try and the wait cannot be missed (the `Notify::enable` rule). When this client
    ///    already listens on the channel, interest is free and is taken before the first try.
    /// 3. Wait for a wake-up OR the holder's remaining lease OR our own deadline, whichever
    ///    comes first, then try again.
    async fn acquire(&self, wait: Option<Duration>, mode: LeaseMode) -> Result<Option<LockGuard>> {
        if let LeaseMode::Fixed(lease) = mode {
            leasehold_core::lease_millis(lease)?;
        }
        let owner = self.owner();
        if wait == Some(Duration::ZERO) {
            // try_lock: one try and nothing to wait for, so no interest and no turn queue.
            return Ok(self.attempt(&owner, mode, None).await?.into_guard());
        }
        let deadline = wait.map(|w| Instant::now() + w.min(leasehold_core::MAX_LEASE));
        let channel = self.keys.released();
        // Interest is free when this client already listens on the channel: take it before
        // the first try. Otherwise the first try goes out alone (most locks are free), and the
        // subscriber connection is opened only when there is something to wait for.
        let mut interest = match self.client.notifier_if_started() {
            Some(notifier)
                if deadline.is_none_or(|d| d > Instant::now())
                    && notifier.is_subscribed(channel) =>
            {
                Some(
                    notifier
                        .interest(channel)
                        .await
                        .map_err(|e| self.client.map_err(e))?,
                )
            }
            _ => None,
        };
        if deadline.is_some_and(|d| d <= Instant::now()) {
            return Ok(self.attempt(&owner, mode, None).await?.into_guard());
        }
        let mut leave = LeaveQueue {
            lock: self,
            armed: true,
        };
        let mut backoff = Backoff::new();
        loop {
            // The wake-up future borrows `interest`, so it lives in this block only.
            let subscribe_by = {
                let mut notified = pin!(interest.as_ref().map(|i| i.notified()));
                if let Some(notified) = notified.as_mut().as_pin_mut() {
                    notified.enable();
                }
                let retry_after = match self.attempt(&owner, mode, interest.as_ref()).await {
                    Ok(Attempt::Granted(guard)) => {
                        leave.armed = false;
                        return Ok(Some(guard));
                    }
                    Ok(Attempt::Held(ttl)) => {
                        backoff.reset();
                        // +1 ms: PTTL rounds down, and waking a hair early wastes a try.
                        ttl.map_or(Duration::from_secs(1), |t| t + Duration::from_millis(1))
                    }
                    Err(error) if error.is_transient() => {
                        tracing::debug!(lock = %self.keys.name(), %error, "acquire failed while waiting; retrying");
                        backoff.next()
                    }
                    Err(error) => return Err(error),
                };
                let now = Instant::now();
                if deadline.is_some_and(|d| d <= now) {
                    return Ok(None);
                }
                let mut wake_at = now + retry_after;
                if let Some(deadline) = deadline {
                    wake_at = wake_at.min(deadline);
                }
                match notified.as_mut().as_pin_mut() {
                    // First failure: subscribe below, then try again at once.
                    None => Some(wake_at),
                    Some(notified) => {
                        tokio::select! {
                            _ = notified => {}
                            _ = tokio::time::sleep_until(wake_at) => {}
                        }
                        None
                    }
                }
            };
            if let Some(wake_at) = subscribe_by {
                // A release published before the subscription reached nobody, so the lock
                // state is read again (next iteration) once it is active.
                let registered = match self.client.notifier().await {
                    Ok(notifier) => notifier
                        .interest(channel)
                        .await
                        .map_err(|e| self.client.map_err(e)),
                    Err(error) => Err(error),
                };
                match registered {
                    Ok(registered) => interest = Some(registered),
                    Err(error) if !error.is_transient() => return Err(error),
                    Err(error) => {
                        tracing::debug!(lock = %self.keys.name(), %error, "subscribe failed; retrying");
                        let delay = backoff.next();
                        tokio::time::sleep_until(wake_at.min(Instant::now() + delay)).await;
                    }
                }
                continue;
            }
            if deadline.is_some_and(|d| d <= Instant::now()) {
                // One last try at the deadline: a release may have woken us just now.
                let guard = self
                    .attempt(&owner, mode, interest.as_ref())
                    .await?
                    .into_guard();
                leave.armed = guard.is_none();
                return Ok(guard);
            }
        }
    }

    /// One acquire script call. If the reply never comes (timeout, connection lost, or this
    /// future dropped while the call is in flight) the acquire is undone in the background.
    /// A caller holding `interest` is a subscribed waiter: it takes part in the turn queue.
    async fn attempt(
        &self,
        owner: &Owner,
        mode: LeaseMode,
        interest: Option<&leasehold_pubsub::Interest>,
    ) -> Result<Attempt> {
        let lease = match mode {
            LeaseMode::Watched => self.client.lease,
            LeaseMode::Fixed(lease) => lease,
        };
        let lease_ms = leasehold_core::lease_millis(lease)?;
        // An earlier unanswered acquire or release of this owner may have left a hold that
        // this acquire would re-enter; it is settled first.
        let timeout = self.client.command_timeout;
        if !self.client.settled(&self.keys, owner, timeout).await {
            return Err(LockError::Timeout(timeout));
        }
        let waiter = match (interest, self.client.notifier_if_started()) {
            (Some(_), Some(notifier)) => Some(commands::Waiter {
                client: self.client.id.as_str(),
                more: notifier.waiters_on(self.keys.released()) > 1,
            }),
            _ => None,
        };
        self.client.ready().await;
        // Armed only now: dropped while waiting for the connection, nothing was sent and
        // nothing needs undoing.
        let mut pending = PendingAcquire {
            client: &self.client,
            keys: &self.keys,
            owner,
            lease,
            armed: true,
        };
        let sent_at = Instant::now();
        let reply =
            commands::acquire(&self.client.redis, &self.keys, owner, lease_ms, waiter).await;
        let reply = match reply {
            Ok(reply) => reply,
            Err(error) => {
                let error = self.client.map_err(error);
                // Redis refused the script before it changed anything (type, ACL, argument):
                // nothing to undo. Anything else (no reply, or a reply we could not read) may
                // have granted a hold.
                pending.armed = !matches!(
                    error,
                    LockError::WrongType { .. }
                        | LockError::PermissionDenied(_)
                        | LockError::InvalidArgument(_)
                );
                return Err(error);
            }
        };
        pending.armed = false;
        match reply {
            commands::Acquire::Granted { hold_count, fence } => {
                let lease = match mode {
                    LeaseMode::Watched => GuardLease::Watched(
                        self.client
                            .watchdog
                            .watch(&self.keys, owner, hold_count, sent_at),
                    ),
                    LeaseMode::Fixed(lease) => {
                        GuardLease::Fixed(Arc::new(LeaseState::new(valid_until(sent_at, lease))))
                    }
                };
                Ok(Attempt::Granted(LockGuard::new(
                    self.client.clone(),
                    self.keys.clone(),
                    owner.clone(),
                    fence,
                    hold_count,
                    lease,
                )))
            }
            commands::Acquire::Held { ttl } => Ok(Attempt::Held(ttl)),
        }
    }
}

/// A release script's answer as callers see it: `NotHeld` names the lock and the owner.
pub(crate) fn released(keys: &LockKeys, owner: &Owner, reply: commands::Release) -> Result<()> {
    match reply {
        commands::Release::Released { .. } => Ok(()),
        commands::Release::NotHeld => Err(LockError::NotHeld {
            name: keys.name().to_string(),
            owner: owner.to_string(),
        }),
    }
}

/// An acquire whose reply has not arrived. Dropped while armed, it undoes the acquire if Redis
/// ran it: "if the owner's count is exactly what that acquire produced, take one hold back".
struct PendingAcquire<'a> {
    client: &'a Arc<ClientInner>,
    keys: &'a LockKeys,
    owner: &'a Owner,
    /// The lease asked for: after it, an unconfirmed grant has ended by itself.
    lease: Duration,
    armed: bool,
}

impl Drop for PendingAcquire<'_> {
    fn drop(&mut self) {
        if self.armed {
            // What the acquire would have produced: the owner's live holds here plus one.
            // Counted only now, on the rare path, not before every acquire.
            let expected_count = self.client.local_holds(self.keys, self.owner) + 1;
            self.client
                .spawn_repair(self.keys, self.owner, expected_count, self.lease);
        }
    }
}

/// Takes this client out of the lock's turn queue when its last local waiter stops waiting
/// without the lock (timeout, cancellation, error): otherwise the next release would reserve
/// the lock for a client that no longer wants it, and everyone would wait out the grace.
/// A waiter that got the lock left the queue in the acquire script already.
struct LeaveQueue<'a> {
    lock: &'a Lock,
    armed: bool,
}

impl Drop for LeaveQueue<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let client = &self.lock.client;
        let Some(notifier) = client.notifier_if_started() else {
            return;
        };
        let keys = &self.lock.keys;
        // Our own Interest is still registered here (it drops after this guard).
        if notifier.waiters_on(keys.released()) != 1
            || tokio::runtime::Handle::try_current().is_err()
        {
            return;
        }
        let client = client.clone();
        let keys = keys.clone();
        tokio::spawn(async move {
            if let Err(error) =
                commands::leave_queue(&client.redis, &keys, client.id.as_str()).await
            {
                tracing::debug!(lock = %keys.name(), %error, "leaving the turn queue failed; the next release will skip us after the grace");
            }
        });
    }
}

/// Retry delay after transient errors while waiting: 10 ms doubling to 1 s.
struct Backoff(Duration);

impl Backoff {
    fn new() -> Backoff {
        Backoff(Duration::from_millis(10))
    }

    fn reset(&mut self) {
        self.0 = Duration::from_millis(10);
    }

    fn next(&mut self) -> Duration {
        let delay = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(1));
        delay
    }
}
