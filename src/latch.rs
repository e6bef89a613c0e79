//! [`Latch`]: a distributed count-down latch ("start when all N workers are ready").

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::commands;
use leasehold_core::protocol::LATCH_FIELD;
use leasehold_core::telemetry::LockMetrics;
use leasehold_core::{LockKeys, Result};
use leasehold_pubsub::Place;
use tokio::time::Instant;

use crate::client::ClientInner;
use crate::wait::{self, Attempt, Line, Tried};

/// A handle on one distributed count-down latch: [`Latch::wait`] returns once the count,
/// set by [`Latch::try_set_count`], has been counted down to zero by [`Latch::count_down`]
/// calls from any client.
///
/// Waiters are woken by a message when the count reaches zero; a waiter that missed it (its
/// subscriber connection was lost) looks again at least once a second, so none is stranded.
/// The count is kept in Redis (no TTL) until it reaches zero; then the latch is gone, and
/// `try_set_count` may start a new round.
///
/// Every round has an id (a fencing token of the name's slot, so ids never repeat), and a
/// waiter remembers the round it began in: it goes once that round opened, even when the next
/// round started at once and the count it reads is the new round's.
///
/// ```
/// # leasehold_testkit::with_redis(|url| async move {
/// let client = leasehold::LockClient::connect(&url).await?;
/// let ready = client.latch("migration:workers-ready")?;
/// assert_eq!(ready.name(), "migration:workers-ready");
/// ready.try_set_count(2).await?;
/// let waiting = tokio::spawn({
///     let ready = ready.clone();
///     async move { ready.wait().await }
/// });
/// ready.count_down().await?; // worker 1 ready
/// ready.count_down().await?; // worker 2 ready: the waiter goes
/// waiting.await.unwrap()?;
/// assert_eq!(ready.count().await?, 0);
/// # Ok::<(), leasehold::LockError>(()) });
/// ```
#[derive(Clone)]
pub struct Latch {
    client: Arc<ClientInner>,
    keys: LockKeys,
}

impl fmt::Debug for Latch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Latch")
            .field("name", &self.keys.name())
            .field("key", &self.keys.hash())
            .finish()
    }
}

impl Latch {
    pub(crate) fn new(client: Arc<ClientInner>, keys: LockKeys) -> Latch {
        Latch { client, keys }
    }

    /// The latch's name. Example: [`Latch`]'s.
    pub fn name(&self) -> &str {
        self.keys.name()
    }

    /// Sets the count if the latch is not counting down already (Redisson's `trySetCount`),
    /// starting a new round; returns whether it was set. A count of zero sets nothing (the
    /// latch is open).
    ///
    /// Under a replica sync policy
    /// ([`LockClientBuilder::replica_sync`](crate::LockClientBuilder::replica_sync)) it returns
    /// once the replicas have the count: a count a failover loses makes the latch read as open
    /// (`wait()` returns at once).
    ///
    /// # Errors
    /// [`LockError::AppliedNotReplicated`](crate::LockError::AppliedNotReplicated) when the
    /// count was set (or found set) on the primary but did not reach the replicas in time: it
    /// stands there. Calling `try_set_count` again is safe (it sets nothing over a count) and
    /// waits for the replicas again. [`LockError::WrongKind`](crate::LockError::WrongKind) when
    /// the name is in use by a lock, a read/write lock or a semaphore (nothing changed).
    pub async fn try_set_count(&self, count: u32) -> Result<bool> {
        if count == 0 {
            return Ok(false);
        }
        let client = &self.client;
        // Boxed (here and below): a script call's future is large in a debug build.
        let set = Box::pin(client.call(
            client.command_timeout,
            commands::latch_set_count(&client.redis, &client.scripts, &self.keys, count),
        ))
        .await?;
        client.sync_change(&self.keys).await?;
        Ok(set)
    }

    /// Counts down by one; at zero every waiter is woken. Returns the count left (0 once
    /// open; counting down an open latch does nothing).
    ///
    /// Under a replica sync policy it returns once the replicas have the count-down: a
    /// count-down a failover loses is never counted, and the latch may then never open.
    ///
    /// # Errors
    /// [`LockError::AppliedNotReplicated`](crate::LockError::AppliedNotReplicated) when it
    /// counted down on the primary but did not reach the replicas in time: it stands there, so
    /// do **not** count down again for it (that would count twice). A
    /// [`Timeout`](crate::LockError::Timeout) or [`Connection`](crate::LockError::Connection)
    /// error may come after the count-down ran, too.
    pub async fn count_down(&self) -> Result<u64> {
        let client = &self.client;
        let left = Box::pin(client.call(
            client.command_timeout,
            commands::latch_count_down(&client.redis, &client.scripts, &self.keys),
        ))
        .await?;
        client.sync_change(&self.keys).await?;
        Ok(left)
    }

