//! [`MultiLock`]: several locks taken all or none, possibly on different Redis servers.

use std::fmt;
use std::time::Duration;

use leasehold_core::{FencingToken, LockError, Result};
use tokio::time::Instant;

use crate::{Lock, LockGuard, LAST_TRY_BUDGET};

/// Several locks acquired together, all or none (Redisson's `RedissonMultiLock`): for work
/// that must hold every one of them, such as moving money between two accounts. The locks may
/// come from different clients, and so from different Redis servers.
///
/// Every acquire takes the locks one by one in a **canonical order** (by key, then by server),
/// whatever order they were listed in: two callers that list `{a, b}` and `{b, a}` both take
/// `a` first, so neither can hold one while waiting for the other's. A wait's deadline covers
/// all of them. If one cannot be had in time, or the acquire fails or is cancelled, the ones
/// already taken are released (their guards are dropped, which releases them in the background).
///
/// Each member is an ordinary hold: re-entrant per owner as its [`Lock`] handle is, renewed by
/// its client's watchdog, fenced. The [`MultiLockGuard`] releases all of them and reports the
/// set lost as soon as any member is.
///
/// (Locks that share a Cluster slot are still taken one script call each: taking them in one
/// script would save round trips, not change the outcome.)
///
/// ```
/// # leasehold_testkit::with_redis(|url| async move {
/// let client = leasehold::LockClient::connect(&url).await?;
/// let transfer = leasehold::MultiLock::new([
///     client.lock("account:42")?,
///     client.lock("account:7")?,
/// ])?;
/// let guard = transfer.lock().await?;
/// // ... move the money, fencing each write with its account's token ...
/// assert_eq!(guard.fencing_tokens().len(), 2);
/// guard.unlock().await?;
/// # Ok::<(), leasehold::LockError>(()) });
/// ```
#[derive(Clone)]
pub struct MultiLock {
    /// In canonical order.
    locks: Vec<Lock>,
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.locks.iter().map(|l| l.keys().hash()))
            .finish()
    }
}

impl MultiLock {
    /// The locks `locks`, to be taken together.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for no locks, or one lock listed twice (the same key on
    /// the same server: it would wait for itself).
    pub fn new(locks: impl IntoIterator<Item = Lock>) -> Result<MultiLock> {
        let mut locks: Vec<Lock> = locks.into_iter().collect();
        if locks.is_empty() {
            return Err(LockError::InvalidArgument(
                "a multi-lock needs at least one lock".into(),
            ));
        }
        // By key, then by the server the client talks to: the same in every process (client
        // ids are random per process, so two processes could order two servers' locks of one
        // name differently and wait for each other).
        let server = |lock: &Lock| {
            use fred::interfaces::ClientLike;
            format!("{:?}", lock.client().redis.client_config().server)
        };
        let mut keyed: Vec<(String, String, Lock)> = locks
            .drain(..)
            .map(|lock| (lock.keys().hash().to_string(), server(&lock), lock))
            .collect();
        keyed.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        if let Some(pair) = keyed
            .windows(2)
            .find(|pair| pair[0].0 == pair[1].0 && pair[0].1 == pair[1].1)
        {
            return Err(LockError::InvalidArgument(format!(
                "lock {:?} is listed twice in one multi-lock (the same key on the same server: \
                 it would wait for itself)",
                pair[0].2.name()
            )));
        }
        let locks = keyed.into_iter().map(|(_, _, lock)| lock).collect();
        Ok(MultiLock { locks })
    }

