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
/// Every acquire takes the locks one by one in a **canonical order** (by key, then by the
/// server's identity, [`Lock::server_identity`]), whatever order they were listed in: two
/// callers that list `{a, b}` and `{b, a}` both take `a` first, so neither can hold one while
/// waiting for the other's. The identity is read from the server (its `run_id`; on Redis
/// Cluster the node serving the slot) or given by the caller
/// ([`LockClientBuilder::server_name`](crate::LockClientBuilder::server_name)), never taken
/// from the address a process reaches it by, which may differ between processes
/// (docs/multi-lock.md, "Which server is which"). A wait's deadline covers
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
/// assert_eq!(guard.guards()[0].name(), "account:42"); // in canonical order (by key)
/// guard.unlock().await?;
/// # Ok::<(), leasehold::LockError>(()) });
/// ```
#[derive(Clone)]
pub struct MultiLock {
    /// In canonical order as of construction.
    locks: Vec<Lock>,
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.locks.iter().map(|l| l.keys().hash()))
            .finish()
    }
}

/// How often a multi-lock that holds some members and waits for the next one checks that its
/// order still stands: a server's identity changes when it restarts or fails over (its
/// `run_id`) or when a Cluster slot moves (the node serving it), and two processes whose
/// views differ for a moment may have taken two members in opposite orders. The one whose
/// order changed gives back what it holds and starts again in the new order, so that such a
/// moment costs a restart, not a wait for each other until a deadline (or for ever).
const ORDER_CHECK: Duration = Duration::from_secs(1);

/// A lock's place in the canonical order: its key, then its server's identity (see
/// [`MultiLock`]), then where it was listed (ties only among locks of one key whose servers
/// look alike, which [`MultiLock::new`] refuses; kept for a total order).
fn order_of(locks: &[Lock]) -> Vec<usize> {
    let mut keyed: Vec<(&str, String, usize)> = locks
        .iter()
        .enumerate()
        .map(|(i, lock)| {
            let identity = lock.client().server_identity(lock.keys());
            (lock.keys().hash(), identity, i)
        })
        .collect();
    keyed.sort();
    keyed.into_iter().map(|(_, _, i)| i).collect()
}

impl MultiLock {
    /// The locks `locks`, to be taken together.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for no locks, or one lock listed twice (the same key on
    /// the same server, whatever addresses its clients reach it by: it would wait for itself).
    pub fn new(locks: impl IntoIterator<Item = Lock>) -> Result<MultiLock> {
        let locks: Vec<Lock> = locks.into_iter().collect();
        if locks.is_empty() {
            return Err(LockError::InvalidArgument(
                "a multi-lock needs at least one lock".into(),
            ));
        }
        // By key, then by the server's identity as the server reports it (or as the caller
        // named it), never by the address a process reaches it by: two processes that reach
        // one server under different addresses order alike.
        let order = order_of(&locks);
        let identity = |i: usize| locks[i].client().server_identity(locks[i].keys());
        if let Some(pair) = order.windows(2).find(|pair| {
            locks[pair[0]].keys().hash() == locks[pair[1]].keys().hash()
                && identity(pair[0]) == identity(pair[1])
        }) {
            return Err(LockError::InvalidArgument(format!(
                "lock {:?} is listed twice in one multi-lock (the same key on the same server, \
                 {}: it would wait for itself)",
                locks[pair[0]].name(),
                identity(pair[0])
            )));
        }
        let mut locks: Vec<Option<Lock>> = locks.into_iter().map(Some).collect();
        let locks = order
            .into_iter()
            .map(|i| locks[i].take().expect("each index once"))
            .collect();
        Ok(MultiLock { locks })
    }

    /// The locks, in canonical order as of [`MultiLock::new`]. Each acquire orders them afresh
    /// by their servers' identities then (which change when a server restarts or fails over).
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
        let one_try = wait.is_some_and(|w| w.is_zero());
        'order: loop {
            // In memory: each server's identity as its client knows it now.
            let order = order_of(&self.locks);
            let mut guards = Vec::with_capacity(self.locks.len());
            for &index in &order {
                let lock = &self.locks[index];
                let left = match deadline {
                    _ if one_try => Some(Duration::ZERO),
                    Some(deadline) => Some(deadline.saturating_duration_since(Instant::now())),
                    None => None,
                };
                // Boxed: one lock's acquire future, awaited in a loop, would otherwise sit
                // inside this one. On `?` (or cancellation) `guards` drops here: the members
                // taken are released in the background.
                let acquire = Box::pin(lock.acquire(left, lease));
                let got = if guards.is_empty() || one_try {
                    acquire.await?
                } else {
                    match self.unless_reordered(&order, acquire).await {
                        Some(got) => got?,
                        None => {
                            tracing::debug!(
                                multi_lock = ?self,
                                "a server's identity changed while waiting: starting again in the new order"
                            );
                            give_back(guards, deadline).await;
                            continue 'order;
                        }
                    }
                };
                match got {
                    Some(guard) => guards.push(guard),
                    None => {
                        give_back(guards, deadline).await;
                        return Ok(None);
                    }
                }
            }
            return Ok(Some(MultiLockGuard { guards }));
        }
    }

    /// Runs `acquire` (of a member after the first) unless the canonical order stops being
    /// `order` meanwhile (checked every [`ORDER_CHECK`]): `None` then, `acquire` dropped (a
    /// member's acquire is cancel safe).
    async fn unless_reordered<F: std::future::Future>(
        &self,
        order: &[usize],
        acquire: F,
    ) -> Option<F::Output> {
        let reordered = async {
            loop {
                tokio::time::sleep(ORDER_CHECK).await;
                if order_of(&self.locks) != order {
                    return;
                }
            }
        };
        tokio::select! {
            biased;
            output = acquire => Some(output),
            () = reordered => None,
        }
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
    /// Each member's guard, in canonical order. Example: [`MultiLock`]'s.
    pub fn guards(&self) -> &[LockGuard<'a>] {
        &self.guards
    }

    /// Each member's name and fencing token, in canonical order: fence each write with the
    /// token of the lock that protects what it writes. Example: [`MultiLock`]'s.
    pub fn fencing_tokens(&self) -> Vec<(&str, FencingToken)> {
        self.guards
            .iter()
            .map(|g| (g.name(), g.fencing_token()))
            .collect()
    }

    /// Whether every member's lease is still certainly valid. Example:
    /// [`lost`](MultiLockGuard::lost)'s.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// The instant until which every member's lease is certainly valid, unless renewed
    /// further: the earliest member's. Example: [`Hold`](crate::Hold)'s, which any guard of
    /// a set is.
    pub fn valid_until(&self) -> Instant {
        self.guards
            .iter()
            .map(LockGuard::valid_until)
            .min()
            .expect("a multi-lock has members")
    }

    /// Completes as soon as any member's lease is lost: the set is held only while all of it
    /// is.
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// use std::time::Duration;
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let transfer = client.multi_lock([client.lock("account:42")?, client.lock("account:7")?])?;
    /// let guard = transfer.lock_with_lease(Duration::from_millis(100)).await?;
    /// guard.lost().await; // the first member's lease to end ends the set
    /// assert!(!guard.is_held());
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
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