    /// The count now (0: open): how many count-downs the round still waits for. A snapshot, for
    /// progress reports: to act on the latch opening, [`wait`](Latch::wait) for it.
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let ready = client.latch("deploy:hosts-ready")?;
    /// assert_eq!(ready.count().await?, 0); // never set: open
    /// ready.try_set_count(3).await?;
    /// ready.count_down().await?; // the first host is ready
    /// assert_eq!(ready.count().await?, 2);
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    pub async fn count(&self) -> Result<u64> {
        let client = &self.client;
        let state = Box::pin(client.call(
            client.command_timeout,
            commands::latch_state(&client.redis, &self.keys),
        ))
        .await?;
        Ok(state.count)
    }

    /// Waits until the count reaches zero (at once if it is zero, or was never set).
    ///
    /// ```
    /// # leasehold_testkit::with_redis(|url| async move {
    /// let client = leasehold::LockClient::connect(&url).await?;
    /// let ready = client.latch("deploy:hosts-ready")?;
    /// ready.wait().await?; // never set: returns at once
    /// ready.try_set_count(1).await?;
    /// let host = tokio::spawn({
    ///     let ready = ready.clone();
    ///     async move { ready.count_down().await }
    /// });
    /// ready.wait().await?; // until the host counted down
    /// host.await.unwrap()?;
    /// # Ok::<(), leasehold::LockError>(()) });
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped wait only leaves the client's local line (and its channel
    /// subscription lingers, then goes); it changes nothing in Redis.
    pub async fn wait(&self) -> Result<()> {
        Box::pin(self.wait_until(None)).await?;
        Ok(())
    }

    /// Waits at most `timeout` for the count to reach zero; returns whether it did.
    ///
    /// # Cancel safety
    /// As [`Latch::wait`].
    pub async fn wait_for(&self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout.min(leasehold_core::MAX_LEASE);
        Box::pin(self.wait_until(Some(deadline))).await
    }

    /// Waits until the latch opens or `deadline`; returns whether it opened.
    ///
    /// The wait's first look is its own, before it lines up behind the client's other waiters
    /// of this latch: it marks the round the wait began in. A look made only once the waiters
    /// before it went could find the next round counting and take that one for its own.
    async fn wait_until(&self, deadline: Option<Instant>) -> Result<bool> {
        let client = &self.client;
        let first = match client
            .call(
                client.budget(deadline),
                commands::latch_state(&client.redis, &self.keys),
            )
            .await
        {
            Ok(state) if state.count == 0 => return Ok(true),
            Ok(state) => Some(state),
            // The engine retries it; the round is then the one its first answered look finds.
            Err(error) if error.is_transient() => None,
            Err(error) => return Err(error),
        };
        let mut attempt = LatchAttempt {
            latch: self,
            round: first
                .as_ref()
                .map(|state| state.round.clone().unwrap_or_default()),
            first,
        };
        let opened = wait::acquire(client, &self.keys, &mut attempt, deadline).await?;
        Ok(opened.is_some())
    }
}

/// One look at a latch, as the waiting engine drives it: open is a "grant" that excludes
/// nobody.
struct LatchAttempt<'a> {
    latch: &'a Latch,
    /// The round the wait began in (set by its first look at a closed latch): once the latch
    /// holds another round, or none, that round opened.
    round: Option<String>,
    /// The wait's own first look ([`Latch::wait_until`]), standing for the engine's first try
    /// when that try is not a subscribed waiter's: one that finds it closed subscribes and
    /// looks again at once, so a stale "closed" costs nothing.
    first: Option<commands::LatchState>,
}

impl Attempt for LatchAttempt<'_> {
    type Grant = ();

    async fn attempt(&mut self, subscribed: bool, budget: Duration) -> Result<Tried<()>> {
        let client = &self.latch.client;
        let state = match (self.first.take(), subscribed) {
            (Some(first), false) => first,
            _ => {
                client
                    .call(
                        budget,
                        commands::latch_state(&client.redis, &self.latch.keys),
                    )
                    .await?
            }
        };
        let began_in = self
            .round
            .get_or_insert_with(|| state.round.clone().unwrap_or_default());
        // Open, or the round this wait began in opened and another one is counting down now.
        // Closed: nothing bounds how long (no lease); the engine looks again every second in
        // case the opening message was lost.
        Ok(
            if state.count == 0 || state.round.as_ref() != Some(began_in) {
                Tried::Granted(())
            } else {
                Tried::Busy(None)
            },
        )
    }

    /// The opening of this wait's round (or a later one), heard on the release channel: the
    /// count-down that opened it names the round, so the wait ends without another look.
    fn heard(&mut self, place: &Place) -> Option<()> {
        let began_in: u64 = self.round.as_ref()?.parse().ok()?;
        place
            .granted(LATCH_FIELD, began_in.saturating_sub(1))
            .map(|_| ())
    }

    fn metrics(&self) -> &LockMetrics {
        self.latch.client.metrics.latch()
    }

    fn line(&self) -> Line {
        Line::Broadcast
    }
}