    /// The locks, in the order they are taken.
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }

    /// Takes every lock, one after the other in canonical order, within `wait` (`None`: no
    /// limit; zero: one try each) and with `lease` (`None`: watched).
    async fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Option<MultiLockGuard<'_>>> {
        let deadline = wait.map(|w| Instant::now() + w.min(leasehold_core::MAX_LEASE));
        let mut guards = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            let left = match (wait, deadline) {
                (Some(wait), _) if wait.is_zero() => Some(Duration::ZERO),
                (_, Some(deadline)) => Some(deadline.saturating_duration_since(Instant::now())),
                (_, None) => None,
            };
            // Boxed: one lock's acquire future, awaited in a loop, would otherwise sit inside
            // this one. On `?` (or cancellation) `guards` drops here: the members taken are
            // released in the background.
            match Box::pin(lock.acquire(left, lease)).await? {
                Some(guard) => guards.push(guard),
                None => {
                    give_back(guards, deadline).await;
                    return Ok(None);
                }
            }
        }
        Ok(Some(MultiLockGuard { guards }))
    }

    /// Waits until every lock is held; each is renewed by its client's watchdog.
    ///
    /// # Cancel safety
    /// Cancel safe: the locks taken so far are released (in the background), and a member's
    /// acquire in flight is undone as [`Lock::lock`]'s is.
    pub async fn lock(&self) -> Result<MultiLockGuard<'_>> {
        let guard = self.acquire(None, None).await?;
        Ok(guard.expect("an unbounded wait returns only when acquired"))
    }

    /// As [`MultiLock::lock`], every member with the explicit `lease` (never renewed).
    ///
    /// # Cancel safety
    /// As [`MultiLock::lock`].
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<MultiLockGuard<'_>> {
        let guard = self.acquire(None, Some(lease)).await?;
        Ok(guard.expect("an unbounded wait returns only when acquired"))
    }

    /// One try of each lock, no waiting: all of them, or `None` and none held.
    ///
    /// The members taken before one was found busy are given back before `None` is
    /// returned, all at once, each within [`LAST_TRY_BUDGET`]; one whose server does not
    /// answer by then is released in the background (so a server cut off costs this call that
    /// budget, not a command timeout).
    ///
    /// # Cancel safety
    /// As [`MultiLock::lock`].
    pub async fn try_lock(&self) -> Result<Option<MultiLockGuard<'_>>> {
        self.acquire(Some(Duration::ZERO), None).await
    }

    /// Waits at most `wait` for all of them; `None` (and none held) when they did not all come
    /// in time.
    ///
    /// Returns within about `wait` + 2 × [`LAST_TRY_BUDGET`] whatever the servers do: the
    /// last try of a member gets that budget, and the members already taken are then given
    /// back all at once within what is left of the wait (at least that budget); one whose
    /// server does not answer in time is released in the background.
    ///
    /// # Cancel safety
    /// As [`MultiLock::lock`].
    pub async fn try_lock_for(&self, wait: Duration) -> Result<Option<MultiLockGuard<'_>>> {
        self.acquire(Some(wait), None).await
    }

    /// As [`MultiLock::try_lock_for`], every member with the explicit `lease`.
    ///
    /// # Cancel safety
    /// As [`MultiLock::lock`].
    pub async fn try_lock_for_with_lease(
        &self,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<MultiLockGuard<'_>>> {
        self.acquire(Some(wait), Some(lease)).await
    }
}

/// Gives back the members a bounded acquire took when it could not take them all, before it
/// returns `None`, so that "none held" is true when the caller looks: all at once, within what
/// is left until `deadline` (at least [`LAST_TRY_BUDGET`], as a last try gets). A release that
/// does not answer by then (its server cut off or paused) is not waited for: it is settled in
/// the background, as a dropped guard's is, and its lease ends it if even that fails. Waiting
/// for it (up to a command timeout per member, one after the other) would overrun the caller's
/// wait by that much.
async fn give_back(guards: Vec<LockGuard<'_>>, deadline: Option<Instant>) {
    let left = deadline.map_or(Duration::ZERO, |d| {
        d.saturating_duration_since(Instant::now())
    });
    let results = crate::guard::unlock_all_within(guards, left.max(LAST_TRY_BUDGET)).await;
    for error in results.into_iter().filter_map(Result::err) {
        tracing::debug!(%error, "a multi-lock member given back did not confirm in time; settled in the background");
    }
}

/// Every lock of a [`MultiLock`], held. Dropping it releases them all (in the background).
pub struct MultiLockGuard<'a> {
    /// In canonical order.
    guards: Vec<LockGuard<'a>>,
}

impl fmt::Debug for MultiLockGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.guards.iter()).finish()
    }
}

impl<'a> MultiLockGuard<'a> {
    /// Each member's guard, in canonical order.
    pub fn guards(&self) -> &[LockGuard<'a>] {
        &self.guards
    }

    /// Each member's name and fencing token, in canonical order: fence each write with the
    /// token of the lock that protects what it writes.
    pub fn fencing_tokens(&self) -> Vec<(&str, FencingToken)> {
        self.guards
            .iter()
            .map(|g| (g.name(), g.fencing_token()))
            .collect()
    }

    /// Whether every member's lease is still certainly valid.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// Completes as soon as any member's lease is lost.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn lost(&self) {
        let lost = self.guards.iter().map(|g| Box::pin(g.lost()));
        futures::future::select_all(lost).await;
    }

    /// Runs `work` while every member is held: its output, or [`LockError::LeaseLost`] (naming
    /// the first member found lost) as soon as any is lost.
    ///
    /// # Cancel safety
    /// Dropping the returned future drops `work`.
    pub async fn run_while_held<F: std::future::Future>(&self, work: F) -> Result<F::Output> {
        let lost = || {
            let name = self
                .guards
                .iter()
                .find(|g| !g.is_held())
                .map_or_else(|| self.guards[0].name(), |g| g.name());
            LockError::LeaseLost {
                name: name.to_string(),
            }
        };
        if !self.is_held() {
            return Err(lost());
        }
        tokio::select! {
            biased;
            _ = self.lost() => Err(lost()),
            output = work => Ok(output),
        }
    }

    /// Releases every member (all are tried); the first error, if any (e.g.
    /// [`LockError::NotHeld`] for a member whose lease ended).
    ///
    /// # Cancel safety
    /// Cancel safe: the releases not sent yet happen in the background when their guards drop.
    pub async fn unlock(self) -> Result<()> {
        let mut first_error = None;
        // In reverse order, as nested locks are released.
        for guard in self.guards.into_iter().rev() {
            if let Err(error) = Box::pin(guard.unlock()).await {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
